"""Sampling with a KV cache: EOS handling, masks, left padding, filtering, reproducibility."""

import functools
import logging
from contextlib import nullcontext
from types import SimpleNamespace

import pytest
import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from rlhfkit.data import pad
from rlhfkit.experience import generation
from rlhfkit.experience.generation import SamplingConfig, filter_logits, generate, sample_next_token
from rlhfkit.models.lora import add_lora
from rlhfkit.runtime.decoding import cache_name, static_cache_supported
from rlhfkit.runtime.packing import enable_packing

EOS, PAD, VOCAB = 0, 1, 8


class ScriptedLM(torch.nn.Module):
    """Emits ``script[row][step]`` greedily (a huge logit; token 4 is the runner-up), counting
    its forward calls."""

    def __init__(self, script: list[list[int]]):
        super().__init__()
        self.script = torch.tensor(script)
        self.calls = 0

    def forward(
        self, input_ids, attention_mask, position_ids, use_cache, past_key_values=None, **kw
    ):
        step = self.calls
        self.calls += 1
        logits = torch.zeros(input_ids.shape[0], 1, VOCAB)
        logits[..., 4] = 1.0
        logits[torch.arange(input_ids.shape[0]), 0, self.script[:, step]] = 100.0
        return SimpleNamespace(logits=logits, past_key_values=past_key_values)


def _query(batch=3, length=2):
    return torch.full((batch, length), 5), torch.ones(batch, length, dtype=torch.long)


def test_stops_at_eos_pads_after_and_masks_up_to_eos():
    script = [[2, EOS, 3, 4, 5, 6], [2, 3, 4, EOS, 5, 6], [EOS, 2, 2, 2, 2, 2]]
    model = ScriptedLM(script)
    out = generate(
        model,
        *_query(),
        SamplingConfig(max_new_tokens=6, greedy=True),
        eos_token_id=EOS,
        pad_token_id=PAD,
    )
    assert out.response.tolist() == [[2, EOS, PAD, PAD], [2, 3, 4, EOS], [EOS, PAD, PAD, PAD]]
    assert out.response_mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]
    assert out.response_mask.dtype == torch.long
    # Every row finished after 4 tokens: prefill + 3 decode steps, no wasted forward.
    assert model.calls == 4
    assert out.eos_emitted.tolist() == [True, True, True]


def test_rows_without_eos_run_to_max_new_tokens():
    script = [[2, 3, 4, 5], [EOS, 2, 2, 2]]
    model = ScriptedLM(script)
    out = generate(
        model,
        *_query(2),
        SamplingConfig(max_new_tokens=4, greedy=True),
        eos_token_id=EOS,
        pad_token_id=PAD,
    )
    assert out.response.tolist() == [[2, 3, 4, 5], [EOS, PAD, PAD, PAD]]
    assert out.response_mask.tolist() == [[1, 1, 1, 1], [1, 0, 0, 0]]
    assert out.eos_emitted.tolist() == [False, True]
    assert model.calls == 4  # the last token needs no forward


def test_pad_token_is_never_sampled():
    model = ScriptedLM([[PAD, PAD, 3]])  # the model prefers pad, then token 4
    out = generate(
        model,
        *_query(1),
        SamplingConfig(max_new_tokens=3, greedy=True),
        eos_token_id=EOS,
        pad_token_id=PAD,
    )
    assert out.response.tolist() == [[4, 4, 3]]
    assert out.response_mask.tolist() == [[1, 1, 1]]


@pytest.fixture
def decisive_model():
    """A tiny GPT-2 with large init, so greedy arg-maxes are far from ties."""
    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=2, n_head=2, n_embd=32, n_positions=64, vocab_size=50, initializer_range=0.3
    )
    return GPT2LMHeadModel(config).eval()


def test_left_padding_gives_the_same_greedy_continuation_as_no_padding(decisive_model):
    prompts = [[5, 6, 7, 8, 9, 10], [11, 12], [13, 14, 15]]
    config = SamplingConfig(max_new_tokens=8, greedy=True)
    query, query_mask = pad(prompts, PAD, side="left")
    batched = generate(
        decisive_model, query, query_mask, config, eos_token_id=EOS, pad_token_id=PAD
    )
    for i, prompt in enumerate(prompts):
        alone = generate(
            decisive_model,
            torch.tensor([prompt]),
            torch.ones(1, len(prompt), dtype=torch.long),
            config,
            eos_token_id=EOS,
            pad_token_id=PAD,
        )
        width = alone.response.shape[1]
        assert batched.response[i, :width].tolist() == alone.response[0].tolist()
        assert batched.response_mask[i, :width].tolist() == alone.response_mask[0].tolist()


