"""Who is looking, in the app: room mode (a workshop's shared server, `DIVVIZ_ROOM`), the browser's identity
(`ownership.browser_id`), the teacher's key, and the sentence that says whose runs a page manages."""

from __future__ import annotations

import os
import secrets

import streamlit as st

from divviz.app.ownership import browser_id, is_teacher_key
from divviz.runs.runner import Viewer


_TEACHERS: set[str] = set()  # browsers that opened a link with the teacher key, for as long as the app runs


LOCAL_ADDRESSES = ("localhost", "127.0.0.1", "::1")


def room_mode() -> bool:
    """Students own their runs when the app is served beyond this machine, or $DIVVIZ_ROOM=1, or a teacher key is
    set; an app bound to localhost (the default) has one user, who manages every run."""
    return (st.get_option("server.address") not in LOCAL_ADDRESSES or os.environ.get("DIVVIZ_ROOM") == "1"
            or bool(os.environ.get("DIVVIZ_TEACHER_KEY")))


def viewer() -> Viewer:
    """This browser (`ownership.browser_id` of its Streamlit cookie, else this tab's session) and whether it may
    manage every run: in room mode, the browser that once opened a link with ?teacher=KEY, KEY being
    $DIVVIZ_TEACHER_KEY when the app was started (the key is then removed from the address bar)."""
    who = browser_id(st.context.cookies.get("_streamlit_xsrf")) or st.session_state.setdefault(
        "_tab_identity", secrets.token_hex(8))
    if "teacher" in st.query_params:
        if is_teacher_key(st.query_params["teacher"], os.environ.get("DIVVIZ_TEACHER_KEY")):
            _TEACHERS.add(who)
        del st.query_params["teacher"]
    return Viewer(who, teacher=not room_mode() or who in _TEACHERS)


def ownership_text(me: Viewer) -> str:
    """Who may stop or delete a run, said for the mode the app is in (`room_mode`)."""
    if not room_mode():
        return ("This app is served to this machine only, so it has one user: any of its browsers can stop or "
                "delete any run.")
    return ("In this workshop room only the browser that started a run, or the teacher, can stop or delete it"
            + (" (this browser is the teacher's)." if me.teacher else "."))
