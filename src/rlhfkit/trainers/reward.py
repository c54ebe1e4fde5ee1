"""Reward model on comparisons and K-way rankings: InstructGPT step 2 (Ouyang et al. 2022, eq. 1).

A `RewardModel` (causal-LM backbone + linear head read at the last real token, from
`rlhfkit.models.loading`) scores every prompt + response. `PairCollator` lays a batch out rank-major, so
one forward pass scores all responses and `ranked_scores` turns them into a best-first (N, K)
table. Loss, by batch content:

- only pairs (K = 2): the configured pairwise loss, `-log sigmoid(r_chosen - r_rejected -
  margin)` or Coati's `log(1 + exp(r_rejected - r_chosen))` (`ops.losses`);
- any ranking with K > 2: InstructGPT's ranking loss over all C(K, 2) pairs of each prompt,
  each prompt weighted once (`ops.losses.ranking_loss`; pairs in the same batch count as
  prompts with K = 2). The margin and the log-exp form do not apply there.

With `group_by_prompt` each prompt's comparisons are one example (`data.group_by_prompt`,
InstructGPT's batching): its distinct responses are scored once, and the pairwise loss runs
over the (P, 2) [better, worse] scores of its pairs, the mean over the batch's pairs as
without grouping.

With `center_rewards_coef` > 0 the centring term of Eisenstein et al. 2023
(`ops.losses.reward_centering`, TRL's `center_rewards_coefficient`) is added with that
weight. Dropout is off by default (`disable_dropout`), as in TRL's RewardTrainer.

With `padding_free` the rows of a batch are scored packed, their real tokens in one row
(`runtime/packing.py`).

Evaluation: pairwise accuracy and mean margin over every (better, worse) pair, plus for K > 2
data the ranking accuracy (share of a ranking's pairs ordered right) and the share of rankings
reproduced exactly. Optional InstructGPT normalisation: after training, the head's bias is
shifted so that the demonstrations in `normalize_data` score 0 on average, which gives PPO
rewards centred on what the SFT policy already writes.

The model starts from a causal LM (a fresh head) or from a reward model with its trained head:
one rlhfkit wrote, or any one-label `AutoModelForSequenceClassification` such as TRL's. The
final model is that standard format too (`rlhfkit.models.reward_format`; with LoRA the merged
model), with the tokenizer beside it, so transformers and TRL load it as it is.

Departures from TRL's RewardTrainer: rankings are not expanded into independent pairs, and the
head has a bias (the normalisation's shift; written into the final norm's bias on save). On a
model whose final norm has no bias (Llama-style RMSNorm) the bias is not trained, so what
transformers reads stays what rlhfkit trained.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from accelerate.utils import set_seed

from rlhfkit import checkpoint as ckpt
from rlhfkit.config import RewardConfig, TrainConfig
from rlhfkit.data import (
    PairCollator,
    PreferenceExample,
    SFTCollator,
    SFTExample,
    encode_comparisons,
    encode_demonstrations,
    group_by_prompt,
    load_records,
    ranked_scores,
)
from rlhfkit.models.loading import (
    RewardModel,
    check_model_source,
    disable_dropout,
    load_tokenizer,
)
from rlhfkit.models.lora import add_lora, merged_copy
from rlhfkit.models.reward_format import bias_is_portable
from rlhfkit.ops.losses import (
    pairwise_logexp_loss,
    pairwise_logsigmoid_loss,
    ranking_loss,
    reward_centering,
)
from rlhfkit.runtime.packing import PackedRows, packing_enabled
from rlhfkit.trainers.loop import Batch, Trainer

logger = logging.getLogger(__name__)


def pair_table(scores: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Margins r_better - r_worse of every pair within each row, and which pairs are real.

    Args:
        scores: (N, K) best-first scores; valid: (N, K) which responses exist.

    Returns:
        margins (N, P) and pair_valid (N, P) bool, P = K (K - 1) / 2, pairs in
        `torch.triu_indices` order (the order `ops.losses.ranking_loss` uses).
    """
    k = scores.shape[1]
    better, worse = torch.triu_indices(k, k, offset=1, device=scores.device)  # (P,) each
    margins = scores[:, better] - scores[:, worse]  # (N, P)
    pair_valid = valid[:, better].bool() & valid[:, worse].bool()  # (N, P)
    return margins, pair_valid


