#!/usr/bin/env python
"""Seconds per PPO iteration and per GRPO, DPO, SFT and reward-model step on a real model,
phase by phase: SmolLM2-135M-Instruct (30 layers x 576, vocabulary 49152) on the instructions
task's data, on the CPU; with ``--trl-python``, TRL 1.16 on the same GRPO and DPO workloads
in the same run.

Workloads (the shapes a new user tries first on this model):
- ``ppo``: 16 prompts x 48 new tokens a rollout, one PPO epoch in 2 minibatches of 8, the
  policy and the critic LoRA adapters (rank 8) with the reference as the policy's base
  weights without the adapter (a view beside it on a CPU); scored by a reward model, which
  also starts the critic (InstructGPT).
- ``ppo-full``: the same with full fine-tuning (a separate frozen reference copy).
- ``sampling``: sampling alone (16 prompts x 48 tokens), from the policy's weights in fp32
  under bf16 autocast, with LoRA adapters, as a bf16 copy, and as a bf16 copy with the
  adapters folded in.
- ``grpo``: 8 prompts x 4 responses x 48 new tokens a step, LoRA, the checker of the
  instructions task as the reward.
- ``dpo``: 8 pairs a step of the task's comparisons (``max_length`` 192, beta 0.1, lr 5e-5
  constant), LoRA, the reference precomputed for the pairs the run visits (the default).
- ``sft`` and ``reward``: the pipeline's full-fine-tuning stages at its shapes (16
  demonstrations, or 16 comparisons, a step; ``max_length`` 192; ``--dpo-steps`` steps).
- ``dpo-packed``, ``sft-packed``, ``reward-packed``: the same with ``padding_free`` (the
  real tokens alone, packed into one row); run beside the padded ones for the ratio.

Each runs ``--steps`` iterations (DPO, SFT, reward model: ``--dpo-steps``) from the SFT model in bf16 autocast
(fp32 weights) with SDPA attention. Prints the median over the iterations after the first of
each phase the trainers log (``time/generate``, ``time/forward`` (the policy, reference and
critic passes and the scorer), ``time/score``, ``time/update``), the whole iteration, the peak
RSS of the process so far (one workload per run for its own), the CPU the machine's other
processes used meanwhile (the machine is shared) and the command.

With ``--trl-python`` (an interpreter with TRL 1.16: ``make trl``'s ``.venv-trl``) every
workload runs in a fresh process of its own, ``--runs`` rounds, and ``grpo`` and ``dpo`` also
run ``benchmarks/trl/trl_smollm2_bench.py`` (GRPOTrainer / DPOTrainer with a peft LoRA of the
same rank, alpha and modules, ``bf16=True``, the same prompts and pairs in the same order) after
rlhfkit in each round. Compared: seconds per step as both step timers see it (the wall time
between the ends of consecutive steps, logging included; median after the first), the set-up
before step 1 (loading, and DPO's precomputed reference on rlhfkit's side) and each process's
peak RSS, with rlhfkit's as a ratio of TRL's.

    make smollm2   # runs/models/SmolLM2-135M-Instruct
    .venv/bin/python benchmarks/bench_smollm2.py --workloads ppo ppo-full grpo \\
        --model runs/instructions_smollm2/sft/final \\
        --reward_model runs/instructions_smollm2/reward/final
    make trl       # .venv-trl
    .venv/bin/python benchmarks/bench_smollm2.py --workloads grpo dpo --steps 6 \\
        --dpo-steps 12 --trl-python .venv-trl/bin/python --runs 2
"""

from __future__ import annotations

import argparse
import copy
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import MachineLoad, logged_steps, peak_rss_mib, spread  # noqa: E402

from rlhfkit.config import RewardConfig, SFTConfig  # noqa: E402
from rlhfkit.data import encode_prompts, load_records, pad  # noqa: E402
from rlhfkit.experience.generation import SamplingConfig, generate  # noqa: E402
from rlhfkit.models.loading import load_causal_lm, load_tokenizer  # noqa: E402
from rlhfkit.models.lora import add_lora, merged_copy  # noqa: E402
from rlhfkit.tasks import INSTRUCTIONS_DATA_DIR  # noqa: E402
from rlhfkit.trainers.dpo import run_dpo  # noqa: E402
from rlhfkit.trainers.dpo_config import DPOConfig  # noqa: E402
from rlhfkit.trainers.reward import run_reward  # noqa: E402
from rlhfkit.trainers.rl import run_rl  # noqa: E402
from rlhfkit.trainers.rl_config import RLConfig  # noqa: E402
from rlhfkit.trainers.sft import run_sft  # noqa: E402

