"""Make the SFT demonstrations and the comparisons of the instructions task from a starting model.

The prompts come first, without any model (``scripts/make_instruction_prompts.py``); this
script samples the starting model on them and labels the samples, the way InstructGPT
(Ouyang et al. 2022, section 3.2) collected its data, with the gold judge
``rlhfkit.tasks.instructions`` standing for the labeller:

- comparisons (reward model, DPO): K = 4 responses per prompt sampled from the starting model
  at the task's sampling temperature. ``rankings/`` holds the K-way ranking of each set, drawn
  from the Plackett-Luce model of the gold scores; ``comparisons/`` holds every pair of the set
  whose gold scores differ (InstructGPT trains on all K-choose-2 pairs), each labelled by one
  Bradley-Terry choice. The gold score is a share of constraints met, so many samples tie; a
  labeller asked which response follows the instruction better marks a tie there, and a tie
  carries no preference, so tied pairs are left out of ``comparisons/`` (the rankings keep
  them, ordered at random, as a ranking must). The noise tau is calibrated so that
  ``--agreement`` (75%) of the untied pairs agree with the gold order in expectation, about
  the agreement InstructGPT reports between its labellers (72-77%).
- demonstrations (SFT): rejection sampling (best-of-n, Nakano et al. 2021; Touvron et al.
  2023): ``--demo-n`` samples of the starting model per prompt, the one the gold judge scores
  highest kept when it scores at least ``--demo-min-gold``. The demonstrator is the model
  itself, filtered: no better-written text enters than the model could already write.

Prompts are taken in a fixed shuffled order of the train split: the first ``--rank-prompts``
for comparisons, the next ``--demo-prompts`` for demonstrations, so no prompt serves both;
PPO and GRPO sample from the whole train split. The test split (held-out topics and held-out
constraint kinds) gets comparisons for the reward model's accuracy and a few demonstrations
for SFT's held-out loss.

More comparisons later: ``--more-comparisons N`` samples and labels the next N train prompts
of the same order (after every prompt already used for comparisons or demonstrations) with the
labeller tau of ``stats.json``, and appends them to ``rankings/`` and ``comparisons/``; the
demonstrations and the test split are left as they are.

More responses for the same prompts: ``--resample-comparisons DIR`` writes a copy of the data
to DIR (prompts, demonstrations, stats) whose ``rankings/`` and ``comparisons/`` hold ``--k``
new responses for every prompt of the original ``rankings/`` (train and test), labelled with
the labeller tau of ``stats.json`` (the same labeller). SFT trains on the same demonstrations
there, and with K = 8 a prompt has 28 pairs instead of 6.

Output, beside the prompts: ``{sft,comparisons,rankings}/{train,test}.jsonl`` and the counts,
tau and sampling settings merged into ``stats.json``. Usage (after ``make smollm2``)::

    python scripts/make_instruction_data.py --model runs/models/SmolLM2-135M-Instruct
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import math
import random
import shutil
import time
from pathlib import Path

import torch

from rlhfkit.data import PromptRecord, encode_prompts, load_records
from rlhfkit.experience.generation import SamplingConfig
from rlhfkit.interact.sampling import sample_responses
from rlhfkit.labelling.export import write_jsonl
from rlhfkit.labelling.simulated import calibrate_tau, gold_agreement, plackett_luce, prefers
from rlhfkit.models.loading import freeze, load_causal_lm, load_tokenizer
from rlhfkit.runtime.machine import Runtime
from rlhfkit.tasks import INSTRUCTIONS_DATA_DIR, REWARD_FUNCTIONS

log = logging.getLogger("make_instruction_data")
GOLD = REWARD_FUNCTIONS["instructions"]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="runs/models/SmolLM2-135M-Instruct")
    parser.add_argument("--data", type=Path, default=INSTRUCTIONS_DATA_DIR)
    parser.add_argument("--k", type=int, default=4, help="responses per compared prompt")
    parser.add_argument("--rank-prompts", type=int, default=500)
    parser.add_argument("--rank-test-prompts", type=int, default=150)
    parser.add_argument("--demo-prompts", type=int, default=400)
    parser.add_argument("--demo-test-prompts", type=int, default=48)
    parser.add_argument("--demo-n", type=int, default=8, help="samples per demonstration")
    parser.add_argument("--demo-min-gold", type=float, default=0.5)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--max-prompt-length", type=int, default=128)
    parser.add_argument("--agreement", type=float, default=0.75)
    parser.add_argument("--batch-size", type=int, default=64, help="sampled rows per batch")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--more-comparisons",
        type=int,
        default=0,
        metavar="N",
        help="append comparisons of the next N unused train prompts to the existing data",
    )
    parser.add_argument(
        "--resample-comparisons",
        type=Path,
        metavar="DIR",
        help="a copy of the data in DIR with --k new responses for every compared prompt",
    )
    parser.add_argument(
        "--device",
        default="cuda" if torch.cuda.is_available() else "cpu",
        help="where to sample (default: a CUDA GPU if there is one, else the CPU)",
    )
    return parser.parse_args()


def sample_sets(model, tokenizer, prompts: list[str], n: int, args, seed: int) -> list[list[str]]:
    """``n`` responses per prompt from ``model`` (bf16 autocast, seeded), prompt by prompt."""
    records = [PromptRecord(p) for p in prompts]
    ids, _ = encode_prompts(records, tokenizer, args.max_prompt_length)
    sampling = SamplingConfig(args.max_new_tokens, args.temperature)
    device = torch.device(args.device)
    runtime = Runtime(device=device, bf16=True, attention="sdpa", side_by_side=False)
    runtime.start()  # freed memory kept for the next step: no page faults on every token
    batches = sample_responses(
        model,
        tokenizer,
        ids,
        sampling,
        seed=seed,
        batch_size=args.batch_size,
        repeat=n,
        runtime=runtime,
    )
    flat = [r for batch in batches for r in batch.responses]
    return [flat[i * n : (i + 1) * n] for i in range(len(prompts))]


def golds_of(prompt: str, responses: list[str]) -> list[float]:
    return GOLD([prompt] * len(responses), responses)


def label(prompts: list[str], sets: list[list[str]], tau: float, rng: random.Random):
    """Rankings (Plackett-Luce) of every set, and its untied pairs (Bradley-Terry)."""
    rankings, pairs = [], []
    for prompt, responses in zip(prompts, sets, strict=True):
        golds = golds_of(prompt, responses)
        rankings.append({"prompt": prompt, "responses": responses, "gold": golds})
        rankings[-1]["ranking"] = plackett_luce(golds, tau, rng)
        for a, b in itertools.combinations(range(len(responses)), 2):
            if golds[a] == golds[b] or responses[a] == responses[b]:
                continue
            win, lose = (a, b) if prefers(golds[a], golds[b], tau, rng) else (b, a)
            pairs.append(
                {
                    "prompt": prompt,
                    "chosen": responses[win],
                    "rejected": responses[lose],
                    "gold": [golds[win], golds[lose]],
                }
            )
    return rankings, pairs


def demonstrations(prompts: list[str], sets: list[list[str]], min_gold: float) -> list[dict]:
    """The gold judge's favourite of each set, where it scores at least ``min_gold``."""
    rows = []
    for prompt, responses in zip(prompts, sets, strict=True):
        golds = golds_of(prompt, responses)
        best = max(range(len(responses)), key=golds.__getitem__)
        if golds[best] >= min_gold:
            rows.append({"prompt": prompt, "response": responses[best], "gold": golds[best]})
    return rows


