"""Tests for scripts/smollm2_from_gguf.py: a tiny Llama GGUF, written with gguf's GGUFWriter,
converted to a plain checkpoint that stock transformers loads with the same logits."""

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGUFWriter, TokenType
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.convert_slow_tokenizer import bytes_to_unicode

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "smollm2_from_gguf.py"
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2 as in SmolLM2
# "1 2" and "Ġ Ġ" tell SmolLM's digit-by-digit pre-tokenizer from GPT-2's (see below)
MERGES = ["Ġ t", "h e", "Ġt he", "i n", "Ġ w", "a s", "Ġw as", "o n", "1 2", "Ġ Ġ"]
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
HIDDEN, LAYERS, HEADS, KV_HEADS, FFN = 64, 2, 4, 2, 128
TEXT = "It was the 12 in the  2024 window"


def _load_script():
    spec = importlib.util.spec_from_file_location("smollm2_from_gguf", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


convert_script = _load_script()


def _vocab() -> list[str]:
    """SmolLM2's layout in miniature: special tokens, the 256 byte symbols, then the merges."""
    merged = [m.replace(" ", "") for m in MERGES]
    return [*SPECIALS, *bytes_to_unicode().values(), *merged]


def write_tiny_llama_gguf(path: Path, tied: bool = True) -> Path:
    """A 2-layer Llama (hidden 64) with a byte-level BPE tokenizer, F32 tensors: the metadata
    transformers' GGUF loader reads (config keys, tokenizer.ggml.*, chat template)."""
    rng = np.random.default_rng(0)
    tokens = _vocab()
    head_dim = HIDDEN // HEADS
    writer = GGUFWriter(path, arch="llama")
    writer.add_name("tiny llama")
    writer.add_context_length(128)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    types = [TokenType.CONTROL] * len(SPECIALS) + [TokenType.NORMAL] * (len(tokens) - 3)
    writer.add_token_types(types)
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_pad_token_id(2)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)

    def tensor(name: str, *shape: int, scale: float = 0.1) -> None:
        # numpy in torch's (out, in) order, as llama.cpp's converter writes it
        writer.add_tensor(name, (rng.standard_normal(shape) * scale).astype(np.float32))

    tensor("token_embd.weight", len(tokens), HIDDEN)
    for i in range(LAYERS):
        tensor(f"blk.{i}.attn_norm.weight", HIDDEN, scale=1.0)
        tensor(f"blk.{i}.attn_q.weight", HIDDEN, HIDDEN)
        tensor(f"blk.{i}.attn_k.weight", KV_HEADS * head_dim, HIDDEN)
        tensor(f"blk.{i}.attn_v.weight", KV_HEADS * head_dim, HIDDEN)
        tensor(f"blk.{i}.attn_output.weight", HIDDEN, HIDDEN)
        tensor(f"blk.{i}.ffn_norm.weight", HIDDEN, scale=1.0)
        tensor(f"blk.{i}.ffn_gate.weight", FFN, HIDDEN)
        tensor(f"blk.{i}.ffn_up.weight", FFN, HIDDEN)
        tensor(f"blk.{i}.ffn_down.weight", HIDDEN, FFN)
    tensor("output_norm.weight", HIDDEN, scale=1.0)
    if not tied:  # llama.cpp writes the LM head only when it is not the embedding matrix
        tensor("output.weight", len(tokens), HIDDEN)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@torch.no_grad()
def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    return model(input_ids=ids).logits.float()


@pytest.mark.parametrize("tied", [True, False])
def test_saved_checkpoint_loads_with_stock_classes_and_same_logits(tmp_path, tied):
    gguf_path = write_tiny_llama_gguf(tmp_path / "tiny.gguf", tied=tied)
    out = tmp_path / "out"
    result = convert_script.convert(gguf_path, out, dtype=torch.float32)
    assert result.max_abs_diff == 0.0

    gguf_model, _ = convert_script.load_gguf(gguf_path)
    model = AutoModelForCausalLM.from_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert model.dtype == torch.float32
    assert model.config.tie_word_embeddings == tied
    tied_now = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert tied_now == tied
    assert not hasattr(model.config, "quantization_config")
    ids = torch.tensor([tokenizer(TEXT).input_ids])
    torch.testing.assert_close(_logits(model, ids), _logits(gguf_model, ids), rtol=0, atol=0)
    assert not list(tmp_path.glob(".tmp-*"))  # the temporary directory was renamed away


def test_tokenizer_keeps_special_tokens_template_and_splits_digits(tmp_path):
    gguf_path = write_tiny_llama_gguf(tmp_path / "tiny.gguf")
    convert_script.convert(gguf_path, tmp_path / "out")
    _, gguf_tok = convert_script.load_gguf(gguf_path)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "out")
    assert (tokenizer.eos_token, tokenizer.bos_token, tokenizer.pad_token) == (
        "<|im_end|>",
        "<|im_start|>",
        "<|im_end|>",
    )
    assert tokenizer.model_max_length == 128  # the context length, not transformers' "infinity"
    chat = [{"role": "user", "content": "hi"}]
    rendered = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert rendered == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer("<|im_end|>").input_ids == [2]
    ids = tokenizer(TEXT).input_ids
    assert tokenizer.decode(ids) == TEXT
    # SmolLM's pre-tokenizer isolates every digit (llama.cpp's "smollm", the hub's Digits step):
    # " 12" cannot merge into "12", and "  " before "2024" stays one piece that merges to "ĠĠ".
    # transformers' GGUF reader splits with GPT-2's regex alone: "12" merges, "ĠĠ" does not.
    assert tokenizer.convert_ids_to_tokens(ids) == [
        *["I", "t", "Ġwas", "Ġthe", "Ġ", "1", "2", "Ġ", "in", "Ġthe", "ĠĠ"],
        *["2", "0", "2", "4", "Ġw", "in", "d", "o", "w"],
    ]
    gguf_tokens = gguf_tok.convert_ids_to_tokens(gguf_tok(TEXT).input_ids)
    assert "12" in gguf_tokens and "ĠĠ" not in gguf_tokens


def test_saves_bfloat16_by_default(tmp_path):
    gguf_path = write_tiny_llama_gguf(tmp_path / "tiny.gguf")
    result = convert_script.convert(gguf_path, tmp_path / "out")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert result.dtype == torch.bfloat16 and model.dtype == torch.bfloat16
    assert result.max_abs_diff == 0.0  # the copy is checked in float32, before the cast


def test_smollm2_pipeline_config_derives_every_stage():
    from rlhfkit.config import load_config
    from rlhfkit.pipeline.config import PipelineConfig, stage_configs

    config = load_config(PipelineConfig, SCRIPT.parents[1] / "configs" / "smollm2.yaml")
    stages = stage_configs(config)
    assert stages.sft.model == convert_script.DEFAULT_OUT == config.base_model
    for stage in (stages.sft, stages.reward, stages.ppo, stages.dpo):
        assert (stage.mixed_precision, stage.attn_implementation) == ("bf16", "sdpa")
