"""Write docs/trl_options.md, the table of every TRL option and rlhfkit's answer to it, from
``rlhfkit.trl_names`` (the tables the CLI answers from), so the document cannot drift from
what the commands say; tests/test_trl_names.py checks that the file is this script's output.

Usage::

    .venv/bin/python scripts/trl_options_table.py [docs/trl_options.md]
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

from rlhfkit.trl_names import STAGES, TABLES, Answer, Table

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "trl_options.md"

INTRO = """\
# TRL's options in rlhfkit

Every option of TRL's `SFTConfig`, `RewardConfig`, `DPOConfig`, `GRPOConfig`, `RLOOConfig`
(TRL 1.16) and `PPOConfig` (TRL 1.12, the last release with PPO), of transformers'
`TrainingArguments` that they extend, of the `ModelConfig` and `ScriptArguments` of TRL's
scripts, and the names earlier releases had, with rlhfkit's answer in the stage that
corresponds: **same** (rlhfkit's option has TRL's name; what differs, if anything), the option
to write instead, or **not an option** (why, and what to do instead). rlhfkit takes one name
per option and no alias.

`rlhfkit <stage>` answers the same way: a TRL name given as an option, or as a key of a
`--config` file, stops the run before anything loads (exit code 2) with "did you mean" and
ours, or with why there is no such option. A stage's own table answers first, then the shared
ones at the end.

This file is written by `scripts/trl_options_table.py` from `src/rlhfkit/trl_names.py`, the
tables the commands read; `tests/test_trl_names.py` checks that it is up to date, that every
answer names an option the stage has and, where TRL's source is at hand (`RLHFKIT_TRL_SOURCES`),
that every option of TRL's classes is answered.
"""


def cell(answer: Answer) -> str:
    """The rlhfkit column of one row."""
    if answer.kind == "same":
        return f"same: {answer.note}" if answer.note else "same"
    if answer.kind == "ours":
        return f"`{answer.spelling}`" + (f" ({answer.note})" if answer.note else "")
    return f"not an option: {answer.note}"


def section(table: Table) -> list[str]:
    """One table of the document: a heading naming the commands, then a row per option."""
    commands = (
        "every training stage, after its own table"
        if table.commands == STAGES
        else ", ".join(f"`rlhfkit {c}`" for c in table.commands)
    )
    lines = [f"## {table.title}", "", f"For {commands}.", "", "| TRL option | rlhfkit |"]
    lines.append("| --- | --- |")
    for name in sorted(table.options):
        lines.append(f"| `{name}` | {cell(table.options[name]).replace('|', '/')} |")
    return [*lines, ""]


def render() -> str:
    """The whole document."""
    kinds = Counter(a.kind for table in TABLES for a in table.options.values())
    rows = sum(kinds.values())
    summary = (
        f"{rows} rows in {len(TABLES)} tables: {kinds['same']} the same option, "
        f"{kinds['ours']} ours under another name, {kinds['missing']} not an option."
    )
    contents = [f"- [{t.title}](#{anchor(t.title)})" for t in TABLES]
    lines = [INTRO, summary, "", *contents, ""]
    for table in TABLES:
        lines += section(table)
    return "\n".join(lines).rstrip("\n") + "\n"


def anchor(title: str) -> str:
    """GitHub's anchor of a heading: lower case, spaces to dashes, punctuation dropped."""
    kept = "".join(c for c in title.lower() if c.isalnum() or c in " -_")
    return kept.replace(" ", "-")


def main(argv: list[str]) -> int:
    path = Path(argv[0]) if argv else DOC
    path.write_text(render(), encoding="utf-8")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