def pair_agreement(pairs: list[dict]) -> float | None:
    return sum(p["gold"][0] > p["gold"][1] for p in pairs) / len(pairs) if pairs else None


def label_stats(rankings: list[dict], pairs: list[dict]) -> dict:
    """How the labels of one split agree with the gold order, and the samples' mean gold."""
    all_golds = [g for r in rankings for g in r["gold"]]
    return {
        "agreement_with_gold": {
            "pairs": _rounded(pair_agreement(pairs)),
            "rankings": _rounded(
                gold_agreement([r["ranking"] for r in rankings], [r["gold"] for r in rankings])
            ),
        },
        "mean_gold_of_samples": round(sum(all_golds) / len(all_golds), 4),
    }


def _rounded(x: float | None) -> float | None:
    """``x`` to 4 decimals; None for no value (nan: every pair tied), which JSON can hold."""
    return None if x is None or math.isnan(x) else round(x, 4)


def shuffled_prompts(data: Path, rng: random.Random) -> tuple[list[str], list[str]]:
    """The train and test prompts in the script's fixed order."""
    train = [r.prompt for r in load_records(data / "prompts", "prompts", split="train")]
    test = [r.prompt for r in load_records(data / "prompts", "prompts", split="test")]
    rng.shuffle(train)
    rng.shuffle(test)
    return train, test


