#!/usr/bin/env python3
"""Summarize runs/trl-results/*.json from run_all.sh into markdown tables (min/median/max over runs).

usage: python3 summarize.py [RESULTS_DIR]   (stdlib only)
"""

import json
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path


def mmm(xs, fmt="{:.3f}"):
    xs = [x for x in xs if x is not None]
    if not xs:
        return "-"
    return "/".join(fmt.format(v) for v in (min(xs), statistics.median(xs), max(xs)))


def same(xs, fmt="{:.6f}"):
    xs = [x for x in xs if x is not None]
    if not xs:
        return "-"
    s = fmt.format(xs[0])
    return (
        s
        if all(fmt.format(x) == s for x in xs)
        else s + " (differs: " + ", ".join(fmt.format(x) for x in xs) + ")"
    )


def rows(groups, names, columns, key):
    """Prints a markdown table's header (``columns``, then the separator) and yields
    ``(name, results)`` for the benches whose results have ``key``, in ``names`` order."""
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for n in names:
        if key in groups[n][0]:
            yield n, groups[n]


def trainer_of(rs) -> str:
    return f"{rs[0]['trainer']} {rs[0]['env']['trl']}"


def foreign_max(rs) -> str:
    return f"{max(r.get('contention', {}).get('foreign_cores') or 0 for r in rs):.2f}"


def main():
    d = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/trl-results")
    groups = defaultdict(list)
    for p in sorted(d.glob("*.json")):
        m = re.match(r"(.+)_(\d+)$", p.stem)
        if not m:
            continue
        groups[m.group(1)].append(json.loads(p.read_text()))
    if not groups:
        sys.exit(f"no results in {d}")

    order = [
        "ppo_rm",
        "ppo_digits",
        "grpo_digits",
        "grpo_rm",
        "rloo_digits",
        "rloo_rm",
        "dpo",
        "rm",
        "sft",
    ]
    names = [n for n in order if n in groups] + sorted(n for n in groups if n not in order)

    print("### Online RL (one iteration = rollout of 32 completions x 32 new tokens + update)\n")
    online = [
        "bench",
        "trainer (TRL)",
        "runs",
        "s/iter min/med/max",
        "first iter s",
        "gen tok/s min/med/max",
        "e2e gen tok/s med",
        "peak RSS MiB min/med/max",
        "train reward first -> last3 (med)",
        "eval RM score before -> after (med)",
        "eval digit reward before -> after (med)",
        "foreign cores max",
    ]
    for n, rs in rows(groups, names, online, "sec_per_iter_median"):
        first_key = "train_score_first" if "train_score_first" in rs[0] else "train_reward_first"
        last_key = "train_score_last3" if "train_score_last3" in rs[0] else "train_reward_last3"
        med = lambda k, rs=rs: statistics.median([r[k] for r in rs if r.get(k) is not None])  # noqa: E731
        ev = lambda w, k, rs=rs: statistics.median([r[w][k] for r in rs])  # noqa: E731
        print(
            f"| {n} | {trainer_of(rs)} | {len(rs)} | {mmm([r['sec_per_iter_median'] for r in rs])} | "
            f"{mmm([r['first_iter_s'] for r in rs], '{:.1f}')} | {mmm([r['gen_tokens_per_s'] for r in rs], '{:.0f}')} | "
            f"{med('e2e_gen_tokens_per_s'):.0f} | {mmm([r['peak_rss_mib'] for r in rs], '{:.0f}')} | "
            f"{med(first_key):.4f} -> {med(last_key):.4f} | "
            f"{ev('eval_before', 'rm_score'):.4f} -> {ev('eval_after', 'rm_score'):.4f} | "
            f"{ev('eval_before', 'digit_reward'):.4f} -> {ev('eval_after', 'digit_reward'):.4f} | "
            f"{foreign_max(rs)} |"
        )

    print("\n### Offline trainers\n")
    offline = [
        "bench",
        "trainer (TRL)",
        "runs",
        "s/step min/med/max",
        "first step s",
        "tokens/s med",
        "peak RSS MiB min/med/max",
        "loss first",
        "loss last (med)",
        "held-out metric before -> after",
        "foreign cores max",
    ]
    for n, rs in rows(groups, names, offline, "sec_per_step_median"):
        if n == "dpo" or rs[0]["bench"] == "trl_dpo":
            ho = "eval implicit-reward acc after: " + mmm(
                [(r.get("eval_after") or {}).get("eval_rewards/accuracies") for r in rs]
            )
        elif rs[0]["bench"] == "trl_rm":
            ho = (
                "pair acc "
                + mmm([r["heldout_acc_before"]["accuracy"] for r in rs])
                + " -> "
                + mmm([r["heldout_acc_after"]["accuracy"] for r in rs])
            )
        elif rs[0]["bench"] == "trl_sft":
            ho = (
                "logp(chosen)>logp(rejected) "
                + mmm([r["heldout_pref_acc_before"] for r in rs])
                + " -> "
                + mmm([r["heldout_pref_acc_after"] for r in rs])
            )
        else:
            ho = "-"
        tps = [r.get("tokens_per_s") for r in rs if r.get("tokens_per_s")]
        print(
            f"| {n} | {trainer_of(rs)} | {len(rs)} | {mmm([r['sec_per_step_median'] for r in rs])} | "
            f"{mmm([r['first_step_s'] for r in rs], '{:.2f}')} | {statistics.median(tps) if tps else 0:.0f} | "
            f"{mmm([r['peak_rss_mib'] for r in rs], '{:.0f}')} | {same([r['loss_first'] for r in rs])} | "
            f"{statistics.median([r['loss_last'] for r in rs]):.6f} | {ho} | "
            f"{foreign_max(rs)} |"
        )

    print(
        "\n### Step-1 parity values (fixed seed, file-order batches; identical across runs => deterministic)\n"
    )
    for n in names:
        rs = groups[n]
        p = rs[0].get("parity_step1") or rs[0].get("first_step_logs")
        if not p:
            continue
        keys = [
            k
            for k, v in p.items()
            if isinstance(v, (int, float)) and k not in ("step", "epoch", "step_time")
        ]
        vals = {
            k: same(
                [(r.get("parity_step1") or r.get("first_step_logs") or {}).get(k) for r in rs],
                "{:.6g}",
            )
            for k in keys
        }
        print(f"- **{n}**: " + ", ".join(f"{k}={v}" for k, v in vals.items()))


if __name__ == "__main__":
    main()
