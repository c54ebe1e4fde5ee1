"""`rlhfkit sample` prints continuations of a checkpoint, in a real subprocess."""

import re
import subprocess
import sys

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