def append_jsonl(rows: list[dict], path: Path) -> None:
    """``path``'s rows followed by ``rows``, written again atomically."""
    old = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
    write_jsonl(old + rows, path)


def add_comparisons(args, model, tokenizer) -> None:
    """Sample, label and append comparisons of the next ``--more-comparisons`` train prompts."""
    stats_path = args.data / "stats.json"
    stats = json.loads(stats_path.read_text())
    made = stats["data"]
    if made["seed"] != args.seed:
        raise SystemExit(f"--seed {args.seed} differs from the data's seed {made['seed']}")
    train, _ = shuffled_prompts(args.data, random.Random(args.seed))
    used = made["train"]["rankings"] + made["train"]["demo_prompts"]
    prompts = train[used : used + args.more_comparisons]
    if not prompts:
        raise SystemExit(f"every one of the {len(train)} train prompts is used already")
    log.info("sampling %d x %d responses (more comparisons)", len(prompts), args.k)
    started = time.process_time()
    sets = sample_sets(model, tokenizer, prompts, args.k, args, args.seed + 4 + used)
    tau = stats["labeller_tau"]
    rankings, pairs = label(prompts, sets, tau, random.Random(used))
    append_jsonl(rankings, args.data / "rankings" / "train.jsonl")
    append_jsonl(pairs, args.data / "comparisons" / "train.jsonl")
    made["added"] = made.get("added", []) + [
        {
            "prompts": len(prompts),
            "after": used,
            "comparisons": len(pairs),
            "tau": tau,
            "agreement_with_gold": _rounded(pair_agreement(pairs)),
            "sampling_cpu_s": round(time.process_time() - started, 1),
        }
    ]
    made["train"]["rankings"] += len(rankings)
    made["train"]["comparisons"] += len(pairs)
    stats_path.write_text(json.dumps(stats, indent=2) + "\n", encoding="utf-8")
    log.info("appended %d rankings and %d comparisons", len(rankings), len(pairs))


