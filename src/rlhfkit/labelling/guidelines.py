"""Markdown made safe: the labelling guidelines (a Markdown file given to `rlhfkit label serve
--guidelines`, shown with every task and on a page of its own) and the responses of a task.

Rendered with markdown-it-py (CommonMark and its table extension, as GitHub writes tables),
made safe for a page that labellers trust: raw HTML is not rendered but shown as text
(`html: False`), an image is shown as a link to it (the page loads nothing from elsewhere; its
Content-Security-Policy would block it anyway), and a link is a link only when it points to
http or https (`javascript:`, `data:`, relative and other links stay plain text). Links open in
a new tab without handing it this page (`rel="noopener noreferrer"`), so that following one
does not lose the task at hand. A table column's alignment is a class, not markdown-it's
`style` attribute, which the Content-Security-Policy refuses. The guidelines are rendered once,
at start; a response each time its page is shown, its controls and bidi characters made
visible first (`display.visible`), as in its raw form.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

from markdown_it import MarkdownIt
from markdown_it.common.utils import escapeHtml
from markupsafe import Markup

from rlhfkit.errors import UsageError
from rlhfkit.labelling.display import visible

SAFE_SCHEMES = ("http://", "https://")
MAX_BYTES = 512 * 1024


def _safe_link(url: str) -> bool:
    return url.strip().lower().startswith(SAFE_SCHEMES)


def _open_link_apart(renderer: Any, tokens: Any, index: int, options: Any, env: Any) -> str:
    """markdown-it's rule for `link_open` (bound to the renderer, hence its first argument)."""
    tokens[index].attrSet("rel", "noopener noreferrer")
    tokens[index].attrSet("target", "_blank")
    return renderer.renderToken(tokens, index, options, env)


def _image_as_link(renderer: Any, tokens: Any, index: int, options: Any, env: Any) -> str:
    """An image as a link to it, named by its alt text: the page loads nothing from elsewhere."""
    token = tokens[index]
    alt = escapeHtml(renderer.renderInlineAsText(token.children, options, env) or "image")
    src = escapeHtml(token.attrGet("src") or "")
    return f'<a href="{src}" rel="noopener noreferrer" target="_blank">{alt}</a>'


def _aligned_by_class(renderer: Any, tokens: Any, index: int, options: Any, env: Any) -> str:
    """markdown-it's rule for `th_open` and `td_open`: `style="text-align:right"` becomes
    `class="align-right"` (style.css), since the page allows no inline style."""
    token = tokens[index]
    style = token.attrGet("style")
    if style is not None:
        del token.attrs["style"]
        token.attrSet("class", "align-" + str(style).removeprefix("text-align:"))
    return renderer.renderToken(tokens, index, options, env)


@cache
def _renderer() -> MarkdownIt:
    md = MarkdownIt("commonmark", {"html": False}).enable("table")
    md.validateLink = _safe_link  # type: ignore[method-assign]
    md.add_render_rule("link_open", _open_link_apart)
    md.add_render_rule("image", _image_as_link)
    md.add_render_rule("th_open", _aligned_by_class)
    md.add_render_rule("td_open", _aligned_by_class)
    return md


def render_guidelines(text: str) -> Markup:
    """The guidelines `text` (Markdown) as HTML safe to put in a page."""
    return Markup(_renderer().render(text))


def render_response(text: str) -> Markup:
    """A model's response `text` as Markdown made safe, every control and bidi embedding,
    override or isolate shown as its escape (the Jinja filter `markdown` of the task page)."""
    return Markup(_renderer().render(visible(text)))


def read_guidelines(path: str | Path) -> Markup:
    """The guidelines file at `path`, rendered; `UsageError` naming the file if it cannot be
    read as UTF-8 text of at most `MAX_BYTES`."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as error:
        raise UsageError(f"guidelines {path}: cannot be read ({error.strerror})") from None
    if len(data) > MAX_BYTES:
        raise UsageError(f"guidelines {path}: {len(data)} bytes, more than {MAX_BYTES}")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise UsageError(f"guidelines {path}: not UTF-8 text") from None
    return render_guidelines(text)
