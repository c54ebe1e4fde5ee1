"""Make the data of the two episode tasks: the calculator (``rlhfkit.tasks.calculator``) and
the guessing game (``rlhfkit.tasks.guessing``).

Each task gets ``prompts/`` (``train``, ``validation``, ``test`` JSONL: prompt records with
the columns their checks read, ``answer`` or ``secret``) and ``sft/`` (``train``, ``test``:
chat demonstrations of the episode format, InstructGPT's order: SFT first, then RL).

A calculator demonstration is one episode told as its two policy turns, each a
demonstration whose prompt is the conversation before it: the tool call
(``<tool_call>{"name": "calculator", "arguments": {"expression": "347 * 58"}}</tool_call>``)
after the system message that shows the tools (``tools.tools_prompt``, as an episode shows
them to a model whose chat template takes no tools), then "Answer: 20126" after the tool's
result. A guessing-game demonstration is a game played by halving the range after a random
first guess (``guessing.halving_game``), each guess a demonstration after the replies so far.
The small game for the bundled tiny model (``guessing_small``: 1 to ``SMALL_HIGHEST``, its
rows carry ``highest``) is demonstrated by a player who guesses at random and never listens
(``guessing.random_game``): the format is taught, the strategy is left to RL.

Problems and secrets of the demonstrations are drawn apart from the prompts' (their own
seed), so no test prompt is demonstrated. The bundled data is made by the defaults::

    python scripts/make_tool_data.py --out src/rlhfkit/assets/data
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from rlhfkit.experience.tools import Tool, tools_prompt
from rlhfkit.tasks import calculator, guessing

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "src" / "rlhfkit" / "assets" / "data"
PROMPT_SPLITS = {"train": 2000, "validation": 256, "test": 256}
SMALL_HIGHEST = 2
SMALL_MAX_GUESSES = 2


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def tool_call(expression: str) -> str:
    call = {"name": "calculator", "arguments": {"expression": expression}}
    return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"


def calculator_demonstrations(problems: list[dict]) -> list[dict]:
    """Two demonstrations per problem: the call, then the answer after the tool's result."""
    system = {"role": "system", "content": tools_prompt([Tool.of(calculator.calculator)])}
    rows = []
    for problem in problems:
        expression = f"{problem['a']} * {problem['b']}"
        conversation = [system, {"role": "user", "content": problem["prompt"]}]
        rows.append({"prompt": conversation, "response": tool_call(expression)})
        conversation = [
            *conversation,
            {"role": "assistant", "content": tool_call(expression)},
            {"role": "tool", "content": calculator.calculator(expression)},
        ]
        rows.append({"prompt": conversation, "response": f"Answer: {problem['answer']}"})
    return rows


def guessing_demonstrations(secrets: list[int], seed: int, small: bool = False) -> list[dict]:
    """One demonstration per guess of games played by halving the range (the small game:
    at random)."""
    rng = random.Random(seed)
    rows = []
    for secret in secrets:
        if small:
            prompt = guessing.prompt_of(SMALL_HIGHEST)
            game = guessing.random_game(secret, rng, SMALL_HIGHEST, SMALL_MAX_GUESSES)
        else:
            prompt, game = guessing.PROMPT, guessing.halving_game(secret, rng)
        conversation = [{"role": "user", "content": prompt}]
        for guess in game:
            rows.append({"prompt": list(conversation), "response": str(guess)})
            reply = "Higher." if guess < secret else "Lower."
            conversation += [
                {"role": "assistant", "content": str(guess)},
                {"role": "user", "content": reply},
            ]
    return rows


def split_rows(rows: list[dict]) -> dict[str, list[dict]]:
    """``rows`` cut into the prompt splits, in order."""
    splits, start = {}, 0
    for name, count in PROMPT_SPLITS.items():
        splits[name] = rows[start : start + count]
        start += count
    return splits


def unique(rows, key) -> list[dict]:
    seen, kept = set(), []
    for row in rows:
        if key(row) not in seen:
            seen.add(key(row))
            kept.append(row)
    return kept


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--calculator_demos", type=int, default=300)
    parser.add_argument("--guessing_demos", type=int, default=100)
    parser.add_argument("--small_guessing_demos", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    total = sum(PROMPT_SPLITS.values())

    drawn = unique(calculator.problems(3 * total, args.seed), lambda r: r["prompt"])[:total]
    prompts = [{k: r[k] for k in ("prompt", "answer")} for r in drawn]
    for name, rows in split_rows(prompts).items():
        write_jsonl(args.out / "calculator" / "prompts" / f"{name}.jsonl", rows)
    taken = {r["prompt"] for r in drawn}
    demos = [
        r for r in calculator.problems(3 * args.calculator_demos, args.seed + 1)
        if r["prompt"] not in taken
    ][: args.calculator_demos]  # fmt: skip
    held_out = max(1, len(demos) // 10)
    write_jsonl(args.out / "calculator" / "sft" / "train.jsonl",
                calculator_demonstrations(demos[held_out:]))  # fmt: skip
    write_jsonl(args.out / "calculator" / "sft" / "test.jsonl",
                calculator_demonstrations(demos[:held_out]))  # fmt: skip

    write_guessing(args.out / "guessing", args.guessing_demos, args.seed, small=False)
    write_guessing(args.out / "guessing_small", args.small_guessing_demos, args.seed, small=True)


def write_guessing(out: Path, demos: int, seed: int, small: bool) -> None:
    """The guessing game's prompts and demonstrations, the small game's if ``small``."""
    highest = SMALL_HIGHEST if small else guessing.HIGHEST
    games = list(guessing.secrets(sum(PROMPT_SPLITS.values()), seed, highest))
    for name, rows in split_rows(games).items():
        write_jsonl(out / "prompts" / f"{name}.jsonl", rows)
    rng = random.Random(seed + 1)
    played = [rng.randint(1, highest) for _ in range(demos)]
    held_out = max(1, len(played) // 10)
    write_jsonl(out / "sft" / "train.jsonl",
                guessing_demonstrations(played[held_out:], seed + 2, small))  # fmt: skip
    write_jsonl(out / "sft" / "test.jsonl",
                guessing_demonstrations(played[:held_out], seed + 3, small))  # fmt: skip


if __name__ == "__main__":
    main()
