"""Make the arithmetic word problems of the math task (``rlhfkit.tasks.math_problems``).

A problem is a short everyday story ("Tom has 12 apples. He buys 7 more. How many apples does
he have now?") whose answer is a non-negative integer, in the style of GSM8K (Cobbe et al.
2021, "Training Verifiers to Solve Math Word Problems") but made by a program, so that every
answer is known and the difficulty is graded. A story starts with a quantity someone owns
(a count; ``a`` boxes of ``b``; ``b`` more, fewer or times as many as someone else has; a
share of ``a`` things split among ``b`` children),
then each step changes it (buys, finds, gives away, eats, sells, gets ``n`` times as many,
splits into ``n`` equal bags and keeps one), and a question asks for the count at the end.
Each operation is one step; every intermediate count is a positive integer and every
division is exact. Names, objects, verbs and questions are drawn from small tables.

Levels (``LEVELS``), from one step with single digits to three steps with multi-digit numbers:

1. one step, ``+`` or ``-``, single digits (2 to 9);
2. one step, ``+`` or ``-``, numbers up to 20;
3. one step, ``+ - * /``, multi-digit numbers (sums of numbers up to 999; a two- or
   three-digit number times or divided by a single digit);
4. two steps, ``+ - * /``, numbers up to 20 (factors and divisors 2 to 5);
5. two steps, ``+ - * /``, multi-digit numbers;
6. three steps, ``+ - * /``, multi-digit numbers.

The bundled data holds levels 1 and 2, the levels where SmolLM2-135M-Instruct, the model the
task is for, gets answers right (validation problems, 48 to 64 a level): greedy decoding solves
48% of level 1 and 21% of level 2; plain sampling at temperature 1.0 6% of each (it mostly
derails), at 0.7 23% and 12%; levels 3 and 4 it solves 0 to 2% of even greedily.

Each record is ``{"prompt", "answer", "level", "expression"}``: ``prompt`` is the story plus
``INSTRUCTION`` (how to state the final answer, a form the math reward checks), ``answer`` the
answer in digits ("42"), ``expression`` an arithmetic expression whose value is the answer,
with the numbers in the order the text states them ("(12 + 7) * 3").

Splits: ``train.jsonl``, ``validation.jsonl`` and ``test.jsonl``, each with the levels asked
for in equal shares (the first levels take the remainder), taking turns row by row (1, 2, 3,
1, 2, 3, ...), so that the first rows of a split, however many an evaluation takes, hold every
level. One seeded ``random.Random`` per
level draws that level's problems, first those of test, then validation, then train; a
problem whose text was drawn before (in any split, at any level) is drawn again, so no text is
in two splits. The output is a pure function of the arguments, and a split does not change
when the splits drawn after it grow (test stays as it is when train grows). The bundled data (``src/rlhfkit/assets/data/math``) is made
by the defaults::

    python scripts/make_math_problems.py --out src/rlhfkit/assets/data/math \\
        --levels 1,2 --train 2000 --validation 256 --test 512 --seed 0
"""

from __future__ import annotations

import argparse
import json
import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("make_math_problems")

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "src" / "rlhfkit" / "assets" / "data" / "math"
DEFAULT_LEVELS = (1, 2)
SIZES = {"test": 512, "validation": 256, "train": 2000}
"""Rows per split, in the order the splits are drawn."""
INSTRUCTION = "Give the final answer as a number on the last line, after 'Answer:'."
"""Appended to every story: what ``math_format_reward`` checks and ``math_reward`` reads."""


@dataclass(frozen=True)
class Level:
    steps: int
    ops: str  # the operations drawn from
    start: tuple[int, int]  # the first count
    addend: tuple[int, int]  # what + and - add or take away
    factor: tuple[int, int]  # what * multiplies by and / divides by
    most: int  # no count above this


