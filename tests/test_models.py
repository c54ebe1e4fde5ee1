"""Tests for rlhfkit.models.loading: loading, scalar heads, padding, LoRA and atomic checkpoints."""

import json
import logging

import pytest
import torch
from peft import PeftModel
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import (
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    PreTrainedTokenizerFast,
)

from helpers import tiny_llama
from rlhfkit.errors import UsageError
from rlhfkit.models.loading import (
    HEAD_CONFIG,
    HEAD_WEIGHTS,
    RewardModel,
    ScalarHeadModel,
    ValueModel,
    freeze,
    load_causal_lm,
    load_reference,
    load_tokenizer,
    save_pretrained_atomic,
)
from rlhfkit.models.lora import add_lora, merge_lora, reference_mode
from rlhfkit.models.reward_format import SCORE_BIAS
from rlhfkit.runtime.machine import prepare_model

SEQS = [[5, 17, 42, 99, 7], [8, 3], [250, 11, 64]]


def _pad(seqs, pad_id, side):
    """Plain padding for the tests (independent of rlhfkit.data)."""
    width = max(len(s) for s in seqs)
    ids, mask = [], []
    for s in seqs:
        fill = [pad_id] * (width - len(s))
        ids.append(s + fill if side == "right" else fill + s)
        ones, zeros = [1] * len(s), [0] * len(fill)
        mask.append(ones + zeros if side == "right" else zeros + ones)
    return torch.tensor(ids), torch.tensor(mask)


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


def _perturb(module, seed=1, scale=0.05):
    """Move every weight so a test cannot pass by reloading the untouched original."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(scale * torch.randn(p.shape, generator=gen))


def _tokenizer_without_pad(tmp_path, eos=True):
    """A byte-level BPE with no pad token at all (and optionally no EOS), saved to disk."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    special = ["<|endoftext|>"] if eos else []
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(["a cat sees a dog", "the dog likes the cat"] * 20, trainer=trainer)
    kwargs = {"eos_token": "<|endoftext|>"} if eos else {}
    PreTrainedTokenizerFast(tokenizer_object=tok, **kwargs).save_pretrained(tmp_path)
    return tmp_path


# --------------------------------------------------------------------------- tokenizer / LM
def test_load_tokenizer_keeps_existing_distinct_pad(tiny_model_dir, tiny_tokenizer):
    tok = load_tokenizer(tiny_model_dir, padding_side="left")
    assert tok.pad_token == "<|pad|>" and tok.pad_token_id != tok.eos_token_id
    assert len(tok) == len(tiny_tokenizer)
    assert tok.padding_side == "left"


def test_load_tokenizer_adds_distinct_pad_and_lm_resizes(tmp_path, tiny_model_dir, caplog):
    tok_dir = _tokenizer_without_pad(tmp_path)
    n_before = len(PreTrainedTokenizerFast.from_pretrained(tok_dir))
    with caplog.at_level(logging.INFO, logger="rlhfkit.models.loading"):
        tok = load_tokenizer(tok_dir)
    assert "added <|pad|>" in caplog.text
    assert tok.pad_token == "<|pad|>"
    assert tok.pad_token_id == n_before and tok.pad_token_id != tok.eos_token_id

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    base.resize_token_embeddings(n_before)  # a model that knows every id except the pad
    base.save_pretrained(tmp_path / "lm")
    model = load_causal_lm(tmp_path / "lm", tokenizer=tok)
    emb = model.get_input_embeddings().weight
    assert emb.shape[0] == len(tok) == n_before + 1
    torch.testing.assert_close(emb[:n_before], base.get_input_embeddings().weight)
    assert model.config.pad_token_id == tok.pad_token_id
    assert model.generation_config.pad_token_id == tok.pad_token_id
    assert torch.isfinite(_logits(model, torch.tensor([[tok.pad_token_id, 3]]))).all()


def test_load_tokenizer_replaces_pad_aliased_to_eos(tmp_path, tiny_tokenizer):
    tiny_tokenizer.save_pretrained(tmp_path)
    cfg = tmp_path / "tokenizer_config.json"
    cfg.write_text(cfg.read_text().replace('"<|pad|>"', '"<|endoftext|>"'))
    tok = load_tokenizer(tmp_path)
    assert tok.pad_token == "<|pad|>" and tok.pad_token_id != tok.eos_token_id


