"""Make the prompts of the instructions task (``rlhfkit.tasks.instructions``).

A prompt is one task sentence on an everyday topic ("Describe a rainy morning.") with one or two
constraints a program can check, as in IFEval (Zhou et al. 2023, "Instruction-Following
Evaluation for Large Language Models") and the verifiable prompts of Tulu 3's RLVR (Lambert et
al. 2024). Each constraint takes one of its kind's phrasings at random; at most one phrasing per
prompt is a fragment joined to the task sentence ("Describe a rainy morning in under 25
words."), the others follow as sentences. Two constraints are drawn only if compatible: not two
of a group (two length limits, two layouts, two letter cases) nor a pair of ``CONFLICTS``
(a title and a first word both claim the opening; a postscript and a last word the ending).
Quoted words of one prompt differ ("Mention 'rain'" and "Do not use 'rain'" never meet).

Splits, all drawn with one seeded ``random.Random``:

- ``prompts/train.jsonl``: training kinds only, on the training topics;
- ``prompts/test.jsonl``: training kinds on the held-out topics (a fifth of them, never in
  train): does following instructions carry over to new topics;
- held-out kinds: at least one of ``HELDOUT_KINDS`` per prompt (never in train), on the
  training topics, so that only the kind of constraint is new. They are written into
  ``prompts/test.jsonl`` too, every third record (``FILES``), so that the evaluation's first
  prompts, however many it takes, measure both kinds of generalisation;
- ``prompts/validation.jsonl``: as ``test.jsonl``, on other prompts: what a run chooses by
  while it trains (``metric_for_best_model``), so that the test prompts measure the model it
  chose without having chosen it. Drawn after the other splits, which it leaves as they were.

Each record is ``{"prompt", "constraints" (kind names, in the order the prompt states them),
"topic", "instruction_id_list", "kwargs"}``: the last two are the constraints in IFEval's
vocabulary, as google/IFEval writes them, for the ``ifeval`` reward and IFEval's figures
(``rlhfkit.tasks.ifeval.IFEVAL_COUNTERPARTS``): only the constraints with a counterpart, so a
prompt whose constraints have none ("paragraphs", "numbered", "start_word", "end_word") has
two empty lists, and IFEval's figures leave it out. The prompt loaders read the prompt and
hand the other columns to the reward functions that name them. ``stats.json`` holds the
seed, the kinds, the topics of each split and the counts per kind. Usage::

    python scripts/make_instruction_prompts.py [--out DIR] [--seed N]
"""

from __future__ import annotations

import argparse
import json
import logging
import random
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from rlhfkit.tasks import INSTRUCTIONS_DATA_DIR
from rlhfkit.tasks.ifeval import ifeval_columns
from rlhfkit.tasks.instructions import (
    HELDOUT_KINDS,
    KINDS,
    TOPICS,
    TRAINING_KINDS,
    Constraint,
    Topic,
    phrase,
)

log = logging.getLogger("make_instruction_prompts")

SIZES = {
    "train": 2000,
    "test": 400,
    "heldout_kinds": 200,
    "validation": 128,
    "validation_heldout_kinds": 64,
}
FILES = {
    "train": ("train",),
    "test": ("test", "test", "heldout_kinds"),
    "validation": ("validation", "validation", "validation_heldout_kinds"),
}
"""Which splits each prompts file holds: records taken in turn, one from each named split."""
HELDOUT_TOPIC_SHARE = 0.2
TWO_CONSTRAINTS = 0.5  # chance that a prompt has a second constraint
TASKS = (
    "Describe {topic}.",
    "Tell me about {topic}.",
    "Write a short note about {topic}.",
    "Write a short story about {topic}.",
    "Give some advice about {topic}.",
    "Share a few thoughts on {topic}.",
    "Explain what you like about {topic}.",
)
CATEGORY_TASKS = (
    "Name a few {topic}.",
    "Name some {topic} and say something about each.",
    "Tell me about some {topic} you like.",
    "Write a short note about {topic}.",
)
OPENERS = ("today", "imagine", "honestly", "sometimes", "here", "yes", "first", "every")
GROUPS = {
    "max_words": "length",
    "min_words": "length",
    "sentences": "layout",
    "paragraphs": "layout",
    "bullets": "layout",
    "numbered": "layout",
    "lowercase": "case",
    "uppercase": "case",
}
CONFLICTS = frozenset(
    frozenset(pair)
    for pair in (
        ("min_words", "sentences"),  # "exactly two sentences" of 40 words or more
        ("max_words", "paragraphs"),
        ("title", "start_word"),
        ("title", "quotes"),
        ("title", "sentences"),  # is the title line a sentence?
        ("title", "paragraphs"),
        ("quotes", "postscript"),
        ("quotes", "bullets"),  # a quote before the first marker hides it
        ("quotes", "numbered"),
        ("postscript", "end_word"),
        ("postscript", "sentences"),
        ("postscript", "paragraphs"),
    )
)
NUMBERS = {
    "max_words": (15, 20, 25, 30, 40, 50),
    "min_words": (20, 30, 40, 50),
    "sentences": (2, 3, 4),
    "paragraphs": (2, 3),
    "bullets": (2, 3, 4, 5),
    "numbered": (2, 3, 4, 5),
    "keyword": (1, 2, 3),
}