def resample_comparisons(args, model, tokenizer) -> None:
    """A copy of the data in ``--resample-comparisons`` with ``--k`` new responses for each
    compared prompt, labelled again by the same labeller."""
    out: Path = args.resample_comparisons
    if out.exists():
        raise SystemExit(f"--resample-comparisons {out}: exists; give a new folder")
    out.mkdir(parents=True)
    for folder in ("prompts", "sft"):
        shutil.copytree(args.data / folder, out / folder)
    stats = json.loads((args.data / "stats.json").read_text())
    made, tau = stats["data"], stats["labeller_tau"]
    started = time.process_time()
    for offset, split in enumerate(("train", "test")):
        source = args.data / "rankings" / f"{split}.jsonl"
        prompts = [json.loads(line)["prompt"] for line in source.read_text().splitlines() if line]
        log.info("sampling %d x %d responses (%s, resampled)", len(prompts), args.k, split)
        sets = sample_sets(model, tokenizer, prompts, args.k, args, args.seed + 10 + offset)
        rankings, pairs = label(prompts, sets, tau, random.Random(args.seed + 10 + offset))
        write_jsonl(rankings, out / "rankings" / f"{split}.jsonl")
        write_jsonl(pairs, out / "comparisons" / f"{split}.jsonl")
        made[split].update(
            rankings=len(rankings), comparisons=len(pairs), **label_stats(rankings, pairs)
        )
        log.info("%s: %d rankings, %d comparisons", split, len(rankings), len(pairs))
    made.pop("added", None)
    made.update(
        k=args.k,
        comparisons_resampled={
            "from": args.data.name,
            "device": args.device,
            "sampling_cpu_s": round(time.process_time() - started, 1),
        },
    )
    (out / "stats.json").write_text(json.dumps(stats, indent=2) + "\n", encoding="utf-8")


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    torch.manual_seed(args.seed)
    tokenizer = load_tokenizer(args.model, padding_side="left")
    model = freeze(load_causal_lm(args.model, tokenizer=tokenizer)).to(args.device)
    if args.more_comparisons:
        add_comparisons(args, model, tokenizer)
        return
    if args.resample_comparisons:
        resample_comparisons(args, model, tokenizer)
        return
    rng = random.Random(args.seed)
    train, test = shuffled_prompts(args.data, rng)
    rank_train = train[: args.rank_prompts]
    demo_train = train[args.rank_prompts : args.rank_prompts + args.demo_prompts]
    rank_test = test[: args.rank_test_prompts]
    demo_test = test[args.rank_test_prompts : args.rank_test_prompts + args.demo_test_prompts]

    started = time.process_time()
    sets = {}
    for name, prompts, n, seed in (
        ("rank_train", rank_train, args.k, args.seed),
        ("rank_test", rank_test, args.k, args.seed + 1),
        ("demo_train", demo_train, args.demo_n, args.seed + 2),
        ("demo_test", demo_test, args.demo_n, args.seed + 3),
    ):
        log.info("sampling %d x %d responses (%s)", len(prompts), n, name)
        sets[name] = sample_sets(model, tokenizer, prompts, n, args, seed)
    sampling_s = time.process_time() - started

    diffs = [
        a - b
        for prompt, responses in zip(rank_train, sets["rank_train"], strict=True)
        for a, b in itertools.combinations(golds_of(prompt, responses), 2)
    ]
    tau = calibrate_tau(diffs, args.agreement)
    log.info("labeller tau %.4f for %.0f%% agreement", tau, 100 * args.agreement)
    stats_path = args.data / "stats.json"
    stats = json.loads(stats_path.read_text()) if stats_path.is_file() else {}
    data_stats: dict = {}
    for split, rank_prompts, demo_prompts in (
        ("train", rank_train, demo_train),
        ("test", rank_test, demo_test),
    ):
        rankings, pairs = label(rank_prompts, sets[f"rank_{split}"], tau, rng)
        demos = demonstrations(demo_prompts, sets[f"demo_{split}"], args.demo_min_gold)
        write_jsonl(rankings, args.data / "rankings" / f"{split}.jsonl")
        write_jsonl(pairs, args.data / "comparisons" / f"{split}.jsonl")
        write_jsonl(demos, args.data / "sft" / f"{split}.jsonl")
        data_stats[split] = {
            "rankings": len(rankings),
            "comparisons": len(pairs),
            "sft": len(demos),
            "demo_prompts": len(demo_prompts),
            **label_stats(rankings, pairs),
            "mean_gold_of_demonstrations": round(
                sum(d["gold"] for d in demos) / max(1, len(demos)), 4
            ),
        }
    stats["data"] = {
        "model": args.model,
        "k": args.k,
        "demo_n": args.demo_n,
        "demo_min_gold": args.demo_min_gold,
        "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature,
        "target_agreement": args.agreement,
        "seed": args.seed,
        "sampling_cpu_s": round(sampling_s, 1),
        **data_stats,
    }
    stats["labeller_tau"] = round(tau, 4)
    stats_path.write_text(json.dumps(stats, indent=2) + "\n", encoding="utf-8")
    log.info("wrote %s: %s", args.data, json.dumps(data_stats))


if __name__ == "__main__":
    main()