def test_load_tokenizer_without_eos_raises(tmp_path):
    with pytest.raises(ValueError, match="no eos_token"):
        load_tokenizer(_tokenizer_without_pad(tmp_path, eos=False))


def test_freeze_and_load_reference_leave_no_grads(tiny_model_dir, tiny_model):
    ref = load_reference(tiny_model_dir)
    for model in (freeze(tiny_model), ref):
        assert not model.training
        assert not any(p.requires_grad for p in model.parameters())
        assert not model(input_ids=torch.tensor([[1, 2, 3]])).logits.requires_grad


def test_causal_lm_atomic_round_trip(tmp_path, tiny_model_dir, tiny_tokenizer):
    model = load_causal_lm(tiny_model_dir, tokenizer=tiny_tokenizer)
    _perturb(model)
    ids = torch.tensor([[5, 6, 7, 8]])
    out = save_pretrained_atomic(model, tiny_tokenizer, tmp_path / "policy")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["policy"]
    assert not list(out.glob("*.bin")) and list(out.glob("*.safetensors"))
    loaded = AutoModelForCausalLM.from_pretrained(out)
    torch.testing.assert_close(_logits(loaded, ids), _logits(model, ids))
    assert load_tokenizer(out).pad_token_id == tiny_tokenizer.pad_token_id


# --------------------------------------------------------------------------- scalar heads
def test_fresh_head_init_follows_lm_human_preferences(tiny_model_dir):
    torch.manual_seed(0)
    rm = RewardModel.from_pretrained(tiny_model_dir)
    hidden = rm.config.hidden_size
    assert rm.score.weight.shape == (1, hidden)
    assert torch.count_nonzero(rm.score.bias) == 0
    std = rm.score.weight.std().item()
    assert 0.6 / (hidden + 1) ** 0.5 < std < 1.4 / (hidden + 1) ** 0.5


def _hf_scores(path, ids, mask):
    """Scores of a saved reward model under stock transformers alone."""
    model = AutoModelForSequenceClassification.from_pretrained(path).eval()
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask).logits[:, 0]


def test_reward_model_saves_a_standard_sequence_classifier(
    tmp_path, tiny_model_dir, tiny_tokenizer
):
    rm = RewardModel.from_pretrained(tiny_model_dir)
    _perturb(rm)  # the score bias too: folded into ln_f's bias for transformers
    ids, mask = _pad(SEQS, tiny_tokenizer.pad_token_id, "right")
    with torch.no_grad():
        scores = rm(ids, mask)  # (B,)
    out = save_pretrained_atomic(rm, tiny_tokenizer, tmp_path / "rm")
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["GPT2ForSequenceClassification"]
    assert len(config["id2label"]) == 1  # num_labels=1
    assert config["pad_token_id"] == tiny_tokenizer.pad_token_id
    assert not (out / HEAD_CONFIG).exists() and (out / "tokenizer.json").is_file()
    torch.testing.assert_close(_hf_scores(out, ids, mask), scores, atol=1e-5, rtol=0)

    loaded = RewardModel.from_pretrained(out)  # bit for bit what was saved: score_bias restored
    for key, value in rm.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    torch.testing.assert_close(loaded(ids, mask), scores, atol=0, rtol=0)


def test_score_bias_is_ignored_once_the_weights_changed(tmp_path, tiny_model_dir, caplog):
    rm = RewardModel.from_pretrained(tiny_model_dir)
    _perturb(rm.score)
    rm.save_pretrained(tmp_path)
    assert (tmp_path / SCORE_BIAS).is_file()
    other = AutoModelForSequenceClassification.from_pretrained(tmp_path)
    _perturb(other.score, seed=5)  # another tool trains it and saves over the weights
    other.save_pretrained(tmp_path)
    with caplog.at_level(logging.WARNING):
        loaded = RewardModel.from_pretrained(tmp_path)
    assert "score_bias.safetensors does not match" in caplog.text
    torch.testing.assert_close(loaded.score.weight, other.score.weight)
    assert torch.count_nonzero(loaded.score.bias) == 0
    torch.testing.assert_close(loaded.backbone.ln_f.bias, other.transformer.ln_f.bias)


