"""SFT demonstrations of the instructions task with letter-case answers corrected, as a
labeller would correct them, for the two kinds the starting model never meets on its own.

"All lowercase" and "all capitals" are met by 0.4% and 0.1% of SmolLM2-135M-Instruct's samples
(``scripts/constraint_coverage.py``), so the rejection-sampled demonstrations of
``make_instruction_data.py`` hold none, and GRPO, whose groups never contain one, cannot learn
them. Here, without any model:

- every demonstration of ``--data`` whose prompt asks for a letter case gets its response
  lowercased or capitalised (``str.lower`` / ``str.upper``) and its gold score recomputed;
- from the rankings of ``--rankings`` (K samples of each compared prompt, prompts no
  demonstration has), each prompt that asks for a letter case gives the best of its K
  samples once corrected, kept when it then scores at least ``--min-gold``; ``--count`` of
  those, drawn at random, join the training demonstrations, and the whole set is shuffled;
- ``--untouched N`` adds as well N best samples, as they are, of ranked prompts that ask for
  no letter case (rejection sampling from the stored samples, at least ``--min-gold``), so the
  corrected answers are not most of what SFT sees: 150 corrected ones alone made half the
  demonstrations ask for a letter case, against a quarter of the task's prompts, and taught
  lowercase where no prompt asked for it;
- ``--paired`` adds, for each demonstration that asks for a letter case, its twin: the same
  prompt with the letter-case phrasing taken out and the answer as sampled, in the normal
  case (kept when it scores at least ``--min-gold``), so that SFT sees the same answer in
  both cases with nothing but the instruction to tell them apart.

The output folder holds ``sft/{train,test}.jsonl`` and ``stats.json``; train on it with a
stage's ``train_data`` (docs/instructions.md, "Where GRPO's curve flattens"). Usage::

    python scripts/make_letter_case_demonstrations.py --out runs/letter_case
"""

from __future__ import annotations

import argparse
import json
import random
import re
from pathlib import Path

from rlhfkit.labelling.export import write_jsonl
from rlhfkit.tasks import INSTRUCTIONS_DATA_DIR
from rlhfkit.tasks.instructions import KINDS, instruction_score, parse_constraints

CASES = {"lowercase": str.lower, "uppercase": str.upper}


def asked_cases(prompt: str) -> list[str]:
    """The letter-case kinds ``prompt`` asks for (none, or one)."""
    return [c.kind for c in parse_constraints(prompt) if c.kind in CASES]


def in_asked_case(prompt: str, response: str) -> str:
    """``response`` in the letter case ``prompt`` asks for, unchanged if it asks for none."""
    for kind in asked_cases(prompt):
        response = CASES[kind](response)
    return response


def corrected(demonstration: dict) -> dict:
    """A demonstration in its prompt's letter case, its gold score recomputed if it changed."""
    prompt, response = demonstration["prompt"], demonstration["response"]
    fixed = in_asked_case(prompt, response)
    if fixed == response:
        return demonstration
    return {**demonstration, "response": fixed, "gold": instruction_score(prompt, fixed)}


def _cut(text: str, match: re.Match) -> str:
    """``text`` without the phrasing ``match`` found: a fragment with the comma before it, a
    sentence with the period after it."""
    head, tail = text[: match.start()].rstrip(), text[match.end() :]
    if head.endswith(","):
        return head[:-1] + tail
    return f"{head} {tail.lstrip('. ')}".strip()


def without_asked_case(prompt: str) -> str | None:
    """``prompt`` with its letter-case phrasing taken out: a fragment (", all in lowercase")
    with its comma, a sentence with its period. None where no other constraint is left (the
    checker scores none) or what is left would state others than the prompt's."""
    text = prompt
    for pattern in (p for kind in CASES for p in KINDS[kind].patterns()):
        for match in reversed(list(pattern.finditer(text))):
            text = _cut(text, match)
    others = [c for c in parse_constraints(prompt) if c.kind not in CASES]
    return text if others and parse_constraints(text) == others else None


