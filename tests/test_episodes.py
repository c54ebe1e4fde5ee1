"""Episodes: tool calls read and run (every failure kind a message, never a crash), the
environment's turns rendered after the policy's EOS, and their tokens outside the loss, the
KL and the advantages; one-turn episodes are the bandit rollout, bit for bit."""

import copy
import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import gymnasium
import pytest
import torch

from helpers import (
    stage_config,
    stopped_and_resumed_equals_straight,
    tiny_corpus,
    tiny_lm,
    write_jsonl,
)
from rlhfkit.data import (
    PromptColumns,
    PromptRecord,
    encode_prompts,
    encode_turn,
    load_prompts,
    pad,
)
from rlhfkit.errors import UsageError
from rlhfkit.evaluation.measures import PolicySamples, episode_figures
from rlhfkit.experience.episodes import (
    EPISODE_STATS,
    EpisodeError,
    EpisodeSettings,
    ToolEnv,
    as_environment,
    run_episodes,
    shown_stats,
)
from rlhfkit.experience.generation import GenerationOutput, SamplingConfig
from rlhfkit.experience.rollout import (
    ExperienceMaker,
    RolloutModels,
    RolloutSettings,
    rollout_stats,
)
from rlhfkit.experience.scorers import FunctionScorer, ScoreInput
from rlhfkit.experience.tools import Tool, ToolCall, ToolCallError, parse_tool_calls, tools_prompt
from rlhfkit.interact.env import TextEnv
from rlhfkit.models.passes import ValueHeadLM
from rlhfkit.runtime.machine import Runtime
from rlhfkit.trainers.ppo_update import PolicyLossSettings, policy_loss
from rlhfkit.trainers.rl import RLTrainer
from rlhfkit.trainers.rl_config import RLConfig

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|endoftext|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: the first factor
        b: the second factor
    """
    return a * b


def divide(a: float, b: float) -> float:
    """Divide a by b.

    Args:
        a: the dividend
        b: the divisor
    """
    return a / b


def slow(seconds: float) -> str:
    """Sleep, then answer.

    Args:
        seconds: how long to sleep
    """
    time.sleep(seconds)
    return "done"


def call(name: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


# --------------------------------------------------------------------------- tool calls
def test_tool_calls_are_read_in_order_and_a_turn_without_one_is_the_answer():
    text = f"Let me see. {call('multiply', a=3, b=4)} and {call('divide', a=1, b=2)}"
    assert parse_tool_calls(text) == [
        ToolCall("multiply", {"a": 3, "b": 4}),
        ToolCall("divide", {"a": 1, "b": 2}),
    ]
    assert parse_tool_calls("The answer is 12.") == []
    # arguments written as a JSON string, as some models do
    assert parse_tool_calls(
        '<tool_call>{"name": "multiply", "arguments": "{\\"a\\": 1, \\"b\\": 2}"}</tool_call>'
    ) == [ToolCall("multiply", {"a": 1, "b": 2})]


@pytest.mark.parametrize(
    "text, kind",
    [
        ("<tool_call>{name: multiply}</tool_call>", "format"),
        ('<tool_call>["multiply"]</tool_call>', "format"),
        ('<tool_call>{"name": "multiply", "arguments": {"a": 1', "format"),
        ('<tool_call>{"name": "multiply", "arguments": [1, 2]}</tool_call>', "arguments"),
    ],
)
def test_a_call_that_does_not_parse_is_an_error_of_its_kind(text, kind):
    (parsed,) = parse_tool_calls(text)
    assert isinstance(parsed, ToolCallError) and parsed.kind == kind


@pytest.mark.parametrize(
    "text, kind, says",
    [
        ("<tool_call>not json</tool_call>", "format", "not valid JSON"),
        (call("add", a=1, b=2), "unknown_tool", "no tool named 'add' (tools: multiply, divide"),
        (call("multiply", a=1), "arguments", "missing 'b'"),
        (call("multiply", a=1, b=2, c=3), "arguments", "unexpected 'c'"),
        (call("multiply", a="one", b=2), "arguments", "'a' must be integer, got \"one\""),
        (call("multiply", a=True, b=2), "arguments", "'a' must be integer, got true"),
        (call("divide", a=1, b=0), "raised", "divide raised ZeroDivisionError"),
        (call("slow", seconds=5), "timeout", "slow did not finish within 0.2 s"),
    ],
)
def test_every_failed_call_is_a_message_the_policy_reads_and_a_count(text, kind, says):
    env = ToolEnv([multiply, divide, slow], timeout=0.2)
    env.reset(options={"prompt": "What is 3 x 4?"})
    started = time.perf_counter()
    observation, reward, terminated, truncated, info = env.step(text)
    assert time.perf_counter() - started < 2  # a tool past its limit does not hold the run
    assert (reward, terminated, truncated) == (0.0, False, False)
    (message,) = observation
    assert message["role"] == "tool" and message["content"].startswith("Error: ")
    assert says in message["content"]
    assert info["tool_calls"] == 1 and info["tool_errors"] == {kind: 1}


def test_a_call_that_runs_returns_its_result_and_an_answer_ends_the_episode():
    env = ToolEnv([multiply, divide])
    env.reset(options={"prompt": "What is 3 x 4?"})
    observation, _, terminated, _, info = env.step(call("multiply", a=3, b=4))
    assert observation == [{"role": "tool", "content": "12"}] and not terminated
    assert info == {"tool_calls": 1, "tool_errors": {}}
    observation, reward, terminated, _, info = env.step("It is 12.")
    assert (observation, reward, terminated, info) == ("", 0.0, True, {"tool_calls": 0})


def test_a_tool_without_hints_or_docstring_is_refused_naming_it():
    def bare(a, b):
        return a + b

    with pytest.raises(UsageError, match="tool bare: no JSON schema"):
        Tool.of(bare)


def test_the_tools_prompt_shows_each_schema_and_the_call_format():
    text = tools_prompt([Tool.of(multiply)])
    assert "<tool_call>" in text and '"name": "multiply"' in text
    assert '"a": {"type": "integer", "description": "the first factor"}' in text


# --------------------------------------------------------------------------- rendering
def test_the_environment_turn_follows_the_eos_as_the_template_renders_it(tiny_tokenizer):
    tokenizer = copy.deepcopy(tiny_tokenizer)
    tool = [{"role": "tool", "content": "12"}]
    assert tokenizer.decode(encode_turn(tool, tokenizer)) == "\nTool: 12\nAssistant:"
    tokenizer.chat_template = CHATML
    # the template's "\n" after the answer's EOS, the tool turn, the next assistant turn
    expected = "\n<|im_start|>tool\n12<|endoftext|>\n<|im_start|>assistant\n"
    assert tokenizer.decode(encode_turn(tool, tokenizer)) == expected


# --------------------------------------------------------------------------- episodes
class Scripted:
    """A policy that says the given turns: ``sample`` for ``run_episodes``."""

    def __init__(self, tokenizer, turns: list[list[str]]):
        self.tokenizer, self.turns, self.calls = tokenizer, iter(turns), []

    def __call__(self, query, query_mask, max_new_tokens) -> GenerationOutput:
        self.calls.append((query.clone(), max_new_tokens))
        texts = next(self.turns)
        assert len(texts) == len(query)  # one per unfinished episode
        ids = [self.tokenizer(t)["input_ids"] + [self.tokenizer.eos_token_id] for t in texts]
        ids = [row[:max_new_tokens] for row in ids]
        width = max(map(len, ids))
        pad = self.tokenizer.pad_token_id
        response = torch.tensor([row + [pad] * (width - len(row)) for row in ids])
        mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in ids])
        eos = torch.tensor([row[-1] == self.tokenizer.eos_token_id for row in ids])
        return GenerationOutput(response, mask, eos)


@pytest.fixture
def tokenizer(tiny_tokenizer):
    """The tiny tokenizer with room for the tools' system prompt (no model reads it)."""
    tokenizer = copy.deepcopy(tiny_tokenizer)
    tokenizer.model_max_length = 4096
    return tokenizer


