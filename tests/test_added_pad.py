"""A model whose saved tokenizer has no pad token (as many hub models, SmolLM2's pad being its
EOS): rlhfkit adds ``<|pad|>``, one id past the checkpoint's vocabulary, and every model that
reads the policy's ids (policy, reference, critic, reward model) gets a row for it, whatever
scores and wherever the critic starts; one loaded without it is refused by name."""

import json
import subprocess
import sys

import pytest

from helpers import (
    build_tiny_tokenizer,
    stage_config,
    tiny_corpus,
    tiny_lm,
    tiny_prompts,
    write_jsonl,
)
from rlhfkit.errors import UsageError
from rlhfkit.models.loading import (
    RewardModel,
    ValueModel,
    load_causal_lm,
    load_tokenizer,
    match_vocabulary,
)
from rlhfkit.trainers.rl import RLTrainer, run_rl
from rlhfkit.trainers.rl_config import RLConfig


@pytest.fixture(scope="module")
def no_pad(tmp_path_factory):
    """``policy/``: a tiny GPT-2 saved with a tokenizer that has no pad token; ``rm/``: a
    reward model of the same vocabulary (its pad id the EOS, as TRL's often are), saved with
    that tokenizer; ``prompts.jsonl``: prompts of 2 to 5 words, so every batch is padded."""
    root = tmp_path_factory.mktemp("no_pad")
    tokenizer = build_tiny_tokenizer(pad_is_eos=True)
    tokenizer.pad_token = None
    policy = tiny_lm(tokenizer, n_positions=128)
    policy.save_pretrained(root / "policy")
    tokenizer.save_pretrained(root / "policy")
    reward_model = RewardModel(tiny_lm(tokenizer, seed=2, n_positions=128).transformer)
    reward_model.config.pad_token_id = tokenizer.eos_token_id
    reward_model.save_pretrained(root / "rm")
    tokenizer.save_pretrained(root / "rm")
    lines = tiny_corpus(16, seed=5)
    prompts = [{"prompt": " ".join(line.split()[: 2 + i % 4])} for i, line in enumerate(lines)]
    write_jsonl(root / "prompts.jsonl", prompts)
    return root


def test_the_tokenizer_gains_a_pad_past_the_checkpoints_vocabulary(no_pad):
    tokenizer = load_tokenizer(no_pad / "policy")
    rows = load_causal_lm(no_pad / "policy").get_input_embeddings().num_embeddings
    assert tokenizer.pad_token_id == rows == len(tokenizer) - 1


SCORERS = {
    "reward_model": {"reward_functions": []},
    "function": {"reward_model": None},
    "both": {},
}
CRITICS = {
    "from_reward_model": {},
    "from_policy": {"critic_model": "policy"},  # without a reward model: the default
    "value_head": {"critic": "value_head"},
}
COMBINATIONS = [
    (scorer, critic)
    for scorer in SCORERS
    for critic in CRITICS
    if not (scorer == "function" and critic == "from_reward_model")
]


def _config(root, tmp_path, **overrides) -> RLConfig:
    # Every model reads the padded batch, pad ids included, not only the real tokens.
    return stage_config(
        RLConfig, tmp_path / "run",
        **{"model": str(root / "policy"), "train_data": str(root / "prompts.jsonl"),
           "eval_data": None, "reward_model": str(root / "rm"), "reward_functions": ["sentiment"],
           "max_steps": 2, "rollout_batch_size": 8, "batch_size": 4, "ppo_epochs": 1,
           "max_new_tokens": 4, "padding_free": False, "lr_scheduler": "linear", "seed": 0,
           **overrides},
    )  # fmt: skip


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize(("scorer", "critic"), COMBINATIONS)
def test_ppo_runs_on_a_model_whose_tokenizer_gains_a_pad(no_pad, tmp_path, scorer, critic, lora):
    overrides = {**SCORERS[scorer], **CRITICS[critic]}
    if overrides.get("critic_model") == "policy":
        overrides["critic_model"] = str(no_pad / "policy")
    final = run_rl(_config(no_pad, tmp_path, lora=lora, **overrides))
    assert (final / "model.safetensors").is_file()
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert [m["step"] for m in metrics if "train/score/mean" in m] == [1, 2]


def test_a_critic_loaded_without_the_tokenizer_is_refused_by_name(no_pad, tmp_path):
    tokenizer = load_tokenizer(no_pad / "policy", padding_side="left")
    critic = ValueModel.from_pretrained(no_pad / "policy")  # no tokenizer: no pad row
    message = r"critic \(.*policy\) has 400 token embeddings but the policy's tokenizer has 401"
    with pytest.raises(UsageError, match=message):
        RLTrainer(
            _config(no_pad, tmp_path, reward_model=None),
            load_causal_lm(no_pad / "policy", tokenizer=tokenizer),
            tokenizer,
            tiny_prompts(tokenizer, 8),
            lambda prompts, responses: [0.0] * len(prompts),
            critic=critic,
        )


def test_a_model_without_rows_for_other_tokens_is_refused_not_grown(no_pad, tmp_path):
    tokenizer = load_tokenizer(no_pad / "policy")
    small = load_causal_lm(no_pad / "policy")
    small.resize_token_embeddings(300)
    small.save_pretrained(tmp_path / "small")
    message = r"critic '.*small' has 300 token embeddings.* 401 tokens: ids 300 to 400 have no"
    with pytest.raises(UsageError, match=message):
        ValueModel.from_pretrained(tmp_path / "small", tokenizer=tokenizer)
    with pytest.raises(UsageError, match="adds a row only for the pad token"):
        match_vocabulary(small, tokenizer, "model")


def test_the_reported_command_runs(no_pad, tmp_path):
    """`rlhfkit ppo --reward_model null --reward_functions sentiment --lora true`, as reported
    (it stopped with an IndexError in the critic's first pass)."""
    command = [sys.executable, "-m", "rlhfkit.cli", "ppo", "--model", str(no_pad / "policy")]
    command += ["--reward_model", "null", "--reward_functions", "sentiment", "--lora", "true"]
    command += ["--train_data", str(no_pad / "prompts.jsonl"), "--eval_data", "null"]
    command += ["--output_dir", str(tmp_path / "run"), "--max_steps", "2", "--cpu", "true"]
    command += ["--rollout_batch_size", "8", "--batch_size", "4", "--ppo_epochs", "1"]
    command += ["--max_new_tokens", "4", "--report_to", "none"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "run" / "final" / "critic").is_dir()
