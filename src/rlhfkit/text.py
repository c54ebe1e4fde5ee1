"""Text from a model or a user, made inert for where it is shown.

Sampled text and data are arbitrary Unicode: a token can decode to ESC or BEL (the bundled
tokenizer has 31 tokens that decode to control characters), a prompt can hold HTML.
`terminal_text` is for what is printed to a terminal, where ESC and OSC sequences would move
the cursor, recolour or retitle it; `markdown_cell` for a cell of a markdown table
(``report.md``, TensorBoard's text tab), whose renderers also run HTML and follow links and
images. Both show the text as written, with what would act escaped visibly, never dropped.
"""

from __future__ import annotations

import re

# What a terminal acts on: C0 controls but tab and newline, DEL and C1 (ESC, CSI, OSC, BEL,
# CR, backspace), and the bidirectional overrides and isolates that reorder the characters
# shown ("Trojan Source", CVE-2021-42574).
_BIDI = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
_CONTROL = re.compile(f"[\x00-\x08\x0b-\x1f\x7f-\x9f{_BIDI}]")
_CONTROL_OR_NEWLINE = re.compile(f"[\x00-\x08\x0a-\x1f\x7f-\x9f{_BIDI}]")

# Markdown that would act or break the table (HTML, links and images, code spans, the cell's
# pipes); emphasis is left alone: it can neither run nor fetch anything.
_MARKDOWN = str.maketrans(
    {
        "\\": "\\\\",
        "`": "\\`",
        "[": "\\[",
        "]": "\\]",
        "|": "\\|",
        "&": "&amp;",
        "<": "&lt;",
        ">": "&gt;",
    }
)


def _visible(match: re.Match) -> str:
    return match.group().encode("unicode_escape").decode("ascii")  # "\x1b" -> "\\x1b"


def terminal_text(text: str, *, one_line: bool = False) -> str:
    """``text`` safe to print: control characters as visible escapes (``\\x1b``, ``\\r``),
    never emitted; tabs and newlines kept, or with ``one_line`` newlines escaped too."""
    return (_CONTROL_OR_NEWLINE if one_line else _CONTROL).sub(_visible, text)


def markdown_cell(text: str) -> str:
    """``text`` as one cell of a markdown table, shown as written: HTML and link syntax
    escaped (``&lt;script&gt;``, ``\\[``), pipes escaped, every kind of line break (CR
    included) a ``<br>``, and control characters visible as in ``terminal_text``."""
    return "<br>".join(terminal_text(line) for line in text.translate(_MARKDOWN).splitlines())