def play(tokenizer, turns, factory, prompts, **settings):
    sample = Scripted(tokenizer, turns)
    settings.setdefault("max_prompt_length", 2048)
    starts = PromptColumns(prompts, {"answer": [12] * len(prompts)})
    out = run_episodes(
        sample, tokenizer, factory, starts, [0] * len(prompts),
        EpisodeSettings(**settings), 256, torch.device("cpu"),
    )  # fmt: skip
    return out, sample


def test_a_two_turn_episode_in_one_sequence_with_each_position_masked(tokenizer):
    eos = tokenizer.eos_token_id
    turns = [[call("multiply", a=3, b=4), "It is 12."], ["So 12."]]
    out, sample = play(tokenizer, turns, lambda: ToolEnv([multiply]), ["3 x 4?", "3 x 4?"])
    first = tokenizer(turns[0][0])["input_ids"] + [eos]
    reply = encode_turn([{"role": "tool", "content": "12"}], tokenizer)
    second = tokenizer("So 12.")["input_ids"] + [eos]
    row = first + reply + second
    assert out.response[0, : len(row)].tolist() == row
    assert out.response_mask[0].tolist()[: len(row)] == [1] * len(first) + [0] * len(reply) + [
        1
    ] * len(second)
    assert out.env_mask[0].tolist()[: len(row)] == [0] * len(first) + [1] * len(reply) + [0] * len(
        second
    )
    assert not out.response_mask[0, len(row) :].any() and not out.env_mask[0, len(row) :].any()
    # the second episode answered at once: one turn, ended by the environment
    answer = tokenizer("It is 12.")["input_ids"] + [eos]
    assert out.response_mask[1].sum() == len(answer) and not out.env_mask[1].any()
    assert out.stats["turns"].tolist() == [2, 1] and out.stats["tool_calls"].tolist() == [1, 0]
    assert out.stats["tools"].tolist() == [1, 1]  # offered to each
    assert set(shown_stats(out.stats)) >= {"tool_calls", "tool_errors/timeout"}
    assert out.stats["truncated"].tolist() == [0, 0] and out.eos_emitted.all()
    assert out.answers == ["So 12.", "It is 12."]
    assert out.completions[0] == [
        {"role": "assistant", "content": turns[0][0]},
        {"role": "tool", "content": "12"},
        {"role": "assistant", "content": "So 12."},
    ]
    # the second turn was sampled for the unfinished episode alone, after everything so far
    (query, _), (second_query, _) = sample.calls
    assert len(second_query) == 1
    assert second_query[0, -len(first + reply) :].tolist() == first + reply
    # the tools shown in a system message (the tiny tokenizer has no chat template)
    prompt = tokenizer.decode(out.query[0][out.query_mask[0] != 0])
    assert prompt.startswith("System: You can call tools") and prompt.endswith(
        "User: 3 x 4?\nAssistant:"
    )


