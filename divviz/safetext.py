"""Text from outside divviz — a link's values, a run folder's files, a model's completions — shown as text.

Streamlit renders alerts, captions, progress texts and expander labels as Markdown (links, images the browser
fetches, emoji and colour directives, LaTeX). `literal` makes any string render as itself there: every ASCII
punctuation character is backslash-escaped (CommonMark renders an escaped character literally), and an invisible
word joiner (U+2060) breaks the triggers of GitHub's bare autolinks (`://`, `www.`, `@`), which escaping alone
does not stop (seen in chromium with Streamlit 1.67). `shorten` keeps a message readable whatever it quotes.
`spreadsheet_safe` keeps a CSV cell from being run as a formula when a spreadsheet opens the download.
"""

from __future__ import annotations

import re

_PUNCTUATION = re.compile(r"([!-/:-@\[-`{-~])")  # every ASCII punctuation character
_AUTOLINK = re.compile(r"(?<=:)(?=//)|(?<=www)(?=\.)|(?<=@)", re.IGNORECASE)
WORD_JOINER = "\u2060"


def shorten(text: str, limit: int = 80) -> str:
    """`text` as it is if short, else its start and how long it was."""
    text = str(text)
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} characters)"


def quoted(value, limit: int = 80) -> str:
    """A value quoted in a message: repr, cut to `limit` characters."""
    return shorten(repr(value), limit)


def literal(text: str) -> str:
    """Markdown that Streamlit renders as exactly `text` (plus invisible word joiners in URLs)."""
    joined = _AUTOLINK.sub(WORD_JOINER, str(text))
    return _PUNCTUATION.sub(r"\\\1", joined).replace("\n", "  \n")


def one_of(names) -> str:
    """The choices `names` as a sentence's list: 'a, b or c'."""
    names = [str(name) for name in names]
    return " or ".join([", ".join(names[:-1]), names[-1]]) if len(names) > 1 else names[0]


def unknown(what: str, value, choices) -> str:
    """The one message for a value that is not one of its choices: "unknown task 'chess'; choose add, sort or
    reverse"."""
    return f"unknown {what} {quoted(value)}; choose {one_of(choices)}"


FORMULA_START = ("=", "+", "-", "@", "\t", "\r")  # what makes a spreadsheet read a cell as a formula (OWASP)


def spreadsheet_safe(text):
    """A CSV cell that a spreadsheet shows and never runs: text starting with = + - @, a tab or a carriage return
    gets a leading apostrophe (OWASP's advice on CSV injection: `=HYPERLINK(…)` as a metric's name); any other value
    as it is, numbers included (−0.5 stays a number)."""
    return f"'{text}" if isinstance(text, str) and text.startswith(FORMULA_START) else text
