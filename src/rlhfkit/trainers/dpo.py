"""Direct preference optimisation on the shared loop: DPO, IPO and conservative DPO.

Follows Rafailov et al. 2023, "Direct Preference Optimization" (eq. 7) as TRL's ``DPOTrainer``
implements it: the policy's and the frozen reference's log-probs of the chosen and rejected
responses give the implicit rewards beta * log(pi / ref), and the loss (``ops.losses.dpo_loss``)
pushes the chosen one above the rejected one. IPO (Azar et al. 2023) uses the per-token mean
log-prob, as in the paper's experiments and TRL; DPO and cDPO use the sum over response tokens
(EOS included).

Details and departures:
- Chosen and rejected rows go through ONE forward (``data.PairCollator`` lays them out
  chosen-first), so both see the same weights and the step costs one batched pass.
- Reference log-probs are by default computed once before the first step (TRL's
  ``precompute_ref_log_probs``), for the eval pairs and the training pairs the run will visit
  (TRL computes all; a run shorter than an epoch needs fewer); the reference model is then
  dropped. When no separate reference is given, the starting policy itself provides them, so
  the reference weights are never loaded twice. ``precompute_reference=False`` runs the
  reference every step instead.
- With LoRA the reference is the policy with its adapter disabled (``lora.reference_mode``).
- Rankings (K responses best first) are expanded into all K-choose-2 (better, worse) pairs.
- ``rpo_alpha`` > 0 adds RPO's NLL of the chosen responses (Pang et al. 2024,
  ``ops.losses.rpo_loss``), per token over the batch's chosen tokens, as TRL does.
- ``max_prompt_length`` and ``max_response_length`` cut prompt and responses before
  ``max_length`` applies (``data.encode_comparisons``), as TRL's DPO used to.
- Dropout is off by default: the implicit reward must be a deterministic function of the
  weights, or step 1 would not start exactly at loss ln 2.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from accelerate.utils import set_seed
from torch import nn

from rlhfkit import checkpoint as ckpt
from rlhfkit.data import (
    PairCollator,
    PreferenceExample,
)
from rlhfkit.models.loading import (
    check_model_source,
    load_causal_lm,
    load_reference,
    load_tokenizer,
)
from rlhfkit.models.passes import labelled_logprobs
from rlhfkit.ops.losses import dpo_loss, rpo_loss
from rlhfkit.ops.masks import masked_mean, masked_sum
from rlhfkit.trainers.dpo_config import DPOConfig
from rlhfkit.trainers.loop import Batch, epoch_order
from rlhfkit.trainers.policy import PolicyTrainer
from rlhfkit.trainers.reward import load_preferences

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DPOPair:
    """One (chosen, rejected) pair and, once precomputed, its reference log-probs."""

    example: PreferenceExample  # prompt ids and [chosen ids, rejected ids]
    ref_logps: tuple[float, float] | None = None  # (chosen, rejected) under the reference


@dataclass(frozen=True)
class DPOCollator:
    """`DPOPair`s -> a `PairCollator` batch (rows [0, N) chosen, [N, 2N) rejected), plus
    `ref_logps` (2N,) in the same row order when every pair carries them."""

    pad_id: int

    def __call__(self, pairs: Sequence[DPOPair]) -> Batch:
        batch = PairCollator(self.pad_id)([p.example for p in pairs])
        if all(p.ref_logps is not None for p in pairs):
            chosen, rejected = zip(*(p.ref_logps for p in pairs), strict=True)
            batch["ref_logps"] = torch.tensor([*chosen, *rejected], dtype=torch.float32)  # (2N,)
        return batch


def preference_pairs(examples: Sequence[PreferenceExample]) -> list[DPOPair]:
    """One `DPOPair` per comparison; a K-way ranking gives all K-choose-2 (better, worse)."""
    pairs = []
    for example in examples:
        for better, worse in itertools.combinations(example.response_ids, 2):
            pairs.append(DPOPair(PreferenceExample(example.prompt_ids, [better, worse])))
    return pairs


def sequence_logps(model: nn.Module, batch: Batch, average: bool = False) -> torch.Tensor:
    """Log-prob of each row's response under ``model``: the sum (or mean) of its labelled
    tokens' log-probs (``passes.labelled_logprobs``; EOS included).

    Returns:
        (R,) float32 log-probs, one per row of ``batch["input_ids"]``.
    """
    return sequence_logps_and_lengths(model, batch, average)[0]


def sequence_logps_and_lengths(
    model: nn.Module, batch: Batch, average: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``sequence_logps``, with each row's summed log-prob and its number of response tokens.

    Returns:
        (R,) log-probs (sums, or means with ``average``), (R,) sums, (R,) token counts.
    """
    logprobs, mask = labelled_logprobs(model, batch)  # (R, K) each
    sums = masked_sum(logprobs, mask, dim=1)  # (R,)
    logps = masked_mean(logprobs, mask, dim=1) if average else sums
    return logps, sums, mask.sum(dim=1)


