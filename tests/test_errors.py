"""Every anticipated failure of `rlhfkit <command>` is one message naming its place, with exit
code 2 for what the user gave and 1 for a failure while running, and no traceback unless
`--debug` asks: a table over malformed files, configs, paths and reward functions."""

import json
import logging
import os
import shutil
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from rlhfkit import cli
from rlhfkit.config import ConfigError, RewardConfig
from rlhfkit.data import Comparison, DataError, load_records
from rlhfkit.errors import UsageError
from rlhfkit.models.loading import TRUST_PICKLE, load_causal_lm

REWARDS = "rlhfkit_test_rewards"  # a module of broken reward functions, written per session
REWARD_CODE = """
def nan(prompts, responses):
    return [float("nan")] * len(responses)

def inf(prompts, responses):
    return [1.0] * (len(responses) - 1) + [float("inf")]

def one_short(prompts, responses):
    return [1.0] * (len(responses) - 1)

def words(prompts, responses):
    return ["high"] * len(responses)

def nothing(prompts, responses):
    return [None] * len(responses)

def raises(prompts, responses):
    return [1 / 0 for _ in responses]
"""


@pytest.fixture(scope="module")
def place(tmp_path_factory, tiny_model_dir):
    """The broken things the table points at."""
    root = tmp_path_factory.mktemp("broken")
    (root / "latin1.jsonl").write_bytes(
        b'{"prompt": "Hi", "response": " there"}\n{"prompt": "caf\xe9", "response": " ok"}\n'
    )
    long = " the cat likes the big tree in the park every day" * 12
    (root / "long.jsonl").write_text(json.dumps({"prompt": long, "response": long}) + "\n")
    (root / "empty").mkdir()
    pickled = root / "pickled"
    shutil.copytree(tiny_model_dir, pickled)
    torch.save(load_file(pickled / "model.safetensors"), pickled / "pytorch_model.bin")
    (pickled / "model.safetensors").unlink()
    (root / f"{REWARDS}.py").write_text(REWARD_CODE)
    return SimpleNamespace(root=root, model=str(tiny_model_dir), pickled=str(pickled))


def sft(place, *args):
    out = str(place.root / "runs" / "sft")
    return ["sft", "--model", place.model, "--eval_data", "null", "--output_dir", out, *args]


def sample(place, reward, model=None, field="--reward_functions"):
    model = model or place.model
    return ["sample", "--model", model, "--prompt", "the cat", "--num_samples", "2",
            "--max_new_tokens", "3", field, reward]  # fmt: skip


# id: (argv of the command, exit code, what the message must say)
CASES = {
    # data files and data options
    "data not UTF-8": (
        lambda p: sft(p, "--train_data", str(p.root / "latin1.jsonl")),
        2,
        ["latin1.jsonl line 2: byte 16 (0xe9) is not UTF-8 text"],
    ),
    "data path missing": (
        lambda p: sft(p, "--train_data", str(p.root / "no" / "such" / "data")),
        2,
        ["no/such/data: no such file or directory (nor a hub dataset name)"],
    ),
    "max_length past the context": (
        lambda p: sft(p, "--train_data", str(p.root / "long.jsonl"), "--max_length", "200"),
        2,
        ["max_length = 200 lets examples reach 200 tokens", "context of 128", "at most 128"],
    ),
    "config value": (
        lambda p: sft(p, "--learning_rate", "0"),
        2,
        ["SFTConfig.learning_rate = 0.0 is not allowed: expected a number > 0"],
    ),
    # model paths
    "model path missing": (
        lambda p: sft(p, "--model", str(p.root / "no" / "model" / "here")),
        2,
        ["no/model/here': no such directory, nor a hub model name"],
    ),
    "model directory empty": (
        lambda p: sft(p, "--model", str(p.root / "empty")),
        2,
        ["empty': an empty directory without config.json, so not a model"],
    ),
    "model only a pickle": (
        lambda p: sft(p, "--model", p.pickled),
        2,
        ["weights are a pickle (pytorch_model.bin)", f"{TRUST_PICKLE}=1"],
    ),
    "eval without an SFT model": (
        lambda p: ["eval"],
        2,
        ["EvalConfig.reference 'runs/sft/final': no such directory"],
    ),
    # reward function specs
    "reward spec without colon": (
        lambda p: sample(p, "nocolon"),
        2,
        ["reward function 'nocolon': not a known scorer; allowed: calculator | digits"],
    ),
    "reward module missing": (
        lambda p: sample(p, "rlhfkit_no_such_module:f"),
        2,
        ["no module named 'rlhfkit_no_such_module' on the Python path", "PYTHONPATH=."],
    ),
    "reward function missing": (
        lambda p: sample(p, "rlhfkit.tasks:no_such_function"),
        2,
        ["module rlhfkit.tasks has no attribute 'no_such_function'"],
    ),
    "reward not callable": (
        lambda p: sample(p, "rlhfkit.tasks:REWARD_FUNCTIONS"),
        2,
        ["module rlhfkit.tasks has a dict 'REWARD_FUNCTIONS'"],
    ),
    "reward model without head": (
        lambda p: sample(p, p.model, field="--reward_model"),
        2,
        ["not a reward model (its config.json names no *ForSequenceClassification"],
    ),
    # reward functions that run and fail: the sample is named
    "reward NaN": (
        lambda p: sample(p, f"{REWARDS}:nan"),
        1,
        ["non-finite score nan for sample 0 (prompt='the cat', response="],
    ),
    "reward inf": (
        lambda p: sample(p, f"{REWARDS}:inf"),
        1,
        ["non-finite score inf for sample 1 (prompt='the cat', response="],
    ),
    "reward count": (
        lambda p: sample(p, f"{REWARDS}:one_short"),
        1,
        ["returned 1 scores for 2 responses; it must return one number per response"],
    ),
    "reward strings": (
        lambda p: sample(p, f"{REWARDS}:words"),
        1,
        ["returned 'high' (str, not a number) for sample 0 (prompt='the cat'"],
    ),
    "reward None": (
        lambda p: sample(p, f"{REWARDS}:nothing"),
        1,
        ["returned None (NoneType, not a number) for sample 0 (prompt='the cat'"],
    ),
    "reward raises": (
        lambda p: sample(p, f"{REWARDS}:raises"),
        1,
        ["raised ZeroDivisionError: division by zero on sample 0 (prompt='the cat'"],
    ),
}


