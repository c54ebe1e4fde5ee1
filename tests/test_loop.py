"""The shared training loop: exact resume, checkpoint files, rotation, schedule, accumulation.

A toy language-modelling trainer on random token ids keeps these tests independent of the data
pipeline; the tiny GPT-2 keeps its dropout (0.1) so that resume must restore the RNG streams.
"""

import json
import logging
import math
import random

import numpy as np
import pytest
import torch
from accelerate.state import AcceleratorState
from safetensors import safe_open
from transformers import AutoModelForCausalLM

from rlhfkit import checkpoint as ckpt
from rlhfkit.config import ConfigError, SFTConfig, TrainConfig
from rlhfkit.errors import UsageError
from rlhfkit.tracking import read_jsonl
from rlhfkit.trainers.loop import Trainer, epoch_order

SEQ_LEN = 12


class ToyLMTrainer(Trainer):
    """Next-token loss on fixed-length random sequences (no padding)."""

    def compute_loss(self, batch):
        loss = self.model(input_ids=batch["input_ids"], labels=batch["input_ids"]).loss
        return loss, {"tokens": batch["input_ids"].numel()}

    def evaluate(self):
        self.eval_calls = getattr(self, "eval_calls", 0) + 1
        return {"random_draw": torch.rand(()).item()}


def _collate(examples):
    return {"input_ids": torch.stack(examples)}


def _data(vocab, n=20):
    gen = torch.Generator().manual_seed(1)
    return [torch.randint(2, vocab, (SEQ_LEN,), generator=gen) for _ in range(n)]


def _trainer(model_dir, tokenizer, out, no_dropout=False, **overrides):
    kwargs = {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0} if no_dropout else {}
    model = AutoModelForCausalLM.from_pretrained(model_dir, **kwargs)
    fields = dict(
        model=str(model_dir),
        output_dir=str(out),
        batch_size=4,
        gradient_accumulation_steps=2,
        max_steps=6,
        learning_rate=1e-3,
        warmup_steps=2,
        lr_scheduler="cosine",
        log_every=1,
        cpu=True,
        report_to=[],
    )
    fields.update(overrides)
    config = TrainConfig(**fields)
    return ToyLMTrainer(config, model, _data(len(tokenizer)), _collate, tokenizer=tokenizer)


def _fail_in_step(trainer, step, message):
    """Train ``trainer`` until its loss raises a RuntimeError(``message``) in step ``step``."""
    compute_loss = trainer.compute_loss

    def fails(batch):
        if trainer.state.step == step - 1:
            raise RuntimeError(message)
        return compute_loss(batch)

    trainer.compute_loss = fails
    with pytest.raises(RuntimeError, match=message):
        trainer.train()


def _weights(trainer):
    return {k: v.detach().cpu().clone() for k, v in trainer.unwrapped_model.state_dict().items()}


@pytest.fixture
def on_device(device):
    """Trainer fields for ``device``; accelerate's process-wide state is started afresh for
    it (its device is fixed by the first ``Accelerator`` of a process) and reset after."""
    AcceleratorState._reset_state(reset_partial_state=True)
    yield {"cpu": device.type == "cpu"}
    AcceleratorState._reset_state(reset_partial_state=True)


def test_stop_and_resume_equals_uninterrupted_run(
    tiny_model_dir, tiny_tokenizer, tmp_path, device, on_device
):
    # 20 examples / batch 4 = 5 micro-batches per epoch, 2 per step: steps cross epochs and the
    # interruption after step 3 falls in the middle of epoch 1. The straight run never
    # evaluates, the interrupted one every step: evaluation must not move the random streams.
    straight = _trainer(tiny_model_dir, tiny_tokenizer, tmp_path / "a", **on_device)
    assert next(straight.unwrapped_model.parameters()).device.type == device.type
    straight.train()
    expected = _weights(straight)
    assert straight.eval_calls == 1  # the final evaluation only

    first = _trainer(tiny_model_dir, tiny_tokenizer, tmp_path / "b", eval_every=1, **on_device)
    state = first.train(stop_after=3)
    assert (state.step, state.epoch, state.batch_index, state.complete) == (3, 1, 1, False)
    assert ckpt.latest_checkpoint(tmp_path / "b").name == "checkpoint-3"
    # A fresh process would start from fresh weights and fresh random streams.
    torch.manual_seed(123)
    random.seed(123)
    second = _trainer(tiny_model_dir, tiny_tokenizer, tmp_path / "b", eval_every=1, **on_device)
    state = second.train()
    assert state.complete and state.step == 6 and second.eval_calls == 3

    resumed = _weights(second)
    assert resumed.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(resumed[name], tensor), name
    # Curves of the resumed run continue the interrupted one: one row per step, no duplicates.
    steps = [r["step"] for r in read_jsonl(tmp_path / "b" / "metrics.jsonl") if "train/loss" in r]
    assert steps == [1, 2, 3, 4, 5, 6]


