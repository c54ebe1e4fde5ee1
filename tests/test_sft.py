"""SFT: the loss covers response tokens only, training lowers held-out response NLL, frozen
parameters stay put."""

import json
import math
import random

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from helpers import stage_config
from rlhfkit.config import SFTConfig
from rlhfkit.data import Demonstration, SFTCollator, encode_demonstrations
from rlhfkit.tracking import read_jsonl
from rlhfkit.trainers.sft import SFTTrainer, run_sft

SUBJECTS = ["The cat", "A dog", "My friend", "The teacher", "A small bird", "The robot"]
OBJECTS = ["a red ball", "the big tree", "some good food", "a new book", "the blue sky"]


def qa_demos(n: int, seed: int) -> list[Demonstration]:
    """'Q: <subject> likes <object>.' -> ' A: <object>' (copy the object)."""
    rng = random.Random(seed)
    demos = []
    for _ in range(n):
        obj = rng.choice(OBJECTS)
        demos.append(Demonstration(f"Q: {rng.choice(SUBJECTS)} likes {obj}.", f" A: {obj}"))
    return demos


def _config(tmp_path, model_dir, **overrides):
    return stage_config(
        SFTConfig, tmp_path / "sft",
        **{"model": str(model_dir), "eval_data": None, "batch_size": 8, "max_steps": 30,
           "learning_rate": 3e-3, "warmup_steps": 0, "log_every": 5, "eval_every": 15,
           "max_length": 64, "resume": True, **overrides},
    )  # fmt: skip


def test_loss_is_mean_nll_of_response_tokens_only(tiny_model, tiny_tokenizer, tmp_path):
    examples, _ = encode_demonstrations(qa_demos(4, seed=0), tiny_tokenizer, 64)
    trainer = SFTTrainer(
        _config(tmp_path, "unused"), tiny_model, tiny_tokenizer, examples, examples
    )
    batch = SFTCollator(tiny_tokenizer.pad_token_id)(examples)
    assert (batch["labels"] == -100).any() and (batch["labels"] != -100).any()
    tiny_model.eval()
    loss, metrics = trainer.compute_loss(batch)
    # Independent reference: transformers' own shifted cross-entropy, ignoring label -100.
    reference = tiny_model(**batch).loss
    torch.testing.assert_close(loss, reference, rtol=1e-5, atol=1e-6)
    assert int(metrics["response_tokens"]) == int((batch["labels"][:, 1:] != -100).sum())
    # Changing a prompt token's label must not change the loss: only the mask matters.
    changed = dict(batch, labels=batch["labels"].clone())
    changed["labels"][:, 1] = -100
    assert torch.equal(trainer.compute_loss(changed)[0], loss)
    eval_metrics = trainer.evaluate()
    assert eval_metrics["perplexity"] == pytest.approx(math.exp(eval_metrics["nll"]))


def test_sft_lowers_held_out_response_nll(tiny_model_dir, tiny_tokenizer, tmp_path):
    train, _ = encode_demonstrations(qa_demos(64, seed=1), tiny_tokenizer, 64)
    held_out, _ = encode_demonstrations(qa_demos(16, seed=2), tiny_tokenizer, 64)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    wpe = model.transformer.wpe.weight
    wpe.requires_grad_(False)  # frozen position embeddings: must not move
    frozen_before = wpe.detach().clone()
    block_before = model.transformer.h[0].mlp.c_fc.weight.detach().clone()
    config = _config(tmp_path, tiny_model_dir)
    trainer = SFTTrainer(config, model, tiny_tokenizer, train, held_out)
    before = trainer.run_evaluation()["nll"]
    trainer.train()
    after = trainer.state.eval_metrics["nll"]
    assert after < before - 3.0, (before, after)  # measured: 5.98 -> 0.54
    assert torch.equal(wpe.detach(), frozen_before)
    assert not torch.equal(model.transformer.h[0].mlp.c_fc.weight.detach(), block_before)
    rows = read_jsonl(tmp_path / "sft" / "metrics.jsonl")
    assert [r["step"] for r in rows if "eval/nll" in r] == [15, 30]


