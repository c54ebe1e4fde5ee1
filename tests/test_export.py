"""`rlhfkit export`: a PPO or GRPO checkpoint becomes the model directory the run would have
written as `final/` at that step; written as the run's `final/`, it ends the run there."""

import json
import os
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM

from helpers import tiny_corpus
from rlhfkit import checkpoint as ckpt
from rlhfkit.errors import UsageError
from rlhfkit.models.loading import check_model_source
from rlhfkit.models.lora import merged_copy
from rlhfkit.models.passes import causal_lm
from rlhfkit.trainers.export import CheckpointExportConfig, run_checkpoint_export
from rlhfkit.trainers.rl import RLTrainer, run_rl
from rlhfkit.trainers.rl_config import RLConfig


def _fields(tiny_model_dir, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in tiny_corpus(16)))
    return dict(
        model=str(tiny_model_dir),
        train_data=str(prompts),
        output_dir=str(tmp_path / "run"),
        reward_model=None,
        reward_functions=["rlhfkit.tasks:digits_reward"],
        max_steps=3,
        max_new_tokens=8,
        learning_rate=1e-3,
        save_every=1,
        report_to=[],
        seed=0,
    )


def _ppo_config(tiny_model_dir, tmp_path, **overrides):
    fields = _fields(tiny_model_dir, tmp_path)
    return RLConfig(**{**fields, "rollout_batch_size": 8, "batch_size": 4, **overrides})


def _state(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _export(checkpoint, output_dir):
    return run_checkpoint_export(CheckpointExportConfig(str(checkpoint), str(output_dir)))


def test_a_ppo_checkpoint_exported_as_final_ends_the_run_at_its_step(tiny_model_dir, tmp_path):
    config = _ppo_config(tiny_model_dir, tmp_path)
    trainer = RLTrainer.from_config(config)
    start = _state(causal_lm(trainer.models.policy))
    trainer.train(stop_after=2)
    policy, critic = _state(causal_lm(trainer.models.policy)), _state(trainer.models.critic)
    assert any(not torch.equal(start[k], policy[k]) for k in start)  # the policy moved
    run = tmp_path / "run"
    before = sorted(p.name for p in run.iterdir())

    final = _export(run / "checkpoint-2", run / "final")

    exported = AutoModelForCausalLM.from_pretrained(final)
    assert all(torch.equal(exported.state_dict()[k], v) for k, v in policy.items())
    critic_back = type(trainer.models.critic).from_pretrained(final / "critic")
    assert all(torch.equal(critic_back.state_dict()[k], v) for k, v in critic.items())
    state = ckpt.read_json(final / ckpt.STATE_FILE)
    assert state["step"] == 2 and state["complete"] is True
    assert state["exported_from"] == str(run / "checkpoint-2")
    assert ckpt.verify(final) and ckpt.is_complete(run)
    assert sorted(p.name for p in run.iterdir()) == sorted([*before, "final"])

    with pytest.raises(UsageError, match="a training checkpoint .* `rlhfkit export --check"):
        check_model_source(run / "checkpoint-2")  # what eval and chat say of it
    run_rl(_ppo_config(tiny_model_dir, tmp_path, resume=True))  # finished: nothing trains
    assert ckpt.read_json(final / ckpt.STATE_FILE)["step"] == 2
    assert not (run / "checkpoint-3").exists()


def test_a_lora_grpo_checkpoint_is_exported_merged(tiny_model_dir, tmp_path):
    fields = _fields(tiny_model_dir, tmp_path)
    grpo = {"rollout_batch_size": 2, "num_generations": 4, "batch_size": 8, "lora": True}
    config = RLConfig.preset("grpo", **{**fields, **grpo})
    trainer = RLTrainer.from_config(config)
    trainer.train(stop_after=1)
    merged = _state(merged_copy(trainer.unwrapped_model))
    assert (tmp_path / "run" / "checkpoint-1" / "trainable.safetensors").is_file()

    out = _export(tmp_path / "run" / "checkpoint-1", tmp_path / "at-1")

    exported = AutoModelForCausalLM.from_pretrained(out).state_dict()
    assert exported.keys() == merged.keys()
    for name, value in merged.items():
        torch.testing.assert_close(exported[name], value, msg=name)


def _saved_state(directory, **state):
    directory.mkdir(parents=True)
    ckpt.write_json(state, directory / ckpt.STATE_FILE)
    return directory


def test_what_is_not_an_exportable_checkpoint_is_refused_by_name(tmp_path):
    with pytest.raises(UsageError, match="no trainer_state.json there, so not a checkpoint"):
        _export(tmp_path, tmp_path / "out")
    sft = _saved_state(tmp_path / "sft" / "checkpoint-4", step=4, config={"max_length": 64})
    with pytest.raises(UsageError, match="not of an RL run .* SFT, reward-model"):
        _export(sft, tmp_path / "out")
    final = _saved_state(tmp_path / "ppo" / "final", step=4, complete=True, config={})
    with pytest.raises(UsageError, match="is a finished model directory"):
        _export(final, tmp_path / "out")
    with pytest.raises(UsageError, match="output_dir .* exists; remove it"):
        _export(sft, sft.parent)


def test_export_command_end_to_end(tiny_model_dir, tmp_path):
    trainer = RLTrainer.from_config(_ppo_config(tiny_model_dir, tmp_path, max_steps=2))
    trainer.train(stop_after=1)
    env = dict(os.environ, OMP_NUM_THREADS="2", TOKENIZERS_PARALLELISM="false")
    command = [sys.executable, "-m", "rlhfkit.cli", "export"]
    checkpoint = str(tmp_path / "run" / "checkpoint-1")
    done = subprocess.run(
        [*command, "--checkpoint", checkpoint, "--output_dir", str(tmp_path / "at-1")],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "at-1" / "model.safetensors").is_file()
    again = subprocess.run(
        [*command, "--checkpoint", checkpoint, "--output_dir", str(tmp_path / "at-1")],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert again.returncode == 2 and "Traceback" not in again.stderr
    assert "exists; remove it or choose another directory" in again.stderr