PROMPTS = str(INSTRUCTIONS_DATA_DIR / "prompts")
COMPARISONS = str(INSTRUCTIONS_DATA_DIR / "comparisons")
DEMONSTRATIONS = str(INSTRUCTIONS_DATA_DIR / "sft")
TRL_BENCH = Path(__file__).resolve().parent / "trl" / "trl_smollm2_bench.py"
COMMON = dict(
    train_data=PROMPTS, max_new_tokens=48, temperature=0.7, learning_rate=1e-5,
    mixed_precision="bf16", attn_implementation="sdpa", report_to=[], resume=False,
    save_every=0, seed=0, cpu=True,
)  # fmt: skip


def ppo(args, out: Path, lora: bool) -> None:
    run_rl(
        RLConfig.preset(
            "ppo",
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
    run_rl(
        RLConfig.preset(
            "grpo",
            model=args.model,
            reward_model=None,
            reward_functions=["instructions"],
            output_dir=str(out),
            max_steps=args.steps,
            rollout_batch_size=8,
            num_generations=4,
            batch_size=32,  # 8 prompts x 4 responses: one optimiser step an iteration
            eval_data=None,
            lora=True,
            log_every=1,
            **COMMON,
        )  # fmt: skip
    )


def dpo(args, out: Path, packed: bool = False) -> None:
    run_dpo(
        DPOConfig(
            model=args.model,
            train_data=COMPARISONS,
            eval_data=None,
            output_dir=str(out),
            max_steps=args.dpo_steps,
            batch_size=8,
            max_length=192,
            learning_rate=5e-5,
            lr_scheduler="constant",
            lora=True,
            padding_free=packed,
            log_every=1,
            mixed_precision="bf16",
            attn_implementation="sdpa",
            report_to=[],
            resume=False,
            save_every=0,
            seed=0,
            cpu=True,
        )  # fmt: skip
    )


FIXED_DATA = dict(
    eval_data=None, batch_size=16, max_length=192, lr_scheduler="constant", log_every=1,
    mixed_precision="bf16", attn_implementation="sdpa", report_to=[], resume=False,
    save_every=0, seed=0, cpu=True,
)  # fmt: skip


def fixed_data(args, out: Path, packed: bool, run, config_class, data: str, lr: float) -> None:
    """A full-fine-tuning stage on fixed data (SFT, the reward model) at the pipeline's shapes."""
    run(
        config_class(
            model=args.model,
            train_data=data,
            output_dir=str(out),
            max_steps=args.dpo_steps,
            learning_rate=lr,
            padding_free=packed,
            **FIXED_DATA,
        )  # fmt: skip
    )


SFT = dict(run=run_sft, config_class=SFTConfig, data=DEMONSTRATIONS, lr=2e-5)
REWARD = dict(run=run_reward, config_class=RewardConfig, data=COMPARISONS, lr=3e-5)


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
    "dpo": dpo,
    "dpo-packed": lambda args, out: dpo(args, out, packed=True),
    "sft": lambda args, out: fixed_data(args, out, False, **SFT),
    "sft-packed": lambda args, out: fixed_data(args, out, True, **SFT),
    "reward": lambda args, out: fixed_data(args, out, False, **REWARD),
    "reward-packed": lambda args, out: fixed_data(args, out, True, **REWARD),
    "sampling": sampling,
}
TRL_SIDE = ("grpo", "dpo")  # the workloads benchmarks/trl/trl_smollm2_bench.py also runs
PHASES = ("time/generate", "time/forward", "time/score", "time/update", "time/update_forward")


def measure(name: str, args) -> dict | None:
    """Run workload ``name`` in this process and print its line; its figures, or None for a
    workload without a trainer (it printed its own)."""
    with tempfile.TemporaryDirectory() as tmp:
        load, started = MachineLoad(), time.time()
        WORKLOADS[name](args, Path(tmp) / name)
        metrics = Path(tmp) / name / "metrics.jsonl"
        if not metrics.is_file():
            return None
        rows, between = logged_steps(metrics)
    timed = rows[1:]
    cells = {"iteration": statistics.median(r["train/step_seconds"] for r in timed)}
    for phase in PHASES:
        values = [r[f"train/{phase}"] for r in timed if f"train/{phase}" in r]
        if values:
            cells[phase.removeprefix("time/")] = statistics.median(values)
    result = {
        "median_s": statistics.median(between[1:]),
        "first_s": between[0],
        "setup_s": rows[0]["time"] - rows[0]["train/step_seconds"] - started,
        "rss_mib": peak_rss_mib(),
        "foreign_cores": load.foreign_cores(),
        "response_tokens": mean_of([r.get("train/response/length") for r in rows]),
    }
    shown = ", ".join(f"{k} {v:.2f} s" for k, v in cells.items())
    print(
        f"{name}: {shown} (medians of {len(timed)}); peak RSS {result['rss_mib']:.0f} MiB; "
        f"other processes {result['foreign_cores']:.2f} cores",
        flush=True,
    )
    return result


def mean_of(values: list) -> float | None:
    """The mean of the values that are not None; None if there are none."""
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else None


def run_rlhfkit(name: str, args) -> dict | None:
    """Workload ``name`` in a fresh process (``--child``): its figures."""
    cmd = [sys.executable, __file__, "--child", name, "--model", args.model,
           "--reward_model", args.reward_model, "--steps", str(args.steps),
           "--dpo-steps", str(args.dpo_steps)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    lines = proc.stdout.splitlines()
    results = [x for x in lines if x.startswith("RESULT ")]
    if proc.returncode or not results:
        sys.exit(f"rlhfkit {name} failed:\n{proc.stderr[-3000:]}")
    print("\n".join(x for x in lines if not x.startswith("RESULT ")), flush=True)
    return json.loads(results[-1].removeprefix("RESULT "))


def run_trl(name: str, args, work: Path) -> dict:
    """``benchmarks/trl/trl_smollm2_bench.py --algo name`` with ``--trl-python``: its figures,
    named as ``measure`` names them."""
    out = work / f"trl-{name}.json"
    steps = args.dpo_steps if name == "dpo" else args.steps
    cmd = [args.trl_python, str(TRL_BENCH), "--algo", name, "--model", args.model,
           "--steps", str(steps), "--json", str(out), "--out-dir", str(work / "trl-out")]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode or not out.is_file():
        sys.exit(f"TRL {name} failed:\n{proc.stderr[-3000:]}")
    print(next(x for x in proc.stdout.splitlines() if x.startswith("[smollm2")), flush=True)
    res = json.loads(out.read_text())
    return {
        "median_s": res["sec_per_step_median"],
        "first_s": res["first_step_s"],
        "setup_s": res["setup_s"],
        "rss_mib": res["peak_rss_mib"],
        "foreign_cores": res["contention"]["foreign_cores"],
        "response_tokens": res["completion_length"],
    }


def compare(name: str, sides: dict[str, list[dict]]) -> None:
    """Each side's figures over the rounds, and rlhfkit's as a ratio of TRL's (medians)."""
    print(f"\n{name} ({len(sides['rlhfkit'])} rounds): s/step min/med/max; first step s; "
          "set-up s; peak RSS MiB min/med/max; other processes (max); mean response tokens")  # fmt: skip
    for side, rows in sides.items():
        tokens = mean_of([r["response_tokens"] for r in rows])
        print(
            f"  {side:8s} {spread([r['median_s'] for r in rows], '.2f')}; "
            f"{statistics.median(r['first_s'] for r in rows):.2f}; "
            f"{statistics.median(r['setup_s'] for r in rows):.1f}; "
            f"{spread([r['rss_mib'] for r in rows], '.0f')}; "
            f"{max(r['foreign_cores'] for r in rows):.2f}; "
            + ("-" if tokens is None else f"{tokens:.1f}")
        )
    if "TRL" in sides:
        med = {k: {f: statistics.median(r[f] for r in v) for f in ("median_s", "rss_mib")}
               for k, v in sides.items()}  # fmt: skip
        print(
            f"  rlhfkit / TRL: time {med['rlhfkit']['median_s'] / med['TRL']['median_s']:.2f}x, "
            f"peak RSS {med['rlhfkit']['rss_mib'] / med['TRL']['rss_mib']:.2f}x"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    parser.add_argument("--model", default="runs/instructions_smollm2/sft/final")
    parser.add_argument("--reward_model", default="runs/instructions_smollm2/reward/final")
    parser.add_argument("--steps", type=int, default=5, help="iterations; the first not timed")
    parser.add_argument(
        "--dpo-steps",
        type=int,
        default=12,
        help="DPO, SFT and reward-model steps; the first not timed",
    )
    parser.add_argument("--trl-python", default=None, help="python with TRL 1.16 installed")
    parser.add_argument("--runs", type=int, default=1, help="rounds with --trl-python")
    parser.add_argument("--child", choices=WORKLOADS, help=argparse.SUPPRESS)  # one, then RESULT
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(measure(args.child, args)))
        return
    if args.trl_python is None:
        for name in args.workloads:
            measure(name, args)
    else:
        results: dict[str, dict[str, list[dict]]] = {}
        with tempfile.TemporaryDirectory(prefix="bench_smollm2_") as tmp:
            for _ in range(args.runs):
                for name in args.workloads:
                    sides = results.setdefault(name, {"rlhfkit": []})
                    sides["rlhfkit"].append(run_rlhfkit(name, args))
                    if name in TRL_SIDE:
                        sides.setdefault("TRL", []).append(run_trl(name, args, Path(tmp)))
        for name, sides in results.items():
            if sides["rlhfkit"][0] is not None:
                compare(name, sides)
    print(f"command: {shlex.join([sys.executable, *sys.argv])}")


if __name__ == "__main__":
    main()