def test_the_text_environment_in_chat_mode_plays_episodes(tokenizer):
    """interact.env.TextEnv with observation="reply": the user's next message is the
    environment's turn, the reward of each response is added to the episode's, and the
    conversation ends when the user has nothing more to say."""
    eos = tokenizer.eos_token_id

    def user(conversation):
        return "Say more." if len(conversation) < 3 else None

    def chars(prompts, responses):
        return [float(len(r.strip())) for r in responses]

    def factory():
        return TextEnv(["unused"], chars, tokenizer, user=user, observation="reply")

    out, _ = play(tokenizer, [["Hi."], ["Hello there."]], factory, ["Greet me."])
    first = tokenizer("Hi.")["input_ids"] + [eos]
    reply = encode_turn([{"role": "user", "content": "Say more."}], tokenizer)
    second = tokenizer("Hello there.")["input_ids"] + [eos]
    row = first + reply + second
    assert out.response[0, : len(row)].tolist() == row
    assert out.env_mask[0, : len(row)].tolist() == [0] * len(first) + [1] * len(reply) + [0] * len(
        second
    )
    assert out.stats["turns"].tolist() == [2] and out.stats["truncated"].tolist() == [0]
    assert out.env_rewards.tolist() == [len("Hi.") + len("Hello there.")]
    assert tokenizer.decode(out.query[0][out.query_mask[0] != 0]).endswith(
        "User: Greet me.\nAssistant:"
    )


def test_max_turns_and_the_token_budget_cut_episodes_and_say_so(tokenizer):
    turns = [[call("multiply", a=3, b=4)]] * 2
    out, _ = play(tokenizer, turns, lambda: ToolEnv([multiply]), ["3 x 4?"], max_turns=2)
    assert out.stats["turns"].tolist() == [2] and out.stats["truncated"].tolist() == [1]
    assert out.stats["tool_calls"].tolist() == [2]
    # a budget that leaves no room after the first reply
    first = len(tokenizer(turns[0][0])["input_ids"]) + 1
    out, sample = play(
        tokenizer, turns, lambda: ToolEnv([multiply]), ["3 x 4?"], max_episode_tokens=first + 3
    )
    assert out.stats["turns"].tolist() == [1] and out.stats["truncated"].tolist() == [1]
    assert not out.env_mask.any()
    # and one that cuts the first turn before its EOS
    out, sample = play(
        tokenizer, turns, lambda: ToolEnv([multiply]), ["3 x 4?"], max_episode_tokens=5
    )
    assert sample.calls[0][1] == 5 and out.response_mask.sum() == 5
    assert not out.eos_emitted[0] and out.stats["truncated"].tolist() == [1]