def test_older_rlhfkit_format_still_loads(tmp_path, tiny_model_dir, tiny_tokenizer):
    """Backbone + score_head.safetensors + score_head.json, as rlhfkit wrote reward models
    before they were sequence classifiers (ScalarHeadModel.save_pretrained still writes it)."""
    rm = RewardModel.from_pretrained(tiny_model_dir)
    _perturb(rm)
    ids, mask = _pad(SEQS, tiny_tokenizer.pad_token_id, "left")
    with torch.no_grad():
        scores = rm(ids, mask)
        hidden = rm.backbone(input_ids=ids, attention_mask=mask).last_hidden_state
    ScalarHeadModel.save_pretrained(rm, tmp_path / "old")
    assert (tmp_path / "old" / HEAD_CONFIG).is_file() and (
        tmp_path / "old" / HEAD_WEIGHTS
    ).is_file()
    plain = AutoModel.from_pretrained(tmp_path / "old")  # the backbone alone, as before
    with torch.no_grad():
        torch.testing.assert_close(
            plain(input_ids=ids, attention_mask=mask).last_hidden_state, hidden
        )
        torch.testing.assert_close(RewardModel.from_pretrained(tmp_path / "old")(ids, mask), scores)
        values = ValueModel.from_pretrained(tmp_path / "old")(ids, mask)  # (B, T)
    torch.testing.assert_close(values[:, -1], scores)


def test_llama_reward_model_keeps_an_unfoldable_bias_for_rlhfkit(tmp_path, tiny_tokenizer, caplog):
    """RMSNorm has no bias to fold into: transformers reads the score without the head's
    bias (a warning says by how much); rlhfkit restores it."""
    tiny_llama(tiny_tokenizer).save_pretrained(tmp_path / "lm")
    rm = RewardModel.from_pretrained(tmp_path / "lm")
    ids, mask = _pad(SEQS, tiny_tokenizer.pad_token_id, "right")
    rm.save_pretrained(tmp_path / "unbiased")
    assert not (tmp_path / "unbiased" / SCORE_BIAS).exists()
    with torch.no_grad():
        scores = rm(ids, mask)
        torch.testing.assert_close(_hf_scores(tmp_path / "unbiased", ids, mask), scores)
        rm.score.bias.fill_(0.75)  # a normalisation shift
        with caplog.at_level(logging.WARNING):
            rm.save_pretrained(tmp_path / "biased")
        assert "cannot carry the score bias 0.75" in caplog.text
        torch.testing.assert_close(_hf_scores(tmp_path / "biased", ids, mask), scores)
        loaded = RewardModel.from_pretrained(tmp_path / "biased")
        torch.testing.assert_close(loaded(ids, mask), scores + 0.75, atol=0, rtol=0)


def test_reward_score_at_last_real_token_left_or_right_padded(tiny_model_dir, tiny_tokenizer):
    rm = RewardModel.from_pretrained(tiny_model_dir).eval()
    pad_id = tiny_tokenizer.pad_token_id
    right_ids, right_mask = _pad(SEQS, pad_id, "right")
    left_ids, left_mask = _pad(SEQS, pad_id, "left")
    with torch.no_grad():
        right = rm(right_ids, right_mask)
        left = rm(left_ids, left_mask)
        alone = torch.stack([rm(torch.tensor([s]), torch.ones(1, len(s)))[0] for s in SEQS])
        values = rm(right_ids, right_mask, per_token=True)  # (B, T)
    torch.testing.assert_close(right, alone)
    torch.testing.assert_close(left, alone)
    last = torch.tensor([len(s) - 1 for s in SEQS])
    torch.testing.assert_close(right, values[torch.arange(3), last])
    # Without mask-derived positions the left-padded rows would be scored differently.
    with torch.no_grad():
        shifted = rm.backbone(input_ids=left_ids, attention_mask=left_mask).last_hidden_state
    assert not torch.allclose(rm.score(shifted[:, -1]).squeeze(-1)[1:], alone[1:], atol=1e-4)


