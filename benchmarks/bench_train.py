#!/usr/bin/env python
"""Seconds per step and peak memory of rlhfkit's SFT and reward-model training on CPU.

Workload (the settings of ``benchmarks/trl/trl_sft_bench.py`` and ``trl_rm_bench.py``): a GPT-2
with 4 layers, 4 heads, width 256, 256 positions and a 4096-token vocabulary (dropout 0); fp32;
AdamW, constant learning rate, gradient clipping at 1; at most 128 tokens per sequence; SFT 16
sequences per step (lr 1e-4, loss on the completion only), reward model 8 pairs per step
(lr 5e-5); 40 steps. Each measurement runs in a fresh process, one at a time.

Data and weights, in order of preference:
- ``--assets DIR`` from ``benchmarks/trl/make_assets.py`` (``tokenizer/``, ``sft.jsonl`` with prompt/completion,
  ``preference.jsonl``, and ``policy/`` once pretrained): the data TRL is measured on;
- otherwise a 4096-token byte-level BPE trained here on CPython's documentation
  (``pydoc_data.topics``, the corpus of those assets) and short prompt/response sentences cut from it.
Without ``policy/`` the model is an untrained GPT-2 of that configuration: speed depends on
shapes and token counts, not on weights. The output says which was used.

Prints, per bench, the min / median / max over runs of each run's median seconds per step
(first step excluded), the first step, tokens per second (non-padding tokens per step over the
median step time), peak RSS (``ru_maxrss`` of the run's process), the CPU used by other
processes during the run (the machine is shared: distrust runs where it exceeds ~0.1 cores),
TRL's figures from ``benchmarks/trl/README.md`` for reference, and the command line. With
``--trl-python`` (the python of ``make trl``'s ``.venv-trl``, TRL 1.16) the TRL scripts of
``benchmarks/trl/`` run too, each right after the matching rlhfkit run, so both meet the same
background load.

    .venv/bin/python benchmarks/trl/make_assets.py      # once: runs/trl-assets
    make trl                                            # once: .venv-trl with TRL 1.16
    .venv/bin/python benchmarks/bench_train.py --assets runs/trl-assets --runs 3 \\
        --trl-python .venv-trl/bin/python
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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import MachineLoad, peak_rss_mib, spread  # noqa: E402

# Reference only: copied from benchmarks/trl/README.md (TRL 1.16.0, 3 runs, quiet 2-core CPU,
# 2026-11-21), not measured here. Their data averages about 25 tokens per sequence.
TRL_README = {
    "sft": {"s_step": (0.188, 0.195, 0.200), "first_s": 0.30, "tok_s": 2042, "rss": 930},
    "rm": {"s_step": (0.118, 0.122, 0.139), "first_s": 0.17, "tok_s": 3144, "rss": 765},
}
TRL_DIR = Path(__file__).resolve().parent / "trl"  # the TRL side of the comparison
SETTINGS = {  # per bench: examples per step, learning rate
    "sft": {"batch_size": 16, "learning_rate": 1e-4},
    "rm": {"batch_size": 8, "learning_rate": 5e-5},
}


# ----------------------------------------------------------------------------- assets
def _build_tokenizer(out: Path):
    """A byte-level BPE with 4096 tokens on CPython's docs; specials as in benchmarks/trl's assets."""
    import pydoc_data.topics

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    texts = list(pydoc_data.topics.topics.values())
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|pad|>"]
    trainer = trainers.BpeTrainer(vocab_size=4096, special_tokens=specials, show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=specials[0], bos_token=specials[0], pad_token=specials[1]
    )
    fast.save_pretrained(out)
    return fast, texts


def _sentences(texts: list[str], n: int) -> list[str]:
    words = " ".join(" ".join(texts).split()).split(". ")
    return [s.strip() + "." for s in words if 8 <= len(s.split()) <= 24][:n]


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def prepare(assets: Path | None, work: Path) -> dict:
    """Model dir (weights + tokenizer) and data files for the runs; says what was used."""
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    model_dir = work / "model"
    if assets is not None:
        tokenizer = AutoTokenizer.from_pretrained(assets / "tokenizer")
        sft, prefs, source = assets / "sft.jsonl", assets / "preference.jsonl", str(assets)
    else:
        tokenizer, texts = _build_tokenizer(work / "tokenizer")
        lines = _sentences(texts, 1024)
        sft, prefs, source = work / "sft.jsonl", work / "preference.jsonl", "pydoc_data.topics"
        cut = [(" ".join(s.split()[:5]), " " + " ".join(s.split()[5:])) for s in lines]
        _write_jsonl(sft, [{"prompt": p, "completion": c} for p, c in cut[:512]])
        pairs = zip(cut[:512], cut[512:], strict=True)
        _write_jsonl(prefs, [{"prompt": p, "chosen": c, "rejected": r[1]} for (p, c), r in pairs])
    if assets is not None and (assets / "policy").is_dir():
        model = GPT2LMHeadModel.from_pretrained(assets / "policy")
        weights = "pretrained policy/ from the assets"
    else:
        config = GPT2Config(
            n_layer=4, n_head=4, n_embd=256, n_positions=256, vocab_size=len(tokenizer),
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
            bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )  # fmt: skip
        model = GPT2LMHeadModel(config)
        weights = "untrained GPT-2 (same shapes)"
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    params = sum(p.numel() for p in model.parameters())
    return {"model": str(model_dir), "sft": str(sft), "prefs": str(prefs), "data": source,
            "weights": weights, "params": params}  # fmt: skip


# ----------------------------------------------------------------------------- one run
def child(bench: str, prepared: dict, out: Path, steps: int, threads: int) -> dict:
    """One training run in this process; returns its measurements."""
    import torch

    torch.set_num_threads(threads)
    from rlhfkit.config import RewardConfig, SFTConfig
    from rlhfkit.tracking import read_jsonl

    machine = MachineLoad()
    fields = dict(
        model=prepared["model"], output_dir=str(out), eval_data=None, max_steps=steps,
        max_length=128, lr_scheduler="constant", max_grad_norm=1.0, log_every=1, cpu=True,
        seed=42, resume=False, **SETTINGS[bench],
    )  # fmt: skip
    if bench == "sft":
        from rlhfkit.trainers.sft import load_demonstrations as load
        from rlhfkit.trainers.sft import run_sft as run

        config = SFTConfig(train_data=prepared["sft"], columns={"response": "completion"}, **fields)
    else:
        from rlhfkit.trainers.reward import load_preferences as load
        from rlhfkit.trainers.reward import run_reward as run

        config = RewardConfig(train_data=prepared["prefs"], **fields)
    run(config)
    tokens = [_token_count(e) for e in _examples(config, load)]
    rows = [r for r in read_jsonl(out / "metrics.jsonl") if "train/step_seconds" in r]
    times = [r["train/step_seconds"] for r in rows]
    median = statistics.median(times[1:])
    return {
        "median_s": median,
        "first_s": times[0],
        "tok_s": statistics.mean(tokens) * config.batch_size / median,
        "rss_mib": peak_rss_mib(),
        "loss_first": rows[0]["train/loss"],
        "loss_last": rows[-1]["train/loss"],
        "foreign_cores": machine.foreign_cores(),
    }


def _token_count(example) -> int:
    """Non-padding tokens of one SFT example, or of all rows of one preference example."""
    if hasattr(example, "input_ids"):
        return len(example.input_ids)
    return sum(len(example.prompt_ids) + len(r) for r in example.response_ids)


def _examples(config, loader):
    from rlhfkit.models.loading import load_tokenizer

    tokenizer = load_tokenizer(config.model)
    return loader(config.train_data, tokenizer, config, config.train_split, None)


# ----------------------------------------------------------------------------- runs
def run_ours(bench: str, work: Path, run: int, args: argparse.Namespace) -> dict:
    """One rlhfkit run in a fresh process."""
    spec = f"{bench}:{work / 'prepared.json'}:{work / f'{bench}-{run}'}"
    cmd = [sys.executable, __file__, "--child", spec, "--steps", str(args.steps),
           "--threads", str(args.threads)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    if proc.returncode or not lines:
        sys.exit(f"rlhfkit {bench} run {run} failed:\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT ") :])


def run_trl(bench: str, work: Path, run: int, args: argparse.Namespace) -> dict:
    """One run of benchmarks/trl's TRL script for the same workload, right after ours."""
    out = work / f"trl-{bench}-{run}"
    cmd = [str(args.trl_python), str(TRL_DIR / f"trl_{bench}_bench.py"),
           "--assets", str(args.assets), "--steps", str(args.steps),
           "--out-dir", str(out), "--json", str(out) + ".json"]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode:
        sys.exit(f"TRL {bench} run {run} failed:\n{proc.stderr[-3000:]}")
    res = json.loads(Path(str(out) + ".json").read_text())
    return {
        "median_s": res["sec_per_step_median"],
        "first_s": res["first_step_s"],
        "tok_s": res.get("tokens_per_s", float("nan")),
        "rss_mib": res["peak_rss_mib"],
        "loss_first": res["loss_first"],
        "loss_last": res["loss_last"],
        "foreign_cores": res["contention"]["foreign_cores"],
    }


