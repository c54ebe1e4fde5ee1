"""Model text shown exactly as text: what a labeller sees of a prompt or a response.

HTML is escaped (Jinja2 autoescape in the templates; the page's script only ever sets
`textContent`) and markdown is never rendered. What escaping leaves alone are the characters
that draw nothing or rearrange the line: terminal escapes, NUL, backspace, bidi overrides
("Trojan Source", CVE-2021-42574), zero-width spaces and joiners. A model that writes them
would show the labeller something other than what the reward model reads, so `visible`
writes each as its escape: the controls and bidi characters as `text.terminal_text` does for
a terminal (`\\x1b`, `\\u202e`) and, the same way, the format characters that a terminal
prints harmlessly but a page does not show at all. `visible_html` also marks each (a span),
so that it cannot be mistaken for a backslash the model typed. Escapes rather than Unicode's
Control Pictures (U+241B for ESC): many fonts have no glyph for those, and a box says nothing.
Tabs and newlines stay (layout the labeller should see); a CRLF is one newline.
"""

from __future__ import annotations

import re

from markupsafe import Markup, escape

from rlhfkit.text import terminal_text

# Invisible on a page though inert in a terminal: the soft hyphen, the Mongolian vowel
# separator, zero-width space, non-joiner and joiner, the line and paragraph separators, the
# invisible operators, the deprecated format characters, the BOM, interlinear annotations.
_FORMAT = re.compile(
    "[\u00ad\u180e\u200b-\u200d\u2028\u2029\u2060-\u2064\u206a-\u206f\ufeff\ufff9-\ufffb]"
)
# Every character `visible` might change (the rest is printable ASCII, tab or newline).
_SUSPECT = re.compile("[^\t\n\x20-\x7e]")


def visible(text: str) -> str:
    """`text` with every invisible or layout-changing character written as its escape."""
    shown = terminal_text(text.replace("\r\n", "\n"))
    return _FORMAT.sub(lambda m: f"\\u{ord(m.group()):04x}", shown)


def visible_html(text: str) -> Markup:
    """`visible(text)` as HTML: escaped, each replaced character in a `ctrl` span."""
    text = text.replace("\r\n", "\n")
    parts, start = [], 0
    for match in _SUSPECT.finditer(text):
        character = match.group()
        shown = visible(character)
        if shown != character:
            span = Markup('<span class="ctrl" title="U+{:04X}">{}</span>')
            parts += [escape(text[start : match.start()]), span.format(ord(character), shown)]
            start = match.end()
    parts.append(escape(text[start:]))
    return Markup("").join(parts)


def prompt_turns(prompt: str | list[dict[str, str]]) -> list[dict[str, str | None]]:
    """A prompt as the turns a page shows: one turn without a role for a plain text prompt,
    one per message (role and content) for a chat prompt."""
    if isinstance(prompt, str):
        return [{"role": None, "content": prompt}]
    return [{"role": m["role"], "content": m["content"]} for m in prompt]