def ranking_metrics(scores: torch.Tensor, valid: torch.Tensor) -> dict[str, float]:
    """Accuracy and margin of a best-first score table (see the module docstring).

    `accuracy` and `margin` average over all real pairs; `ranking_accuracy` averages the share
    of correctly ordered pairs per ranking with K > 2, and `ranking_exact` is the share of those
    rankings whose every pair is ordered right (both NaN-free: omitted without K > 2 rows).
    """
    margins, pair_valid = pair_table(scores, valid)
    correct = (margins > 0) & pair_valid  # (N, P)
    metrics = {
        "accuracy": (correct.sum() / pair_valid.sum().clamp(min=1)).item(),
        "margin": (
            margins[pair_valid].mean() if pair_valid.any() else margins.new_zeros(())
        ).item(),
    }
    pairs_per_row = pair_valid.sum(1)  # (N,)
    ranked = pairs_per_row > 1  # rows with K > 2 responses
    if ranked.any():
        share = correct.sum(1)[ranked] / pairs_per_row[ranked]  # (N_ranked,)
        metrics["ranking_accuracy"] = share.float().mean().item()
        metrics["ranking_exact"] = (share == 1).float().mean().item()
    return metrics


def preference_loss(
    table: torch.Tensor,
    valid: torch.Tensor,
    loss: str = "logsigmoid",
    margin: float | None = None,
    center_coef: float = 0.0,
) -> torch.Tensor:
    """The pairwise `loss` ("logsigmoid" with optional `margin`, or "logexp") when the batch
    holds only pairs (K = 2), else InstructGPT's K-way ranking loss over the (N, K) table;
    plus `center_coef` times the centring term (`reward_centering`) when it is > 0."""
    chosen, rejected = table[:, 0], table[:, 1]  # (N,) each
    if table.shape[1] > 2:
        fit = ranking_loss(table, valid)
    elif loss == "logexp":
        fit = pairwise_logexp_loss(chosen, rejected)
    else:
        margins = None if margin is None else torch.full_like(chosen, margin)
        fit = pairwise_logsigmoid_loss(chosen, rejected, margins)
    if center_coef == 0:
        return fit
    return fit + center_coef * reward_centering(table, valid)


