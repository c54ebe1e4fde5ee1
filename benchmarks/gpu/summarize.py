#!/usr/bin/env python
"""Side-by-side table of the ``rlhfkit_<shape>_<workload>.json`` and ``trl_<shape>_<workload>.json``
results in a folder (written by ``run_all.sh``), one row per shape and workload: seconds per
iteration and their ratio rlhfkit / TRL (below 1: rlhfkit faster), generation tokens/s, MFU,
peak CUDA memory and its ratio. Then, where ``run_all.sh`` ran them: sampling against the bare
decode loop (``decode_<shape>.json``), the shipped pipeline's time and results table
(``smollm2/pipeline_run.json``), and every step's exit code and wall time (``*.step.json``).

    python benchmarks/gpu/summarize.py RESULTS_DIR   # also writes summary.md and results.json there
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from workloads import SHAPES, WORKLOADS  # noqa: E402

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


def markdown(header: list[str], body: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in body]


def decoding(folder: Path) -> tuple[list[str], list[dict]]:
    """The sampling tables of ``decode_<shape>.json``: each variant against the bare loop."""
    lines, found = [], []
    for shape in SHAPES:
        path = folder / f"decode_{shape}.json"
        if not path.is_file():
            continue
        result = json.loads(path.read_text())
        found.append(result | {"shape": shape})
        variants = result["variants"]
        floor = variants.get("bare", next(iter(variants.values())))["seconds"]
        body = [
            [name, fmt(v["seconds"], ".3f"), fmt(v["tokens_per_s"], ".0f"),
             fmt(v["ms_per_step"], ".2f"), fmt(v["peak_gib"], ".2f"), ratio(v["seconds"], floor)]
            for name, v in variants.items()
        ]  # fmt: skip
        lines += [
            f"\nSampling at the {shape} shape ({result['params'] / 1e6:.0f}M parameters):"
            f" {result['batch']} rows x {result['new_tokens']} new tokens after"
            f" {result['prompt_tokens']} prompt tokens; `{result['command']}`\n",
            *markdown(["variant", "s/call", "tokens/s", "ms/step", "peak GiB", "x bare"], body),
        ]
    return lines, found


def sharded(folder: Path) -> tuple[list[str], list[dict]]:
    """The FSDP runs of one process (``fsdp_<stage>/``): median seconds per step after the
    first, and whether the checkpoint holds the sharded layout (one optimiser file per process)."""
    found = []
    for run in sorted(folder.glob("fsdp_*/metrics.jsonl")):
        seconds = [
            row["train/step_seconds"]
            for line in run.read_text().splitlines()
            if "train/step_seconds" in (row := json.loads(line))
        ]
        layouts = {p.name for p in run.parent.glob("checkpoint-*/optimizer*.safetensors")}
        found.append({
            "step": run.parent.name,
            "steps": len(seconds),
            "sec_per_step_median": statistics.median(seconds[1:] or seconds) if seconds else None,
            "sharded_checkpoint": layouts == {"optimizer_0.safetensors"},
        })  # fmt: skip
    if not found:
        return [], []
    body = [
        [r["step"], str(r["steps"]), fmt(r["sec_per_step_median"], ".3f"),
         "yes" if r["sharded_checkpoint"] else "no"]
        for r in found
    ]  # fmt: skip
    header = ["run", "steps", "s/step (median)", "sharded checkpoint"]
    return ["\nFSDP2 in one process (a group of one):\n", *markdown(header, body)], found


def pipeline(folder: Path) -> tuple[list[str], list[dict]]:
    """The shipped pipeline's wall time, stage times and results table, if it ran."""
    path = folder / "smollm2" / "pipeline_run.json"
    if not path.is_file():
        return [], []
    run = json.loads(path.read_text())
    stages = ", ".join(
        f"{name} {timing['seconds']:.0f} s"
        for name, timing in run["stages"].items()
        if isinstance(timing, dict) and "seconds" in timing
    )
    lines = [
        f"\n`{run['config']}` on {run['base_model']}{' (dry run)' if run['dry_run'] else ''}:"
        f" {run['seconds']:.0f} s ({stages}); `{run['command']}`\n",
        run["results_table"],
    ]
    return lines, [run | {"step": "smollm2"}]


def steps(folder: Path) -> tuple[list[str], list[dict]]:
    """Every step's exit code and wall seconds, in the order they ran."""
    ran = sorted(folder.glob("*.step.json"), key=lambda path: path.stat().st_mtime)
    found = [json.loads(path.read_text()) for path in ran]
    body = [[r["step"], str(r["exit"]), str(r["seconds"])] for r in found]
    return (["\nSteps (exit 124: timed out):\n", *markdown(["step", "exit", "s"], body)], found)


def main() -> None:
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    lines = markdown(HEADER, rows(folder))
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
    for section in (decoding, sharded, pipeline, steps):
        more, found = section(folder)
        lines += more
        everything += found
    text = "\n".join(lines)
    print(text)
    (folder / "summary.md").write_text(text + "\n")
    (folder / "results.json").write_text(json.dumps(everything, indent=1) + "\n")


if __name__ == "__main__":
    main()
