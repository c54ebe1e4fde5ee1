#!/usr/bin/env python
"""TRL 1.16 on the real-model workload of ``benchmarks/bench_smollm2.py``: GRPO or DPO with
LoRA on SmolLM2-135M-Instruct (the instructions task's SFT model), on the CPU.

Measured: seconds per trainer step (median over the steps after the first, from
``trl_common``'s step timer), the first step, the set-up before it (model, data, trainer),
the peak RSS of the process and the CPU other processes used meanwhile. One ``RESULT {json}``
line; ``--json FILE`` also saves it.

Workloads, the same as rlhfkit's in ``bench_smollm2.py``:

- ``--algo grpo``: ``trl.GRPOTrainer``, 8 prompts x 4 completions x at most 48 new tokens a
  step at temperature 0.7 (top-k and top-p off), one optimiser step per generation, beta 0.04
  (the reference is the model with its adapter off), DAPO's token-mean loss, group-scaled
  rewards, the plain k3 gradient (``use_bias_correction_kl=False``, as rlhfkit's default), lr
  1e-5 decaying linearly. Prompts: the instructions task's ``prompts/train.jsonl``, each one
  user message (TRL applies the chat template, as rlhfkit does).
- ``--algo dpo``: ``trl.DPOTrainer``, 8 pairs a step of the task's ``comparisons/train.jsonl``
  (conversational: one user message, one assistant answer each), ``max_length=192``, beta
  0.1, sigmoid loss, lr 5e-5 constant; the reference is the model with its adapter off, run
  every step (TRL's default; rlhfkit precomputes it for the pairs its run visits).

Both: LoRA rank 8, alpha 16, no dropout, on peft's Llama defaults (``q_proj``, ``v_proj``),
rlhfkit's LoRA defaults; ``bf16=True`` (autocast over fp32 weights), SDPA attention,
``gradient_checkpointing=False`` (rlhfkit's setting and TRL's faster one), seed 0. The data
come in rlhfkit's order: the permutation its loop draws for epoch 0 of seed ``--seed``
(``numpy.random.default_rng([seed, 0])``), then read sequentially, so both libraries see the
same prompts and pairs at every step.

GRPO's reward is the instructions checker, ``rlhfkit.tasks.REWARD_FUNCTIONS["instructions"]``:
a pure-Python function of (prompts, responses), the one thing this script imports from
rlhfkit (``make trl`` installs rlhfkit in ``.venv-trl``). It gets the user message and the
completion's text.

    .venv-trl/bin/python benchmarks/trl/trl_smollm2_bench.py --algo grpo --steps 6
    .venv-trl/bin/python benchmarks/trl/trl_smollm2_bench.py --algo dpo --steps 12

``bench_smollm2.py --trl-python .venv-trl/bin/python`` runs this beside rlhfkit and prints the
ratio.
"""

import argparse
import time

import numpy as np
import torch
import trl_common as pc  # before datasets and transformers: it sets the offline variables
from datasets import Dataset
from peft import LoraConfig
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlhfkit.tasks import REWARD_FUNCTIONS

DATA = pc.REPO / "src" / "rlhfkit" / "assets" / "data" / "instructions"
MODEL = pc.REPO / "runs" / "instructions_smollm2" / "sft" / "final"


def rlhfkit_order(rows: list[dict], seed: int) -> list[dict]:
    """``rows`` in the order of rlhfkit's first pass over them with ``seed``
    (``trainers/loop.py``'s ``epoch_order``)."""
    return [rows[i] for i in np.random.default_rng([seed, 0]).permutation(len(rows))]


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def assistant(text: str) -> list[dict]:
    return [{"role": "assistant", "content": text}]


def instructions_reward(prompts, completions, **kwargs):
    """The instructions checker on the user message and the completion's text."""
    return REWARD_FUNCTIONS["instructions"](
        [p[-1]["content"] for p in prompts], [c[0]["content"] for c in completions]
    )


def trainer_args(args) -> dict:
    """``trl_common.cpu_args`` in bf16 autocast, as rlhfkit's side of the bench runs."""
    return {
        **pc.cpu_args(args),
        "output_dir": args.out_dir,
        "max_steps": args.steps,
        "gradient_accumulation_steps": 1,
        "bf16": True,
        "gradient_checkpointing": False,
    }


