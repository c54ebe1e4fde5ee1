"""A loss, gradient norm or rollout tensor that is NaN or inf stops the run (RunError, exit 1)
before anything is saved from it, naming the step and the quantity; `skip_nonfinite_steps`
skips and counts such steps instead."""

import json
import math
import os
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM

from helpers import TargetFraction, tiny_lm, tiny_prompts
from rlhfkit import checkpoint as ckpt
from rlhfkit.config import ConfigError, TrainConfig
from rlhfkit.errors import NonFiniteError, RunError
from rlhfkit.experience.rollout import Rollout
from rlhfkit.experience.scorers import ScoreError
from rlhfkit.models.loading import ValueModel
from rlhfkit.tracking import read_jsonl
from rlhfkit.trainers.loop import Trainer
from rlhfkit.trainers.rl import RLTrainer
from rlhfkit.trainers.rl_config import RLConfig


class ToyLMTrainer(Trainer):
    """Next-token loss on random sequences; ``poisoned`` steps (1-based) give a NaN loss."""

    poisoned: tuple[int, ...] = ()

    def compute_loss(self, batch):
        loss = self.model(input_ids=batch["input_ids"], labels=batch["input_ids"]).loss
        if self.state.step + 1 in self.poisoned:
            loss = loss * float("nan")
        return loss, {}


def _toy(model_dir, tokenizer, out, **overrides):
    fields = dict(
        model=str(model_dir), output_dir=str(out), batch_size=4, max_steps=6,
        learning_rate=1e-3, lr_scheduler="constant", log_every=1, save_every=1, keep_last=10,
        cpu=True, report_to=[],
    )  # fmt: skip
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    gen = torch.Generator().manual_seed(1)
    data = [torch.randint(2, len(tokenizer), (12,), generator=gen) for _ in range(16)]
    config = TrainConfig(**{**fields, **overrides})
    return ToyLMTrainer(config, model, data, lambda xs: {"input_ids": torch.stack(xs)})


def _saved_steps(out):
    return sorted(int(p.name.split("-")[1]) for p in ckpt.checkpoint_dirs(out))


def test_a_diverging_run_stops_at_the_bad_step_and_saves_nothing_from_it(
    tiny_model_dir, tiny_tokenizer, tmp_path
):
    trainer = _toy(tiny_model_dir, tiny_tokenizer, tmp_path, learning_rate=1e6, max_grad_norm=0)
    with pytest.raises(RunError, match="training diverged at step") as info:
        trainer.train()
    message = str(info.value)
    step = int(message.split("at step ")[1].split()[0])
    assert "is nan" in message or "is inf" in message
    assert "learning_rate" in message and "max_grad_norm" in message
    assert not (tmp_path / "final").exists()
    assert _saved_steps(tmp_path) == list(range(1, step))  # the last good step is the newest
    assert json.loads((tmp_path / "failed.json").read_text())["step"] == step - 1


def test_a_nan_loss_is_named_with_its_step(tiny_model_dir, tiny_tokenizer, tmp_path):
    trainer = _toy(tiny_model_dir, tiny_tokenizer, tmp_path)
    trainer.poisoned = (3,)
    with pytest.raises(RunError, match="at step 3 .*: loss is nan"):
        trainer.train()
    assert _saved_steps(tmp_path) == [1, 2]


def test_skipped_steps_change_nothing_and_are_counted(tiny_model_dir, tiny_tokenizer, tmp_path):
    trainer = _toy(tiny_model_dir, tiny_tokenizer, tmp_path, skip_nonfinite_steps=2)
    trainer.poisoned = (3,)
    trainer.train(stop_after=2)
    before = {k: v.clone() for k, v in trainer.unwrapped_model.state_dict().items()}
    optimizer = trainer.learners["model"].optimizer
    moments = [s["exp_avg"].clone() for s in optimizer.state.values()]
    trainer.train(stop_after=1)  # step 3: skipped
    after = trainer.unwrapped_model.state_dict()
    assert all(torch.equal(after[k], v) for k, v in before.items())
    assert all(
        torch.equal(s["exp_avg"], m) for s, m in zip(optimizer.state.values(), moments, strict=True)
    )
    assert trainer.learners["model"].scheduler.last_epoch == 2
    assert trainer.train().complete and trainer.state.skipped_steps == 1
    logged = [row["train/skipped_steps"] for row in read_jsonl(tmp_path / "metrics.jsonl")]
    assert logged[-1] == 1