def compatible(a: str, b: str) -> bool:
    """Whether one prompt may ask for kinds ``a`` and ``b`` together (module docstring)."""
    same_group = a in GROUPS and GROUPS.get(a) == GROUPS.get(b)
    return a != b and not same_group and frozenset((a, b)) not in CONFLICTS


def is_fragment(phrasing: str) -> bool:
    """A phrasing that joins the task sentence ("in under {below} words") is not capitalised."""
    return not phrasing[0].isupper()


def draw_constraint(
    kind: str, phrasing: str, topic: Topic, taken: set[str], rng: random.Random
) -> Constraint:
    """A constraint of ``kind`` with parameters that suit ``phrasing`` and ``topic``; a quoted
    word is one not in ``taken`` (and is added to it)."""
    n = rng.choice(NUMBERS[kind]) if kind in NUMBERS else None
    if "{below}" in phrasing:
        n -= 1  # "under 25 words" is at most 24: the stated number stays round
    word = None
    if "{word}" in phrasing:
        pool = OPENERS if kind == "start_word" else tuple(topic.related.split())
        word = rng.choice([w for w in pool if w not in taken])
        taken.add(word)
    return Constraint(kind, n, word)


def make_prompt(
    topic: Topic, kinds: Sequence[str], rng: random.Random
) -> tuple[str, list[Constraint]]:
    """The prompt text asking ``kinds`` on ``topic``, and its constraints in the order it
    states them (a fragment's first: it joins the task sentence)."""
    tasks = CATEGORY_TASKS if topic.category else TASKS
    task = rng.choice(tasks).format(topic=topic.name)
    fragments, sentence_constraints, sentences = [], [], []
    taken: set[str] = set()
    for kind in kinds:
        phrasings = [p for p in KINDS[kind].phrasings if not (fragments and is_fragment(p))]
        phrasing = rng.choice(phrasings)
        constraint = draw_constraint(kind, phrasing, topic, taken, rng)
        text = phrase(phrasing, constraint)
        if is_fragment(phrasing):
            task = task[:-1] + ("" if text.startswith(",") else " ") + text + "."
            fragments.append(constraint)
        else:
            sentences.append(text)
            sentence_constraints.append(constraint)
    return " ".join([task, *sentences]), fragments + sentence_constraints


def draw_kinds(first_pool: Sequence[str], pool: Sequence[str], rng: random.Random) -> list[str]:
    """One kind of ``first_pool`` and, with chance ``TWO_CONSTRAINTS``, a compatible second
    kind of ``pool``."""
    first = rng.choice(first_pool)
    seconds = [kind for kind in pool if compatible(first, kind)]
    return [first, rng.choice(seconds)] if rng.random() < TWO_CONSTRAINTS else [first]


def make_record(prompt: str, constraints: Sequence[Constraint], topic: Topic) -> dict:
    """A prompt's record: its text, kinds and topic, and the constraints with an IFEval
    counterpart as IFEval's columns (``rlhfkit.tasks.ifeval.ifeval_columns``)."""
    record = {"prompt": prompt, "constraints": [c.kind for c in constraints], "topic": topic.name}
    return record | ifeval_columns(constraints)


