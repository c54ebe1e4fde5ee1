"""Reward functions see the dataset's columns: TRL's signature, f(prompts, completions,
completion_ids, **columns), with the prompts as written; rlhfkit's f(prompts, responses)
unchanged; a column a function needs and the data lacks refused when the data loads; and the
columns reaching a function in every command that scores, in real subprocesses."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from helpers import write_jsonl
from rlhfkit.data import DataError, PromptColumns, PromptExample, PromptRecord, load_records
from rlhfkit.data.collate import PromptCollator
from rlhfkit.errors import UsageError
from rlhfkit.experience.scorer_loading import (
    build_scorer,
    check_no_columns_needed,
    reward_data_check,
)
from rlhfkit.experience.scorers import (
    FunctionScorer,
    ScoreError,
    ScoreInput,
    needed_columns,
    trl_style,
)


def _batch(prompts, responses, columns=None, written=None):
    """A ScoreInput of two-token responses (the second EOS, id 0) and, given ``columns``,
    the rows' prompts as written and their columns."""
    n = len(responses)
    response = torch.tensor([[7 + i, 0] for i in range(n)])
    given = PromptColumns(written or list(prompts), columns) if columns is not None else None
    return ScoreInput(
        list(prompts), list(responses), torch.ones(n, 2, dtype=torch.long),
        torch.ones(n, 2, dtype=torch.long), response, torch.ones(n, 2, dtype=torch.long),
        0, given,
    )  # fmt: skip


def accuracy_reward(completions, solution, **kwargs):
    """A reward function as written for TRL."""
    return [float(c.strip() == s) for c, s in zip(completions, solution, strict=True)]


def test_a_trl_reward_function_gets_completions_ids_and_columns():
    seen = {}

    def spy(prompts, completions, completion_ids, solution, **kwargs):
        seen.update(prompts=prompts, ids=completion_ids, solution=solution, rest=kwargs)
        return [1.0] * len(completions)

    batch = _batch(
        ["rendered 1", "rendered 2"], ["4", "5"],
        {"solution": ["4", "6"], "level": [1, 2]}, written=["2 + 2?", "3 + 3?"],
    )  # fmt: skip
    assert FunctionScorer(spy)(batch).tolist() == [1.0, 1.0]
    assert seen["prompts"] == ["2 + 2?", "3 + 3?"]  # as written, not the rendering
    assert seen["ids"] == [[7, 0], [8, 0]]  # up to and including EOS
    assert seen["solution"] == ["4", "6"] and seen["rest"] == {"level": [1, 2]}
    assert FunctionScorer(accuracy_reward)(batch).tolist() == [1.0, 0.0]


def test_chat_prompts_get_completions_as_assistant_messages():
    seen = []
    chat = [{"role": "user", "content": "2 + 2?"}]
    batch = _batch(["user\n2 + 2?\nassistant\n"], ["4"], {}, written=[chat])
    FunctionScorer(lambda completions, **kw: seen.append(completions) or [0.0])(batch)
    assert seen == [[[{"role": "assistant", "content": "4"}]]]


def test_a_function_without_kwargs_gets_only_what_it_names():
    def named(completions, level):
        return [float(x) for x in level]

    batch = _batch(["p", "q"], ["a", "b"], {"level": [1, 2], "other": ["x", "y"]})
    assert FunctionScorer(named)(batch).tolist() == [1.0, 2.0]


def test_the_old_two_argument_functions_are_called_as_before():
    seen = []

    def old(prompts, responses):
        seen.append((prompts, responses))
        return [0.5] * len(responses)

    batch = _batch(["rendered"], ["r"], {"solution": ["x"]}, written=["as written"])
    assert FunctionScorer(old)(batch).tolist() == [0.5]
    assert seen == [(["rendered"], ["r"])]  # the decoded text, no columns
    assert not trl_style(old) and not trl_style(lambda p, r: r)
    assert trl_style(accuracy_reward) and trl_style(lambda **kw: 0)
    assert not trl_style(lambda prompts, responses, **kw: 0)  # names `responses`: ours


