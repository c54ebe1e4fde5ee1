"""What every RL stage (PPO, GRPO, RLOO) reads before it trains, read one way: the training
and held-out prompts.

The prompts come first and are loaded before any model, so a data error stops the run before
minutes go into loading weights; the scorer (``RewardOptions.scorer``: a reward model, reward
functions or both) comes with the models.
"""

from __future__ import annotations

from typing import Any

from rlhfkit.data import load_prompts


def load_rl_prompts(config: Any, tokenizer: Any) -> tuple[list[list[int]], list[list[int]]]:
    """The training prompts (the first ``max_train_samples`` where the stage has that limit)
    and the held-out ones (the first ``max_eval_samples`` of ``eval_data``; none without it),
    as token ids, each cut to ``max_prompt_length`` and in the chat template if asked."""
    read = {
        "tokenizer": tokenizer,
        "max_prompt_length": config.max_prompt_length,
        "chat_template": config.chat_template,
    }
    limit = getattr(config, "max_train_samples", None)
    prompts = load_prompts(config.train_data, config.train_split, limit=limit, **read)
    eval_prompts: list[list[int]] = []
    if config.eval_data:
        eval_prompts = load_prompts(
            config.eval_data, config.eval_split, limit=config.max_eval_samples, **read
        )
    return prompts, eval_prompts
