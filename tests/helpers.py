"""Helpers the tests import: a tiny corpus, a byte-level BPE tokenizer trained on it, tiny
GPT-2 and Llama models built from a config, JSONL writers and a trivially learnable scorer.

Everything is made in-process and offline. The fixtures built from these (a saved tokenizer
and model, the device, thread counts) are in ``conftest.py``; tests import what they need from
here with ``from helpers import tiny_lm``.
"""

import importlib.util
import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
)

from rlhfkit.experience.scorers import Scorer

EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"
TINY_VOCAB_SIZE = 400
TINY_PIPELINE_CONFIG = Path(__file__).resolve().parent / "pipeline_tiny.yaml"

SUBJECTS = ["the cat", "a dog", "my friend", "the teacher", "a small bird", "the robot", "we"]
VERBS = ["likes", "sees", "finds", "makes", "wants", "reads", "paints", "helps"]
OBJECTS = ["a red ball", "the big tree", "some good food", "a new book", "the blue sky", "it"]
ENDINGS = [".", "!", " today.", " every day.", " in the park.", "?"]


def tiny_corpus(n_lines: int = 400, seed: int = 0) -> list[str]:
    """Simple English sentences, deterministic for a given seed."""
    rng = random.Random(seed)
    lines = []
    for i in range(n_lines):
        words = f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)}"
        lines.append(f"{words.capitalize()}{rng.choice(ENDINGS)} Number {i % 50}.")
    return lines


def build_tiny_tokenizer(
    vocab_size: int = TINY_VOCAB_SIZE, pad_is_eos: bool = False
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE (GPT-2 style) on ``tiny_corpus`` in well under a second; with
    ``pad_is_eos`` EOS is its only special token and its pad, as many hub tokenizers have."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN] if pad_is_eos else [EOS_TOKEN, PAD_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(tiny_corpus(), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=EOS_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=EOS_TOKEN,
        pad_token=EOS_TOKEN if pad_is_eos else PAD_TOKEN,
        model_max_length=128,
    )


