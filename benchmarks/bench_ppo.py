#!/usr/bin/env python
"""Seconds per PPO iteration on the issue's fixed workload, next to TRL 1.12's PPOTrainer.

Workload (the same as ``benchmarks/trl/trl_ppo_bench.py --reward rm``): a GPT-2 with 4 layers,
4 heads, width 256, 256 positions, 4096-token vocabulary; 32 prompts x 32 new tokens at
temperature 1; 4 PPO epochs x 4 minibatches of 8; a separate critic initialised from the
reward model; frozen reference copy; lr 1e-4, k1 KL penalty 0.05.

Models, in order of preference:
- ``--assets DIR`` from ``benchmarks/trl/make_assets.py`` (``tokenizer/``, ``policy/``, ``reward_model/`` as
  GPT2ForSequenceClassification, ``prompts.jsonl``): the exact models TRL is measured on;
- ``src/rlhfkit/assets/base`` (the bundled pretrained base), with a fresh reward head;
- otherwise untrained models of the same configuration and a 4096-token BPE trained here on
  CPython's own documentation. Speed depends on shapes, not weights; the output says which.

Prints the median seconds per iteration (first iteration excluded), time per phase,
generation tokens/s (batch x new-token slots / seconds inside generation, as the TRL scripts
count them), peak RSS, the CPU used by other processes while it ran (the machine is shared), and
the command line. ``--profile`` prints torch.profiler's top operators for one iteration.

Default setting (the fastest correct one measured): bf16 autocast with fp32 master weights and
fp32 loss math, eager attention (torch's CPU flash-attention backward is slow in bf16), fused
AdamW and the table GELU (``ops.gelu_tanh``; both done by ``RLTrainer``), policy and critic
updated side by side on one core each, and the rollout's passes in two such halves
(``--one-after-the-other`` turns both off), every pass over query + response on its real
tokens only (``--padded`` keeps the padding). ``--bounded-memory`` measures what
``rlhfkit --bounded-memory`` does (a lower peak RSS, some speed). On a busy machine use
``--threads 1``: two OpenMP threads that get descheduled wait on each other (10x slower).

    .venv/bin/python benchmarks/trl/make_assets.py      # once: runs/trl-assets
    .venv/bin/python benchmarks/bench_ppo.py --assets runs/trl-assets   # bf16, eager
    .venv/bin/python benchmarks/bench_ppo.py --assets runs/trl-assets --fp32

TRL's PPOTrainer on the same workload (TRL 1.12, the last release with PPO; ``make trl``)::

    .venv-trl-ppo/bin/python benchmarks/trl/trl_ppo_bench.py --reward rm \\
        --assets runs/trl-assets --iters 8 --eval-prompts 16
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch  # noqa: E402
from common import MachineLoad, peak_rss_mib, scored_head_from_seqcls  # noqa: E402
from transformers import (  # noqa: E402
    GPT2Config,
    GPT2LMHeadModel,
    PreTrainedTokenizerFast,
)

from rlhfkit.experience.scorers import RewardModelScorer  # noqa: E402
from rlhfkit.models.loading import RewardModel, ValueModel, load_causal_lm, load_tokenizer  # noqa: E402
from rlhfkit.runtime.allocator import bound_held_memory  # noqa: E402
from rlhfkit.trainers.rl import RLTrainer  # noqa: E402
from rlhfkit.trainers.rl_config import RLConfig  # noqa: E402

BASE_ASSET = Path(__file__).resolve().parents[1] / "src" / "rlhfkit" / "assets" / "base"


def _prompt_texts(path: Path | None, n: int) -> list[str]:
    if path is not None and path.is_file():
        return [json.loads(line)["prompt"] for line in path.read_text().splitlines()][:n]
    import pydoc_data.topics

    words = " ".join(pydoc_data.topics.topics.values()).split()
    return [" ".join(words[i * 7 : i * 7 + 4 + i % 5]) for i in range(n)]


def _untrained(vocab_size: int = 4096):
    """A 4096-token byte-level BPE on CPython's docs and fresh models of the bench config."""
    import pydoc_data.topics

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>", "<|pad|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(pydoc_data.topics.topics.values(), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|pad|>", padding_side="left"
    )
    config = GPT2Config(
        n_layer=4,
        n_head=4,
        n_embd=256,
        n_positions=256,
        vocab_size=len(tokenizer),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    torch.manual_seed(0)
    policy = GPT2LMHeadModel(config)
    reference = GPT2LMHeadModel(config)
    reference.load_state_dict(policy.state_dict())
    reward_model = RewardModel(GPT2LMHeadModel(config).transformer)
    critic = ValueModel(GPT2LMHeadModel(config).transformer)
    critic.load_state_dict(reward_model.state_dict())
    return tokenizer, policy, reference, critic, reward_model


def load_models(assets: Path | None):
    """(description, tokenizer, policy, reference, critic, reward model, prompts file)."""
    if assets is not None:
        tokenizer = load_tokenizer(assets / "tokenizer", padding_side="left")
        policy = load_causal_lm(assets / "policy", tokenizer=tokenizer)
        reference = load_causal_lm(assets / "policy", tokenizer=tokenizer)
        critic = scored_head_from_seqcls(assets / "reward_model", ValueModel)
        reward_model = scored_head_from_seqcls(assets / "reward_model", RewardModel)
        parts = (tokenizer, policy, reference, critic, reward_model)
        return (
            f"TRL bench assets {assets} (the models TRL runs on)",
            *parts,
            assets / "prompts.jsonl",
        )
    if (BASE_ASSET / "config.json").is_file():
        tokenizer = load_tokenizer(BASE_ASSET, padding_side="left")
        policy = load_causal_lm(BASE_ASSET, tokenizer=tokenizer)
        reference = load_causal_lm(BASE_ASSET, tokenizer=tokenizer)
        critic = ValueModel.from_pretrained(BASE_ASSET)
        reward_model = RewardModel(ValueModel.from_pretrained(BASE_ASSET).backbone)
        parts = (tokenizer, policy, reference, critic, reward_model)
        return f"bundled base model {BASE_ASSET} (fresh reward head)", *parts, None
    return "UNTRAINED models of the bench config (no assets found)", *_untrained(), None


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--assets", type=Path, default=None, help="benchmarks/trl/make_assets.py's output"
    )
    ap.add_argument("--iters", type=int, default=8, help="PPO iterations (the first is excluded)")
    ap.add_argument(
        "--fp32", action="store_true", help="no bf16 autocast (default: bf16, fp32 weights/losses)"
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--profile", action="store_true", help="profile iteration 2 with torch.profiler"
    )
    ap.add_argument(
        "--attn",
        choices=["eager", "sdpa"],
        default=None,
        help="attention kernel (default: RLConfig's choice, eager with bf16 on CPU)",
    )
    ap.add_argument(
        "--one-after-the-other",
        action="store_true",
        help="models take turns in the rollout's passes and the update (default: side by side)",
    )
    ap.add_argument(
        "--padded",
        action="store_true",
        help="passes over query + response with their padding (default: padding-free)",
    )
    ap.add_argument(
        "--bounded-memory",
        action="store_true",
        help="one malloc arena and a smaller oneDNN kernel cache, as `rlhfkit --bounded-memory`",
    )
    ap.add_argument("--json", type=Path, default=None, help="also write the result here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.bounded_memory:  # before the models load (allocator.bound_held_memory)
        bound_held_memory()

    what, tokenizer, policy, reference, critic, reward_model, prompt_file = load_models(args.assets)
    prompts = [tokenizer(p)["input_ids"] for p in _prompt_texts(prompt_file, 512)]
    config = RLConfig.preset(
        "ppo",
        model="in-memory",
        train_data="in-memory",
        output_dir=tempfile.mkdtemp(prefix="bench_ppo_"),
        reward_model="in-memory",
        max_steps=args.iters,
        rollout_batch_size=32,
        batch_size=8,
        ppo_epochs=4,
        max_new_tokens=32,
        temperature=1.0,
        learning_rate=1e-4,
        lr_scheduler="constant",
        kl_coef=0.05,
        mixed_precision="no" if args.fp32 else "bf16",
        cpu=True,
        seed=42,
        report_to=[],
        attn_implementation=args.attn,
        parallel_critic=False if args.one_after_the_other else None,
        padding_free=not args.padded,
    )
    trainer = RLTrainer(
        config,
        policy,
        tokenizer,
        prompts,
        RewardModelScorer(reward_model.eval().requires_grad_(False)),
        reference=reference,
        critic=critic,
    )
    machine = MachineLoad()
    rows = []
    for it in range(args.iters):
        if args.profile and it == 2:
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CPU]) as prof:
                metrics, _ = trainer.step()
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
        else:
            metrics, _ = trainer.step()
        rows.append(metrics)
        print(
            f"iter {it + 1}: {metrics['time/iteration']:.3f}s (gen {metrics['time/generate']:.3f} "
            f"fwd+score {metrics['time/forward']:.3f} (score {metrics['time/score']:.3f}) "
            f"update {metrics['time/update']:.3f}) score {metrics['score/mean']:.3f} "
            f"kl {metrics['kl/ref']:.3f} approx_kl {metrics['policy/approx_kl']:.4f} "
            f"length {metrics['response/length']:.1f}",
            flush=True,
        )
    after_first = rows[1:]

    def median(key):
        return statistics.median(r[key] for r in after_first)

    result = {
        "models": what,
        "dtype": "fp32" if args.fp32 else "bf16 autocast (fp32 weights, fp32 loss math)",
        "attention": config.attention or "the model's own (sdpa)",
        "threads": args.threads,
        "policy_and_critic": "one after the other" if args.one_after_the_other else "side by side",
        "passes": "padded" if args.padded else "padding-free",
        "iterations": len(rows),
        "sec_per_iter_median": median("time/iteration"),
        "sec_per_iter_min": min(r["time/iteration"] for r in after_first),
        "sec_per_iter_max": max(r["time/iteration"] for r in after_first),
        "first_iter_s": rows[0]["time/iteration"],
        "phase_median_s": {
            k: median(f"time/{k}") for k in ("generate", "forward", "score", "update")
        },
        "gen_tokens_per_s": 32 * 32 / median("time/generate"),
        "peak_rss_mib": peak_rss_mib(),
        "foreign_cores": machine.foreign_cores(),
        "score_first_last": [rows[0]["score/mean"], rows[-1]["score/mean"]],
        "command": " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]),
    }
    print("RESULT " + json.dumps(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
