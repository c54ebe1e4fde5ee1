#!/usr/bin/env python
"""Seconds a reward model takes for one pass over the same comparisons, each pair a batch
element (TRL's way, and rlhfkit's default) or each prompt's comparisons one element
(``group_by_prompt``, InstructGPT's way: each distinct response scored once).

Workload: the comparisons of the first ``--prompts`` prompts of a data folder's train split
(default: the instructions task's 8 samples a prompt, ``instructions_k8``), full fine-tuning
of the SFT model at the CPU pipeline's shapes (``bench_smollm2.py``'s reward-model settings:
``max_length`` 192, bf16 autocast, SDPA; and ``padding_free``): 16 pairs a step, against
``--grouped-batch`` prompts a step grouped. Each side runs in a fresh process, ``--runs``
rounds, alternating. Prints per side the pass's training seconds (the steps' own timers
summed: loading and tokenising are left out), the seconds per 100 comparisons, the steps,
the process's peak RSS and the cores other processes kept busy meanwhile; then the ratio of
the medians. The pass's last training loss is printed too, to show both trained.

    make smollm2   # and an SFT model, e.g. the CPU pipeline's
    .venv/bin/python benchmarks/bench_reward_grouping.py \\
        --model runs/instructions_smollm2/sft/final --prompts 48 --runs 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_smollm2 import FIXED_DATA  # noqa: E402
from common import MachineLoad, peak_rss_mib, spread  # noqa: E402

from rlhfkit.config import RewardConfig  # noqa: E402
from rlhfkit.tasks import ASSETS_DIR  # noqa: E402
from rlhfkit.tracking import read_jsonl  # noqa: E402
from rlhfkit.trainers.reward import run_reward  # noqa: E402

K8_DATA = ASSETS_DIR / "data" / "instructions_k8"
SIDES = {"pairs": False, "grouped": True}


def first_prompts(data: Path, prompts: int, out: Path) -> int:
    """The comparisons of the first ``prompts`` distinct prompts of ``data``'s train split,
    written to ``out``; how many."""
    seen: set[str] = set()
    kept = []
    for line in (data / "comparisons" / "train.jsonl").read_text(encoding="utf-8").splitlines():
        prompt = json.loads(line)["prompt"]
        if prompt not in seen and len(seen) == prompts:
            continue
        seen.add(prompt)
        kept.append(line)
    out.write_text("\n".join(kept) + "\n", encoding="utf-8")
    return len(kept)


def one_pass(args, grouped: bool) -> dict:
    """One reward-model pass in this process: its figures."""
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "comparisons.jsonl"
        comparisons = first_prompts(args.data, args.prompts, data)
        load = MachineLoad()
        settings = {**FIXED_DATA, "batch_size": args.grouped_batch if grouped else 16}
        run_reward(
            RewardConfig(
                model=args.model,
                train_data=str(data),
                output_dir=str(Path(tmp) / "rm"),
                num_epochs=1,
                group_by_prompt=grouped,
                learning_rate=3e-5,
                padding_free=True,
                **settings,
            )
        )
        rows = [r for r in read_jsonl(Path(tmp) / "rm" / "metrics.jsonl") if "train/loss" in r]
        return {
            "train_s": sum(r["train/step_seconds"] for r in rows),
            "steps": len(rows),
            "comparisons": comparisons,
            "last_loss": rows[-1]["train/loss"],
            "rss_mib": peak_rss_mib(),
            "foreign_cores": load.foreign_cores(),
        }


def in_child(side: str, args) -> dict:
    """``one_pass`` for ``side`` in a fresh process (its peak RSS its own)."""
    cmd = [sys.executable, __file__, "--child", side, "--model", args.model, "--data",
           str(args.data), "--prompts", str(args.prompts),
           "--grouped-batch", str(args.grouped_batch)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    results = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    if proc.returncode or not results:
        sys.exit(f"{side} failed:\n{proc.stderr[-3000:]}")
    return json.loads(results[-1].removeprefix("RESULT "))


def report(sides: dict[str, list[dict]]) -> None:
    """Each side's figures over the rounds (min / median / max), and the ratio of medians."""
    print("\nside: train s; s per 100 comparisons; steps; peak RSS MiB; other processes (max); "
          "last loss")  # fmt: skip
    for side, rows in sides.items():
        per_100 = [100 * r["train_s"] / r["comparisons"] for r in rows]
        print(
            f"  {side:8s} {spread([r['train_s'] for r in rows], '.1f')}; "
            f"{spread(per_100, '.2f')}; {rows[0]['steps']}; "
            f"{spread([r['rss_mib'] for r in rows], '.0f')}; "
            f"{max(r['foreign_cores'] for r in rows):.2f}; "
            f"{statistics.median(r['last_loss'] for r in rows):.3f}"
        )
    med = {s: statistics.median(r["train_s"] for r in rows) for s, rows in sides.items()}
    rss = {s: statistics.median(r["rss_mib"] for r in rows) for s, rows in sides.items()}
    print(
        f"  grouped / pairs: time {med['grouped'] / med['pairs']:.2f}x, "
        f"peak RSS {rss['grouped'] / rss['pairs']:.2f}x"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="runs/instructions_smollm2/sft/final")
    parser.add_argument("--data", type=Path, default=K8_DATA)
    parser.add_argument("--prompts", type=int, default=48)
    parser.add_argument("--grouped-batch", type=int, default=4, help="prompts a grouped step")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--child", choices=SIDES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(one_pass(args, SIDES[args.child])), flush=True)
        return
    print("command: " + " ".join([Path(sys.executable).name, *sys.argv]), flush=True)
    print(f"date: {time.strftime('%Y-%m-%d %H:%M')}", flush=True)
    sides: dict[str, list[dict]] = {side: [] for side in SIDES}
    for _ in range(args.runs):
        for side in SIDES:
            sides[side].append(in_child(side, args))
            row = sides[side][-1]
            print(f"{side}: {row['train_s']:.1f} s, {row['comparisons']} comparisons", flush=True)
    report(sides)


if __name__ == "__main__":
    main()
