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

import argparse
import random
import time

import numpy as np
import torch
import trl_common as pc  # before datasets and transformers: it sets the offline variables
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

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
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--assets", default=pc.DEFAULT_ASSETS)
    ap.add_argument("--reward", choices=["rm", "digits"], default="rm")
    ap.add_argument("--iters", type=int, default=16, help="PPO iterations (rollout+update)")
    ap.add_argument("--batch", type=int, default=32, help="prompts per iteration")
    ap.add_argument("--response-length", type=int, default=32)
    ap.add_argument("--ppo-epochs", type=int, default=4)
    ap.add_argument("--mini-batches", type=int, default=4)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--kl-coef", type=float, default=0.05)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--eval-prompts", type=int, default=64)
    ap.add_argument(
        "--trl-defaults",
        action="store_true",
        help="keep TRL's bf16=True / gradient_checkpointing=True defaults (default: fp32, no ckpt)",
    )
    ap.add_argument(
        "--unseeded-numpy",
        action="store_true",
        help="do not seed numpy (TRL's own behaviour: PPO minibatch order then differs run to run)",
    )
    ap.add_argument("--json", default=None)
    ap.add_argument("--out-dir", default=str(pc.OUT_ROOT / "ppo"))
    args = ap.parse_args()

    A = pc.assets(args.assets)
    torch.manual_seed(args.seed)
    tok = AutoTokenizer.from_pretrained(A / "tokenizer", padding_side="left")

    t_load = time.perf_counter()
    policy = AutoModelForCausalLM.from_pretrained(A / "policy")
    ref_policy = AutoModelForCausalLM.from_pretrained(A / "policy")
    value_model = AutoModelForSequenceClassification.from_pretrained(
        A / "reward_model", num_labels=1
    )
    if args.reward == "rm":
        reward_model = AutoModelForSequenceClassification.from_pretrained(
            A / "reward_model", num_labels=1
        )
    else:
        ppo_mod.get_reward = _patched_get_reward
        reward_model = ProgrammaticReward(pc.digit_reward, tok)
    # separate copy for the library-agnostic eval (never trained)
    eval_rm = AutoModelForSequenceClassification.from_pretrained(A / "reward_model", num_labels=1)
    load_s = time.perf_counter() - t_load

    prompts = [r["prompt"] for r in pc.load_jsonl(A / "prompts.jsonl")]
    eval_prompts = [r["prompt"] for r in pc.load_jsonl(A / "preference_test.jsonl")][
        : args.eval_prompts
    ]
    train_ds = Dataset.from_dict({"input_ids": [tok(p)["input_ids"] for p in prompts]})
    eval_ds = Dataset.from_dict({"input_ids": [tok(p)["input_ids"] for p in eval_prompts[:32]]})

    fp32 = {} if args.trl_defaults else {"bf16": False, "gradient_checkpointing": False}
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
        report_to="none",
        save_strategy="no",
        logging_steps=1,
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
    timer = pc.make_step_callback()
    trainer.add_callback(timer)
    gen_timer = pc.GenerateTimer(policy, tok.pad_token_id, tok.eos_token_id)

    if not args.unseeded_numpy:
        # TRL's PPOTrainer seeds torch only; its minibatch shuffle uses the global numpy RNG
        # (np.random.permutation), so without this runs diverge from iteration 2 on.
        np.random.seed(args.seed)
        random.seed(args.seed)
    meter = pc.ContentionMeter()
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
    scores = [log["objective/scores"] for log in timer.logs if "objective/scores" in log]
    kls = [log["objective/kl"] for log in timer.logs if "objective/kl" in log]
    gen = gen_timer.summary(skip_first_calls=1)
    after_first = it[1:]
    res = {
        "bench": "trl_ppo",
        "trainer": f"{PPO_LOCATION}.PPOTrainer",
        "reward": args.reward,
        "config": {k: v for k, v in vars(args).items() if k not in ("json",)},
        "dtype": "trl-defaults(bf16 autocast, grad ckpt)" if args.trl_defaults else "fp32",
        "iterations": len(it),
        "sec_per_iter": pc.stats(after_first),
        "sec_per_iter_median": pc.stats(after_first).get("median"),
        "first_iter_s": it[0] if it else None,
        "train_s": train_s,
        "load_s": load_s,
        "generation": gen,
        "gen_tokens_per_s": gen["gen_tokens_per_s"],
        "e2e_gen_tokens_per_s": (args.batch * args.response_length * len(after_first))
        / sum(after_first)
        if after_first
        else None,
        "train_score_first": scores[0] if scores else None,
        "train_score_last3": sum(scores[-3:]) / len(scores[-3:]) if scores else None,
        "train_scores": scores,
        "train_kl_last": kls[-1] if kls else None,
        "eval_before": pre,
        "eval_after": post,
        "contention": contention,
        "peak_rss_mib": pc.peak_rss_mib(),
    }
    print(
        f"[ppo/{args.reward}] {len(it)} iters; sec/iter median {res['sec_per_iter_median']:.3f} "
        f"(min {res['sec_per_iter']['min']:.3f}, max {res['sec_per_iter']['max']:.3f}); first {it[0]:.2f}s; "
        f"gen {gen['gen_tokens_per_s']:.0f} tok/s; peak RSS {res['peak_rss_mib']:.0f} MiB; "
        f"foreign cores {contention['foreign_cores']:.2f}\n"
        f"  train score {scores[0]:.4f} -> {res['train_score_last3']:.4f} (last3);  "
        f"eval rm {pre['rm_score']:.4f} -> {post['rm_score']:.4f}; "
        f"eval digits {pre['digit_reward']:.4f} -> {post['digit_reward']:.4f}",
        flush=True,
    )
    pc.emit(res, args.json)


if __name__ == "__main__":
    main()