# an addend of 2 at least: "buys 1 more apples" is no English
TINY = dict(start=(2, 9), addend=(2, 9), factor=(2, 3), most=20)
SMALL = dict(start=(3, 20), addend=(2, 20), factor=(2, 5), most=200)
LARGE = dict(start=(100, 999), addend=(10, 999), factor=(2, 9), most=9999)
LEVELS = {
    1: Level(steps=1, ops="+-", **TINY),
    2: Level(steps=1, ops="+-", **SMALL),
    3: Level(steps=1, ops="+-*/", **LARGE),
    4: Level(steps=2, ops="+-*/", **SMALL),
    5: Level(steps=2, ops="+-*/", **LARGE),
    6: Level(steps=3, ops="+-*/", **LARGE),
}

PEOPLE = [
    ("Tom", "he"), ("Anna", "she"), ("Ben", "he"), ("Lucy", "she"), ("Sam", "he"),
    ("Maria", "she"), ("Leo", "he"), ("Emma", "she"), ("Omar", "he"), ("Sofia", "she"),
    ("Jack", "he"), ("Mia", "she"), ("Ravi", "he"), ("Grace", "she"), ("Ethan", "he"),
    ("Zoe", "she"), ("Noah", "he"), ("Lily", "she"), ("Carlos", "he"), ("Hannah", "she"),
    ("Max", "he"), ("Chloe", "she"), ("Ivan", "he"), ("Nina", "she"),
]  # fmt: skip
FOOD = ["apples", "cookies", "oranges", "eggs", "muffins", "strawberries", "carrots", "cupcakes"]
THINGS = [
    "marbles", "stickers", "books", "pencils", "coins", "stamps", "cards", "shells",
    "balloons", "crayons", "buttons", "toy cars", "beads", "postcards", "seeds", "candles",
]  # fmt: skip
CONTAINERS = ["boxes", "bags", "packs", "jars", "baskets", "trays"]
FRIENDS = ["a friend", "a neighbour", "a classmate", "a cousin", "the teacher", "a brother"]
FRIENDS += ["a sister"]


@dataclass
class Story:
    """A story as it is told: its sentences, the count it is about and how it was reached."""

    name: str
    pronoun: str
    objects: str
    sentences: list[str]
    count: int
    expression: str
    precedence: int  # of ``expression``'s outermost operation: 3 a number, 2 * or /, 1 + or -
    ops: int = 0


def _cap(text: str) -> str:
    return text[0].upper() + text[1:]


def _number(rng: random.Random, bounds: tuple[int, int]) -> int:
    return rng.randint(*bounds)


