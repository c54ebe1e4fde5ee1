"""Padding-free passes: the packing's indices by hand, packed passes equal to padded ones for
every supported model and attention kernel (outputs and gradients), unpacked calls and saved
models untouched, unsupported models left padded, and PPO packed against padded."""

import copy
import subprocess
import sys

import pytest
import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    GPTNeoXConfig,
    GPTNeoXForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from rlhfkit.data import pad
from rlhfkit.experience.scorers import RewardModelScorer, ScoreInput
from rlhfkit.models.loading import RewardModel, ValueModel
from rlhfkit.models.lora import add_lora, reference_mode
from rlhfkit.models.passes import ValueHeadLM, critic_values, response_logits, sequence_inputs
from rlhfkit.runtime import packing
from rlhfkit.runtime.packing import (
    SHORT_ROWS,
    WIDTH_STEP,
    PackedRows,
    enable_packing,
    packed_length,
    packing_enabled,
    training_kernel,
)
from test_ppo import _trainer, _weights

VOCAB = 97


def test_packed_rows_by_hand():
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 0, 0], [0, 0, 1, 0]])
    rows = PackedRows.from_mask(mask)
    assert rows.tokens.tolist() == [1, 2, 3, 4, 5, 10]  # flat (B * T) index, row by row
    assert rows.position_ids.tolist() == [[0, 1, 2, 0, 1, 0]]
    assert WIDTH_STEP == 8 and rows.width == 8  # the longest row, 3, rounded up
    # (B, W) layout, each row from column 0; padding slots read token 0.
    assert rows.slots.view(3, 8).tolist() == [
        [0, 1, 2, 0, 0, 0, 0, 0],
        [3, 4, 0, 0, 0, 0, 0, 0],
        [5, 0, 0, 0, 0, 0, 0, 0],
    ]
    assert rows.filled.tolist() == [0, 1, 2, 8, 9, 16]
    assert rows.index[0, 1:].tolist() == [0, 1, 2] and rows.index[1, :2].tolist() == [3, 4]
    assert rows.index[2, 2].item() == 5
    ids = torch.arange(12).view(3, 4)
    inputs = rows.inputs(ids)
    assert inputs["input_ids"].tolist() == [[1, 2, 3, 4, 5, 10]]
    assert inputs["attention_mask"].shape == (1, 1, 8, 8)
    packed = torch.arange(6.0)[None, :, None]  # (1, N, 1): read back into (B, K, 1)
    assert rows.read(packed, torch.tensor([3]))[:, 0, 0].tolist() == [2.0, 4.0, 5.0]


def test_the_packed_row_is_rounded_up_with_filler_that_nothing_reads():
    assert [packed_length(n) for n in (1, 6, 16, 31, 33, 344, 1300)] == [
        1,
        6,
        16,
        31,
        34,
        352,
        1344,
    ]
    mask = torch.ones(3, 11, dtype=torch.long)  # 33 real tokens -> 34
    rows = PackedRows.from_mask(mask)
    assert rows.tokens.shape == (34,) and rows.position_ids.shape == (1, 34)
    assert rows.filled.shape == (34,) and rows.filled[-1] == 0 and rows.tokens[-1] == 0
    model = _model(_gpt2, "eager")
    packed_model = copy.deepcopy(model)
    enable_packing(packed_model)
    ids = torch.randint(2, VOCAB, (3, 11))
    logits = model(input_ids=ids, attention_mask=mask).logits
    packed_logits = rows.read(packed_model(**rows.inputs(ids)).logits, torch.arange(11))
    assert _close(logits, packed_logits)
    logits.logsumexp(-1).sum().backward()
    packed_logits.logsumexp(-1).sum().backward()
    for p, q in zip(model.parameters(), packed_model.parameters(), strict=True):
        assert _close(p.grad, q.grad, rel=1e-4)


def test_a_row_without_tokens_is_refused():
    with pytest.raises(ValueError, match="every row"):
        PackedRows.from_mask(torch.tensor([[1, 1], [0, 0]]))


def _gpt2():
    config = GPT2Config(n_layer=2, n_head=2, n_embd=16, n_positions=32, vocab_size=VOCAB)
    return GPT2LMHeadModel(config)


# Grouped-query attention: 4 query heads, 2 key/value heads.
_GQA = dict(
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    hidden_size=16,
    intermediate_size=32,
    vocab_size=VOCAB,
)


def _llama():
    return LlamaForCausalLM(LlamaConfig(**_GQA))


def _qwen2():
    return Qwen2ForCausalLM(Qwen2Config(**_GQA))


def _model(build, attention):
    torch.manual_seed(0)
    model = build()
    model.set_attn_implementation(attention)
    return model.eval()


def _batch():
    """Left-padded queries, responses that stop early (right padding), one row of both."""
    torch.manual_seed(1)
    query, query_mask = pad([[5, 6, 7, 8, 9, 10], [11, 12], [13], [14, 15, 16]], 0, side="left")
    response = torch.randint(2, VOCAB, (4, 5))
    response_mask = torch.tensor([[1] * 5, [1, 1, 0, 0, 0], [1] * 5, [1, 1, 1, 1, 0]])
    return query, query_mask, response, response_mask


