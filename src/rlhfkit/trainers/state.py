"""Where a run is: the loop's state besides weights, optimiser and random streams, written
to each checkpoint's ``trainer_state.json`` and read back on resume."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass
class TrainerState:
    """Where a run is: everything besides weights, optimiser and RNG needed to resume it."""

    step: int = 0
    """Steps of the loop done (optimiser steps; PPO iterations)."""
    epoch: int = 0
    """Current epoch (0-based)."""
    batch_index: int = 0
    """Micro-batches of the current epoch already consumed by this process."""
    total_steps: int = 0
    """Steps the run will make."""
    complete: bool = False
    """True once the final model is written."""
    eval_metrics: dict[str, float] = dataclasses.field(default_factory=dict)
    """The most recent evaluation results."""
    evaluated_at: int = -1
    """The step of the most recent evaluation (a resumed run does not repeat it)."""
    skipped_steps: int = 0
    """Steps skipped for a loss or gradient that was not finite (`skip_nonfinite_steps`)."""
    best_metric: float | None = None
    """The best value of `metric_for_best_model` so far (None: no evaluation gave one)."""
    best_step: int = -1
    """The step whose model `best/` holds (-1: none)."""
    config_changes: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    """Settings changed on a resume: the step they apply from and each field's old and new
    value (`RESUMABLE_CHANGES`, or any with `resume_override`)."""
