"""The best evaluated model of a run, a part the loop holds: ``best/`` written whenever an
evaluation's ``metric_for_best_model`` beats the best so far, and ``final/`` made from it at
the end where ``load_best_model_at_end`` asks (Hugging Face Trainer's options of those names;
here ``best/`` is a whole model directory, so it survives the checkpoints ``keep_last`` deletes).

The decision is the main process's, told to the others, so that every process writes (under
FSDP: gathers) the same model. The run's state (``TrainerState.best_metric`` and
``best_step``) says which step ``best/`` holds; ``reconcile`` makes the directory agree with
the state a run resumes from.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from accelerate import Accelerator
from accelerate.utils import broadcast_object_list

from rlhfkit import checkpoint as ckpt
from rlhfkit.checkpoint import atomic_dir
from rlhfkit.config import TrainConfig
from rlhfkit.errors import UsageError
from rlhfkit.trainers.state import TrainerState

logger = logging.getLogger(__name__)


class BestModel:
    """``best/`` of one run (see the module docstring).

    ``write(path, **notes)`` writes the run's model directory at ``path`` (the loop's
    ``write_model_dir``: the trained models, the tokenizer and the state with ``notes``)."""

    def __init__(
        self,
        config: TrainConfig,
        path: Path,
        accelerator: Accelerator,
        write: Callable[..., None],
    ) -> None:
        self.config, self.path, self.accelerator, self.write = config, path, accelerator, write

    def keep_if_best(self, state: TrainerState, metrics: dict[str, float]) -> None:
        """Write ``best/`` if this evaluation's ``metric_for_best_model`` beats the best so
        far (``state``'s, updated). A metric the evaluation does not give is a `UsageError`
        naming those it gives."""
        key = self.config.best_metric_key
        if key is None:
            return
        if key not in metrics:
            given = ", ".join(f"eval/{k}" for k in sorted(metrics)) or "none"
            raise UsageError(
                f"{type(self.config).__name__}.metric_for_best_model: "
                f"{self.config.metric_for_best_model!r} is not a metric this run's evaluation "
                f"gives (it gives: {given}). Set one of those and resume"
            )
        value = [metrics[key]]
        if self.accelerator.num_processes > 1:  # one decision, the main process's
            broadcast_object_list(value)
        if not self.config.is_better(value[0], state.best_metric):
            return
        state.best_metric, state.best_step = value[0], state.step
        self.write(self.path, **self.note(state))
        logger.info(
            "best so far: eval/%s %.4g at step %d (%s)", key, value[0], state.step, self.path
        )

    def note(self, state: TrainerState) -> dict[str, Any]:
        """What ``final/`` and ``best/`` say of the best model: its metric, value and step."""
        if self.config.best_metric_key is None or state.best_step < 0:
            return {}
        best = {
            "metric": f"eval/{self.config.best_metric_key}",
            "value": state.best_metric,
            "step": state.best_step,
        }
        return {"best": best}

    def make_final(self, state: TrainerState) -> None:
        """``final/`` as a copy of ``best/`` (checked against its manifest), marked complete
        and naming the last step, whose model stays in the newest checkpoint."""
        if self.accelerator.is_main_process:
            ckpt.verify(self.path)
            saved = ckpt.read_json(self.path / ckpt.STATE_FILE)
            with atomic_dir(self.config.final_dir) as tmp:
                own = shutil.ignore_patterns(ckpt.MANIFEST_FILE, ckpt.STATE_FILE)
                shutil.copytree(self.path, tmp, ignore=own, dirs_exist_ok=True)
                final_state = {**saved, "complete": True, "last_step": state.step}
                ckpt.write_json(final_state, tmp / ckpt.STATE_FILE)
        self.accelerator.wait_for_everyone()
        logger.info(
            "final/: the best model, of step %d (the last, %d, is in %s)",
            state.best_step,
            state.step,
            ckpt.latest_checkpoint(self.path.parent),
        )

    def reconcile(self, state: TrainerState) -> None:
        """Make ``best/`` hold the model of ``state``'s ``best_step``, or nothing: a ``best/``
        of another step (written after the checkpoint this run resumed from, or left by a run
        without a checkpoint) is removed, and the best is chosen again from the evaluations to
        come. One the state names but that is gone is said in a warning."""
        state_file = self.path / ckpt.STATE_FILE
        held = ckpt.read_json(state_file).get("best_step", -1) if state_file.is_file() else -1
        if held == state.best_step:
            return
        if state.best_step >= 0 and held == -1:
            logger.warning(
                "%s of step %d is gone: the best model is chosen again from the evaluations "
                "to come",
                self.path,
                state.best_step,
            )
        state.best_metric, state.best_step = None, -1
        self.accelerator.wait_for_everyone()  # every process read it before it goes
        if self.accelerator.is_main_process and self.path.exists():
            logger.info("removing %s: it is not the best model of this run's state", self.path)
            shutil.rmtree(self.path)