def _close(a, b, rel=1e-5):
    """Equal up to float rounding, relative to the tensor's scale."""
    return (a - b).abs().max() <= rel * max(a.abs().max(), 1e-6)


@pytest.mark.parametrize("build", [_gpt2, _llama, _qwen2], ids=["gpt2", "llama", "qwen2"])
@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_packed_passes_equal_padded_ones(build, attention, device):
    padded_lm = _model(build, attention).to(device)
    packed_lm = copy.deepcopy(padded_lm)
    assert enable_packing(packed_lm) and packing_enabled(packed_lm)
    assert not packing_enabled(padded_lm)
    batch = tuple(x.to(device) for x in _batch())
    mask = batch[3].bool()
    tr = batch[2].shape[1]
    padded, packed = sequence_inputs(*batch), sequence_inputs(*batch, packed=True)
    assert packed["input_ids"].shape == (1, int(batch[1].sum() + batch[3].sum()))

    a, _ = response_logits(padded_lm, padded, tr, 0.7)
    b, _ = response_logits(packed_lm, packed, tr, 0.7)
    assert a.shape == b.shape == (4, tr, VOCAB)
    assert _close(a[mask], b[mask])
    (a[mask].logsumexp(-1).sum()).backward()
    (b[mask].logsumexp(-1).sum()).backward()
    for (name, p), q in zip(padded_lm.named_parameters(), packed_lm.parameters(), strict=True):
        assert _close(p.grad, q.grad, rel=1e-4), name

    # Fresh critic heads are zero: a random one makes the values depend on the hidden states.
    head = torch.nn.Linear(padded_lm.config.hidden_size, 1).to(device)
    critic = ValueModel(padded_lm.base_model).to(device)
    packed_critic = ValueModel(packed_lm.base_model).to(device)
    for model in (critic, packed_critic):
        model.score.load_state_dict(head.state_dict())
    values = critic_values(critic, padded, tr)
    assert values[mask].std() > 0
    assert _close(values[mask], critic_values(packed_critic, packed, tr)[mask])

    (la, va), (lb, vb) = (
        response_logits(_with_head(ValueHeadLM(m).to(device), head), inputs, tr, 1.0)
        for m, inputs in ((padded_lm, padded), (packed_lm, packed))
    )
    assert va.shape == vb.shape == (4, tr)
    assert _close(la[mask], lb[mask]) and _close(va[mask], vb[mask])


def _with_head(model: ValueHeadLM, head: torch.nn.Linear) -> ValueHeadLM:
    model.value_head.load_state_dict(head.state_dict())
    return model


def test_short_rows_in_bf16_with_gradients_take_the_eager_kernel_on_a_cpu():
    query = torch.zeros(1, 2, 4, 8, requires_grad=True)
    with torch.autocast("cpu", torch.bfloat16):
        assert training_kernel("sdpa", query, SHORT_ROWS) == "eager"
        assert training_kernel("sdpa", query, SHORT_ROWS + WIDTH_STEP) == "sdpa"
        assert training_kernel("sdpa", query.detach(), WIDTH_STEP) == "sdpa"
        assert training_kernel("eager", query, WIDTH_STEP) == "eager"
    assert training_kernel("sdpa", query, WIDTH_STEP) == "sdpa"  # float32
    assert training_kernel("sdpa", query.bfloat16(), WIDTH_STEP) == "eager"  # bf16 weights


@pytest.mark.parametrize("build", [_gpt2, _llama], ids=["gpt2", "llama"])
def test_the_eager_kernel_in_a_bf16_update_matches_sdpa(build, monkeypatch):
    """A packed SDPA model's pass with gradients in bf16 autocast runs the eager kernel, and its
    log-probs and gradients are those of the padded SDPA pass up to bf16 rounding."""
    sdpa_lm = _model(build, "sdpa")
    packed_lm = copy.deepcopy(sdpa_lm)
    enable_packing(packed_lm)
    chosen = []
    choose = packing.training_kernel
    monkeypatch.setattr(
        packing, "training_kernel", lambda *args: chosen.append(choose(*args)) or chosen[-1]
    )
    batch = _batch()
    mask, tr = batch[3].bool(), batch[2].shape[1]
    with torch.autocast("cpu", torch.bfloat16):
        a, _ = response_logits(sdpa_lm, sequence_inputs(*batch), tr, 1.0)
        b, _ = response_logits(packed_lm, sequence_inputs(*batch, packed=True), tr, 1.0)
    assert chosen == ["eager"] * sdpa_lm.config.num_hidden_layers
    a, b = a.float().log_softmax(-1)[mask], b.float().log_softmax(-1)[mask]
    assert _close(a, b, rel=2e-2)
    weights = torch.randn(a.shape, generator=torch.Generator().manual_seed(0))
    (a * weights).sum().backward()
    (b * weights).sum().backward()
    for (name, p), q in zip(sdpa_lm.named_parameters(), packed_lm.parameters(), strict=True):
        assert _close(p.grad, q.grad, rel=5e-2), name


