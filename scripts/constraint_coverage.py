"""How often a model's own samples meet each constraint kind of the instructions task, from a
rankings file (K responses per prompt, as ``make_instruction_data.py`` writes them).

Reinforcement learning can only raise what the policy sometimes does: a group of K samples in
which none meets a constraint gives GRPO no advantage for it, and a reward model trained on
comparisons where it is never met cannot learn to pay for it. Per kind this prints the samples
that ask for it, the share of them that meet it, the prompts that ask for it, and the share of
those with at least one of their K samples meeting it (pass@K). Usage::

    python scripts/constraint_coverage.py src/rlhfkit/assets/data/instructions_k8/rankings/train.jsonl
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

from rlhfkit.tasks.instructions import passed_constraints

COLUMNS = ("kind", "samples", "met", "prompts", "met_by_one_of_k")


def coverage(records: list[dict]) -> list[dict]:
    """One row per constraint kind (``COLUMNS``), sorted by kind, of ``records`` (each with a
    ``prompt`` and its ``responses``)."""
    asked, met, prompts, met_once = Counter(), Counter(), Counter(), Counter()
    for record in records:
        once: Counter = Counter()
        for response in record["responses"]:
            for kind, passed in passed_constraints(record["prompt"], response).items():
                asked[kind] += 1
                met[kind] += passed
                once[kind] |= passed
        for kind, passed in once.items():
            prompts[kind] += 1
            met_once[kind] += passed
    return [
        {
            "kind": kind,
            "samples": asked[kind],
            "met": met[kind] / asked[kind],
            "prompts": prompts[kind],
            "met_by_one_of_k": met_once[kind] / prompts[kind],
        }
        for kind in sorted(asked)
    ]


def markdown(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in rows:
        cells = [f"{v:.3f}" if isinstance(v, float) else str(v) for v in row.values()]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rankings", type=Path, help="JSONL of {prompt, responses, ...}")
    args = parser.parse_args()
    with args.rankings.open() as lines:
        records = [json.loads(line) for line in lines if line.strip()]
    print(markdown(coverage(records)))


if __name__ == "__main__":
    main()
