"""Trainers: the shared loop (`loop.Trainer`) and one trainer per stage built on it.

- `loop`: accumulation, clipping, schedule, evaluation, checkpoints, exact resume, tracking;
  `state`: where a run is (`TrainerState`); `best_model`: `best/` and `final/` from it.
- `checkpoint`: pickle-free checkpoint files (safetensors + JSON), RNG states, rotation.
- `sft`: supervised fine-tuning (`SFTTrainer`, `run_sft`).
- `reward`: reward model on pairs and K-way rankings (`RewardTrainer`, `run_reward`).
- `rl`, `rl_config`: the one RL stage, PPO, GRPO, RLOO and REINFORCE++ as presets of one
  config (`RLTrainer`, `run_rl`, `RLConfig`); `ppo_update` its update, `rl_inputs` its data.
- `policy`: the base of the trainers that move a policy away from a frozen reference
  (`PolicyTrainer`: dropout off, LoRA, the reference, LoRA checkpoints).
- `dpo`: DPO, IPO and cDPO (`DPOTrainer`, `run_dpo`).

Names are imported lazily, so `import rlhfkit.trainers.loop` does not load every stage.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Trainer": "loop",
    "TrainerState": "state",
    "SFTTrainer": "sft",
    "run_sft": "sft",
    "RewardTrainer": "reward",
    "run_reward": "reward",
    "RLConfig": "rl_config",
    "RLTrainer": "rl",
    "run_rl": "rl",
    "PolicyTrainer": "policy",
    "DPOTrainer": "dpo",
    "run_dpo": "dpo",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
