"""The pipeline's settings: `PipelineConfig` (where it runs, what it starts from, each stage's
fields) and how it derives every stage's config from it (`stage_configs`: each stage's output
feeds the next, and with `rounds` > 1 each round's reward model and PPO, `RoundStages`);
`DemoConfig` for `rlhfkit demo`. Running them is ``pipeline/run.py`` (the rounds:
``pipeline/rounds.py``)."""

from __future__ import annotations

from argparse import ArgumentError
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import rlhfkit
from rlhfkit.config import (
    ConfigError,
    RewardConfig,
    SFTConfig,
    _check_literals,
    check_section_keys,
    config_from_namespace,
    config_parser,
    require,
)
from rlhfkit.evaluation.evaluate import EvalConfig
from rlhfkit.tasks import BASE_MODEL_DIR, DEMO_DATA_DIR, REWARD_FUNCTIONS
from rlhfkit.trainers.dpo_config import DPOConfig
from rlhfkit.trainers.rl_config import RLConfig


@dataclass
class PipelineConfig:
    """The whole pipeline: where it runs, what it starts from, and each stage's settings."""

    output_dir: str = "runs/pipeline"
    """Run directory; each stage writes to a subdirectory (sft, reward, ppo, dpo, and
    round_<r> for rounds >= 2) and the evaluation and report land at its top."""
    base_model: str | None = None
    """Model to start from (hub name or directory); None = the bundled tiny English GPT-2."""
    data_dir: str | None = None
    """Folder with prompts/, sft/ and comparisons/ (each with train and test files);
    None = the bundled demo data."""
    reward_data: str = "comparisons"
    """Folder of `data_dir` the reward model trains on: 'comparisons' (pairs) or 'rankings'
    (K responses best first, InstructGPT's format); DPO always uses the comparisons."""
    task: str | None = "sentiment"
    """Gold judge of the evaluation ('sentiment', 'digits', 'instructions'); None when the
    task has none."""
    seed: int = 42
    """Seed of every stage (a stage's own `seed` overrides it)."""
    ppo_eval_every: int = 0
    """Evaluate the PPO policy on held-out prompts every this many iterations (gold, proxy and
    KL: the over-optimisation curve); 0 = only the final evaluation."""
    ppo_eval_prompts: int = 32
    """Held-out prompts per PPO evaluation point."""
    ppo_critic_init: Literal["reward_model", "sft"] = "reward_model"
    """Where PPO's separate critic starts, in every round: the reward model (InstructGPT) or
    the SFT model with a zero value head (docs/ppo.md). A path in `ppo.critic_model` wins."""
    parallel_arms: bool = False
    """Train DPO and the GRPO arm, which need only the SFT model, each in a process of its own
    beside the reward model and PPO, from the moment the SFT model is saved; the pipeline
    waits for them after PPO (before any round >= 2). For one GPU and a small model, whose
    stages leave the device mostly idle (docs/results/gpu.md); on a CPU they share its
    cores. Logs: `arms/<stage>.log` of the run. Not under a launcher of several processes
    (torchrun, accelerate launch)."""
    keep_checkpoints: bool = False
    """Keep each stage's `checkpoint-<step>/` directories once its `final/` is written. They
    serve only to resume an interrupted stage (a finished one is skipped), and with full
    fine-tuning each holds the optimiser's state, twice the model's size: off, the pipeline
    deletes them as each stage finishes."""
    rounds: int = 1
    """Rounds of InstructGPT's loop of steps 2 and 3 (docs/iterated_rlhf.md): after the PPO
    of round r, K responses per prompt are sampled from its policy on new prompts, labelled,
    the reward model is trained again on every comparison so far and PPO runs again. Each
    round r >= 2 writes to `round_<r>/` of the run. 1 = the pipeline without rounds."""
    round_prompts: str | None = None
    """Prompts the new comparisons of rounds 2.. are sampled for (its `train` split); None =
    the `prompts` folder of `data_dir`. Prompts of the reward data are left out; round r takes
    the next `prompts_per_round` of the rest, so no two rounds share a prompt."""
    prompts_per_round: int = 128
    """Prompts whose responses are compared in each round >= 2."""
    responses_per_prompt: int = 4
    """K, responses sampled per prompt and ranked (2 gives pairs); empty or repeated samples
    are dropped, and a prompt left with fewer than 2 is left out."""
    round_heldout: float = 0.2
    """Share of each round's prompts held out of reward-model training to measure the old and
    the retrained reward model on the new policy's samples; 0 trains on all (the accuracy is
    then measured on training data)."""
    labeller: Literal["simulated", "humans"] = "simulated"
    """Who ranks the samples of rounds >= 2: 'simulated' (the gold judge of `task` through a
    noisy Bradley-Terry / Plackett-Luce choice, `labelling/simulated.py`), or 'humans' (the
    tasks go into `round_<r>/labels.db`, the pipeline stops until `rlhfkit label serve` has
    collected the votes, and a later start goes on)."""
    labeller_tau: float | None = None
    """Noise of the simulated labeller (> 0, larger is noisier); None = `labeller_tau` of the
    data's `stats.json` (the labeller that made the bundled demo data)."""
    labels_per_task: int = 1
    """Votes (skips not counted) every task needs before a human-labelled round is complete."""
    label_aggregate: Literal["all", "majority"] = "all"
    """How several votes on one task become training data (`rlhfkit label export --help`)."""
    round_reward_init: Literal["sft", "previous"] = "sft"
    """Where each round's reward model starts: the SFT model (a new reward model, as in
    round 1) or the previous round's reward model (trained on further)."""
    round_policy_init: Literal["sft", "previous"] = "sft"
    """Where each round's PPO policy starts: the SFT model (a new policy) or the previous
    round's policy. The KL reference is the SFT model either way."""
    round_reward: dict[str, Any] = field(default_factory=dict)
    """`RewardConfig` fields for the reward models of rounds >= 2, over those of `reward`."""
    round_ppo: dict[str, Any] = field(default_factory=dict)
    """`RLConfig` fields (`rlhfkit ppo --help`) for the PPO of rounds >= 2, over those of
    `ppo`."""
    sft: dict[str, Any] = field(default_factory=dict)
    """`SFTConfig` fields (`rlhfkit sft --help`) to set, beside those the pipeline derives."""
    reward: dict[str, Any] = field(default_factory=dict)
    """`RewardConfig` fields (`rlhfkit rm --help`)."""
    ppo: dict[str, Any] = field(default_factory=dict)
    """`RLConfig` fields over the PPO preset's defaults (`rlhfkit ppo --help`)."""
    dpo: dict[str, Any] = field(default_factory=dict)
    """`DPOConfig` fields (`rlhfkit dpo --help`)."""
    grpo: dict[str, Any] | None = None
    """`RLConfig` fields over the GRPO preset's defaults (`rlhfkit grpo --help`) of a GRPO arm from the SFT model, trained on
    the task's gold judge as its reward function unless `reward_functions` says otherwise:
    reinforcement learning from a verifiable reward (RLVR) beside RLHF. Its evaluation's gold
    score is then its own training reward, not an independent judge. None = no GRPO arm."""
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
        _check_literals(self)
        for name in ("rounds", "prompts_per_round", "labels_per_task"):
            require(self, name, getattr(self, name) >= 1, "an integer >= 1")
        require(self, "responses_per_prompt", self.responses_per_prompt >= 2, "an integer >= 2")
        require(self, "round_heldout", 0 <= self.round_heldout < 1, "a share in [0, 1)")
        for name in ("sft", "reward", "ppo", "dpo", "eval", "round_reward", "round_ppo"):
            require(
                self,
                name,
                isinstance(getattr(self, name), dict),
                "a mapping of the stage's fields, {} for its defaults (every stage but grpo "
                "runs; grpo: null leaves the GRPO arm out)",
            )
        require(
            self,
            "grpo",
            self.grpo is None or self.task is not None or "reward_functions" in self.grpo,
            "None, or its reward_functions given, when `task` is None (its default reward is "
            "the task's gold judge)",
        )
        tau = self.labeller_tau
        require(self, "labeller_tau", tau is None or tau > 0, "None or a number > 0")
        require(
            self,
            "labeller",
            self.rounds == 1 or self.labeller != "simulated" or self.task is not None,
            "'humans' when `task` is None (the simulated labeller follows the task's gold judge)",
        )

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
    ppo: RLConfig
    dpo: DPOConfig
    eval: EvalConfig
    rounds: list[RoundStages] = field(default_factory=list)
    """Rounds 2.. of iterated RLHF (``PipelineConfig.rounds``); round 1 is reward and ppo."""
    grpo: RLConfig | None = None
    """The GRPO arm (``PipelineConfig.grpo``), None without one."""


