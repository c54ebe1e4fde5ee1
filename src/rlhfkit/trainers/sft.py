"""Supervised fine-tuning on demonstrations: InstructGPT step 1 (Ouyang et al. 2022, sec. 3.5).

The loss is the negative log-likelihood of the response tokens only (EOS included): prompt and
padding positions carry label -100 (`rlhfkit.data.encode_demonstrations`, `SFTCollator`) and
are masked out. Log-probs come from `ops.logprobs.shifted_logprobs` (logits at t score token
t + 1), averaged with `ops.masks.masked_mean` over all response tokens of the micro-batch, as
TRL's completion-only SFT does. Evaluation reports the held-out response NLL per token (summed
over the whole eval set, then divided by its response-token count) and its perplexity.

Departures from InstructGPT: no fixed epoch count or residual dropout schedule is imposed
(both are config fields of the shared loop).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from accelerate.utils import set_seed

from rlhfkit import checkpoint as ckpt
from rlhfkit.config import SFTConfig
from rlhfkit.data import (
    SFTCollator,
    SFTExample,
    encode_demonstrations,
    load_records,
)
from rlhfkit.models.loading import check_model_source, load_causal_lm, load_tokenizer
from rlhfkit.models.passes import labelled_logprobs, labelled_tokens
from rlhfkit.ops.masks import masked_mean, masked_sum
from rlhfkit.runtime.distributed import shares_over_ranks
from rlhfkit.trainers.loop import Batch
from rlhfkit.trainers.policy import PolicyTrainer

logger = logging.getLogger(__name__)


class SFTTrainer(PolicyTrainer):
    """Fine-tune a causal LM on demonstrations; loss on response tokens only. With ``lora``
    only adapters train, checkpoints hold them, and ``final/`` is the merged model."""

    plot_keys = ("train/loss", "train/lr", "train/grad_norm")

    def __init__(
        self,
        config: SFTConfig,
        model: torch.nn.Module,
        tokenizer: Any,
        train_examples: Sequence[SFTExample],
        eval_examples: Sequence[SFTExample] = (),
        **kwargs: Any,
    ) -> None:
        self.collate = SFTCollator(pad_id=tokenizer.pad_token_id)
        super().__init__(
            config,
            model,
            train_examples,
            self.collate,
            tokenizer=tokenizer,
            reference=None,
            needs_reference=False,
            **kwargs,
        )
        self.eval_examples = eval_examples

    def micro_batch_weights(self, batches: list[Batch]) -> list[float]:
        """By response tokens, over the processes: the mean NLL of all their tokens."""
        return shares_over_ranks(torch.stack([labelled_tokens(batch) for batch in batches]))

    def compute_loss(self, batch: Batch) -> tuple[torch.Tensor, dict[str, Any]]:
        logprobs, mask = labelled_logprobs(self.model, batch, trim=False)
        loss = -masked_mean(logprobs, mask)  # mean NLL over the micro-batch's response tokens
        return loss, {"response_tokens": mask.sum()}

    def evaluate(self) -> dict[str, float]:
        if not self.eval_examples:
            return {}
        nll, tokens = 0.0, 0
        for batch in self.eval_batches(self.eval_examples, self.collate):
            logprobs, mask = labelled_logprobs(self.model, batch, trim=False)
            nll -= masked_sum(logprobs, mask).item()
            tokens += int(mask.sum())
        nll_per_token = nll / max(tokens, 1)
        return {"nll": nll_per_token, "perplexity": math.exp(min(nll_per_token, 50.0))}


def load_demonstrations(
    source: str, tokenizer: Any, config: SFTConfig, split: str, limit: int | None
) -> list[SFTExample]:
    """Records of `source` tokenised for SFT (truncation is logged by `rlhfkit.data`)."""
    records = load_records(
        source, "demonstrations", split=split, columns=config.columns, limit=limit
    )
    examples, _ = encode_demonstrations(
        records, tokenizer, config.max_length, chat_template=config.chat_template
    )
    return examples


def run_sft(config: SFTConfig) -> Path:
    """Load model, tokenizer and data from `config`, train, and return the final model's dir."""
    if config.resume and ckpt.is_complete(config.output_dir):
        logger.info("%s is already complete; nothing to do", config.output_dir)
        return config.final_dir
    check_model_source(config.model)  # a look at the directory, before reading any data
    tokenizer = load_tokenizer(config.model, trust_remote_code=config.trust_remote_code)
    # The data first: a data error stops the run before any model is loaded.
    train = load_demonstrations(
        config.train_data, tokenizer, config, config.train_split, config.max_train_samples
    )
    evaluation = []
    if config.eval_data:
        evaluation = load_demonstrations(
            config.eval_data, tokenizer, config, config.eval_split, config.max_eval_samples
        )
    set_seed(config.seed)
    model = load_causal_lm(
        config.model, tokenizer=tokenizer, trust_remote_code=config.trust_remote_code
    )
    SFTTrainer(config, model, tokenizer, train, evaluation).train()
    return config.final_dir
