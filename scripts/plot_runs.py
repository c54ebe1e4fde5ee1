"""Several runs' metrics against step, one panel per metric and one line per run, from each
run directory's ``metrics.jsonl``: to compare runs of one recipe from different starts, or of
different recipes on one task. Usage::

    python scripts/plot_runs.py runs/lc/grpo_lc runs/lc/grpo_base --labels "letter-case SFT" \\
        "the config's SFT" --metrics eval/score train/kl/ref --out docs/img/x.png

A metric a run did not log leaves its line out of that panel, with a warning.

Recipes of different batch shapes compare per answer sampled, not per step:
``--responses_per_step 64 32`` puts each run's steps on an axis of responses sampled, and
``--responses_before`` shifts a run that went on from another (its second leg) past the first::

    python scripts/plot_runs.py runs/ppo runs/ppo2 runs/grpo --labels ... \\
        --responses_per_step 64 64 32 --responses_before 0 4608 0 --out docs/img/y.png
"""

from __future__ import annotations

import argparse
import logging
import math
from pathlib import Path

from rlhfkit.tracking import read_jsonl, save_figure

logger = logging.getLogger("plot_runs")


def points(run_dir: Path, metric: str, per_step: int = 1, before: int = 0) -> list[tuple]:
    """(x, value) of every finite value of ``metric`` in ``run_dir``'s metrics.jsonl, x being
    ``before + per_step * step``."""
    rows = read_jsonl(Path(run_dir) / "metrics.jsonl")
    finite = [r for r in rows if metric in r and math.isfinite(r[metric])]
    return [(before + per_step * r["step"], r[metric]) for r in finite]


def plot_runs(
    runs: list[Path],
    labels: list[str],
    metrics: list[str],
    out: Path,
    responses: list[tuple[int, int]] | None = None,
) -> Path:
    """One panel per metric, one line per run; the PNG's path. ``responses``, one
    (per step, before) a run, puts the runs on an axis of responses sampled instead of steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(metrics), 1, figsize=(6, 2.8 * len(metrics)), squeeze=False)
    for ax, metric in zip(axes[:, 0], metrics, strict=True):
        for run, label, scale in zip(runs, labels, responses or [(1, 0)] * len(runs), strict=True):
            found = points(run, metric, *scale)
            if not found:
                logger.warning("%s logged no %s", run, metric)
                continue
            ax.plot(*zip(*found, strict=True), marker="." if len(found) < 50 else None, label=label)
        ax.set_title(metric)
        ax.set_xlabel("responses sampled" if responses else "step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return save_figure(fig, out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run directories (a stage's output_dir)")
    parser.add_argument("--labels", nargs="+", help="one per run (default: the directories)")
    parser.add_argument("--metrics", nargs="+", default=["eval/score"])
    parser.add_argument("--out", type=Path, required=True, help="the PNG to write")
    parser.add_argument(
        "--responses_per_step", nargs="+", type=int, help="one per run: x in responses sampled"
    )
    parser.add_argument(
        "--responses_before", nargs="+", type=int, help="one per run: responses of earlier legs"
    )
    args = parser.parse_args()
    n = len(args.runs)
    labels = args.labels or [str(run) for run in args.runs]
    per_step, before = args.responses_per_step, args.responses_before or [0] * n
    for name, values in (
        ("labels", labels),
        ("responses_per_step", per_step or []),
        ("responses_before", before),
    ):
        if values and len(values) != n:
            parser.error(f"{len(values)} {name} for {n} runs")
    if args.responses_before and not per_step:
        parser.error("--responses_before needs --responses_per_step")
    responses = list(zip(per_step, before, strict=True)) if per_step else None
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    print(plot_runs(args.runs, labels, args.metrics, args.out, responses))


if __name__ == "__main__":
    main()
