"""The terminal chat: the loop in-process, then the real `rlhfkit chat` through a pseudo-terminal."""

import json
import sys
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM

from rlhfkit.config import ConfigError
from rlhfkit.experience.episodes import ToolEnv
from rlhfkit.experience.generation import SamplingConfig
from rlhfkit.experience.scorer_loading import parse_scorer
from rlhfkit.experience.scorers import WeightedScorer
from rlhfkit.experience.tools import Tool
from rlhfkit.interact.chat import USER_PROMPT, ChatConfig, chat_loop
from rlhfkit.interact.env import LMAgent
from rlhfkit.tasks import digits_score
from rlhfkit.tasks.calculator import calculator

RLHFKIT = Path(sys.executable).with_name("rlhfkit")  # the console script of this environment


@pytest.fixture(scope="module")
def agent(tiny_model_dir, tiny_tokenizer):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    return LMAgent(model, tiny_tokenizer, SamplingConfig(max_new_tokens=8), seed=0)


def scripted(lines):
    """A `read` that types ``lines`` in order, then signals end of input (Ctrl-D)."""
    typed = iter(lines)

    def read(prompt):
        assert prompt == USER_PROMPT
        try:
            return next(typed)
        except StopIteration:
            raise EOFError from None

    return read


def test_a_weighted_reward_shows_each_part(agent):
    """With several scorers the user sees which one liked the reply, not only the sum."""
    shown = []
    agent_generate = agent.generate
    agent.generate = lambda messages: "I have 2 cats."
    scorer = WeightedScorer([(parse_scorer("digits"), 0.5), (parse_scorer("sentiment"), 2.0)])
    try:
        chat_loop(agent, scorer, read=scripted(["hello", "/quit"]), write=shown.append)
    finally:
        agent.generate = agent_generate
    line = shown[1]
    total, parts = line.removeprefix("[reward ").removesuffix("]").split(" = ")
    digits, sentiment = parts.split(" + ")
    assert digits.startswith("0.5 x digits ") and sentiment.startswith("2 x sentiment ")
    value = 0.5 * float(digits.rsplit(" ", 1)[1]) + 2 * float(sentiment.rsplit(" ", 1)[1])
    assert float(total) == pytest.approx(value, abs=2e-3)


def test_loop_keeps_history_resets_and_quits(agent):
    shown = []
    history = []
    agent_generate = agent.generate
    agent.generate = lambda messages: history.append(list(messages)) or "I have 2 cats."
    try:
        final = chat_loop(
            agent,
            parse_scorer("digits"),
            system="Be brief.",
            read=scripted(["hello", "", "and you?", "/reset", "again", "/quit", "unread"]),
            write=shown.append,
        )
    finally:
        agent.generate = agent_generate
    assert shown == [
        "bot> I have 2 cats.",
        "[reward digits: 1.000]",
        "bot> I have 2 cats.",
        "[reward digits: 1.000]",
        "(history cleared)",
        "bot> I have 2 cats.",
        "[reward digits: 1.000]",
    ]
    # The second turn sees the first exchange; after /reset only the system message remains.
    assert [m["content"] for m in history[1]] == [
        "Be brief.",
        "hello",
        "I have 2 cats.",
        "and you?",
    ]
    assert [m["content"] for m in history[2]] == ["Be brief.", "again"]
    assert final[-1] == {"role": "assistant", "content": "I have 2 cats."}


def test_end_of_input_quits_cleanly(agent):
    shown = []
    final = chat_loop(agent, None, read=scripted(["hi"]), write=shown.append)
    assert len(shown) == 2 and shown[0].startswith("bot> ") and shown[1] == ""
    assert [m["role"] for m in final] == ["user", "assistant"]


def test_config_names_a_bad_sampling_field():
    with pytest.raises(ConfigError, match="ChatConfig.temperature=0.0: must be > 0"):
        ChatConfig(model="m", temperature=0.0)


def test_rlhfkit_chat_in_a_pseudo_terminal(tiny_model_dir):
    pexpect = pytest.importorskip("pexpect")  # a test dependency; absent where only the runtime is
    command = f"{RLHFKIT} chat --model {tiny_model_dir} --reward_functions digits --max_new_tokens 8 --seed 0"
    child = pexpect.spawn(command, encoding="utf-8", timeout=120)
    try:
        child.expect("/quit")  # the banner
        child.expect_exact(USER_PROMPT)
        child.sendline("Tell me 3 numbers like 12 and 7")
        child.expect(r"bot> (.*?)\r\n\[reward digits: (-?\d+\.\d+)\]\r\n")
        reply, reward = child.match.group(1).replace("\r\n", "\n"), float(child.match.group(2))
        assert reward == digits_score(reply)  # the reply's digits, not the prompt's
        child.expect_exact(USER_PROMPT)
        child.sendline("/reset")
        child.expect_exact("(history cleared)")
        child.expect_exact(USER_PROMPT)
        child.sendline("/quit")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0, child.before


class ToolCaller:
    """An agent that calls the calculator once, then answers with the result it read."""

    def __init__(self, tokenizer):
        self.tokenizer, self.device, self.seen = tokenizer, "cpu", []

    def generate(self, messages):
        self.seen.append([dict(m) for m in messages])
        if messages[-1]["role"] == "tool":
            return f"Answer: {messages[-1]['content']}"
        call = {"name": "calculator", "arguments": {"expression": "347 * 58"}}
        return f"<tool_call>{json.dumps(call)}</tool_call>"


def test_chat_runs_the_tools_a_reply_calls_and_shows_their_results(tiny_tokenizer):
    agent = ToolCaller(tiny_tokenizer)
    tools = ToolEnv([calculator])
    shown = []
    messages = chat_loop(
        agent, tools=tools, read=scripted(["What is 347 times 58?"]), write=shown.append
    )
    assert shown[0].startswith("bot> <tool_call>")
    assert shown[1:3] == ["tool> 20126", "bot> Answer: 20126"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
    assert agent.seen[1][-1] == {"role": "tool", "content": "20126"}


def test_the_tools_are_shown_in_the_system_message_without_a_template_for_them(agent):
    system = agent.show_tools([Tool.of(calculator)], "Be brief.", None)
    assert system.startswith("You can call tools") and system.endswith("\n\nBe brief.")
    assert '"name": "calculator"' in system and agent.tools is None
