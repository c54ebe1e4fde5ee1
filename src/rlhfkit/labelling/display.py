"""Model text shown exactly as text: what a labeller sees of a prompt or a response.

HTML is escaped (Jinja2 autoescape in the templates; the page's script only ever sets
`textContent`). A response is also shown as Markdown made safe (`guidelines.render_response`,
from `visible`'s text), as a chat interface would show it, with a switch back to this raw form.
Labellers must see what a user of the model would see, so every character is shown as itself,
joiners and marks included: the zero-width joiner holds a family emoji together, the
non-joiner is part of a Persian word (`می‌خواهم`),
the left-to-right and right-to-left marks place punctuation in mixed-direction text. Only the
characters that make the page show something other than what the text says are neutralised:
the controls (terminal escapes, NUL, backspace, a lone carriage return, C1) and the bidi
embeddings, overrides and isolates, which reorder what follows them ("Trojan Source",
CVE-2021-42574). `visible` writes each of those as its escape (`\\x1b`, `\\u202e`), as
`text.terminal_text` does for a terminal, and `visible_html` also marks it (a span), so that it
cannot be mistaken for a backslash the model typed. Escapes rather than Unicode's Control
Pictures (U+241B for ESC): many fonts have no glyph for those, and a box says nothing.
Tabs and newlines stay (layout the labeller should see); a CRLF is one newline.
"""

from __future__ import annotations

import re

from markupsafe import Markup, escape

# C0 controls but tab and newline, DEL, C1; the bidi embeddings and overrides (LRE, RLE, PDF,
# LRO, RLO) and isolates (LRI, RLI, FSI, PDI). Not the marks (LRM, RLM, ALM): they reorder
# nothing beyond the neutral characters beside them, and real text needs them.
_DECEPTIVE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _escape(character: str) -> str:
    return character.encode("unicode_escape").decode("ascii")  # "\x1b" -> "\\x1b"


def visible(text: str) -> str:
    """`text` with every control and bidi embedding, override or isolate as its escape."""
    return _DECEPTIVE.sub(lambda m: _escape(m.group()), text.replace("\r\n", "\n"))


def visible_html(text: str) -> Markup:
    """`visible(text)` as HTML: escaped, each replaced character in a `ctrl` span."""
    text = text.replace("\r\n", "\n")
    parts, start = [], 0
    for match in _DECEPTIVE.finditer(text):
        span = Markup('<span class="ctrl" title="U+{:04X}">{}</span>')
        character = match.group()
        parts += [
            escape(text[start : match.start()]),
            span.format(ord(character), _escape(character)),
        ]
        start = match.end()
    parts.append(escape(text[start:]))
    return Markup("").join(parts)


def prompt_turns(prompt: str | list[dict[str, str]]) -> list[dict[str, str | None]]:
    """A prompt as the turns a page shows: one turn without a role for a plain text prompt,
    one per message (role and content) for a chat prompt."""
    if isinstance(prompt, str):
        return [{"role": None, "content": prompt}]
    return [{"role": m["role"], "content": m["content"]} for m in prompt]
