"""Stage configs: validation errors name field, value and what is allowed; YAML + overrides;
every field documented for `--help`."""

import dataclasses
from pathlib import Path

import pytest

from rlhfkit.config import (
    ConfigError,
    RewardConfig,
    SFTConfig,
    TrainConfig,
    config_parser,
    load_config,
)
from rlhfkit.trainers.rl_config import RLConfig


@pytest.mark.parametrize(
    ("cls", "field", "value", "allowed"),
    [
        (SFTConfig, "learning_rate", -1.0, "a number > 0"),
        (SFTConfig, "lr_scheduler", "step", "one of 'linear', 'cosine', 'constant'"),
        (SFTConfig, "batch_size", 0, "an integer >= 1"),
        (SFTConfig, "max_length", 1, "an integer >= 2"),
        (RewardConfig, "loss", "hinge", "one of 'logsigmoid', 'logexp'"),
        (TrainConfig, "mixed_precision", "fp16", "one of 'no', 'bf16'"),
        (TrainConfig, "adam_beta2", 1.0, "a number in [0, 1)"),
        (TrainConfig, "attn_implementation", "flash", "one of 'eager', 'sdpa', None"),
    ],
)
def test_bad_value_names_field_value_and_allowed(cls, field, value, allowed):
    with pytest.raises(ConfigError) as info:
        cls(**{field: value})
    assert str(info.value).startswith(
        f"{cls.__name__}.{field} = {value!r} is not allowed: expected {allowed}"
    )


def test_cross_field_checks():
    with pytest.raises(ConfigError, match=r"RewardConfig\.margin = 0\.5 .* loss='logexp'"):
        RewardConfig(loss="logexp", margin=0.5)
    with pytest.raises(ConfigError, match=r"warmup_ratio = 0\.1 .* warmup_steps is set"):
        SFTConfig(warmup_steps=10, warmup_ratio=0.1)


def test_derived_values_are_properties():
    config = SFTConfig(batch_size=4, gradient_accumulation_steps=3, warmup_ratio=0.1)
    assert config.effective_batch_size == 12
    assert config.warmup_for(200) == 20
    assert str(config.final_dir) == "runs/sft/final"
    assert "effective_batch_size" not in config.to_dict()


def test_attention_defaults_to_eager_for_bf16_on_cpu():
    assert TrainConfig(cpu=True).attention is None  # fp32: the model's own kernel
    assert TrainConfig(cpu=True, mixed_precision="bf16").attention == "eager"
    assert TrainConfig(cpu=True, mixed_precision="bf16", attn_implementation="sdpa").attention == (
        "sdpa"
    )


def test_yaml_then_cli_args_then_keywords(tmp_path):
    path = tmp_path / "rm.yaml"
    path.write_text("learning_rate: 1.0e-3\nbatch_size: 4\nmargin: 0.25\n")
    config = load_config(RewardConfig, path, ["--batch_size", "2"], output_dir="x")
    assert (config.learning_rate, config.batch_size, config.margin) == (1e-3, 2, 0.25)
    assert config.output_dir == "x" and config.loss == "logsigmoid"
    path.write_text("learning_rat: 1.0\n")
    with pytest.raises(SystemExit):  # jsonargparse rejects unknown keys
        load_config(RewardConfig, path)


@pytest.mark.parametrize("cls", [SFTConfig, RewardConfig])
def test_every_field_is_documented(cls):
    helps = {a.dest: a.help for a in config_parser(cls)._actions}
    for field in dataclasses.fields(cls):
        assert helps.get(field.name), f"{cls.__name__}.{field.name} has no help text"


def test_shipped_configs_load():
    root = Path(__file__).resolve().parents[1]
    sft = load_config(SFTConfig, root / "configs" / "sft.yaml")
    rm = load_config(RewardConfig, root / "configs" / "rm.yaml")
    assert sft.output_dir == "runs/sft" and rm.output_dir == "runs/rm"
    # The paths are relative to the repository root and point at the bundled assets.
    for path in (sft.model, sft.train_data, sft.eval_data, rm.train_data, rm.normalize_data):
        assert (root / path).exists(), path
    for default in (SFTConfig(), RewardConfig()):
        assert Path(default.model).is_dir() and Path(default.train_data).is_dir()


def test_help_is_grouped_by_the_option_classes_a_config_is_composed_of():
    parser = config_parser(RLConfig)
    sections = {
        group.title: {action.dest for action in group._group_actions}
        for group in parser._action_groups
    }
    fields = {f.name for f in dataclasses.fields(RLConfig)}
    placed = [dest for dests in sections.values() for dest in dests if dest in fields]
    assert sorted(placed) == sorted(fields)  # every field once
    assert {"kl_coef", "kl_in_loss", "adaptive_kl"} <= sections["KLOptions"]
    assert {"critic", "vf_coef", "critic_warmup"} <= sections["CriticOptions"]
    assert {"learning_rate", "max_steps", "seed"} <= sections["TrainConfig"]  # overridden too


def test_each_rl_option_is_declared_once():
    declared = [
        name
        for klass in RLConfig.__mro__
        if klass.__module__ == "rlhfkit.trainers.rl_config" and klass is not RLConfig
        for name in vars(klass).get("__annotations__", {})
    ]
    assert len(declared) == len(set(declared))