def make_split(
    size: int,
    topics: Sequence[Topic],
    pools: tuple[Sequence[str], Sequence[str]],
    seen: set[str],
    rng: random.Random,
) -> list[dict]:
    """``size`` records of prompts not in ``seen`` (which takes them): kinds drawn from
    ``pools`` (first kind, second kind), topics from ``topics``."""
    records = []
    for _ in range(100 * size):
        topic = rng.choice(topics)
        prompt, constraints = make_prompt(topic, draw_kinds(*pools, rng), rng)
        if prompt not in seen:
            seen.add(prompt)
            records.append(make_record(prompt, constraints, topic))
        if len(records) == size:
            return records
    raise RuntimeError(f"only {len(records)} distinct prompts of {size} after many draws")


def split_topics(rng: random.Random) -> tuple[list[Topic], list[Topic]]:
    """(training topics, held-out topics): a ``HELDOUT_TOPIC_SHARE`` of the plain topics and of
    the categories each, so that both splits have tasks of both sorts."""
    train, test = [], []
    for category in (False, True):
        group = [topic for topic in TOPICS if topic.category == category]
        rng.shuffle(group)
        cut = round(HELDOUT_TOPIC_SHARE * len(group))
        test += group[:cut]
        train += group[cut:]
    return train, test


def make_splits(seed: int) -> tuple[dict[str, list[dict]], dict[str, list[Topic]]]:
    """The records of every split, and the topics of each."""
    rng = random.Random(seed)
    train_topics, test_topics = split_topics(rng)
    heldout = sorted(HELDOUT_KINDS)
    plan = {
        "train": (train_topics, (TRAINING_KINDS, TRAINING_KINDS)),
        "test": (test_topics, (TRAINING_KINDS, TRAINING_KINDS)),
        "heldout_kinds": (train_topics, (heldout, tuple(KINDS))),
        "validation": (test_topics, (TRAINING_KINDS, TRAINING_KINDS)),
        "validation_heldout_kinds": (train_topics, (heldout, tuple(KINDS))),
    }
    seen: set[str] = set()
    splits = {
        name: make_split(SIZES[name], topics, pools, seen, rng)
        for name, (topics, pools) in plan.items()
    }
    return splits, {name: topics for name, (topics, _) in plan.items()}


def stats(seed: int, splits: dict[str, list[dict]], topics: dict[str, list[Topic]]) -> dict:
    """What ``stats.json`` records: the seed, kinds, topics, and counts per split and kind."""
    return {
        "seed": seed,
        "training_kinds": list(TRAINING_KINDS),
        "heldout_kinds": sorted(HELDOUT_KINDS),
        "prompts": {name: len(records) for name, records in splits.items()},
        "constraints_per_kind": {
            name: dict(sorted(Counter(k for r in records for k in r["constraints"]).items()))
            for name, records in splits.items()
        },
        "topics": {name: [topic.name for topic in group] for name, group in topics.items()},
    }


def interleave(groups: list[list[dict]], pattern: Sequence[str]) -> list[dict]:
    """The records of ``groups`` (one per distinct name of ``pattern``, in order of first
    appearance) taken in turn as ``pattern`` names them, until each group is used up."""
    sources = dict(zip(dict.fromkeys(pattern), map(iter, groups), strict=True))
    out: list[dict] = []
    while sources:
        for name in pattern:
            if name in sources:
                record = next(sources[name], None)
                if record is None:
                    del sources[name]
                else:
                    out.append(record)
    return out


def write(out: Path, seed: int) -> None:
    """Write the splits under ``out/prompts`` and ``out/stats.json``."""
    splits, topics = make_splits(seed)
    (out / "prompts").mkdir(parents=True, exist_ok=True)
    for name, parts in FILES.items():
        records = interleave([splits[part] for part in dict.fromkeys(parts)], parts)
        lines = "".join(json.dumps(record) + "\n" for record in records)
        (out / "prompts" / f"{name}.jsonl").write_text(lines, encoding="utf-8")
    summary = stats(seed, splits, topics)
    (out / "stats.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    log.info("wrote %s prompts to %s", summary["prompts"], out)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=INSTRUCTIONS_DATA_DIR)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    write(args.out, args.seed)


if __name__ == "__main__":
    main()