def test_more_bad_steps_than_may_be_skipped_stop(tiny_model_dir, tiny_tokenizer, tmp_path):
    # Logging every 10 steps: no interval ends before the run stops.
    trainer = _toy(tiny_model_dir, tiny_tokenizer, tmp_path, skip_nonfinite_steps=1, log_every=10)
    trainer.poisoned = (2, 4)
    with pytest.raises(
        RunError, match="at step 4 .*, after 1 such step.s. skipped .*: loss is nan"
    ):
        trainer.train()
    failure = json.loads((tmp_path / "failed.json").read_text())
    assert failure["step"] == 3 and failure["skipped_steps"] == 1
    logged = [row for row in read_jsonl(tmp_path / "metrics.jsonl") if "train/skipped_steps" in row]
    assert logged[-1]["train/skipped_steps"] == 1  # logged, though the run stopped


def test_skip_nonfinite_steps_is_checked(tmp_path):
    with pytest.raises(ConfigError, match="skip_nonfinite_steps"):
        TrainConfig(model="m", output_dir=str(tmp_path), skip_nonfinite_steps=-1)


def test_the_sft_command_exits_1_naming_the_step_and_the_quantity(tiny_model_dir, tmp_path):
    demos = tmp_path / "d.jsonl"
    rows = [{"prompt": f"Q: {i} plus one?", "response": f" A: {i + 1}"} for i in range(8)]
    demos.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = [
        "sft", "--model", str(tiny_model_dir), "--train_data", str(demos), "--eval_data", "null",
        "--batch_size", "4", "--max_length", "32", "--max_steps", "8", "--save_every", "1",
        "--learning_rate", "1e6", "--max_grad_norm", "0", "--output_dir", "run",
        "--report_to", "none",
    ]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    result = subprocess.run(
        [sys.executable, "-m", "rlhfkit.cli", *args],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr[-3000:]
    assert "training diverged at step" in result.stderr
    assert "grad_norm/model is" in result.stderr or "loss is" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "run" / "final").exists()


def _rollout(**changes):
    b, t = 2, 3
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    tensors = {
        name: torch.zeros(b, t)
        for name in ("logprobs", "ref_logprobs", "entropy", "values", "kl", "rewards",
                     "advantages", "returns")
    }  # fmt: skip
    tensors.update({"raw_scores": torch.zeros(b), "scores": torch.zeros(b), **changes})
    return Rollout(
        query=torch.ones(b, 2, dtype=torch.long), query_mask=torch.ones(b, 2),
        response=torch.ones(b, t, dtype=torch.long), response_mask=mask,
        eos_emitted=torch.ones(b, dtype=bool), prompts=["a", "b"], responses=["c", "d"],
        **tensors,
    )  # fmt: skip


def test_a_rollout_names_its_first_non_finite_tensor():
    _rollout().check_finite()
    padding_only = torch.tensor([[0.0, 0.0, float("nan")], [0.0, float("inf"), 0.0]])
    _rollout(values=padding_only).check_finite()  # padding may hold anything
    bad = torch.tensor([[0.0, float("nan"), 0.0], [0.0, 0.0, 0.0]])
    with pytest.raises(NonFiniteError, match=r"rollout advantages \(1 of 3 values"):
        _rollout(advantages=bad).check_finite()
    with pytest.raises(NonFiniteError, match="rollout scores"):
        _rollout(scores=torch.tensor([0.0, float("inf")])).check_finite()


class NaNScore(TargetFraction):
    """The target fraction, and NaN for the first response."""

    def score(self, batch):
        scores = super().score(batch)
        scores[0] = float("nan")
        return scores


RL_FIELDS = dict(
    model="unused", train_data="unused", reward_functions=["unused:unused"], max_steps=2,
    batch_size=4, max_new_tokens=4, lr_scheduler="constant", report_to=[], resume=False,
)  # fmt: skip


def test_a_nan_score_stops_ppo_naming_the_score(tiny_tokenizer, tmp_path):
    config = RLConfig(**RL_FIELDS, output_dir=str(tmp_path), rollout_batch_size=4)
    trainer = RLTrainer(
        config, tiny_lm(tiny_tokenizer), tiny_tokenizer, tiny_prompts(tiny_tokenizer, 8),
        NaNScore(), reference=tiny_lm(tiny_tokenizer),
        critic=ValueModel(tiny_lm(tiny_tokenizer, seed=1).transformer),
    )  # fmt: skip
    with pytest.raises(ScoreError, match="non-finite score nan"):
        trainer.train()
    assert not ckpt.checkpoint_dirs(tmp_path)