@pytest.fixture
def in_place(place, monkeypatch):
    """Run from `place` (the default paths of `eval` are relative), its reward module
    importable."""
    monkeypatch.chdir(place.root)
    monkeypatch.syspath_prepend(str(place.root))
    monkeypatch.delenv("RLHFKIT_DEBUG", raising=False)
    return place


def run_main(argv, capsys):
    """`rlhfkit argv` in-process (--verbose: leave the libraries' progress bars as they are):
    the exit code and stderr."""
    try:
        code = cli.main(["--verbose", *argv])
    except SystemExit as exit:  # argparse's own errors (a bad option or config value)
        code = exit.code
    return code, capsys.readouterr().err


@pytest.mark.parametrize("case", CASES)
def test_failure_is_one_message_naming_its_place(case, in_place, capsys):
    argv, expected_code, says = CASES[case]
    code, err = run_main(argv(in_place), capsys)
    assert code == expected_code, err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    kind = "error" if expected_code == 2 else "failed"  # a bad option: argparse's "error: "
    assert last.startswith((f"rlhfkit {argv(in_place)[0]}: {kind}: ", "error: ")), err
    for text in says:
        assert text in last, last
    assert not (in_place.root / "runs").exists()  # nothing written before the failure


def test_debug_adds_the_traceback_and_keeps_the_exit_code(in_place, capsys, monkeypatch):
    argv = sample(in_place, f"{REWARDS}:raises")
    code, err = run_main(["--debug", *argv], capsys)
    assert code == 1 and "Traceback" in err and "ZeroDivisionError" in err
    monkeypatch.setattr(cli, "run_command", lambda name, args: 1 / 0)
    code, err = run_main(["sft"], capsys)
    assert code == 1 and "Traceback" not in err
    assert err.strip().splitlines()[-1] == (
        "rlhfkit sft: ZeroDivisionError: division by zero "
        "(`rlhfkit --debug sft ...` or RLHFKIT_DEBUG=1 shows the traceback)"
    )
    monkeypatch.setenv("RLHFKIT_DEBUG", "1")
    code, err = run_main(["sft"], capsys)
    assert code == 1 and "Traceback" in err


def test_console_script_prints_no_traceback(place):
    """The real entry point, in a subprocess: a data error is exit code 2 and one line."""
    command = [sys.executable, "-m", "rlhfkit.cli", *sft(place)]
    command += ["--train_data", str(place.root / "latin1.jsonl")]
    env = {**os.environ, "RLHFKIT_DEBUG": "0"}
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("rlhfkit sft: error: ")


def test_identical_responses_are_dropped_with_a_count_or_refused(tmp_path, caplog):
    rows = [
        {"prompt": "p", "chosen": "a", "rejected": "b"},
        {"prompt": "p", "chosen": "same", "rejected": "same"},
        {"prompt": "p", "responses": ["x", "y", "x"], "ranking": [1, 0, 2]},
        {"prompt": "p", "responses": ["x", "x"], "ranking": [0, 1]},
    ]
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with caplog.at_level(logging.WARNING):
        assert load_records(path, "comparisons") == [Comparison("p", "a", "b")]
    assert "dropped 3 of 4 comparisons whose responses are identical" in caplog.text
    with pytest.raises(DataError, match=f"{path} line 2: the responses compared are identical"):
        load_records(path, "comparisons", degenerate_comparisons="error")
    same = tmp_path / "same.jsonl"
    same.write_text("".join(json.dumps(r) + "\n" for r in rows[1:2]))
    with pytest.raises(DataError, match="every comparison compares identical responses"):
        load_records(same, "comparisons")
    with pytest.raises(ConfigError, match="degenerate_comparisons = 'keep'"):
        RewardConfig(degenerate_comparisons="keep")


def test_pickle_loads_only_when_its_source_is_trusted(place, monkeypatch):
    monkeypatch.delenv(TRUST_PICKLE, raising=False)
    with pytest.raises(UsageError, match="its weights are a pickle"):
        load_causal_lm(place.pickled)
    monkeypatch.setenv(TRUST_PICKLE, "1")
    model = load_causal_lm(place.pickled)
    reference = load_causal_lm(place.model)
    for name, tensor in reference.state_dict().items():
        torch.testing.assert_close(model.state_dict()[name], tensor, rtol=0, atol=0)
