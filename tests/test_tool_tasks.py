"""The two episode tasks: the calculator tool and its check, the guessing game, and their
bundled data (scripts/make_tool_data.py), which the documented command remakes byte for byte."""

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from rlhfkit.cli import main
from rlhfkit.data import load_records
from rlhfkit.experience.tools import Tool, tools_prompt
from rlhfkit.tasks import REWARD_FUNCTIONS
from rlhfkit.tasks.calculator import answer_reward, calculator, final_number
from rlhfkit.tasks.guessing import GuessingGame, halving_game, random_game, solved

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "src" / "rlhfkit" / "assets" / "data"


@pytest.mark.parametrize(
    "expression, value",
    [("347 * 58", "20126"), ("347 x 58", "20126"), ("(2 + 3) * -4", "-20"), ("7 / 2", "3.5"),
     ("8 / 2", "4"), ("2 ** 10", "1024"), ("17 % 5", "2")],
)  # fmt: skip
def test_the_calculator_evaluates_arithmetic(expression, value):
    assert calculator(expression) == value


@pytest.mark.parametrize(
    "expression, says",
    [("__import__('os').system('true')", "only numbers"), ("a.b", "only numbers"),
     ("9 ** 9 ** 9", "exponent 387420489 is over 100"), ("3 +", "not an arithmetic"),
     ("'a' * 3", "only numbers")],
)  # fmt: skip
def test_the_calculator_runs_no_code(expression, says):
    with pytest.raises(ValueError, match=says):
        calculator(expression)


def test_the_answer_is_the_final_number_not_a_restated_product():
    completions = ["Answer: 20126", "Answer: 20,126.", "347 * 58", "It is 20126", "Answer: 2 * 1"]
    assert answer_reward(completions, ["20126"] * 5) == [1.0, 1.0, 0.0, 1.0, 0.0]
    episode = [
        {"role": "assistant", "content": "<tool_call>...</tool_call>"},
        {"role": "tool", "content": "20126"},
        {"role": "assistant", "content": "Answer: 20125"},
    ]
    assert answer_reward([episode], ["20126"]) == [0.0]  # the tool's result is not the answer
    assert final_number("no number") is None
    assert REWARD_FUNCTIONS["calculator"] is answer_reward


def test_the_guessing_game_answers_each_guess_and_pays_for_speed():
    game = GuessingGame(max_guesses=3)
    prompt, info = game.reset(seed=0, options={"prompt": "Guess!", "secret": 42})
    assert prompt == "Guess!" and info["secret"] == 42
    assert game.step("I guess 50")[:4] == ("Lower.", 0.0, False, False)
    assert game.step("no idea")[:4] == ("Please reply with a whole number.", 0.0, False, False)
    observation, reward, terminated, truncated, _ = game.step("42")
    assert (observation, terminated, truncated) == ("Correct!", True, False)
    assert reward == pytest.approx(0.8) and game.solved
    assert solved([], [], environments=[game]) == [1.0]
    game.reset(seed=0, options={"secret": 7})
    for _ in range(2):
        assert not game.step("1")[3]
    assert game.step("1")[3]  # the third wrong guess cuts the game
    assert solved([], [], environments=[game]) == [0.0]


def test_a_game_without_a_secret_draws_one_from_its_seed():
    secrets = {GuessingGame().reset(seed=s)[1]["secret"] for s in range(20)}
    assert len(secrets) > 5 and all(1 <= s <= 100 for s in secrets)
    assert GuessingGame().reset(seed=3)[1] == GuessingGame().reset(seed=3)[1]


def test_a_row_with_its_own_range_plays_the_small_game():
    game = GuessingGame()
    prompt, info = game.reset(seed=0, options={"highest": 2})
    assert "between 1 and 2." in prompt and info["secret"] in (1, 2)
    assert GuessingGame().reset(seed=0, options={"highest": 2, "prompt": "Go"})[0] == "Go"


def test_the_random_player_never_listens_and_stops_at_its_budget():
    rng = random.Random(0)
    games = [random_game(1, rng, highest=2, max_guesses=2) for _ in range(200)]
    assert {tuple(g) for g in games} == {(1,), (2, 1), (2, 2)}  # a wrong guess repeated too


def test_halving_finds_any_secret_within_seven_guesses():
    rng = random.Random(0)
    for secret in range(1, 101):
        guesses = halving_game(secret, rng)
        assert guesses[-1] == secret and len(guesses) <= 8  # a random first guess, then 7


def test_the_bundled_data_is_the_documented_command(tmp_path):
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "make_tool_data.py"), "--out", str(tmp_path)],
        check=True,
        timeout=300,
    )
    tasks = ("calculator", "guessing", "guessing_small")
    for path in sorted(path for task in tasks for path in (DATA / task).rglob("*.jsonl")):
        made = tmp_path / path.relative_to(DATA)
        assert made.read_bytes() == path.read_bytes(), path


def test_the_bundled_data_loads_and_its_demonstrations_show_the_tools_as_episodes_do():
    prompts = load_records(DATA / "calculator" / "prompts", "prompts", split="test")
    assert len(prompts) == 256
    train = {r.prompt for r in load_records(DATA / "calculator" / "prompts", "prompts")}
    assert not train & {r.prompt for r in prompts}
    demos = load_records(DATA / "calculator" / "sft", "demonstrations")
    system = demos[0].prompt[0]
    assert system == {"role": "system", "content": tools_prompt([Tool.of(calculator)])}
    call, answer = demos[0], demos[1]
    expression = json.loads(call.response.split("\n")[1])["arguments"]["expression"]
    assert answer.prompt[-1] == {"role": "tool", "content": calculator(expression)}
    assert answer.response == f"Answer: {calculator(expression)}"
    games = load_records(DATA / "guessing" / "prompts", "prompts", split="test")
    assert len(games) == 256 and all(1 <= g.columns["secret"] <= 100 for g in games)


def test_the_tiny_model_learns_to_read_the_guessing_games_replies(tmp_path):
    """configs/guessing_tiny_*.yaml as they ship, on the bundled model: SFT on a player who
    never listens wins about 3 games in 5 (a wrong first guess is often repeated); GRPO's 40
    steps against the environment must win at least 0.9 of the held-out games."""
    runs = tmp_path / "runs" / "guessing_tiny"
    quiet = ["--report_to", "[none]"]
    for stage in ("sft", "grpo"):
        config = str(ROOT / "configs" / f"guessing_tiny_{stage}.yaml")
        start = ["--model", str(runs / "sft" / "final")] if stage == "grpo" else []
        assert main([stage, "--config", config, "--output_dir", str(runs / stage), *start,
                     *quiet]) == 0  # fmt: skip
    models = json.dumps({name: str(runs / name / "final") for name in ("sft", "grpo")})
    output = tmp_path / "eval.json"
    assert main(["eval", "--config", str(ROOT / "configs" / "guessing_tiny_eval.yaml"),
                 "--models", models, "--reference", str(runs / "sft" / "final"),
                 "--output", str(output), "--max_prompts", "64"]) == 0  # fmt: skip
    results = {row["model"]: row for row in json.loads(output.read_text())["rows"]}
    assert results["sft"]["gold"] < 0.75
    assert results["grpo"]["gold"] >= 0.9
    assert results["grpo"]["gold_gain"] > 3 * results["grpo"]["gold_gain_se"]
