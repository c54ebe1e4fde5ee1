#!/usr/bin/env python
"""Sampling speed of ``rlhfkit.experience.generation.generate`` against a bare KV-cached decode loop.

Workload: the PPO rollout's sampling in the GPU benchmark (``benchmarks/gpu/``): a
GPT-2-124M-shaped model (12 layers x 768, vocabulary 50257, random weights with a fixed
seed: speed depends on shapes), 64 left-padded prompts of 24-48 tokens, 128 new tokens at
temperature 1, fp32 weights under bf16 autocast with SDPA attention (how the rollout runs).
EOS is an id the random model almost never samples and the loop runs until every row
stops, so every variant decodes all 128 steps.

Variants, each timed as the median of ``--repeats`` runs after warm-up runs:

- ``rlhfkit``: ``generate`` as the trainers call it (``cache_implementation="auto"``: on a
  GPU a static cache with each decode step a CUDA graph replay; ``decoding.py``);
- ``rlhfkit-dynamic``: ``generate`` with transformers' growing cache, one launch per kernel;
- ``hf-generate``: transformers' ``model.generate(do_sample=True)``, what TRL calls;
- ``bare``: the floor: a static cache and the whole step (forward, sampling, feeding the
  token back) captured in ONE CUDA graph, no EOS handling and no host synchronisation per
  token (GPU only);
- ``bare-bf16-weights``: the same loop on a bf16 copy of the weights, no per-step casts of
  fp32 weights (what a separate inference copy of the policy would gain; GPU only).

Prints seconds per call, generated tokens per second, milliseconds per decode step, peak GPU
memory and each variant's time over the bare loop's, then the command.

    python benchmarks/bench_generation.py                 # on a GPU
    python benchmarks/bench_generation.py --smoke         # a tiny model, on any machine

``--model DIR`` takes any causal LM saved on disk instead (the GPU benchmark's 0.5B-class
assets, ``benchmarks/gpu/workloads.py``), with ``--prompt-tokens 48,48 --batch 128
--new-tokens 256`` for GRPO's sampling there; ``--variants`` picks which to time. On a CPU the
bare loop runs its steps one by one, without the graph (for tests).
"""

from __future__ import annotations

import argparse
import copy
import json
import shlex
import statistics
import sys
import time

import torch
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, StaticCache

from rlhfkit.data import pad
from rlhfkit.experience.generation import SamplingConfig, generate
from rlhfkit.runtime.decoding import cache_name


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _prompts(batch: int, vocab: int, lo: int, hi: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(lo, hi + 1, (batch,), generator=g)
    return [torch.randint(1, vocab - 1, (int(n),), generator=g).tolist() for n in lengths]


class BareLoop:
    """Static cache + one CUDA graph per step: forward, multinomial draw, token fed back."""

    def __init__(self, model, query, query_mask, new_tokens: int, temperature: float):
        self.model, self.new_tokens, self.temperature = model, new_tokens, temperature
        self.cache_name = cache_name(model)  # `cache` from transformers 5.24
        self.query, self.query_mask = query, query_mask

    def _mask(self):
        batch, width = self.query_mask.shape
        visible = torch.zeros(batch, 1, 1, width + self.new_tokens, dtype=torch.bool)
        visible = visible.to(self.query.device)
        visible[:, 0, 0, :width] = self.query_mask.bool()
        return visible

    def _step(self):
        self.visible |= self.opening  # the column of the token fed in now
        logits = self.model(
            input_ids=self.token,
            attention_mask=self.visible,
            position_ids=self.position,
            use_cache=True,
            **{self.cache_name: self.cache},
        ).logits[:, -1]
        probs = (logits.float() / self.temperature).softmax(-1)
        # Exponential race (the Gumbel-max trick): a categorical draw without a host sync.
        race = probs / torch.empty_like(probs).exponential_()
        self.token.copy_(race.argmax(-1, keepdim=True))
        self.position.add_(1)
        self.opening.copy_(self.opening.roll(1, -1))

    def __call__(self) -> torch.Tensor:
        with torch.autocast(self.query.device.type, dtype=torch.bfloat16, cache_enabled=False):
            return self._run()

    def _run(self) -> torch.Tensor:
        query, mask = self.query, self.query_mask
        width = query.shape[1]
        self.cache = StaticCache(config=self.model.config, max_cache_len=width + self.new_tokens)
        self.visible = self._mask()
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        causal = torch.ones(width, width, dtype=torch.bool, device=query.device).tril()
        prefill_mask = (self.visible[..., :width] & causal) | torch.eye(
            width, dtype=torch.bool, device=query.device
        )
        prefill_mask = torch.nn.functional.pad(prefill_mask, (0, self.new_tokens))
        logits = self.model(
            input_ids=query,
            attention_mask=prefill_mask,
            position_ids=positions,
            use_cache=True,
            **{self.cache_name: self.cache},
            logits_to_keep=1,
        ).logits[:, -1]
        self.token = torch.multinomial((logits.float() / self.temperature).softmax(-1), 1)
        self.position = positions[:, -1:] + 1
        self.opening = torch.zeros_like(self.visible)
        self.opening[..., width] = True
        tokens = [self.token.clone()]
        if self.query.device.type != "cuda":  # no graph: the same steps, one by one
            for _ in range(self.new_tokens - 1):
                self._step()
                tokens.append(self.token.clone())
            return torch.cat(tokens, 1)
        saved = [t.clone() for t in (self.token, self.position, self.opening)]
        lengths = [layer.cumulative_length.clone() for layer in self.cache.layers]
        graph = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()  # one warm-up step on a side stream, then undone
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._step()
        torch.cuda.current_stream().wait_stream(side)
        for tensor, value in zip((self.token, self.position, self.opening), saved, strict=True):
            tensor.copy_(value)
        for layer, length in zip(self.cache.layers, lengths, strict=True):
            layer.cumulative_length.copy_(length)
        with torch.cuda.graph(graph):
            self._step()
        for _ in range(self.new_tokens - 1):
            graph.replay()
            tokens.append(self.token.clone())
        return torch.cat(tokens, 1)


def _time(fn, device, warmup: int, repeats: int) -> list[float]:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        _sync(device)
        started = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - started)
    return times


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a causal LM's folder (default: GPT-2-124M's shape)")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--prompt-tokens", default="24,48", help="LO,HI prompt lengths")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated")
    parser.add_argument("--smoke", action="store_true", help="a 2-layer model, 2 runs, any device")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    unknown = set(args.variants.split(",")) - set(VARIANTS)
    if unknown:
        parser.error(f"unknown --variants {sorted(unknown)}; choose from {', '.join(VARIANTS)}")
    if args.smoke:
        args.batch, args.new_tokens, args.repeats, args.warmup = 4, 8, 2, 1
    return args


