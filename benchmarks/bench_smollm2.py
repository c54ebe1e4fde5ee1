#!/usr/bin/env python
"""Seconds per PPO iteration and per GRPO step on a real model, phase by phase: SmolLM2-135M-
Instruct (30 layers x 576, vocabulary 49152) on the instructions task's prompts, on the CPU.

Workloads (the shapes a new user tries first on this model):
- ``ppo``: 16 prompts x 48 new tokens a rollout, one PPO epoch in 2 minibatches of 8, the
  policy and the critic LoRA adapters (rank 8) with the reference as the policy with its
  adapter off; scored by a reward model, which also starts the critic (InstructGPT).
- ``ppo-full``: the same with full fine-tuning (a separate frozen reference copy).
- ``sampling``: sampling alone (16 prompts x 48 tokens), from the policy's weights in fp32
  under bf16 autocast, with LoRA adapters, as a bf16 copy, and as a bf16 copy with the
  adapters folded in.
- ``grpo``: 8 prompts x 4 responses x 48 new tokens a step, LoRA, the checker of the
  instructions task as the reward.

Each runs ``--steps`` iterations from the SFT model in bf16 autocast (fp32 weights) with SDPA
attention. Prints the median over the iterations after the first of each phase the trainers
log (``time/generate``, ``time/forward`` (the policy, reference and critic passes and the
scorer), ``time/score``, ``time/update``), the whole iteration, the peak RSS of the process so
far (one workload per run for its own), the CPU the machine's other processes used meanwhile
(the machine is shared) and the command.

    make smollm2   # runs/models/SmolLM2-135M-Instruct
    .venv/bin/python benchmarks/bench_smollm2.py --workloads ppo ppo-full grpo \\
        --model runs/instructions_smollm2/sft/final \\
        --reward_model runs/instructions_smollm2/reward/final
"""

from __future__ import annotations

import argparse
import copy
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import MachineLoad, peak_rss_mib  # noqa: E402

from rlhfkit.data import encode_prompts, load_records, pad  # noqa: E402
from rlhfkit.experience.generation import SamplingConfig, generate  # noqa: E402
from rlhfkit.models.loading import load_causal_lm, load_tokenizer  # noqa: E402
from rlhfkit.models.lora import add_lora, merged_copy  # noqa: E402
from rlhfkit.tasks import INSTRUCTIONS_DATA_DIR  # noqa: E402
from rlhfkit.tracking import read_jsonl  # noqa: E402
from rlhfkit.trainers.grpo import run_grpo  # noqa: E402
from rlhfkit.trainers.grpo_config import GRPOConfig  # noqa: E402
from rlhfkit.trainers.ppo import run_ppo  # noqa: E402
from rlhfkit.trainers.ppo_config import PPOConfig  # noqa: E402

PROMPTS = str(INSTRUCTIONS_DATA_DIR / "prompts")
COMMON = dict(
    train_data=PROMPTS, max_new_tokens=48, temperature=0.7, learning_rate=1e-5,
    mixed_precision="bf16", attn_implementation="sdpa", report_to=[], resume=False,
    save_every=0, seed=0, cpu=True,
)  # fmt: skip


def ppo(args, out: Path, lora: bool) -> None:
    run_ppo(
        PPOConfig(
            model=args.model,
            reward_model=args.reward_model,
            output_dir=str(out),
            max_steps=args.steps,
            rollout_batch_size=16,
            batch_size=8,
            ppo_epochs=1,
            lora=lora,
            **COMMON,
        )  # fmt: skip
    )


def grpo(args, out: Path) -> None:
    run_grpo(
        GRPOConfig(
            model=args.model,
            reward_model=None,
            reward_functions=["instructions"],
            output_dir=str(out),
            max_steps=args.steps,
            batch_size=8,
            num_generations=4,
            eval_data=None,
            lora=True,
            log_every=1,
            **COMMON,
        )  # fmt: skip
    )


def sampling(args, out: Path) -> None:
    """Seconds to sample 16 prompts x 48 tokens from the policy held four ways: fp32 weights
    under bf16 autocast (what the trainers run), the same with LoRA adapters (what a LoRA run
    samples from), a bf16 copy of the weights, and a bf16 copy with the adapters folded in."""
    tokenizer = load_tokenizer(args.model, padding_side="left")
    model = load_causal_lm(args.model, tokenizer=tokenizer).eval()
    records = load_records(PROMPTS, "prompts", split="train", limit=16)
    query, query_mask = pad(encode_prompts(records, tokenizer, 128)[0], tokenizer.pad_token_id)
    lora = add_lora(copy.deepcopy(model)).eval()
    variants = {
        "fp32, bf16 autocast": (model, True),
        "LoRA, bf16 autocast": (lora, True),
        "bf16 copy": (copy.deepcopy(model).to(torch.bfloat16), False),
        "bf16 copy, LoRA folded in": (merged_copy(lora).to(torch.bfloat16), False),
    }
    for name, (lm, autocast) in variants.items():
        seconds = []
        for seed in range(args.steps):
            started = time.perf_counter()
            with torch.no_grad(), torch.autocast("cpu", torch.bfloat16, enabled=autocast):
                generate(
                    lm, query, query_mask, SamplingConfig(48, 0.7),
                    eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                    generator=torch.Generator().manual_seed(seed),
                )  # fmt: skip
            seconds.append(time.perf_counter() - started)
        print(f"sampling, {name}: {statistics.median(seconds[1:]):.2f} s", flush=True)


WORKLOADS = {
    "ppo": lambda args, out: ppo(args, out, lora=True),
    "ppo-full": lambda args, out: ppo(args, out, lora=False),
    "grpo": grpo,
    "sampling": sampling,
}
PHASES = ("time/generate", "time/forward", "time/score", "time/update", "time/update_forward")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    parser.add_argument("--model", default="runs/instructions_smollm2/sft/final")
    parser.add_argument("--reward_model", default="runs/instructions_smollm2/reward/final")
    parser.add_argument("--steps", type=int, default=5, help="iterations; the first not timed")
    args = parser.parse_args()
    for name in args.workloads:
        with tempfile.TemporaryDirectory() as tmp:
            load = MachineLoad()
            WORKLOADS[name](args, Path(tmp) / name)
            metrics = Path(tmp) / name / "metrics.jsonl"
            if not metrics.is_file():  # no trainer: the workload printed its own figures
                continue
            rows = [r for r in read_jsonl(metrics) if "time" in r]
            timed = [r for r in rows if "train/step_seconds" in r][1:]
            cells = {"iteration": statistics.median(r["train/step_seconds"] for r in timed)}
            for phase in PHASES:
                values = [r[f"train/{phase}"] for r in timed if f"train/{phase}" in r]
                if values:
                    cells[phase.removeprefix("time/")] = statistics.median(values)
            shown = ", ".join(f"{k} {v:.2f} s" for k, v in cells.items())
            print(
                f"{name}: {shown} (medians of {len(timed)}); peak RSS {peak_rss_mib():.0f} MiB; "
                f"other processes {load.foreign_cores():.2f} cores",
                flush=True,
            )
    print(f"command: {shlex.join([sys.executable, *sys.argv])}")


if __name__ == "__main__":
    main()