def test_cached_greedy_matches_full_recompute(decisive_model, device):
    """The KV-cache loop equals re-running the whole sequence for every token (on a GPU the
    cache is the static one and each step a CUDA graph replay)."""
    decisive_model.to(device)
    query, query_mask = (x.to(device) for x in pad([[5, 6, 7], [8, 9]], PAD, side="left"))
    out = generate(
        decisive_model,
        query,
        query_mask,
        SamplingConfig(max_new_tokens=6, greedy=True),
        eos_token_id=EOS,
        pad_token_id=PAD,
    )
    ids, mask = query, query_mask
    for t in range(out.response.shape[1]):
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        logits = decisive_model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[
            :, -1
        ]
        logits[:, PAD] = float("-inf")
        expected = logits.argmax(-1)
        real = out.response_mask[:, t].bool()
        assert out.response[real, t].tolist() == expected[real].tolist()
        ids = torch.cat([ids, out.response[:, t : t + 1]], 1)
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)


# Grouped-query attention: 4 query heads, 2 key/value heads.
_GQA = dict(
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    hidden_size=32,
    intermediate_size=64,
    vocab_size=50,
    initializer_range=0.3,
)


def _llama(attention):
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**_GQA, attn_implementation=attention)).eval()


def _qwen2(attention):
    """Qwen2: Llama's layout with biased query/key/value projections and tied embeddings
    (the GPU benchmark's 0.5B shape)."""
    torch.manual_seed(0)
    config = Qwen2Config(**_GQA, tie_word_embeddings=True, attn_implementation=attention)
    return Qwen2ForCausalLM(config).eval()


def _gpt2(attention):
    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=2,
        n_head=2,
        n_embd=32,
        n_positions=64,
        vocab_size=50,
        initializer_range=0.3,
        attn_implementation=attention,
    )
    return GPT2LMHeadModel(config).eval()


@pytest.mark.parametrize("packed", [False, True], ids=["plain", "packing-enabled"])
@pytest.mark.parametrize("attention", ["eager", "sdpa"])
@pytest.mark.parametrize("build", [_gpt2, _llama, _qwen2], ids=["gpt2", "llama", "qwen2"])
def test_the_static_cache_decodes_what_the_dynamic_cache_does(build, attention, packed, device):
    """Left-padded prompts, greedy and seeded sampling: the same tokens from both caches (on
    a GPU the static one replays a CUDA graph), whatever kernel, with packing switched on."""
    model = build(attention).to(device)
    if packed:
        assert enable_packing(model)
    query, query_mask = (
        x.to(device) for x in pad([[5, 6, 7, 8, 9, 10], [11, 12], [13]], PAD, side="left")
    )
    assert static_cache_supported(model)
    for greedy in (True, False):
        responses = []
        for cache in ("dynamic", "static"):
            config = SamplingConfig(12, temperature=1.3, greedy=greedy, cache_implementation=cache)
            generator = torch.Generator(device).manual_seed(3)
            out = generate(
                model,
                query,
                query_mask,
                config,
                eos_token_id=EOS,
                pad_token_id=PAD,
                generator=generator,
            )
            responses.append(out.response)
        assert torch.equal(*responses), greedy


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("build", [_gpt2, _llama], ids=["gpt2", "llama"])
def test_decoding_uses_the_current_cache_api(build, cache, caplog):
    """No deprecated name for the KV cache, neither passed (a FutureWarning, an error under
    the suite's filters) nor read from the output (a transformers log line, once a process)."""
    logging.Logger.warning_once.cache_clear()
    query, query_mask = pad([[5, 6, 7], [8]], PAD, side="left")
    config = SamplingConfig(4, greedy=True, cache_implementation=cache)
    with caplog.at_level(logging.WARNING):
        generate(build("eager"), query, query_mask, config, eos_token_id=EOS, pad_token_id=PAD)
    assert "deprecated" not in caplog.text


def test_a_model_that_takes_past_key_values_gets_it():
    """A model of a release before transformers 5.24, or remote code, keeps the old name."""
    assert cache_name(ScriptedLM([[2]])) == "past_key_values"


