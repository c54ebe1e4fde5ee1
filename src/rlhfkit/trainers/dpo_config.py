"""`DPOConfig`: the settings of direct preference optimisation and its IPO / conservative
variants (trained by `trainers/dpo.py`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from rlhfkit.config import (
    DEMO_DATA,
    DataOptions,
    LoRAOptions,
    ReferenceOptions,
    TrainConfig,
    require,
)


@dataclass
class DPOConfig(DataOptions, ReferenceOptions, LoRAOptions, TrainConfig):
    """Direct preference optimisation (Rafailov et al. 2023) and its IPO / conservative variants."""

    output_dir: str = "runs/dpo"
    """Directory for checkpoints, metrics, TensorBoard events and the final model (`final/`)."""
    train_data: str = f"{DEMO_DATA}/comparisons"
    """Comparisons (prompt/chosen/rejected) or rankings (expanded into all pairs) to train on."""
    eval_data: str | None = f"{DEMO_DATA}/comparisons"
    """Held-out comparisons for preference accuracy and implicit-reward margin; None skips."""
    beta: float = 0.1
    """Inverse temperature of the implicit reward beta * log(pi / ref) (IPO's tau)."""
    loss_type: Literal["sigmoid", "ipo", "conservative"] = "sigmoid"
    """'sigmoid' = DPO; 'ipo' = IPO (per-token mean log-probs); 'conservative' = cDPO."""
    label_smoothing: float = 0.0
    """cDPO's probability that a label is flipped, in (0, 0.5); only for loss_type='conservative'."""
    precompute_reference: bool = True
    """Compute reference log-probs once over the data before training and free the reference
    model (saves its memory and a forward per step); False runs the reference every step."""
    rpo_alpha: float = 0.0
    """Weight of RPO's NLL term (Pang et al. 2024): the loss is the DPO loss plus rpo_alpha
    times the negative log-likelihood per token of the chosen responses, which keeps their
    likelihood from falling (the paper uses 1); 0 is plain DPO."""
    max_prompt_length: int | None = None
    """Cut each prompt to its last this many tokens before `max_length` applies; None leaves
    the prompt to `max_length` alone."""
    max_response_length: int | None = None
    """Cut each response to its first this many tokens before `max_length` applies; None
    leaves the responses to `max_length` alone."""
    disable_dropout: bool = True
    """Set every dropout to 0 in policy and reference (as TRL's DPO does): with dropout the
    implicit rewards are noisy and step 1 would not start at the reference."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_data()
        self._check_lora()
        require(self, "beta", 0 < self.beta < math.inf, "a number > 0")
        require(self, "rpo_alpha", 0 <= self.rpo_alpha < math.inf, "a number >= 0 (0 = DPO)")
        for name in ("max_prompt_length", "max_response_length"):
            value = getattr(self, name)
            require(self, name, value is None or value >= 1, "None or an integer >= 1")
        if self.loss_type == "conservative":
            ok, allowed = 0 < self.label_smoothing < 0.5, "a number in (0, 0.5) for cDPO"
        else:
            ok, allowed = self.label_smoothing == 0, "0 unless loss_type='conservative'"
        require(self, "label_smoothing", ok, allowed)
        self._check_reference()
