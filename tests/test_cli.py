"""`rlhfkit` CLI: command listing, documented options, config errors, and both training
commands end to end in a subprocess on tiny data and a tiny model."""

import json
import os
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM

from helpers import write_jsonl
from rlhfkit.cli import COMMANDS, main, parse_command
from rlhfkit.config import ConfigError, RewardConfig, check_section_keys
from rlhfkit.models.loading import RewardModel
from rlhfkit.trainers.rl_config import RLConfig


def test_top_level_help_lists_commands(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for name in COMMANDS:
        assert name in out
    assert "reward" in out  # alias of rm


def test_command_help_documents_fields(capsys):
    with pytest.raises(SystemExit):
        main(["rm", "--help"])
    out = " ".join(capsys.readouterr().out.split())  # undo line wrapping
    assert "--margin MARGIN Margin the chosen reward must exceed" in out
    assert "--normalize_data" in out and "--config CONFIG" in out


def test_config_error_names_field(capsys):
    with pytest.raises(SystemExit) as info:
        main(["reward", "--learning_rate", "0"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "RewardConfig.learning_rate = 0.0 is not allowed: expected a number > 0" in err


def test_unknown_command_fails(capsys):
    with pytest.raises(SystemExit) as info:
        main(["sftt"])
    assert info.value.code == 2
    assert "invalid choice: 'sftt'" in capsys.readouterr().err


def test_launch_names_the_stages_it_runs_and_shows_torchruns_options(capsys):
    assert main(["launch", "--nproc_per_node", "2"]) == 2
    error = capsys.readouterr().err
    assert "rlhfkit launch: error: name the stage to launch (" in error and "grpo, ppo" in error
    assert "eval" not in error.split("(")[1].split(")")[0]  # one process: not launched
    assert main(["launch", "--help"]) == 0
    assert "--nproc_per_node" in capsys.readouterr().out


def _cli(*args, cwd):
    env = dict(os.environ, OMP_NUM_THREADS="2", TOKENIZERS_PARALLELISM="false")
    result = subprocess.run(
        [sys.executable, "-m", "rlhfkit.cli", *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_sft_and_rm_commands_train_and_save(tiny_model_dir, tmp_path):
    demos = [{"prompt": f"Q: {i} plus one?", "response": f" A: {i + 1}"} for i in range(12)]
    pairs = [
        {"prompt": f"Q: {i} plus one?", "chosen": f" {i + 1}", "rejected": f" {i + 2}"}
        for i in range(12)
    ]
    sft_yaml = tmp_path / "sft.yaml"
    sft_yaml.write_text(
        f"model: {tiny_model_dir}\ntrain_data: {write_jsonl(tmp_path / 'd.jsonl', demos)}\n"
        "eval_data: null\nbatch_size: 4\nmax_length: 32\n"
    )
    out = _cli(
        "sft", "--config", str(sft_yaml), "--output_dir", "runs/sft", "--max_steps", "2",
        "--cpu", "true", "--report_to", "none", cwd=tmp_path,
    )  # fmt: skip
    final = tmp_path / "runs" / "sft" / "final"
    assert str(final) in out
    AutoModelForCausalLM.from_pretrained(final)

    # The reward model starts from the SFT model, as in InstructGPT; with the memory bound.
    out = _cli(
        "--bounded-memory", "rm", "--model", str(final), "--output_dir", "runs/rm", "--max_steps", "2",
        "--train_data", write_jsonl(tmp_path / "c.jsonl", pairs), "--eval_data", "null",
        "--batch_size", "4", "--max_length", "32", "--cpu", "true", cwd=tmp_path,
    )  # fmt: skip
    rm_final = tmp_path / "runs" / "rm" / "final"
    assert str(rm_final) in out
    model = RewardModel.from_pretrained(rm_final)
    assert torch.isfinite(model.score.weight).all()
    saved = json.loads((rm_final / "trainer_state.json").read_text())
    assert saved["complete"] and saved["config"]["model"] == str(final)
    assert RewardConfig(**saved["config"]).max_steps == 2


@pytest.mark.parametrize(
    ("command", "trl_flag", "ours"),
    [
        ("sft", "--model_name_or_path", "--model"),
        ("sft", "--per_device_train_batch_size=4", "--batch_size"),
        ("dpo", "--logging-steps", "--log_every"),
        ("ppo", "--num_ppo_epochs", "--ppo_epochs"),
        ("grpo", "--max_completion_length", "--max_new_tokens"),
        ("rm", "--bf16", "--mixed_precision bf16"),
    ],
)
def test_a_trl_option_name_is_refused_naming_ours(capsys, command, trl_flag, ours):
    assert main([command, trl_flag, "1"]) == 2
    err = capsys.readouterr().err
    assert f"did you mean {ours}?" in err and "Traceback" not in err


def test_a_misspelt_option_is_refused_naming_the_one_meant(capsys):
    assert main(["sft", "--learning_rat", "1e-4"]) == 2
    err = capsys.readouterr().err
    assert "unrecognized option --learning_rat; did you mean --learning_rate?" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("argv", [["--learning", "1e-4"], ["--warmup=2"]])
def test_no_option_is_taken_for_an_abbreviation_of_another(capsys, argv):
    with pytest.raises(SystemExit) as exit_info:
        parse_command("sft", argv)
    assert exit_info.value.code == 2
    assert f"unrecognized arguments: {argv[0].split('=')[0]}" in capsys.readouterr().err


def test_a_pipeline_section_key_gets_the_commands_did_you_mean():
    check_section_keys(RLConfig, "ppo", ["max_steps", "learning_rate"])
    with pytest.raises(ConfigError, match="PipelineConfig.ppo: unrecognized key 'iterations' "):
        check_section_keys(RLConfig, "ppo", ["iterations"])
    with pytest.raises(ConfigError, match=r"round_reward: .*did you mean --batch_size\?"):
        check_section_keys(RewardConfig, "round_reward", ["per_device_train_batch_size"])
    with pytest.raises(ConfigError, match="did you mean --learning_rate"):
        check_section_keys(RLConfig, "round_ppo", ["learning_rat"])


def test_a_trl_name_for_an_option_the_command_lacks_is_a_plain_unknown_option(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["sft", "--num_ppo_epochs", "2"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments: --num_ppo_epochs" in err and "did you mean" not in err


@pytest.mark.parametrize(
    ("argv", "flag", "ours"),
    [
        (["chat", "--model", "m", "--reward", "gold"], "--reward", "--reward_model DIR"),
        (["sample", "--prompt", "hi", "--reward=digits"], "--reward", "--reward_functions NAME"),
        (["bon", "--scorer", "runs/rm/final"], "--scorer", "--reward_model DIR (a reward model)"),
        (["bon", "--out", "picks.jsonl"], "--out", "--output"),
        (["sft", "--tensorboard", "false"], "--tensorboard", "--report_to tensorboard, or"),
        (["ppo", "--iterations", "3"], "--iterations", "--max_steps (the PPO/GRPO iterations"),
        (["grpo", "--iterations=3"], "--iterations", "--max_steps"),
    ],
)
def test_a_former_option_name_is_refused_naming_the_new_one(capsys, argv, flag, ours):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"unrecognized option {flag} (a former name); did you mean --" in err
    assert ours in err and "Traceback" not in err


def test_one_value_of_a_list_option_is_a_list_of_one():
    from rlhfkit.cli import _list_fields, _lists_of_one
    from rlhfkit.config import config_from_namespace, config_parser
    from rlhfkit.trainers.rl_config import RLConfig

    args = ["--reward_functions", "gold", "--reward_weights=0.5", "--report_to", "none"]
    args += ["--reward_model", "null", "--lora_target_modules", "[c_attn, c_proj]"]
    fields = _list_fields(RLConfig)
    assert {"reward_functions", "reward_weights", "report_to", "lora_target_modules"} <= fields
    parsed = config_parser(RLConfig).parse_args(_lists_of_one(args, fields))
    config = config_from_namespace(RLConfig, parsed)
    assert config.reward_functions == ["gold"] and config.reward_weights == [0.5]
    assert config.report_to == ["none"] and config.lora_target_modules == ["c_attn", "c_proj"]
    assert config.reward_model is None


def test_a_former_name_in_a_config_file_is_refused_naming_the_file(capsys, tmp_path):
    old = tmp_path / "bon.yaml"
    old.write_text("model: runs/sft/final\nscorer: gold\n")
    assert main(["bon", "--config", str(old)]) == 2
    err = capsys.readouterr().err
    assert f"unrecognized key 'scorer' in {old} (a former name); did you mean --reward_model" in err


def test_the_rm_command_keeps_its_best_evaluation_as_final(tiny_model_dir, tmp_path):
    pairs = write_jsonl(
        tmp_path / "c.jsonl",
        [{"prompt": f"Q: {i}?", "chosen": f" {i + 1}", "rejected": f" {i + 2}"} for i in range(12)],
    )
    common = (
        "rm", "--model", str(tiny_model_dir), "--train_data", pairs, "--eval_data", pairs,
        "--max_steps", "3", "--eval_every", "1", "--batch_size", "4", "--max_length", "32",
        "--cpu", "true", "--report_to", "none",
    )  # fmt: skip
    _cli(
        *common, "--output_dir", "runs/rm", "--metric_for_best_model", "eval/accuracy",
        "--load_best_model_at_end", "true", cwd=tmp_path,
    )  # fmt: skip
    run = tmp_path / "runs" / "rm"
    saved = json.loads((run / "final" / "trainer_state.json").read_text())
    best = json.loads((run / "best" / "trainer_state.json").read_text())["best"]
    assert saved["complete"] and saved["best"] == best and saved["last_step"] == 3
    assert saved["step"] == best["step"] and best["metric"] == "eval/accuracy"
    RewardModel.from_pretrained(run / "final")

    env = dict(os.environ, OMP_NUM_THREADS="2", TOKENIZERS_PARALLELISM="false")
    wrong = subprocess.run(
        [sys.executable, "-m", "rlhfkit.cli", *common, "--output_dir", "runs/rm2",
         "--metric_for_best_model", "eval/acuracy"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert wrong.returncode == 2 and "Traceback" not in wrong.stderr
    assert "'eval/acuracy' is not a metric this run's evaluation gives" in wrong.stderr
    assert "eval/accuracy" in wrong.stderr
