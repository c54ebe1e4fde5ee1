"""TRL's option names (rlhfkit.trl_names): every answer names an option the stage has,
docs/trl_options.md is the script's output, every option of transformers' TrainingArguments
and (where TRL's source is at hand) of TRL's classes is answered, and the CLI gives each
answer with exit code 2.

TRL's classes are read from its source with ``ast``, not imported: set RLHFKIT_TRL_SOURCES to
directories (separated by the path separator) that hold a ``trl/`` package, such as unpacked
wheels of TRL 1.16, 1.12 (the last with PPO) and 0.19::

    pip download --no-deps trl==1.16.0 trl==1.12.0 trl==0.19.1 -d /tmp/trl  # then unzip each
    RLHFKIT_TRL_SOURCES=/tmp/trl116:/tmp/trl112:/tmp/trl019 pytest tests/test_trl_names.py
"""

import ast
import dataclasses
import importlib.util
import os
from pathlib import Path

import pytest
import transformers

from rlhfkit import trl_names
from rlhfkit.cli import COMMANDS, _load, main, parse_command

ROOT = Path(__file__).resolve().parents[1]
SOURCES_ENV = "RLHFKIT_TRL_SOURCES"

# TRL's classes, where they live in its package, and the rlhfkit commands that answer them.
TRL_CLASSES = [
    ("trl/trainer/sft_config.py", "SFTConfig", ("sft",)),
    ("trl/trainer/reward_config.py", "RewardConfig", ("rm",)),
    ("trl/trainer/dpo_config.py", "DPOConfig", ("dpo",)),
    ("trl/trainer/grpo_config.py", "GRPOConfig", ("grpo",)),
    ("trl/trainer/rloo_config.py", "RLOOConfig", ("rloo",)),
    ("trl/experimental/ppo/ppo_config.py", "RLConfig", ("ppo",)),
    ("trl/trainer/ppo_config.py", "RLConfig", ("ppo",)),  # before TRL 0.26
    ("trl/trainer/base_config.py", "_BaseConfig", trl_names.STAGES),
    ("trl/trainer/model_config.py", "ModelConfig", trl_names.STAGES),
    ("trl/scripts/utils.py", "ScriptArguments", trl_names.STAGES),
    ("trl/scripts/grpo.py", "GRPOScriptArguments", ("grpo",)),
    ("trl/scripts/rloo.py", "RLOOScriptArguments", ("rloo",)),
]


def fields_of(command: str) -> set[str]:
    return {f.name for f in dataclasses.fields(_load(COMMANDS[command].config))}


def class_fields(path: Path, name: str) -> list[str] | None:
    """The fields a dataclass declares in its own body (no import of its module); None where
    the file holds no such class."""
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return [
                s.target.id
                for s in node.body
                if isinstance(s, ast.AnnAssign)
                and isinstance(s.target, ast.Name)
                and not s.target.id.startswith("_")
                and "ClassVar" not in ast.unparse(s.annotation)
            ]
    return None


def trl_sources() -> list[Path]:
    given = [Path(p) for p in os.environ.get(SOURCES_ENV, "").split(os.pathsep) if p]
    return [p for p in given if (p / "trl" / "__init__.py").is_file()]


@pytest.mark.parametrize("table", trl_names.TABLES, ids=lambda t: t.title)
def test_every_answer_names_an_option_the_stage_has(table):
    for command in table.commands:
        fields = fields_of(command)
        for name, answer in table.options.items():
            where = f"{table.title}: {name} in rlhfkit {command}"
            if answer.kind == "same":
                assert name in fields, f"{where} is answered 'same', and {command} lacks it"
            else:
                assert name not in fields, f"{where} is an option, yet answered {answer.kind!r}"
            if answer.kind == "ours":
                assert answer.field in fields, f"{where}: {command} has no {answer.field}"
            if answer.kind == "missing":
                assert len(answer.note) > 20, f"{where} says too little about why"


