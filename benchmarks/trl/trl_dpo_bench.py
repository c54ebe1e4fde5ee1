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

import trl_common as pc  # before datasets and transformers: it sets the offline variables
from datasets import Dataset
from transformers import AutoModelForCausalLM
from trl import DPOConfig, DPOTrainer


def main():
    ap = pc.arg_parser(__doc__)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch", type=int, default=8, help="preference pairs per step")
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--beta", type=float, default=0.1)
    ap.add_argument("--max-length", type=int, default=128)
    pc.add_run_args(ap, shuffle=True)
    ap.add_argument("--no-eval", action="store_true")
    pc.add_output_args(ap, "dpo")
    args = ap.parse_args()

    A, tok = pc.open_assets(args)
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
    trainer, init_s = pc.timed(
        DPOTrainer,
        model=model,
        ref_model=ref,
        args=cfg,
        train_dataset=train,
        eval_dataset=test,
        processing_class=tok,
    )
    timer, train_s, contention = pc.timed_train(trainer, meter)

    res = pc.offline_result(
        "trl_dpo",
        "trl.DPOTrainer",
        args,
        timer,
        contention,
        parity_keys=(
            "loss",
            "logps/chosen",
            "logps/rejected",
            "rewards/margins",
            "grad_norm",
            "num_tokens",
        ),
        init_s=init_s,
        train_s=train_s,
    )
    if not args.no_eval:
        ev = trainer.evaluate()
        res["eval_after"] = {
            k: ev.get(k) for k in ("eval_loss", "eval_rewards/accuracies", "eval_rewards/margins")
        }
    res["peak_rss_mib"] = pc.peak_rss_mib()
    print(
        pc.step_report("dpo", res, f"{args.batch} pairs")
        + f"step1 parity {res['parity_step1']}; eval {res.get('eval_after')}",
        flush=True,
    )
    pc.emit(res, args.json)


if __name__ == "__main__":
    main()