@pytest.mark.parametrize("build", [_gpt2, _llama], ids=["gpt2", "llama"])
def test_a_packed_reward_model_scores_at_each_rows_last_real_token(build):
    query, query_mask, response, response_mask = _batch()
    padded_rm = RewardModel(_model(build, "eager").base_model)
    packed_rm = copy.deepcopy(padded_rm)
    assert enable_packing(packed_rm)
    batch = ScoreInput([""] * 4, [""] * 4, query, query_mask, response, response_mask)
    scores = RewardModelScorer(padded_rm).score(batch)  # (B,)
    packed = RewardModelScorer(packed_rm).score(batch)
    assert packed.shape == (4,) and _close(scores, packed)
    rows = PackedRows.from_mask(torch.cat([query_mask, response_mask], 1))
    assert rows.last.tolist() == [10, 14, 20, 27]  # lengths 11, 4, 6, 7


def test_packing_leaves_unpacked_calls_generation_and_saved_models_as_they_were(tmp_path):
    model = _model(_gpt2, "eager")
    ids = torch.randint(2, VOCAB, (2, 6))
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    before = model(input_ids=ids, attention_mask=mask).logits
    greedy = model.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False)
    assert enable_packing(model)
    assert torch.equal(model(input_ids=ids, attention_mask=mask).logits, before)
    again = model.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False)
    assert torch.equal(again, greedy)
    model.save_pretrained(tmp_path)
    assert "rlhfkit" not in (tmp_path / "config.json").read_text()
    # Stock transformers, without rlhfkit imported, opens what was saved.
    code = (
        "import sys, transformers; "
        f"m = transformers.AutoModelForCausalLM.from_pretrained({str(tmp_path)!r}); "
        "assert 'rlhfkit' not in sys.modules and 'rlhfkit' not in m.config._attn_implementation"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_unsupported_models_stay_padded():
    neox = GPTNeoXForCausalLM(
        GPTNeoXConfig(
            num_hidden_layers=1,
            num_attention_heads=2,
            hidden_size=16,
            intermediate_size=32,
            vocab_size=VOCAB,
        )
    )
    upcast = GPT2LMHeadModel(
        GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=VOCAB, reorder_and_upcast_attn=True)
    )
    for model in (neox, upcast, torch.nn.Linear(2, 2)):
        before = [m.config._attn_implementation for m in model.modules() if hasattr(m, "config")]
        assert not enable_packing(model) and not packing_enabled(model)
        after = [m.config._attn_implementation for m in model.modules() if hasattr(m, "config")]
        assert after == before


def test_a_lora_policy_and_its_adapter_off_reference_run_packed():
    model = add_lora(_model(_gpt2, "eager"), r=4, target_modules=["c_attn"])
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_()  # a non-zero adapter, so that policy and reference differ
    assert enable_packing(model)
    batch = _batch()
    mask = batch[3].bool()
    padded, packed = sequence_inputs(*batch), sequence_inputs(*batch, packed=True)
    with torch.no_grad():
        policy = [response_logits(model, inputs, 5, 1.0)[0] for inputs in (padded, packed)]
        with reference_mode(model) as reference:
            ref = [response_logits(reference, inputs, 5, 1.0)[0] for inputs in (padded, packed)]
    assert not _close(policy[0][mask], ref[0][mask])
    assert _close(policy[0][mask], policy[1][mask]) and _close(ref[0][mask], ref[1][mask])


def test_ppo_packed_and_padded_make_the_same_rollout_and_step(tiny_tokenizer, tmp_path):
    trainers = {
        packed: _trainer(tiny_tokenizer, tmp_path / str(packed), padding_free=packed)
        for packed in (False, True)
    }
    assert trainers[True].models.packed and not trainers[False].models.packed
    results = {packed: trainer.step() for packed, trainer in trainers.items()}
    (metrics_a, rollout_a), (metrics_b, rollout_b) = results[False], results[True]
    mask = rollout_a.response_mask.bool()
    assert torch.equal(rollout_a.response, rollout_b.response)
    for field in ("logprobs", "ref_logprobs", "values", "entropy"):
        assert _close(getattr(rollout_a, field)[mask], getattr(rollout_b, field)[mask]), field
    for field in ("rewards", "advantages", "returns"):
        a, b = getattr(rollout_a, field), getattr(rollout_b, field)
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-5), field
    a, b = _weights(trainers[False].trainable), _weights(trainers[True].trainable)
    # Adam's steps divide a gradient by its own size, so where a component is tiny its
    # rounding can move the weight by a few percent of a step (the learning rate, 1e-3).
    assert all(torch.allclose(a[k], b[k], rtol=1e-4, atol=5e-5) for k in a)
    for key in ("loss/policy", "loss/value", "grad_norm/policy", "grad_norm/critic"):
        assert metrics_b[key] == pytest.approx(metrics_a[key], rel=1e-4, abs=1e-6)
