"""PPO with LoRA on a model whose pad token is its EOS (as SmolLM2's is): `load_tokenizer` gives
it a pad of its own, which grows the vocabulary and the embeddings by one row, and the run
must still write in `final/` one plain merged model, with those rows and that tokenizer, that
`rlhfkit eval`, `rlhfkit sample`, `rlhfkit chat`, the next stage and stock transformers load.
Every command runs in a real subprocess, as a user runs it."""

import json
import os
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from helpers import build_tiny_tokenizer, tiny_corpus, tiny_lm, write_jsonl

pytestmark = pytest.mark.slow  # a PPO run, then eval, sample, chat and DPO: 40 s or more

PROMPTS = [" ".join(line.split()[:3]) for line in tiny_corpus(8)]  # "We paints a", ...


def _start(*args, cwd, stdin=False):
    """Start ``rlhfkit ARGS`` in ``cwd``; ``stdin=True`` gives it a pipe for ``_finish`` to
    type into."""
    env = dict(os.environ, OMP_NUM_THREADS="2", TOKENIZERS_PARALLELISM="false")
    process = subprocess.Popen(
        [sys.executable, "-m", "rlhfkit.cli", *map(str, args)], cwd=cwd, env=env,
        stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    return process


def _finish(process, typed=None):
    """Type ``typed`` into a command from ``_start`` and wait for it; assert it exits 0 and
    return its stdout."""
    try:
        out, err = process.communicate(typed, timeout=300)
    except subprocess.TimeoutExpired:
        process.kill()
        raise
    assert process.returncode == 0, err[-3000:]
    return out


def _cli(*args, cwd):
    """Run ``rlhfkit ARGS`` in ``cwd``; assert it exits 0 and return its stdout."""
    return _finish(_start(*args, cwd=cwd))


@pytest.fixture(scope="module")
def pad_is_eos_model_dir(tmp_path_factory):
    """The tiny GPT-2 saved with a tokenizer whose pad is its EOS, and exactly one embedding
    row per token: a pad of its own cannot reuse a spare row."""
    path = tmp_path_factory.mktemp("pad_is_eos_model")
    tokenizer = build_tiny_tokenizer(pad_is_eos=True)
    tiny_lm(tokenizer, n_positions=128).save_pretrained(path)
    tokenizer.save_pretrained(path)

    saved = AutoTokenizer.from_pretrained(path)
    assert saved.pad_token_id == saved.eos_token_id is not None
    assert "<|pad|>" not in saved.get_vocab()
    rows = AutoModelForCausalLM.from_pretrained(path).get_input_embeddings().weight.shape[0]
    assert rows == len(saved)
    return path


@pytest.fixture(scope="module")
def work_dir(tmp_path_factory):
    """Where the commands run: prompts and comparisons, and every run's directory."""
    path = tmp_path_factory.mktemp("lora_outputs")
    write_jsonl(path / "prompts.jsonl", [{"prompt": p} for p in PROMPTS])
    pairs = [{"prompt": p, "chosen": " a good book.", "rejected": " it."} for p in PROMPTS[:4]]
    write_jsonl(path / "pairs.jsonl", pairs)
    return path


@pytest.fixture(scope="module")
def ppo_final(pad_is_eos_model_dir, work_dir):
    """`final/` of a 2-iteration PPO run with LoRA on the pad-is-EOS model."""
    out = _cli(
        "ppo", "--model", pad_is_eos_model_dir, "--output_dir", "runs/ppo",
        "--lora", "true", "--lora_r", "4", "--max_steps", "2", "--ppo_epochs", "1",
        "--rollout_batch_size", "4", "--batch_size", "4", "--max_new_tokens", "6",
        "--reward_model", "null", "--reward_functions", "sentiment",
        "--train_data", "prompts.jsonl", "--eval_data", "null",
        "--cpu", "true", "--report_to", "none", cwd=work_dir,
    )  # fmt: skip
    final = work_dir / "runs" / "ppo" / "final"
    assert str(final) in out
    return final


def test_ppo_with_lora_writes_a_merged_model_with_its_grown_vocabulary(
    pad_is_eos_model_dir, ppo_final
):
    # A plain model, not an adapter: transformers with peft installed would also "load" an
    # adapter directory, by fetching the base model it names.
    assert not (ppo_final / "adapter_config.json").exists()
    assert not (ppo_final / "adapter_model.safetensors").exists()
    assert (ppo_final / "model.safetensors").is_file()

    original = AutoTokenizer.from_pretrained(pad_is_eos_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(ppo_final)
    assert tokenizer.pad_token_id is not None
    assert tokenizer.pad_token_id != tokenizer.eos_token_id == original.eos_token_id
    assert len(tokenizer) == len(original) + 1

    model = AutoModelForCausalLM.from_pretrained(ppo_final)
    assert type(model).__name__ == "GPT2LMHeadModel"
    assert model.get_input_embeddings().weight.shape[0] == len(tokenizer)
    assert model.get_output_embeddings().weight.shape[0] == len(tokenizer)
    assert model.config.vocab_size == len(tokenizer)
    assert model.config.pad_token_id == tokenizer.pad_token_id

    # The adapters are folded in (c_attn moved), the old embedding rows are untouched.
    base = AutoModelForCausalLM.from_pretrained(pad_is_eos_model_dir)
    trained, start = model.state_dict(), base.state_dict()
    assert not torch.equal(
        trained["transformer.h.0.attn.c_attn.weight"], start["transformer.h.0.attn.c_attn.weight"]
    )
    assert torch.equal(
        trained["transformer.wte.weight"][: len(original)], start["transformer.wte.weight"]
    )


def test_eval_reads_the_merged_model_beside_its_pad_is_eos_base(
    pad_is_eos_model_dir, ppo_final, work_dir
):
    output = work_dir / "runs" / "eval" / "eval.json"
    models = json.dumps({"base": str(pad_is_eos_model_dir), "ppo": str(ppo_final)})
    _cli(
        "eval", "--models", models, "--reference", pad_is_eos_model_dir,
        "--reward_model", "null", "--task", "sentiment", "--prompts", "prompts.jsonl",
        "--max_prompts", "4", "--best_of_n_prompts", "2", "--best_of_n", "[1, 2]",
        "--max_new_tokens", "6", "--batch_size", "4", "--num_samples", "2",
        "--output", output, "--device", "cpu", cwd=work_dir,
    )  # fmt: skip
    results = json.loads(output.read_text())
    rows = {row["model"]: row for row in results["rows"]}
    assert {"base", "ppo"} <= set(rows)
    for row in rows.values():
        assert row["prompts"] == 4
        assert 0 < row["length"] <= 6
    assert abs(rows["ppo"]["kl"]) < 1.0  # two small LoRA steps barely move the policy
    assert [s["prompt"] for s in results["samples"]] == PROMPTS[:2]
    assert all("ppo" in s["responses"] for s in results["samples"])


def test_sample_and_chat_read_the_merged_model(ppo_final, work_dir):
    # Side by side: each spends most of its time importing, on one core.
    sample = _start(
        "sample", "--model", ppo_final, "--prompt", json.dumps(PROMPTS[:2]),
        "--num_samples", "2", "--max_new_tokens", "6", "--reward_functions", "sentiment",
        "--seed", "1", cwd=work_dir,
    )  # fmt: skip
    chat = _start(
        "chat", "--model", ppo_final, "--max_new_tokens", "6", "--seed", "0",
        cwd=work_dir, stdin=True,
    )  # fmt: skip

    out = _finish(sample)
    lines = [line for line in out.splitlines() if " |" in line]
    assert [line.split("] ", 1)[1].split(" |")[0] for line in lines] == [
        PROMPTS[0], PROMPTS[0], PROMPTS[1], PROMPTS[1]
    ]  # fmt: skip
    assert "<|pad|>" not in out

    # Off a terminal, chat reads its turns from stdin.
    out = _finish(chat, f"{PROMPTS[0]}\n/quit\n")
    assert out.count("bot> ") == 1, out
    assert "<|pad|>" not in out


def test_the_next_stage_starts_from_the_merged_model(ppo_final, work_dir):
    out = _cli(
        "dpo", "--model", ppo_final, "--output_dir", "runs/dpo", "--train_data", "pairs.jsonl",
        "--eval_data", "null", "--max_steps", "1", "--batch_size", "4", "--max_length", "32",
        "--cpu", "true", "--report_to", "none", cwd=work_dir,
    )  # fmt: skip
    final = work_dir / "runs" / "dpo" / "final"
    assert str(final) in out
    tokenizer = AutoTokenizer.from_pretrained(final)
    model = AutoModelForCausalLM.from_pretrained(final)
    assert tokenizer.pad_token_id != tokenizer.eos_token_id
    assert model.get_input_embeddings().weight.shape[0] == len(tokenizer)