class DPOTrainer(PolicyTrainer):
    """DPO / IPO / cDPO on `DPOPair`s (see the module docstring).

    Args:
        config: a `DPOConfig`.
        model: the policy (a causal LM), already matched to ``tokenizer``; LoRA is added
            here when ``config.lora``.
        tokenizer: supplies the pad id and is saved with checkpoints.
        train_pairs: the training pairs (`preference_pairs`).
        eval_pairs: held-out pairs for `evaluate`; None or empty skips evaluation.
        reference: a frozen reference LM; None uses a copy of the starting ``model`` (or, with
            LoRA, ``model`` with its adapter disabled).
    """

    plot_keys = (
        "train/loss",
        "train/accuracy",
        "train/margin",
        "train/logps_chosen",
        "train/logps_rejected",
    )
    watch = {"loss": "train/loss", "margin": "train/margin", "accuracy": "train/accuracy"}

    def __init__(
        self,
        config: DPOConfig,
        model: nn.Module,
        tokenizer: Any,
        train_pairs: Sequence[DPOPair],
        eval_pairs: Sequence[DPOPair] | None = None,
        *,
        reference: nn.Module | None = None,
        accelerator=None,
    ) -> None:
        super().__init__(
            config,
            model,
            list(train_pairs),
            DPOCollator(tokenizer.pad_token_id),
            tokenizer=tokenizer,
            # Precomputing needs no copy: the starting policy gives the log-probs.
            reference=reference,
            needs_reference=reference is not None or not config.precompute_reference,
            accelerator=accelerator,
        )
        self.eval_pairs = list(eval_pairs or [])
        self._policy_is_reference = False
        if config.precompute_reference:
            self._precompute_reference()

    # ----------------------------------------------------------------- reference
    def reference_logps(self, batch: Batch) -> torch.Tensor:
        """(R,) reference log-probs of a batch, without gradient: the separate reference,
        the LoRA model with its adapter off, or (only while precomputing, before any step)
        the starting policy itself."""
        average = self.config.loss_type == "ipo"
        with torch.no_grad(), self.reference_model() as reference:
            if reference is not None:
                return sequence_logps(reference, batch, average)
            if not self._policy_is_reference:
                raise RuntimeError(
                    "a batch without precomputed reference log-probs, and no reference model "
                    "left to compute them (precompute_reference=True frees it)"
                )
            was_training = self.model.training
            self.model.eval()
            try:
                return sequence_logps(self.model, batch, average)
            finally:
                self.model.train(was_training)

    def _precompute_reference(self) -> None:
        """Reference log-probs of the eval pairs and of the training pairs this run visits,
        then drop the reference model. Runs before any step (also when resuming: the
        checkpoint is loaded later, in `train`), so the starting policy can serve as the
        reference without a copy."""
        self._policy_is_reference = self.reference is None
        visited = self._visited_indices()
        chosen = [self.train_data[i] for i in visited]
        for i, pair in zip(visited, self.attach_reference_logps(chosen), strict=True):
            self.train_data[i] = pair
        self.eval_pairs = self.attach_reference_logps(self.eval_pairs)
        self.reference = None  # no longer needed: free its memory
        self._policy_is_reference = False

    def _visited_indices(self) -> list[int]:
        """Training pairs the run will use: all once it reaches a second epoch, else the head
        of epoch 0's order (the loop's order depends on (seed, epoch) only)."""
        cfg, n = self.config, len(self.train_data)
        visits = self.state.total_steps * cfg.gradient_accumulation_steps * cfg.batch_size
        visits *= self.accelerator.num_processes
        if visits >= n:
            return list(range(n))
        return sorted(int(i) for i in epoch_order(n, cfg.seed, 0)[:visits])

    def attach_reference_logps(self, pairs: Sequence[DPOPair]) -> list[DPOPair]:
        """The pairs with their reference log-probs, computed in batches of eval_batch_size."""
        logps = []
        for batch in self.eval_batches(pairs, self.collate_fn):
            with self.runtime.autocast():
                rows = self.reference_logps(batch).float().cpu()  # (2n,): chosen, then rejected
            n = batch["pair_count"]
            logps += [(float(rows[i]), float(rows[n + i])) for i in range(n)]
        logger.info("precomputed reference log-probs of %d pairs", len(pairs))
        return [DPOPair(p.example, ref) for p, ref in zip(pairs, logps, strict=True)]

    # ----------------------------------------------------------------- loss
    def pair_losses(
        self, batch: Batch
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
        """Per-pair DPO losses (N,) and per-pair statistics of one batch (one policy forward),
        and each chosen response's summed log-prob (with gradient) and token count, (N,) each,
        for RPO's term (`objective`)."""
        cfg = self.config
        n = batch["pair_count"]
        average = cfg.loss_type == "ipo"
        logps, sums, lengths = sequence_logps_and_lengths(self.model, batch, average)  # (2N,)
        ref = batch["ref_logps"] if "ref_logps" in batch else self.reference_logps(batch)
        losses, chosen_rewards, rejected_rewards = dpo_loss(
            logps[:n], logps[n:], ref[:n], ref[n:], cfg.beta, cfg.loss_type, cfg.label_smoothing
        )  # (N,) each
        stats = {
            "accuracy": (chosen_rewards > rejected_rewards).float(),
            "rewards_chosen": chosen_rewards,
            "rewards_rejected": rejected_rewards,
            "margin": chosen_rewards - rejected_rewards,
            "logps_chosen": logps[:n].detach(),
            "logps_rejected": logps[n:].detach(),
        }
        return losses, stats, (sums[:n], lengths[:n])

    def objective(
        self, losses: torch.Tensor, chosen_logps: torch.Tensor, chosen_tokens: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The loss to minimise over pairs: the mean DPO loss or, with ``rpo_alpha``, RPO's
        (``ops.losses.rpo_loss``); and what to log besides the pairs' statistics."""
        alpha = self.config.rpo_alpha
        if alpha == 0:
            return losses.mean(), {}
        loss, nll = rpo_loss(losses, chosen_logps, chosen_tokens, alpha)
        return loss, {"dpo_loss": losses.detach().mean(), "nll_chosen": nll}

    def compute_loss(self, batch: Batch) -> tuple[torch.Tensor, dict[str, Any]]:
        losses, stats, chosen = self.pair_losses(batch)
        loss, extra = self.objective(losses, *chosen)
        return loss, {**{key: value.mean() for key, value in stats.items()}, **extra}

    def evaluate(self) -> dict[str, float]:
        """Loss, preference accuracy, implicit rewards and log-probs over the eval pairs (with
        ``rpo_alpha``: RPO's loss, its NLL per token over every chosen token of the set)."""
        if not self.eval_pairs:
            return {}
        sums: dict[str, float] = {}
        chosen_logps, chosen_tokens = 0.0, 0
        for batch in self.eval_batches(self.eval_pairs, self.collate_fn):
            with self.runtime.autocast():
                losses, stats, (logps, tokens) = self.pair_losses(batch)
            for key, value in {"loss": losses, **stats}.items():
                sums[key] = sums.get(key, 0.0) + float(value.float().sum())
            chosen_logps += float(logps.float().sum())
            chosen_tokens += int(tokens.sum())
        means = {key: total / len(self.eval_pairs) for key, total in sums.items()}
        if self.config.rpo_alpha == 0:
            return means
        # The whole set as one batch: its mean DPO loss and its chosen tokens' totals.
        loss, extra = self.objective(
            torch.tensor([means["loss"]]),
            torch.tensor([chosen_logps]),
            torch.tensor([chosen_tokens]),
        )
        return {**means, "loss": float(loss), **{key: float(v) for key, v in extra.items()}}


def load_pairs(
    config: DPOConfig, source: str, split: str, tokenizer: Any, limit: int | None
) -> list[DPOPair]:
    """Comparisons from ``source`` as tokenised `DPOPair`s (see `preference_pairs`)."""
    examples = load_preferences(
        source,
        tokenizer,
        config,
        split,
        limit,
        max_prompt_length=config.max_prompt_length,
        max_response_length=config.max_response_length,
    )
    return preference_pairs(examples)


def run_dpo(config: DPOConfig) -> Path:
    """Load model, tokenizer, data (and a separate reference if configured), train, and
    return the final model's directory (the ``rlhfkit dpo`` command)."""
    if config.resume and ckpt.is_complete(config.output_dir):
        logger.info("%s is already complete; nothing to do", config.output_dir)
        return config.final_dir
    check_model_source(config.model)  # a look at the directory, before reading any data
    trust = config.trust_remote_code
    tokenizer = load_tokenizer(config.model, trust_remote_code=trust)
    # The data first: a data error stops the run before any model is loaded.
    train = load_pairs(
        config, config.train_data, config.train_split, tokenizer, config.max_train_samples
    )
    evals = None
    if config.eval_data:
        evals = load_pairs(
            config, config.eval_data, config.eval_split, tokenizer, config.max_eval_samples
        )
    set_seed(config.seed)
    model = load_causal_lm(config.model, tokenizer=tokenizer, trust_remote_code=trust)
    reference = None
    if config.reference:
        reference = load_reference(config.reference, tokenizer=tokenizer, trust_remote_code=trust)
    DPOTrainer(config, model, tokenizer, train, evals, reference=reference).train()
    return config.final_dir
