"""The base of the trainers of a causal-LM policy (SFT, DPO): dropout off where the
config asks, optional LoRA, the frozen reference where the stage has one, and the final model
of LoRA runs merged (checkpoints hold the adapter, ``checkpoints.MODEL_DIRECTORY``).

The reference is, in order of preference: the model given; with LoRA, the policy itself with
its adapter disabled (``lora.reference_mode``: never a second copy in memory); otherwise a
copy of the starting policy, made before the first step. A stage that needs no reference model
(DPO with precomputed log-probs) gets none.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from torch import nn

from rlhfkit.config import TrainConfig
from rlhfkit.models.loading import disable_dropout, freeze
from rlhfkit.models.lora import add_lora, merged_copy, reference_mode
from rlhfkit.runtime.sharding import shard
from rlhfkit.trainers.loop import Batch, Trainer


class PolicyTrainer(Trainer):
    """A `Trainer` whose model is a policy with a frozen reference.

    ``config`` needs the fields of `config.LoRAOptions` and ``disable_dropout``;
    ``needs_reference`` says whether the stage runs a reference model at all.
    """

    def __init__(
        self,
        config: TrainConfig,
        model: nn.Module,
        train_data: Sequence[Any],
        collate_fn: Callable[[list[Any]], Batch],
        *,
        tokenizer: Any,
        reference: nn.Module | None,
        needs_reference: bool,
        accelerator=None,
    ) -> None:
        if config.disable_dropout:
            disable_dropout(model)
        if config.lora:
            model = add_lora(model, **config.lora_settings)
        elif reference is None and needs_reference:
            reference = copy.deepcopy(model)  # the starting weights, before any step
        super().__init__(
            config, model, train_data, collate_fn, tokenizer=tokenizer, accelerator=accelerator
        )
        self.reference = None
        if reference is not None and needs_reference:
            if config.disable_dropout:
                disable_dropout(reference)
            self.reference = freeze(self.runtime.prepare(reference, packed=self.padding_free))
            if self.runtime.sharded:
                shard(self.reference)

    @contextmanager
    def reference_model(self) -> Iterator[nn.Module | None]:
        """The reference model to run (no gradient is taken through it): the separate copy,
        the LoRA policy with its adapter off, or None when the stage has no reference."""
        if self.reference is not None:
            yield self.reference
        elif self.config.lora:
            with reference_mode(self.unwrapped_model) as reference:
                yield reference
        else:
            yield None

    # ----------------------------------------------------------------- the final model
    def save_model(self, path: Path) -> None:
        """With LoRA, ``final/`` holds the merged model, so anything that loads a causal LM
        can open it."""
        if not self.config.lora:
            super().save_model(path)
            return
        merged_copy(self.unwrapped_model).save_pretrained(path)
        if self.tokenizer is not None:
            self.tokenizer.save_pretrained(path)