def grpo_trainer(args, model, tok, lora):
    from trl import GRPOConfig, GRPOTrainer

    rows = rlhfkit_order(pc.load_jsonl(DATA / "prompts" / "train.jsonl"), args.seed)
    cfg = GRPOConfig(
        **trainer_args(args),
        per_device_train_batch_size=8 * 4,  # completions: 8 prompts x num_generations
        num_generations=4,
        steps_per_generation=1,
        num_iterations=1,
        max_completion_length=48,
        temperature=0.7,
        top_k=0,
        top_p=1.0,
        learning_rate=1e-5,
        lr_scheduler_type="linear",
        beta=0.04,
        loss_type="dapo",
        scale_rewards="group",
        use_bias_correction_kl=False,
        shuffle_dataset=False,
        disable_dropout=True,
    )
    return GRPOTrainer(
        model=model,
        reward_funcs=instructions_reward,
        args=cfg,
        train_dataset=Dataset.from_dict({"prompt": [user(r["prompt"]) for r in rows]}),
        processing_class=tok,
        peft_config=lora,
    )


def dpo_trainer(args, model, tok, lora):
    from trl import DPOConfig, DPOTrainer

    rows = rlhfkit_order(pc.load_jsonl(DATA / "comparisons" / "train.jsonl"), args.seed)
    cfg = DPOConfig(
        **trainer_args(args),
        per_device_train_batch_size=8,
        max_length=192,
        beta=0.1,
        learning_rate=5e-5,
        lr_scheduler_type="constant",
        train_sampling_strategy="sequential",
    )
    data = {
        "prompt": [user(r["prompt"]) for r in rows],
        "chosen": [assistant(r["chosen"]) for r in rows],
        "rejected": [assistant(r["rejected"]) for r in rows],
    }
    return DPOTrainer(
        model=model,
        args=cfg,
        train_dataset=Dataset.from_dict(data),
        processing_class=tok,
        peft_config=lora,
    )


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--algo", choices=["grpo", "dpo"], default="grpo")
    ap.add_argument("--model", default=str(MODEL), help="the policy (and its tokenizer)")
    ap.add_argument("--steps", type=int, default=None, help="trainer steps (GRPO 6, DPO 12)")
    ap.add_argument("--seed", type=int, default=0)
    pc.add_output_args(ap, None)  # default: runs/trl-out/smollm2_ALGO
    args = ap.parse_args()
    args.steps = args.steps or {"grpo": 6, "dpo": 12}[args.algo]
    args.out_dir = args.out_dir or str(pc.OUT_ROOT / f"smollm2_{args.algo}")

    meter = pc.ContentionMeter()
    started = time.perf_counter()
    torch.manual_seed(args.seed)
    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(
        args.model, dtype=torch.float32, attn_implementation="sdpa"
    )
    lora = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, task_type="CAUSAL_LM")
    build = grpo_trainer if args.algo == "grpo" else dpo_trainer
    trainer = build(args, model, tok, lora)
    timer, train_s, contention = pc.timed_train(trainer, meter)
    steps = timer.step_times()
    res = {
        "bench": f"trl_smollm2_{args.algo}",
        "trainer": f"trl.{type(trainer).__name__}",
        "config": dict(vars(args)),
        "steps": len(steps),
        "step_seconds": steps,
        "sec_per_step_median": pc.stats(steps[1:])["median"],
        "first_step_s": steps[0],
        "setup_s": timer.t_begin - started,
        "train_s": train_s,
        "completion_length": pc.stats(timer.series("completions/mean_length")).get("mean"),
        "losses": timer.series("loss"),
        "contention": contention,
        "peak_rss_mib": pc.peak_rss_mib(),
    }
    print(
        f"[smollm2 {args.algo}] {res['steps']} steps; sec/step median "
        f"{res['sec_per_step_median']:.2f} (first {res['first_step_s']:.2f}, set-up "
        f"{res['setup_s']:.1f} s); peak RSS {res['peak_rss_mib']:.0f} MiB; foreign cores "
        f"{contention['foreign_cores']:.2f}",
        flush=True,
    )
    pc.emit(res, args.json)


if __name__ == "__main__":
    main()
