#!/usr/bin/env python
"""CPU benchmark of TRL's RewardTrainer (``trl.RewardTrainer``) on the offline assets.

Starts from assets/reward_model_init (policy backbone + seeded random score head,
GPT2ForSequenceClassification num_labels=1) and trains a Bradley-Terry reward model
on assets/preference.jsonl (explicit prompt; TRL appends EOS and concatenates
prompt+chosen / prompt+rejected).  File-order batches, constant LR, AdamW, fp32.

Prints seconds per step (median after the first), peak RSS, loss start/end, the
step-1 parity values, and held-out pair accuracy on preference_test.jsonl measured
both by TRL's evaluate() and by the library-agnostic trl_common.rm_pair_accuracy
(before and after training).
"""

import argparse
import time

import torch
import trl_common as pc  # before datasets and transformers: it sets the offline variables
from datasets import Dataset
from transformers import AutoModelForSequenceClassification, AutoTokenizer
from trl import RewardConfig, RewardTrainer


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--assets", default=pc.DEFAULT_ASSETS)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch", type=int, default=8, help="preference pairs per step")
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--max-length", type=int, default=128)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--shuffle", action="store_true")
    ap.add_argument(
        "--trl-defaults", action="store_true", help="keep TRL's bf16/grad-ckpt defaults"
    )
    ap.add_argument("--json", default=None)
    ap.add_argument("--out-dir", default=str(pc.OUT_ROOT / "rm"))
    args = ap.parse_args()

    A = pc.assets(args.assets)
    torch.manual_seed(args.seed)
    tok = AutoTokenizer.from_pretrained(A / "tokenizer")
    model = AutoModelForSequenceClassification.from_pretrained(
        A / "reward_model_init", num_labels=1
    )
    train = Dataset.from_list(pc.load_jsonl(A / "preference.jsonl"))
    test_rows = pc.load_jsonl(A / "preference_test.jsonl")
    test = Dataset.from_list(test_rows)

    acc_before = pc.rm_pair_accuracy(model, tok, test_rows)
    cfg = RewardConfig(
        **pc.common_training_args(args), max_length=args.max_length, per_device_eval_batch_size=32
    )
    meter = pc.ContentionMeter()
    t_init = time.perf_counter()
    trainer = RewardTrainer(
        model=model, args=cfg, train_dataset=train, eval_dataset=test, processing_class=tok
    )
    init_s = time.perf_counter() - t_init
    timer = pc.make_step_callback()
    trainer.add_callback(timer)
    t0 = time.perf_counter()
    trainer.train()
    train_s = time.perf_counter() - t0
    contention = meter.read()

    res = {
        "bench": "trl_rm",
        "trainer": "trl.RewardTrainer",
        "config": dict(vars(args)),
        "dtype": "trl-defaults" if args.trl_defaults else "fp32",
        "init_s": init_s,
        "train_s": train_s,
    }
    res.update(pc.step_summary(timer))
    first = res["first_step_logs"] or {}
    res["parity_step1"] = {
        k: first.get(k)
        for k in ("loss", "accuracy", "margin", "mean_reward", "grad_norm", "num_tokens")
    }
    ntok = [log["num_tokens"] for log in timer.logs if "num_tokens" in log]
    if ntok and len(timer.step_ends) > 1:
        res["tokens_per_s"] = (ntok[-1] - ntok[0]) / (timer.step_ends[-1] - timer.step_ends[0])
    res["contention"] = contention
    ev = trainer.evaluate()
    res["eval_after_trl"] = {k: ev.get(k) for k in ("eval_loss", "eval_accuracy", "eval_margin")}
    res["heldout_acc_before"] = acc_before
    res["heldout_acc_after"] = pc.rm_pair_accuracy(trainer.model, tok, test_rows)
    res["peak_rss_mib"] = pc.peak_rss_mib()
    print(
        f"[rm] {res['steps']} steps x {args.batch} pairs; sec/step median {res['sec_per_step_median']:.3f} "
        f"(min {res['sec_per_step']['min']:.3f}, max {res['sec_per_step']['max']:.3f}); first {res['first_step_s']:.2f}s; "
        f"peak RSS {res['peak_rss_mib']:.0f} MiB; foreign cores {contention['foreign_cores']:.2f}\n"
        f"  loss {res['loss_first']:.6f} -> {res['loss_last']:.6f} (last5 {res['loss_last5_mean']:.4f}); "
        f"held-out acc {acc_before['accuracy']:.3f} -> {res['heldout_acc_after']['accuracy']:.3f} "
        f"(TRL eval {res['eval_after_trl']})",
        flush=True,
    )
    pc.emit(res, args.json)


if __name__ == "__main__":
    main()
