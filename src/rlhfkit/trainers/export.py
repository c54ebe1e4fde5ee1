"""`rlhfkit export`: a checkpoint of an RL run (PPO, GRPO, RLOO, REINFORCE++) as a model
directory.

A run's `final/` holds its last step, and the step worth keeping can be an earlier one: the
pipeline's gold-against-KL points (`pipeline/ppo_eval.py`) show where a policy began to
over-optimise its reward model, and the checkpoint saved there holds the policy of that step.
An RL checkpoint holds only what an exact resume needs (`trainable.safetensors`: the trained
weights of the policy and critic, a LoRA run's adapters only, with the optimiser state beside
them), so it is not a model that `eval`, `chat` or `from_pretrained` reads.

This command builds the trainer again from the config the checkpoint saved, loads the
checkpoint's weights and trainer state into it, and writes the directory as the run writes
`final/` (`Trainer.write_model_dir`): the policy as its passes computed with (merged, with LoRA)
and the tokenizer, the critic, and `trainer_state.json` marked complete, with the checkpoint it
came from. Written as the run's own `final/` (`--output_dir <run>/final`), it ends the run at that
step: `rlhfkit ppo` then finds the run finished, and the pipeline goes on with that policy.

SFT, reward-model and DPO checkpoints hold the model as their `final/` would (full weights, or a
LoRA adapter that rlhfkit loads onto its base), so they are read as they are.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlhfkit import checkpoint as ckpt
from rlhfkit.config import require
from rlhfkit.errors import UsageError

logger = logging.getLogger(__name__)


@dataclass
class CheckpointExportConfig:
    """Write a checkpoint of an RL run (ppo, grpo, rloo, reinforce++) as a model directory, as
    the run would have written `final/` at that step."""

    checkpoint: str
    """The checkpoint: a run's `checkpoint-<step>/` directory (runs/x/ppo/checkpoint-24)."""
    output_dir: str
    """Where the model directory goes; it must not exist. The run's own `final/`
    (runs/x/ppo/final) ends the run at the checkpoint's step."""

    def __post_init__(self) -> None:
        require(self, "checkpoint", bool(self.checkpoint), "a checkpoint-<step> directory")
        require(self, "output_dir", bool(self.output_dir), "a directory that does not exist")


def run_checkpoint_export(config: CheckpointExportConfig) -> Path:
    """Export `config.checkpoint` into `config.output_dir` (the `rlhfkit export` command)."""
    source, target = Path(config.checkpoint), Path(config.output_dir)
    saved = _checkpoint_state(source)
    if target.exists():
        raise UsageError(
            f"output_dir {str(target)!r} exists; remove it or choose another directory "
            "(an export never writes over a model)"
        )
    trainer = _trainer(source, saved["config"])
    trainer.checkpoints.load_trained(source, saved)
    trainer.state.complete = True
    trainer.write_model_dir(target, exported_from=str(source))
    logger.info("step %d of %s written to %s", trainer.state.step, source.parent, target)
    return target


def _checkpoint_state(path: Path) -> dict[str, Any]:
    """The trainer state of checkpoint `path`, its files checked against its manifest."""
    if not (path / ckpt.STATE_FILE).is_file():
        raise UsageError(
            f"checkpoint {str(path)!r}: no {ckpt.STATE_FILE} there, so not a checkpoint; a "
            f"run saves them as <output_dir>/{ckpt.CHECKPOINT_PREFIX}<step> (`save_every`)"
        )
    ckpt.verify(path)  # a DamagedError names the file that fails
    saved = ckpt.read_json(path / ckpt.STATE_FILE)
    if saved.get("complete"):
        raise UsageError(
            f"checkpoint {str(path)!r} is a finished model directory (a `final/`), which "
            "`eval`, `chat` and `from_pretrained` read as it is"
        )
    return saved


def _trainer(path: Path, fields: dict[str, Any]):
    """The trainer of the run that saved checkpoint `path`, built from its config `fields`."""
    from rlhfkit.trainers.rl import RLTrainer
    from rlhfkit.trainers.rl_config import RLConfig

    if "advantage_estimator" not in fields:
        raise UsageError(
            f"checkpoint {str(path)!r} is not of an RL run (ppo, grpo, rloo, reinforce++). "
            "SFT, reward-model and DPO checkpoints hold the model as `final/` does: give the "
            "directory itself to `eval`, `chat` or the next stage"
        )
    unknown = sorted(set(fields) - {f.name for f in dataclasses.fields(RLConfig)})
    if unknown:
        raise UsageError(
            f"checkpoint {str(path)!r}: its config has fields this version of rlhfkit does "
            f"not know ({', '.join(unknown)}); export it with the version that wrote it"
        )
    return RLTrainer.from_config(RLConfig(**fields))
