#!/usr/bin/env python
"""Seconds per step of the bundled model's SFT at each thread setting, quiet and beside a
busy neighbour: what a shared machine (a laptop, a CI runner) does to torch's CPU threads.

Each setting runs ``rlhfkit sft --config configs/sft.yaml --max_steps STEPS`` in a fresh
process, with ``OMP_NUM_THREADS`` and ``OMP_WAIT_POLICY`` as given (``default``: unset, so that
rlhfkit's own choice is measured), once on the quiet machine and once beside ``--neighbours``
processes that each keep one core busy (a Python loop), one setting at a time. Prints the
median seconds per step (steps 6 on, logging included) per setting and load, the slowdown the
neighbour causes, the CPU other processes used during the quiet runs (distrust a quiet figure
where it exceeds ~0.1 cores) and the command line.

    .venv/bin/python benchmarks/bench_threads.py --steps 40
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common import MachineLoad, logged_steps

ROOT = Path(__file__).resolve().parents[1]
# (name, OMP_NUM_THREADS, OMP_WAIT_POLICY); None leaves the variable unset.
SETTINGS = [
    ("default", None, None),
    ("2 threads", "2", None),
    ("2 threads, passive wait", "2", "PASSIVE"),
    ("1 thread", "1", None),
]


def spin() -> None:
    """A neighbour: one core kept busy until it is terminated."""
    while True:
        pass


def step_seconds(threads: str | None, wait: str | None, steps: int) -> float:
    """The median seconds per step (from step 6) of one SFT run with these settings."""
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
    for name, value in (("OMP_NUM_THREADS", threads), ("OMP_WAIT_POLICY", wait)):
        env.pop(name, None)
        if value is not None:
            env[name] = value
    with tempfile.TemporaryDirectory() as out:
        command = [sys.executable, "-m", "rlhfkit.cli", "sft", "--config", "configs/sft.yaml",
                   "--max_steps", str(steps), "--output_dir", out, "--log_every", "1",
                   "--eval_data", "null", "--report_to", "[none]", "--save_every", "100000"]  # fmt: skip
        subprocess.run(command, cwd=ROOT, env=env, check=True, capture_output=True, timeout=1800)
        _, times = logged_steps(Path(out) / "metrics.jsonl")
    return statistics.median(times[5:])


def measure(steps: int, neighbours: int) -> dict[tuple[str, bool], float]:
    """Seconds per step for each setting, quiet (False) and beside the neighbours (True)."""
    results = {}
    for name, threads, wait in SETTINGS:
        load = MachineLoad()
        results[(name, False)] = step_seconds(threads, wait, steps)
        print(f"{name}: quiet {results[(name, False)]:.3f} s/step "
              f"(other processes: {load.foreign_cores():.2f} cores)", flush=True)  # fmt: skip
        busy = [multiprocessing.Process(target=spin, daemon=True) for _ in range(neighbours)]
        for process in busy:
            process.start()
        try:
            results[(name, True)] = step_seconds(threads, wait, steps)
        finally:
            for process in busy:
                process.terminate()
                process.join()
        print(f"{name}: beside {neighbours} busy {results[(name, True)]:.3f} s/step", flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--neighbours", type=int, default=1)
    args = parser.parse_args()
    results = measure(args.steps, args.neighbours)
    print(f"\n{os.cpu_count()} cores; median s/step of steps 6-{args.steps}")
    print("| setting | quiet | beside a busy neighbour | slowdown |\n| --- | --- | --- | --- |")
    for name, _, _ in SETTINGS:
        quiet, busy = results[(name, False)], results[(name, True)]
        print(f"| {name} | {quiet:.3f} | {busy:.3f} | {busy / quiet:.2f}x |")
    print("\ncommand:", shlex.join([sys.executable, *sys.argv]))


if __name__ == "__main__":
    main()
