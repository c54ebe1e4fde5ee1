"""Where a PPO run is saved, how it resumes exactly, and its final models.

A checkpoint (``checkpoint-<iteration>/``, written atomically) holds the trainable weights,
each learner's AdamW state, the random streams (the global ones, the sampling generator and
the minibatch shuffler) and, as JSON, the run's position (``PPOState``), the learning-rate
schedules, the KL controller and the running score statistics.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
from pathlib import Path

import torch

from rlhfkit import checkpoint as ckpt
from rlhfkit.checkpoint import atomic_dir
from rlhfkit.models.passes import causal_lm
from rlhfkit.tracking import Tracker
from rlhfkit.trainers.loop import OPTIMIZER_FILE

logger = logging.getLogger(__name__)

WEIGHTS_FILE = "trainable.safetensors"
RNG_FILE = "rng_state_0.safetensors"


@dataclasses.dataclass
class PPOState:
    """Where a PPO run is, besides weights, optimiser and random streams."""

    iteration: int = 0
    prompt_epoch: int = 0  # pass over the prompts
    prompt_index: int = 0  # rollout batches of the current pass already used
    ptx_epoch: int = 0  # pass over the ptx examples
    ptx_index: int = 0  # ptx micro-batches of the current pass already used
    total_iterations: int = 0
    complete: bool = False


class PPOCheckpoints:
    """Checkpoints, resume, clean-up and the final models for ``PPOTrainer`` (which provides
    ``config``, ``state``, ``output_dir``, the models, ``tokenizer``, ``learners``,
    ``kl_controller``, ``moments``, ``prompts`` and the two generators)."""

    def _prepare_run(self) -> bool:
        """Resume or clear ``output_dir``; True if the run is already complete."""
        if self.config.resume:
            if ckpt.is_complete(self.output_dir):
                logger.info("%s holds a finished run; skipping", self.output_dir)
                self.state.complete = True
                return True
            latest = ckpt.latest_checkpoint(self.output_dir)
            if latest is not None:
                self.load_checkpoint(latest)
        else:
            for old in [*ckpt.checkpoint_dirs(self.output_dir), self.output_dir / "final"]:
                logger.warning("resume=False: deleting %s", old)
                shutil.rmtree(old, ignore_errors=True)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        ckpt.write_json(self.config.to_dict(), self.output_dir / "train_config.json")
        return False

    def _state_json(self) -> dict:
        return {
            **dataclasses.asdict(self.state),
            "scheduler": {
                learner.name: learner.scheduler.state_dict() for learner in self.learners
            },
            "kl_controller": self.kl_controller.state_dict(),
            "score_moments": self.moments.state_dict(),
            "config": self.config.to_dict(),
        }

    def save_checkpoint(self) -> Path:
        """``checkpoint-<iteration>``: trainable weights, optimiser, random streams, state."""
        path = self.output_dir / f"{ckpt.CHECKPOINT_PREFIX}{self.state.iteration}"
        weights = {k: p for k, p in self.trainable.named_parameters() if p.requires_grad}
        rng = {
            **ckpt.rng_state(),
            "sample": self.sample_generator.get_state(),
            "shuffle": self.shuffle_generator.get_state(),
        }
        with atomic_dir(path) as tmp:
            ckpt.save_state(weights, tmp / WEIGHTS_FILE)
            optimizers = {learner.name: learner.optimizer.state_dict() for learner in self.learners}
            ckpt.save_state(optimizers, tmp / OPTIMIZER_FILE)
            ckpt.save_state(rng, tmp / RNG_FILE)
            ckpt.write_json(self._state_json(), tmp / ckpt.STATE_FILE)
        ckpt.rotate_checkpoints(self.output_dir, self.config.keep_last)
        logger.info("saved checkpoint %s", path)
        return path

    def load_checkpoint(self, path: Path) -> None:
        """Restore everything ``save_checkpoint`` wrote, for an exact continuation."""
        weights = ckpt.load_state(path / WEIGHTS_FILE)
        with torch.no_grad():
            for name, param in self.trainable.named_parameters():
                if param.requires_grad:
                    param.copy_(weights[name])
        optimizers = ckpt.load_state(path / OPTIMIZER_FILE)
        missing = [learner.name for learner in self.learners if learner.name not in optimizers]
        if missing:
            raise ValueError(
                f"{path / OPTIMIZER_FILE} holds no optimiser state for {', '.join(missing)}: "
                "it was written before policy and critic had one AdamW each. Resume from a "
                "newer checkpoint, or start again with resume: false"
            )
        saved = ckpt.read_json(path / ckpt.STATE_FILE)
        for learner in self.learners:
            learner.optimizer.load_state_dict(optimizers[learner.name])
            learner.scheduler.load_state_dict(saved["scheduler"][learner.name])
        self.kl_controller.load_state_dict(saved["kl_controller"])
        self.moments.load_state_dict(saved["score_moments"])
        fields = {f.name for f in dataclasses.fields(PPOState)}
        self.state = PPOState(**{k: v for k, v in saved.items() if k in fields})
        self.state.total_iterations = self.config.total_iterations(len(self.prompts))
        rng = ckpt.load_state(path / RNG_FILE)
        self.sample_generator.set_state(rng.pop("sample"))
        self.shuffle_generator.set_state(rng.pop("shuffle"))
        ckpt.set_rng_state(rng)
        logger.info("resumed from %s at iteration %d", path, self.state.iteration)

    def _finish(self, tracker: Tracker) -> None:
        self.save_checkpoint()
        self.state.complete = True
        with atomic_dir(self.config.final_dir) as tmp:
            self.save_models(tmp)
            ckpt.write_json(self._state_json(), tmp / ckpt.STATE_FILE)
        keys = ("score/mean", "kl/ref", "policy/entropy", "value/explained_variance")
        keys = tuple(f"train/{key}" for key in keys)
        tracker.plot(keys, self.output_dir / "curves.png")
        logger.info("finished: final policy in %s", self.config.final_dir)

    def save_models(self, path: Path) -> None:
        """The policy with the tokenizer in ``path`` (with LoRA: the adapter, which
        ``from_pretrained`` loads onto its base), the critic in ``path/critic`` (or the value
        head in ``path/value_head.safetensors``)."""
        causal_lm(self.policy).save_pretrained(path)
        self.tokenizer.save_pretrained(path)
        if self.critic is not None:
            self.critic.save_pretrained(path / "critic")
        else:
            ckpt.save_state(self.policy.value_head.state_dict(), path / "value_head.safetensors")
