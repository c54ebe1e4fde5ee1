#!/usr/bin/env python
"""What a checkpoint's manifest costs: writing it at save (every file hashed, the manifest
flushed) and verifying it at load (every file hashed again), for the model directories given.

Each directory is copied under a temporary directory first (the copy is what is timed, in the
page cache as a freshly written checkpoint is); ``verify`` is timed with its cache of verified
directories cleared, and once more with it (what the second and third load of one model pay).
``--synthetic-gib`` adds one file of that size (random bytes), e.g. 1.6 for a 135M model's
fp32 weights with AdamW's two moments. Prints medians of ``--runs`` runs, the spread, the
hashing throughput and the command.

    .venv/bin/python benchmarks/bench_manifest.py src/rlhfkit/assets/base \\
        runs/models/SmolLM2-135M-Instruct --synthetic-gib 1.6
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from rlhfkit import checkpoint as ckpt


def _timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def measure(directory: Path, runs: int) -> dict[str, list[float]]:
    """Seconds to write the manifest of a copy of ``directory``, to verify it uncached, and
    to verify it again (cached), ``runs`` times each."""
    times: dict[str, list[float]] = {"write": [], "verify": [], "verify again": []}
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / directory.name
        shutil.copytree(directory, copy, ignore=shutil.ignore_patterns(ckpt.MANIFEST_FILE))
        for _ in range(runs):
            times["write"].append(_timed(lambda: ckpt.write_manifest(copy)))
            ckpt._verified.clear()
            times["verify"].append(_timed(lambda: ckpt.verify(copy)))
            times["verify again"].append(_timed(lambda: ckpt.verify(copy)))
    return times


def synthetic(gib: float, root: Path) -> Path:
    """A directory holding one file of ``gib`` GiB of random bytes."""
    directory = root / f"synthetic-{gib:g}GiB"
    directory.mkdir()
    chunk = bytes(range(256)) * (1 << 14)  # 4 MiB, varied bytes
    with (directory / "optimizer.safetensors").open("wb") as f:
        for _ in range(int(gib * (1 << 30)) // len(chunk)):
            f.write(chunk)
    return directory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dirs", nargs="*", type=Path, help="model or checkpoint directories")
    parser.add_argument("--synthetic-gib", type=float, default=0.0)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        dirs = list(args.dirs)
        if args.synthetic_gib:
            dirs.append(synthetic(args.synthetic_gib, Path(tmp)))
        print("| directory | MB | write (s) | verify (s) | verify again (s) | hashing MB/s |")
        print("| --- | --- | --- | --- | --- | --- |")
        for directory in dirs:
            mb = sum(p.stat().st_size for p in directory.rglob("*") if p.is_file()) / 1e6
            times = measure(directory, args.runs)
            medians = {k: statistics.median(v) for k, v in times.items()}
            cells = " | ".join(
                f"{medians[k]:.3f} ({min(v):.3f}-{max(v):.3f})" for k, v in times.items()
            )
            print(f"| {directory.name} | {mb:.1f} | {cells} | {mb / medians['verify']:.0f} |")
    print(f"\nmedians of {args.runs} runs (min-max); command: {shlex.join(sys.argv)}")


if __name__ == "__main__":
    main()