def test_sft_with_lora_trains_adapters_only_and_writes_a_merged_model(
    tiny_model_dir, tiny_tokenizer, tmp_path
):
    train, _ = encode_demonstrations(qa_demos(64, seed=1), tiny_tokenizer, 64)
    held_out, _ = encode_demonstrations(qa_demos(16, seed=2), tiny_tokenizer, 64)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    base_before = {k: v.clone() for k, v in model.state_dict().items()}
    config = _config(
        tmp_path, tiny_model_dir, lora=True, lora_r=16, learning_rate=2e-2,
        lora_target_modules=["c_attn", "c_proj", "c_fc"],
    )  # fmt: skip
    trainer = SFTTrainer(config, model, tiny_tokenizer, train, held_out)
    before = trainer.run_evaluation()["nll"]
    trainer.train()
    # Adapters on attention and MLP only (no embeddings): slower than full fine-tuning.
    assert trainer.state.eval_metrics["nll"] < before - 0.5  # measured: 5.98 -> 5.05
    base = {k.replace("base_model.model.", "").replace(".base_layer", ""): v for k, v in
            trainer.unwrapped_model.state_dict().items() if "lora_" not in k}  # fmt: skip
    assert all(torch.equal(base[k], v) for k, v in base_before.items())  # base weights frozen
    final = tmp_path / "sft" / "final"
    assert not (final / "adapter_config.json").exists()  # merged: a plain causal LM
    merged = AutoModelForCausalLM.from_pretrained(final)
    assert not any(torch.equal(merged.state_dict()[k], v) for k, v in base_before.items()
                   if k.endswith("c_attn.weight"))  # fmt: skip
    assert (tmp_path / "sft" / "checkpoint-30" / "adapter_model.safetensors").is_file()


def test_run_sft_from_files(tiny_model_dir, tmp_path):
    for name, seed in (("train", 3), ("test", 4)):
        with (tmp_path / f"{name}.jsonl").open("w") as f:
            for d in qa_demos(16, seed):
                f.write(json.dumps({"prompt": d.prompt, "response": d.response}) + "\n")
    config = _config(
        tmp_path,
        tiny_model_dir,
        train_data=str(tmp_path / "train.jsonl"),
        eval_data=str(tmp_path / "test.jsonl"),
        max_steps=4,
    )
    final = run_sft(config)
    assert final == config.final_dir
    loaded = AutoModelForCausalLM.from_pretrained(final)
    assert (
        loaded.config.vocab_size
        == AutoModelForCausalLM.from_pretrained(tiny_model_dir).config.vocab_size
    )
    state = json.loads((final / "trainer_state.json").read_text())
    assert state["complete"] and state["step"] == 4 and "nll" in state["eval_metrics"]
    assert run_sft(config) == final  # complete: returns without training again


@pytest.mark.parametrize(
    "precision, lora, saved_dtype",
    [("bf16", False, torch.bfloat16), ("no", False, torch.float32), ("bf16", True, torch.float32)],
    ids=["bf16-autocast", "float32", "bf16-autocast-lora"],
)
def test_a_model_stored_in_bf16_keeps_what_its_bf16_passes_trained(
    tiny_model_dir, tiny_tokenizer, tmp_path, precision, lora, saved_dtype
):
    """From weights stored in bf16, trained under bf16 autocast, final/ holds the float32
    master weights rounded to bf16 (what every forward pass computed with), and the model
    trains on in float32; trained in float32, or with LoRA, final/ is float32."""
    start = tmp_path / "bf16_start"
    AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16).save_pretrained(
        start
    )
    tiny_tokenizer.save_pretrained(start)
    train, _ = encode_demonstrations(qa_demos(16, seed=1), tiny_tokenizer, 64)
    held_out, _ = encode_demonstrations(qa_demos(8, seed=2), tiny_tokenizer, 64)
    config = _config(
        tmp_path, start, mixed_precision=precision, lora=lora, max_steps=2, eval_every=0,
        lora_target_modules=["c_attn"],
    )  # fmt: skip
    model = AutoModelForCausalLM.from_pretrained(start, dtype=torch.float32)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = SFTTrainer(config, model, tiny_tokenizer, train, held_out)
    trainer.train()
    final = tmp_path / "sft" / "final"
    saved = load_file(final / "model.safetensors")
    assert {v.dtype for v in saved.values()} == {saved_dtype}
    assert json.loads((final / "config.json").read_text())["dtype"] == str(saved_dtype)[6:]
    masters = trainer.unwrapped_model.state_dict()
    assert all(v.dtype == torch.float32 for v in masters.values())
    if not lora:
        assert all(torch.equal(v, masters[k].to(saved_dtype)) for k, v in saved.items())
        moved = [k for k, v in saved.items() if not torch.equal(v, before[k].to(saved_dtype))]
        assert moved  # it trained (past bf16's resolution somewhere)