def test_a_resume_takes_the_thread_count_its_checkpoint_recorded(
    tiny_model_dir, tiny_tokenizer, tmp_path, monkeypatch
):
    """A CPU sums by threads: the run resumed on a machine whose load led to another count
    continues on the count that wrote the checkpoint, and ends as the uninterrupted run."""
    monkeypatch.delenv("OMP_NUM_THREADS")
    straight = _trainer(tiny_model_dir, tiny_tokenizer, tmp_path / "a")
    straight.train()
    first = _trainer(tiny_model_dir, tiny_tokenizer, tmp_path / "b")
    first.train(stop_after=3)
    checkpoint = ckpt.latest_checkpoint(tmp_path / "b")
    assert ckpt.read_json(checkpoint / ckpt.STATE_FILE)["threads"] == 1
    torch.set_num_threads(2)
    second = _trainer(tiny_model_dir, tiny_tokenizer, tmp_path / "b")
    second.train()
    assert torch.get_num_threads() == 1
    resumed = _weights(second)
    for name, tensor in _weights(straight).items():
        assert torch.equal(resumed[name], tensor), name


def test_final_dir_and_checkpoint_files(tiny_model_dir, tiny_tokenizer, tmp_path):
    trainer = _trainer(tiny_model_dir, tiny_tokenizer, tmp_path, save_every=1, keep_last=2)
    trainer.train()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert [n for n in names if n.startswith("checkpoint-")] == ["checkpoint-5", "checkpoint-6"]
    assert not [n for n in names if n.startswith(".")], "temporary directories left behind"
    last = tmp_path / "checkpoint-6"
    state = json.loads((last / "trainer_state.json").read_text())
    assert state["step"] == 6 and state["scheduler"]["model"]["last_epoch"] == 6
    with safe_open(str(last / "optimizer.safetensors"), "pt") as f:
        assert "t.model.state.0.exp_avg" in set(f.keys())  # each learner by name
    assert (last / "model.safetensors").is_file() and not list(tmp_path.rglob("*.bin"))

    final = tmp_path / "final"
    assert ckpt.is_complete(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(final)
    for name, tensor in loaded.state_dict().items():
        assert torch.equal(tensor, trainer.unwrapped_model.state_dict()[name]), name
    assert (final / "tokenizer.json").is_file()
    assert (tmp_path / "curves.png").stat().st_size > 0


def test_a_run_stopped_by_an_error_says_so_and_the_next_start_clears_it(
    tiny_model_dir, tiny_tokenizer, tmp_path
):
    broken = _trainer(tiny_model_dir, tiny_tokenizer, tmp_path, save_every=2)
    _fail_in_step(broken, 4, "the reward server went away")
    failure = json.loads((tmp_path / "failed.json").read_text())
    assert failure == {
        "step": 3,
        "error": "RuntimeError: the reward server went away",
        "skipped_steps": 0,
    }
    resumed = _trainer(tiny_model_dir, tiny_tokenizer, tmp_path, save_every=2, resume=True)
    assert resumed.train().complete and resumed.state.step == 6
    assert not (tmp_path / "failed.json").exists()


def test_complete_run_is_skipped_and_resume_false_starts_over(
    tiny_model_dir, tiny_tokenizer, tmp_path
):
    _trainer(tiny_model_dir, tiny_tokenizer, tmp_path, max_steps=2).train()
    again = _trainer(tiny_model_dir, tiny_tokenizer, tmp_path, max_steps=2)
    before = _weights(again)
    state = again.train()
    assert state.complete and state.step == 2  # the finished run's state, read back
    assert all(torch.equal(before[k], v) for k, v in _weights(again).items())  # not trained

    fresh = _trainer(tiny_model_dir, tiny_tokenizer, tmp_path, max_steps=1, resume=False)
    assert fresh.train().step == 1
    assert [p.name for p in ckpt.checkpoint_dirs(tmp_path)] == ["checkpoint-1"]


def test_warmup_then_linear_decay_is_logged_per_step(tiny_model_dir, tiny_tokenizer, tmp_path):
    trainer = _trainer(tiny_model_dir, tiny_tokenizer, tmp_path, max_steps=4, lr_scheduler="linear")
    trainer.train()
    rows = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if "train/lr" in r]
    # linear warmup over 2 steps, then linear decay to 0 at step 4; lr used by steps 1..4.
    assert [r["train/lr"] for r in rows] == pytest.approx([0.0, 5e-4, 1e-3, 5e-4])
    assert all(r["train/grad_norm"] > 0 for r in rows)
    # Two micro-batches of 4 sequences per step.
    assert [r["train/tokens"] for r in rows] == [4 * SEQ_LEN] * 4


