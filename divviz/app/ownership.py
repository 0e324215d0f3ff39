"""Who is looking: a browser's identity, without JavaScript and without putting it in the link.

Streamlit sets one cookie per browser, `_streamlit_xsrf` (Tornado's XSRF token, format "2|mask|masked token|time").
Its mask changes from page load to page load, but the token under it stays the same until the browser drops the
cookie (it lasts for the browser session): `browser_id` unmasks it and keeps a hash, so a reloaded tab is the same
browser, and the token itself (a secret) never reaches a run folder. A token in the link would have done the same,
but a workshop shares links: whoever opened a shared link would own the sharer's runs.

Where there is no such cookie (XSRF protection turned off, or AppTest), the page falls back to an identity per
browser tab session, which a reload forgets.
"""

from __future__ import annotations

import hashlib
import hmac


def browser_id(xsrf_cookie: str | None) -> str | None:
    """A stable identity from Streamlit's `_streamlit_xsrf` cookie, or None if it is missing or malformed."""
    try:
        version, mask, masked, _ = (xsrf_cookie or "").split("|")
        mask, masked = bytes.fromhex(mask), bytes.fromhex(masked)
    except ValueError:
        return None
    if version != "2" or len(mask) != 4 or not masked:
        return None
    token = bytes(b ^ mask[i % 4] for i, b in enumerate(masked))
    return hashlib.sha256(b"divviz-owner:" + token).hexdigest()[:16]


def is_teacher_key(given: str | None, key: str | None) -> bool:
    """Whether the key given in a link matches the teacher key set when the app was started."""
    return bool(given and key) and hmac.compare_digest(given.encode(), key.encode())