def test_needed_columns_are_the_named_parameters_without_default():
    def fn(prompts, completions, completion_ids, answer, *, level, hint=None, **kw):
        return []

    assert needed_columns(fn) == ["answer", "level"]
    assert needed_columns(accuracy_reward) == ["solution"]
    assert needed_columns(lambda prompts, responses: []) == []


def test_a_column_missing_from_the_batch_names_the_function_and_column():
    with pytest.raises(ScoreError, match=r"accuracy_reward needs the column\(s\) 'solution'"):
        FunctionScorer(accuracy_reward)(_batch(["p"], ["r"], {"answer": ["1"]}))
    with pytest.raises(ScoreError, match="these prompts came without data"):
        FunctionScorer(accuracy_reward)(_batch(["p"], ["r"]))


def test_a_raising_trl_function_names_the_sample():
    def fussy(completions, solution, **kw):
        if "boom" in solution:
            raise ValueError("cannot read the solution")
        return [0.0] * len(completions)

    batch = _batch(["p", "q"], ["a", "b"], {"solution": ["1", "boom"]})
    with pytest.raises(ScoreError, match=r"ValueError: cannot read the solution on sample 1"):
        FunctionScorer(fussy)(batch)


def test_records_keep_every_column_and_the_collator_aligns_them(tmp_path):
    rows = [
        {"prompt": "2 + 2?", "solution": "4", "level": 1},
        {"prompt": [{"role": "user", "content": "3 + 3?"}], "solution": "6"},
    ]
    write_jsonl(tmp_path / "p.jsonl", rows)
    records = load_records(tmp_path / "p.jsonl", "prompts")
    assert records[0] == PromptRecord("2 + 2?", {"solution": "4", "level": 1})
    batch = PromptCollator(0)([PromptExample([5], r) for r in records])
    given = batch["prompt_columns"]
    assert given.prompts == [rows[0]["prompt"], rows[1]["prompt"]]
    assert given.columns == {"solution": ["4", "6"], "level": [1, None]}
    assert given.repeat(2).columns["solution"] == ["4", "4", "6", "6"]