def test_accumulating_two_half_batches_equals_one_full_batch(
    tiny_model_dir, tiny_tokenizer, tmp_path
):
    # A larger Adam epsilon keeps float rounding in near-zero gradients from being amplified
    # to a full-size update (m / sqrt(v) is about +-1 however small the gradient).
    common = dict(
        no_dropout=True, max_steps=3, max_grad_norm=0.0, lr_scheduler="constant", adam_epsilon=1e-4
    )
    halves = _trainer(tiny_model_dir, tiny_tokenizer, tmp_path / "a", batch_size=2, **common)
    full = _trainer(
        tiny_model_dir, tiny_tokenizer, tmp_path / "b", batch_size=4,
        gradient_accumulation_steps=1, **common,
    )  # fmt: skip
    halves.train()
    full.train()
    a, b = _weights(halves), _weights(full)
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-6)


def test_state_round_trip_without_pickle(tmp_path):
    param = torch.nn.Parameter(torch.randn(3, 2))
    opt = torch.optim.AdamW([param], lr=0.1, betas=(0.8, 0.9))
    param.sum().backward()
    opt.step()
    ckpt.save_state(opt.state_dict(), tmp_path / "opt.safetensors")
    loaded = ckpt.load_state(tmp_path / "opt.safetensors")
    assert list(loaded["state"]) == [0]  # int keys survive JSON
    assert torch.equal(loaded["state"][0]["exp_avg"], opt.state[param]["exp_avg"])
    assert loaded["param_groups"][0]["betas"] == [0.8, 0.9]
    opt2 = torch.optim.AdamW([torch.nn.Parameter(param.detach().clone())], lr=0.1)
    opt2.load_state_dict(loaded)
    assert opt2.state_dict()["param_groups"][0]["betas"] == [0.8, 0.9]

    with pytest.raises(TypeError, match="without pickle"):
        ckpt.save_state({"bad": object()}, tmp_path / "bad.safetensors")


def test_rng_state_round_trip(tmp_path):
    ckpt.save_state(ckpt.rng_state(), tmp_path / "rng.safetensors")
    draws = (random.random(), np.random.rand(), torch.rand(()).item())
    ckpt.set_rng_state(ckpt.load_state(tmp_path / "rng.safetensors"))
    assert (random.random(), np.random.rand(), torch.rand(()).item()) == draws


def test_epoch_order_depends_on_seed_and_epoch_only():
    order = epoch_order(10, seed=3, epoch=1)
    assert sorted(order.tolist()) == list(range(10))
    assert np.array_equal(order, epoch_order(10, seed=3, epoch=1))
    assert not np.array_equal(order, epoch_order(10, seed=3, epoch=2))


# The score each step's evaluation gives in the best-model tests: the best is step 4's.
SCORES = {1: 1.0, 2: 3.0, 3: 2.0, 4: 5.0, 5: 4.0, 6: 4.5}


