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

import trl_common as pc  # before datasets and transformers: it sets the offline variables
from datasets import Dataset
from trl import RewardConfig, RewardTrainer


def main():
    ap = pc.arg_parser(__doc__)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch", type=int, default=8, help="preference pairs per step")
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--max-length", type=int, default=128)
    pc.add_run_args(ap, shuffle=True)
    pc.add_output_args(ap, "rm")
    args = ap.parse_args()

    A, tok = pc.open_assets(args)
    model = pc.load_reward_model(A / "reward_model_init")
    train = Dataset.from_list(pc.load_jsonl(A / "preference.jsonl"))
    test_rows = pc.load_jsonl(A / "preference_test.jsonl")
    test = Dataset.from_list(test_rows)

    acc_before = pc.rm_pair_accuracy(model, tok, test_rows)
    cfg = RewardConfig(
        **pc.common_training_args(args), max_length=args.max_length, per_device_eval_batch_size=32
    )
    meter = pc.ContentionMeter()
    trainer, init_s = pc.timed(
        RewardTrainer,
        model=model,
        args=cfg,
        train_dataset=train,
        eval_dataset=test,
        processing_class=tok,
    )
    timer, train_s, contention = pc.timed_train(trainer, meter)

    res = pc.offline_result(
        "trl_rm",
        "trl.RewardTrainer",
        args,
        timer,
        contention,
        parity_keys=("loss", "accuracy", "margin", "mean_reward", "grad_norm", "num_tokens"),
        init_s=init_s,
        train_s=train_s,
    )
    ev = trainer.evaluate()
    res["eval_after_trl"] = {k: ev.get(k) for k in ("eval_loss", "eval_accuracy", "eval_margin")}
    res["heldout_acc_before"] = acc_before
    res["heldout_acc_after"] = pc.rm_pair_accuracy(trainer.model, tok, test_rows)
    res["peak_rss_mib"] = pc.peak_rss_mib()
    print(
        pc.step_report("rm", res, f"{args.batch} pairs")
        + f"held-out acc {acc_before['accuracy']:.3f} -> {res['heldout_acc_after']['accuracy']:.3f} "
        f"(TRL eval {res['eval_after_trl']})",
        flush=True,
    )
    pc.emit(res, args.json)


if __name__ == "__main__":
    main()