@pytest.mark.parametrize("build", [_gpt2, _llama, _qwen2], ids=["gpt2", "llama", "qwen2"])
def test_the_static_cache_under_bf16_autocast(build, device):
    """The rollout decodes under bf16 autocast, where Llama's rotary embedding gives float32
    keys beside bfloat16 values; on a GPU the captured graph casts the weights itself."""
    model = build("sdpa").to(device)
    query, query_mask = (
        x.to(device) for x in pad([[5, 6, 7, 8, 9, 10], [11, 12], [13]], PAD, side="left")
    )
    responses = []
    for cache in ("dynamic", "static"):
        config = SamplingConfig(16, greedy=True, cache_implementation=cache)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            out = generate(model, query, query_mask, config, eos_token_id=EOS, pad_token_id=PAD)
        responses.append(out.response)
    assert torch.equal(*responses)


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_frozen_weights_are_cast_once_and_decode_the_same_tokens(cache, device, monkeypatch):
    """Under bf16 autocast, a LoRA model's frozen weights (and its tied LM head) are held in
    bf16 for the decode loop, which samples exactly the tokens the per-call casts give, and
    are put back afterwards; weights that take gradients are left to autocast's cache."""
    model = add_lora(_llama("sdpa"), target_modules=["q_proj", "v_proj"]).to(device)
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if "lora_B" in name:  # a trained adapter: B starts at zero
                weight.normal_(0, 0.3)
    query, query_mask = (
        x.to(device) for x in pad([[5, 6, 7, 8, 9, 10], [11, 12], [13]], PAD, side="left")
    )
    config = SamplingConfig(16, temperature=1.3, cache_implementation=cache)
    before = dict(model.named_parameters())
    seen = {}

    def record(name, module, args):
        seen.setdefault(name, module.weight.dtype)

    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            module.register_forward_pre_hook(functools.partial(record, name))

    def sample():
        with torch.autocast(device.type, dtype=torch.bfloat16):
            generator = torch.Generator(device).manual_seed(4)
            return generate(
                model, query, query_mask, config, eos_token_id=EOS, pad_token_id=PAD,
                generator=generator,
            ).response  # fmt: skip

    cast_once = sample()
    lm_head = "base_model.model.lm_head"
    assert seen[lm_head] == torch.bfloat16  # tied to the embedding, which stays float32
    assert seen["base_model.model.model.layers.0.mlp.up_proj"] == torch.bfloat16
    assert seen["base_model.model.model.layers.0.self_attn.q_proj.base_layer"] == torch.bfloat16
    assert seen["base_model.model.model.layers.0.self_attn.q_proj.lora_A.default"] == torch.float32
    assert dict(model.named_parameters()) == before  # the same tensors, float32
    assert all(w.dtype == torch.float32 for w in before.values())
    monkeypatch.setattr(generation, "frozen_weights_cast_once", lambda model: nullcontext())
    assert torch.equal(cast_once, sample())


def test_sampling_is_reproducible_with_a_seeded_generator(decisive_model):
    query, query_mask = pad([[5, 6, 7], [8, 9]], PAD, side="left")
    config = SamplingConfig(max_new_tokens=10, temperature=1.5)

    def run(seed):
        g = torch.Generator().manual_seed(seed)
        return generate(
            decisive_model,
            query,
            query_mask,
            config,
            eos_token_id=EOS,
            pad_token_id=PAD,
            generator=g,
        ).response

    assert torch.equal(run(1), run(1))
    assert not torch.equal(run(1), run(2))


def test_top_k_one_is_greedy():
    logits = torch.randn(16, 30)
    g = torch.Generator().manual_seed(0)
    sampled = sample_next_token(logits, SamplingConfig(top_k=1, temperature=2.0), g)
    assert torch.equal(sampled, logits.argmax(-1))


def test_filter_logits_by_hand():
    # probabilities 0.5, 0.3, 0.15, 0.05 (log-space logits)
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    inf = float("-inf")
    # top_p=0.7: 0.5 < 0.7 so the second token is kept too; mass before the third is 0.8.
    kept = filter_logits(logits, top_p=0.7)
    assert torch.isinf(kept).tolist() == [[False, False, True, True]]
    # top_p=0.5: the first token alone reaches 0.5 exactly.
    assert torch.isinf(filter_logits(logits, top_p=0.5)).tolist() == [[False, True, True, True]]
    # A tiny top_p still keeps the most likely token.
    assert torch.isinf(filter_logits(logits, top_p=1e-6)).tolist() == [[False, True, True, True]]
    # top_k=3 drops only the last; the order of the tokens in the row does not matter.
    shuffled = logits[:, [2, 0, 3, 1]]
    assert filter_logits(shuffled, top_k=3)[0, 2].item() == inf
    assert torch.isfinite(filter_logits(shuffled, top_k=3)).sum() == 3


@pytest.mark.parametrize(
    ("field", "value"),
    [("max_new_tokens", 0), ("temperature", 0.0), ("top_k", -1), ("top_p", 0.0), ("top_p", 1.5)],
)
def test_sampling_config_names_the_bad_field(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingConfig(**{field: value})


def test_eos_equal_to_pad_is_rejected():
    with pytest.raises(ValueError, match="must differ"):
        generate(
            ScriptedLM([[2]]),
            *_query(1),
            SamplingConfig(max_new_tokens=1),
            eos_token_id=3,
            pad_token_id=3,
        )


def test_sampling_follows_the_distribution():
    probs = torch.tensor([0.5, 0.0, 0.3, 0.2])
    logits = probs.log().expand(20000, 4)
    g = torch.Generator().manual_seed(0)
    counts = torch.bincount(sample_next_token(logits, SamplingConfig(), g), minlength=4)
    assert counts[1] == 0  # zero probability is never drawn
    assert torch.allclose(counts / 20000, probs, atol=0.015)
