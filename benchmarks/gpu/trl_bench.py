#!/usr/bin/env python
"""TRL's trainers on the GPU workloads of ``workloads.py``, the counterpart of ``rlhfkit_bench.py``:
seconds per iteration, tokens per second inside generation, peak CUDA memory and MFU.

    PYTHONPATH=$TRL112_PATH python benchmarks/gpu/trl_bench.py --workload ppo  --assets DIR
    PYTHONPATH=$TRL116_PATH python benchmarks/gpu/trl_bench.py --workload grpo --assets DIR
    (dpo, sft likewise under TRL 1.16; --smoke: tiny model on a CPU)

PPO exists only up to TRL 1.12.0 (``trl.experimental.ppo``; removed in 1.13.0), so ``ppo``
needs TRL 1.12 and the others are meant for TRL 1.16; the script says which TRL it found and
warns on any other version. Workloads, data and models are ``workloads.py``'s, the same as
rlhfkit's. Iterations are timed between consecutive ``on_step_end`` callbacks (TRL's whole
step: data, generation, update, logging), each after a CUDA synchronisation; the median
leaves out the warm-up. Generation is timed by wrapping the policy's ``generate``.

Settings (TRL's fastest correct setting on one GPU; all dropout is 0 in the models):
- every trainer: ``bf16=True`` (bf16 autocast, fp32 master weights), SDPA attention,
  ``gradient_checkpointing=False`` (TRL's default is True: slower, and memory is no issue
  here), ``optim="adamw_torch_fused"``, TF32 for fp32 products (both libraries; ``--no-tf32``);
  Liger kernels off (not installed), no vLLM (not installed), no packing.
- PPO (1.12): ``PPOTrainer`` builds its own ``Accelerator()``, which ignores ``bf16=True`` and
  reads ``ACCELERATE_MIXED_PRECISION`` (what ``accelerate launch --mixed_precision bf16``
  sets): set to bf16 here, so the update runs in bf16 autocast. Generation and the rollout's
  reference, critic and reward passes bypass accelerate's wrapper and stay fp32 (TF32): that
  is how TRL runs them. ``--autocast-all`` (not a TRL option) runs all of ``train()`` under
  bf16 autocast, to show how much of the gap is that precision. ``stop_token=None``: EOS does
  not end a response, all are 128 tokens. Separate critic from the reward model, as rlhfkit.
- GRPO (1.16): ``generation_kwargs={"min_new_tokens": N}`` so no completion ends early;
  ``steps_per_generation=1``, ``num_iterations=1``, beta 0.04 (a reference model), the
  default ``loss_type="dapo"``.
- DPO (1.16): ``precompute_ref_log_probs=True`` with no reference model (the policy gives
  them before step 1, as rlhfkit does; ``init_sec``); ``padding_free`` is unavailable in 1.16
  ("temporarily unavailable since the DPO refactor") and every row is 512 tokens anyway.
- SFT (1.16): prompt/completion data, completion-only loss (TRL's default for such data),
  ``padding_free=False`` (it needs FlashAttention, not installed; rows are all 512 tokens).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import workloads as wl  # noqa: E402  (sets the offline variables before transformers loads)


def trl_version() -> str:
    import trl

    return trl.__version__


def check_version(name: str) -> str:
    version = trl_version()
    wanted = "1.12" if name == "ppo" else "1.16"
    if not version.startswith(wanted):
        print(
            f"WARNING: TRL {version} found; the {name} bench is meant for TRL {wanted}.x",
            flush=True,
        )
    return version


def step_timer():
    """A TrainerCallback recording the wall time of each step (between consecutive
    ``on_step_end``, the first from ``on_train_begin``) and every log."""
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.ends: list[float] = []
            self.logs: list[dict] = []

        def on_train_begin(self, args, state, control, **kwargs):
            wl.sync()
            self.ends = [time.perf_counter()]

        def on_step_end(self, args, state, control, **kwargs):
            wl.sync()
            self.ends.append(time.perf_counter())
            print(
                f"  iteration {len(self.ends) - 1}: {self.ends[-1] - self.ends[-2]:.3f} s",
                flush=True,
            )

        def on_log(self, args, state, control, logs=None, **kwargs):
            self.logs.append(dict(logs or {}))

        def times(self) -> list[float]:
            return [b - a for a, b in zip(self.ends, self.ends[1:], strict=False)]

    return StepTimer()


def timed_generate(model, pad_id: int) -> wl.GenerationTimer:
    """Wrap ``model.generate`` (an instance attribute: TRL calls it on the same module)."""

    def length_of(output, args, kwargs) -> float:
        sequences = output.sequences if hasattr(output, "sequences") else output
        new = sequences[:, kwargs["input_ids"].shape[1] :]
        return (new != pad_id).sum(1).float().mean().item()

    timer = wl.GenerationTimer(model.generate, length_of)
    model.generate = timer
    return timer


def training_args(w: wl.Workload, out: str) -> dict:
    """The TrainingArguments every TRL trainer gets here."""
    import torch

    return {
        "output_dir": out,
        "learning_rate": w.learning_rate,
        "lr_scheduler_type": "constant",
        "bf16": True,
        "gradient_checkpointing": False,
        "optim": "adamw_torch_fused",
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
        "disable_tqdm": True,
        "seed": 42,
        "dataloader_num_workers": 0,
        "use_cpu": not torch.cuda.is_available(),
    }


def load_lm(path: Path):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="sdpa"
    )


def load_seqcls(path: Path):
    import torch
    from transformers import AutoModelForSequenceClassification

    return AutoModelForSequenceClassification.from_pretrained(
        path, num_labels=1, dtype=torch.float32, attn_implementation="sdpa"
    )


# ----------------------------------------------------------------------------- workloads
def run_ppo(w: wl.Workload, assets: Path, args, out: str):
    # Read by the Accelerator() that PPOTrainer builds (it ignores bf16=True): set before it.
    os.environ["ACCELERATE_MIXED_PRECISION"] = "bf16"
    import numpy as np
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl.experimental.ppo import PPOConfig, PPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(assets / "tokenizer", padding_side="left")
    policy, reference = load_lm(assets / "policy"), load_lm(assets / "policy")
    critic, reward_model = (
        load_seqcls(assets / "reward_model"),
        load_seqcls(assets / "reward_model"),
    )
    ids = [r["input_ids"] for r in wl.read_jsonl(assets / "prompts.jsonl")]
    config = PPOConfig(
        per_device_train_batch_size=w.batch,  # the rollout batch (gradient_accumulation_steps=1)
        gradient_accumulation_steps=1,
        num_mini_batches=w.minibatches,
        num_ppo_epochs=w.epochs,
        local_rollout_forward_batch_size=w.batch,
        total_episodes=w.iterations * w.batch,
        response_length=w.new_tokens,
        stop_token=None,  # EOS ends nothing: every response is response_length tokens
        temperature=1.0,
        kl_coef=0.05,
        num_sample_generations=0,
        **training_args(w, out),
    )
    started = time.perf_counter()
    trainer = PPOTrainer(
        args=config,
        processing_class=tokenizer,
        model=policy,
        ref_model=reference,
        reward_model=reward_model,
        value_model=critic,
        train_dataset=Dataset.from_dict({"input_ids": ids}),
        eval_dataset=Dataset.from_dict({"input_ids": ids[: w.batch]}),
    )
    init = time.perf_counter() - started
    timer = step_timer()
    trainer.add_callback(timer)
    gen = timed_generate(policy, tokenizer.pad_token_id)
    np.random.seed(42)  # PPOTrainer shuffles minibatches with numpy's global RNG
    random.seed(42)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    autocast = torch.autocast(device, dtype=torch.bfloat16) if args.autocast_all else nullcontext()
    with autocast:
        trainer.train()
    logs = [entry for entry in timer.logs if "objective/kl" in entry]
    extra = {
        "init_sec": init,
        "accelerate_mixed_precision": trainer.accelerator.mixed_precision,
        "eos_tokens_sampled_last": logs[-1].get("val/num_eos_tokens") if logs else None,
        "autocast_all": args.autocast_all,
    }
    return timer.times(), gen, extra


def run_grpo(w: wl.Workload, assets: Path, args, out: str):
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    def digits(prompts, completions, **kwargs):
        return wl.digit_reward(completions)

    tokenizer = AutoTokenizer.from_pretrained(assets / "tokenizer")
    policy = load_lm(assets / "policy")
    prompts = [r["prompt"] for r in wl.read_jsonl(assets / "prompts.jsonl")]
    config = GRPOConfig(
        per_device_train_batch_size=w.rows,  # completions = prompts x generations
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        num_iterations=1,
        num_generations=w.generations,
        max_completion_length=w.new_tokens,
        generation_kwargs={"min_new_tokens": w.new_tokens},  # no completion ends early
        temperature=1.0,
        beta=0.04,
        max_steps=w.iterations,
        **training_args(w, out),
    )
    started = time.perf_counter()
    trainer = GRPOTrainer(
        model=policy,
        reward_funcs=digits,
        args=config,
        train_dataset=Dataset.from_dict({"prompt": prompts}),
        processing_class=tokenizer,
    )
    init = time.perf_counter() - started
    timer = step_timer()
    trainer.add_callback(timer)
    gen = timed_generate(policy, tokenizer.pad_token_id)
    trainer.train()
    lengths = [
        entry["completions/mean_length"]
        for entry in timer.logs
        if "completions/mean_length" in entry
    ]
    extra = {"init_sec": init, "library_response_length": lengths[-1] if lengths else None}
    return timer.times(), gen, extra


def _offline_trainer(w: wl.Workload, assets: Path, out: str, kind: str):
    """DPO or SFT: (trainer, init seconds)."""
    from datasets import Dataset
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(assets / "tokenizer")
    policy = load_lm(assets / "policy")
    if kind == "dpo":
        from trl import DPOConfig as Config
        from trl import DPOTrainer as Trainer

        rows = wl.read_jsonl(assets / "pairs.jsonl")
        fields = {
            "beta": 0.1,
            "precompute_ref_log_probs": True,
            "precompute_ref_batch_size": 2 * w.batch,
        }
        extra_kwargs = {"ref_model": None}
    else:
        from trl import SFTConfig as Config
        from trl import SFTTrainer as Trainer

        rows = wl.read_jsonl(assets / "sft.jsonl")
        fields = {"packing": False, "padding_free": False}
        extra_kwargs = {}
    config = Config(
        per_device_train_batch_size=w.batch,
        gradient_accumulation_steps=1,
        max_steps=w.iterations,
        max_length=w.seq_len,
        **fields,
        **training_args(w, out),
    )
    started = time.perf_counter()
    trainer = Trainer(
        model=policy,
        args=config,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        **extra_kwargs,
    )
    wl.sync()
    return trainer, time.perf_counter() - started


def run_offline(w: wl.Workload, assets: Path, args, out: str):
    trainer, init = _offline_trainer(w, assets, out, w.name)
    timer = step_timer()
    trainer.add_callback(timer)
    trainer.train()
    tokens = [entry["num_tokens"] for entry in timer.logs if "num_tokens" in entry]
    losses = [entry["loss"] for entry in timer.logs if "loss" in entry]
    extra = {
        "init_sec": init,
        # TRL's own count of the (non-padding) tokens it trained on per step.
        "tokens_per_step": tokens[-1] - tokens[-2] if len(tokens) > 1 else None,
        "loss_first_last": [losses[0], losses[-1]] if losses else None,
    }
    return timer.times(), None, extra


RUNS = {"ppo": run_ppo, "grpo": run_grpo, "dpo": run_offline, "sft": run_offline}


def bench(name: str, args) -> dict:
    import accelerate
    import torch
    import transformers

    version = check_version(name)
    wl.setup_torch(not args.no_tf32)
    assets = wl.assets_for(args.assets, args.smoke, args.shape)
    manifest = wl.read_manifest(assets)
    w = wl.workload(name, manifest)
    print(f"TRL {version} {name}: {w} on {wl.device_info()['name']}", flush=True)
    with tempfile.TemporaryDirectory(prefix=f"trl-{name}-") as out:
        times, gen, extra = RUNS[name](w, assets, args, out)
    if len(times) != w.iterations:
        raise RuntimeError(f"{len(times)} steps timed, {w.iterations} expected")
    settings = {
        "precision": "bf16 autocast (bf16=True), fp32 weights",
        "attention": "sdpa",
        "gradient_checkpointing": False,
        "tf32": not args.no_tf32,
        "optimizer": "adamw_torch_fused",
        "versions": {
            "trl": version,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "accelerate": accelerate.__version__,
        },
    }
    return wl.summarize_run(
        "trl",
        w,
        times,
        gen.seconds if gen else [],
        gen.lengths if gen else [],
        manifest,
        {"settings": settings, **extra},
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workload", choices=wl.WORKLOADS, required=True)
    parser.add_argument("--smoke", action="store_true", help="tiny model, 3 iterations (CPU)")
    parser.add_argument("--shape", choices=wl.SHAPES, default="gpt2", help="the models' shape")
    parser.add_argument("--assets", type=Path, default=None, help="workloads.py --prepare DIR")
    parser.add_argument("--json", type=Path, default=None, help="also write the result here")
    parser.add_argument("--no-tf32", action="store_true", help="full fp32 for fp32 products")
    parser.add_argument(
        "--autocast-all",
        action="store_true",
        help="PPO: all of train() under bf16 autocast, generation included (not a TRL option)",
    )
    args = parser.parse_args()
    result = bench(args.workload, args)
    wl.emit(result, args.json)
    print(wl.table([result]))


if __name__ == "__main__":
    main()