def test_the_document_is_the_scripts_output():
    spec = importlib.util.spec_from_file_location("table", ROOT / "scripts/trl_options_table.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    doc = (ROOT / "docs" / "trl_options.md").read_text(encoding="utf-8")
    assert doc == script.render(), "run scripts/trl_options_table.py to rewrite the document"


def test_every_training_argument_is_answered_in_every_stage():
    names = [f.name for f in dataclasses.fields(transformers.TrainingArguments) if f.init]
    names = [n for n in names if not n.startswith("_")]
    assert len(names) > 100
    for command in trl_names.STAGES:
        missing = [n for n in names if trl_names.answer(command, n) is None]
        assert not missing, f"rlhfkit {command} has no answer to TrainingArguments' {missing}"


def test_every_option_of_trls_classes_is_answered():
    sources = trl_sources()
    if not sources:
        pytest.skip(f"{SOURCES_ENV} names no directory holding TRL's source (trl/)")
    read = 0
    for source in sources:
        for relative, name, commands in TRL_CLASSES:
            path = source / relative
            names = class_fields(path, name) if path.is_file() else None
            if names is None:
                continue
            read += 1
            for command in commands:
                missing = [n for n in names if trl_names.answer(command, n) is None]
                assert not missing, f"{source}/{relative} {name}: {command} lacks {missing}"
    assert read, f"no TRL config class found under {sources}"


# ---------------------------------------------------------------------------- the CLI
@pytest.mark.parametrize(
    ("argv", "answer"),
    [
        (["dpo", "--max_completion_length", "64"], "did you mean --max_response_length?"),
        (
            ["dpo", "--precompute_ref_log_probs", "true"],
            "did you mean --precompute_reference true?",
        ),
        (["dpo", "--ref_model", "gpt2"], "did you mean --reference?"),
        (["ppo", "--num_mini_batches", "4"], "did you mean --batch_size?"),
        (["ppo", "--stop_token", "eos"], "not an option of rlhfkit ppo: responses always stop"),
        (["rm", "--center_rewards_coefficient", "0.01"], "did you mean --center_rewards_coef?"),
        (["sft", "--push_to_hub", "true"], "not an option of rlhfkit sft: rlhfkit uploads nothing"),
        (["grpo", "--use_vllm", "true"], "not an option of rlhfkit grpo: rlhfkit samples"),
        (["rloo", "--rloo_k", "4"], "did you mean --num_generations?"),
        (["chat", "--model_name_or_path", "m"], "did you mean --model?"),
    ],
)
def test_a_trl_option_stops_with_its_answer(capsys, argv, answer):
    assert main(argv) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert answer in err and "(TRL's name)" in err and "Traceback" not in err


def test_a_trl_key_in_a_config_file_stops_with_its_answer(capsys, tmp_path):
    path = tmp_path / "dpo.yaml"
    path.write_text("beta: 0.1\nsync_ref_model: true\n")
    assert main(["dpo", "--config", str(path)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"unrecognized key 'sync_ref_model' in {path} (TRL's name), not an option" in err


@pytest.mark.parametrize(
    ("argv", "field", "value"),
    [
        (["dpo", "--rpo_alpha", "0.5"], "rpo_alpha", 0.5),
        (["dpo", "--max_prompt_length", "64"], "max_prompt_length", 64),
        (["dpo", "--max_response_length", "64"], "max_response_length", 64),
        (["dpo", "--reference", "runs/sft/final"], "reference", "runs/sft/final"),
        (["rm", "--center_rewards_coef", "0.01"], "center_rewards_coef", 0.01),
        (["rm", "--disable_dropout", "false"], "disable_dropout", False),
        (["sft", "--trust_remote_code", "true"], "trust_remote_code", True),
        (["ppo", "--trust_remote_code", "true"], "trust_remote_code", True),
    ],
)
def test_the_options_built_for_trl_users_parse(argv, field, value):
    _, config = parse_command(argv[0], argv[1:])
    assert getattr(config, field) == value
