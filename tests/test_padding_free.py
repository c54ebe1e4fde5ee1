"""Padding-free passes of the stages that train on fixed data (``padding_free``: SFT, the
reward model, DPO): labelled log-probs and reward scores of packed models equal the padded
ones, and each trainer packed and padded starts from the same gradients and takes a few steps
at the same losses."""

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlhfkit.config import RewardConfig, SFTConfig
from rlhfkit.data import (
    IGNORE_INDEX,
    SFTCollator,
    SFTExample,
    encode_comparisons,
    encode_demonstrations,
)
from rlhfkit.models.loading import RewardModel
from rlhfkit.models.passes import labelled_logprobs
from rlhfkit.ops.masks import masked_sum
from rlhfkit.runtime.packing import enable_packing, packing_enabled
from rlhfkit.trainers.dpo import DPOTrainer
from rlhfkit.trainers.reward import RewardTrainer
from rlhfkit.trainers.sft import SFTTrainer
from test_dpo import _config as dpo_config
from test_dpo import _toy_pairs
from test_packing import _close, _gpt2, _llama, _model, _qwen2
from test_reward_trainer import _config as reward_config
from test_reward_trainer import pairs
from test_sft import _config as sft_config
from test_sft import qa_demos


def _sft_batch() -> dict:
    """Rows of different lengths (right padding), one of them with a single labelled token."""
    rows = [([5, 6, 7], [8, 9, 10, 11]), ([12], [13, 14]), ([15, 16, 17, 18, 19, 20], [21])]
    examples = [SFTExample(p + r, [IGNORE_INDEX] * len(p) + r) for p, r in rows]
    return SFTCollator(pad_id=0)(examples)


@pytest.mark.parametrize("build", [_gpt2, _llama, _qwen2], ids=["gpt2", "llama", "qwen2"])
@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_packed_labelled_logprobs_equal_padded_ones(build, attention):
    padded_lm = _model(build, attention)
    packed_lm = copy.deepcopy(padded_lm)
    assert enable_packing(packed_lm)
    batch = _sft_batch()
    scored = batch["labels"][:, 1:] != IGNORE_INDEX  # (B, T - 1)
    assert scored.sum(1).tolist() == [4, 2, 1]

    full, full_mask = labelled_logprobs(padded_lm, batch, trim=False)  # (B, T - 1)
    packed, packed_mask = labelled_logprobs(packed_lm, batch, trim=False)
    assert packed.shape == full.shape and torch.equal(packed_mask, full_mask)
    assert _close(full[scored], packed[scored]) and not packed[~scored].any()
    trimmed, trimmed_mask = labelled_logprobs(packed_lm, batch)  # trim: the same for packed
    assert torch.equal(trimmed_mask, packed_mask)

    weights = torch.tensor([1.0, -2.0, 3.0])[:, None]  # a different weight per row
    masked_sum(full * weights, full_mask).backward()
    masked_sum(packed * weights, packed_mask).backward()
    for (name, p), q in zip(padded_lm.named_parameters(), packed_lm.parameters(), strict=True):
        assert _close(p.grad, q.grad, rel=1e-4), name


def test_packed_log_probs_by_hand():
    """The packed log-prob of a labelled token is log softmax of the model's output at the
    token before it, computed here row by row without padding."""
    lm = _model(_gpt2, "eager")
    batch = _sft_batch()
    packed_lm = copy.deepcopy(lm)
    enable_packing(packed_lm)
    logprobs, mask = labelled_logprobs(packed_lm, batch)
    for row, length in enumerate(batch["attention_mask"].sum(1).tolist()):
        ids = batch["input_ids"][row, :length]
        with torch.no_grad():
            by_row = lm(ids[None]).logits[0].log_softmax(-1)  # (length, V)
        for t in range(length - 1):
            if mask[row, t]:
                expected = by_row[t, ids[t + 1]]
                assert float(logprobs[row, t].detach()) == pytest.approx(float(expected), abs=1e-5)


