"""Tests for the math task: the problem generator (scripts/make_math_problems.py) and its
bundled data, checked with an arithmetic of the test's own, and the rewards of
``rlhfkit.tasks.math_problems``."""

import ast
import json
import operator
import re
import threading
from fractions import Fraction
from pathlib import Path

import pytest

from helpers import load_script
from rlhfkit.tasks.math_problems import (
    check_math_prompt,
    final_answer_text,
    math_format_reward,
    math_reward,
)

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "make_math_problems.py"
BUNDLED = ROOT / "src" / "rlhfkit" / "assets" / "data" / "math"
SPLITS = ("train", "validation", "test")


@pytest.fixture(scope="module")
def generator():
    return load_script(SCRIPT)


def read_rows(folder: Path) -> dict[str, list[dict]]:
    return {
        split: [json.loads(line) for line in (folder / f"{split}.jsonl").open(encoding="utf-8")]
        for split in SPLITS
    }


@pytest.fixture(scope="module")
def bundled() -> dict[str, list[dict]]:
    return read_rows(BUNDLED)


def in_thread(function, *args, timeout: float = 60.0):
    """``function(*args)`` run in a thread of its own (not the main thread), its result."""
    result: dict = {}

    def run():
        try:
            result["value"] = function(*args)
        except BaseException as e:  # noqa: BLE001 -- handed back to the test
            result["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), f"{function.__name__} did not return within {timeout} s"
    if "error" in result:
        raise result["error"]
    return result["value"]


# ------------------------------------------------------------------ an arithmetic of our own

_OPERATIONS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def evaluate(expression: str) -> Fraction:
    """The value of an expression of non-negative integers, + - * / and brackets, exactly."""

    def value(node: ast.AST) -> Fraction:
        if isinstance(node, ast.Constant) and type(node.value) is int and node.value >= 0:
            return Fraction(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATIONS:
            return _OPERATIONS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            return value(node.left) / value(node.right)
        raise ValueError(f"{expression!r}: {ast.dump(node)} is not plain arithmetic")

    return value(ast.parse(expression, mode="eval").body)


def test_the_evaluator():
    assert evaluate("(12 + 7) * 3") == 57
    assert evaluate("12 + 7 * 3") == 33
    assert evaluate("10 - 4 - 3") == 3
    assert evaluate("9 / 2") == Fraction(9, 2)
    for bad in ("2 ** 10", "abs(3)", "x + 1", "-3", "1.5 + 1"):
        with pytest.raises(ValueError):
            evaluate(bad)


# --------------------------------------------------------------------------- the generator


def test_the_generator_is_deterministic(generator, tmp_path):
    args = ["--levels", "1,2,3", "--train", "30", "--validation", "12", "--test", "12"]
    generator.main([*args, "--out", str(tmp_path / "a")])
    generator.main([*args, "--out", str(tmp_path / "b")])
    for split in SPLITS:
        a = (tmp_path / "a" / f"{split}.jsonl").read_bytes()
        assert a == (tmp_path / "b" / f"{split}.jsonl").read_bytes()
        assert len(a.splitlines()) == {"train": 30, "validation": 12, "test": 12}[split]
    # a larger train split leaves the others as they were
    more = ["--levels", "1,2,3", "--train", "45", "--validation", "12", "--test", "12"]
    generator.main([*more, "--out", str(tmp_path / "c")])
    for split in ("validation", "test"):
        a = (tmp_path / "a" / f"{split}.jsonl").read_bytes()
        assert (tmp_path / "c" / f"{split}.jsonl").read_bytes() == a
    generator.main([*args, "--seed", "1", "--out", str(tmp_path / "d")])
    a, d = ((tmp_path / x / "test.jsonl").read_bytes() for x in "ad")
    assert a != d


def test_the_bundled_data_is_the_documented_command(generator, tmp_path):
    lines = generator.__doc__.splitlines()
    start = next(
        i for i, line in enumerate(lines) if "python scripts/make_math_problems.py" in line
    )
    command = lines[start]
    while command.endswith("\\"):
        start += 1
        command = command[:-1] + " " + lines[start]
    argv = command.split()[2:]
    assert argv[argv.index("--out") + 1] == "src/rlhfkit/assets/data/math"
    argv[argv.index("--out") + 1] = str(tmp_path)
    generator.main(argv)
    for split in SPLITS:
        made = (tmp_path / f"{split}.jsonl").read_bytes()
        assert made == (BUNDLED / f"{split}.jsonl").read_bytes(), split
    generator.main(["--out", str(tmp_path / "defaults")])  # the defaults are that command
    for split in SPLITS:
        made = (tmp_path / "defaults" / f"{split}.jsonl").read_bytes()
        assert made == (BUNDLED / f"{split}.jsonl").read_bytes(), split


def test_the_bundled_splits(generator, bundled):
    sizes = {split: len(rows) for split, rows in bundled.items()}
    assert sizes == {"train": 2000, "validation": 256, "test": 512}
    texts = {split: {row["prompt"] for row in rows} for split, rows in bundled.items()}
    for split, rows in bundled.items():
        assert len(texts[split]) == len(rows), f"a problem twice in {split}"
    assert not texts["train"] & texts["validation"]
    assert not texts["train"] & texts["test"]
    assert not texts["validation"] & texts["test"]
    levels = set(generator.DEFAULT_LEVELS)
    for split, rows in bundled.items():
        assert {row["level"] for row in rows} == levels, split
        counts = [sum(row["level"] == level for row in rows) for level in levels]
        assert max(counts) - min(counts) <= 1, (split, counts)
        # the levels take turns: an evaluation's first prompts hold them all
        assert {row["level"] for row in rows[: len(levels)]} == levels, split
    total = sum((BUNDLED / f"{split}.jsonl").stat().st_size for split in SPLITS)
    assert total < 1_000_000


def numbers(text: str) -> list[int]:
    return [int(n) for n in re.findall(r"\d+", text)]


def check_row(row: dict, instruction: str) -> None:
    assert set(row) == {"prompt", "answer", "level", "expression"}
    assert isinstance(row["answer"], str) and re.fullmatch(r"0|[1-9]\d*", row["answer"]), row
    value = evaluate(row["expression"])
    assert value.denominator == 1 and value >= 0, row
    assert str(value.numerator) == row["answer"], row
    assert row["prompt"].endswith(" " + instruction), row
    story = row["prompt"][: -len(instruction)]
    # the expression's numbers are the story's numbers, in the order the story states them
    assert numbers(row["expression"]) == numbers(story), row
    assert story.rstrip().endswith("?"), row


def test_every_answer_is_right(generator, bundled):
    for rows in bundled.values():
        for row in rows:
            check_row(row, generator.INSTRUCTION)


def test_every_level_makes_right_problems(generator):
    instruction = generator.INSTRUCTION
    made = generator.make(sorted(generator.LEVELS), {"test": 60, "validation": 6}, seed=3)
    for rows in made.values():
        for row in rows:
            check_row(row, instruction)
    levels = sorted(generator.LEVELS)
    steps = {level: generator.LEVELS[level].steps for level in levels}
    for row in made["test"]:
        # one operation per step, an operator between two numbers
        assert len(numbers(row["expression"])) == steps[row["level"]] + 1, row


def test_the_generator_refuses_bad_levels(generator, tmp_path):
    for levels in ("0", "1,1", "x"):
        with pytest.raises(SystemExit):
            generator.main(["--levels", levels, "--out", str(tmp_path)])


# ---------------------------------------------------------------------------- the rewards

REWARDS = [
    # (response, gold, accuracy, format)
    ("4 + 3 = 7\nAnswer: 7", "7", 1.0, 1.0),
    ("4 + 3 = 8\nAnswer: 8", "7", 0.0, 1.0),
    ("Answer: 42.", "42", 1.0, 1.0),  # punctuation after the number
    ("**Answer:** 42", "42", 1.0, 1.0),  # markdown
    ("answer: 1,234", "1234", 1.0, 1.0),  # thousands separator
    ("Answer: 42 apples", "42", 1.0, 0.0),  # right, but not the asked form
    ("Answer: forty-two", "42", 0.0, 0.0),  # a number in words reads as nothing
    ("She has forty-two apples.", "42", 0.0, 0.0),
    ("Answer: 12 + 30 = 42", "42", 1.0, 0.0),  # the value stated last on the line
    ("So the total is $\\boxed{42}$.", "42", 1.0, 0.0),  # a LaTeX boxed answer
    ("The answer is \\boxed{41}.", "42", 0.0, 0.0),
    ("12 + 30 = 42\nThe answer is 42.", "42", 1.0, 0.0),  # no "Answer:": Math-Verify's own
    ("Tom has 12 + 30 = 42 apples.", "42", 1.0, 0.0),  # ... the last number then
    ("Tom has 42 apples. He gave 12 away.", "42", 0.0, 0.0),  # ... which is 12 here
    ("Answer: 42\nCheck: 12 + 30 = 42. And 7 more.", "42", 1.0, 0.0),  # the last "Answer:" line
    ("Answer: 41\nWait, no.\nAnswer: 42", "42", 1.0, 1.0),  # the last "Answer:" counts
    ("Answer: 42\nAnswer: 41", "42", 0.0, 1.0),
    ("Answer:\n42", "42", 1.0, 0.0),  # the number on the next line
    ("Answer: 42.0", "42", 1.0, 1.0),
    ("Answer: 9^9^9^9", "42", 0.0, 0.0),  # a power tower scores 0 at once, never hangs
    ("", "42", 0.0, 0.0),
    ("I don't know.", "42", 0.0, 0.0),
]


@pytest.mark.parametrize(("response", "gold", "accuracy", "form"), REWARDS)
def test_the_rewards(response, gold, accuracy, form):
    assert math_reward([response], answer=[gold]) == [accuracy]
    assert math_format_reward([response]) == [form]


def test_the_rewards_from_a_thread():
    # Math-Verify's own timeout (signal.alarm) fails outside the main thread
    responses = [r for r, *_ in REWARDS]
    golds = [g for _, g, *_ in REWARDS]
    assert in_thread(lambda: math_reward(responses, answer=golds)) == [a for *_, a, _ in REWARDS]
    assert in_thread(lambda: math_format_reward(responses)) == [f for *_, f in REWARDS]


def test_conversational_completions():
    completions = [
        [{"role": "assistant", "content": "3 + 4 = 7\nAnswer: 7"}],
        [{"role": "assistant", "content": "Answer: 8"}],
        [{"role": "assistant", "content": None}],
    ]
    golds = ["7", "7", "7"]
    prompts = [[{"role": "user", "content": "Tom has 3 apples ..."}]] * 3
    kwargs = dict(prompts=prompts, completion_ids=[[1], [2], [3]], level=[1, 1, 1])
    assert math_reward(completions, answer=golds, **kwargs) == [1.0, 0.0, 0.0]
    assert math_format_reward(completions, **kwargs) == [1.0, 1.0, 0.0]


def test_bad_gold_answers():
    with pytest.raises(ValueError, match="'seven'"):
        math_reward(["Answer: 7"], answer=["seven"])
    with pytest.raises(ValueError, match="2 completions but 1 answer"):
        math_reward(["Answer: 7", "Answer: 8"], answer=["7"])
    assert math_reward(["Answer: 7"], answer=[7]) == [1.0]  # a number read from JSON as such


def test_final_answer_text():
    assert final_answer_text("Work.\nAnswer: 42.") == " 42."
    assert final_answer_text("no label, 42") == "no label, 42"
    assert final_answer_text("**Answer**: 3\nmore") == " 3"


def test_check_math_prompt():
    prompt = "Tom has 3 apples. He buys 4 more. How many apples does he have now?"
    assert check_math_prompt(prompt, {"answer": "7", "level": 1}) is None
    assert check_math_prompt([{"role": "user", "content": prompt}], {"answer": "7"}) is None
    assert "'answer' column" in check_math_prompt(prompt, {"level": 1})
    assert "'answer' column" in check_math_prompt(prompt, {"answer": None})
    assert "'seven'" in check_math_prompt(prompt, {"answer": "seven"})
    assert "True" in check_math_prompt(prompt, {"answer": True})


# ------------------------------------------------------------------------------ GRPO learns
@pytest.mark.slow
def test_grpo_on_the_math_data_learns_the_math_reward(tiny_tokenizer, tmp_path):
    """A tiny random GPT-2 cannot read a word problem, but GRPO with the `math` reward, which
    reads each problem's `answer` column, teaches it the answers these problems share: on the
    bundled problems whose answer is 1 or 2, its accuracy rises from chance within 30 steps."""
    from helpers import tiny_lm
    from rlhfkit.data import PromptExample, encode_prompts, load_records
    from rlhfkit.experience.scorer_loading import build_scorer
    from rlhfkit.trainers.rl import RLTrainer
    from rlhfkit.trainers.rl_config import RLConfig

    records = load_records(BUNDLED, "prompts", split="train")
    records = [r for r in records if r.columns["answer"] in ("1", "2")]
    ids, _ = encode_prompts(records, tiny_tokenizer, 16, chat_template=False)
    examples = [PromptExample(i, r) for i, r in zip(ids, records, strict=True)]
    config = RLConfig.preset(
        "grpo", model="unused", train_data="unused", output_dir=str(tmp_path / "run"),
        reward_functions=["math"], rollout_batch_size=8, num_generations=8, batch_size=64,
        max_new_tokens=4,
        max_steps=30, learning_rate=3e-3, lr_scheduler="constant", log_every=10,
        sample_every=100, cpu=True, report_to=[], resume=False, seed=0,
    )  # fmt: skip
    scorer = build_scorer(None, ["math"])
    model = tiny_lm(tiny_tokenizer)
    trainer = RLTrainer(config, model, tiny_tokenizer, examples, scorer, eval_prompts=examples[:64])
    start = trainer.run_evaluation()["score"]
    trainer.train()
    end = trainer.state.eval_metrics["score"]
    assert start < 0.1
    assert end > 0.25 and end > start + 0.2, (start, end)
