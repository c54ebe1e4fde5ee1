"""The pipeline's settings: `PipelineConfig` (where it runs, what it starts from, each stage's
fields) and how it derives every stage's config from it (`stage_configs`: each stage's output
feeds the next); `DemoConfig` for `rlhfkit demo`. Running them is ``pipeline/run.py``."""

from __future__ import annotations

from argparse import ArgumentError
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import rlhfkit
from rlhfkit.config import (
    ConfigError,
    RewardConfig,
    SFTConfig,
    config_from_namespace,
    config_parser,
    require,
)
from rlhfkit.evaluation.evaluate import EvalConfig
from rlhfkit.tasks import BASE_MODEL_DIR, DEMO_DATA_DIR, REWARD_FUNCTIONS
from rlhfkit.trainers.dpo_config import DPOConfig
from rlhfkit.trainers.ppo_config import PPOConfig


@dataclass
class PipelineConfig:
    """The whole pipeline: where it runs, what it starts from, and each stage's settings."""

    output_dir: str = "runs/pipeline"
    """Run directory; each stage writes to a subdirectory (sft, reward, ppo, dpo) and the
    evaluation and report land at its top."""
    base_model: str | None = None
    """Model to start from (hub name or directory); None = the bundled tiny English GPT-2."""
    data_dir: str | None = None
    """Folder with prompts/, sft/ and comparisons/ (each with train and test files);
    None = the bundled demo data."""
    reward_data: str = "comparisons"
    """Folder of `data_dir` the reward model trains on: 'comparisons' (pairs) or 'rankings'
    (K responses best first, InstructGPT's format); DPO always uses the comparisons."""
    task: str | None = "sentiment"
    """Gold judge of the evaluation ('sentiment', 'digits'); None when the task has none."""
    seed: int = 42
    """Seed of every stage (a stage's own `seed` overrides it)."""
    ppo_eval_every: int = 0
    """Evaluate the PPO policy on held-out prompts every this many iterations (gold, proxy and
    KL: the over-optimisation curve); 0 = only the final evaluation."""
    ppo_eval_prompts: int = 32
    """Held-out prompts per PPO evaluation point."""
    sft: dict[str, Any] = field(default_factory=dict)
    """`SFTConfig` fields (`rlhfkit sft --help`) to set, beside those the pipeline derives."""
    reward: dict[str, Any] = field(default_factory=dict)
    """`RewardConfig` fields (`rlhfkit rm --help`)."""
    ppo: dict[str, Any] = field(default_factory=dict)
    """`PPOConfig` fields (`rlhfkit ppo --help`)."""
    dpo: dict[str, Any] = field(default_factory=dict)
    """`DPOConfig` fields (`rlhfkit dpo --help`)."""
    eval: dict[str, Any] = field(default_factory=dict)
    """`EvalConfig` fields (`rlhfkit eval --help`)."""

    def __post_init__(self) -> None:
        require(self, "output_dir", bool(self.output_dir), "a directory path")
        require(
            self,
            "task",
            self.task is None or self.task in REWARD_FUNCTIONS,
            f"None or one of {sorted(REWARD_FUNCTIONS)}",
        )
        require(self, "reward_data", bool(self.reward_data), "a folder name under data_dir")
        require(self, "ppo_eval_every", self.ppo_eval_every >= 0, "an integer >= 0")
        require(self, "ppo_eval_prompts", self.ppo_eval_prompts >= 1, "an integer >= 1")

    @property
    def run_dir(self) -> Path:
        return Path(self.output_dir)

    def data(self, kind: str) -> str:
        """The data folder of one kind: prompts, sft, comparisons or rankings."""
        return str(Path(self.data_dir) / kind if self.data_dir else DEMO_DATA_DIR / kind)


@dataclass
class Stages:
    """The configs of every stage, derived from a ``PipelineConfig``."""

    sft: SFTConfig
    reward: RewardConfig
    ppo: PPOConfig
    dpo: DPOConfig
    eval: EvalConfig


