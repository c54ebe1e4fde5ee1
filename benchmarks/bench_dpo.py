#!/usr/bin/env python
"""Seconds per DPO step and peak memory on CPU, next to TRL 1.16's DPOTrainer in the same run.

Workload (the settings of ``benchmarks/trl/trl_dpo_bench.py``): a GPT-2 with 4 layers, 4 heads,
width 256, 256 positions, a 4096-token vocabulary (dropout 0); 8 preference pairs per step,
sequences of at most 128 tokens, sigmoid loss with beta 0.1, lr 5e-5 constant, AdamW, gradient
clipping at 1, a separate reference model (a second copy of the policy); 40 steps.

rlhfkit runs in two modes: ``precompute`` (the default of ``DPOConfig``: reference log-probs
once before step 1, then the reference is freed; the one-off cost is reported as "init") and
``on-the-fly`` (the reference runs every step, as TRL does by default). ``--bf16`` adds
runs with bf16 autocast (fp32 master weights) and reports how far their losses drift.

Model and data: by default the bundled pretrained base (``src/rlhfkit/assets/base``, exactly
this shape) and the demo comparisons; with ``--assets`` (or without the base) they come from
``bench_train.prepare``: the data of ``benchmarks/trl/make_assets.py``, its ``policy/`` if it exists, else an untrained
GPT-2 of that shape (speed depends on shapes, not weights). With ``--trl-python`` (an interpreter with TRL 1.16) each
round also runs ``benchmarks/trl/trl_dpo_bench.py`` on the very same model and data.
Every run is a fresh process; rounds alternate rlhfkit and TRL so both see the same load.

    .venv/bin/python benchmarks/trl/make_assets.py      # once: runs/trl-assets
    make trl                                            # once: .venv-trl with TRL 1.16
    .venv/bin/python benchmarks/bench_dpo.py --assets runs/trl-assets \\
        --trl-python .venv-trl/bin/python --runs 3
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_train import prepare  # noqa: E402
from common import MachineLoad, logged_steps, peak_rss_mib, spread  # noqa: E402

TRL_DIR = Path(__file__).resolve().parent / "trl"  # the TRL side of the comparison

STEPS, PAIRS, MAX_LENGTH, LR, BETA = 40, 8, 128, 5e-5, 0.1
ASSETS = Path(__file__).resolve().parents[1] / "src" / "rlhfkit" / "assets"


def workload(assets: Path | None, work: Path) -> dict:
    """Model and data: the bundled base model and demo data when no ``--assets`` are given and
    the base exists (the issue's default), else ``bench_train.prepare``."""
    if assets is not None or not (ASSETS / "base" / "model.safetensors").is_file():
        return prepare(assets, work)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(ASSETS / "base")
    demo = ASSETS / "data" / "demo"
    return {
        "model": str(ASSETS / "base"),
        "prefs": str(demo / "comparisons" / "train.jsonl"),
        "prefs_test": str(demo / "comparisons" / "test.jsonl"),
        "prompts": str(demo / "prompts" / "train.jsonl"),
        "data": "the bundled demo data (src/rlhfkit/assets/data/demo)",
        "weights": "the bundled pretrained base (src/rlhfkit/assets/base)",
        "params": sum(p.numel() for p in model.parameters()),
    }


def child(prepared: dict, out: Path, mode: str, steps: int, threads: int) -> dict:
    """One rlhfkit DPO run in this process (mode: precompute | on-the-fly, optional +bf16)."""
    import torch

    torch.set_num_threads(threads)
    from rlhfkit.models.loading import load_causal_lm, load_reference, load_tokenizer
    from rlhfkit.trainers.dpo import DPOTrainer, load_pairs
    from rlhfkit.trainers.dpo_config import DPOConfig

    machine = MachineLoad()
    precompute = mode.startswith("precompute")
    config = DPOConfig(
        model=prepared["model"], output_dir=str(out), train_data=prepared["prefs"],
        eval_data=None, batch_size=PAIRS, max_steps=steps, max_length=MAX_LENGTH,
        learning_rate=LR, beta=BETA, lr_scheduler="constant", max_grad_norm=1.0, log_every=1,
        cpu=True, seed=42, resume=False, report_to=[], precompute_reference=precompute,
        mixed_precision="bf16" if mode.endswith("+bf16") else "no",
    )  # fmt: skip
    tokenizer = load_tokenizer(config.model)
    model = load_causal_lm(config.model, tokenizer=tokenizer)
    reference = None if precompute else load_reference(config.model, tokenizer=tokenizer)
    pairs = load_pairs(config, config.train_data, "train", tokenizer, None)
    started = time.perf_counter()
    trainer = DPOTrainer(config, model, tokenizer, pairs, reference=reference)
    init_s = time.perf_counter() - started
    trainer.train()
    rows, times = logged_steps(out / "metrics.jsonl")
    return {
        "median_s": statistics.median(times[1:]),
        "first_s": times[0],
        "init_s": init_s,
        "rss_mib": peak_rss_mib(),
        "losses": [r["train/loss"] for r in rows],
        "logps_chosen_1": rows[0]["train/logps_chosen"],
        "foreign_cores": machine.foreign_cores(),
    }


def trl_layout(prepared: dict, assets: Path | None, work: Path) -> Path:
    """A directory in the layout of benchmarks/trl's assets pointing at the same model and data."""
    trl_dir = work / "trl-assets"
    trl_dir.mkdir()
    (trl_dir / "manifest.json").write_text("{}\n")
    (trl_dir / "policy").symlink_to(prepared["model"])
    (trl_dir / "tokenizer").symlink_to(prepared["model"])
    (trl_dir / "preference.jsonl").symlink_to(prepared["prefs"])
    test = assets / "preference_test.jsonl" if assets else Path(prepared.get("prefs_test", ""))
    test = test if test.is_file() else Path(prepared["prefs"])
    (trl_dir / "preference_test.jsonl").symlink_to(test)
    return trl_dir


def trl_run(python: str, trl_assets: Path, out: Path, steps: int, threads: int) -> dict:
    """One run of benchmarks/trl/trl_dpo_bench.py (no final eval, ``threads`` torch threads); its JSON
    fields, renamed like ours."""
    cmd = [python, str(TRL_DIR / "trl_dpo_bench.py"), "--assets", str(trl_assets),
           "--steps", str(steps), "--no-eval", "--json", str(out / "trl.json"),
           "--out-dir", str(out / "trl-out")]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    if proc.returncode:
        sys.exit(f"TRL run failed:\n{proc.stderr[-3000:]}")
    res = json.loads((out / "trl.json").read_text())
    return {
        "median_s": res["sec_per_step_median"],
        "first_s": res["first_step_s"],
        "init_s": res["init_s"],
        "rss_mib": res["peak_rss_mib"],
        "losses": res["losses"],
        "logps_chosen_1": res["parity_step1"]["logps/chosen"],
        "foreign_cores": res["contention"]["foreign_cores"],
    }


def report(name: str, results: list[dict]) -> None:
    print(f"\n{name} ({len(results)} runs)")
    print(f"  s/step min/med/max            {spread([r['median_s'] for r in results], '.3f')}")
    print(f"  first step s (median)         {statistics.median(r['first_s'] for r in results):.2f}")
    print(f"  init s (median)               {statistics.median(r['init_s'] for r in results):.2f}")
    print(f"  peak RSS MiB min/med/max      {spread([r['rss_mib'] for r in results], '.0f')}")
    first = results[0]
    print(f"  step-1 logps/chosen, loss 1 -> {len(first['losses'])}  "
          f"{first['logps_chosen_1']:.3f}, {first['losses'][0]:.4f} -> {first['losses'][-1]:.4f}")  # fmt: skip
    print(f"  foreign cores (max over runs) {max(r['foreign_cores'] for r in results):.2f}")


def run_child(script: str, work: Path, name: str, run: int, args) -> dict:
    """Run ``script --child`` for one (mode, run) in a fresh process; its RESULT line."""
    spec = f"{name}:{work / 'prepared.json'}:{work / f'{name}-{run}'}"
    cmd = [sys.executable, script, "--child", spec, "--steps", str(args.steps),
           "--threads", str(args.threads)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    if proc.returncode or not lines:
        sys.exit(f"{name} run {run} failed:\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT ") :])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--assets", type=Path, default=None, help="benchmarks/trl/make_assets.py's output"
    )
    parser.add_argument("--runs", type=int, default=3, help="rounds (fresh processes each)")
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument("--modes", nargs="+", default=["precompute", "on-the-fly"],
                        choices=["precompute", "on-the-fly"])  # fmt: skip
    parser.add_argument("--bf16", action="store_true", help="also run each mode in bf16 autocast")
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
    modes = [m + suffix for m in args.modes for suffix in ([""] + ["+bf16"] * args.bf16)]
    results: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="bench_dpo_") as tmp:
        work = Path(tmp)
        prepared = workload(args.assets, work)
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
                trl = trl_run(args.trl_python, trl_dir, out, args.steps, args.threads)
                results.setdefault("TRL 1.16 DPOTrainer", []).append(trl)
    for name, rows in results.items():
        report(name, rows)
    summarize(results, "TRL 1.16 DPOTrainer", "losses", "step")
    print(f"\ncommand: {command}")
    if args.json:
        args.json.write_text(json.dumps({"command": command, "prepared": prepared,
                                         "results": results}, indent=2))  # fmt: skip


def summarize(results: dict[str, list[dict]], trl_name: str, curve: str, unit: str) -> None:
    """Median of the run medians, as a ratio to TRL's, and bf16's drift from fp32 in `curve`
    (a per-step series of the first run)."""
    medians = {k: statistics.median(r["median_s"] for r in v) for k, v in results.items()}
    trl = medians.get(trl_name)
    print()
    for name, value in medians.items():
        ratio = f" = {value / trl:.2f} x TRL" if trl and name != trl_name else ""
        print(f"median s/{unit} {name:28s} {value:.3f}{ratio}")
    for name in [k for k in results if k.endswith("+bf16")]:
        fp32 = results[name.removesuffix("+bf16")][0][curve]
        bf16 = results[name][0][curve]
        drift = max(abs(a - b) for a, b in zip(fp32, bf16, strict=True))
        print(f"bf16 vs fp32 {curve}, max |difference| over {unit}s ({name}): {drift:.4f}")


if __name__ == "__main__":
    main()
