#!/usr/bin/env python
"""CPU benchmark of TRL's SFTTrainer (``trl.SFTTrainer``) on the offline assets.

Fine-tunes assets/policy on assets/sft.jsonl (prompt/completion = prompt + chosen of
the preference data; TRL appends EOS and, for prompt/completion data, by default
computes the loss on completion tokens only).  No packing, file-order batches,
constant LR, AdamW, fp32.

Prints seconds per step (median after the first), tokens/s, peak RSS, loss start/end,
step-1 parity values, and the fraction of held-out pairs (preference_test.jsonl) where
the policy's summed completion log-prob of chosen > rejected, before and after.
"""

import argparse
import time

import torch
import trl_common as pc  # before datasets and transformers: it sets the offline variables
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import SFTConfig, SFTTrainer


@torch.no_grad()
def completion_logp(model, tok, prompt, completion):
    p = tok(prompt)["input_ids"]
    full = tok(prompt + completion + tok.eos_token)["input_ids"]
    ids = torch.tensor([full])
    logits = model(input_ids=ids).logits[0, :-1]
    lp = torch.log_softmax(logits.float(), -1).gather(-1, ids[0, 1:, None])[:, 0]
    return lp[len(p) - 1 :].sum().item()


def pref_acc(model, tok, rows):
    model.eval()
    ok = sum(
        completion_logp(model, tok, r["prompt"], r["chosen"])
        > completion_logp(model, tok, r["prompt"], r["rejected"])
        for r in rows
    )
    return ok / len(rows)


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--assets", default=pc.DEFAULT_ASSETS)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch", type=int, default=16, help="sequences per step")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--max-length", type=int, default=128)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--shuffle", action="store_true")
    ap.add_argument(
        "--trl-defaults", action="store_true", help="keep TRL's bf16/grad-ckpt defaults"
    )
    ap.add_argument("--json", default=None)
    ap.add_argument("--out-dir", default=str(pc.OUT_ROOT / "sft"))
    args = ap.parse_args()

    A = pc.assets(args.assets)
    torch.manual_seed(args.seed)
    tok = AutoTokenizer.from_pretrained(A / "tokenizer")
    model = AutoModelForCausalLM.from_pretrained(A / "policy")
    train = Dataset.from_list(pc.load_jsonl(A / "sft.jsonl"))
    test_rows = pc.load_jsonl(A / "preference_test.jsonl")

    acc_before = pref_acc(model, tok, test_rows)
    cfg = SFTConfig(**pc.common_training_args(args), max_length=args.max_length, packing=False)
    meter = pc.ContentionMeter()
    t_init = time.perf_counter()
    trainer = SFTTrainer(model=model, args=cfg, train_dataset=train, processing_class=tok)
    init_s = time.perf_counter() - t_init
    timer = pc.make_step_callback()
    trainer.add_callback(timer)
    t0 = time.perf_counter()
    trainer.train()
    train_s = time.perf_counter() - t0
    contention = meter.read()

    res = {
        "bench": "trl_sft",
        "trainer": "trl.SFTTrainer",
        "config": dict(vars(args)),
        "dtype": "trl-defaults" if args.trl_defaults else "fp32",
        "init_s": init_s,
        "train_s": train_s,
        "completion_only_loss": trainer.completion_only_loss
        if hasattr(trainer, "completion_only_loss")
        else trainer.args.completion_only_loss,
    }
    res.update(pc.step_summary(timer))
    first = res["first_step_logs"] or {}
    res["parity_step1"] = {
        k: first.get(k) for k in ("loss", "grad_norm", "num_tokens", "mean_token_accuracy")
    }
    ntok = [log["num_tokens"] for log in timer.logs if "num_tokens" in log]
    if ntok and len(timer.step_ends) > 1:
        res["tokens_per_s"] = (ntok[-1] - ntok[0]) / (timer.step_ends[-1] - timer.step_ends[0])
    res["contention"] = contention
    res["heldout_pref_acc_before"] = acc_before
    res["heldout_pref_acc_after"] = pref_acc(trainer.model, tok, test_rows)
    res["peak_rss_mib"] = pc.peak_rss_mib()
    print(
        f"[sft] {res['steps']} steps x {args.batch} seqs; sec/step median {res['sec_per_step_median']:.3f} "
        f"(min {res['sec_per_step']['min']:.3f}, max {res['sec_per_step']['max']:.3f}); first {res['first_step_s']:.2f}s; "
        f"tokens/s {res.get('tokens_per_s', 0):.0f}; peak RSS {res['peak_rss_mib']:.0f} MiB; "
        f"foreign cores {contention['foreign_cores']:.2f}\n"
        f"  loss {res['loss_first']:.6f} -> {res['loss_last']:.6f} (last5 {res['loss_last5_mean']:.4f}); "
        f"held-out logp(chosen)>logp(rejected) {acc_before:.3f} -> {res['heldout_pref_acc_after']:.3f}",
        flush=True,
    )
    pc.emit(res, args.json)


if __name__ == "__main__":
    main()