@dataclass
class RoundStages:
    """Round ``number`` >= 2 of iterated RLHF: where it writes and its two training stages."""

    number: int
    dir: Path
    """``<run>/round_<number>``: samples/, labels/, reward_data/, rm/, ppo/, ppo_eval/."""
    policy_before: str
    """The previous round's policy: its samples are what this round labels."""
    reward_before: str
    """The previous round's reward model (measured on this round's comparisons)."""
    policy_init: str | None
    """Weights this round's PPO policy starts from, None = the SFT model (its reference)."""
    reward: RewardConfig
    ppo: RLConfig

    def path(self, part: str) -> Path:
        return self.dir / part


def _build(
    cls: type,
    section: str,
    overrides: dict[str, Any],
    preset: str | None = None,
    **derived: Any,
):
    """``cls`` from its ``preset``'s defaults (an RL stage's), the pipeline-derived values,
    then the user's, type-checked by jsonargparse."""
    check_section_keys(cls, section, list(overrides))
    defaults = cls.preset_defaults(preset) if preset else None
    parser = config_parser(cls, defaults, exit_on_error=False)
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
        RLConfig,
        "ppo",
        config.ppo,
        "ppo",
        model=sft_final,
        reward_model=str(reward.final_dir),
        output_dir=str(run / "ppo"),
        train_data=config.data("prompts"),
        eval_data=config.data("prompts"),
        **_critic_start(config, sft_final),
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
    grpo = _grpo_config(config, sft_final, split)
    rounds = _round_stages(config, sft, reward, ppo)
    ev = _eval_config(config, base, sft, reward, ppo, dpo, grpo, rounds)
    return Stages(sft, reward, ppo, dpo, ev, rounds, grpo)


