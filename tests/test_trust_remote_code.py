"""`trust_remote_code`: a model that ships its own code (``auto_map``) loads only when asked, in
every loader and every training stage, and is refused by name otherwise."""

import json

import pytest
from transformers import GPT2Config

from helpers import tiny_lm, write_jsonl
from rlhfkit.config import RewardConfig, SFTConfig, config_parser
from rlhfkit.errors import UsageError
from rlhfkit.experience.rollout import load_rollout_models
from rlhfkit.experience.scorer_loading import build_scorer
from rlhfkit.models.loading import RewardModel, load_causal_lm, load_tokenizer
from rlhfkit.trainers.dpo import run_dpo
from rlhfkit.trainers.dpo_config import DPOConfig
from rlhfkit.trainers.reward import run_reward
from rlhfkit.trainers.rl_config import RLConfig
from rlhfkit.trainers.sft import run_sft

CONFIGURATION = """from transformers import GPT2Config


class CustomConfig(GPT2Config):
    model_type = "rlhfkit_custom_gpt2"
"""

MODELING = """from transformers import GPT2LMHeadModel, GPT2Model

from .configuration_custom import CustomConfig


class CustomModel(GPT2Model):
    config_class = CustomConfig


class CustomLM(GPT2LMHeadModel):
    config_class = CustomConfig
"""


@pytest.fixture(scope="module")
def custom_model_dir(tmp_path_factory, tiny_tokenizer):
    """The tiny GPT-2 as a model of its own architecture, whose code ships beside it."""
    path = tmp_path_factory.mktemp("custom_model")
    tiny_lm(tiny_tokenizer, n_positions=128).save_pretrained(path)
    tiny_tokenizer.save_pretrained(path)
    (path / "configuration_custom.py").write_text(CONFIGURATION)
    (path / "modeling_custom.py").write_text(MODELING)
    config = json.loads((path / "config.json").read_text())
    config["model_type"] = "rlhfkit_custom_gpt2"
    config["architectures"] = ["CustomLM"]
    config["auto_map"] = {
        "AutoConfig": "configuration_custom.CustomConfig",
        "AutoModel": "modeling_custom.CustomModel",
        "AutoModelForCausalLM": "modeling_custom.CustomLM",
    }
    (path / "config.json").write_text(json.dumps(config))
    return path


def test_a_model_with_its_own_code_loads_only_when_trusted(custom_model_dir, tiny_tokenizer):
    with pytest.raises(UsageError, match="ships Python code of its own.*--trust_remote_code true"):
        load_causal_lm(custom_model_dir)
    with pytest.raises(UsageError, match="--trust_remote_code true"):
        RewardModel.from_pretrained(custom_model_dir)
    model = load_causal_lm(custom_model_dir, tokenizer=tiny_tokenizer, trust_remote_code=True)
    assert type(model).__name__ == "CustomLM" and isinstance(model.config, GPT2Config)
    reward = RewardModel.from_pretrained(custom_model_dir, trust_remote_code=True)
    assert type(reward.backbone).__name__ == "CustomModel"
    assert load_tokenizer(custom_model_dir, trust_remote_code=True).eos_token_id is not None


def test_the_rl_stages_loaders_pass_it_on(custom_model_dir, tiny_tokenizer):
    with pytest.raises(UsageError, match="--trust_remote_code true"):
        load_rollout_models(str(custom_model_dir), tiny_tokenizer, critic=None)
    models = load_rollout_models(
        str(custom_model_dir), tiny_tokenizer, critic=str(custom_model_dir), trust_remote_code=True
    )
    assert type(models.reference).__name__ == "CustomLM"
    assert type(models.critic.backbone).__name__ == "CustomModel"
    spec = [f"perplexity:{custom_model_dir}"]
    with pytest.raises(UsageError, match="--trust_remote_code true"):
        build_scorer(None, spec, tokenizer=tiny_tokenizer)
    assert build_scorer(None, spec, tokenizer=tiny_tokenizer, trust_remote_code=True)


@pytest.mark.parametrize("cls", [SFTConfig, RewardConfig, DPOConfig, RLConfig])
def test_every_stage_has_the_option_off_by_default_and_says_so(cls):
    assert cls.trust_remote_code is False
    helps = {a.dest: a.help for a in config_parser(cls)._actions}
    assert "Off by default" in helps["trust_remote_code"]


def _data(tmp_path):
    demos = [{"prompt": f"Number {i}.", "response": " The cat sees it."} for i in range(4)]
    pairs = [
        {"prompt": f"Number {i}.", "chosen": " The cat sees it.", "rejected": " We read."}
        for i in range(4)
    ]
    write_jsonl(tmp_path / "demos.jsonl", demos)
    write_jsonl(tmp_path / "pairs.jsonl", pairs)
    return str(tmp_path / "demos.jsonl"), str(tmp_path / "pairs.jsonl")


@pytest.mark.parametrize("stage", ["sft", "rm", "dpo"])
def test_each_stage_refuses_then_trains_a_trusted_model(custom_model_dir, tmp_path, stage):
    demos, pairs = _data(tmp_path)
    cls, run, data = {
        "sft": (SFTConfig, run_sft, demos),
        "rm": (RewardConfig, run_reward, pairs),
        "dpo": (DPOConfig, run_dpo, pairs),
    }[stage]

    def config(trust):
        return cls(
            model=str(custom_model_dir),
            train_data=data,
            eval_data=None,
            output_dir=str(tmp_path / f"{stage}-{trust}"),
            batch_size=2,
            max_steps=1,
            max_length=32,
            cpu=True,
            report_to=["none"],
            trust_remote_code=trust,
        )

    with pytest.raises(UsageError, match="--trust_remote_code true"):
        run(config(False))
    assert (run(config(True)) / "config.json").is_file()