class RewardTrainer(Trainer):
    """Train a `RewardModel` on `PreferenceExample`s (pairs or best-first rankings)."""

    plot_keys = ("train/loss", "train/accuracy", "train/margin", "train/lr")
    watch = {"loss": "train/loss", "accuracy": "train/accuracy"}

    def __init__(
        self,
        config: RewardConfig,
        model: RewardModel,
        tokenizer: Any,
        train_examples: Sequence[PreferenceExample],
        eval_examples: Sequence[PreferenceExample] = (),
        *,
        normalize_examples: Sequence[SFTExample] = (),
        **kwargs: Any,
    ) -> None:
        self.collate = PairCollator(pad_id=tokenizer.pad_token_id)
        model.config.pad_token_id = tokenizer.pad_token_id  # where transformers reads the score
        portable = bias_is_portable(model.backbone)
        if config.disable_dropout:
            disable_dropout(model)
        if config.lora:  # adapters on the backbone; the score head trains in full
            model = add_lora(model, **config.lora_settings)
        if not portable:  # a bias the standard format cannot carry (reward_format) stays put
            model.score.bias.requires_grad_(False)
        if config.group_by_prompt:
            train_examples = _grouped(train_examples, "train")
            eval_examples = _grouped(eval_examples, "eval")
        super().__init__(config, model, train_examples, self.collate, tokenizer=tokenizer, **kwargs)
        self.eval_examples = eval_examples
        self.normalize_examples = normalize_examples

    def score_table(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """Best-first (N, K) scores of a `PairCollator` batch and its (N, K) valid mask; for
        grouped comparisons (`pairs` in the batch) the (P, 2) [better, worse] scores of its
        pairs instead, which the loss and the metrics read as P pairs."""
        ids, mask = batch["input_ids"], batch["attention_mask"]  # (R, T)
        if packing_enabled(self.model):  # padding_free
            scores = self.model(**PackedRows.from_mask(mask).inputs(ids))  # (R,)
        else:
            scores = self.model(ids, mask)  # (R,)
        table, valid = ranked_scores(scores.float(), batch["group"], batch["rank"])  # (N, K)
        if "pairs" not in batch:
            return table, valid
        group, better, worse = batch["pairs"].unbind(1)  # (P,) each
        pairs = torch.stack([table[group, better], table[group, worse]], dim=1)  # (P, 2)
        return pairs, torch.ones_like(pairs, dtype=torch.bool)

    def compute_loss(self, batch: Batch) -> tuple[torch.Tensor, dict[str, Any]]:
        cfg = self.config
        table, valid = self.score_table(batch)
        loss = preference_loss(table, valid, cfg.loss, cfg.margin, cfg.center_rewards_coef)
        with torch.no_grad():
            metrics = ranking_metrics(table, valid)
            metrics["score_best"] = table[:, 0].mean().item()
            if cfg.center_rewards_coef > 0:
                metrics["centering"] = reward_centering(table, valid).item()
        return loss, metrics

    def evaluate(self) -> dict[str, float]:
        if not self.eval_examples:
            return {}
        tables, valids = [], []
        for batch in self.eval_batches(self.eval_examples, self.collate):
            table, valid = self.score_table(batch)
            tables.append(table)
            valids.append(valid)
        # Batches may differ in K: pad every table to the largest K with invalid entries.
        k = max(t.shape[1] for t in tables)
        table = torch.cat([torch.nn.functional.pad(t, (0, k - t.shape[1])) for t in tables])
        valid = torch.cat([torch.nn.functional.pad(v, (0, k - v.shape[1])) for v in valids])
        return ranking_metrics(table, valid)

    def save_model(self, path: Path) -> None:
        """The reward model with the tokenizer, as a one-label sequence classifier that
        transformers, TRL, ``RewardModel.from_pretrained`` and every scorer load; with LoRA
        the merged model."""
        merged_copy(self.unwrapped_model).save_pretrained(path)
        self.tokenizer.save_pretrained(path)

    def on_train_end(self) -> None:
        """InstructGPT normalisation: shift the head's bias so the demonstrations score 0."""
        if not self.normalize_examples:
            return
        model = self.unwrapped_model
        model.eval()
        scores = []
        with torch.no_grad(), self.runtime.autocast():
            collate = SFTCollator(pad_id=self.tokenizer.pad_token_id)
            for batch in self.eval_batches(self.normalize_examples, collate):
                scores.append(model(batch["input_ids"], batch["attention_mask"]).float())
        mean = torch.cat(scores).mean()
        with torch.no_grad():
            model.score.bias -= mean.to(model.score.bias.dtype)
        model.train()
        logger.info("reward normalised: demonstrations' mean score %.4f shifted to 0", mean)
        if self.tracker is not None:
            self.tracker.log({"eval/normalization_shift": -mean.item()}, self.state.step)


def _grouped(examples: Sequence[PreferenceExample], name: str) -> list[PreferenceExample]:
    """`group_by_prompt`, logging the responses a pass scores before and after grouping."""
    grouped = group_by_prompt(examples)
    if examples:
        logger.info(
            "group_by_prompt: %d %s examples (%d responses) -> %d prompts (%d responses)",
            len(examples),
            name,
            sum(len(e.response_ids) for e in examples),
            len(grouped),
            sum(len(e.response_ids) for e in grouped),
        )
    return grouped


def load_preferences(
    source: str,
    tokenizer: Any,
    config: TrainConfig,
    split: str,
    limit: int | None,
    *,
    max_prompt_length: int | None = None,
    max_response_length: int | None = None,
) -> list[PreferenceExample]:
    """Comparisons or rankings of `source`, tokenised (truncation is logged by `rlhfkit.data`;
    the length limits as in `encode_comparisons`); the reward model's and DPO's data alike."""
    records = load_records(
        source,
        "comparisons",
        split=split,
        columns=config.columns,
        limit=limit,
        degenerate_comparisons=config.degenerate_comparisons,
    )
    examples, _ = encode_comparisons(
        records,
        tokenizer,
        config.max_length,
        max_prompt_length=max_prompt_length,
        max_response_length=max_response_length,
        chat_template=config.chat_template,
    )
    return examples


def run_reward(config: RewardConfig) -> Path:
    """Load backbone, tokenizer and data from `config`, train, and return the final model's dir."""
    if config.resume and ckpt.is_complete(config.output_dir):
        logger.info("%s is already complete; nothing to do", config.output_dir)
        return config.final_dir
    check_model_source(config.model)  # a look at the directory, before reading any data
    tokenizer = load_tokenizer(config.model, trust_remote_code=config.trust_remote_code)
    # The data first: a data error stops the run before any model is loaded.
    train = load_preferences(
        config.train_data, tokenizer, config, config.train_split, config.max_train_samples
    )
    evaluation, normalize = [], []
    if config.eval_data:
        evaluation = load_preferences(
            config.eval_data, tokenizer, config, config.eval_split, config.max_eval_samples
        )
    if config.normalize_data:
        records = load_records(config.normalize_data, "demonstrations", split=config.train_split)
        normalize, _ = encode_demonstrations(
            records, tokenizer, config.max_length, chat_template=config.chat_template
        )
    set_seed(config.seed)  # the new head's initial weights
    model = RewardModel.from_pretrained(
        config.model, tokenizer=tokenizer, trust_remote_code=config.trust_remote_code
    )
    trainer = RewardTrainer(
        config, model, tokenizer, train, evaluation, normalize_examples=normalize
    )
    trainer.train()
    return config.final_dir