# ----------------------------------------------------------------------------- report
def _column(results: list[dict]) -> list[str]:
    return [
        spread([r["median_s"] for r in results], ".3f"),
        f"{statistics.median(r['first_s'] for r in results):.2f}",
        f"{statistics.median(r['tok_s'] for r in results):.0f}",
        spread([r["rss_mib"] for r in results], ".0f"),
        f"{results[0]['loss_first']:.4f} -> {results[0]['loss_last']:.4f}",
        f"{max(r['foreign_cores'] for r in results):.2f}",
    ]


def report(bench: str, ours: list[dict], trl: list[dict]) -> None:
    readme = TRL_README[bench]
    columns = [("rlhfkit (measured here)", _column(ours))]
    if trl:
        columns.append(("TRL 1.16 (measured here, paired)", _column(trl)))
    columns.append((
        "TRL 1.16 (README, not measured here)",
        [" / ".join(f"{x:.3f}" for x in readme["s_step"]), f"{readme['first_s']:.2f}",
         str(readme["tok_s"]), str(readme["rss"]), "-", "<= 0.06"],
    ))  # fmt: skip
    rows = ["s/step min/med/max", "first step s (median)", "tokens/s (median)",
            "peak RSS MiB min/med/max", "loss step 1 -> last (run 1)", "foreign cores (max)"]  # fmt: skip
    what = "16 sequences/step" if bench == "sft" else "8 pairs/step"
    print(f"\n{bench}: {what}, {len(ours)} runs")
    print(f"  {'':28}" + "".join(f"{title:>38}" for title, _ in columns))
    for i, name in enumerate(rows):
        print(f"  {name:28}" + "".join(f"{values[i]:>38}" for _, values in columns))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--assets", type=Path, default=None, help="benchmarks/trl/make_assets.py's output"
    )
    parser.add_argument("--runs", type=int, default=3, help="runs per bench (fresh processes)")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument("--bench", nargs="+", choices=list(SETTINGS), default=list(SETTINGS))
    parser.add_argument("--trl-python", type=Path, help="python of a TRL venv: also run TRL")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # internal: "bench:prepared.json:out"
    args = parser.parse_args()
    if args.child:
        bench, prepared, out = args.child.split(":")
        result = child(bench, json.loads(Path(prepared).read_text()), Path(out), args.steps,
                       args.threads)  # fmt: skip
        print("RESULT " + json.dumps(result))
        return
    if args.trl_python and args.assets is None:
        parser.error(
            "--trl-python needs --assets (the TRL scripts read benchmarks/trl/make_assets.py's assets)"
        )
    command = shlex.join([Path(sys.executable).name, *sys.argv])
    results: dict[str, dict[str, list[dict]]] = {b: {"ours": [], "trl": []} for b in args.bench}
    with tempfile.TemporaryDirectory(prefix="bench_train_") as tmp:
        work = Path(tmp)
        prepared = prepare(args.assets, work)
        (work / "prepared.json").write_text(json.dumps(prepared))
        print(f"data: {prepared['data']}; weights: {prepared['weights']}, "
              f"{prepared['params'] / 1e6:.2f} M parameters")  # fmt: skip
        # Interleaved, so that both libraries meet the same background load.
        for run in range(args.runs):
            for bench in args.bench:
                results[bench]["ours"].append(run_ours(bench, work, run, args))
                if args.trl_python:
                    results[bench]["trl"].append(run_trl(bench, work, run, args))
    for bench, rows in results.items():
        report(bench, rows["ours"], rows["trl"])
    print(f"\ncommand: {command}")
    if args.json:
        args.json.write_text(json.dumps({"command": command, "prepared": prepared,
                                         "results": results}, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
