#!/usr/bin/env python
"""CPU benchmark of TRL's GRPOTrainer / RLOOTrainer (``trl.GRPOTrainer``, ``trl.RLOOTrainer``).

Online RL with group sampling on assets/prompts.jsonl (standard, non-conversational
prompts), generation through ``transformers.generate`` (no vLLM on CPU).

One *iteration* = one trainer step = generate --completions completions
(--completions / --num-generations distinct prompts x --num-generations samples each,
--response-length new tokens max) + score + one optimizer step over them
(steps_per_generation=1, num_iterations=1, gradient_accumulation_steps=1).

Reward (--reward): ``digits`` = Python function trl_common.digit_reward (TRL supports
plain callables ``f(prompts, completions, **kw) -> list[float]``), or ``rm`` = the tiny
reward model (assets/reward_model) passed as a PreTrainedModel reward.

Prints seconds per iteration (median after the first), generation tokens/s, peak RSS,
mean reward at start vs end (TRL's logged ``reward``) and the library-agnostic eval
(trl_common.eval_policy on 64 held-out prompts) before/after.
"""

import argparse
import time

import torch
import trl_common as pc  # before datasets and transformers: it sets the offline variables
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer


def digits_reward_func(prompts, completions, **kwargs):
    return [pc.digit_reward(c) for c in completions]


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--assets", default=pc.DEFAULT_ASSETS)
    ap.add_argument("--algo", choices=["grpo", "rloo"], default="grpo")
    ap.add_argument("--reward", choices=["digits", "rm"], default="digits")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--completions", type=int, default=32, help="completions per iteration")
    ap.add_argument(
        "--num-generations", type=int, default=4, help="samples per prompt (group size)"
    )
    ap.add_argument("--response-length", type=int, default=32)
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--beta", type=float, default=0.04, help="KL coef (0 = no reference model)")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--eval-prompts", type=int, default=64)
    ap.add_argument(
        "--trl-defaults", action="store_true", help="keep TRL's bf16/grad-ckpt defaults"
    )
    ap.add_argument("--json", default=None)
    ap.add_argument("--out-dir", default=None)
    args = ap.parse_args()

    if args.algo == "grpo":
        from trl import GRPOConfig as Config
        from trl import GRPOTrainer as Trainer
    else:
        from trl import RLOOConfig as Config
        from trl import RLOOTrainer as Trainer

    A = pc.assets(args.assets)
    torch.manual_seed(args.seed)
    tok = AutoTokenizer.from_pretrained(A / "tokenizer")
    policy = AutoModelForCausalLM.from_pretrained(A / "policy")
    eval_rm = AutoModelForSequenceClassification.from_pretrained(A / "reward_model", num_labels=1)
    if args.reward == "digits":
        reward_funcs, reward_tok = digits_reward_func, None
    else:
        reward_funcs = AutoModelForSequenceClassification.from_pretrained(
            A / "reward_model", num_labels=1
        )
        reward_tok = tok

    prompts = [r["prompt"] for r in pc.load_jsonl(A / "prompts.jsonl")]
    eval_prompts = [r["prompt"] for r in pc.load_jsonl(A / "preference_test.jsonl")][
        : args.eval_prompts
    ]
    train_ds = Dataset.from_dict({"prompt": prompts})

    fp32 = {} if args.trl_defaults else {"bf16": False, "gradient_checkpointing": False}
    cfg = Config(
        output_dir=args.out_dir or str(pc.OUT_ROOT / args.algo),
        per_device_train_batch_size=args.completions,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        num_iterations=1,
        num_generations=args.num_generations,
        max_completion_length=args.response_length,
        temperature=args.temperature,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        beta=args.beta,
        max_steps=args.iters,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=args.seed,
        use_cpu=True,
        dataloader_num_workers=0,
        **fp32,
    )

    pre = pc.eval_policy(
        policy,
        tok,
        eval_prompts,
        eval_rm,
        max_new_tokens=args.response_length,
        temperature=args.temperature,
    )
    meter = pc.ContentionMeter()
    trainer = Trainer(
        model=policy,
        reward_funcs=reward_funcs,
        args=cfg,
        train_dataset=train_ds,
        processing_class=tok,
        **({"reward_processing_classes": reward_tok} if reward_tok is not None else {}),
    )
    timer = pc.make_step_callback()
    trainer.add_callback(timer)
    gen_timer = pc.GenerateTimer(
        trainer.accelerator.unwrap_model(trainer.model), tok.pad_token_id, tok.eos_token_id
    )

    t0 = time.perf_counter()
    trainer.train()
    train_s = time.perf_counter() - t0
    gen_timer.restore()
    contention = meter.read()

    post = pc.eval_policy(
        policy,
        tok,
        eval_prompts,
        eval_rm,
        max_new_tokens=args.response_length,
        temperature=args.temperature,
    )
    it = timer.step_times()
    rewards = [log["reward"] for log in timer.logs if "reward" in log]
    gen = gen_timer.summary(skip_first_calls=1)
    after = it[1:]
    res = {
        "bench": f"trl_{args.algo}",
        "trainer": f"trl.{Trainer.__name__}",
        "reward": args.reward,
        "config": dict(vars(args)),
        "dtype": "trl-defaults" if args.trl_defaults else "fp32",
        "iterations": len(it),
        "sec_per_iter": pc.stats(after),
        "sec_per_iter_median": pc.stats(after).get("median"),
        "first_iter_s": it[0] if it else None,
        "train_s": train_s,
        "generation": gen,
        "gen_tokens_per_s": gen["gen_tokens_per_s"],
        "e2e_gen_tokens_per_s": args.completions * args.response_length * len(after) / sum(after)
        if after
        else None,
        "train_reward_first": rewards[0] if rewards else None,
        "train_reward_last3": sum(rewards[-3:]) / len(rewards[-3:]) if rewards else None,
        "train_rewards": rewards,
        "first_step_logs": timer.logs[0] if timer.logs else None,
        "eval_before": pre,
        "eval_after": post,
        "contention": contention,
        "peak_rss_mib": pc.peak_rss_mib(),
    }
    print(
        f"[{args.algo}/{args.reward}] {len(it)} iters x {args.completions} completions; sec/iter median "
        f"{res['sec_per_iter_median']:.3f} (min {res['sec_per_iter']['min']:.3f}, max {res['sec_per_iter']['max']:.3f}); "
        f"first {it[0]:.2f}s; gen {gen['gen_tokens_per_s']:.0f} tok/s; peak RSS {res['peak_rss_mib']:.0f} MiB; "
        f"foreign cores {contention['foreign_cores']:.2f}\n"
        f"  train reward {rewards[0]:.4f} -> {res['train_reward_last3']:.4f} (last3); "
        f"eval rm {pre['rm_score']:.4f} -> {post['rm_score']:.4f}; "
        f"eval digits {pre['digit_reward']:.4f} -> {post['digit_reward']:.4f}",
        flush=True,
    )
    pc.emit(res, args.json)


if __name__ == "__main__":
    main()