def tiny_lm(tokenizer, seed: int = 0, n_positions: int = 64) -> GPT2LMHeadModel:
    """A fresh seeded 2-layer GPT-2 (n_embd 64) over ``tokenizer``'s vocabulary."""
    config = GPT2Config(
        n_layer=2,
        n_head=2,
        n_embd=64,
        n_positions=n_positions,
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    return GPT2LMHeadModel(config)


def tiny_llama(tokenizer, seed: int = 0) -> LlamaForCausalLM:
    """A fresh seeded 1-layer Llama over ``tokenizer``'s vocabulary: a final RMSNorm, no bias."""
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    """``rows`` as JSON lines at ``path``, its directory made if needed; returns ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def stage_config(make, run_dir, **fields):
    """``make(**fields)`` (a stage's config class, or a preset's constructor) as the tests build
    it: on the CPU, model and data "unused" (the test hands them over as objects) unless named,
    written under ``run_dir`` (unless ``output_dir`` says otherwise) with nothing tracked beside
    metrics.jsonl, starting afresh,
    at a constant learning rate."""
    quiet = {
        "model": "unused",
        "train_data": "unused",
        "output_dir": str(run_dir),
        "report_to": [],
        "resume": False,
        "lr_scheduler": "constant",
        "cpu": True,
    }
    return make(**{**quiet, **fields})


def write_pipeline_data(root) -> None:
    """prompts/, sft/ and comparisons/ with train and test files, as the demo data has: the
    first 3 words of a tiny-corpus line as the prompt, the rest as the response."""
    lines = tiny_corpus(60, seed=3)
    for split, chunk in (("train", lines[:44]), ("test", lines[44:])):
        cut = [(" ".join(s.split()[:3]), " " + " ".join(s.split()[3:])) for s in chunk]
        write_jsonl(root / "prompts" / f"{split}.jsonl", [{"prompt": p} for p, _ in cut])
        write_jsonl(root / "sft" / f"{split}.jsonl", [{"prompt": p, "response": r} for p, r in cut])
        pairs = [
            {"prompt": p, "chosen": r, "rejected": other}
            for (p, r), (_, other) in zip(cut, cut[1:] + cut[:1], strict=True)
        ]
        write_jsonl(root / "comparisons" / f"{split}.jsonl", pairs)


def tiny_pipeline_config(run_dir, data, model, **fields):
    """tests/pipeline_tiny.yaml (a few steps a stage) on ``data`` (``write_pipeline_data``) and
    the tiny ``model``, into ``run_dir``, with ``fields`` set."""
    from rlhfkit.config import load_config
    from rlhfkit.pipeline.config import PipelineConfig

    return load_config(
        PipelineConfig,
        TINY_PIPELINE_CONFIG,
        output_dir=str(run_dir),
        base_model=str(model),
        data_dir=str(data),
        **fields,
    )


def on_device(device, **overrides) -> dict:
    """Trainer config fields that run it on ``device``: on a GPU with its fast settings (bf16
    autocast, SDPA attention, and so the static-cache CUDA-graph decoding)."""
    if device.type == "cpu":
        return {"cpu": True, **overrides}
    return {"cpu": False, "mixed_precision": "bf16", "attn_implementation": "sdpa", **overrides}


def tiny_prompts(tokenizer, n: int = 64) -> list[list[int]]:
    """``n`` prompts of at most 6 token ids from the tiny corpus."""
    return [tokenizer(line)["input_ids"][:6] for line in tiny_corpus(n)]


TARGETS = range(10, 50)  # 40 of ~400 token ids: about 10% of random tokens hit at the start


class TargetFraction(Scorer):
    """Share of the response's real tokens that are ``TARGETS`` ids (a trivially learnable
    reward for the RL trainers); remembers the last batch it scored."""

    name = "target_fraction"

    def score(self, batch):
        self.last = batch
        real = batch.response_mask != 0
        hits = (batch.response >= TARGETS.start) & (batch.response < TARGETS.stop) & real
        return hits.sum(1).float() / real.sum(1)


def response_chars(prompts, responses):
    """A reward function by name (``helpers:response_chars``): each response's length in
    characters, a score that differs between samples."""
    return [float(len(r)) for r in responses]


def sigterm_after_steps(process: subprocess.Popen, run_dir: Path, steps: int = 2) -> str:
    """Send ``process`` (a training command writing ``run_dir``) SIGTERM once its
    ``metrics.jsonl`` holds ``steps`` rows (or it ended, or 240 s passed); its stderr once it
    exits."""
    metrics = Path(run_dir) / "metrics.jsonl"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and process.poll() is None:
        if metrics.is_file() and metrics.read_text().count("\n") >= steps:
            break
        time.sleep(0.02)
    process.send_signal(signal.SIGTERM)
    return process.communicate(timeout=120)[1]


def load_script(path: Path):
    """A script of scripts/ as a module."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # where its dataclasses look their annotations up
    spec.loader.exec_module(module)
    return module


def stopped_and_resumed_equals_straight(trainer, stop_after: int):
    """Train ``trainer("a")`` straight through, and ``trainer("b")`` stopped after
    ``stop_after`` steps then resumed (``trainer(out, resume=True)``); assert their final
    weights are equal, tensor by tensor. Returns the two trainers."""
    straight = trainer("a")
    straight.train()
    trainer("b").train(stop_after=stop_after)
    resumed = trainer("b", resume=True)
    resumed.train()
    for (name, a), b in zip(
        straight.model.state_dict().items(), resumed.model.state_dict().values(), strict=True
    ):
        torch.testing.assert_close(a, b, msg=name)
    return straight, resumed


def run_light_command(args: list[str]) -> tuple[int, bool, float, str]:
    """``rlhfkit <args>`` (`cli.main`) in a fresh interpreter: its exit code, whether it
    imported torch, the seconds it took and its log (stderr)."""
    script = (
        "import sys, time; from rlhfkit.cli import main; started = time.perf_counter(); "
        f"code = main({args!r}); "
        "print(code, 'torch' in sys.modules, time.perf_counter() - started)"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    code, torch_loaded, seconds = done.stdout.split()[-3:]
    return int(code), torch_loaded == "True", float(seconds), done.stderr
