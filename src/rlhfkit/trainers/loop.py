"""The training loop every rlhfkit trainer shares, on `accelerate` (not the HF `Trainer`).

A step of the loop is `train_step()`. By default it is one optimiser step over
`gradient_accumulation_steps` micro-batches of the training data (taken by
`optim.MinibatchLearner`, the one accumulation loop of every stage), and a trainer supplies:

- `compute_loss(batch) -> (loss, metrics)`: the loss of one micro-batch (a scalar tensor to
  minimise) and scalar metrics to log;
- `evaluate() -> metrics`: held-out metrics (called in eval mode, without gradients).

An RL trainer (PPO, GRPO) overrides `train_step()` instead: its step is one iteration, "make
experience from the next batch of prompts, then learn from it for some passes of minibatches",
with one optimiser step per minibatch and `Learner`. How long a run is comes from the config
and the data (`TrainConfig.loop_steps` and its stages' own), never from a stage's methods, so
nothing of a stage runs before it is built. Whatever the step, the base owns the rest:
the device and precision (`runtime.machine.Runtime`), the learners (each an AdamW and its
schedule, `optim.py`), periodic evaluation, logging (`rlhfkit.tracking.Tracker`), checkpoints
and exact resume.

Data position: each epoch visits the training examples in a permutation drawn from
`(seed, epoch)` alone, so a resumed run rebuilds the same order and skips the micro-batches it
has already seen. Micro-batches flow across epoch boundaries; an optimiser step consumes
`gradient_accumulation_steps` of them. On several processes, micro-batch `i` of the epoch's list
goes to process `i % num_processes`.

Checkpoints (`checkpoint-<step>/`, written to a temporary directory and renamed when complete)
are a part the loop holds, `checkpoints.Checkpoints`: the trained models in the layout the
stage names (`checkpoint_layout`), each learner's AdamW state, every random stream (the
trainer's own in `generators`), and `trainer_state.json` with the state of the trainer's own
objects (`state_parts`); `trainers/checkpoints.py` says what each file holds. Nothing is
pickled. Temporary directories a killed run left are removed when the next one starts; a run
that stops on an error writes `failed.json` (its step and the error), which the next start
removes. A finished run also writes `final/` (model + tokenizer + `trainer_state.json` with
`"complete": true`); with `resume=True` a complete run is skipped. Evaluation runs with the
random streams saved and restored around it, so `eval_every` never changes the training
trajectory.

The best model: with `metric_for_best_model`, each evaluation that beats the best so far
writes `best/` as `final/` is written, its step and value in the trainer state (and so in every
checkpoint after it); `load_best_model_at_end` copies it as `final/`. A resumed run keeps the
`best/` of the step its checkpoint names; one written after that checkpoint (by evaluations the
interrupted run made past it) is removed, and those evaluations are made again.

What a run writes is checked when read (`checkpoint.py`): each checkpoint and `final/` ends
with a manifest of its files' sizes and SHA-256; resume takes the newest checkpoint that
verifies, setting a damaged one aside with a warning, and a damaged `final/` is no finished
run. A checkpoint whose writing fails is removed at once, a disk error named with its file and
bytes, and the record of the failure (`failed.json`) never hides the failure itself.

One writer per directory: the run holds `run.lock` in `output_dir` while it trains
(`runtime/output_lock.py`), so a second start there is refused naming the first; under
torchrun, every process stops at the next step boundary once its launcher is gone. SIGTERM (a
scheduler's preemption or time limit) stops the run at the end of the step under way, every
process at the same step, with a checkpoint of it (`runtime/termination.py`).

Non-finite numbers: a loss or gradient norm that is NaN or inf (and for PPO and GRPO a score,
advantage, value or KL of a rollout) stops the run at that step with a `RunError` naming it,
before the optimiser step and before any checkpoint or `final/` is written from that state, so
the newest checkpoint stays a good resume point; `skip_nonfinite_steps` skips a few instead.

Several processes: the trained model is replicated through accelerate (DDP: the gradients are
averaged once per optimiser step) or, with ``fsdp``, sharded (``runtime/sharding.py``; its
checkpoints hold the whole model, gathered, and each process's optimiser shard). Only the main
process writes; every process saves its random streams.

Departures from the HF Trainer: each micro-batch's loss is its own mean, divided by the number
of accumulated micro-batches (no re-weighting by token counts across micro-batches); bf16
autocast comes from the runtime, not from accelerate's process-wide mixed-precision setting
(so stages of different precision can run in one process); no fp16 loss scaling and no
DeepSpeed.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import logging
import math
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.utils import (
    DistributedDataParallelKwargs,
    broadcast_object_list,
    send_to_device,
    set_seed,
)
from torch import nn

from rlhfkit import checkpoint as ckpt
from rlhfkit.checkpoint import atomic_dir
from rlhfkit.config import TrainConfig
from rlhfkit.errors import NonFiniteError, RunError, Terminated, UsageError, require_finite
from rlhfkit.models.loading import stored_dtype
from rlhfkit.runtime.distributed import sum_over_ranks
from rlhfkit.runtime.machine import Runtime, parameters_cast
from rlhfkit.runtime.output_lock import launch_lock, launcher_alive, launcher_pid
from rlhfkit.runtime.sharding import (
    ShardedModel,
)
from rlhfkit.runtime.termination import sigterm_deferred
from rlhfkit.tracking import Tracker, format_metrics
from rlhfkit.trainers.best_model import BestModel
from rlhfkit.trainers.checkpoints import MODEL_DIRECTORY, Checkpoints
from rlhfkit.trainers.optim import Learner, MinibatchLearner, accumulate, build_optimizer
from rlhfkit.trainers.state import TrainerState

logger = logging.getLogger(__name__)

CONFIG_FILE = "train_config.json"
FAILED_FILE = "failed.json"  # written by a run that stopped on an error
BEST_DIR = "best"  # the best evaluated model (`metric_for_best_model`)
# What a person watches on an RL stage's progress bar (PPO, GRPO, RLOO): short name -> key.
WATCH_RL = {"score": "train/score/mean", "kl": "train/kl/ref", "entropy": "train/policy/entropy"}
Batch = dict[str, Any]


@functools.lru_cache(maxsize=8)
def epoch_order(num_examples: int, seed: int, epoch: int) -> np.ndarray:
    """The permutation of example indices for `epoch`; a function of `(seed, epoch)` only.
    Cached (one call per micro-batch) and read-only, since callers share the array."""
    order = np.random.default_rng([seed, epoch]).permutation(num_examples)
    order.flags.writeable = False
    return order


@dataclasses.dataclass(frozen=True)
class Stream:
    """Batches of example indices: each pass over the examples is the permutation drawn from
    `(seed, pass)` alone, so a position `(epoch, index)` is all a resumed run needs. Batch `i`
    of a pass goes to process `i % world`; every process sees the same number of batches."""

    num_examples: int
    batch_size: int
    seed: int
    drop_last: bool = False
    """Skip an incomplete last batch (PPO's prompts: every rollout has the same size)."""
    rank: int = 0
    world: int = 1

    @property
    def batches_per_pass(self) -> int:
        """Batches in a pass over the examples, over all processes."""
        size = self.batch_size
        return self.num_examples // size if self.drop_last else -(-self.num_examples // size)

    @property
    def batches_per_epoch(self) -> int:
        """Batches each process sees per pass."""
        return max(self.batches_per_pass // self.world, 1)

    def check_split(self, field: str) -> None:
        """A usage error naming ``field`` (the data) where a pass has fewer batches than there
        are processes: one of them would get none."""
        if self.world > 1 and self.batches_per_pass < self.world:
            raise UsageError(
                f"{field}: {self.num_examples} examples make {self.batches_per_pass} batch(es) "
                f"of {self.batch_size}, fewer than the {self.world} processes, and each needs "
                "one. Give more examples, a smaller batch_size or fewer processes"
            )

    def next(self, epoch: int, index: int) -> tuple[int, int, np.ndarray]:
        """The position after the batch at `(epoch, index)`, and that batch's indices."""
        if index >= self.batches_per_epoch:
            epoch, index = epoch + 1, 0
        order = epoch_order(self.num_examples, self.seed, epoch)
        start = self.number(index) * self.batch_size
        return epoch, index + 1, order[start : start + self.batch_size]

    def number(self, index: int) -> int:
        """The place in its pass, counted over all processes, of this process's batch
        `index`: the same batch of examples has the same number whatever the world size."""
        return index * self.world + self.rank


@dataclasses.dataclass
class Position:
    """Where a stage's own `Stream` is (its pass and batch within it), kept by checkpoints
    as one of ``Trainer.state_parts``."""

    epoch: int = 0
    index: int = 0

    def advance(self, stream: Stream) -> np.ndarray:
        """The indices of ``stream``'s next batch; the position moves past it."""
        self.epoch, self.index, indices = stream.next(self.epoch, self.index)
        return indices

    def state_dict(self) -> list[int]:
        return [self.epoch, self.index]

    def load_state_dict(self, saved: list[int]) -> None:
        self.epoch, self.index = saved


def _attribute(owner: Any, path: str) -> Any:
    """``owner.a.b`` for the path "a.b"."""
    return functools.reduce(getattr, path.split("."), owner)


def _set_attribute(owner: Any, path: str, value: Any) -> None:
    """Set ``owner.a.b = value`` for the path "a.b"."""
    parent, _, name = path.rpartition(".")
    setattr(_attribute(owner, parent) if parent else owner, name, value)


class Trainer:
    """Base training loop; subclasses implement `compute_loss` and `evaluate` (or `train_step`).

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
    learner_name = "model"  # the name of `model`'s learner (its optimiser state in checkpoints)
    checkpoint_layout = MODEL_DIRECTORY  # how checkpoints hold the trained models
    drop_last = False  # see `Stream.drop_last`

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
        self.runtime = Runtime.from_config(config)
        # DDP's gradients as views of its all-reduce buckets: one copy of them, not two.
        replicas = DistributedDataParallelKwargs(gradient_as_bucket_view=True)
        self.accelerator = accelerator or Accelerator(
            cpu=self.runtime.device.type == "cpu", kwargs_handlers=[replicas]
        )
        self.train_data = train_data
        self.collate_fn = collate_fn
        self.tokenizer = tokenizer
        self.output_dir = Path(config.output_dir)
        self.runtime.start()
        # Padding-free passes where the stage has them (``padding_free``) and the model can.
        self.padding_free = getattr(config, "padding_free", False)
        self.runtime.prepare(model, packed=self.padding_free, trained=True)
        self.sharded: dict[str, ShardedModel] = {}  # the trained models FSDP shards, by name
        self.model, optimizer = self.distribute(self.learner_name, model)
        # The run's length comes from the config and the data alone (``TrainConfig.loop_steps``
        # and its stages' own): nothing of a subclass is called before it is built.
        world = self.accelerator.num_processes
        self.stream = Stream(
            len(train_data),
            config.loop_batch_size(world),
            config.seed,
            self.drop_last,
            self.accelerator.process_index,
            world,
        )
        self.stream.check_split("train_data")
        steps = config.loop_steps(len(train_data), self.stream.batches_per_epoch)
        self.state = TrainerState(total_steps=steps)
        self.optimizer_steps = config.optimizer_steps(steps, world)  # every schedule's length
        learner = Learner.build(
            self.learner_name, self.model, config, self.optimizer_steps, optimizer
        )
        self.learners = {learner.name: learner}
        self.tracker: Tracker | None = None
        self._prepared = False  # resume / clean-up happen on the first train() call only
        self.checkpoints = Checkpoints(self)
        # The trainer's own random generators and stateful objects (each with `state_dict()`
        # and `load_state_dict()`), by name: a stage adds its own; checkpoints keep them.
        self.generators: dict[str, torch.Generator] = {}
        self.state_parts: dict[str, Any] = {}
        self.launcher = launcher_pid()  # torchrun's, whose death stops the run
        self.best = BestModel(config, self.output_dir / BEST_DIR, self.accelerator,
                              self.write_model_dir)  # fmt: skip

    # ----------------------------------------------------------------- the processes
    def distribute(
        self, name: str, model: nn.Module, learning_rate: float | None = None
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        """``model`` ready to learn on every process, with its AdamW (peak ``learning_rate``,
        else the config's): replicated through accelerate (DDP on several processes) or, with
        ``fsdp``, sharded in place (``runtime/sharding.py``), its optimiser then built over
        the shards."""
        if self.runtime.sharded:
            self.sharded[name] = ShardedModel(model)
            return model, build_optimizer(model, self.config, learning_rate)
        return self.accelerator.prepare(model, build_optimizer(model, self.config, learning_rate))

    def no_sync(self, model: nn.Module) -> AbstractContextManager:
        """Gradients of the micro-batches before an optimiser step's last, kept on each process
        instead of reduced (DDP's ``no_sync``, through accelerate). Sharded models reduce them
        at every micro-batch: holding them back would keep whole-size gradients on every
        process, the memory FSDP is there to save (and accelerate's FSDP ``no_sync`` expects
        one root module, where a reward model or a critic is several)."""
        if self.sharded:
            return nullcontext()
        return self.accelerator.no_sync(model)

    def model_attributes(self) -> dict[str, str]:
        """The attributes that hold a trained model (dotted paths from the trainer), and the
        model's name (``distribute``)."""
        return {"model": self.learner_name}

    @contextmanager
    def whole_models(self, everywhere: bool = False) -> Iterator[dict[str, nn.Module]]:
        """With FSDP, the trained models' attributes point to whole plain copies while inside
        (on the main process, or with ``everywhere`` on every process), so that the code that
        saves or loads a plain model runs unchanged; yields the copies by name. Every process
        must enter (the shards are gathered). Without FSDP nothing changes."""
        copies = {name: model.whole(everywhere) for name, model in self.sharded.items()}
        if not copies or None in copies.values():
            yield {}
            return
        held = {path: _attribute(self, path) for path in self.model_attributes()}
        for path, name in self.model_attributes().items():
            _set_attribute(self, path, copies[name])
        try:
            yield copies
        finally:
            for path, model in held.items():
                _set_attribute(self, path, model)

    # ----------------------------------------------------------------- to implement
    def compute_loss(self, batch: Batch) -> tuple[torch.Tensor, dict[str, Any]]:
        """Loss (scalar tensor) and metrics of one micro-batch."""
        raise NotImplementedError

    def micro_batch_weights(self, batches: list[Batch]) -> list[float]:
        """What each micro-batch's loss counts in its step: 1 each here, the processes' losses
        averaged. A loss that is a mean over a varying number of items (SFT's tokens) weights
        them by that number (``distributed.shares_over_ranks``), so that N processes take the
        step of one process holding all their items."""
        return [1.0] * len(batches)

    def evaluate(self) -> dict[str, float]:
        """Held-out metrics; the loop calls this in eval mode under `torch.no_grad()`."""
        return {}

    # ----------------------------------------------------------------- data position
    @property
    def batches_per_epoch(self) -> int:
        """Micro-batches each process sees per epoch (the last one may be smaller)."""
        return self.stream.batches_per_epoch

    def next_batch(self) -> Batch:
        """The next batch of `train_data` for this process, collated, on the device."""
        self.state.epoch, self.state.batch_index, indices = self.stream.next(
            self.state.epoch, self.state.batch_index
        )
        examples = [self.train_data[int(i)] for i in indices]
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

        `stop_after`: make at most this many steps in this call, then write a checkpoint and
        return (a time-sliced job; the next `train()` resumes there).
        """
        # The lock first: a run refused for another's lock must not write failed.json there.
        with launch_lock(self.output_dir, self.accelerator.is_main_process):
            try:
                return self._train(stop_after)
            except Exception as error:
                self._mark_failed(error)
                raise

    def _train(self, stop_after: int | None) -> TrainerState:
        if not self._prepared:
            self._prepared = True
            if self._prepare_run():
                return self.state
        target = self.state.total_steps
        if stop_after is not None:
            target = min(target, self.state.step + stop_after)
        self.tracker = Tracker(
            self.output_dir,
            enabled=self.accelerator.is_main_process,
            resume_step=self.state.step,
            report_to=self.config.report_to,
            project=self.config.project,
            hparams=self.config.to_dict(),
        )
        self.tracker.start_progress(
            self.state.total_steps, self.state.step, type(self).__name__, self.watch
        )
        try:
            with sigterm_deferred() as asked:
                self._run_steps(target, asked)
            if self.state.step < self.state.total_steps:  # stopped early: resumable from here
                self.checkpoints.save_if_new()
            else:
                self._finish()
        except BaseException:
            with _logged_instead("closing the tracker"):  # a full disk fails this too
                self.tracker.close()
            raise
        self.tracker.close()
        return self.state

    def _mark_failed(self, error: Exception) -> None:
        """Write `failed.json` (the step and the error) so that a directory of a run that
        stopped on an error says so; the next start removes it. On a full disk this write
        fails too: logged, so that the error raised stays the first one."""
        if self.accelerator.is_main_process and self.output_dir.is_dir():
            failure = {
                "step": self.state.step,
                "error": f"{type(error).__name__}: {error}",
                "skipped_steps": self.state.skipped_steps,
            }
            with _logged_instead(f"recording the failure in {self.output_dir / FAILED_FILE}"):
                ckpt.write_json(failure, self.output_dir / FAILED_FILE)
                if self.tracker is not None and self.config.skip_nonfinite_steps:
                    skipped = {"train/skipped_steps": self.state.skipped_steps}
                    self.tracker.log(skipped, self.state.step)

    def _prepare_run(self) -> bool:
        """Resume or clear `output_dir`; True if the run is already complete."""
        if self.accelerator.is_main_process:
            for stale in ckpt.stale_temporaries(self.output_dir):
                logger.info("removing %s, left by an interrupted run", stale)
                shutil.rmtree(stale, ignore_errors=True)
            (self.output_dir / FAILED_FILE).unlink(missing_ok=True)
        if self.config.resume:
            if ckpt.is_complete(self.output_dir):
                logger.info("%s holds a finished run; skipping", self.output_dir)
                saved = ckpt.read_json(self.config.final_dir / ckpt.STATE_FILE)
                self.checkpoints.restore_state(saved)
                return True
            latest = self.checkpoints.resume_point()
            if latest is not None:
                self.checkpoints.load(latest)  # restores the random streams too
                return False
        elif self.accelerator.is_main_process:
            for old in [
                *ckpt.checkpoint_dirs(self.output_dir),
                self.output_dir / "final",
                self.best.path,
            ]:
                if old.exists():  # a fresh directory has nothing to warn about
                    logger.warning("resume=False: deleting %s", old)
                    shutil.rmtree(old, ignore_errors=True)
        self.accelerator.wait_for_everyone()
        self.best.reconcile(self.state)
        if self.accelerator.is_main_process:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            ckpt.write_json(self.config.to_dict(), self.output_dir / CONFIG_FILE)
        # Seeded here, not at construction: the run then depends only on its config, whatever
        # ran in this process between building the trainer and training it.
        set_seed(self.config.seed)
        return False

    def _resume_point(self) -> Path | None:
        """The newest checkpoint that verifies (`ckpt.intact_checkpoint`), chosen by the main
        process, which sets damaged ones aside, and told to the others."""
        choice = [None]
        if self.accelerator.is_main_process:
            found = ckpt.intact_checkpoint(self.output_dir)
            choice = [None if found is None else str(found)]
        if self.accelerator.num_processes > 1:
            broadcast_object_list(choice)
        return None if choice[0] is None else Path(choice[0])

    def _at_step_boundary(self, asked: Callable[[], bool]) -> None:
        """Stop every process at this step once any of them was told to (SIGTERM,
        ``asked()``: a checkpoint, then `Terminated`) or lost its launcher (a `RunError`: a
        new start on this directory must not race workers that lost theirs). One collective
        on several processes, so that all stop at the same step."""
        gone = self.launcher is not None and not launcher_alive(self.launcher)
        stop = asked()
        if self.accelerator.num_processes > 1:
            flags = torch.tensor([float(gone), float(stop)], device=self.accelerator.device)
            gone, stop = (bool(flag) for flag in sum_over_ranks(flags).tolist())
        if gone:
            raise RunError(
                f"the launcher that started this run (torchrun, pid {self.launcher} for process "
                f"{self.accelerator.process_index}) is gone, so the run stops before step "
                f"{self.state.step + 1} instead of training on without it. Start it again to "
                f"resume {self.output_dir} from its newest checkpoint"
            )
        if stop:
            raise Terminated(self._stopped_here())

    def _stopped_here(self) -> str:
        """Write a checkpoint of this step unless there is one; the message of the stop."""
        step, total = self.state.step, self.state.total_steps
        if step > 0:
            self.checkpoints.save_if_new()
        latest = ckpt.latest_checkpoint(self.output_dir)
        if latest is None:
            return f"stopped by SIGTERM at step {step} of {total}, before any checkpoint"
        return (
            f"stopped by SIGTERM after step {step} of {total}; {latest} resumes it: run the "
            f"same command again"
        )

    def _run_steps(self, target: int, asked: Callable[[], bool]) -> None:
        self.model.train()
        cfg = self.config
        sums: dict[str, float] = {}
        count = 0
        while self.state.step < target:
            self._at_step_boundary(asked)
            started = time.perf_counter()
            metrics = self._guarded_step()
            if metrics is not None:
                metrics["step_seconds"] = time.perf_counter() - started
                accumulate(sums, metrics)
                count += 1
            self.state.step += 1
            self.tracker.advance()
            if count and (self.state.step % cfg.log_every == 0 or self.state.step == target):
                self._log_train(sums, count)
                sums, count = {}, 0
            if cfg.eval_every and self.state.step % cfg.eval_every == 0:
                self.best.keep_if_best(self.state, self.run_evaluation())
            if cfg.save_every and self.state.step % cfg.save_every == 0:
                self.checkpoints.save()
        self._at_step_boundary(asked)

    def _guarded_step(self) -> dict[str, float] | None:
        """`train_step`, or None for a step skipped because a quantity in it was not finite.

        Such a step stops the run (`RunError`) before anything is saved from that state, so
        the newest checkpoint stays a good resume point; `skip_nonfinite_steps` skips up to
        that many instead: the step's gradients are dropped and neither weights, AdamW moments,
        the learning-rate schedule (which then ends that many steps short of its end) nor the
        trainer's own state change. A step of several optimiser steps (an RL iteration's
        minibatches) is undone from a copy taken before it, kept while skips are left."""
        taken = self._steps_taken()
        before = self._state_before_step()
        try:
            return self.train_step()
        except NonFiniteError as error:
            step = self.state.step + 1
            clean = self._steps_taken() == taken
            left = self.state.skipped_steps < self.config.skip_nonfinite_steps
            if not left or (not clean and before is None):
                raise RunError(self._nonfinite_message(error, step)) from error
            if not clean:
                self._restore_state_before_step(before)
            logger.warning("step %d skipped: %s (skip_nonfinite_steps)", step, error)
        for learner in self.learners.values():
            learner.optimizer.zero_grad(set_to_none=True)
        self.state.skipped_steps += 1
        return None

    def _state_before_step(self) -> dict[str, Any] | None:
        """What a step of several optimiser steps changes, copied (the trained weights, each
        learner's AdamW and schedule, the trainer's own state), where such a step may still be
        skipped; None otherwise (a step of one optimiser step is skipped before it is taken)."""
        several = self.config.optimizer_steps(1, self.accelerator.num_processes) > 1
        if not several or self.state.skipped_steps >= self.config.skip_nonfinite_steps:
            return None
        learners = {
            name: {
                "weights": [p.detach().clone() for p in learner.params],
                "optimizer": copy.deepcopy(learner.optimizer.state_dict()),
                "scheduler": copy.deepcopy(learner.scheduler.state_dict()),
            }
            for name, learner in self.learners.items()
        }
        return {"learners": learners, "own": copy.deepcopy(self.checkpoints.own_state())}

    def _restore_state_before_step(self, before: dict[str, Any]) -> None:
        """Undo a step from ``_state_before_step``'s copy."""
        with torch.no_grad():
            for name, learner in self.learners.items():
                saved = before["learners"][name]
                for param, value in zip(learner.params, saved["weights"], strict=True):
                    param.copy_(value)
                learner.optimizer.load_state_dict(saved["optimizer"])
                learner.scheduler.load_state_dict(saved["scheduler"])
        self.checkpoints.load_own_state(before["own"])

    def _steps_taken(self) -> int:
        """Optimiser steps taken by every learner so far (their schedules count them)."""
        return sum(learner.scheduler.last_epoch for learner in self.learners.values())

    def _nonfinite_message(self, error: NonFiniteError, step: int) -> str:
        """What stopped at which step (after how many skipped), that nothing was saved from
        it, and what to try."""
        skipped = self.state.skipped_steps
        after = f", after {skipped} such step(s) skipped (skip_nonfinite_steps)" if skipped else ""
        return (
            f"training diverged at step {step} of {self.output_dir}{after}: {error.quantity} is "
            f"{error.value}, not a finite number, so the run stopped before saving anything "
            "from that step (the newest checkpoint there, if any, is the last good one). "
            "Try a lower learning_rate, gradient clipping "
            "(max_grad_norm, e.g. 1.0), a warmup (warmup_steps), mixed_precision no (fp32) "
            "instead of bf16, or skip_nonfinite_steps to skip a few such steps; then resume, "
            "or start again with resume: false"
        )

    def check_loss(self, loss: float) -> None:
        """A `NonFiniteError` where ``loss`` is NaN or inf on any process (on several, one
        collective: every process stops at the same step, none waits for the others)."""
        if self.accelerator.num_processes > 1:
            bad = torch.tensor(float(not math.isfinite(loss)), device=self.accelerator.device)
            if sum_over_ranks(bad).item() and math.isfinite(loss):
                raise NonFiniteError("loss of another process", math.nan)
        require_finite("loss", loss)

    def train_step(self) -> dict[str, float]:
        """One step of the loop. Here: one optimiser step over the next
        `gradient_accumulation_steps` micro-batches (`optim.MinibatchLearner`: gradients
        accumulated, the loss checked, clipped, stepped). Returns the micro-batch-averaged
        metrics plus `grad_norm` and `lr`."""
        accumulation = self.config.gradient_accumulation_steps
        batches = [self.next_batch() for _ in range(accumulation)]
        weights = self.micro_batch_weights(batches)
        # The division by the accumulation is the learner's, not accelerate's
        # (Accelerator(gradient_accumulation_steps=...) is process-global state shared by
        # every Accelerator, so two trainers would overwrite each other's).
        learner = MinibatchLearner(
            self.learners[self.learner_name],
            self._weighted_loss,
            accumulation,
            self.runtime.autocast,
            functools.partial(self.no_sync, self.model),
            before_step=lambda stats: self.check_loss(float(stats["loss"])),
        )
        totals = learner.learn([list(zip(batches, weights, strict=True))])
        totals["grad_norm"] = totals.pop(f"grad_norm/{self.learner_name}")
        return totals

    def _weighted_loss(self, batch: Batch, weight: float) -> tuple[torch.Tensor, dict]:
        """``compute_loss`` times the micro-batch's weight; the unweighted loss logged."""
        loss, metrics = self.compute_loss(batch)
        return loss * weight, {"loss": loss, **metrics}

    def _log_train(self, sums: dict[str, float], count: int) -> None:
        """Log the mean of each metric over the last `count` steps (averaged over processes)."""
        keys = sorted(sums)
        means = [sums[k] / count for k in keys]
        means = torch.tensor(means, dtype=torch.float64, device=self.accelerator.device)
        means = self.accelerator.reduce(means, reduction="mean")
        metrics = {f"train/{k}": v for k, v in zip(keys, means.tolist(), strict=True)}
        metrics["train/epoch"] = self.state.epoch + self.state.batch_index / self.batches_per_epoch
        if self.config.skip_nonfinite_steps:
            metrics["train/skipped_steps"] = self.state.skipped_steps
        self.tracker.log(metrics, self.state.step)

    def run_evaluation(self) -> dict[str, float]:
        """`evaluate()` in eval mode, without gradients or RNG side effects; logs `eval/*`."""
        self.model.eval()
        with ckpt.preserved_rng(), torch.no_grad(), self.runtime.autocast():
            metrics = {k: float(v) for k, v in self.evaluate().items()}
        self.model.train()
        self.state.evaluated_at = self.state.step
        if metrics:
            self.state.eval_metrics = metrics
            if self.tracker is not None:
                self.tracker.log({f"eval/{k}": v for k, v in metrics.items()}, self.state.step)
            logger.info("eval step %d: %s", self.state.step, format_metrics(metrics))
        return metrics

    def _finish(self) -> None:
        """Final evaluation, last checkpoint, `final/` with the complete marker, curves."""
        if self.state.evaluated_at != self.state.step:
            self.best.keep_if_best(self.state, self.run_evaluation())
        self.checkpoints.save_if_new()
        self.on_train_end()
        self.state.complete = True
        best = self.state.best_step
        if self.config.load_best_model_at_end and best not in (-1, self.state.step):
            self.best.make_final(self.state)
        else:
            self.write_model_dir(self.config.final_dir, **self.best.note(self.state))
        if self.accelerator.is_main_process:
            keys = [*self.plot_keys, *(f"eval/{k}" for k in self.state.eval_metrics)]
            self.tracker.plot(keys, self.output_dir / "curves.png")
        self.accelerator.wait_for_everyone()
        logger.info("finished: final model in %s", self.config.final_dir)

    def write_model_dir(self, path: Path, **notes: Any) -> None:
        """Write `path` atomically as `final/` is written: the model as its passes computed
        with (`stored_as_trained`), the tokenizer, and the trainer state with `notes` added."""
        with self.whole_models():
            if self.accelerator.is_main_process:
                with atomic_dir(path) as tmp, self.stored_as_trained(path.name):
                    self.save_model(tmp)
                    state = {**self.checkpoints.state_json(), **notes}
                    ckpt.write_json(state, tmp / ckpt.STATE_FILE)

    def model_sources(self) -> dict[str, str]:
        """Where each trained model started, by its name (``distribute``)."""
        return {self.learner_name: self.config.model}

    @contextmanager
    def stored_as_trained(self, written: str) -> Iterator[None]:
        """While inside, each trained model that started from weights stored in bf16 holds
        its weights in bf16, when the run trained under bf16 autocast with full fine-tuning:
        ``final/`` (or ``best/``: the directory named ``written``) then keeps the model its
        forward passes computed with. Its float32 master weights also hold updates below
        bf16's resolution that no pass saw, which read in float32 make another model
        (docs/instructions.md, "Measuring KL"); the checkpoints keep them, for an exact
        resume. A LoRA model is saved in float32: its adapter ran beside the rounded base
        weights, and folded into them in bf16 would mostly round away."""
        with ExitStack() as stack:
            if self.runtime.bf16 and not self.config.lora:
                models = {
                    name: _attribute(self, path) for path, name in self.model_attributes().items()
                }
                for name, source in self.model_sources().items():
                    if stored_dtype(source) == torch.bfloat16:
                        model = self.accelerator.unwrap_model(models[name])
                        stack.enter_context(parameters_cast(model, torch.bfloat16))
                        logger.info("%s/: the %s in bf16, as %s stores it", written, name, source)
            yield

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


@contextmanager
def _logged_instead(doing: str) -> Iterator[None]:
    """Run a clean-up while an error is on its way out: an `OSError` of its own (the disk
    that failed the run is full for it too) is logged, never raised in the first's place."""
    try:
        yield
    except OSError as error:
        logger.error("%s failed as well: %s", doing, error)