def test_reward_model_trains_head_and_backbone(tiny_model_dir):
    rm = RewardModel.from_pretrained(tiny_model_dir)
    ids, mask = _pad(SEQS, 1, "right")
    rm(ids, mask).sum().backward()
    assert rm.score.weight.grad.abs().sum() > 0
    assert rm.backbone.wte.weight.grad.abs().sum() > 0


def test_a_critic_from_a_language_model_starts_at_zero_and_learns(tiny_model_dir, caplog):
    """A fresh critic head is zero (every value 0), a fresh reward head small and random; the
    zero head still gets gradients, and the backbone gets them once the head has moved."""
    ids, mask = _pad(SEQS, 1, "right")
    with caplog.at_level(logging.INFO, logger="rlhfkit.models.loading"):
        critic = ValueModel.from_pretrained(tiny_model_dir)
    assert "the score head is freshly initialised (at zero)" in caplog.text
    assert torch.count_nonzero(critic.score.weight) == 0
    values = critic(ids, mask)  # (B, T)
    assert torch.count_nonzero(values) == 0
    values.sum().backward()
    assert critic.score.weight.grad.abs().sum() > 0
    assert critic.backbone.wte.weight.grad.abs().sum() == 0
    rm = RewardModel.from_pretrained(tiny_model_dir)
    hidden = rm.config.hidden_size
    assert abs(rm.score.weight.std().item() - (hidden + 1) ** -0.5) < 0.3 * (hidden + 1) ** -0.5
    assert torch.unique(rm(ids, mask)).numel() == len(SEQS)


def test_value_model_from_reward_checkpoint(tmp_path, tiny_model_dir, tiny_tokenizer):
    rm = RewardModel.from_pretrained(tiny_model_dir)
    _perturb(rm.score)
    rm.save_pretrained(tmp_path / "rm")
    critic = ValueModel.from_pretrained(tmp_path / "rm")
    ids, mask = _pad(SEQS, tiny_tokenizer.pad_token_id, "left")
    with torch.no_grad():
        values = critic(ids, mask)  # (B, T)
        scores = rm(ids, mask)  # (B,)
    assert values.shape == ids.shape
    torch.testing.assert_close(values[:, -1], scores)  # left-padded: last column is last real
    assert ScalarHeadModel.from_pretrained(tmp_path / "rm").per_token is False


def test_head_config_with_wrong_format_names_file_and_field(tmp_path, tiny_model_dir):
    ScalarHeadModel.save_pretrained(RewardModel.from_pretrained(tiny_model_dir), tmp_path)
    (tmp_path / HEAD_CONFIG).write_text('{"format": "something-else"}')
    with pytest.raises(ValueError, match=r"score_head\.json: field 'format'"):
        RewardModel.from_pretrained(tmp_path)


def test_a_classifier_with_several_labels_is_refused(tmp_path, tiny_model_dir):
    AutoModelForSequenceClassification.from_pretrained(
        tiny_model_dir, num_labels=3
    ).save_pretrained(tmp_path)
    with pytest.raises(UsageError, match=r"num_labels=3; a reward model gives one score"):
        RewardModel.from_pretrained(tmp_path)


# --------------------------------------------------------------------------- LoRA
def test_lora_reference_mode_is_base_model_and_only_adapters_train(tiny_model_dir, tiny_model):
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    base_logits = _logits(tiny_model, ids)
    model = add_lora(tiny_model, r=4, alpha=8)
    assert isinstance(model, PeftModel)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    _perturb(torch.nn.ModuleList(m for n, m in model.named_modules() if n.endswith("lora_B")))
    adapted = _logits(model, ids)
    assert not torch.allclose(adapted, base_logits, atol=1e-4)
    with reference_mode(model):
        torch.testing.assert_close(_logits(model, ids), base_logits)
    torch.testing.assert_close(_logits(model, ids), adapted)  # adapter back on afterwards

    merged = merge_lora(model)
    assert not isinstance(merged, PeftModel)
    torch.testing.assert_close(_logits(merged, ids), adapted, atol=1e-5, rtol=1e-5)