class Broken(gymnasium.Env):
    def reset(self, *, seed=None, options=None):
        return options["prompt"], {}

    def step(self, action):
        raise KeyError("board")


def test_an_environment_that_raises_is_named_with_the_episode(tiny_tokenizer):
    with pytest.raises(EpisodeError, match=r"Broken.step raised KeyError: 'board' .*'3 x 4\?'"):
        play(tiny_tokenizer, [["hi"]], Broken, ["3 x 4?"])


class Calculator:
    """An environment object written for TRL's environment_factory: its public methods
    are the tools; reset gets the row's columns."""

    def reset(self, answer, **columns) -> str:
        self.answer, self.calls = answer, 0
        return "Use the calculator."

    def multiply(self, a: int, b: int) -> int:
        """Multiply two integers.

        Args:
            a: the first factor
            b: the second factor
        """
        self.calls += 1
        return a * b


def test_an_object_whose_methods_are_tools_plays_as_a_tool_environment(tokenizer):
    factory = lambda: as_environment(Calculator())  # noqa: E731
    turns = [[call("multiply", a=3, b=4)], ["12"]]
    out, _ = play(tokenizer, turns, factory, ["3 x 4?"])
    (env,) = out.environments
    assert env.state.calls == 1 and env.state.answer == 12
    prompt = tokenizer.decode(out.query[0][out.query_mask[0] != 0])
    assert "User: 3 x 4?\n\nUse the calculator." in prompt and '"name": "multiply"' in prompt

    def rewarded(prompts, completions, environments, **kwargs):
        return [float(e.state.calls) for e in environments]

    scorer = FunctionScorer(rewarded)
    batch = ScoreInput(
        ["3 x 4?"], out.answers, out.query, out.query_mask, out.response,
        out.response_mask | out.env_mask, tokenizer.eos_token_id,
        PromptColumns(["3 x 4?"], {"answer": [12]}), out.completions, out.environments,
    )  # fmt: skip
    assert scorer(batch).tolist() == [1.0]