def _model(args):
    """The model to sample from: ``--model``, or GPT-2's shape with random weights."""
    if args.model:
        return AutoModelForCausalLM.from_pretrained(args.model, attn_implementation="sdpa")
    config = GPT2Config(attn_implementation="sdpa")
    if args.smoke:
        config = GPT2Config(
            n_layer=2, n_head=2, n_embd=64, vocab_size=512, attn_implementation="sdpa"
        )
    torch.manual_seed(0)
    return GPT2LMHeadModel(config)


PAD_ID = 0
VARIANTS = ("rlhfkit", "rlhfkit-dynamic", "hf-generate", "bare", "bare-bf16-weights")


def _variants(args, model, query, query_mask) -> dict:
    """The samplers ``--variants`` names, each a function of no arguments."""
    device = query.device
    eos, pad_id = model.config.vocab_size - 1, PAD_ID  # a random model samples vocab-1 w.p. ~1/V
    autocast = torch.autocast(device.type, dtype=torch.bfloat16)

    def ours(cache: str):
        sampling = SamplingConfig(args.new_tokens, cache_implementation=cache)
        generator = torch.Generator(device).manual_seed(0)

        def run():
            with autocast:
                generate(
                    model, query, query_mask, sampling,
                    eos_token_id=eos, pad_token_id=pad_id, generator=generator,
                )  # fmt: skip

        return run

    def hf_generate():
        with autocast:
            model.generate(
                input_ids=query,
                attention_mask=query_mask,
                do_sample=True,
                max_new_tokens=args.new_tokens,
                min_new_tokens=args.new_tokens,
                eos_token_id=eos,
                pad_token_id=pad_id,
                top_k=0,
            )

    def bare_bf16():
        bf16 = copy.deepcopy(model).to(torch.bfloat16)
        return BareLoop(bf16, query, query_mask, args.new_tokens, 1.0)

    makers = {
        "rlhfkit": lambda: ours("auto"),
        "rlhfkit-dynamic": lambda: ours("dynamic"),
        "hf-generate": lambda: hf_generate,
        "bare": lambda: BareLoop(model, query, query_mask, args.new_tokens, 1.0),
        "bare-bf16-weights": bare_bf16,
    }
    return {name: makers[name]() for name in args.variants.split(",")}


def _measure(fn, args, device: torch.device) -> dict:
    """Median seconds of ``fn`` over ``--repeats`` runs after ``--warmup``, and what follows."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = _time(fn, device, args.warmup, args.repeats)
    seconds = statistics.median(times)
    return {
        "seconds": seconds,
        "spread": [min(times), max(times)],
        "tokens_per_s": args.batch * args.new_tokens / seconds,
        "ms_per_step": 1000 * seconds / args.new_tokens,
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None,
    }


def _print_table(results: dict, heading: str) -> None:
    floor = results.get("bare", next(iter(results.values())))["seconds"]
    print(heading)
    print(
        f"{'variant':<16} {'s/call':>8} {'tok/s':>10} {'ms/step':>8} {'peak GiB':>9} {'x bare':>7}"
    )
    for name, r in results.items():
        peak = f"{r['peak_gib']:.2f}" if r["peak_gib"] is not None else "-"
        print(
            f"{name:<16} {r['seconds']:8.3f} {r['tokens_per_s']:10.0f} {r['ms_per_step']:8.2f}"
            f" {peak:>9} {r['seconds'] / floor:7.2f}"
        )


def main(argv: list[str] | None = None) -> None:
    args = _arguments(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = _model(args).to(device).eval()
    lo, hi = (int(n) for n in args.prompt_tokens.split(","))
    prompts = _prompts(args.batch, model.config.vocab_size, lo, hi)
    query, query_mask = (x.to(device) for x in pad(prompts, PAD_ID, side="left"))
    variants = _variants(args, model, query, query_mask)
    results = {name: _measure(fn, args, device) for name, fn in variants.items()}
    params = sum(p.numel() for p in model.parameters())
    device_name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    _print_table(
        results,
        f"device: {device_name}; torch {torch.__version__}; {model.config.model_type}"
        f" {params / 1e6:.1f}M parameters; batch {args.batch} x {args.new_tokens} new tokens"
        f" after {args.prompt_tokens} prompt tokens",
    )
    command = shlex.join([sys.executable, *sys.argv])
    print(f"command: {command}")
    record = {
        "device": device_name,
        "model": args.model or "gpt2-124m-shape",
        "params": params,
        "batch": args.batch,
        "prompt_tokens": args.prompt_tokens,
        "new_tokens": args.new_tokens,
        "variants": results,
    }
    print("RESULT " + json.dumps(record))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record | {"command": command}, f, indent=1)


if __name__ == "__main__":
    main()
