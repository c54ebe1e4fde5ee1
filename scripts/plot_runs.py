"""Several runs' metrics against step, one panel per metric and one line per run, from each
run directory's ``metrics.jsonl``: to compare runs of one recipe from different starts, or of
different recipes on one task. Usage::

    python scripts/plot_runs.py runs/lc/grpo_lc runs/lc/grpo_base --labels "letter-case SFT" \\
        "the config's SFT" --metrics eval/score train/kl/ref --out docs/img/x.png

A metric a run did not log leaves its line out of that panel, with a warning.
"""

from __future__ import annotations

import argparse
import logging
import math
from pathlib import Path

from rlhfkit.tracking import read_jsonl, save_figure

logger = logging.getLogger("plot_runs")


def points(run_dir: Path, metric: str) -> list[tuple[int, float]]:
    """(step, value) of every finite value of ``metric`` in ``run_dir``'s metrics.jsonl."""
    rows = read_jsonl(Path(run_dir) / "metrics.jsonl")
    return [(r["step"], r[metric]) for r in rows if metric in r and math.isfinite(r[metric])]


def plot_runs(runs: list[Path], labels: list[str], metrics: list[str], out: Path) -> Path:
    """One panel per metric, one line per run; the PNG's path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(metrics), 1, figsize=(6, 2.8 * len(metrics)), squeeze=False)
    for ax, metric in zip(axes[:, 0], metrics, strict=True):
        for run, label in zip(runs, labels, strict=True):
            found = points(run, metric)
            if not found:
                logger.warning("%s logged no %s", run, metric)
                continue
            ax.plot(*zip(*found, strict=True), marker="." if len(found) < 50 else None, label=label)
        ax.set_title(metric)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return save_figure(fig, out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run directories (a stage's output_dir)")
    parser.add_argument("--labels", nargs="+", help="one per run (default: the directories)")
    parser.add_argument("--metrics", nargs="+", default=["eval/score"])
    parser.add_argument("--out", type=Path, required=True, help="the PNG to write")
    args = parser.parse_args()
    labels = args.labels or [str(run) for run in args.runs]
    if len(labels) != len(args.runs):
        parser.error(f"{len(labels)} labels for {len(args.runs)} runs")
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    print(plot_runs(args.runs, labels, args.metrics, args.out))


if __name__ == "__main__":
    main()