# --------------------------------------------------------------------------- in a rollout
class TwoTurns(gymnasium.Env):
    """Answers every turn with "the cat"; the second turn ends the episode with reward 1."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.turn = 0
        return options["prompt"], {}

    def step(self, action):
        self.turn += 1
        return "the cat", float(self.turn), self.turn >= 2, False, {}


class OneTurn(gymnasium.Env):
    def reset(self, *, seed=None, options=None):
        return options["prompt"], {}

    def step(self, action):
        return "", 0.0, True, False, {}


def eos_biased(model, tokenizer, bias: float = 5.0):
    """``model`` with its EOS logit raised, so that its turns end within a few tokens; the
    logits kept for the test to read their gradient."""
    seen = []

    def hook(module, inputs, output):
        output = output.clone()
        output[..., tokenizer.eos_token_id] += bias
        if output.requires_grad:
            output.retain_grad()
            seen.append(output)
        return output

    model.lm_head.register_forward_hook(hook)
    return seen


def maker_of(model, tokenizer, environment, scorer=None, **settings):
    reference = copy.deepcopy(model.lm if isinstance(model, ValueHeadLM) else model)
    models = RolloutModels(model, reference, None)
    settings = RolloutSettings(sampling=SamplingConfig(max_new_tokens=8), **settings)
    runtime = Runtime.inference(torch.device("cpu"))
    return ExperienceMaker(models, scorer, tokenizer, settings, runtime, environment)


PROMPTS = ["a dog", "a dog", "we", "we", "the robot", "the robot"]


def two_turn_rollout(maker, seed=0):
    starts = PromptColumns(PROMPTS, {})
    generator = torch.Generator().manual_seed(seed)
    return maker.make(
        None, None, kl_coef=0.1, generator=generator, prompt_columns=starts, env_seeds=[0] * 6
    )


@pytest.mark.parametrize("estimator", ["gae", "grpo", "reinforce++"])
def test_environment_tokens_get_no_reward_kl_advantage_or_gradient(
    tiny_tokenizer, tiny_model, estimator
):
    torch.manual_seed(0)
    policy = ValueHeadLM(tiny_model) if estimator == "gae" else tiny_model
    lm = tiny_model
    maker = maker_of(policy, tiny_tokenizer, TwoTurns, estimator=estimator, group_size=2)
    seen = eos_biased(lm, tiny_tokenizer)
    if estimator == "gae":  # a value head that says something
        torch.nn.init.normal_(policy.value_head.weight, std=0.5)
    rollout = two_turn_rollout(maker)
    env = rollout.env_mask.bool()
    assert env.any(), "no episode reached a second turn; raise the EOS bias"
    assert not (env & rollout.response_mask.bool()).any()
    for name in ("rewards", "kl", "advantages"):
        assert (getattr(rollout, name)[env] == 0).all(), name
    if estimator == "gae":
        assert (rollout.returns[env] == 0).all()
    # the environment's reward: the sum of its rewards (1 + 2 for two turns answered)
    two = (rollout.episode_stats["turns"] == 2) & rollout.eos_emitted
    assert two.any() and rollout.raw_scores[two].tolist() == [3.0] * int(two.sum())
    if estimator == "gae":  # the values after the environment's tokens reached the first turn
        first_turn = rollout.response_mask.bool() & ~env.cumsum(1).bool()
        assert (rollout.advantages[two][first_turn[two]] != 0).all()
    # the policy loss's gradient reaches the logits of the policy's tokens only
    seen.clear()
    settings = PolicyLossSettings(temperature=1.0, clip_range=0.2)
    loss, _, _ = policy_loss(policy, rollout, settings, 0.0, packed=False)
    loss.backward()
    (logits,) = seen
    grad = logits.grad.abs().sum(-1)  # (B, Tr)
    assert (grad[env] == 0).all()
    assert (grad[rollout.response_mask.bool()] > 0).float().mean() > 0.9


def test_episode_statistics_reach_the_metrics(tiny_tokenizer, tiny_model):
    maker = maker_of(tiny_model, tiny_tokenizer, TwoTurns, estimator="grpo", group_size=2)
    eos_biased(tiny_model, tiny_tokenizer)
    stats = rollout_stats(two_turn_rollout(maker), group_size=2)
    assert 1 <= stats["episode/turns"] <= 2
    # no tool figures for an environment without tools, nor the count of tools offered
    assert not any(key.startswith(("episode/tool", "episode/tools")) for key in stats)
    # the policy's tokens alone are the response's length
    assert stats["response/length"] < stats["response/length"] + stats["episode/env_tokens"]


def test_one_turn_episodes_are_the_bandit_rollout_bit_for_bit(tiny_tokenizer, tiny_model):
    def chars(prompts, responses):
        return [float(len(r)) for r in responses]

    eos_biased(tiny_model, tiny_tokenizer, bias=3.0)
    settings = {"estimator": "grpo", "group_size": 2}
    bandit = maker_of(tiny_model, tiny_tokenizer, None, FunctionScorer(chars), **settings)
    episodes = maker_of(tiny_model, tiny_tokenizer, OneTurn, FunctionScorer(chars), **settings)
    starts = PromptColumns(PROMPTS, {})
    ids, _ = encode_prompts([PromptRecord(p) for p in PROMPTS], tiny_tokenizer, 128)
    query, query_mask = pad(ids, tiny_tokenizer.pad_token_id, side="left")
    expected = bandit.make(
        query, query_mask, kl_coef=0.1, generator=torch.Generator().manual_seed(0),
        prompt_columns=starts,
    )  # fmt: skip
    got = episodes.make(
        None, None, kl_coef=0.1, generator=torch.Generator().manual_seed(0),
        prompt_columns=starts, env_seeds=[0] * 6,
    )  # fmt: skip
    assert not expected.eos_emitted.all() and expected.eos_emitted.any()
    for name in ("query", "query_mask", "response", "response_mask", "logprobs",
                 "ref_logprobs", "raw_scores", "scores", "kl", "rewards", "advantages"):  # fmt: skip
        assert torch.equal(getattr(got, name), getattr(expected, name)), name
    assert got.responses == expected.responses and not got.env_mask.any()


# --------------------------------------------------------------------------- trainer and CLI
def eos_prone(model, tokenizer):
    """``model`` with its EOS logit raised (``eos_biased``), so that episodes last turns."""
    eos_biased(model, tokenizer)
    return model


def test_a_multi_turn_run_stopped_and_resumed_equals_an_uninterrupted_one(tiny_tokenizer, tmp_path):
    rows = [{"prompt": line} for line in tiny_corpus(16)]
    write_jsonl(tmp_path / "prompts.jsonl", rows)
    prompts = load_prompts(str(tmp_path / "prompts.jsonl"), "train", tiny_tokenizer, 16, limit=None)

    def trainer(out, **more):
        config = stage_config(
            functools.partial(RLConfig.preset, "grpo"), tmp_path / out,
            environment="tests:unused", rollout_batch_size=2, num_generations=2, batch_size=4,
            max_new_tokens=6, max_steps=3, learning_rate=1e-3, seed=0, max_turns=3, **more,
        )  # fmt: skip
        model = eos_prone(tiny_lm(tiny_tokenizer, n_positions=128), tiny_tokenizer)
        return RLTrainer(config, model, tiny_tokenizer, prompts, None, environment=Seeded)

    _, resumed = stopped_and_resumed_equals_straight(trainer, stop_after=2)
    assert resumed.state.step == 3
    logged = [json.loads(line) for line in (tmp_path / "a" / "metrics.jsonl").open()]
    turns = [row["train/episode/turns"] for row in logged if "train/episode/turns" in row]
    assert turns and max(turns) > 1  # episodes of several turns were played


class Seeded(gymnasium.Env):
    """Replies with a number drawn from the episode's seed; rewards that number's parity."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return options["prompt"], {}

    def step(self, action):
        number = int(self.np_random.integers(10))
        return f"{number}", float(number % 2), len(action) % 3 == 0, False, {}


