#!/usr/bin/env python
"""Side-by-side table of the ``rlhfkit_<shape>_<workload>.json`` and ``trl_<shape>_<workload>.json``
results in a folder (written by ``run_all.sh``), one row per shape and workload: seconds per
iteration and their ratio rlhfkit / TRL (below 1: rlhfkit faster), generation tokens/s, MFU,
peak CUDA memory and its ratio.

    python benchmarks/gpu/summarize.py RESULTS_DIR   # also writes summary.md and results.json there
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

WORKLOADS = ("ppo", "grpo", "dpo", "sft")
SHAPES = ("gpt2", "qwen0.5b")
LIBRARIES = ("rlhfkit", "trl")
RUNS = [(shape, workload) for shape in SHAPES for workload in WORKLOADS]


def load(folder: Path, library: str, shape: str, workload: str) -> dict | None:
    path = folder / f"{library}_{shape}_{workload}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def fmt(value, spec: str, scale: float = 1.0) -> str:
    return "-" if value is None else f"{value * scale:{spec}}"


def ratio(a, b) -> str:
    return "-" if a is None or b is None or not b else f"{a / b:.2f}x"


def peak(result: dict | None):
    if result is None:
        return None
    return result.get("peak_allocated_gib", result.get("peak_rss_gib"))


def rows(folder: Path) -> list[list[str]]:
    out = []
    for shape, workload in RUNS:
        ours = load(folder, "rlhfkit", shape, workload)
        trl = load(folder, "trl", shape, workload)
        if ours is None and trl is None:
            continue

        def get(result, key):
            return None if result is None else result.get(key)

        out.append(
            [
                shape,
                workload,
                fmt(get(ours, "sec_per_iter_median"), ".3f"),
                fmt(get(trl, "sec_per_iter_median"), ".3f"),
                ratio(get(ours, "sec_per_iter_median"), get(trl, "sec_per_iter_median")),
                fmt(get(ours, "gen_tokens_per_s"), ".0f"),
                fmt(get(trl, "gen_tokens_per_s"), ".0f"),
                fmt(get(ours, "mfu"), ".1f", 100),
                fmt(get(trl, "mfu"), ".1f", 100),
                fmt(peak(ours), ".2f"),
                fmt(peak(trl), ".2f"),
                ratio(peak(ours), peak(trl)),
                fmt(get(ours, "peak_reserved_gib"), ".2f"),
                fmt(get(trl, "peak_reserved_gib"), ".2f"),
                fmt(get(ours, "response_length_mean"), ".1f"),
                fmt(get(trl, "response_length_mean"), ".1f"),
            ]
        )
    return out


HEADER = [
    "shape",
    "workload",
    "rlhfkit s/it",
    "TRL s/it",
    "time ratio",
    "rlhfkit gen tok/s",
    "TRL gen tok/s",
    "rlhfkit MFU %",
    "TRL MFU %",
    "rlhfkit peak alloc GiB",
    "TRL peak alloc GiB",
    "mem ratio",
    "rlhfkit reserved GiB",
    "TRL reserved GiB",
    "rlhfkit resp len",
    "TRL resp len",
]


def main() -> None:
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    table = rows(folder)
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(row) + " |" for row in table]
    devices, versions = set(), {}
    everything = [
        result
        for shape, workload in RUNS
        for library in LIBRARIES
        if (result := load(folder, library, shape, workload)) is not None
    ]
    for result in everything:
        devices.add(result["device"])
        found = result.get("settings", {}).get("versions", {})
        versions.setdefault(json.dumps(found, sort_keys=True), []).append(
            f"{result['library']} {result['shape']} {result['workload']}"
        )
    lines += [f"- {', '.join(runs)}: {found}" for found, runs in versions.items()]
    lines.insert(0, f"device: {', '.join(sorted(devices)) or '?'}; time ratio = rlhfkit / TRL\n")
    text = "\n".join(lines)
    print(text)
    (folder / "summary.md").write_text(text + "\n")
    (folder / "results.json").write_text(json.dumps(everything, indent=1) + "\n")


if __name__ == "__main__":
    main()
