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

import torch
import trl_common as pc  # before datasets and transformers: it sets the offline variables
from datasets import Dataset
from transformers import AutoModelForCausalLM
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
    ap = pc.arg_parser(__doc__)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch", type=int, default=16, help="sequences per step")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--max-length", type=int, default=128)
    pc.add_run_args(ap, shuffle=True)
    pc.add_output_args(ap, "sft")
    args = ap.parse_args()

    A, tok = pc.open_assets(args)
    model = AutoModelForCausalLM.from_pretrained(A / "policy")
    train = Dataset.from_list(pc.load_jsonl(A / "sft.jsonl"))
    test_rows = pc.load_jsonl(A / "preference_test.jsonl")

    acc_before = pref_acc(model, tok, test_rows)
    cfg = SFTConfig(**pc.common_training_args(args), max_length=args.max_length, packing=False)
    meter = pc.ContentionMeter()
    trainer, init_s = pc.timed(
        SFTTrainer, model=model, args=cfg, train_dataset=train, processing_class=tok
    )
    timer, train_s, contention = pc.timed_train(trainer, meter)

    res = pc.offline_result(
        "trl_sft",
        "trl.SFTTrainer",
        args,
        timer,
        contention,
        parity_keys=("loss", "grad_norm", "num_tokens", "mean_token_accuracy"),
        init_s=init_s,
        train_s=train_s,
        completion_only_loss=trainer.completion_only_loss
        if hasattr(trainer, "completion_only_loss")
        else trainer.args.completion_only_loss,
    )
    res["heldout_pref_acc_before"] = acc_before
    res["heldout_pref_acc_after"] = pref_acc(trainer.model, tok, test_rows)
    res["peak_rss_mib"] = pc.peak_rss_mib()
    print(
        pc.step_report("sft", res, f"{args.batch} seqs", tokens=True)
        + f"held-out logp(chosen)>logp(rejected) {acc_before:.3f} -> {res['heldout_pref_acc_after']:.3f}",
        flush=True,
    )
    pc.emit(res, args.json)


if __name__ == "__main__":
    main()
