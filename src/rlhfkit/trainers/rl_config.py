"""`RLConfig`: the one config of every RL algorithm (PPO, GRPO, RLOO, REINFORCE++), trained by
`trainers/rl.py`; the algorithms are presets of its defaults (`PRESETS`).

One vocabulary. An iteration samples `rollout_batch_size` prompts (over all processes: each
of N processes samples `rollout_batch_size / N`), `num_generations` responses each, in
generation batches of `generation_prompts` prompts (default: the process's whole share at
once); scores them and computes their advantages by `advantage_estimator`; then makes
`ppo_epochs` passes over that experience in minibatches of `batch_size *
gradient_accumulation_steps` sequences per process (one optimiser step each, shuffled when
a pass has more than one), so that there are `num_mini_batches = rollout_batch_size *
num_generations / (batch_size * gradient_accumulation_steps * N)` optimiser steps per pass.
The KL to the reference goes into the per-token rewards (InstructGPT, `kl_in_loss: false`)
or into the loss (GRPO, `kl_in_loss: true`), weighted by `kl_coef`. A critic (`separate` or a
`value_head`) gives the values of the estimators that read them (`gae`, `sequence`); the
group estimators (`grpo`, `rloo`) and `reinforce++` need none.

| preset | estimator | critic | KL | epochs | prompts x responses / iteration |
| --- | --- | --- | --- | --- | --- |
| `ppo` | gae | separate (from the reward model) | in the rewards, 0.05 | 4 | 32 x 1 |
| `grpo` | grpo | none | in the loss, 0.04 | 1 | 8 x 4 |
| `rloo` | rloo | none | in the loss, 0.04 | 1 | 8 x 4 |
| `reinforce++` | reinforce++ | none | in the rewards, 0.04 | 1 | 8 x 4 |

Defaults follow TRL's PPO (1.12) and GRPO (1.16) where InstructGPT / lm-human-preferences do
not fix a value. The same YAML on N processes is the same experiment when `batch_size` is
divided by N.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from rlhfkit.config import (
    DEMO_DATA,
    EvalPromptOptions,
    LoRAOptions,
    ReferenceOptions,
    SamplingOptions,
    ScorerOptions,
    TrainConfig,
    require,
)
from rlhfkit.errors import UsageError
from rlhfkit.experience.episodes import EpisodeSettings, environment_factory
from rlhfkit.experience.rewards import ScoreOptions
from rlhfkit.experience.rollout import GROUP_ESTIMATORS, RolloutSettings
from rlhfkit.models.loading import same_tokenizer, saved_tokenizer
from rlhfkit.trainers.ppo_update import PolicyLossSettings

CRITIC_ESTIMATORS = ("gae", "sequence")  # the estimators that read a critic's values

_GROUPS = {
    "rollout_batch_size": 8,
    "num_generations": 4,
    "batch_size": 32,
    "ppo_epochs": 1,
    "reward_model": None,
    "critic": "none",
    "kl_coef": 0.04,
    "kl_in_loss": True,
    "whiten_advantages": False,
    "sample_seeds": "data",
}
PRESETS: dict[str, dict[str, Any]] = {
    "ppo": {},
    "grpo": {**_GROUPS, "output_dir": "runs/grpo", "advantage_estimator": "grpo"},
    "rloo": {**_GROUPS, "output_dir": "runs/rloo", "advantage_estimator": "rloo"},
    "reinforce++": {
        **_GROUPS,
        "output_dir": "runs/reinforce++",
        "advantage_estimator": "reinforce++",
        "kl_in_loss": False,
    },
}
"""Each RL command's defaults, over `RLConfig`'s own (which are PPO's)."""


@dataclass
class PromptDataOptions:
    """The prompts an RL stage samples from."""

    train_data: str = f"{DEMO_DATA}/prompts"
    """Prompts (any record kind with a prompt): .jsonl/.json/.parquet, dataset dir or hub name;
    every other column of a row reaches the reward functions by name."""
    train_split: str = "train"
    """Split to read from `train_data` when it is a dataset with splits."""
    max_train_samples: int | None = None
    """Use only the first this many training prompts; None uses all."""
    max_prompt_length: int = 128
    """Prompts longer than this many tokens keep their last tokens."""


@dataclass
class RolloutOptions:
    """How many responses an iteration samples, and how the update passes over them."""

    rollout_batch_size: int = 32
    """Prompts sampled per iteration, over all processes."""
    num_generations: int = 1
    """Responses sampled per prompt: the group whose scores are each other's baseline under
    the group estimators (>= 2 for 'grpo' and 'rloo')."""
    generation_prompts: int | None = None
    """Prompts sampled, scored and given their advantages together on each process (a group
    never spans two); None = the process's whole share of the iteration. Advantages are
    whitened (`whiten_advantages`, 'reinforce++') over a generation batch."""
    sample_seeds: Literal["process", "data"] = "process"
    """Where sampling draws its randomness: 'process', one random stream per process, carried
    from iteration to iteration (kept in checkpoints, as TRL); 'data', a stream for each
    generation batch keyed by its place in the data, so that the same prompts get the same
    responses on any number of processes (with the same `generation_prompts`) and after a
    resume."""
    ppo_epochs: int = 4
    """Passes of the update over each iteration's experience (TRL's num_ppo_epochs and GRPO's
    num_iterations): from the second optimiser step on, the policy has moved from the one
    that sampled, and the clip acts."""
    forward_batch_size: int | None = None
    """Rows per no-grad forward pass while making experience; None = the whole generation
    batch."""


@dataclass
class ToolOptions:
    """Tools the policy may call (`experience/tools.py`): in episodes, and in `chat` and
    `sample`."""

    tools: list[str] = field(default_factory=list)
    """Tools the policy may call, 'module:function' each: Python functions with type hints
    and a docstring whose Args: describe each argument, shown to the policy as JSON schemas
    and called as <tool_call>{"name": ..., "arguments": {...}}</tool_call>. They are your
    code, run with your rights."""
    tool_timeout: float = 10.0
    """Seconds a tool call may run; past it the policy reads an error instead."""
    tools_prompt: str | None = None
    """The system prompt that shows the tools to a model whose chat template takes none, with
    {tools} where their JSON schemas go, one per line; None: rlhfkit's default (the
    <tool_call> format and the schemas). SFT demonstrations should show the same."""

    def tool_environment(self):
        """What makes a ``ToolEnv`` of the tools; None without tools."""
        return environment_factory(None, self.tools, self.tool_timeout)

    def _check_tools(self) -> None:
        require(self, "tool_timeout", self.tool_timeout > 0, "> 0 seconds")


@dataclass
class EpisodeOptions(ToolOptions):
    """Episodes: the policy calls tools or plays an environment over several turns
    (`experience/episodes.py`), instead of answering each prompt once."""

    environment: str | None = None
    """'module:Class' of a Gymnasium text environment (reset gives the first prompt, step
    the environment's reply, its reward and whether the episode is over), or of a class whose
    public methods are tools (TRL's environment_factory); one instance per episode."""
    max_turns: int = 4
    """Policy turns per episode: the episode is cut (truncated) after this many."""
    max_episode_tokens: int | None = None
    """Tokens of an episode after its prompt, the policy's and the environment's together;
    None: each turn has `max_new_tokens`."""

    @property
    def has_episodes(self) -> bool:
        """Whether the policy plays episodes (with tools or an environment)."""
        return bool(self.tools) or self.environment is not None

    def environment_factory(self):
        """What makes each episode's environment; None without tools or an environment."""
        return environment_factory(self.environment, self.tools, self.tool_timeout)

    def episode_settings(self, max_prompt_length: int) -> EpisodeSettings:
        return EpisodeSettings(
            self.max_turns, self.max_episode_tokens, max_prompt_length, self.tools_prompt
        )

    def _check_episodes(self) -> None:
        self._check_tools()
        require(self, "max_turns", self.max_turns >= 1, "an integer >= 1")
        budget = self.max_episode_tokens
        require(self, "max_episode_tokens", budget is None or budget >= 1, "None or >= 1")
        require(
            self,
            "environment",
            not (self.environment and self.tools),
            "None when tools are given (an environment's tools are its public methods)",
        )


@dataclass
class AdvantageOptions:
    """How a token's advantage is computed, and which responses the loss counts."""

    advantage_estimator: Literal["gae", "sequence", "grpo", "rloo", "reinforce++"] = "gae"
    """How a token's advantage is computed. With a critic: 'gae' (a value per token,
    InstructGPT) or 'sequence' (one value per response, the critic's value of the prompt, as
    the baseline of each token's return to the end; lambda 1). Without one: 'grpo' (score -
    group mean, divided by the group std unless `scale_rewards` is false: Shao et al. 2024),
    'rloo' (score - the mean of the other responses to the prompt: Ahmadian et al. 2024) or
    'reinforce++' (each token's return to the end, the KL penalty per token included,
    whitened over the generation batch: Hu 2025)."""
    scale_rewards: bool = True
    """'grpo' only: divide by the group std (False = Dr. GRPO, Liu et al. 2025: centring
    only)."""
    whiten_advantages: bool = True
    """Normalise advantages over each generation batch (mean 0, std 1)."""
    gamma: float = 1.0
    """Discount of the returns ('gae', 'sequence')."""
    lam: float = 0.95
    """GAE lambda."""
    skip_uniform_groups: bool = False
    """Leave groups whose scores are all equal out of the loss (DAPO's dynamic sampling,
    without the re-sampling): their advantages are 0, so they only dilute the token mean and
    the KL term; `score/groups_without_signal` counts them. Needs num_generations >= 2."""
    mask_truncated_completions: bool = False
    """Leave responses that ran out of tokens (no EOS within max_new_tokens) out of the loss
    (DAPO's overlong filtering): a cut-off answer is neither rewarded nor punished for where
    it was cut. Their scores still count in their group's baseline; missing_eos_penalty
    lowers their score instead."""


@dataclass
class CriticOptions:
    """The critic of the estimators that read values, and its value loss."""

    critic: Literal["separate", "value_head", "none"] = "separate"
    """The critic of the estimators that read values ('gae', 'sequence'): a separate model
    (InstructGPT) or a value head on the policy's trunk; 'none' for 'grpo', 'rloo' and
    'reinforce++'."""
    critic_model: str | None = None
    """Where the separate critic starts; None = the reward model (InstructGPT; an ensemble's
    first), else `model`. It reads the policy's tokens: a reward model with another tokenizer
    needs one of these."""
    critic_learning_rate: float | None = None
    """Peak learning rate of the separate critic's AdamW (OpenRLHF's critic_learning_rate,
    verl's critic.optim.lr; both use about 10x the policy's); None = `learning_rate`. Logged as
    `train/lr/critic`. Needs the separate critic: a value head learns with the policy."""
    critic_warmup: int = 0
    """The first this many iterations train the critic alone, on responses of the starting
    policy, which they leave as it is (verl's critic_warmup, OpenRLHF's freezing_actor_steps).
    A critic started from a reward model knows the score of a whole response, not the value
    of a response's first tokens; until its values fit, the advantages are mostly its error
    and would move the policy at random, spending KL. Counted in max_steps; the policy's
    learning-rate schedule spans the iterations after. Needs the separate critic."""
    clip_range_value: float | None = 0.2
    """Value clip range around the rollout values; None = unclipped value loss."""
    vf_coef: float = 0.1
    """Weight of the value loss."""
    parallel_critic: bool | None = None
    """Run independent model work side by side, each on half the CPU threads: the policy's
    and the separate critic's updates (the same steps, up to float rounding), and in the
    rollout the policy and critic passes beside the reference pass and the scorer (with LoRA
    the reference a view of the policy's base weights). Faster for small models. None: on
    CPU, not on GPU. Always off with several processes."""


@dataclass
class KLOptions:
    """The KL to the reference: its weight, where it goes, how it is estimated and adapted."""

    kl_coef: float = 0.05
    """beta: the weight of the KL to the reference (the initial value when `adaptive_kl`);
    0 drops the KL, and the reference model with it."""
    kl_in_loss: bool = False
    """Put the KL in the policy loss (GRPO): kl_coef x the k3 estimate per token, aggregated
    as the policy loss is; the rewards are then the score alone. False puts kl_coef x the
    `kl_estimator` per token into the rewards (InstructGPT). `kl/ref` reports the k1 KL of
    the rollout either way."""
    kl_estimator: Literal["k1", "k2", "k3"] = "k1"
    """Per-token KL estimator in the rewards (k1 = log pi - log ref, as InstructGPT)."""
    kl_importance_weight: bool = False
    """With the KL in the loss, weight each token's k3 term by the ratio pi / pi_old
    (DeepSeek-V3.2's unbiased KL estimate; TRL's use_bias_correction_kl): the same value at
    the sampling policy, but the gradient of KL(pi || ref) itself, (log pi - log ref) grad log
    pi, where k3's is (1 - ref / pi) grad log pi."""
    adaptive_kl: bool = False
    """Adapt kl_coef towards `kl_target` (Ziegler et al. 2019)."""
    kl_target: float = 6.0
    """Target KL(pi || ref) per response (nats) of the adaptive controller."""
    kl_horizon: int = 10000
    """Horizon (in episodes) of the adaptive controller."""


@dataclass
class PolicyObjectiveOptions:
    """The clipped policy objective and how it is aggregated."""

    clip_range: float = 0.2
    """Policy ratio clip range epsilon of the clipped objective (below 1, and above unless
    `clip_range_high` is set)."""
    clip_range_high: float | None = None
    """Upper clip range: the ratio is clipped to [1 - clip_range, 1 + clip_range_high]
    (DAPO's clip-higher, e.g. 0.28 with clip_range 0.2); None = clip_range. Acts only where
    the policy has moved since sampling (more than one optimiser step per iteration)."""
    importance_sampling_level: Literal["token", "sequence"] = "token"
    """The ratio pi / pi_old of the clipped objective: each token's own ('token') or one per
    response, the geometric mean of its tokens' ratios, clipped as a whole ('sequence': GSPO,
    Zheng et al. 2025, which clips in a far narrower range, e.g. clip_range 3e-4 and
    clip_range_high 4e-4, with loss_aggregation 'sequence_mean'). At the sampling policy both
    give the same gradient. 'sequence' needs one advantage per response ('grpo' or 'rloo')."""
    loss_aggregation: Literal["token_mean", "sequence_mean", "constant"] = "token_mean"
    """How the per-token loss reduces over a micro-batch: 'token_mean' (every response token
    weighs the same; DAPO, PPO), 'sequence_mean' (each response's token mean, then their
    mean; GRPO as published) or 'constant' (the sum over max_new_tokens x responses; Dr.
    GRPO)."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus (subtracted from the loss)."""


@dataclass
class PtxOptions:
    """InstructGPT's PPO-ptx: a language-model loss mixed into the update."""

    ptx_coef: float = 0.0
    """Weight of the language-model loss on `ptx_data` (InstructGPT's PPO-ptx); 0 = off."""
    ptx_data: str | None = None
    """Demonstrations or pretraining text (prompt/response records) for the ptx term."""
    ptx_max_length: int = 256
    """Token budget of each ptx example."""


@dataclass
class RLConfig(
    EpisodeOptions,
    PtxOptions,
    PolicyObjectiveOptions,
    KLOptions,
    CriticOptions,
    AdvantageOptions,
    RolloutOptions,
    PromptDataOptions,
    EvalPromptOptions,
    SamplingOptions,
    ScorerOptions,
    ReferenceOptions,
    LoRAOptions,
    TrainConfig,
):
    """A policy trained on prompts against a scorer, with a KL to a frozen reference: PPO with
    a critic (InstructGPT step 3), or GRPO, RLOO and REINFORCE++ without one. `rlhfkit ppo`,
    `grpo`, `rloo` and `reinforce++` are this config with their presets' defaults."""

    model: str = "runs/sft/final"
    """Policy to start from (the SFT model); also the frozen reference of the KL unless
    `reference` names another."""
    output_dir: str = "runs/ppo"
    """Directory for checkpoints, metrics, samples, TensorBoard events and `final/`."""
    learning_rate: float = 1e-5
    """Peak learning rate of the policy's AdamW (reached after warmup), and of a separate
    critic's unless `critic_learning_rate` is set."""
    lr_scheduler: Literal["linear", "cosine", "constant"] = "linear"
    """Learning-rate decay over all optimiser steps of the run: linear to 0, cosine to 0, or
    constant."""
    batch_size: int = 8
    """Sequences (prompt + response) per forward/backward micro-batch of the update, on each
    process."""
    log_every: int = 1
    """Log training metrics every this many iterations."""
    eval_every: int = 0
    """Evaluate on `eval_data` (score, KL to the reference, length, gold) every this many
    iterations; 0 only at the end."""
    save_every: int = 0
    """Write a checkpoint every this many iterations; 0 only at the end."""
    max_steps: int | None = None
    """Iterations to run (a step of the loop is one rollout and its update); None runs
    `num_epochs` passes over the prompts."""
    reward_model: str | list[str] | None = "runs/rm/final"
    """Reward model directory (from `rlhfkit rm`); a list of directories is an ensemble
    (`reward_ensemble`); None if only reward functions score."""
    disable_dropout: bool = True
    """Turn dropout off in every model, so sampling and the update see the same policy (the
    ratio starts at exactly 1, as in TRL)."""
    sample_every: int = 10
    """Log sample texts (prompt, response, score, advantage) every this many iterations, so
    that reward hacking is seen."""
    num_samples: int = 4
    """Samples logged each time."""

    @classmethod
    def preset(cls, algorithm: str, **fields: Any) -> RLConfig:
        """The config of ``algorithm`` ('ppo', 'grpo', 'rloo', 'reinforce++'): its preset's
        defaults, then ``fields``."""
        return cls(**{**cls.preset_defaults(algorithm), **fields})

    @staticmethod
    def preset_defaults(algorithm: str) -> dict[str, Any]:
        """The defaults ``algorithm``'s preset sets over `RLConfig`'s own (PPO's)."""
        if algorithm not in PRESETS:
            raise UsageError(f"unknown RL algorithm {algorithm!r}: one of {', '.join(PRESETS)}")
        return dict(PRESETS[algorithm])

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_lora()
        self._check_sampling()
        self._check_episodes()
        self._check_scorers(required=self.environment is None)
        self._check_eval_prompts()
        self._check_reference()
        self._check_data()
        self._check_critic()
        self._check_kl()
        self._check_objective()
        self._check_batches()

    def _check_data(self) -> None:
        require(self, "train_data", bool(self.train_data), "a data file, directory or hub name")
        limit = self.max_train_samples
        require(self, "max_train_samples", limit is None or limit >= 1, "None or an integer >= 1")
        positive = ("max_prompt_length", "sample_every", "num_samples", "ptx_max_length")
        for name in positive:
            require(self, name, getattr(self, name) >= 1, "an integer >= 1")
        require(
            self, "ptx_data", self.ptx_coef == 0 or bool(self.ptx_data), "a path when ptx_coef > 0"
        )

    def _check_batches(self) -> None:
        for name in ("rollout_batch_size", "num_generations", "ppo_epochs"):
            require(self, name, getattr(self, name) >= 1, "an integer >= 1")
        for name in ("generation_prompts", "forward_batch_size"):
            value = getattr(self, name)
            require(self, name, value is None or value >= 1, "None or an integer >= 1")
        require(
            self,
            "rollout_batch_size",
            self.rollout_size % self.effective_batch_size == 0,
            f"such that rollout_batch_size x num_generations ({self.rollout_size}) is a multiple "
            f"of batch_size x gradient_accumulation_steps ({self.effective_batch_size})",
        )
        generation = self.generation_prompts
        require(
            self,
            "generation_prompts",
            generation is None or self.rollout_batch_size % generation == 0,
            f"None or a divisor of rollout_batch_size ({self.rollout_batch_size})",
        )

    def _check_critic(self) -> None:
        reads_values = self.advantage_estimator in CRITIC_ESTIMATORS
        require(
            self,
            "critic",
            reads_values == (self.critic != "none"),
            f"'separate' or 'value_head' with advantage_estimator "
            f"{self.advantage_estimator!r}, which reads a critic's values"
            if reads_values
            else f"'none' with advantage_estimator {self.advantage_estimator!r}, which reads "
            "no values (a critic would learn for nothing)",
        )
        separate = self.critic == "separate"
        critic_lr = self.critic_learning_rate
        require(self, "critic_learning_rate", critic_lr is None or critic_lr > 0, "None or > 0")
        require(
            self,
            "critic_learning_rate",
            critic_lr is None or separate,
            "None without a separate critic (a value head learns with the policy)",
        )
        require(
            self,
            "critic_model",
            self.critic_model is None or separate,
            "None without a separate critic",
        )
        require(self, "critic_warmup", self.critic_warmup >= 0, "an integer >= 0")
        require(
            self,
            "critic_warmup",
            self.critic_warmup == 0 or separate,
            "0 without a separate critic (a value head trains the policy's trunk)",
        )
        warmup_fits = self.max_steps is None or self.critic_warmup < self.max_steps
        require(self, "critic_warmup", warmup_fits, f"less than max_steps ({self.max_steps})")
        require(self, "gamma", 0 <= self.gamma <= 1, "a number in [0, 1]")
        require(self, "lam", 0 <= self.lam <= 1, "a number in [0, 1]")
        value_clip = self.clip_range_value
        require(self, "clip_range_value", value_clip is None or value_clip > 0, "None or > 0")

    def _check_kl(self) -> None:
        require(self, "kl_coef", 0 <= self.kl_coef < math.inf, "a number >= 0")
        require(self, "kl_target", self.kl_target > 0, "a number > 0")
        require(self, "kl_horizon", self.kl_horizon >= 1, "an integer >= 1")
        require(
            self,
            "kl_in_loss",
            not self.kl_in_loss or self.advantage_estimator != "reinforce++",
            "False with advantage_estimator 'reinforce++' (its returns carry the KL penalty "
            "of every token)",
        )
        require(
            self,
            "kl_importance_weight",
            not self.kl_importance_weight or self.kl_in_loss,
            "False unless kl_in_loss (it weights the KL term of the loss)",
        )

    def _check_objective(self) -> None:
        groups = self.advantage_estimator in GROUP_ESTIMATORS
        require(
            self,
            "num_generations",
            self.num_generations >= 2 or not groups,
            f"an integer >= 2 with advantage_estimator {self.advantage_estimator!r} (a "
            "response's baseline is the rest of its group)",
        )
        require(
            self,
            "skip_uniform_groups",
            not self.skip_uniform_groups or self.num_generations >= 2,
            "False with num_generations 1 (there are no groups)",
        )
        require(
            self,
            "importance_sampling_level",
            self.importance_sampling_level == "token" or groups,
            "'token' with advantage_estimator "
            f"{self.advantage_estimator!r} (its advantages differ from token to token; a "
            "ratio per response needs one advantage per response: 'grpo' or 'rloo')",
        )
        require(self, "clip_range", 0 < self.clip_range < math.inf, "a number > 0")
        high = self.clip_range_high
        require(self, "clip_range_high", high is None or 0 < high < math.inf, "None or > 0")
        for name in ("vf_coef", "entropy_coef", "ptx_coef"):
            require(self, name, 0 <= getattr(self, name) < math.inf, "a number >= 0")

    # ----------------------------------------------------------------- the models
    @property
    def has_reference(self) -> bool:
        """Whether a KL to the reference is measured (a reference model is run)."""
        return self.kl_coef > 0 or self.adaptive_kl

    def critic_start(self, tokenizer) -> str | None:
        """Where the separate critic starts (None: a value head on the policy's trunk, or no
        critic). The critic reads the policy's token ids, so it cannot start from a model
        with a tokenizer of its own, such as a reward model of another family (which can
        still score)."""
        if self.critic != "separate":
            return None
        start = self.critic_model or next(iter(self.reward_models), self.model)
        if start == self.model:
            return start
        own = saved_tokenizer(start, trust_remote_code=self.trust_remote_code)
        if own is not None and not same_tokenizer(own, tokenizer):
            field = "critic_model" if self.critic_model else "reward_model"
            raise UsageError(
                f"RLConfig.{field} = {start!r}: the critic starts from it, but its tokenizer "
                f"is not the policy's ({self.model!r}), and the critic reads the policy's "
                f"tokens. Set critic_model to a model with the policy's tokenizer (e.g. "
                f"--critic_model {self.model}, the policy itself) or --critic value_head"
            )
        return start

    # ----------------------------------------------------------------- experience and loss
    def rollout_settings(self, world: int) -> RolloutSettings:
        """How each generation batch's experience is made on ``world`` processes: the
        policy's own no-grad pass only where the update is not one step from the sampling
        policy (else the update's first pass is pi_old)."""
        return RolloutSettings(
            sampling=self.sampling,
            kl_estimator=self.kl_estimator,
            gamma=self.gamma,
            lam=self.lam,
            estimator=self.advantage_estimator,
            group_size=self.num_generations,
            scale_by_std=self.scale_rewards,
            skip_uniform_groups=self.skip_uniform_groups,
            mask_truncated=self.mask_truncated_completions,
            whiten_advantages=self.whiten_advantages,
            policy_pass=self.ppo_epochs * self.num_mini_batches(world) > 1,
            scores=ScoreOptions.of(self),
            forward_batch_size=self.forward_batch_size,
            episodes=self.episode_settings(self.max_prompt_length),
        )

    @property
    def loss_settings(self) -> PolicyLossSettings:
        """The policy objective of the update."""
        return PolicyLossSettings(
            temperature=self.temperature,
            clip_range=self.clip_range,
            clip_range_high=self.clip_range_high,
            aggregation=self.loss_aggregation,
            max_tokens=self.max_new_tokens,
            ratio_level=self.importance_sampling_level,
            kl_in_loss=self.kl_in_loss,
            kl_importance_weight=self.kl_importance_weight,
            entropy_coef=self.entropy_coef,
        )

    # ----------------------------------------------------------------- batch arithmetic
    @property
    def rollout_size(self) -> int:
        """Sequences sampled per iteration, over all processes."""
        return self.rollout_batch_size * self.num_generations

    @property
    def minibatch_size(self) -> int:
        """Sequences per optimiser step on one process."""
        return self.effective_batch_size

    def num_mini_batches(self, world: int = 1) -> int:
        """Optimiser steps per pass over an iteration's experience on ``world`` processes,
        each taking its share in minibatches of ``minibatch_size``."""
        return self.rollout_size // (self.minibatch_size * world)

    def check_world(self, world: int) -> None:
        """Fail unless the iteration splits evenly over ``world`` processes: whole generation
        batches of prompts, whole minibatches of sequences."""
        share = self.rollout_batch_size // world
        require(
            self,
            "rollout_batch_size",
            self.rollout_batch_size % world == 0
            and (share * self.num_generations) % self.minibatch_size == 0,
            f"a multiple of the world size ({world} processes) such that each process's "
            f"{share} prompts x num_generations make whole minibatches of batch_size x "
            f"gradient_accumulation_steps = {self.minibatch_size} sequences",
        )
        generation = self.generation_prompts
        require(
            self,
            "generation_prompts",
            generation is None or share % generation == 0,
            f"None or a divisor of each process's {share} prompts",
        )

    def loop_batch_size(self, world: int) -> int:
        """Prompts a generation batch draws from the data on each process: the loop's batch."""
        self.check_world(world)
        return self.generation_prompts or self.rollout_batch_size // world

    def generation_batches(self, world: int) -> int:
        """Generation batches per iteration on each process."""
        return self.rollout_batch_size // world // self.loop_batch_size(world)

    def loop_steps(self, num_examples: int, batches_per_epoch: int) -> int:
        """Iterations of the run for a prompt set of ``num_examples``."""
        if self.max_steps is not None:
            return self.max_steps
        return max(self.num_epochs * num_examples // self.rollout_batch_size, 1)

    def optimizer_steps(self, loop_steps: int, world: int) -> int:
        """Optimiser steps of the run on ``world`` processes (the LR schedule's length)."""
        return loop_steps * self.ppo_epochs * self.num_mini_batches(world)

    def policy_optimizer_steps(self, loop_steps: int, world: int) -> int:
        """The policy's optimiser steps (its LR schedule's length): none in the critic's
        warmup."""
        require(
            self,
            "critic_warmup",
            self.critic_warmup < loop_steps,
            f"less than the run's {loop_steps} iterations",
        )
        return self.optimizer_steps(loop_steps - self.critic_warmup, world)
