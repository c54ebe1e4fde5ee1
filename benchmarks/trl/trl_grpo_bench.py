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

import trl_common as pc  # before datasets and transformers: it sets the offline variables
from datasets import Dataset
from transformers import AutoModelForCausalLM


def digits_reward_func(prompts, completions, **kwargs):
    return [pc.digit_reward(c) for c in completions]


def main():
    ap = pc.arg_parser(__doc__)
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
    pc.add_run_args(ap, eval_prompts=True)
    pc.add_output_args(ap, None)  # default: runs/trl-out/ALGO
    args = ap.parse_args()

    if args.algo == "grpo":
        from trl import GRPOConfig as Config
        from trl import GRPOTrainer as Trainer
    else:
        from trl import RLOOConfig as Config
        from trl import RLOOTrainer as Trainer

    A, tok = pc.open_assets(args)
    policy = AutoModelForCausalLM.from_pretrained(A / "policy")
    eval_rm = pc.load_reward_model(A / "reward_model")
    if args.reward == "digits":
        reward_funcs, reward_tok = digits_reward_func, None
    else:
        reward_funcs, reward_tok = pc.load_reward_model(A / "reward_model"), tok

    prompts, eval_prompts = pc.load_prompts(A, args.eval_prompts)
    train_ds = Dataset.from_dict({"prompt": prompts})

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
        **pc.cpu_args(args),
    )

    pre = pc.eval_rollouts(policy, tok, eval_prompts, eval_rm, args)
    meter = pc.ContentionMeter()
    trainer = Trainer(
        model=policy,
        reward_funcs=reward_funcs,
        args=cfg,
        train_dataset=train_ds,
        processing_class=tok,
        **({"reward_processing_classes": reward_tok} if reward_tok is not None else {}),
    )
    gen_timer = pc.GenerateTimer(
        trainer.accelerator.unwrap_model(trainer.model), tok.pad_token_id, tok.eos_token_id
    )
    timer, train_s, contention = pc.timed_train(trainer, meter, gen_timer)

    post = pc.eval_rollouts(policy, tok, eval_prompts, eval_rm, args)
    rewards = timer.series("reward")
    res = {
        "bench": f"trl_{args.algo}",
        "trainer": f"trl.{Trainer.__name__}",
        "reward": args.reward,
        "config": dict(vars(args)),
        "dtype": pc.dtype_label(args),
        **pc.iteration_summary(
            timer, gen_timer, args.completions * args.response_length, train_s=train_s
        ),
        **pc.first_last3("train_reward", rewards),
        "first_step_logs": timer.logs[0] if timer.logs else None,
        "eval_before": pre,
        "eval_after": post,
        "contention": contention,
        "peak_rss_mib": pc.peak_rss_mib(),
    }
    print(
        f"[{args.algo}/{args.reward}] {res['iterations']} iters x {args.completions} completions; "
        + pc.iteration_report(res)
        + f"  train reward {rewards[0]:.4f} -> {res['train_reward_last3']:.4f} (last3); "
        + pc.eval_report(pre, post),
        flush=True,
    )
    pc.emit(res, args.json)


if __name__ == "__main__":
    main()