class ScoredToyLMTrainer(ToyLMTrainer):
    """Evaluations that give `SCORES[step]`, and keep a copy of the weights each step had."""

    def evaluate(self):
        self.weights_at = getattr(self, "weights_at", {})
        self.weights_at[self.state.step] = _weights(self)
        return {"score": SCORES[self.state.step], "loss": 1.0 / SCORES[self.state.step]}


def _scored(model_dir, tokenizer, out, **overrides):
    trainer = _trainer(model_dir, tokenizer, out, eval_every=1, **overrides)
    trainer.__class__ = ScoredToyLMTrainer
    return trainer


def _saved_weights(path):
    return AutoModelForCausalLM.from_pretrained(path).state_dict()


def _state(path):
    return json.loads((path / "trainer_state.json").read_text())


def test_the_best_model_is_kept_and_becomes_final_with_load_best_model_at_end(
    tiny_model_dir, tiny_tokenizer, tmp_path
):
    best = {"metric": "eval/score", "value": 5.0, "step": 4}
    trainer = _scored(
        tiny_model_dir, tiny_tokenizer, tmp_path, save_every=3,
        metric_for_best_model="eval/score", load_best_model_at_end=True,
    )  # fmt: skip
    state = trainer.train()
    assert (state.step, state.best_step, state.best_metric) == (6, 4, 5.0)
    final, kept = tmp_path / "final", tmp_path / "best"
    assert ckpt.is_complete(tmp_path) and ckpt.verify(final) and ckpt.verify(kept)
    for name, tensor in _saved_weights(final).items():
        assert torch.equal(tensor, trainer.weights_at[4][name]), name
    assert not all(
        torch.equal(t, trainer.weights_at[6][k]) for k, t in _saved_weights(final).items()
    )
    saved = _state(final)
    assert (saved["step"], saved["last_step"], saved["complete"], saved["best"]) == (
        4,
        6,
        True,
        best,
    )
    assert saved["eval_metrics"]["score"] == 5.0  # the evaluation of the model it holds
    assert _state(kept)["best"] == best and (final / "tokenizer.json").is_file()
    assert _state(tmp_path / "checkpoint-6")["best_step"] == 4  # the last step stays there

    # Without load_best_model_at_end, final/ is the last step's and names the best beside it.
    last = _scored(
        tiny_model_dir, tiny_tokenizer, tmp_path / "last", metric_for_best_model="loss"
    )  # 'loss': smaller is better, the same step 4
    last.train()
    saved = _state(tmp_path / "last" / "final")
    assert saved["step"] == 6 and saved["best"] == {**best, "metric": "eval/loss", "value": 0.2}
    for name, tensor in _saved_weights(tmp_path / "last" / "best").items():
        assert torch.equal(tensor, last.weights_at[4][name]), name


def test_a_resumed_run_chooses_the_same_best_model_as_an_uninterrupted_one(
    tiny_model_dir, tiny_tokenizer, tmp_path
):
    fields = dict(
        no_dropout=True, save_every=3, metric_for_best_model="score", load_best_model_at_end=True
    )
    straight = _scored(tiny_model_dir, tiny_tokenizer, tmp_path / "a", **fields)
    straight.train()
    # Interrupted after step 4's evaluation wrote best/ and before step 5 ended: the newest
    # checkpoint (step 3) names step 2 as the best, and best/ holds step 4.
    broken = _scored(tiny_model_dir, tiny_tokenizer, tmp_path / "b", **fields)
    _fail_in_step(broken, 5, "killed")
    assert _state(tmp_path / "b" / "best")["best_step"] == 4
    assert _state(tmp_path / "b" / "checkpoint-3")["best_step"] == 2
    resumed = _scored(tiny_model_dir, tiny_tokenizer, tmp_path / "b", **fields)
    assert resumed.train().best_step == 4 and sorted(resumed.weights_at) == [4, 5, 6]
    expected = _saved_weights(tmp_path / "a" / "final")
    for name, tensor in _saved_weights(tmp_path / "b" / "final").items():
        assert torch.equal(tensor, expected[name]), name