def unasked_twin(demonstration: dict, min_gold: float) -> dict | None:
    """A demonstration as sampled, in the normal case, for its prompt with the letter-case
    phrasing taken out; None where that prompt cannot be had or the answer scores under
    ``min_gold`` for it."""
    prompt = without_asked_case(demonstration["prompt"])
    if prompt is None:
        return None
    gold = instruction_score(prompt, demonstration["response"])
    if gold < min_gold:
        return None
    return {"prompt": prompt, "response": demonstration["response"], "gold": gold}


def best_samples(rankings: list[dict], min_gold: float, letter_case: bool) -> list[dict]:
    """For each ranked prompt that asks for a letter case (``letter_case``), or for none (not),
    its best sample once put in the asked case, as sampled, where the corrected one scores at
    least ``min_gold``."""
    found = []
    for record in rankings:
        prompt = record["prompt"]
        if bool(asked_cases(prompt)) != letter_case:
            continue
        golds = [instruction_score(prompt, in_asked_case(prompt, r)) for r in record["responses"]]
        best = max(range(len(golds)), key=golds.__getitem__)
        if golds[best] >= min_gold:
            response = record["responses"][best]
            gold = instruction_score(prompt, response)
            found.append({"prompt": prompt, "response": response, "gold": gold})
    return found


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def shown(path: Path) -> str:
    """``path`` as the stats name it: under the bundled data folder, relative to it, so that
    the stats of the bundled copy do not depend on where the repository lies."""
    try:
        return str(path.resolve().relative_to(INSTRUCTIONS_DATA_DIR.parent.resolve()))
    except ValueError:
        return str(path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=INSTRUCTIONS_DATA_DIR)
    parser.add_argument(
        "--rankings",
        type=Path,
        default=INSTRUCTIONS_DATA_DIR.with_name("instructions_k8") / "rankings" / "train.jsonl",
    )
    parser.add_argument("--count", type=int, default=150, help="demonstrations to add")
    parser.add_argument(
        "--untouched", type=int, default=0, help="best samples of other prompts to add as well"
    )
    parser.add_argument(
        "--paired",
        action="store_true",
        help="add each letter-case demonstration's twin: the prompt without the letter case",
    )
    parser.add_argument("--min-gold", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.out.exists():
        raise SystemExit(f"--out {args.out}: exists; give a new folder")

    rankings = read_jsonl(args.rankings)
    candidates = best_samples(rankings, args.min_gold, letter_case=True)
    random.Random(args.seed).shuffle(candidates)
    added = candidates[: args.count]
    others = best_samples(rankings, args.min_gold, letter_case=False)
    random.Random(args.seed + 2).shuffle(others)
    untouched = others[: args.untouched]
    demonstrations = read_jsonl(args.data / "sft" / "train.jsonl")
    asking = [d for d in demonstrations if asked_cases(d["prompt"])] + added
    twins = (
        [t for t in (unasked_twin(d, args.min_gold) for d in asking) if t] if args.paired else []
    )
    train = [corrected(d) for d in demonstrations + added] + untouched + twins
    random.Random(args.seed + 1).shuffle(train)
    test = [corrected(d) for d in read_jsonl(args.data / "sft" / "test.jsonl")]
    write_jsonl(train, args.out / "sft" / "train.jsonl")
    write_jsonl(test, args.out / "sft" / "test.jsonl")
    stats = {
        "from": {"demonstrations": shown(args.data / "sft"), "rankings": shown(args.rankings)},
        "candidates": len(candidates),
        "added": len(added),
        "untouched_candidates": len(others),
        "untouched": len(untouched),
        "twins": len(twins),
        "asking_a_letter_case": sum(bool(asked_cases(d["prompt"])) for d in train),
        "train": len(train),
        "test": len(test),
        "seed": args.seed,
        "min_gold": args.min_gold,
    }
    (args.out / "stats.json").write_text(json.dumps(stats, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(stats, indent=2))


if __name__ == "__main__":
    main()