def _build(cls: type, section: str, overrides: dict[str, Any], **derived: Any):
    """``cls`` from the pipeline-derived values, then the user's, type-checked by jsonargparse."""
    parser = config_parser(cls, exit_on_error=False)
    try:
        namespace = parser.parse_object({**derived, **overrides})
        return config_from_namespace(cls, namespace)
    except (ArgumentError, ValueError) as error:  # jsonargparse's, or the config's own check
        raise ConfigError(f"PipelineConfig.{section}: {error}") from error


def stage_configs(config: PipelineConfig) -> Stages:
    """Every stage's config, each stage reading the previous stages' outputs."""
    run, seed = config.run_dir, config.seed
    base = config.base_model or str(BASE_MODEL_DIR)
    sft_data, comparisons = config.data("sft"), config.data("comparisons")
    split = {"train_split": "train", "eval_split": "test", "seed": seed}
    sft = _build(
        SFTConfig,
        "sft",
        config.sft,
        model=base,
        output_dir=str(run / "sft"),
        train_data=sft_data,
        eval_data=sft_data,
        **split,
    )
    sft_final = str(sft.final_dir)
    reward = _build(
        RewardConfig,
        "reward",
        config.reward,
        model=sft_final,
        output_dir=str(run / "reward"),
        train_data=config.data(config.reward_data),
        eval_data=comparisons,
        normalize_data=sft_data,
        **split,
    )
    ppo = _build(
        PPOConfig,
        "ppo",
        config.ppo,
        model=sft_final,
        reward_model=str(reward.final_dir),
        output_dir=str(run / "ppo"),
        train_data=config.data("prompts"),
        eval_data=config.data("prompts"),
        **split,
    )
    dpo = _build(
        DPOConfig,
        "dpo",
        config.dpo,
        model=sft_final,
        output_dir=str(run / "dpo"),
        train_data=comparisons,
        eval_data=comparisons,
        **split,
    )
    return Stages(sft, reward, ppo, dpo, _eval_config(config, base, sft, reward, ppo, dpo))


def _eval_config(
    config: PipelineConfig,
    base: str,
    sft: SFTConfig,
    reward: RewardConfig,
    ppo: PPOConfig,
    dpo: DPOConfig,
) -> EvalConfig:
    """The evaluation of every model the pipeline trained, sampled as PPO sampled."""
    sft_final = str(sft.final_dir)
    models = {"base": base, "sft": sft_final, "ppo": str(ppo.final_dir), "dpo": str(dpo.final_dir)}
    return _build(
        EvalConfig,
        "eval",
        config.eval,
        models=models,
        reference=sft_final,
        reward_model=str(reward.final_dir),
        task=config.task,
        prompts=config.data("prompts"),
        comparisons=config.data("comparisons"),
        split="test",
        max_new_tokens=ppo.max_new_tokens,
        temperature=ppo.temperature,
        chat_template=ppo.chat_template,
        output=str(config.run_dir / "eval.json"),
        seed=config.seed,
    )


@dataclass
class DemoConfig:
    """The pipeline on the bundled tiny English model and demo data (configs/demo.yaml)."""

    output_dir: str = "runs/demo"
    """Run directory of the demo."""
    pipeline_config: str | None = None
    """Pipeline YAML to run; None = configs/demo.yaml of the source tree (or the current
    directory)."""


def demo_config_path() -> Path:
    """configs/demo.yaml next to the package's source tree, else in the current directory."""
    candidates = [
        Path(rlhfkit.__file__).resolve().parents[2] / "configs" / "demo.yaml",
        Path.cwd() / "configs" / "demo.yaml",
    ]
    for path in candidates:
        if path.is_file():
            return path
    raise FileNotFoundError(f"configs/demo.yaml not found; looked in {candidates}")