def test_a_column_the_function_needs_is_refused_at_load_naming_function_column_and_file(
    tmp_path, monkeypatch
):
    module = tmp_path / "myrewards.py"
    module.write_text("def accuracy_reward(completions, solution, **kwargs):\n    return []\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "prompts.jsonl"
    write_jsonl(path, [{"prompt": "a", "solution": "1"}, {"prompt": "b", "answer": "2"}])
    check = reward_data_check(["myrewards:accuracy_reward", "digits"])
    with pytest.raises(DataError) as error:
        load_records(path, "prompts", check=check)
    message = str(error.value)
    assert f"{path} line 2: reward function 'myrewards:accuracy_reward' needs" in message
    assert "'solution', which this record lacks (its columns: answer)" in message
    assert reward_data_check(["digits", "perplexity"]) is None  # nothing needed of the data


def test_chat_and_sample_refuse_a_function_that_needs_columns():
    scorer = build_scorer(None, ["digits"])
    check_no_columns_needed(scorer, "chat")  # needs nothing
    scorer = build_scorer(None, ["digits", "test_reward_columns:accuracy_reward"])
    with pytest.raises(UsageError, match=r"needs the column\(s\) 'solution'.*`rlhfkit chat`"):
        check_no_columns_needed(scorer, "chat")


# ------------------------------------------------------------------------------- end to end
COLUMN_CHECK = '''
import json, os

def accuracy_reward(prompts, completions, completion_ids, solution, **kwargs):
    """As written for TRL; asserts each row's columns belong to its prompt."""
    for prompt, answer, key in zip(prompts, solution, kwargs["key"], strict=True):
        assert isinstance(prompt, str) and prompt.startswith("Sum "), prompt
        assert answer == str(sum(map(int, prompt[4:].split("+")))), (prompt, answer)
        assert key == "k-" + answer
    assert len(completions) == len(completion_ids) == len(prompts)
    with open(os.environ["COLUMN_LOG"], "a") as f:
        f.write(json.dumps(len(prompts)) + "\\n")
    return [float(len(c)) for c in completions]
'''


@pytest.fixture
def column_data(tmp_path):
    (tmp_path / "colcheck.py").write_text(textwrap.dedent(COLUMN_CHECK))
    rows = [
        {"prompt": f"Sum {i}+{j}", "solution": str(i + j), "key": f"k-{i + j}"}
        for i in range(4)
        for j in range(4)
    ]
    path = tmp_path / "sums.jsonl"
    write_jsonl(path, rows)
    return tmp_path, path


def _run(args, cwd, log):
    env = dict(
        os.environ, OMP_NUM_THREADS="2", PYTHONPATH=str(cwd), COLUMN_LOG=str(log),
        TOKENIZERS_PARALLELISM="false",
    )  # fmt: skip
    result = subprocess.run(
        [sys.executable, "-m", "rlhfkit.cli", *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    return result


COMMANDS = {
    "grpo": ["--num_generations", "2", "--batch_size", "4", "--max_steps", "2", "--cpu", "true"],
    "rloo": ["--num_generations", "2", "--batch_size", "4", "--max_steps", "2", "--cpu", "true"],
    "ppo": ["--critic", "value_head", "--rollout_batch_size", "4", "--batch_size", "4"]
    + ["--max_steps", "2", "--cpu", "true"],
}


@pytest.mark.slow
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_columns_reach_a_trl_reward_function_in_every_training_command(
    command, column_data, tiny_model_dir
):
    cwd, data = column_data
    log = cwd / f"{command}.log"
    args = [command, "--model", str(tiny_model_dir), "--train_data", str(data)]
    args += ["--eval_data", str(data), "--eval_split", "train", "--max_eval_samples", "4"]
    args += ["--reward_model", "null", "--reward_functions", "colcheck:accuracy_reward"]
    args += ["--max_new_tokens", "4", "--output_dir", str(cwd / command), "--report_to", "[]"]
    result = _run([*args, *COMMANDS[command]], cwd, log)
    assert result.returncode == 0, result.stderr[-3000:]
    assert log.read_text().splitlines(), "the reward function was never called"


@pytest.mark.slow
def test_columns_reach_a_trl_reward_function_in_best_of_n(column_data, tiny_model_dir):
    cwd, data = column_data
    log = cwd / "bon.log"
    args = ["bon", "--model", str(tiny_model_dir), "--prompts", str(data), "--n", "2"]
    args += ["--reward_model", "null", "--reward_functions", "colcheck:accuracy_reward"]
    args += ["--max_new_tokens", "4", "--output", str(cwd / "bon" / "picks.jsonl")]
    result = _run(args, cwd, log)
    assert result.returncode == 0, result.stderr[-3000:]
    picks = [json.loads(line) for line in (cwd / "bon" / "picks.jsonl").open()]
    assert len(picks) == 16 and log.read_text().splitlines()


def test_a_training_command_refuses_data_without_the_column_before_loading_a_model(
    column_data, tmp_path, tiny_tokenizer_dir
):
    """The "model" is a tokenizer alone: loading its weights would fail, the data fails first."""
    cwd, _ = column_data
    data = tmp_path / "bare.jsonl"
    write_jsonl(data, [{"prompt": "Sum 1+1"}])
    args = ["grpo", "--model", str(tiny_tokenizer_dir), "--train_data", str(data)]
    args += ["--reward_functions", "colcheck:accuracy_reward", "--output_dir", str(tmp_path / "o")]
    result = _run(args, cwd, tmp_path / "log")
    assert result.returncode == 2
    assert f"{data} line 1: reward function 'colcheck:accuracy_reward' needs the column(s) " in (
        result.stderr
    )
    assert "Traceback" not in result.stderr
