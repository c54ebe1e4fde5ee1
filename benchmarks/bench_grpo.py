#!/usr/bin/env python
"""Seconds per GRPO / RLOO iteration on CPU, next to TRL 1.16's GRPOTrainer in the same run.

Workload (the settings of ``benchmarks/trl/trl_grpo_bench.py --reward digits``): a GPT-2 with 4
layers, 4 heads, width 256, 256 positions, a 4096-token vocabulary (dropout 0); one iteration
= 8 prompts x 4 generations x at most 32 new tokens at temperature 1, scored by the
digit reward of ``benchmarks/trl/trl_common.py`` (min(#digits, 8) / 8), then ONE optimiser step over the 32 completions; k3 KL
term with kl_coef 0.04 (TRL's beta) against a frozen reference copy; lr 5e-5 constant; 30 iterations.

rlhfkit runs ``RLTrainer`` (the ``--algo grpo`` or ``rloo`` preset) in fp32, and with
``--bf16`` also in bf16 autocast (fp32 master weights), reporting how far its reward curve
drifts. With
``--trl-python`` (an interpreter with TRL 1.16) each round also runs
``benchmarks/trl/trl_grpo_bench.py`` on the very same model and prompts (its untimed before/after eval needs
a reward model: ``reward_model/`` from the assets, else an untrained one of the same shape).
Model and prompts: the bundled base and demo prompts by default, else as ``bench_dpo.py``
says; with an untrained policy no response stops early, so every iteration generates all 32
tokens per row.

Prints min/median/max over runs of each run's median seconds per iteration (first excluded),
the generation share and tokens/s (32 x 32 token slots / seconds in generation), peak RSS,
the reward curve (first iteration -> mean of the last 3), CPU used by other processes, and
the command.

    .venv/bin/python benchmarks/trl/make_assets.py      # once: runs/trl-assets
    make trl                                            # once: .venv-trl with TRL 1.16
    .venv/bin/python benchmarks/bench_grpo.py --assets runs/trl-assets \\
        --trl-python .venv-trl/bin/python --runs 3
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_dpo import run_child, summarize, workload  # noqa: E402
from common import MachineLoad, logged_steps, peak_rss_mib, spread  # noqa: E402

TRL_DIR = Path(__file__).resolve().parent / "trl"  # the TRL side of the comparison

ITERS, PROMPTS, GENERATIONS, NEW_TOKENS, LR, BETA = 30, 8, 4, 32, 5e-5, 0.04
DIGIT = re.compile(r"\d")


def digit_reward(prompts: list[str], responses: list[str]) -> list[float]:
    """``benchmarks/trl/trl_common.digit_reward`` for rlhfkit: min(#digit characters, 8) / 8."""
    return [min(len(DIGIT.findall(r)), 8) / 8.0 for r in responses]


def child(prepared: dict, out: Path, mode: str, steps: int, threads: int) -> dict:
    """One rlhfkit run in this process; mode is 'grpo' or 'rloo', optionally '+bf16'."""
    import torch

    torch.set_num_threads(threads)
    from rlhfkit.data import load_prompts
    from rlhfkit.experience.scorers import FunctionScorer
    from rlhfkit.models.loading import load_causal_lm, load_tokenizer
    from rlhfkit.trainers.rl import RLTrainer
    from rlhfkit.trainers.rl_config import RLConfig

    machine = MachineLoad()
    config = RLConfig.preset(
        mode.split("+")[0],  # the grpo or rloo preset: KL in the loss, no critic
        model=prepared["model"], output_dir=str(out), train_data=prepared["prompts"],
        reward_functions=["bench_grpo:digit_reward"], rollout_batch_size=PROMPTS,
        num_generations=GENERATIONS, batch_size=PROMPTS * GENERATIONS,  # one optimiser step
        max_new_tokens=NEW_TOKENS, max_steps=steps, learning_rate=LR, kl_coef=BETA,
        lr_scheduler="constant", max_grad_norm=1.0, log_every=1, sample_every=steps, cpu=True,
        seed=42, resume=False,
        report_to=[], mixed_precision="bf16" if mode.endswith("+bf16") else "no",
    )  # fmt: skip
    tokenizer = load_tokenizer(config.model)
    model = load_causal_lm(config.model, tokenizer=tokenizer)
    prompts = load_prompts(config.train_data, "train", tokenizer, config.max_prompt_length, None)
    scorer = FunctionScorer(digit_reward, name="digits")
    RLTrainer(config, model, tokenizer, prompts, scorer).train()
    rows, times = logged_steps(out / "metrics.jsonl")
    gen = [r["train/time/generate"] for r in rows]
    rewards = [r["train/score/mean"] for r in rows]
    return {
        "median_s": statistics.median(times[1:]),
        "first_s": times[0],
        "gen_s": statistics.median(gen[1:]),
        "gen_tok_s": PROMPTS * GENERATIONS * NEW_TOKENS / statistics.median(gen[1:]),
        "rss_mib": peak_rss_mib(),
        "rewards": rewards,
        "foreign_cores": machine.foreign_cores(),
    }


def trl_layout(prepared: dict, assets: Path | None, work: Path) -> Path:
    """The layout of benchmarks/trl's assets for trl_grpo_bench.py on the same policy,
    tokenizer and prompts."""
    from transformers import GPT2ForSequenceClassification

    trl_dir = work / "trl-assets"
    trl_dir.mkdir()
    (trl_dir / "manifest.json").write_text("{}\n")
    for name in ("policy", "tokenizer"):
        (trl_dir / name).symlink_to(prepared["model"])
    (trl_dir / "prompts.jsonl").symlink_to(prepared["prompts"])
    (trl_dir / "preference_test.jsonl").symlink_to(prepared["prompts"])  # eval prompts only
    if assets is not None and (assets / "reward_model").is_dir():
        (trl_dir / "reward_model").symlink_to(assets / "reward_model")
    else:
        rm = GPT2ForSequenceClassification.from_pretrained(prepared["model"], num_labels=1)
        rm.save_pretrained(trl_dir / "reward_model")
    return trl_dir


def trl_run(python: str, trl_assets: Path, out: Path, args) -> dict:
    """One run of benchmarks/trl/trl_grpo_bench.py with ``args.threads`` torch threads; its JSON fields
    renamed like ours."""
    threads = args.threads
    cmd = [python, str(TRL_DIR / "trl_grpo_bench.py"), "--assets", str(trl_assets),
           "--algo", args.algo, "--reward", "digits", "--iters", str(args.steps),
           "--eval-prompts", "8", "--json", str(out / "trl.json"),
           "--out-dir", str(out / "trl-out")]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    if proc.returncode:
        sys.exit(f"TRL run failed:\n{proc.stderr[-3000:]}")
    res = json.loads((out / "trl.json").read_text())
    gen = res["generation"]
    return {
        "median_s": res["sec_per_iter_median"],
        "first_s": res["first_iter_s"],
        "gen_s": gen["generate_seconds"] / gen["generate_calls"],
        "gen_tok_s": res["gen_tokens_per_s"],
        "rss_mib": res["peak_rss_mib"],
        "rewards": res["train_rewards"],
        "foreign_cores": res["contention"]["foreign_cores"],
    }


def report(name: str, results: list[dict]) -> None:
    print(f"\n{name} ({len(results)} runs)")
    print(f"  s/iter min/med/max            {spread([r['median_s'] for r in results], '.3f')}")
    print(f"  first iter s (median)         {statistics.median(r['first_s'] for r in results):.2f}")
    print(
        f"  gen tok/s (median)            {statistics.median(r['gen_tok_s'] for r in results):.0f}"
    )
    print(f"  peak RSS MiB min/med/max      {spread([r['rss_mib'] for r in results], '.0f')}")
    rewards = results[0]["rewards"]
    print(
        f"  reward iter 1 -> last 3 (run 1) {rewards[0]:.3f} -> {statistics.mean(rewards[-3:]):.3f}"
    )
    print(f"  foreign cores (max over runs) {max(r['foreign_cores'] for r in results):.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--assets", type=Path, default=None, help="benchmarks/trl/make_assets.py's output"
    )
    parser.add_argument("--runs", type=int, default=3, help="rounds (fresh processes each)")
    parser.add_argument("--steps", type=int, default=ITERS, help="iterations per run")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument("--algo", choices=["grpo", "rloo"], default="grpo")
    parser.add_argument("--bf16", action="store_true", help="also run in bf16 autocast")
    parser.add_argument("--trl-python", default=None, help="python with TRL 1.16 installed")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # internal: "mode:prepared.json:out"
    args = parser.parse_args()
    if args.child:
        mode, prepared, out = args.child.split(":")
        result = child(json.loads(Path(prepared).read_text()), Path(out), mode, args.steps,
                       args.threads)  # fmt: skip
        print("RESULT " + json.dumps(result))
        return
    command = shlex.join([Path(sys.executable).name, *sys.argv])
    modes = [args.algo] + [f"{args.algo}+bf16"] * args.bf16
    trl_name = f"TRL 1.16 {'GRPOTrainer' if args.algo == 'grpo' else 'RLOOTrainer'}"
    results: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="bench_grpo_") as tmp:
        work = Path(tmp)
        prepared = workload(args.assets, work)
        if "prompts" not in prepared:
            prepared["prompts"] = str(_prompts_file(args.assets, prepared, work))
        (work / "prepared.json").write_text(json.dumps(prepared))
        trl_dir = trl_layout(prepared, args.assets, work) if args.trl_python else None
        print(f"data: {prepared['data']}; weights: {prepared['weights']}, "
              f"{prepared['params'] / 1e6:.2f} M parameters")  # fmt: skip
        for run in range(args.runs):
            for mode in modes:
                result = run_child(__file__, work, mode, run, args)
                results.setdefault(f"rlhfkit {mode}", []).append(result)
            if trl_dir is not None:
                out = work / f"trl-{run}"
                out.mkdir()
                results.setdefault(trl_name, []).append(
                    trl_run(args.trl_python, trl_dir, out, args)
                )
    for name, rows in results.items():
        report(name, rows)
    summarize(results, trl_name, "rewards", "iter")
    print(f"\ncommand: {command}")
    if args.json:
        args.json.write_text(json.dumps({"command": command, "prepared": prepared,
                                         "results": results}, indent=2))  # fmt: skip


def _prompts_file(assets: Path | None, prepared: dict, work: Path) -> Path:
    """The assets' prompts.jsonl, or the preference data's prompts when there are no assets."""
    if assets is not None and (assets / "prompts.jsonl").is_file():
        return assets / "prompts.jsonl"
    rows = [json.loads(line) for line in Path(prepared["prefs"]).read_text().splitlines()]
    path = work / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": r["prompt"]}) + "\n" for r in rows))
    return path


if __name__ == "__main__":
    main()
