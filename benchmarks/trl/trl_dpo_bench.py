#!/usr/bin/env python
"""CPU benchmark of TRL's DPOTrainer (``trl.DPOTrainer``) on the offline assets.

Policy and reference both start from assets/policy; data is assets/preference.jsonl
(prompt/chosen/rejected, standard non-conversational format; TRL appends EOS to
chosen/rejected).  Batches are taken in file order (sequential sampler), constant LR,
plain AdamW, fp32, so the step-1 numbers are a fixed-seed parity reference.

Prints seconds per step (median over steps after the first), tokens/s, peak RSS,
loss at start/end, the step-1 loss and step-1 summed log-probs of chosen/rejected
(parity values), and held-out implicit-reward accuracy on preference_test.jsonl.
"""

import argparse
import time

import torch
import trl_common as pc  # before datasets and transformers: it sets the offline variables
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import DPOConfig, DPOTrainer


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--assets", default=pc.DEFAULT_ASSETS)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch", type=int, default=8, help="preference pairs per step")
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--beta", type=float, default=0.1)
    ap.add_argument("--max-length", type=int, default=128)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument(
        "--shuffle", action="store_true", help="random batch order instead of file order"
    )
    ap.add_argument(
        "--trl-defaults", action="store_true", help="keep TRL's bf16/grad-ckpt defaults"
    )
    ap.add_argument("--no-eval", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("--out-dir", default=str(pc.OUT_ROOT / "dpo"))
    args = ap.parse_args()

    A = pc.assets(args.assets)
    torch.manual_seed(args.seed)
    tok = AutoTokenizer.from_pretrained(A / "tokenizer")
    model = AutoModelForCausalLM.from_pretrained(A / "policy")
    ref = AutoModelForCausalLM.from_pretrained(A / "policy")
    train = Dataset.from_list(pc.load_jsonl(A / "preference.jsonl"))
    test = Dataset.from_list(pc.load_jsonl(A / "preference_test.jsonl"))

    cfg = DPOConfig(
        **pc.common_training_args(args),
        beta=args.beta,
        max_length=args.max_length,
        per_device_eval_batch_size=32,
    )
    meter = pc.ContentionMeter()
    t_init = time.perf_counter()
    trainer = DPOTrainer(
        model=model,
        ref_model=ref,
        args=cfg,
        train_dataset=train,
        eval_dataset=test,
        processing_class=tok,
    )
    init_s = time.perf_counter() - t_init
    timer = pc.make_step_callback()
    trainer.add_callback(timer)

    t0 = time.perf_counter()
    trainer.train()
    train_s = time.perf_counter() - t0
    contention = meter.read()

    res = {
        "bench": "trl_dpo",
        "trainer": "trl.DPOTrainer",
        "config": {k: v for k, v in vars(args).items()},
        "dtype": "trl-defaults" if args.trl_defaults else "fp32",
        "init_s": init_s,
        "train_s": train_s,
    }
    res.update(pc.step_summary(timer))
    first = res["first_step_logs"] or {}
    res["parity_step1"] = {
        k: first.get(k)
        for k in (
            "loss",
            "logps/chosen",
            "logps/rejected",
            "rewards/margins",
            "grad_norm",
            "num_tokens",
        )
    }
    ntok = [log["num_tokens"] for log in timer.logs if "num_tokens" in log]
    if ntok and len(timer.step_ends) > 1:
        # tokens processed (chosen+rejected, incl. padding-free count from TRL) after step 1, per second
        res["tokens_per_s"] = (ntok[-1] - ntok[0]) / (timer.step_ends[-1] - timer.step_ends[0])
    res["contention"] = contention
    if not args.no_eval:
        ev = trainer.evaluate()
        res["eval_after"] = {
            k: ev.get(k) for k in ("eval_loss", "eval_rewards/accuracies", "eval_rewards/margins")
        }
    res["peak_rss_mib"] = pc.peak_rss_mib()
    print(
        f"[dpo] {res['steps']} steps x {args.batch} pairs; sec/step median {res['sec_per_step_median']:.3f} "
        f"(min {res['sec_per_step']['min']:.3f}, max {res['sec_per_step']['max']:.3f}); first {res['first_step_s']:.2f}s; "
        f"peak RSS {res['peak_rss_mib']:.0f} MiB; foreign cores {contention['foreign_cores']:.2f}\n"
        f"  loss {res['loss_first']:.6f} -> {res['loss_last']:.6f} (last5 {res['loss_last5_mean']:.4f}); "
        f"step1 parity {res['parity_step1']}; eval {res.get('eval_after')}",
        flush=True,
    )
    pc.emit(res, args.json)


if __name__ == "__main__":
    main()