def test_lora_causal_lm_saves_adapter_only(tmp_path, tiny_model_dir, tiny_model, tiny_tokenizer):
    model = add_lora(tiny_model)
    _perturb(torch.nn.ModuleList(m for n, m in model.named_modules() if n.endswith("lora_B")))
    out = save_pretrained_atomic(model, tiny_tokenizer, tmp_path / "adapter")
    assert (out / "adapter_model.safetensors").is_file() and not (
        out / "model.safetensors"
    ).exists()
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    loaded = PeftModel.from_pretrained(base, out)
    ids = torch.tensor([[3, 4, 5]])
    torch.testing.assert_close(_logits(loaded, ids), _logits(model, ids))


def test_lora_reward_model_round_trip(tmp_path, tiny_model_dir):
    rm = add_lora(RewardModel.from_pretrained(tiny_model_dir), r=4)
    assert isinstance(rm, RewardModel)
    trainable = {n for n, p in rm.named_parameters() if p.requires_grad}
    assert {"score.weight", "score.bias"} <= trainable
    assert all("lora_" in n or n.startswith("score.") for n in trainable)
    _perturb(torch.nn.ModuleList(m for n, m in rm.named_modules() if n.endswith("lora_B")))
    ids, mask = _pad(SEQS, 1, "left")
    with torch.no_grad():
        scores = rm(ids, mask)
        with reference_mode(rm):
            assert not torch.allclose(rm(ids, mask), scores, atol=1e-4)
    save_pretrained_atomic(rm, None, tmp_path / "rm")
    loaded = RewardModel.from_pretrained(tmp_path / "rm")
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids, mask), scores)


def test_reference_mode_rejects_plain_model(tiny_model):
    with pytest.raises(ValueError, match="needs a LoRA model"), reference_mode(tiny_model):
        pass


# --------------------------------------------------------------------------- atomic save
def test_atomic_save_replaces_and_survives_crash(tmp_path, tiny_model, tiny_tokenizer):
    ids = torch.tensor([[5, 6, 7]])
    path = tmp_path / "ckpt"
    save_pretrained_atomic(tiny_model, tiny_tokenizer, path)
    _perturb(tiny_model)
    save_pretrained_atomic(tiny_model, tiny_tokenizer, path)  # replaces the existing dir
    saved = _logits(tiny_model, ids)
    torch.testing.assert_close(_logits(AutoModelForCausalLM.from_pretrained(path), ids), saved)

    def crash(directory, **kwargs):
        (directory / "model.safetensors").parent.mkdir(parents=True, exist_ok=True)
        (directory / "model.safetensors").write_bytes(b"partial")
        raise RuntimeError("disk full")

    _perturb(tiny_model, seed=2)
    tiny_model.save_pretrained = crash
    with pytest.raises(RuntimeError, match="disk full"):
        save_pretrained_atomic(tiny_model, tiny_tokenizer, path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # no temp dir left behind
    torch.testing.assert_close(_logits(AutoModelForCausalLM.from_pretrained(path), ids), saved)


def test_loading_and_prepare_model_fuse_gelu_and_set_attention_without_changing_outputs(
    tiny_model_dir,
):
    from transformers.activations import NewGELUActivation

    from rlhfkit.runtime.activations import TanhGELU

    def fused(m):
        return not any(type(mod) is NewGELUActivation for mod in m.modules()) and any(
            type(mod) is TanhGELU for mod in m.modules()
        )

    stock = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    assert not fused(stock)
    model = load_causal_lm(tiny_model_dir).eval()
    reward = RewardModel.from_pretrained(tiny_model_dir).eval()
    assert fused(model) and fused(reward)  # every model rlhfkit loads
    ids = torch.tensor([[5, 17, 42, 99, 7], [8, 3, 250, 11, 64]])
    with torch.no_grad():
        stock_logits = stock(ids).logits
        score_before = reward(ids, torch.ones_like(ids))
    for m in (stock, model, add_lora(reward, r=2)):  # and every model a trainer is handed
        prepare_model(m, "eager")
        assert fused(m)
        transformers = [mod for mod in m.modules() if hasattr(mod, "set_attn_implementation")]
        assert transformers and all(t.config._attn_implementation == "eager" for t in transformers)
    with torch.no_grad():
        for m in (stock, model):
            torch.testing.assert_close(m(ids).logits, stock_logits, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(reward(ids, torch.ones_like(ids)), score_before)
