"""The bundled assets: corpus, tokenizer, base model and demo data load offline and are sound."""

import json
import lzma

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlhfkit import tasks
from rlhfkit.data import Comparison, Demonstration, PromptRecord, Ranking, load_records

DEMO_KINDS = {
    "prompts": ("prompts", PromptRecord),
    "sft": ("demonstrations", Demonstration),
    "comparisons": ("comparisons", Comparison),
    "rankings": ("comparisons", Ranking),
}


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(tasks.BASE_MODEL_DIR, local_files_only=True)


@pytest.fixture(scope="module")
def model():
    return AutoModelForCausalLM.from_pretrained(
        tasks.BASE_MODEL_DIR, dtype=torch.float32, local_files_only=True
    ).eval()


def test_corpus_splits_are_disjoint_paragraphs():
    texts = {}
    for split in ("train", "test"):
        with lzma.open(tasks.CORPUS_DIR / f"{split}.jsonl.xz", "rt", encoding="ascii") as f:
            texts[split] = [json.loads(line)["text"] for line in f]
    assert len(texts["train"]) > 8 * len(texts["test"]) > 0
    long_test = {t for t in texts["test"] if len(t) > 200}  # short ones ("Yes.") may repeat
    assert not long_test & set(texts["train"])
    assert {"elizabeth", "darcy", "don't"} <= tasks.known_words()


def test_tokenizer_special_tokens(tokenizer):
    assert len(tokenizer) == 4096
    assert tokenizer.eos_token == "<|endoftext|>" and tokenizer.pad_token == "<|pad|>"
    assert tokenizer.pad_token_id != tokenizer.eos_token_id
    text = " It is a truth universally acknowledged."
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text


def test_model_architecture_and_storage(model):
    cfg = model.config
    shape = (cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.n_positions, cfg.vocab_size)
    assert shape == (4, 4, 256, 256, 4096)
    assert model.dtype == torch.float32
    assert model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr()  # tied
    assert sum(p.numel() for p in model.parameters()) == 4_273_664
    weights = tasks.BASE_MODEL_DIR / "model.safetensors"
    assert weights.stat().st_size < 25e6
    with safe_open(weights, "pt") as f:
        assert f.get_tensor("transformer.wte.weight").dtype == torch.float16


def test_greedy_generation_runs(model, tokenizer):
    enc = tokenizer(["It is a truth universally"], return_tensors="pt")
    out = model.generate(
        **enc, do_sample=False, max_new_tokens=8, pad_token_id=tokenizer.pad_token_id
    )  # (1, Tq + 8) at most
    text = tokenizer.decode(out[0, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    assert text.strip()


def test_training_log_records_the_run():
    record = json.loads((tasks.BASE_MODEL_DIR / "training_log.json").read_text())
    assert record["steps"] > 0 and record["wall_time_s"] > 0
    assert 1.0 < record["heldout_perplexity"] < 200.0


@pytest.mark.parametrize("name", sorted(DEMO_KINDS))
@pytest.mark.parametrize("split", ["train", "test"])
def test_demo_data_loads_through_data_module(name, split):
    kind, record_type = DEMO_KINDS[name]
    records = load_records(tasks.demo_data(f"{name}/{split}.jsonl"), kind)
    assert records and all(isinstance(r, record_type) for r in records)
    if record_type is Ranking:
        assert all(len(r.responses) == 4 for r in records)


def test_demo_folders_split_by_file_name():
    folder = tasks.demo_data("comparisons")
    assert len(load_records(folder, "comparisons", split="test")) < len(
        load_records(folder, "comparisons", split="train")
    )


def test_demo_stats_report_label_noise():
    stats = json.loads(tasks.demo_data("stats.json").read_text())
    assert 0.6 < stats["agreement_with_gold_train"]["pairs"] < 0.9
    assert stats["counts_train"]["comparisons"] == 2 * stats["counts_train"]["rankings"]