def test_a_metric_the_evaluation_does_not_give_is_named_with_those_it_gives(
    tiny_model_dir, tiny_tokenizer, tmp_path
):
    trainer = _scored(tiny_model_dir, tiny_tokenizer, tmp_path, metric_for_best_model="eval/acc")
    with pytest.raises(UsageError, match=r"'eval/acc' is not .* gives: eval/loss, eval/score"):
        trainer.train()


@pytest.mark.parametrize(
    ("metric", "greater", "value", "best", "better"),
    [
        ("eval/accuracy", None, 0.8, 0.7, True),
        ("eval/accuracy", None, 0.7, 0.7, False),  # a tie keeps the earlier model
        ("eval/loss", None, 0.5, 0.7, True),  # a loss: smaller is better
        ("loss", True, 0.5, 0.7, False),  # unless said otherwise
        ("eval/nll", None, 4.046, 4.049, True),
        ("perplexity", None, 57.3, 57.1, False),
        ("rewards/margin_loss", None, 0.1, 0.2, True),
        ("kl", False, 0.5, 0.7, True),
        ("score", None, 0.1, None, True),  # the first evaluation is the best so far
        ("score", None, math.nan, None, False),  # NaN is never the best
        ("score", None, math.inf, 0.1, False),
    ],
)
def test_which_evaluation_is_better(metric, greater, value, best, better):
    config = TrainConfig(eval_every=1, metric_for_best_model=metric, greater_is_better=greater)
    assert config.is_better(value, best) is better


def test_best_model_fields_are_checked():
    with pytest.raises(ConfigError, match="eval_every = 0 .* >= 1 when metric_for_best_model"):
        TrainConfig(metric_for_best_model="eval/loss")
    with pytest.raises(ConfigError, match="load_best_model_at_end = True .* metric_for_best_model"):
        TrainConfig(load_best_model_at_end=True)
    with pytest.raises(ConfigError, match="metric_for_best_model = 'eval/' is not"):
        TrainConfig(eval_every=1, metric_for_best_model="eval/")
    with pytest.raises(
        ConfigError, match="metric_for_best_model = 'loss' .* when eval_data is None"
    ):
        SFTConfig(eval_every=1, metric_for_best_model="loss", eval_data=None)


def test_a_changed_learning_rate_applies_from_the_resumed_step_and_is_recorded(
    tiny_model_dir, tiny_tokenizer, tmp_path, caplog
):
    first = _trainer(tiny_model_dir, tiny_tokenizer, tmp_path, save_every=1)
    first.train(stop_after=3)
    lr_at_3 = first.learners["model"].scheduler.get_last_lr()[0]
    with caplog.at_level(logging.WARNING):
        resumed = _trainer(
            tiny_model_dir, tiny_tokenizer, tmp_path, save_every=1, learning_rate=1e-9
        )
        resumed.train(stop_after=0)  # loads the checkpoint of step 3, makes no step
    assert "learning_rate 0.001 -> 1e-09 from step 3" in caplog.text
    learner = resumed.learners["model"]
    # The same point of the schedule (warmup, then cosine over 6 steps), at the new peak.
    assert learner.scheduler.get_last_lr()[0] == pytest.approx(lr_at_3 * 1e-9 / 1e-3)
    assert learner.optimizer.param_groups[0]["lr"] == pytest.approx(lr_at_3 * 1e-6)
    resumed.train()
    final = json.loads((tmp_path / "final" / "trainer_state.json").read_text())
    assert final["config_changes"] == [{"step": 3, "changes": {"learning_rate": [1e-3, 1e-9]}}]


def test_a_resume_refuses_a_changed_setting_that_shapes_the_run_unless_overridden(
    tiny_model_dir, tiny_tokenizer, tmp_path
):
    _trainer(tiny_model_dir, tiny_tokenizer, tmp_path, save_every=1).train(stop_after=2)
    changed = _trainer(tiny_model_dir, tiny_tokenizer, tmp_path, seed=7, batch_size=2)
    with pytest.raises(UsageError, match="batch_size: 4 -> 2; seed: 42 -> 7"):
        changed.train()
    overridden = _trainer(
        tiny_model_dir, tiny_tokenizer, tmp_path, seed=7, batch_size=2, resume_override=True
    )
    assert overridden.train().complete
