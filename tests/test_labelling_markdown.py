"""The safe Markdown renderer of the labelling app (guidelines.py): GitHub's tables, with the
safety rules of the guidelines kept, and model responses with their controls made visible."""

import re

from rlhfkit.labelling.guidelines import render_guidelines, render_response

TABLE = """| Verdict | When | Weight |
|:--|:-:|--:|
| **better** | correct and clear | 2 |
| <script>alert(1)</script> | [bad](javascript:alert(2)) | [ok](https://example.org/t) |
"""


def test_guidelines_tables_are_tables_aligned_by_class_and_still_safe():
    html = str(render_guidelines(TABLE))
    assert "<table>" in html and "|" not in html
    assert re.findall(r"<th[^>]*>([^<]*)</th>", html) == ["Verdict", "When", "Weight"]
    assert '<td class="align-left"><strong>better</strong></td>' in html
    assert '<th class="align-center">When</th>' in html and '<td class="align-right">2</td>' in html
    assert "style=" not in html  # the Content-Security-Policy refuses inline style
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "<script" not in html
    assert re.findall(r'href="([^"]*)"', html) == ["https://example.org/t"]
    assert "[bad](javascript:alert(2))" in html


def test_a_response_is_markdown_made_safe_with_its_controls_visible():
    text = "**Yes**\x1b[2J \u202eevil\r\n\n<img src=x onerror=alert(1)> ![p](https://e.org/p.png)"
    html = str(render_response(text))
    assert "<strong>Yes</strong>\\x1b[2J \\u202eevil" in html
    assert "\x1b" not in html and "\u202e" not in html and "\r" not in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html and "<img" not in html
    assert '<a href="https://e.org/p.png" rel="noopener noreferrer" target="_blank">p</a>' in html