def _start(rng: random.Random, level: Level, op: str | None) -> Story:
    """The opening: a count someone has, made with ``op`` (one step) or none."""
    name, pronoun = rng.choice(PEOPLE)
    objects = rng.choice(FOOD + THINGS)
    if op is None:
        a = _number(rng, level.start)
        text = rng.choice(
            [
                "{name} has {a} {objects}.",
                "{name} has a collection of {a} {objects}.",
                "There are {a} {objects} in {name}'s room.",
                "{name} starts the day with {a} {objects}.",
            ]
        )
        if text.startswith("There are") and objects in FOOD:
            text = "There are {a} {objects} in {name}'s kitchen."
        return Story(name, pronoun, objects, [text.format(name=name, a=a, objects=objects)], a,
                     str(a), 3)  # fmt: skip
    # the other person is of the other gender, so that "he" or "she" names one of the two
    other, _ = rng.choice([p for p in PEOPLE if p[1] != pronoun])
    a = _number(rng, level.start)
    if op == "*":
        b = _number(rng, level.factor)
        if rng.random() < 0.5:
            container = rng.choice(CONTAINERS)
            # the factor comes first in the story: "3 boxes with 12 apples in each"
            a = _number(rng, level.factor)
            b = _number(rng, (max(2, level.start[0] // 2), level.start[1] // 2))
            text = f"{name} has {a} {container} of {objects} with {b} {objects} in each."
        else:
            text = f"{other} has {a} {objects}. {name} has {b} times as many {objects} as {other}."
        return Story(name, pronoun, objects, [text], a * b, f"{a} * {b}", 2, 1)
    if op == "/":
        divisors = [d for d in range(level.factor[0], level.factor[1] + 1) if a % d == 0]
        if not divisors:
            raise _Retry
        d = rng.choice(divisors)
        text = (
            f"{other} has {a} {objects} and shares them equally among {d} children. "
            f"{name} is one of them."
        )
        return Story(name, pronoun, objects, [text], a // d, f"{a} / {d}", 2, 1)
    b = _number(rng, level.addend)
    if op == "-":
        if b >= a:
            raise _Retry
        text = f"{other} has {a} {objects}. {name} has {b} fewer {objects} than {other}."
        return Story(name, pronoun, objects, [text], a - b, f"{a} - {b}", 1, 1)
    text = f"{other} has {a} {objects}. {name} has {b} more {objects} than {other}."
    return Story(name, pronoun, objects, [text], a + b, f"{a} + {b}", 1, 1)


class _Retry(Exception):
    """The draw does not fit the level's rules (a negative count, an inexact division)."""


ADD = [
    "{Sub} buys {n} more.",
    "{Sub} finds {n} more {objects}.",
    "{Friend} gives {obj} {n} more {objects}.",
    "{Sub} gets {n} more {objects} from {friend}.",
    "Then {sub} buys another {n} {objects}.",
]
SUBTRACT = [
    "{Sub} gives {n} of them to {friend}.",
    "{Sub} loses {n} of them.",
    "{Sub} sells {n} {objects}.",
    "Then {sub} gives away {n} {objects}.",
]
EAT = ["{Sub} eats {n} of them.", "{Sub} uses {n} of them to bake a cake."]
MULTIPLY = [
    "A week later {sub} has {n} times as many {objects} as before.",
    "{Sub} keeps collecting until {sub} has {n} times as many {objects}.",
]
DIVIDE = [
    "{Sub} splits them equally into {n} bags and keeps one bag.",
    "{Sub} puts them into {n} equal piles and keeps one pile.",
]
QUESTIONS = [
    "How many {objects} does {sub} have now?",
    "How many {objects} does {name} have in the end?",
    "How many {objects} does {name} have now?",
]
SHARE_QUESTION = (
    "{Sub} shares them equally among {n} friends. How many {objects} does each friend get?"  # noqa: E501
)


def _step(rng: random.Random, level: Level, story: Story, op: str, last: bool) -> str:
    """Apply ``op`` to the story's count; the sentence that says so (with the question, where
    the step is a share that only the question can state)."""
    q = story.count
    if op in "+-":
        n = _number(rng, level.addend)
        if op == "-" and n >= q:
            raise _Retry
        table = ADD if op == "+" else SUBTRACT + (EAT if story.objects in FOOD else [])
        value = q + n if op == "+" else q - n
        precedence = 1
    else:
        n = _number(rng, level.factor)
        if op == "/" and q % n:
            raise _Retry
        table = MULTIPLY if op == "*" else DIVIDE
        value = q * n if op == "*" else q // n
        precedence = 2
    if value > level.most:
        raise _Retry
    expression = story.expression
    if precedence == 2 and story.precedence == 1:
        expression = f"({expression})"
    story.expression = f"{expression} {op} {n}"
    story.precedence = precedence
    story.count = value
    story.ops += 1
    share = op == "/" and last and rng.random() < 0.5
    template = SHARE_QUESTION if share else rng.choice(table)
    sub = story.pronoun if rng.random() < 0.6 else story.name
    obj = {"he": "him", "she": "her"}[story.pronoun]
    friend = rng.choice(FRIENDS)
    fields = dict(sub=sub, Sub=_cap(sub), n=n, objects=story.objects, obj=obj, friend=friend)
    return template.format(Friend=_cap(friend), name=story.name, **fields)


def problem(rng: random.Random, level_number: int) -> dict:
    """One problem of the level, drawn from ``rng`` (draws that break the rules are redrawn)."""
    level = LEVELS[level_number]
    while True:
        try:
            return _problem(rng, level, level_number)
        except _Retry:
            continue


def _problem(rng: random.Random, level: Level, level_number: int) -> dict:
    ops = [rng.choice(level.ops) for _ in range(level.steps)]
    # a step may be told by the opening sentence ("3 boxes of 12", "7 more than Tom")
    opening = ops[0] if rng.random() < 0.35 else None
    story = _start(rng, level, opening)
    if story.count > level.most:
        raise _Retry
    rest = ops[1:] if opening else ops
    question = None
    for i, op in enumerate(rest):
        sentence = _step(rng, level, story, op, last=i == len(rest) - 1)
        if "How many" in sentence:
            sentence, question = sentence.split(" How many")
            question = "How many" + question
        story.sentences.append(sentence)
    if question is None and not rest:
        question = f"How many {story.objects} does {story.name} have?"
    elif question is None:
        sub = story.pronoun if rng.random() < 0.5 else story.name
        question = rng.choice(QUESTIONS).format(objects=story.objects, sub=sub, name=story.name)
    text = " ".join([*story.sentences, question])
    return {
        "prompt": f"{text} {INSTRUCTION}",
        "answer": str(story.count),
        "level": level_number,
        "expression": story.expression,
    }


def split_sizes(total: int, levels: Sequence[int]) -> dict[int, int]:
    """Rows of each level in a split of ``total`` rows: equal shares, the first levels taking
    the remainder."""
    share, extra = divmod(total, len(levels))
    return {level: share + (i < extra) for i, level in enumerate(levels)}


def make(levels: Sequence[int], sizes: dict[str, int], seed: int) -> dict[str, list[dict]]:
    """The rows of each split (in ``sizes``' order of drawing: test, validation, train)."""
    splits: dict[str, list[dict]] = {split: [] for split in sizes}
    rngs = {level: random.Random(f"math-problems/{seed}/level-{level}") for level in levels}
    seen: set[str] = set()
    for split, total in sizes.items():
        drawn: dict[int, list[dict]] = {}
        for level, want in split_sizes(total, levels).items():
            rows = drawn[level] = []
            tries = 0
            while len(rows) < want:
                row = problem(rngs[level], level)
                tries += 1
                if tries > 100 * (want + 10):
                    raise RuntimeError(f"level {level}: too few distinct problems for {split}")
                if row["prompt"] not in seen:
                    seen.add(row["prompt"])
                    rows.append(row)
        # the levels take turns, so that the first rows of a split, however many, hold them all
        longest = max(len(rows) for rows in drawn.values())
        for i in range(longest):
            splits[split] += [rows[i] for rows in drawn.values() if i < len(rows)]
    return splits


def write(out: Path, levels: Sequence[int], sizes: dict[str, int], seed: int) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for split, rows in make(levels, sizes, seed).items():
        path = out / f"{split}.jsonl"
        with open(path, "w", encoding="utf-8", newline="\n") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        log.info("%s: %d problems", path, len(rows))


def _levels(text: str) -> tuple[int, ...]:
    levels = tuple(int(x) for x in text.split(","))
    unknown = [x for x in levels if x not in LEVELS]
    if unknown or len(set(levels)) != len(levels):
        raise argparse.ArgumentTypeError(f"levels {text!r}: each once, from {sorted(LEVELS)}")
    return levels


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument(
        "--levels", type=_levels, default=DEFAULT_LEVELS, help="comma-separated, e.g. 1,2,3"
    )
    for split, size in SIZES.items():
        parser.add_argument(f"--{split}", type=int, default=size, help=f"rows (default {size})")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    sizes = {split: getattr(args, split) for split in SIZES}
    for split, size in sizes.items():
        if size < len(args.levels):
            parser.error(f"--{split} {size}: at least one row per level ({len(args.levels)})")
    write(args.out, args.levels, sizes, args.seed)


if __name__ == "__main__":
    main()
