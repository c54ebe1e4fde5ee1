"""Text from a model or a user is inert wherever it is shown: the report and TensorBoard's
markdown (no HTML, one table row per sample whatever its line breaks), and the terminal of
`rlhfkit chat` and `rlhfkit sample` (control characters shown as escapes, never emitted)."""

import logging
import re
from types import SimpleNamespace

import torch
from transformers import AutoTokenizer

from rlhfkit.config import ASSETS
from rlhfkit.evaluation.report import format_table, write_report
from rlhfkit.experience.generation import GenerationOutput
from rlhfkit.experience.scorers import FunctionScorer
from rlhfkit.interact.chat import SampleConfig, chat_loop, run_sample
from rlhfkit.interact.env import LMAgent
from rlhfkit.text import markdown_cell, terminal_text
from rlhfkit.tracking import _markdown_table

# An OSC retitle and a screen clear, a CSI as one C1 character, a carriage return that would
# overwrite the line, a right-to-left override, HTML that runs when rendered, a cell's pipe.
HOSTILE = (
    "\x1b]0;owned\x07\x1b[2J\x9b31m\rfake\u202etxt "
    '<script>alert(1)</script><img src=x onerror="alert(2)"> a|b [link](http://x) \\'
)
ACTIVE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")  # \t, \n pass


def assert_inert_in_a_terminal(shown: str) -> None:
    assert not ACTIVE.search(shown), repr(shown)
    assert "\\x1b]0;owned\\x07\\x1b[2J\\x9b31m\\rfake\\u202etxt" in shown


# --------------------------------------------------------------------------- terminals
def test_every_control_token_of_the_bundled_tokenizer_is_shown_as_an_escape():
    tokenizer = AutoTokenizer.from_pretrained(f"{ASSETS}/base")
    texts = [tokenizer.decode([i]) for i in range(len(tokenizer))]
    control = [t for t in texts if ACTIVE.search(t)]
    assert len(control) == 31  # every C0 byte but tab and newline, and DEL
    for text in control:
        shown = terminal_text(text)
        assert not ACTIVE.search(shown) and shown.startswith("\\")
    assert terminal_text("two\nlines\tand a tab") == "two\nlines\tand a tab"
    assert terminal_text("two\nlines", one_line=True) == "two\\nlines"


def test_chat_shows_a_hostile_reply_and_scorer_name_as_escapes(tiny_tokenizer):
    agent = SimpleNamespace(
        tokenizer=tiny_tokenizer, device="cpu", generate=lambda messages: HOSTILE + "\nline 2"
    )
    scorer = FunctionScorer(lambda prompts, responses: [0.5] * len(responses), "judge\x1b[8m")
    typed = iter(["hello", "/quit"])
    shown = []
    chat_loop(agent, scorer, read=lambda prompt: next(typed), write=shown.append)
    reply, reward = shown[:2]
    assert_inert_in_a_terminal(reply)
    assert reply.endswith("\nline 2")  # a reply keeps its lines
    assert reward == "[reward judge\\x1b[8m: 0.500]"


def test_sample_prints_each_continuation_on_one_inert_line(
    tiny_model_dir, tiny_tokenizer, monkeypatch, capsys
):
    ids = tiny_tokenizer(HOSTILE + "\nline 2", add_special_tokens=False)["input_ids"]

    def generate(self, query, query_mask):
        response = torch.tensor([ids] * len(query))
        return GenerationOutput(response, torch.ones_like(response), torch.zeros(len(query)) > 0)

    monkeypatch.setattr(LMAgent, "_generate", generate)
    data_logger = logging.getLogger("rlhfkit.data")
    level = data_logger.level
    run_sample(SampleConfig(model=str(tiny_model_dir), prompt=["Hi\x1b[31m", "Bye"]))
    assert data_logger.level == level  # quiet while it ran, as it was afterwards
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 6  # 2 prompts x 3 samples, one line each
    for line in lines:
        assert_inert_in_a_terminal(line)
        assert line.endswith("\\nline 2")
    assert lines[0].startswith("Hi\\x1b[31m |")


# --------------------------------------------------------------------------- markdown
def test_markdown_cells_hold_no_html_and_no_line_break():
    cell = markdown_cell(HOSTILE + "\r\nrow?\rrow?\u2028row?")
    assert "<script" not in cell and "<img" not in cell and "](" not in cell.replace("\\](", "")
    assert "&lt;script&gt;" in cell and "a\\|b" in cell
    assert not ACTIVE.search(cell) and "\n" not in cell
    assert cell.count("<br>") == 4  # HOSTILE's \r, then \r\n, \r and the line separator
    for table in (format_table([{"text": HOSTILE + "\r\nx"}]), _markdown_table([{"text": "a\rb"}])):
        header, rule, row = table.splitlines()  # one row, whatever the text's line breaks
        assert row.count(" | ") == 0 and row.startswith("| ") and row.endswith(" |")


def test_report_escapes_samples_and_model_names(tmp_path):
    name = '<img src=x onerror="alert(3)">'
    result = {
        "rows": [{"model": name, "gold": 0.1, "kl": 0.0}],
        "samples": [
            {"prompt": "It was\r\nso", "responses": {name: {"text": HOSTILE, "gold": 0.5}}},
            {"prompt": "Then", "responses": {name: {"text": "fine\rso |", "gold": None}}},
        ],
        "config": {},
    }
    text = write_report(tmp_path, result, {}).read_text(encoding="utf-8")
    assert "<script" not in text and "<img" not in text and "\r" not in text
    assert not ACTIVE.search(text.replace("\n", ""))
    section = text.split("## Samples side by side")[1].splitlines()
    samples = [line for line in section if line.startswith("|")]
    assert len(samples) == 4  # header, rule and one row per sample
    assert samples[2].startswith("| It was<br>so | \\x1b\\]0;owned")
    assert '&lt;img src=x onerror="alert(3)"&gt;' in text