def test_a_nan_advantage_stops_grpo_naming_it(tiny_tokenizer, tmp_path, monkeypatch):
    groups = {"rollout_batch_size": 4, "num_generations": 2, "batch_size": 8}
    config = RLConfig.preset("grpo", **{**RL_FIELDS, **groups}, output_dir=str(tmp_path), cpu=True)
    trainer = RLTrainer(
        config, tiny_lm(tiny_tokenizer), tiny_tokenizer, tiny_prompts(tiny_tokenizer, 8),
        NaNScore(),
    )  # fmt: skip
    with pytest.raises(ScoreError, match="non-finite score nan"):
        trainer.train()
    monkeypatch.setattr(
        "rlhfkit.experience.rollout.group_advantages",
        lambda scores, *args: torch.full_like(scores, float("nan")),
    )
    trainer = RLTrainer(
        config, tiny_lm(tiny_tokenizer), tiny_tokenizer, tiny_prompts(tiny_tokenizer, 8),
        TargetFraction(),
    )  # fmt: skip
    with pytest.raises(RunError, match="at step 1 .*: rollout advantages \\(\\d+ of \\d+ values"):
        trainer.train()


def test_a_nan_value_in_the_rollout_stops_ppo_naming_it(tiny_tokenizer, tmp_path):
    config = RLConfig(**RL_FIELDS, output_dir=str(tmp_path), rollout_batch_size=4)
    trainer = RLTrainer(
        config, tiny_lm(tiny_tokenizer), tiny_tokenizer, tiny_prompts(tiny_tokenizer, 8),
        TargetFraction(), reference=tiny_lm(tiny_tokenizer),
        critic=ValueModel(tiny_lm(tiny_tokenizer, seed=1).transformer),
    )  # fmt: skip
    make = trainer.maker.make

    def nan_values(*args, **kwargs):
        rollout = make(*args, **kwargs)
        rollout.values[0, 0] = float("nan")
        return rollout

    trainer.maker.make = nan_values
    before = {k: v.clone() for k, v in trainer.unwrapped_model.state_dict().items()}
    with pytest.raises(RunError, match=r"at step 1 .*: rollout values \(1 of"):
        trainer.train()
    after = trainer.unwrapped_model.state_dict()
    assert all(torch.equal(after[k], v) for k, v in before.items())


def _poison_minibatch(trainer: RLTrainer, call: int) -> None:
    """Make the policy loss of the ``call``-th micro-batch (counted from 1) NaN."""
    learner = trainer.update_schedule[0]
    loss, calls = learner.loss, []

    def poisoned(mb, weight):
        calls.append(1)
        value, stats = loss(mb, weight)
        return (value * math.nan if len(calls) == call else value), stats

    learner.loss = poisoned


@pytest.mark.parametrize("skips", [0, 1])
def test_an_rl_iteration_that_diverges_after_a_minibatch_step_is_undone_and_skipped(
    skips, tiny_tokenizer, tmp_path
):
    # 8 prompts an iteration in minibatches of 4: two optimiser steps an iteration, and the
    # second of iteration 2 (the 4th micro-batch) is NaN, after the first has been taken.
    fields = {**RL_FIELDS, "max_steps": 3, "ppo_epochs": 1, "rollout_batch_size": 8}
    config = RLConfig(**fields, output_dir=str(tmp_path), skip_nonfinite_steps=skips, cpu=True)
    trainer = RLTrainer(
        config, tiny_lm(tiny_tokenizer), tiny_tokenizer, tiny_prompts(tiny_tokenizer, 16),
        TargetFraction(), critic=ValueModel(tiny_lm(tiny_tokenizer, seed=1).transformer),
    )  # fmt: skip
    _poison_minibatch(trainer, call=4)
    trainer.train(stop_after=1)
    before = {k: v.clone() for k, v in trainer.models.policy.state_dict().items()}
    moments = [s["exp_avg"].clone() for s in trainer.learners["policy"].optimizer.state.values()]
    if not skips:
        with pytest.raises(RunError, match="at step 2 .*grad_norm/policy is nan"):
            trainer.train(stop_after=1)
        return
    trainer.train(stop_after=1)  # iteration 2: undone, skipped
    after = trainer.models.policy.state_dict()
    assert all(torch.equal(after[k], v) for k, v in before.items())
    optimizer = trainer.learners["policy"].optimizer
    assert all(
        torch.equal(s["exp_avg"], m) for s, m in zip(optimizer.state.values(), moments, strict=True)
    )
    assert trainer.learners["policy"].scheduler.last_epoch == 2  # iteration 1's two steps
    assert trainer.state.skipped_steps == 1 and trainer.train().complete
