"""The training loop every rlhfkit trainer shares, on `accelerate` (not the HF `Trainer`).

A trainer subclasses `Trainer` and supplies two methods:

- `compute_loss(batch) -> (loss, metrics)`: the loss of one micro-batch (a scalar tensor to
  minimise) and scalar metrics to log;
- `evaluate() -> metrics`: held-out metrics (called in eval mode, without gradients).

The base owns everything else: AdamW and its schedule (`optim.py`), gradient accumulation,
gradient clipping, periodic evaluation, logging (`rlhfkit.tracking.Tracker`), checkpoints and
exact resume.

Data position: each epoch visits the training examples in a permutation drawn from
`(seed, epoch)` alone, so a resumed run rebuilds the same order and skips the micro-batches it
has already seen. Micro-batches flow across epoch boundaries; an optimiser step consumes
`gradient_accumulation_steps` of them. On several processes, micro-batch `i` of the epoch's list
goes to process `i % num_processes`.

Checkpoints (`checkpoint-<step>/`, written to a temporary directory and renamed when complete):
the model via `save_pretrained` (safetensors) with its tokenizer, `optimizer.safetensors`,
`rng_state_<rank>.safetensors` (python, numpy, torch, CUDA generators) and `trainer_state.json`
(step, epoch, batch index, scheduler state, config). Nothing is pickled. A finished run also
writes `final/` (model + tokenizer + `trainer_state.json` with `"complete": true`); with
`resume=True` a complete run is skipped. Evaluation runs with the random streams saved and
restored around it, so `eval_every` never changes the training trajectory.

Departures from the HF Trainer: each micro-batch's loss is its own mean, divided by the number
of accumulated micro-batches (no re-weighting by token counts across micro-batches); no fp16
loss scaling and no sharded optimisers (FSDP, DeepSpeed).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.utils import send_to_device, set_seed
from torch import nn

from rlhfkit import checkpoint as ckpt
from rlhfkit.checkpoint import atomic_dir
from rlhfkit.config import TrainConfig
from rlhfkit.models.loading import prepare_model
from rlhfkit.runtime.allocator import retain_freed_memory
from rlhfkit.tracking import Tracker, format_metrics
from rlhfkit.trainers.optim import build_optimizer, build_scheduler

logger = logging.getLogger(__name__)

OPTIMIZER_FILE = "optimizer.safetensors"
# What a person watches on an RL stage's progress bar (PPO, GRPO, RLOO): short name -> key.
WATCH_RL = {"score": "train/score/mean", "kl": "train/kl/ref", "entropy": "train/policy/entropy"}
Batch = dict[str, Any]


@dataclasses.dataclass
class TrainerState:
    """Where a run is: everything besides weights, optimiser and RNG needed to resume it."""

    step: int = 0
    """Optimiser steps done."""
    epoch: int = 0
    """Current epoch (0-based)."""
    batch_index: int = 0
    """Micro-batches of the current epoch already consumed by this process."""
    total_steps: int = 0
    """Optimiser steps the run will make."""
    complete: bool = False
    """True once the final model is written."""
    eval_metrics: dict[str, float] = dataclasses.field(default_factory=dict)
    """The most recent evaluation results."""


def _scalar(value: Any) -> float:
    """A float from a number or a (possibly grad-carrying) 0-dim tensor."""
    return float(value.detach()) if isinstance(value, torch.Tensor) else float(value)


@functools.lru_cache(maxsize=8)
def epoch_order(num_examples: int, seed: int, epoch: int) -> np.ndarray:
    """The permutation of example indices for `epoch`; a function of `(seed, epoch)` only.
    Cached (one call per micro-batch) and read-only, since callers share the array."""
    order = np.random.default_rng([seed, epoch]).permutation(num_examples)
    order.flags.writeable = False
    return order


class Trainer:
    """Base training loop; subclasses implement `compute_loss` and `evaluate`.

    Args:
        config: loop settings (a `TrainConfig` or a stage config derived from it).
        model: the module to train; only parameters with `requires_grad` are optimised.
        train_data: training examples, indexable; `collate_fn` turns a list of them into a batch.
        collate_fn: list of examples -> dict of tensors (moved to the device by the loop).
        tokenizer: saved next to every checkpoint and the final model, if given.
        accelerator: share one between trainers; a new one is made from `config` if None.
    """

    plot_keys: tuple[str, ...] = ("train/loss", "train/lr")
    # The few metrics a person watches on the progress bar: short name -> logged key.
    watch: dict[str, str] = {"loss": "train/loss", "lr": "train/lr"}

    def __init__(
        self,
        config: TrainConfig,
        model: nn.Module,
        train_data: Sequence[Any],
        collate_fn: Callable[[list[Any]], Batch],
        *,
        tokenizer: Any = None,
        accelerator: Accelerator | None = None,
    ) -> None:
        if len(train_data) == 0:
            raise ValueError("train_data is empty: nothing to train on")
        self.config = config
        self.accelerator = accelerator or Accelerator(
            cpu=config.cpu, mixed_precision=config.mixed_precision
        )
        self.train_data = train_data
        self.collate_fn = collate_fn
        self.tokenizer = tokenizer
        self.output_dir = Path(config.output_dir)
        retain_freed_memory(self.accelerator.device)  # no page faults on each step's activations
        prepare_model(model, config.attention)
        self.model, self.optimizer = self.accelerator.prepare(model, build_optimizer(model, config))
        self.state = TrainerState(total_steps=self._count_total_steps())
        self.scheduler = build_scheduler(self.optimizer, config, self.state.total_steps)
        self.tracker: Tracker | None = None
        self._evaluated_at = self._saved_at = -1  # steps of the latest evaluation / checkpoint

    # ----------------------------------------------------------------- to implement
    def compute_loss(self, batch: Batch) -> tuple[torch.Tensor, dict[str, Any]]:
        """Loss (scalar tensor) and metrics of one micro-batch."""
        raise NotImplementedError

    def evaluate(self) -> dict[str, float]:
        """Held-out metrics; the loop calls this in eval mode under `torch.no_grad()`."""
        return {}

    # ----------------------------------------------------------------- data position
    @property
    def batches_per_epoch(self) -> int:
        """Micro-batches each process sees per epoch (the last one may be smaller)."""
        world = self.accelerator.num_processes
        num_batches = -(-len(self.train_data) // self.config.batch_size)  # ceil
        # Every process must see the same number of micro-batches, or DDP would wait forever.
        return max(num_batches // world, 1)

    def _count_total_steps(self) -> int:
        if self.config.max_steps is not None:
            return self.config.max_steps
        micro_batches = self.config.num_epochs * self.batches_per_epoch
        return max(micro_batches // self.config.gradient_accumulation_steps, 1)

    def _next_batch(self) -> Batch:
        """The next micro-batch of this process, advancing (epoch, batch_index)."""
        if self.state.batch_index >= self.batches_per_epoch:
            self.state.epoch += 1
            self.state.batch_index = 0
        order = epoch_order(len(self.train_data), self.config.seed, self.state.epoch)
        size = self.config.batch_size
        start = (self.state.batch_index * self.accelerator.num_processes) * size
        start += self.accelerator.process_index * size
        self.state.batch_index += 1
        examples = [self.train_data[int(i)] for i in order[start : start + size]]
        return send_to_device(self.collate_fn(examples), self.accelerator.device)

    def eval_batches(
        self, examples: Sequence[Any], collate_fn: Callable[[list[Any]], Batch]
    ) -> Iterator[Batch]:
        """`examples` in order, `eval_batch_size` at a time, collated and on the device.

        Every process evaluates all of them: simple and exact, at the cost of duplicated work.
        """
        size = self.config.eval_batch_size
        for start in range(0, len(examples), size):
            batch = collate_fn(list(examples[start : start + size]))
            yield send_to_device(batch, self.accelerator.device)

    # ----------------------------------------------------------------- the loop
    def train(self, stop_after: int | None = None) -> TrainerState:
        """Train to `total_steps` (resuming if configured), then evaluate and save `final/`.

        `stop_after`: make at most this many optimiser steps in this call, then write a
        checkpoint and return (a time-sliced job; the next `train()` resumes there).
        """
        if self._prepare_run():
            return self.state
        target = self.state.total_steps
        if stop_after is not None:
            target = min(target, self.state.step + stop_after)
        self.tracker = Tracker(
            self.output_dir,
            enabled=self.accelerator.is_main_process,
            resume_step=self.state.step,
            tensorboard=self.config.tensorboard,
        )
        self.tracker.start_progress(
            self.state.total_steps, self.state.step, type(self).__name__, self.watch
        )
        try:
            self._run_steps(target)
            if self.state.step < self.state.total_steps:
                if self._saved_at != self.state.step:
                    self.save_checkpoint()
                return self.state
            self._finish()
        finally:
            self.tracker.close()
        return self.state

    def _prepare_run(self) -> bool:
        """Resume or clear `output_dir`; True if the run is already complete."""
        if self.config.resume:
            if ckpt.is_complete(self.output_dir):
                logger.info("%s holds a finished run; skipping", self.output_dir)
                self._restore_state(ckpt.read_json(self.config.final_dir / ckpt.STATE_FILE))
                return True
            latest = ckpt.latest_checkpoint(self.output_dir)
            if latest is not None:
                self.load_checkpoint(latest)  # restores the random streams too
                return False
        elif self.accelerator.is_main_process:
            for old in [*ckpt.checkpoint_dirs(self.output_dir), self.output_dir / "final"]:
                logger.warning("resume=False: deleting %s", old)
                shutil.rmtree(old, ignore_errors=True)
        self.accelerator.wait_for_everyone()
        if self.accelerator.is_main_process:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            ckpt.write_json(self.config.to_dict(), self.output_dir / "train_config.json")
        # Seeded here, not at construction: the run then depends only on its config, whatever
        # ran in this process between building the trainer and training it.
        set_seed(self.config.seed)
        return False

    def _run_steps(self, target: int) -> None:
        self.model.train()
        cfg = self.config
        sums: dict[str, float] = {}
        count = 0
        while self.state.step < target:
            started = time.perf_counter()
            metrics = self._optimizer_step()
            metrics["step_seconds"] = time.perf_counter() - started
            for key, value in metrics.items():
                sums[key] = sums.get(key, 0.0) + value
            count += 1
            self.state.step += 1
            self.tracker.advance()
            if self.state.step % cfg.log_every == 0 or self.state.step == target:
                self._log_train(sums, count)
                sums, count = {}, 0
            if cfg.eval_every and self.state.step % cfg.eval_every == 0:
                self.run_evaluation()
            if cfg.save_every and self.state.step % cfg.save_every == 0:
                self.save_checkpoint()

    def _optimizer_step(self) -> dict[str, float]:
        """Accumulate gradients over the micro-batches of one step, clip, step. Returns the
        micro-batch-averaged metrics plus `grad_norm` and `lr`."""
        accumulation = self.config.gradient_accumulation_steps
        totals: dict[str, float] = {}
        for index in range(accumulation):
            batch = self._next_batch()
            # No gradient all-reduce until the last micro-batch. The division is done here, not
            # by Accelerator(gradient_accumulation_steps=...): that setting is process-global
            # state shared by every Accelerator, so two trainers would overwrite each other's.
            last = index == accumulation - 1
            sync = nullcontext() if last else self.accelerator.no_sync(self.model)
            with sync, self.accelerator.autocast():
                loss, metrics = self.compute_loss(batch)
                self.accelerator.backward(loss / accumulation)
            for key, value in {"loss": loss, **metrics}.items():
                totals[key] = totals.get(key, 0.0) + _scalar(value) / accumulation
        params = [p for p in self.model.parameters() if p.requires_grad]
        max_norm = self.config.max_grad_norm or float("inf")  # inf: measure without clipping
        grad_norm = self.accelerator.clip_grad_norm_(params, max_norm)
        totals["lr"] = self.scheduler.get_last_lr()[0]
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        totals["grad_norm"] = float(grad_norm)
        return totals

    def _log_train(self, sums: dict[str, float], count: int) -> None:
        """Log the mean of each metric over the last `count` steps (averaged over processes)."""
        keys = sorted(sums)
        means = torch.tensor([sums[k] / count for k in keys], device=self.accelerator.device)
        means = self.accelerator.reduce(means, reduction="mean")
        metrics = {f"train/{k}": v for k, v in zip(keys, means.tolist(), strict=True)}
        metrics["train/epoch"] = self.state.epoch + self.state.batch_index / self.batches_per_epoch
        self.tracker.log(metrics, self.state.step)

    def run_evaluation(self) -> dict[str, float]:
        """`evaluate()` in eval mode, without gradients or RNG side effects; logs `eval/*`."""
        self.model.eval()
        with ckpt.preserved_rng(), torch.no_grad(), self.accelerator.autocast():
            metrics = {k: float(v) for k, v in self.evaluate().items()}
        self.model.train()
        self._evaluated_at = self.state.step
        if metrics:
            self.state.eval_metrics = metrics
            if self.tracker is not None:
                self.tracker.log({f"eval/{k}": v for k, v in metrics.items()}, self.state.step)
            logger.info("eval step %d: %s", self.state.step, format_metrics(metrics))
        return metrics

    def _finish(self) -> None:
        """Final evaluation, last checkpoint, `final/` with the complete marker, curves."""
        if self._evaluated_at != self.state.step:
            self.run_evaluation()
        if self._saved_at != self.state.step:
            self.save_checkpoint()
        self.on_train_end()
        self.state.complete = True
        if self.accelerator.is_main_process:
            with atomic_dir(self.config.final_dir) as tmp:
                self.save_model(tmp)
                ckpt.write_json(self._state_json(), tmp / ckpt.STATE_FILE)
            keys = [*self.plot_keys, *(f"eval/{k}" for k in self.state.eval_metrics)]
            self.tracker.plot(keys, self.output_dir / "curves.png")
        self.accelerator.wait_for_everyone()
        logger.info("finished: final model in %s", self.config.final_dir)

    def on_train_end(self) -> None:
        """Hook run after the last step and evaluation, before `final/` is written."""

    # ----------------------------------------------------------------- checkpoints
    @property
    def unwrapped_model(self) -> nn.Module:
        return self.accelerator.unwrap_model(self.model)

    def save_model(self, path: Path) -> None:
        """Write the model (and tokenizer) so that `from_pretrained(path)` loads it."""
        self.unwrapped_model.save_pretrained(path)
        if self.tokenizer is not None:
            self.tokenizer.save_pretrained(path)

    def load_model_weights(self, path: Path) -> None:
        """Load the weights `save_model` wrote into the model being trained (for resume)."""
        model = self.unwrapped_model
        saved = type(model).from_pretrained(path)
        model.load_state_dict(saved.state_dict())

    def _state_json(self) -> dict[str, Any]:
        return {
            **dataclasses.asdict(self.state),
            "scheduler": self.scheduler.state_dict(),
            "config": self.config.to_dict(),
        }

    def save_checkpoint(self) -> Path:
        """Write `checkpoint-<step>` atomically, then delete all but the newest `keep_last`."""
        path = self.output_dir / f"{ckpt.CHECKPOINT_PREFIX}{self.state.step}"
        acc = self.accelerator
        # Each process writes its own RNG state into one shared temporary directory; the main
        # process renames it into place once everyone is done.
        tmp = self.output_dir / f".tmp-{path.name}"
        if acc.is_main_process:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            self.save_model(tmp)
            ckpt.save_state(self.optimizer.state_dict(), tmp / OPTIMIZER_FILE)
        acc.wait_for_everyone()
        ckpt.save_state(ckpt.rng_state(), tmp / f"rng_state_{acc.process_index}.safetensors")
        acc.wait_for_everyone()
        if acc.is_main_process:
            ckpt.write_json(self._state_json(), tmp / ckpt.STATE_FILE)
            shutil.rmtree(path, ignore_errors=True)
            tmp.rename(path)
            for old in ckpt.rotate_checkpoints(self.output_dir, self.config.keep_last):
                logger.info("deleted old checkpoint %s", old)
        acc.wait_for_everyone()
        self._saved_at = self.state.step
        logger.info("saved checkpoint %s", path)
        return path

    def _restore_state(self, saved: dict[str, Any]) -> None:
        """Take step, data position and last evaluation from a saved trainer state."""
        fields = {f.name for f in dataclasses.fields(TrainerState)} - {"total_steps"}
        self.state = dataclasses.replace(self.state, **{k: saved[k] for k in fields & set(saved)})

    def load_checkpoint(self, path: Path) -> None:
        """Restore model, optimiser, scheduler, RNG streams and data position from `path`."""
        saved = ckpt.read_json(path / ckpt.STATE_FILE)
        if saved["total_steps"] != self.state.total_steps:
            message = "%s planned %d steps; continuing to this run's %d"
            logger.warning(message, path, saved["total_steps"], self.state.total_steps)
        self.load_model_weights(path)
        self.optimizer.load_state_dict(ckpt.load_state(path / OPTIMIZER_FILE))
        self.scheduler.load_state_dict(saved["scheduler"])
        self._restore_state(saved)
        rng_file = path / f"rng_state_{self.accelerator.process_index}.safetensors"
        if rng_file.is_file():
            ckpt.set_rng_state(ckpt.load_state(rng_file))
        else:
            logger.warning("%s missing: random streams are not restored exactly", rng_file)
        logger.info("resumed from %s at step %d", path, self.state.step)
