"""Activation checkpointing (`gradient_checkpointing: true`): the trained models recompute each
block in the backward pass, and the steps are the ones made without it."""

import pytest
import torch
from transformers.models.gpt2.modeling_gpt2 import GPT2Block

from helpers import TargetFraction, tiny_lm, tiny_prompts
from rlhfkit.data import encode_demonstrations
from rlhfkit.models.loading import ValueModel
from rlhfkit.trainers.rl import RLTrainer
from rlhfkit.trainers.rl_config import RLConfig
from rlhfkit.trainers.sft import SFTTrainer
from test_sft import _config as sft_config
from test_sft import qa_demos


def _count_block_passes(module: torch.nn.Module) -> list[int]:
    """A counter that every forward of a transformer block in ``module`` increments, the
    recomputations of checkpointing included (counted at the block's MLP: transformers
    checkpoints a block's ``forward``, inside its own hooks)."""
    calls = [0]

    def count(*_):
        calls[0] += 1

    for block in module.modules():
        if isinstance(block, GPT2Block):
            block.mlp.register_forward_pre_hook(count)
    return calls


def _sft_run(tiny_tokenizer, tmp_path, checkpointing: bool):
    model = tiny_lm(tiny_tokenizer)
    calls = _count_block_passes(model)
    examples, _ = encode_demonstrations(qa_demos(8, seed=0), tiny_tokenizer, 64)
    config = sft_config(
        tmp_path / str(checkpointing), "unused", max_steps=2, eval_every=0, log_every=1,
        gradient_checkpointing=checkpointing, save_every=0,
    )  # fmt: skip
    SFTTrainer(config, model, tiny_tokenizer, examples, []).train()
    return {k: v.clone() for k, v in model.state_dict().items()}, calls[0]


def test_sft_with_checkpointing_recomputes_each_block_and_makes_the_same_steps(
    tiny_tokenizer, tmp_path
):
    plain, plain_calls = _sft_run(tiny_tokenizer, tmp_path, checkpointing=False)
    checkpointed, checkpointed_calls = _sft_run(tiny_tokenizer, tmp_path, checkpointing=True)
    assert plain_calls == 2 * 2  # 2 steps x 2 blocks, forward only
    assert checkpointed_calls == 2 * plain_calls  # and again in each backward
    for name, value in plain.items():
        torch.testing.assert_close(checkpointed[name], value, rtol=0, atol=1e-6, msg=name)


def _ppo_iteration(tiny_tokenizer, tmp_path, checkpointing: bool):
    policy, reference = tiny_lm(tiny_tokenizer), tiny_lm(tiny_tokenizer)
    critic = ValueModel(tiny_lm(tiny_tokenizer, seed=1).transformer)
    calls = _count_block_passes(policy)
    config = RLConfig(
        model="unused", train_data="unused", output_dir=str(tmp_path / str(checkpointing)),
        reward_model=None, reward_functions=["unused:unused"], max_steps=1,
        rollout_batch_size=8, batch_size=8, ppo_epochs=1, max_new_tokens=6,
        learning_rate=1e-3, report_to=[], resume=False, cpu=True,
        gradient_checkpointing=checkpointing, parallel_critic=False,
    )  # fmt: skip
    trainer = RLTrainer(
        config, policy, tiny_tokenizer, tiny_prompts(tiny_tokenizer), TargetFraction(),
        reference=reference, critic=critic,
    )  # fmt: skip
    assert critic.backbone.is_activation_checkpointing == checkpointing
    assert not reference.is_activation_checkpointing
    calls[0] = 0
    trainer.update(trainer.maker.make(*_prompt_batch(trainer), kl_coef=0.05))
    return {k: v.clone() for k, v in trainer.trainable.state_dict().items()}, calls[0]


def _prompt_batch(trainer):
    batch = trainer.next_batch()
    return batch["query"], batch["query_mask"]


@pytest.mark.parametrize("side", ["policy", "critic"])
def test_ppo_update_with_checkpointing_makes_the_same_step(tiny_tokenizer, tmp_path, side):
    plain, plain_calls = _ppo_iteration(tiny_tokenizer, tmp_path, checkpointing=False)
    checkpointed, calls = _ppo_iteration(tiny_tokenizer, tmp_path, checkpointing=True)
    # rollout: 6 decoding steps + 1 scoring pass, 2 blocks each; update: 1 pass (+1 recompute)
    assert calls == plain_calls + 2
    for name, value in plain.items():
        if name.startswith(side):
            torch.testing.assert_close(checkpointed[name], value, rtol=0, atol=1e-6, msg=name)
