"""What every RL stage (PPO, GRPO, RLOO) reads before it trains, read one way: the training
and held-out prompts.

The prompts come first and are loaded before any model, so a data error stops the run before
minutes go into loading weights, and so does a record a reward function cannot take (a column
it needs and the row lacks: ``scorer_loading.reward_data_check``); the scorer
(``RewardOptions.scorer``: a reward model, reward functions or both) comes with the models.
"""

from __future__ import annotations

from typing import Any

from rlhfkit.data import PromptExample, load_prompts
from rlhfkit.experience.scorer_loading import reward_data_check
from rlhfkit.trainers.rl_config import RLConfig


def load_rl_prompts(
    config: RLConfig, tokenizer: Any
) -> tuple[list[PromptExample], list[PromptExample]]:
    """The training prompts (the first ``max_train_samples``) and the held-out ones (the first ``max_eval_samples`` of ``eval_data``; none without it),
    each with its token ids cut to ``max_prompt_length``, in the chat template if asked, and
    its row's columns, checked against what the reward functions need of them."""
    read = {
        "tokenizer": tokenizer,
        "max_prompt_length": config.max_prompt_length,
        "chat_template": config.chat_template,
    }
    check = reward_data_check(config.reward_functions)
    limit = config.max_train_samples
    prompts = load_prompts(config.train_data, config.train_split, limit=limit, check=check, **read)
    eval_prompts: list[PromptExample] = []
    if config.eval_data:
        check = reward_data_check([*config.reward_functions, *config.gold_functions])
        limit = config.max_eval_samples
        eval_prompts = load_prompts(
            config.eval_data, config.eval_split, limit=limit, check=check, **read
        )
    return prompts, eval_prompts
