"""What the benchmarks share: offline Hugging Face settings, the machine's load, the
step times read back from a run's ``metrics.jsonl``, and rlhfkit's scalar-head models from a
transformers sequence-classification reward model.

Import it before torch or transformers: the offline settings are read when they load.
"""

from __future__ import annotations

import os
import resource
import statistics
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def busy_cpu_s() -> float:
    """Machine-wide busy CPU seconds since boot (all cores), from /proc/stat."""
    from rlhfkit.runtime.threads import busy_cpu_seconds

    return busy_cpu_seconds()


def own_cpu_s() -> float:
    """CPU seconds this process and its finished children have used (user + system)."""
    from rlhfkit.runtime.threads import own_cpu_seconds

    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own_cpu_seconds() + children.ru_utime + children.ru_stime


class MachineLoad:
    """From its creation on: the cores other processes kept busy, on average (the machine is
    shared, and a benchmark taken beside another job measures that job too). The benchmark's
    own work, in this process or in the runs it started and waited for, is not counted."""

    def __init__(self) -> None:
        self.busy, self.own, self.wall = busy_cpu_s(), own_cpu_s(), time.perf_counter()

    def foreign_cores(self) -> float:
        wall = time.perf_counter() - self.wall
        return max(0.0, busy_cpu_s() - self.busy - (own_cpu_s() - self.own)) / wall


def peak_rss_mib() -> float:
    """This process's peak resident memory so far, in MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def spread(values: list[float], fmt: str) -> str:
    """ "min / median / max" of ``values``, each formatted with ``fmt``."""
    low, mid, high = min(values), statistics.median(values), max(values)
    return f"{low:{fmt}} / {mid:{fmt}} / {high:{fmt}}"


def logged_steps(metrics: Path) -> tuple[list[dict], list[float]]:
    """The training rows of a run logged every step, and each step's wall time: the time
    between consecutive log lines (logging included, as TRL's step timer measures it); the
    first step's own timer for the first."""
    from rlhfkit.tracking import read_jsonl

    rows = [r for r in read_jsonl(metrics) if "train/step_seconds" in r]
    stamps = [r["time"] for r in rows]
    times = [rows[0]["train/step_seconds"]] + [
        b - a for a, b in zip(stamps, stamps[1:], strict=False)
    ]
    return rows, times


def scored_head_from_seqcls(path: Path, cls):
    """rlhfkit's scalar-head model ``cls`` (``RewardModel`` / ``ValueModel``) holding the weights
    of a ``...ForSequenceClassification`` (num_labels=1; its score layer has no bias)."""
    import torch
    from transformers import AutoModelForSequenceClassification

    seqcls = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1)
    model = cls(seqcls.base_model)
    with torch.no_grad():
        model.score.weight.copy_(seqcls.score.weight)
        model.score.bias.zero_()
    return model