def _critic_start(config: PipelineConfig, sft_final: str) -> dict[str, str]:
    """PPO's `critic_model` as `ppo_critic_init` says (none: the reward model, PPO's default)."""
    return {"critic_model": sft_final} if config.ppo_critic_init == "sft" else {}


def _grpo_config(config: PipelineConfig, sft_final: str, split: dict) -> RLConfig | None:
    """The GRPO arm: from the SFT model, on the task's gold judge, on PPO's prompts."""
    if config.grpo is None:
        return None
    return _build(
        RLConfig,
        "grpo",
        config.grpo,
        "grpo",
        model=sft_final,
        output_dir=str(config.run_dir / "grpo"),
        reward_model=None,
        reward_functions=[config.task] if config.task else [],
        train_data=config.data("prompts"),
        eval_data=config.data("prompts"),
        **split,
    )


def _round_stages(
    config: PipelineConfig, sft: SFTConfig, reward: RewardConfig, ppo: RLConfig
) -> list[RoundStages]:
    """Rounds 2..``config.rounds``: each one's reward model and PPO, reading the round before."""
    if config.round_policy_init == "previous" and {**config.ppo, **config.round_ppo}.get("lora"):
        raise ConfigError(
            "PipelineConfig.round_policy_init: 'previous' cannot go with ppo lora: true (a LoRA "
            "policy is the SFT model plus an adapter, and its reference that model with the "
            "adapter off); allowed with LoRA: 'sft'"
        )
    # The original comparisons are capped by reward.max_train_samples when the round's data is
    # written (pipeline/rounds.py); the round's reward model then reads all of that file.
    reward_fields = {k: v for k, v in config.reward.items() if k != "max_train_samples"}
    split = {"train_split": "train", "eval_split": "test", "seed": config.seed}
    sft_final = str(sft.final_dir)
    rounds, policy, rm = [], str(ppo.final_dir), str(reward.final_dir)
    for number in range(2, config.rounds + 1):
        where = config.run_dir / f"round_{number}"
        round_reward = _build(
            RewardConfig,
            "round_reward",
            {**reward_fields, **config.round_reward},
            model=rm if config.round_reward_init == "previous" else sft_final,
            output_dir=str(where / "rm"),
            train_data=str(where / "reward_data" / "train.jsonl"),
            eval_data=config.data("comparisons"),
            normalize_data=config.data("sft"),
            **split,
        )
        round_ppo = _build(
            RLConfig,
            "round_ppo",
            {**config.ppo, **config.round_ppo},
            "ppo",
            model=sft_final,
            reward_model=str(round_reward.final_dir),
            output_dir=str(where / "ppo"),
            train_data=config.data("prompts"),
            eval_data=config.data("prompts"),
            **_critic_start(config, sft_final),
            **split,
        )
        init = policy if config.round_policy_init == "previous" else None
        rounds.append(RoundStages(number, where, policy, rm, init, round_reward, round_ppo))
        policy, rm = str(round_ppo.final_dir), str(round_reward.final_dir)
    return rounds


def _eval_config(
    config: PipelineConfig,
    base: str,
    sft: SFTConfig,
    reward: RewardConfig,
    ppo: RLConfig,
    dpo: DPOConfig,
    grpo: RLConfig | None,
    rounds: list[RoundStages],
) -> EvalConfig:
    """The evaluation of every model the pipeline trained, sampled as PPO sampled (the
    policies of rounds >= 2 as `ppo_round<r>`)."""
    sft_final = str(sft.final_dir)
    models = {"base": base, "sft": sft_final, "ppo": str(ppo.final_dir), "dpo": str(dpo.final_dir)}
    if grpo is not None:
        models["grpo"] = str(grpo.final_dir)
    models.update({f"ppo_round{r.number}": str(r.ppo.final_dir) for r in rounds})
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
        max_length=reward.max_length,
        split="test",
        max_prompt_length=ppo.max_prompt_length,
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
