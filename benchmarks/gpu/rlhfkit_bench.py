#!/usr/bin/env python
"""rlhfkit's trainers on the GPU workloads of ``workloads.py``: seconds per iteration, tokens
per second inside generation, peak CUDA memory and MFU, next to ``trl_bench.py``.

    python benchmarks/gpu/rlhfkit_bench.py --workload ppo --assets DIR --json OUT.json
    python benchmarks/gpu/rlhfkit_bench.py --workload all --smoke      # CPU test, tiny model

Workloads (one iteration each; sizes in ``workloads.FULL``): PPO 64 prompts x 128 new tokens,
4 epochs x 4 minibatches of 16, separate critic initialised from the reward model, frozen
reference; GRPO 16 prompts x 8 generations x 256 new tokens, one optimiser step, digit reward,
k3 KL term (kl_coef 0.04, TRL's beta) against a reference; DPO 16 pairs of 512-token rows;
SFT 16 rows of 512 tokens. The real trainers run: ``RLTrainer.step()`` for PPO, and for GRPO
(``RLTrainer`` too, the grpo preset), DPO and SFT the shared loop's optimiser step (``Trainer.train_step``, the body of ``train()`` without its
checkpoint, final evaluation and plots, which would cost seconds and disk for nothing here).
Each iteration is timed between CUDA synchronisations; the median leaves out the warm-up.

Settings (rlhfkit's fastest correct setting on a GPU): bf16 autocast with fp32 weights, AdamW
state and loss math (``mixed_precision="bf16"``), SDPA attention, fused AdamW, padding-free
passes (the library's default; the prompts here carry no padding, so they mostly change the
attention kernel: ``--padded`` turns them off), TF32 for the remaining fp32 products (both
libraries; ``--no-tf32``). DPO precomputes the reference log-probs before step 1 (the
default; its time is reported as ``init_sec``, not in the step).

Equal lengths: rlhfkit's sampler (``generation.generate``) stops a row at EOS and has no
``min_new_tokens`` / ``ignore_eos`` option, so PPO and GRPO get a copy of the tokenizer whose
EOS is a new token past the model's 50,258 rows: it is never sampled, every response is
exactly ``new_tokens`` long (``response_length_mean`` in the result checks it). Prompts are
all ``prompt_tokens`` long (no padding); DPO and SFT rows are all cut to 512 tokens.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent), str(HERE.parents[1] / "src")]
import workloads as wl  # noqa: E402  (sets the offline variables before transformers loads)
from common import scored_head_from_seqcls  # noqa: E402

NO_EOS_TOKEN = "<|no-eos|>"


def no_eos_tokenizer(path: Path, vocab_rows: int):
    """The tokenizer with EOS moved to a new token past the model's ``vocab_rows`` rows: the
    sampler can never produce it, so no response ends early."""
    from rlhfkit.models.loading import load_tokenizer

    tokenizer = load_tokenizer(path, padding_side="left")
    tokenizer.add_special_tokens({"eos_token": NO_EOS_TOKEN})
    if tokenizer.eos_token_id < vocab_rows or tokenizer.pad_token_id >= vocab_rows:
        raise RuntimeError(
            f"eos {tokenizer.eos_token_id} / pad {tokenizer.pad_token_id} vs {vocab_rows} rows"
        )
    return tokenizer


def as_sampled_scorer(reward_model):
    """The reward model scoring each response as it was sampled. rlhfkit appends EOS to a
    response cut at the token limit before scoring it; every response here is cut, its EOS
    past the model's rows, and TRL (``stop_token=None``) scores them as they are."""
    import dataclasses

    from rlhfkit.experience.scorers import RewardModelScorer

    class AsSampled(RewardModelScorer):
        def score(self, batch):
            return super().score(dataclasses.replace(batch, eos_token_id=None))

    return AsSampled(reward_model)


def admit_no_eos_token() -> None:
    """Let the rollout take the no-EOS tokenizer: its check refuses a tokenizer with ids past
    the model's rows, and here the one such id is the EOS that is never sampled nor fed."""
    import rlhfkit.experience.rollout

    rlhfkit.experience.rollout.check_vocabulary = lambda model, tokenizer, role: None


def common_fields(w: wl.Workload, args, out: str) -> dict:
    import torch

    return {
        "output_dir": out,
        "learning_rate": w.learning_rate,
        "lr_scheduler": "constant",
        "mixed_precision": "bf16",
        "attn_implementation": "sdpa",
        "cpu": not torch.cuda.is_available(),
        "seed": 42,
        "report_to": [],
    }


def timed_steps(step, count: int) -> list[float]:
    """Seconds of each of ``count`` calls of ``step``, between CUDA synchronisations."""
    times = []
    for i in range(count):
        wl.sync()
        started = time.perf_counter()
        step()
        wl.sync()
        times.append(time.perf_counter() - started)
        print(f"  iteration {i + 1}/{count}: {times[-1]:.3f} s", flush=True)
    return times


def response_length(output, args, kwargs) -> float:
    return output.response_mask.sum(1).float().mean().item()


