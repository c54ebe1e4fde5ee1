#!/usr/bin/env python
"""CPU benchmark of TRL's PPOTrainer on the tiny offline assets from make_assets.py.

PPO is *not* in the newest TRL: it lived in ``trl.PPOTrainer`` (<= 0.2x), then in
``trl.experimental.ppo`` (0.26 ... 1.12.0) and was removed in TRL 1.13.0.  Run this
script with the TRL 1.12.0 venv (`make trl`'s .venv-trl-ppo, see README.md).

Reward variants (--reward):
  rm      the tiny reward model (assets/reward_model), TRL's native path.
  digits  programmatic reward ``trl_common.digit_reward`` on the decoded completion.
          TRL's PPOTrainer only accepts a ``PreTrainedModel`` reward; this bench plugs a
          Python function in by patching ``trl.experimental.ppo.ppo_trainer.get_reward``
          for a parameter-free stand-in module (the value model still uses the original).

Prints seconds per PPO iteration (rollout + all PPO epochs; median over iterations
after the first), generation tokens/s, peak RSS, and reward at start vs end both from
TRL's own logs (objective/scores) and from a fixed library-agnostic eval
(trl_common.eval_policy on 64 held-out prompts).
"""

import random
import time

import numpy as np
import torch
import trl_common as pc  # before datasets and transformers: it sets the offline variables
from datasets import Dataset
from transformers import AutoModelForCausalLM

try:  # TRL 0.26 ... 1.12
    import trl.experimental.ppo.ppo_trainer as ppo_mod
    from trl.experimental.ppo import PPOConfig, PPOTrainer

    PPO_LOCATION = "trl.experimental.ppo"
except ImportError:  # TRL <= 0.25
    try:
        import trl.trainer.ppo_trainer as ppo_mod
        from trl import PPOConfig, PPOTrainer

        PPO_LOCATION = "trl.PPOTrainer"
    except ImportError as e:
        import trl

        raise SystemExit(
            f"TRL {trl.__version__} has no PPOTrainer (removed in 1.13.0; last in trl.experimental.ppo of "
            f"1.12.0). Use .venv-trl-ppo/bin/python (make trl). ImportError: {e}"
        ) from e


class ProgrammaticReward(torch.nn.Module):
    """Parameter-free stand-in passed as ``reward_model``; scored by the patched get_reward."""

    base_model_prefix = "unused"

    def __init__(self, fn, tok):
        super().__init__()
        self.fn = fn
        self.tok = tok


_orig_get_reward = ppo_mod.get_reward


def _patched_get_reward(model, query_responses, pad_token_id, context_length):
    if not isinstance(model, ProgrammaticReward):
        return _orig_get_reward(model, query_responses, pad_token_id, context_length)
    responses = query_responses[:, context_length:]
    texts = model.tok.batch_decode(responses, skip_special_tokens=True)
    scores = torch.tensor(
        [model.fn(t) for t in texts], dtype=torch.float32, device=query_responses.device
    )
    seq_lens = ppo_mod.first_true_indices(responses == pad_token_id) - 1 + context_length
    return None, scores, seq_lens


