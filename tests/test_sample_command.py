"""`rlhfkit sample` prints continuations of a checkpoint, in a real subprocess; sample and chat
at the precision asked."""

import io
import re
import subprocess
import sys

import pytest
import torch

from rlhfkit.interact.chat import ChatConfig, SampleConfig, run_chat, run_sample
from rlhfkit.interact.env import LMAgent
from rlhfkit.tasks import digits_score


def test_sample_prints_each_continuation_with_its_reward(tiny_model_dir):
    prompts = '["the cat sat", "a dog ran"]'
    cmd = [sys.executable, "-m", "rlhfkit.cli", "sample", "--model", str(tiny_model_dir)]
    cmd += ["--prompt", prompts, "--num_samples", "2", "--max_new_tokens", "6"]
    cmd += ["--reward_functions", "digits", "--seed", "3"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True).stdout
    lines = [line for line in out.splitlines() if " |" in line]
    assert [line.split("] ", 1)[1].split(" |")[0] for line in lines] == [
        "the cat sat",
        "the cat sat",
        "a dog ran",
        "a dog ran",
    ]
    for line in lines:
        score, text = line[1:].split("] ", 1)[0], line.split(" |", 1)[1]
        # Control characters are printed as visible escapes ("\\x15"), whose digits are not
        # the text's.
        assert float(score) == digits_score(
            re.sub(r"\\(x[0-9a-f]{2}|u[0-9a-f]{4}|[a-z])", "", text)
        )


@pytest.mark.parametrize("precision", ["no", "bf16"])
def test_sample_and_chat_run_at_the_asked_precision(precision, tiny_model_dir, monkeypatch, capsys):
    """`--mixed_precision bf16` samples (and scores) the model a bf16 run trained: every
    generation runs under bf16 autocast; 'no' under none."""
    seen = []
    generate = LMAgent._generate

    def spy(agent, input_ids, attention_mask):
        seen.append(torch.is_autocast_enabled(input_ids.device.type))
        return generate(agent, input_ids, attention_mask)

    monkeypatch.setattr(LMAgent, "_generate", spy)
    run_sample(
        SampleConfig(
            model=str(tiny_model_dir), prompt="the cat sat", num_samples=2, max_new_tokens=4,
            reward_functions=["digits"], mixed_precision=precision,
        )
    )  # fmt: skip
    assert len([line for line in capsys.readouterr().out.splitlines() if " |" in line]) == 2
    monkeypatch.setattr("sys.stdin", io.StringIO("hello\n"))  # then end of input
    run_chat(
        ChatConfig(model=str(tiny_model_dir), max_new_tokens=4, seed=0, mixed_precision=precision)
    )
    assert "bot> " in capsys.readouterr().out
    assert seen == [precision == "bf16"] * 2


def test_sample_with_tools_plays_an_episode_from_each_prompt(tiny_model_dir):
    cmd = [sys.executable, "-m", "rlhfkit.cli", "sample", "--model", str(tiny_model_dir)]
    cmd += ["--prompt", "What is 3 times 4?", "--num_samples", "2", "--max_new_tokens", "6"]
    cmd += ["--tools", "rlhfkit.tasks.calculator:calculator", "--tools_prompt", "Call tools."]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines.count("What is 3 times 4? |") == 2
    assert sum(line.startswith("[assistant] ") for line in lines) >= 2
