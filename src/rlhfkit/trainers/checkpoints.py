"""The checkpoints of one run, a part the loop holds: ``checkpoint-<step>/`` written atomically,
and read back for an exact resume, or (``rlhfkit export``) for the model of that step.

A checkpoint holds:

- the trained models, in the layout their stage names (``Trainer.checkpoint_layout``):
  `MODEL_DIRECTORY`, the model as ``save_pretrained`` writes it with its tokenizer (a LoRA
  model: its peft adapter), so that the checkpoint is a model directory that ``eval``, ``chat``
  and the next stage read (SFT, reward model, DPO); or `TRAINED_WEIGHTS`, only the trained
  parameters of every trained model by model and name in one file, which is all an exact
  resume of an RL run needs (the policy and the critic; a LoRA run's adapters) and which
  ``rlhfkit export`` writes as a model directory;
- ``optimizer.safetensors``: each learner's AdamW state by name (with FSDP, one file per
  process: its shards);
- ``rng_state_<rank>.safetensors``: the python, numpy, torch and CUDA generators, and the
  trainer's own (``Trainer.generators``);
- ``trainer_state.json``: the step and data position (``TrainerState``), each learner's
  schedule, the config, the launch, the threads, and the state of the trainer's own objects
  (``Trainer.state_parts``: a KL controller, running score moments, a data position);
- the manifest of its files' sizes and SHA-256 (``checkpoint.py``), written last.

Nothing is pickled. A resumed run continues the run that wrote the checkpoint only on the same
launch (processes, FSDP) and with the same settings, except those in `RESUMABLE_CHANGES`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
from pathlib import Path
from typing import Any

import torch
from accelerate.utils import broadcast_object_list
from peft import PeftModel, set_peft_model_state_dict
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn

from rlhfkit import checkpoint as ckpt
from rlhfkit.errors import RunError, UsageError
from rlhfkit.models.loading import check_model_source
from rlhfkit.runtime.sharding import load_local_optimizer_state, local_optimizer_state
from rlhfkit.runtime.threads import resume_threads
from rlhfkit.trainers.state import TrainerState

logger = logging.getLogger(__name__)

OPTIMIZER_FILE = "optimizer.safetensors"
WEIGHTS_FILE = "trainable.safetensors"  # `TRAINED_WEIGHTS`: the trained parameters
# The settings a resumed run may change: they apply from the resumed step on (the learning
# rate and its schedule, how long the run goes, the cadence of logs, evaluations and
# checkpoints, the KL's weight). Any other (the model, the data, batch shapes, the seed)
# changes what the checkpoint's steps mean, and a resume refuses it unless `resume_override`.
RESUMABLE_CHANGES = frozenset(
    {
        "learning_rate", "critic_learning_rate", "lr_scheduler", "warmup_steps",
        "warmup_ratio", "max_steps", "num_epochs", "max_grad_norm", "weight_decay",
        "log_every", "eval_every", "save_every", "keep_last", "sample_every", "num_samples",
        "eval_batch_size", "max_eval_samples", "gold_functions", "metric_for_best_model",
        "greater_is_better", "load_best_model_at_end", "skip_nonfinite_steps", "kl_coef",
        "kl_target", "report_to", "project", "eval_data",
        "forward_batch_size", "parallel_critic", "gradient_checkpointing",
    }
)  # fmt: skip
_HOW_TO_RESUME = ("resume", "resume_override")  # how a run starts, not a setting of it
# The settings of the learning-rate schedule: a change of one rebuilds it at the resumed step.
_SCHEDULE_FIELDS = frozenset(
    {"learning_rate", "critic_learning_rate", "lr_scheduler", "warmup_steps", "warmup_ratio",
     "max_steps", "num_epochs"}
)  # fmt: skip


def trained_parameters(models: dict[str, nn.Module]) -> dict[str, torch.Tensor]:
    """The parameters that train (``requires_grad``) of each model, as ``<model>.<name>``."""
    return {
        f"{name}.{key}": param.detach()
        for name, model in models.items()
        for key, param in model.named_parameters()
        if param.requires_grad
    }


class ModelDirectory:
    """The one trained model as ``save_pretrained`` writes it (a LoRA model: its adapter),
    with the tokenizer: the checkpoint reads as the model of its step."""

    def write(self, models: dict[str, nn.Module], tokenizer: Any, path: Path) -> None:
        (model,) = models.values()
        model.save_pretrained(path)
        if tokenizer is not None:
            tokenizer.save_pretrained(path)

    def read(self, models: dict[str, nn.Module], path: Path) -> None:
        (model,) = models.values()
        check_model_source(path, "checkpoint")  # safetensors only: nothing is unpickled
        if isinstance(model, PeftModel):
            set_peft_model_state_dict(model, load_file(str(path / "adapter_model.safetensors")))
        else:
            model.load_state_dict(type(model).from_pretrained(path).state_dict())


class TrainedWeights:
    """The trained parameters of every trained model, in one file (`WEIGHTS_FILE`)."""

    def write(self, models: dict[str, nn.Module], tokenizer: Any, path: Path) -> None:
        ckpt.save_state(trained_parameters(models), path / WEIGHTS_FILE)

    def read(self, models: dict[str, nn.Module], path: Path) -> None:
        weights = ckpt.load_state(path / WEIGHTS_FILE)
        with torch.no_grad():
            for key, param in trained_parameters(models).items():
                param.copy_(weights[key])


MODEL_DIRECTORY = ModelDirectory()
TRAINED_WEIGHTS = TrainedWeights()


def _launch_text(launch: dict[str, Any]) -> str:
    """ "2 processes with fsdp", "1 process without fsdp"."""
    processes = launch["processes"]
    fsdp = "with fsdp" if launch["fsdp"] else "without fsdp"
    return f"{processes} process{'es' if processes > 1 else ''} {fsdp}"


class Checkpoints:
    """The checkpoints of the run of ``trainer`` (a `loop.Trainer`; see the module
    docstring). ``saved_at`` is the step of the newest one this run wrote or resumed from."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self.saved_at = -1

    # ----------------------------------------------------------------- writing
    def save(self) -> Path:
        """Write ``checkpoint-<step>`` atomically, then delete all but the newest
        ``keep_last``. Each process writes its random streams (and with FSDP its optimiser
        shard) into one shared temporary directory, which the main process renames into place
        once everyone is done; a failed write removes it at once."""
        t = self.trainer
        acc = t.accelerator
        path = t.output_dir / f"{ckpt.CHECKPOINT_PREFIX}{t.state.step}"
        tmp = t.output_dir / f"{ckpt.TEMPORARY_PREFIX}{path.name}"
        with t.whole_models() as copies:
            if acc.is_main_process:
                shutil.rmtree(tmp, ignore_errors=True)
                tmp.mkdir(parents=True)
                with ckpt.removed_on_error(tmp):
                    self.write_models(tmp, copies)
        acc.wait_for_everyone()
        with ckpt.removed_on_error(tmp, remove=acc.is_main_process):
            if acc.is_main_process or t.sharded:
                ckpt.save_state(self._optimizer_state(), tmp / self._optimizer_file())
            ckpt.save_state(self._rng_state(), tmp / f"rng_state_{acc.process_index}.safetensors")
        acc.wait_for_everyone()
        if acc.is_main_process:
            with ckpt.removed_on_error(tmp):
                ckpt.write_json(self.state_json(), tmp / ckpt.STATE_FILE)
                ckpt.replace_dir(tmp, path)  # the manifest last, then the rename
            for old in ckpt.rotate_checkpoints(t.output_dir, t.config.keep_last):
                logger.info("deleted old checkpoint %s", old)
        acc.wait_for_everyone()
        self.saved_at = t.state.step
        logger.info("saved checkpoint %s", path)
        return path

    def save_if_new(self) -> None:
        """Write a checkpoint of this step unless this run already wrote or resumed from one."""
        if self.saved_at != self.trainer.state.step:
            self.save()

    def trained_models(self, copies: dict[str, nn.Module]) -> dict[str, nn.Module]:
        """Each learner's model by name, unwrapped (with FSDP: its whole copy in ``copies``)."""
        t = self.trainer
        return {
            name: copies[name] if name in copies else t.accelerator.unwrap_model(learner.module)
            for name, learner in t.learners.items()
        }

    def write_models(self, path: Path, copies: dict[str, nn.Module]) -> None:
        """The trained models into checkpoint directory ``path``, in the stage's layout."""
        t = self.trainer
        t.checkpoint_layout.write(self.trained_models(copies), t.tokenizer, path)

    def state_json(self) -> dict[str, Any]:
        """``trainer_state.json``: the run's state, schedules, config, launch and own state."""
        t = self.trainer
        schedules = {name: learner.scheduler.state_dict() for name, learner in t.learners.items()}
        return {
            **dataclasses.asdict(t.state),
            "scheduler": schedules,
            "config": t.config.to_dict(),
            "launch": self.launch(),
            "threads": torch.get_num_threads(),
            **self.own_state(),
        }

    def own_state(self) -> dict[str, Any]:
        """The state of the trainer's own objects (``state_parts``), by name, JSON-able."""
        return {name: part.state_dict() for name, part in self.trainer.state_parts.items()}

    def load_own_state(self, saved: dict[str, Any]) -> None:
        """Restore what `own_state` gave (``saved`` may hold more: a whole state file)."""
        for name, part in self.trainer.state_parts.items():
            part.load_state_dict(saved[name])

    def launch(self) -> dict[str, Any]:
        """What a checkpoint's layout depends on: the number of processes (each one's data
        position and random streams) and whether the optimiser state is sharded."""
        t = self.trainer
        return {"processes": t.accelerator.num_processes, "fsdp": bool(t.sharded)}

    def _rng_state(self) -> dict[str, torch.Tensor]:
        own = {f"generator/{k}": g.get_state() for k, g in self.trainer.generators.items()}
        return {**ckpt.rng_state(), **own}

    def _optimizer_file(self) -> str:
        """Each learner's AdamW state: one file, or with FSDP one per process (its shards)."""
        t = self.trainer
        if t.sharded:
            return OPTIMIZER_FILE.replace(".", f"_{t.accelerator.process_index}.", 1)
        return OPTIMIZER_FILE

    def _optimizer_state(self) -> dict[str, Any]:
        learners = self.trainer.learners
        if self.trainer.sharded:
            return {name: local_optimizer_state(ln.optimizer) for name, ln in learners.items()}
        return {name: ln.optimizer.state_dict() for name, ln in learners.items()}

    # ----------------------------------------------------------------- reading
    def resume_point(self) -> Path | None:
        """The newest checkpoint that verifies (`ckpt.intact_checkpoint`), chosen by the main
        process, which sets damaged ones aside, and told to the others."""
        acc = self.trainer.accelerator
        choice = [None]
        if acc.is_main_process:
            found = ckpt.intact_checkpoint(self.trainer.output_dir)
            choice = [None if found is None else str(found)]
        if acc.num_processes > 1:
            broadcast_object_list(choice)
        return None if choice[0] is None else Path(choice[0])

    def load(self, path: Path) -> None:
        """Restore models, optimisers, schedules, random streams and data position from
        ``path``. A file that does not read (in a checkpoint without a manifest to catch it
        before) is a `RunError` naming the checkpoint."""
        try:
            self._load(path)
        except (UsageError, RunError):
            raise
        except (SafetensorError, json.JSONDecodeError, OSError, EOFError) as error:
            why = (
                "Its files match its manifest, so it was written so"
                if (path / ckpt.MANIFEST_FILE).is_file()
                else f"It has no {ckpt.MANIFEST_FILE} to check its files against (an older "
                "rlhfkit wrote it, or the manifest was removed)"
            )
            raise RunError(
                f"checkpoint {path} does not load: {type(error).__name__}: {error}. {why}; "
                "delete it to resume from the one before, or start again with resume: false"
            ) from error

    def _load(self, path: Path) -> None:
        t = self.trainer
        saved = ckpt.read_json(path / ckpt.STATE_FILE)
        if saved["total_steps"] != t.state.total_steps:
            message = "%s planned %d steps; continuing to this run's %d"
            logger.warning(message, path, saved["total_steps"], t.state.total_steps)
        self._check_launch(path, saved.get("launch", {"processes": 1, "fsdp": False}))
        if t.runtime.device.type == "cpu":
            resume_threads(saved.get("threads"), path)
        changes = self._config_changes(path, saved.get("config", {}), saved["step"])
        peaks = {name: learner.scheduler.base_lrs for name, learner in t.learners.items()}
        optimizers = self._saved_optimizers(path)
        self.load_trained(path, saved)
        if not ckpt.verify(path):
            self._hold_unverified(path, optimizers)
        for name, learner in t.learners.items():
            if t.sharded:
                load_local_optimizer_state(learner.optimizer, optimizers[name])
            else:
                learner.optimizer.load_state_dict(optimizers[name])
        self._load_rng(path / f"rng_state_{t.accelerator.process_index}.safetensors")
        self.saved_at = t.state.step
        if changes:
            if _SCHEDULE_FIELDS & set(changes):
                self._reschedule(peaks)
            t.state.config_changes.append({"step": t.state.step, "changes": changes})
        logger.info("resumed from %s at step %d", path, t.state.step)

    def _saved_optimizers(self, path: Path) -> dict[str, Any]:
        """Each learner's optimiser state in checkpoint ``path`` (a `ValueError` naming the
        learners it lacks)."""
        optimizer_file = path / self._optimizer_file()
        optimizers = ckpt.load_state(optimizer_file)
        missing = [name for name in self.trainer.learners if name not in optimizers]
        if missing:
            raise ValueError(
                f"{optimizer_file} holds no optimiser state for {', '.join(missing)}: it "
                "was written by another version of rlhfkit. Resume from a checkpoint of this "
                "version, or start again with resume: false"
            )
        return optimizers

    def load_trained(self, path: Path, saved: dict[str, Any]) -> None:
        """The weights, schedules, step and the trainer's own state of checkpoint ``path``
        (``saved``: its ``trainer_state.json``), without its optimiser state and random
        streams: all that the model at that step needs (``rlhfkit export``), on any launch.
        With FSDP the weights load into whole copies, put back into the shards."""
        t = self.trainer
        with t.whole_models(everywhere=True) as copies:
            t.checkpoint_layout.read(self.trained_models(copies), path)
        for name, plain in copies.items():
            t.sharded[name].load_whole(plain)
        for name, learner in t.learners.items():
            learner.scheduler.load_state_dict(saved["scheduler"][name])
        self.restore_state(saved)
        self.load_own_state(saved)

    def restore_state(self, saved: dict[str, Any]) -> None:
        """Take step, data position and last evaluation from a saved trainer state."""
        t = self.trainer
        fields = {f.name for f in dataclasses.fields(TrainerState)} - {"total_steps"}
        t.state = dataclasses.replace(t.state, **{k: saved[k] for k in fields & set(saved)})

    def _check_launch(self, path: Path, saved: dict[str, Any]) -> None:
        """A checkpoint resumes only on the launch that wrote it: with other processes the
        data positions and random streams would not continue, a sharded optimiser state
        would not fit."""
        now = self.launch()
        if saved != now:
            raise UsageError(
                f"{path} was written by a run on {_launch_text(saved)}, and this one runs on "
                f"{_launch_text(now)}. Resume with the same launch, or start again with "
                "resume: false"
            )

    def _config_changes(self, path: Path, saved: dict[str, Any], step: int) -> dict[str, list[Any]]:
        """Each field whose value differs from the run that wrote checkpoint ``path`` (its
        ``saved`` config): [old, new], logged as applying from ``step`` on. A field outside
        `RESUMABLE_CHANGES` is a `UsageError` naming it, unless ``resume_override``."""
        config = self.trainer.config
        now = json.loads(json.dumps(config.to_dict()))  # as it was saved: lists, floats
        changes = {
            k: [saved[k], v]
            for k, v in now.items()
            if k in saved and saved[k] != v and k not in _HOW_TO_RESUME
        }
        fixed = sorted(k for k in changes if k not in RESUMABLE_CHANGES)
        if fixed and not config.resume_override:
            listed = "; ".join(f"{k}: {changes[k][0]!r} -> {changes[k][1]!r}" for k in fixed)
            raise UsageError(
                f"resume from {path}: the run that wrote it had other settings that shape its "
                f"steps ({listed}), so it would not continue the same run. Give them as they "
                "were, start afresh (resume: false, or another output_dir), or set "
                "resume_override: true to go on with the new ones"
            )
        for field, (old, new) in changes.items():
            logger.warning("%s %r -> %r from step %d (resumed run)", field, old, new, step)
        return changes

    def _reschedule(self, peaks: dict[str, list[float]]) -> None:
        """Each learner's schedule from the changed config on: its peak learning rates
        (``peaks``, those this config built) and shape, at the step resumed."""
        for name, learner in self.trainer.learners.items():
            scheduler = learner.scheduler
            scheduler.base_lrs = list(peaks[name])
            for group, peak in zip(learner.optimizer.param_groups, peaks[name], strict=True):
                group["initial_lr"] = peak
            step = scheduler.last_epoch  # LambdaLR: transformers' schedules
            lrs = [
                peak * f(step) for peak, f in zip(peaks[name], scheduler.lr_lambdas, strict=True)
            ]
            for group, lr in zip(learner.optimizer.param_groups, lrs, strict=True):
                group["lr"] = lr
            scheduler._last_lr = list(lrs)

    def _hold_unverified(self, path: Path, optimizers: dict[str, Any]) -> None:
        """A checkpoint without its manifest (an older rlhfkit wrote it, or the manifest was
        removed): said so, and its trained weights and optimiser moments held finite, which is
        all that can be checked of it (a `RunError` naming the tensor)."""
        logger.warning(
            "%s has no %s: its files are not checked against one; its weights and optimiser "
            "state are checked finite",
            path,
            ckpt.MANIFEST_FILE,
        )
        models = self.trained_models({})
        tensors = {f"weights {k}": v for k, v in trained_parameters(models).items()}
        for name, state in optimizers.items():
            ckpt.flatten_state(state, tensors, prefix=f"{name}'s optimiser")
        for what, tensor in tensors.items():
            if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                raise RunError(
                    f"checkpoint {path}: its {what} hold NaN or inf values, and it has no "
                    f"{ckpt.MANIFEST_FILE} to tell a damaged file; delete it to resume from "
                    "the one before, or start again with resume: false"
                )

    def _load_rng(self, rng_file: Path) -> None:
        if not rng_file.is_file():
            logger.warning("%s missing: random streams are not restored exactly", rng_file)
            return
        rng = ckpt.load_state(rng_file)
        for name, generator in self.trainer.generators.items():
            generator.set_state(rng.pop(f"generator/{name}"))
        ckpt.set_rng_state(rng)