def main():
    ap = pc.arg_parser(__doc__)
    ap.add_argument("--reward", choices=["rm", "digits"], default="rm")
    ap.add_argument("--iters", type=int, default=16, help="PPO iterations (rollout+update)")
    ap.add_argument("--batch", type=int, default=32, help="prompts per iteration")
    ap.add_argument("--response-length", type=int, default=32)
    ap.add_argument("--ppo-epochs", type=int, default=4)
    ap.add_argument("--mini-batches", type=int, default=4)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--kl-coef", type=float, default=0.05)
    ap.add_argument("--temperature", type=float, default=1.0)
    pc.add_run_args(
        ap,
        eval_prompts=True,
        trl_defaults_help="keep TRL's bf16=True / gradient_checkpointing=True defaults (default: fp32, no ckpt)",
    )
    ap.add_argument(
        "--unseeded-numpy",
        action="store_true",
        help="do not seed numpy (TRL's own behaviour: PPO minibatch order then differs run to run)",
    )
    pc.add_output_args(ap, "ppo")
    args = ap.parse_args()

    A, tok = pc.open_assets(args, padding_side="left")

    t_load = time.perf_counter()
    policy = AutoModelForCausalLM.from_pretrained(A / "policy")
    ref_policy = AutoModelForCausalLM.from_pretrained(A / "policy")
    value_model = pc.load_reward_model(A / "reward_model")
    if args.reward == "rm":
        reward_model = pc.load_reward_model(A / "reward_model")
    else:
        ppo_mod.get_reward = _patched_get_reward
        reward_model = ProgrammaticReward(pc.digit_reward, tok)
    # separate copy for the library-agnostic eval (never trained)
    eval_rm = pc.load_reward_model(A / "reward_model")
    load_s = time.perf_counter() - t_load

    prompts, eval_prompts = pc.load_prompts(A, args.eval_prompts)
    train_ds = Dataset.from_dict({"input_ids": [tok(p)["input_ids"] for p in prompts]})
    eval_ds = Dataset.from_dict({"input_ids": [tok(p)["input_ids"] for p in eval_prompts[:32]]})

    cfg = PPOConfig(
        output_dir=args.out_dir,
        per_device_train_batch_size=args.batch,  # = rollout batch (gradient_accumulation_steps=1)
        gradient_accumulation_steps=1,
        num_mini_batches=args.mini_batches,  # -> batch/mini_batches sequences per optimizer step
        num_ppo_epochs=args.ppo_epochs,
        local_rollout_forward_batch_size=args.batch,
        total_episodes=args.iters * args.batch,
        response_length=args.response_length,
        stop_token="eos",
        temperature=args.temperature,
        learning_rate=args.lr,
        kl_coef=args.kl_coef,
        num_sample_generations=0,
        **pc.cpu_args(args),
    )

    pre = pc.eval_rollouts(policy, tok, eval_prompts, eval_rm, args)

    trainer = PPOTrainer(
        args=cfg,
        processing_class=tok,
        model=policy,
        ref_model=ref_policy,
        reward_model=reward_model,
        value_model=value_model,
        train_dataset=train_ds,
        eval_dataset=eval_ds,
    )
    gen_timer = pc.GenerateTimer(policy, tok.pad_token_id, tok.eos_token_id)

    if not args.unseeded_numpy:
        # TRL's PPOTrainer seeds torch only; its minibatch shuffle uses the global numpy RNG
        # (np.random.permutation), so without this runs diverge from iteration 2 on.
        np.random.seed(args.seed)
        random.seed(args.seed)
    meter = pc.ContentionMeter()
    timer, train_s, contention = pc.timed_train(trainer, meter, gen_timer)

    post = pc.eval_rollouts(policy, tok, eval_prompts, eval_rm, args)

    scores = timer.series("objective/scores")
    kls = timer.series("objective/kl")
    res = {
        "bench": "trl_ppo",
        "trainer": f"{PPO_LOCATION}.PPOTrainer",
        "reward": args.reward,
        "config": {k: v for k, v in vars(args).items() if k not in ("json",)},
        "dtype": "trl-defaults(bf16 autocast, grad ckpt)" if args.trl_defaults else "fp32",
        **pc.iteration_summary(
            timer, gen_timer, args.batch * args.response_length, train_s=train_s, load_s=load_s
        ),
        **pc.first_last3("train_score", scores),
        "train_kl_last": kls[-1] if kls else None,
        "eval_before": pre,
        "eval_after": post,
        "contention": contention,
        "peak_rss_mib": pc.peak_rss_mib(),
    }
    print(
        f"[ppo/{args.reward}] {res['iterations']} iters; "
        + pc.iteration_report(res)
        + f"  train score {scores[0]:.4f} -> {res['train_score_last3']:.4f} (last3);  "
        + pc.eval_report(pre, post),
        flush=True,
    )
    pc.emit(res, args.json)


if __name__ == "__main__":
    main()