# ----------------------------------------------------------------------------- workloads
def run_ppo(w: wl.Workload, assets: Path, args, out: str):
    import rlhfkit.experience.rollout
    from rlhfkit.models.loading import RewardModel, ValueModel, load_causal_lm
    from rlhfkit.trainers.rl import RLTrainer
    from rlhfkit.trainers.rl_config import RLConfig

    policy = load_causal_lm(assets / "policy")
    reference = load_causal_lm(assets / "policy")
    tokenizer = no_eos_tokenizer(assets / "tokenizer", policy.config.vocab_size)
    admit_no_eos_token()
    critic = scored_head_from_seqcls(assets / "reward_model", ValueModel)
    reward_model = (
        scored_head_from_seqcls(assets / "reward_model", RewardModel).eval().requires_grad_(False)
    )
    prompts = [r["input_ids"] for r in wl.read_jsonl(assets / "prompts.jsonl")]
    config = RLConfig.preset(
        "ppo",
        model="in-memory",
        train_data="in-memory",
        reward_model="in-memory",
        eval_data=None,
        max_steps=w.iterations,
        rollout_batch_size=w.batch,
        batch_size=w.minibatch_size,
        ppo_epochs=w.epochs,
        max_new_tokens=w.new_tokens,
        temperature=1.0,
        kl_coef=0.05,
        padding_free=not args.padded,
        **common_fields(w, args, out),
    )
    started = time.perf_counter()
    trainer = RLTrainer(
        config,
        policy,
        tokenizer,
        prompts,
        as_sampled_scorer(reward_model),
        reference=reference,
        critic=critic,
    )
    init = time.perf_counter() - started
    timer = wl.GenerationTimer(rlhfkit.experience.rollout.generate, response_length)
    rlhfkit.experience.rollout.generate = timer
    rows = []
    times = timed_steps(lambda: rows.append(trainer.step()[0]), w.iterations)
    extra = {
        "init_sec": init,
        "phases_sec_last": {k: rows[-1][f"time/{k}"] for k in ("generate", "forward", "update")},
        "library_response_length": rows[-1]["response/length"],
        "parallel_critic": trainer.runtime.side_by_side,
    }
    return times, timer, extra, config


def run_grpo(w: wl.Workload, assets: Path, args, out: str):
    from accelerate.utils import set_seed

    import rlhfkit.experience.rollout
    from rlhfkit.experience.scorers import FunctionScorer
    from rlhfkit.models.loading import load_causal_lm
    from rlhfkit.trainers.rl import RLTrainer
    from rlhfkit.trainers.rl_config import RLConfig

    policy = load_causal_lm(assets / "policy")
    reference = load_causal_lm(assets / "policy")
    tokenizer = no_eos_tokenizer(assets / "tokenizer", policy.config.vocab_size)
    admit_no_eos_token()
    prompts = [r["input_ids"] for r in wl.read_jsonl(assets / "prompts.jsonl")]
    config = RLConfig.preset(
        "grpo",
        model="in-memory",
        train_data="in-memory",
        reward_functions=["workloads:digit_reward"],  # the scorer below is this function
        eval_data=None,
        rollout_batch_size=w.batch,
        num_generations=w.generations,
        batch_size=w.batch * w.generations,  # one optimiser step an iteration
        max_new_tokens=w.new_tokens,
        max_steps=w.iterations,
        temperature=1.0,
        kl_coef=0.04,
        log_every=1,
        sample_every=10**6,
        resume=False,
        padding_free=not args.padded,
        **common_fields(w, args, out),
    )
    scorer = FunctionScorer(lambda prompts, responses: wl.digit_reward(responses), name="digits")
    started = time.perf_counter()
    trainer = RLTrainer(config, policy, tokenizer, prompts, scorer, reference=reference)
    init = time.perf_counter() - started
    timer = wl.GenerationTimer(rlhfkit.experience.rollout.generate, response_length)
    rlhfkit.experience.rollout.generate = timer
    set_seed(config.seed)
    trainer.model.train()
    rows = []
    times = timed_steps(lambda: rows.append(trainer.train_step()), w.iterations)
    extra = {"init_sec": init, "library_response_length": rows[-1]["response/length"]}
    return times, timer, extra, config


def run_dpo(w: wl.Workload, assets: Path, args, out: str):
    from accelerate.utils import set_seed

    from rlhfkit.models.loading import load_causal_lm, load_tokenizer
    from rlhfkit.trainers.dpo import DPOTrainer, load_pairs
    from rlhfkit.trainers.dpo_config import DPOConfig

    tokenizer = load_tokenizer(assets / "tokenizer")
    policy = load_causal_lm(assets / "policy", tokenizer=tokenizer)
    # max_steps one more than the steps run: the precompute then covers every pair of
    # pairs.jsonl ((iterations + 1) x batch), the same pairs TRL precomputes.
    config = DPOConfig(
        model="in-memory",
        train_data=str(assets / "pairs.jsonl"),
        eval_data=None,
        batch_size=w.batch,
        max_steps=w.iterations + 1,
        max_length=w.seq_len,
        beta=0.1,
        precompute_reference=True,
        eval_batch_size=2 * w.batch,  # pairs per precompute batch (TRL: precompute_ref_batch_size)
        resume=False,
        **common_fields(w, args, out),
    )
    pairs = load_pairs(config, config.train_data, "train", tokenizer, None)
    started = time.perf_counter()
    trainer = DPOTrainer(config, policy, tokenizer, pairs)
    wl.sync()
    init = time.perf_counter() - started
    set_seed(config.seed)
    trainer.model.train()
    rows = []
    times = timed_steps(lambda: rows.append(trainer.train_step()), w.iterations)
    lengths = [len(p.example.prompt_ids) + len(r) for p in pairs for r in p.example.response_ids]
    extra = {
        "init_sec": init,
        "row_tokens_min_max": [min(lengths), max(lengths)],
        "loss_first_last": [rows[0]["loss"], rows[-1]["loss"]],
    }
    return times, None, extra, config