def docs_environment(module: str) -> str:
    """The environment module ``module`` the tools guide shows, as its code block holds it."""
    guide = (Path(__file__).resolve().parents[1] / "docs" / "tools.md").read_text()
    block = guide.split(f"```python\n# {module}.py\n", 1)[1]
    return block.split("```", 1)[0]


@pytest.mark.parametrize("module, factory", [("mymodule", "Countdown"), ("chatenv", "make")])
def test_the_guides_environments_train_from_the_command_line(
    module, factory, tiny_model_dir, tmp_path
):
    code = docs_environment(module).replace("runs/sft/final", str(tiny_model_dir))
    (tmp_path / f"{module}.py").write_text(code)
    write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": "count"}] * 8)
    command = [
        sys.executable, "-m", "rlhfkit.cli", "grpo", "--environment", f"{module}:{factory}",
        "--train_data", str(tmp_path / "prompts.jsonl"), "--model", str(tiny_model_dir),
        "--output_dir", str(tmp_path / "run"), "--max_turns", "4", "--max_steps", "2",
        "--rollout_batch_size", "2", "--num_generations", "2", "--batch_size", "4",
        "--max_new_tokens", "4",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    trained = [row for row in logged if "train/score/mean" in row]
    assert trained and all(row["train/episode/turns"] >= 1 for row in trained)
    assert (tmp_path / "run" / "final" / "model.safetensors").is_file()


def test_a_config_without_reward_needs_an_environment(tmp_path):
    with pytest.raises(ValueError, match="reward_model"):
        RLConfig.preset("grpo", output_dir=str(tmp_path), tools=["m:f"])
    with pytest.raises(ValueError, match="environment"):
        RLConfig.preset("grpo", environment="m:C", tools=["m:f"], reward_functions=["m:f"])
    with pytest.raises(ValueError, match="max_turns"):
        RLConfig.preset("grpo", environment="m:C", max_turns=0)
    assert RLConfig.preset("grpo", environment="m:C").has_episodes


def test_the_results_table_shows_tool_figures_only_for_episodes_with_tools():
    def samples(tools, calls):
        stats = {key: torch.zeros(2) for key in EPISODE_STATS}
        stats |= {"turns": torch.tensor([1.0, 3.0]), "tools": torch.tensor(tools)}
        stats["tool_calls"] = torch.tensor(calls)
        return PolicySamples(["p", "p"], ["a", "b"], torch.ones(2), episodes=stats)

    game = episode_figures(samples([0.0, 0.0], [0.0, 0.0]))  # a game: no tools
    assert game["turns"] == 2.0 and game["turns_se"] == 1.0
    assert not any(key.startswith("tool") for key in game)
    for tools, calls in (([1.0, 1.0], [0.0, 0.0]), ([0.0, 0.0], [1.0, 0.0])):  # offered, or counted
        figures = episode_figures(samples(tools, calls))
        assert figures["tool_calls"] == sum(calls) / 2 and "tool_errors" in figures