def _gradients(trainer) -> dict[str, torch.Tensor]:
    """The gradients of the loss on the first 8 training examples, before any step."""
    model = trainer.unwrapped_model
    model.zero_grad()
    loss, _ = trainer.compute_loss(trainer.collate_fn(trainer.train_data[:8]))
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    return grads


def _same_run(trainers: dict, steps: int) -> None:
    """``trainers`` (padded: False, packed: True) have the same gradients up to float
    rounding, then take ``steps`` steps at the same losses; the packed one runs packed.

    The weights after the steps are not compared: Adam's first steps move each weight by about
    the learning rate whatever its gradient's size, so a rounding difference in a gradient
    near 0 becomes one of the learning rate's size."""
    assert packing_enabled(trainers[True].unwrapped_model)
    assert not packing_enabled(trainers[False].unwrapped_model)
    padded, packed = (_gradients(trainers[p]) for p in (False, True))
    assert padded.keys() == packed.keys() and padded
    scale = max(float(grad.abs().max()) for grad in padded.values())
    for name, grad in padded.items():  # a gradient that is 0 up to rounding differs wholly
        assert float((grad - packed[name]).abs().max()) <= 1e-4 * scale, name
    losses = {p: [t.train_step()["loss"] for _ in range(steps)] for p, t in trainers.items()}
    assert losses[True] == pytest.approx(losses[False], rel=1e-4)


def test_sft_packed_and_padded_take_the_same_steps(tiny_model_dir, tiny_tokenizer, tmp_path):
    trainers = {}
    for packed in (False, True):
        config: SFTConfig = sft_config(tmp_path / str(packed), tiny_model_dir, padding_free=packed)
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
        examples = encode_demonstrations(qa_demos(32, seed=0), tiny_tokenizer, 64)[0]
        trainers[packed] = SFTTrainer(config, model, tiny_tokenizer, examples, examples[:8])
    _same_run(trainers, 3)
    evaluations = [trainers[packed].evaluate() for packed in (False, True)]
    assert evaluations[1]["nll"] == pytest.approx(evaluations[0]["nll"], rel=1e-5)


def test_reward_model_packed_and_padded_take_the_same_steps(
    tiny_model_dir, tiny_tokenizer, tmp_path
):
    examples = encode_comparisons(pairs(32, seed=0), tiny_tokenizer, 48)[0]
    trainers = {}
    for packed in (False, True):
        config: RewardConfig = reward_config(tmp_path / str(packed), padding_free=packed)
        torch.manual_seed(0)
        model = RewardModel.from_pretrained(tiny_model_dir)
        trainers[packed] = RewardTrainer(config, model, tiny_tokenizer, examples, examples[:8])
    _same_run(trainers, 3)
    evaluations = [trainers[packed].evaluate() for packed in (False, True)]
    assert evaluations[1]["margin"] == pytest.approx(evaluations[0]["margin"], rel=1e-4)


@pytest.mark.parametrize("precompute", [True, False], ids=["precomputed", "reference"])
def test_dpo_packed_and_padded_take_the_same_steps(
    tiny_model_dir, tiny_tokenizer, tmp_path, precompute
):
    train, held_out = _toy_pairs(tiny_tokenizer)
    trainers = {}
    for packed in (False, True):
        config = dpo_config(
            tmp_path / str(packed), padding_free=packed, precompute_reference=precompute
        )
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
        trainers[packed] = DPOTrainer(config, model, tiny_tokenizer, train, held_out[:8])
    if not precompute:
        assert packing_enabled(trainers[True].reference)
    _same_run(trainers, 3)
    evaluations = [trainers[packed].evaluate() for packed in (False, True)]
    assert evaluations[1]["margin"] == pytest.approx(evaluations[0]["margin"], rel=1e-4)


def test_the_fixed_data_stages_stay_padded_by_default(tmp_path):
    assert not SFTConfig(model="m", train_data="d").padding_free
    assert not RewardConfig(model="m", train_data="d").padding_free
    assert not dpo_config(tmp_path).padding_free
