"""Run tracking: a JSONL log of every metric, TensorBoard, wandb or MLflow, a progress bar,
sample texts, plots.

One `Tracker` per run directory. Every `log()` call writes all its numbers to `metrics.jsonl`
(one JSON object per call, with `step` and wall-clock `time`, easy to load with pandas or
`json`; always written, since resume and the report read it) and to the trackers `report_to`
names: TensorBoard (to browse; the default), wandb, MLflow. wandb and MLflow go through
accelerate's trackers (`accelerate.tracking`): one run per run directory, named after it, in
the `project` given, with the config as its hyperparameters, finished by `close()`. A resumed
run continues the same wandb/MLflow run (`tracker_runs.json` keeps its id); as their steps only
go forward, what an interrupted run logged after its checkpoint stays as it was logged there.

A person watches the few metrics a stage names (`watch`: loss and lr for SFT, score, KL and
entropy for PPO): in a terminal on one tqdm bar, with log messages printed above it (tqdm's
logging redirection), and elsewhere (CI, a file, `nohup`) as one log line per `log()` call,
with no carriage-return redraws. Sample texts go to TensorBoard's text tab, wandb's tables and
`samples.jsonl`, so reward hacking is *seen*, not guessed. `plot()` draws PNG curves from the
JSONL with matplotlib's headless Agg backend.

Only the main process should write; pass `enabled=False` on the others and every method becomes
a no-op. On resume, pass `resume_step`: lines logged after that step by the interrupted run are
dropped from the JSONL files and TensorBoard purges its events after it (from `resume_step + 1`:
the checkpoint's own step is kept, as the resumed run does not log it again), so curves
neither double nor lose a step. Sample texts in TensorBoard's markdown are escaped
(`text.markdown_cell`).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import math
import os
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from rlhfkit.errors import UsageError, disk_errors
from rlhfkit.text import markdown_cell

logger = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
SAMPLES_FILE = "samples.jsonl"
RUNS_FILE = "tracker_runs.json"  # the wandb / MLflow run ids, for a resumed run to continue

REPORT_TO = ("tensorboard", "wandb", "mlflow")
"""The trackers `report_to` may name (each its own package); "none" alone names none."""


def report_to_problem(report_to: Sequence[str]) -> str | None:
    """What a `report_to` list should be instead, if it names an unknown tracker, "none"
    beside a tracker, or a tracker whose package is not installed; None if it is fine."""
    allowed = f"a list of {', '.join(REPORT_TO)}, or [none] (metrics.jsonl is always written)"
    if isinstance(report_to, str):
        return allowed
    unknown = [name for name in report_to if name not in (*REPORT_TO, "none")]
    if unknown or ("none" in report_to and len(set(report_to)) > 1):
        return allowed
    for name in report_to:
        if name != "none" and importlib.util.find_spec(name) is None:
            return f"trackers that are installed: {name} is not (`pip install {name}`)"
    return None


def _to_number(value: Any) -> float:
    """A Python float from a float, int, 0-dim tensor or numpy scalar."""
    return float(value.item() if hasattr(value, "item") else value)


def format_metrics(values: Mapping[str, Any]) -> str:
    """Metrics as people read them: ``nll 4.242, perplexity 69.5`` (4 significant digits)."""
    return ", ".join(f"{name} {_to_number(value):.4g}" for name, value in values.items())


def is_terminal() -> bool:
    """Whether progress goes to a terminal (a bar), rather than a file or a pipe (lines)."""
    return sys.stderr.isatty()


def hide_library_progress_bars() -> None:
    """One bar per stage: transformers draws its own for every model it loads or saves
    ("Loading weights", "Writing model shards"), datasets and the hub theirs."""
    import datasets
    import huggingface_hub
    import transformers

    transformers.utils.logging.disable_progress_bar()
    datasets.disable_progress_bars()
    huggingface_hub.utils.disable_progress_bars()


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """All JSON objects of a JSONL file (empty list if the file does not exist)."""
    path = Path(path)
    if not path.exists():
        return []
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _truncate_after(path: Path, step: int) -> None:
    """Drop rows logged after `step` (left by an interrupted run that is being resumed)."""
    rows = [row for row in read_jsonl(path) if row.get("step", 0) <= step]
    text = "".join(json.dumps(row) + "\n" for row in rows)
    with disk_errors(path, len(text)), path.open("w", encoding="utf-8") as f:
        f.write(text)


class Tracker:
    """Log metrics and samples of one run to TensorBoard, JSONL files and a progress bar.

    Args:
        run_dir: directory for `metrics.jsonl`, `samples.jsonl` and TensorBoard events (`tb/`).
        enabled: write anything at all (False on non-main processes).
        resume_step: the step a resumed run restarts from; later rows are discarded.
        report_to: the trackers to write to besides `metrics.jsonl` (`REPORT_TO`).
        project: the wandb project / MLflow experiment of the run (MLflow's
            MLFLOW_EXPERIMENT_NAME, when set, wins, as accelerate has it).
        hparams: the run's config, stored as the hyperparameters of a new wandb/MLflow run.
    """

    def __init__(
        self,
        run_dir: str | Path,
        *,
        enabled: bool = True,
        resume_step: int | None = None,
        report_to: Sequence[str] = ("tensorboard",),
        project: str = "rlhfkit",
        hparams: Mapping[str, Any] | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.enabled = enabled
        self._writer = None
        self._bar: tqdm | None = None
        self._progress: tuple[str, int] | None = None  # (what, total steps) when not a bar
        self._watch: dict[str, str] = {}
        self._redirect = contextlib.ExitStack()
        self._external: list[Any] = []  # accelerate's wandb / MLflow trackers
        problem = report_to_problem(report_to)
        if problem is not None:
            raise UsageError(f"report_to = {list(report_to)!r}: expected {problem}")
        if not enabled:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if resume_step is not None:
            for name in (METRICS_FILE, SAMPLES_FILE):
                if (self.run_dir / name).exists():
                    _truncate_after(self.run_dir / name, resume_step)
        if "tensorboard" in report_to:
            # Imported here: TensorBoard's import is slow and not needed when disabled.
            from torch.utils.tensorboard import SummaryWriter

            purge_step = None if resume_step is None else resume_step + 1
            self._writer = SummaryWriter(str(self.run_dir / "tb"), purge_step=purge_step)
        for name in ("wandb", "mlflow"):
            if name in report_to:
                self._external.append(
                    _start_run(name, self.run_dir, project, bool(resume_step), hparams or {})
                )

    @property
    def metrics_path(self) -> Path:
        return self.run_dir / METRICS_FILE

    @property
    def samples_path(self) -> Path:
        return self.run_dir / SAMPLES_FILE

    def start_progress(
        self,
        total: int,
        initial: int = 0,
        desc: str = "train",
        watch: Mapping[str, str] | None = None,
    ) -> None:
        """Show progress over `total` steps, `initial` of them already done, with the metrics
        `watch` maps a short name to (``{"loss": "train/loss"}``): on a bar in a terminal,
        else as a log line at each `log()`."""
        if not self.enabled:
            return
        self._watch = dict(watch or {})
        if not is_terminal():
            self._progress = (desc, total)
            return
        self._redirect.enter_context(logging_redirect_tqdm())  # messages above the bar
        self._bar = tqdm(total=total, initial=initial, desc=desc, dynamic_ncols=True)

    def advance(self, n: int = 1) -> None:
        """Move the progress bar by `n` steps."""
        if self._bar is not None:
            self._bar.update(n)

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        """Record scalar `metrics` at `step` (numbers, 0-dim tensors or numpy scalars); none
        writes nothing."""
        if not self.enabled or not metrics:
            return
        values = {key: _to_number(value) for key, value in metrics.items()}
        line = json.dumps({"step": int(step), "time": time.time(), **values}) + "\n"
        with (
            disk_errors(self.metrics_path, len(line)),
            self.metrics_path.open("a", encoding="utf-8") as f,
        ):
            f.write(line)
        if self._writer is not None:
            for key, value in values.items():
                self._writer.add_scalar(key, value, step)
        for tracker in self._external:
            tracker.log(values, step=int(step))
        watched = {name: values[key] for name, key in self._watch.items() if key in values}
        if watched and self._bar is not None:
            self._bar.set_postfix_str(format_metrics(watched), refresh=False)
        elif watched and self._progress is not None:
            desc, total = self._progress
            logger.info("%s step %d/%d: %s", desc, step, total, format_metrics(watched))

    def log_samples(
        self, rows: Sequence[Mapping[str, Any]], step: int, tag: str = "samples"
    ) -> None:
        """Record text samples (e.g. prompt, response, score) at `step`.

        Each row is one JSON object in `samples.jsonl` (with `step` and `tag`); TensorBoard gets
        them as one markdown table under `tag`.
        """
        if not self.enabled or not rows:
            return
        lines = "".join(
            json.dumps({"step": int(step), "tag": tag, **row}, default=str) + "\n" for row in rows
        )
        with (
            disk_errors(self.samples_path, len(lines)),
            self.samples_path.open("a", encoding="utf-8") as f,
        ):
            f.write(lines)
        if self._writer is not None:
            self._writer.add_text(tag, _markdown_table(rows), step)
        for tracker in self._external:
            if tracker.name == "wandb":  # MLflow has no table of accelerate's; see samples.jsonl
                columns = list(dict.fromkeys(key for row in rows for key in row))
                data = [[row.get(c) for c in columns] for row in rows]
                tracker.log_table(tag, columns=columns, data=data, step=int(step))

    def plot(self, keys: Iterable[str], png_path: str | Path) -> Path:
        """Draw each metric in `keys` against step (one panel each) from `metrics.jsonl`."""
        import matplotlib

        matplotlib.use("Agg")  # headless: no display on servers and in CI
        import matplotlib.pyplot as plt

        keys = list(keys)
        rows = read_jsonl(self.metrics_path)
        fig, axes = plt.subplots(len(keys), 1, figsize=(6, 2.5 * len(keys)), squeeze=False)
        for ax, key in zip(axes[:, 0], keys, strict=True):
            points = [(r["step"], r[key]) for r in rows if key in r and math.isfinite(r[key])]
            if not points:
                logger.warning("plot: no values logged for %r in %s", key, self.metrics_path)
            ax.plot([p[0] for p in points], [p[1] for p in points], marker=".")
            ax.set_title(key)
            ax.set_xlabel("step")
            ax.grid(alpha=0.3)
        return save_figure(fig, png_path)

    def close(self) -> None:
        """Flush and close the trackers (finishing a wandb/MLflow run) and the progress bar."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        self._redirect.close()
        self._progress = None
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        for tracker in self._external:
            tracker.finish()
        self._external = []

    def __enter__(self) -> Tracker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _start_run(name: str, run_dir: Path, project: str, resuming: bool, hparams: Mapping) -> Any:
    """A started wandb or MLflow run (accelerate's tracker) named after `run_dir`: a new one,
    given `hparams`, or when `resuming`, the one whose id `RUNS_FILE` keeps."""
    from accelerate import PartialState
    from accelerate.tracking import MLflowTracker, WandBTracker

    PartialState()  # accelerate's trackers log through its state (the loop's Accelerator made it)
    runs_path = run_dir / RUNS_FILE
    runs = json.loads(runs_path.read_text(encoding="utf-8")) if runs_path.is_file() else {}
    run_id = runs.get(name) if resuming else None
    run_name = run_dir.resolve().name
    if name == "wandb":
        # wandb's files go in the run directory, unless WANDB_DIR says where.
        where = {} if os.environ.get("WANDB_DIR") else {"dir": str(run_dir)}
        tracker = WandBTracker(project, name=run_name, id=run_id, resume="allow", **where)
    else:
        tracker = MLflowTracker(experiment_name=project, run_id=run_id, run_name=run_name)
    tracker.start()
    if run_id is None:
        tracker.store_init_configuration(dict(hparams))
    runs[name] = tracker.run.id if name == "wandb" else tracker.active_run.info.run_id
    runs_path.write_text(json.dumps(runs) + "\n", encoding="utf-8")
    return tracker


def _markdown_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """Rows as a markdown table, each text inert and in its cell (`text.markdown_cell`)."""
    columns = list(dict.fromkeys(key for row in rows for key in row))
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += [
        "| " + " | ".join(markdown_cell(str(row.get(c, ""))) for c in columns) + " |"
        for row in rows
    ]
    return "\n".join(lines)


def save_figure(fig, png_path: str | Path) -> Path:
    """Lay out ``fig``, write it as a PNG (its folder made if needed) and free it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    png_path = Path(png_path)
    png_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png_path, dpi=100)
    plt.close(fig)
    return png_path
