#!/usr/bin/env python
"""A shipped pipeline config as a GPU session runs it: its wall time, each stage's seconds and
the evaluation's results table, as one JSON (``pipeline_run.json``, beside the run's report).

    python benchmarks/gpu/pipeline_run.py --config configs/instructions_smollm2_gpu.yaml \\
        --base_model runs/models/SmolLM2-135M-Instruct --out RESULTS/smollm2
    python benchmarks/gpu/pipeline_run.py --config configs/instructions_smollm2_gpu.yaml \\
        --dry-run --out DIR        # on a CPU: the bundled tiny model, 2 steps a stage

The config runs as it ships (``parallel_arms`` included); only ``output_dir`` and
``base_model`` are set here. ``--dry-run`` keeps every stage and setting but shrinks the work
(``DRY_RUN``: 2 steps of a few rows, a few evaluation prompts) and starts from the bundled
tiny GPT-2, so that a GPU call does not fail on a typo in this script or the config.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "src"))

FEW = {"max_steps": 2, "batch_size": 4, "report_to": ["none"], "max_length": 96}
RL_FEW = {"max_steps": 2, "max_new_tokens": 8, "max_prompt_length": 64, "report_to": ["none"]}
DRY_RUN = {
    "sft": {**FEW, "eval_batch_size": 8, "max_train_samples": 8, "max_eval_samples": 4},
    "reward": {**FEW, "eval_batch_size": 8, "max_train_samples": 8, "max_eval_samples": 4},
    "dpo": {**FEW, "eval_batch_size": 8, "max_train_samples": 8, "max_eval_samples": 4},
    "ppo": {**RL_FEW, "rollout_batch_size": 4, "batch_size": 4, "ppo_epochs": 1},
    "grpo": {**RL_FEW, "rollout_batch_size": 2, "batch_size": 8},
    "eval": {"max_prompts": 4, "best_of_n": [1, 2], "best_of_n_prompts": 2,
             "max_comparisons": 8, "num_samples": 2},
}  # fmt: skip


def pipeline_config(config: Path, out: Path, base_model: str | None, dry_run: bool):
    """The config as it ships, into ``out``, from ``base_model`` if given; with ``dry_run``
    from the bundled tiny model, each stage's work shrunk."""
    from rlhfkit.config import load_config
    from rlhfkit.pipeline.config import PipelineConfig

    fields: dict = {"output_dir": str(out)}
    if base_model is not None:
        fields["base_model"] = base_model
    if dry_run:
        shipped = load_config(PipelineConfig, config)
        fields |= {"base_model": None, "ppo_eval_every": 1, "ppo_eval_prompts": 2}
        fields |= {k: {**getattr(shipped, k), **v} for k, v in DRY_RUN.items()}
    return load_config(PipelineConfig, config, **fields)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True, help="the run's folder")
    parser.add_argument("--base_model", help="the model to start from (the config's if unset)")
    parser.add_argument("--dry-run", action="store_true", help="tiny model, 2 steps a stage")
    args = parser.parse_args()

    import torch

    from rlhfkit import checkpoint as ckpt
    from rlhfkit.evaluation.report import load_eval, results_table
    from rlhfkit.pipeline.config import stage_configs
    from rlhfkit.pipeline.run import TIMINGS_FILE, run_pipeline

    config = pipeline_config(args.config, args.out, args.base_model, args.dry_run)
    started = time.perf_counter()
    report = run_pipeline(config)
    seconds = time.perf_counter() - started
    result = load_eval(stage_configs(config).eval.output)
    record = {
        "config": str(args.config),
        "base_model": config.base_model or "the bundled tiny GPT-2",
        "dry_run": args.dry_run,
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "seconds": seconds,
        "stages": ckpt.read_json(args.out / TIMINGS_FILE),
        "results_table": results_table(result["rows"]),
        "report": str(report),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
    }
    (args.out / "pipeline_run.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"pipeline: {seconds:.1f} s; results on held-out prompts:\n{record['results_table']}")


if __name__ == "__main__":
    main()