def run_sft(w: wl.Workload, assets: Path, args, out: str):
    from accelerate.utils import set_seed

    from rlhfkit.config import SFTConfig
    from rlhfkit.models.loading import load_causal_lm, load_tokenizer
    from rlhfkit.trainers.sft import SFTTrainer, load_demonstrations

    tokenizer = load_tokenizer(assets / "tokenizer")
    policy = load_causal_lm(assets / "policy", tokenizer=tokenizer)
    config = SFTConfig(
        model="in-memory",
        train_data=str(assets / "sft.jsonl"),
        columns={"response": "completion"},
        eval_data=None,
        batch_size=w.batch,
        max_steps=w.iterations,
        max_length=w.seq_len,
        resume=False,
        **common_fields(w, args, out),
    )
    examples = load_demonstrations(config.train_data, tokenizer, config, "train", None)
    started = time.perf_counter()
    trainer = SFTTrainer(config, policy, tokenizer, examples)
    init = time.perf_counter() - started
    set_seed(config.seed)
    trainer.model.train()
    rows = []
    times = timed_steps(lambda: rows.append(trainer.train_step()), w.iterations)
    lengths = [len(e.input_ids) for e in examples]
    extra = {
        "init_sec": init,
        "row_tokens_min_max": [min(lengths), max(lengths)],
        "loss_first_last": [rows[0]["loss"], rows[-1]["loss"]],
    }
    return times, None, extra, config


RUNS = {"ppo": run_ppo, "grpo": run_grpo, "dpo": run_dpo, "sft": run_sft}


def bench(name: str, args) -> dict:
    import accelerate
    import torch
    import transformers

    import rlhfkit

    wl.setup_torch(not args.no_tf32)
    assets = wl.assets_for(args.assets, args.smoke, args.shape)
    manifest = wl.read_manifest(assets)
    w = wl.workload(name, manifest)
    print(f"rlhfkit {name}: {w} on {wl.device_info()['name']}", flush=True)
    with tempfile.TemporaryDirectory(prefix=f"rlhfkit-{name}-") as out:
        times, timer, extra, config = RUNS[name](w, assets, args, out)
    settings = {
        "precision": "bf16 autocast, fp32 weights / AdamW / loss math",
        "attention": config.attention,
        "padding_free": getattr(config, "padding_free", None),
        "tf32": not args.no_tf32,
        "optimizer": "torch AdamW fused",
        "versions": {
            "rlhfkit": rlhfkit.__version__,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "accelerate": accelerate.__version__,
        },
    }
    result = wl.summarize_run(
        "rlhfkit",
        w,
        times,
        timer.seconds if timer else [],
        timer.lengths if timer else [],
        manifest,
        {"settings": settings, **extra},
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workload", choices=[*wl.WORKLOADS, "all"], required=True)
    parser.add_argument("--smoke", action="store_true", help="tiny model, 3 iterations (CPU)")
    parser.add_argument("--shape", choices=wl.SHAPES, default="gpt2", help="the models' shape")
    parser.add_argument("--assets", type=Path, default=None, help="workloads.py --prepare DIR")
    parser.add_argument("--json", type=Path, default=None, help="also write the result(s) here")
    parser.add_argument("--padded", action="store_true", help="PPO/GRPO: no padding-free passes")
    parser.add_argument("--no-tf32", action="store_true", help="full fp32 for fp32 products")
    args = parser.parse_args()
    if args.workload != "all":
        result = bench(args.workload, args)
        wl.emit(result, args.json)
        print(wl.table([result]))
        return
    # Each workload in its own process: clean peak-memory counters, no state carried over.
    assets = wl.assets_for(args.assets, args.smoke, args.shape)
    results = []
    for name in wl.WORKLOADS:
        cmd = [sys.executable, __file__, "--workload", name, "--assets", str(assets)]
        cmd += (
            ["--shape", args.shape]
            + ["--smoke"] * args.smoke
            + ["--padded"] * args.padded
            + ["--no-tf32"] * args.no_tf32
        )
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=False)
        print(proc.stdout, end="", flush=True)
        lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
        if proc.returncode or not lines:
            print(f"rlhfkit {name} FAILED (exit {proc.returncode})", flush=True)
            continue
        results.append(json.loads(lines[-1][len("RESULT ") :]))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    print(wl.table(results))


if __name__ == "__main__":
    main()
