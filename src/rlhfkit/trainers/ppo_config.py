"""`PPOConfig`: the settings of InstructGPT's step 3 (PPO against a reward model).

Defaults follow TRL's PPO (1.12) where InstructGPT / lm-human-preferences do not fix a value:
k1 KL penalty with beta 0.05, gamma 1, lambda 0.95, clip ranges 0.2, value coefficient 0.1,
advantage whitening, linear learning-rate decay.

Batch vocabulary: an iteration samples `rollout_batch_size` prompts (over all processes:
each of N processes samples `rollout_batch_size / N`); the update then makes `ppo_epochs`
passes over that batch in shuffled minibatches of `batch_size * gradient_accumulation_steps`
sequences per process (one optimiser step each, its gradients averaged over the processes),
so there are `num_mini_batches = rollout_batch_size / (minibatch_size * N)` optimiser steps
per epoch. The same YAML on N processes is the same experiment when `batch_size` is divided
by N.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rlhfkit.config import require
from rlhfkit.errors import UsageError
from rlhfkit.experience.rewards import ScoreOptions
from rlhfkit.experience.rollout import RolloutSettings
from rlhfkit.models.loading import same_tokenizer, saved_tokenizer
from rlhfkit.trainers.ppo_update import PolicyLossSettings
from rlhfkit.trainers.rl_config import RLConfig


@dataclass
class PPOConfig(RLConfig):
    """PPO against a reward model and/or Python reward functions (InstructGPT step 3)."""

    output_dir: str = "runs/ppo"
    """Directory for checkpoints, metrics, samples, TensorBoard events and `final/`."""
    batch_size: int = 8
    """Sequences per forward/backward micro-batch in the update, on each process."""
    eval_every: int = 0
    """Evaluate on `eval_data` (score, KL to the reference, length) every this many PPO
    iterations; 0 only at the end."""
    save_every: int = 0
    """Write a checkpoint every this many PPO iterations; 0 only at the end."""
    max_steps: int | None = None
    """PPO iterations to run (a step of the loop is one rollout and its update); None runs
    `num_epochs` passes over the prompts."""
    rollout_batch_size: int = 32
    """Prompts (hence responses) per iteration, over all processes."""
    ppo_epochs: int = 4
    """Passes of the update over each rollout batch."""
    reward_model: str | list[str] | None = "runs/rm/final"
    """Reward model directory (from `rlhfkit reward`); a list of directories is an ensemble
    (`reward_ensemble`); None if only reward functions score."""
    critic: Literal["separate", "value_head"] = "separate"
    """A separate critic model (InstructGPT) or a value head on the policy's trunk."""
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
    kl_coef: float = 0.05
    """beta of the per-token KL penalty (the initial value when `adaptive_kl`)."""
    kl_estimator: Literal["k1", "k2", "k3"] = "k1"
    """Per-token KL estimator in the rewards (k1 = log pi - log ref, as InstructGPT)."""
    kl_in_loss: bool = False
    """Put the KL in the policy loss instead of the rewards: kl_coef x the k3 estimate per
    token, averaged as the policy loss is (as GRPO does); the rewards are then the score
    alone. `kl/ref` still reports the k1 KL of the rollout."""
    adaptive_kl: bool = False
    """Adapt beta towards `kl_target` (Ziegler et al. 2019)."""
    kl_target: float = 6.0
    """Target KL(pi || ref) per response (nats) of the adaptive controller."""
    kl_horizon: int = 10000
    """Horizon (in episodes) of the adaptive controller."""
    gamma: float = 1.0
    """GAE discount."""
    lam: float = 0.95
    """GAE lambda."""
    advantage_estimator: Literal["gae", "sequence"] = "gae"
    """'gae': a critic value per token (InstructGPT); 'sequence': one value per response, the
    critic's value of the prompt, as the baseline of each token's return to the end of the
    response (the KL penalty included; lambda 1): a sequence-level actor-critic whose critic
    learns only that one value."""
    clip_range_value: float | None = 0.2
    """Value clip range around the rollout values; None = unclipped value loss."""
    vf_coef: float = 0.1
    """Weight of the value loss."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus (subtracted from the loss)."""
    whiten_advantages: bool = True
    """Normalise advantages over each rollout batch."""
    ptx_coef: float = 0.0
    """Weight of the language-model loss on `ptx_data` (InstructGPT's PPO-ptx); 0 = off."""
    ptx_data: str | None = None
    """Demonstrations or pretraining text (prompt/response records) for the ptx term."""
    ptx_max_length: int = 256
    """Token budget of each ptx example."""
    forward_batch_size: int | None = None
    """Rows per no-grad forward pass in the rollout; None = the whole rollout batch."""
    parallel_critic: bool | None = None
    """Run independent model work side by side, each on half the CPU threads: the policy's
    and the separate critic's updates (the same steps, up to float rounding), and in the
    rollout the policy and critic passes beside the reference pass and the scorer (with LoRA
    the reference a view of the policy's base weights). Faster for small models. None: on
    CPU, not on GPU. Always off with several processes."""

    def __post_init__(self) -> None:
        super().__post_init__()
        positive = ("rollout_batch_size", "ppo_epochs", "kl_horizon", "ptx_max_length")
        for name in positive:
            require(self, name, getattr(self, name) >= 1, "an integer >= 1")
        require(
            self,
            "rollout_batch_size",
            self.rollout_batch_size % self.effective_batch_size == 0,
            f"a multiple of batch_size * gradient_accumulation_steps = {self.effective_batch_size}",
        )
        critic_lr = self.critic_learning_rate
        require(self, "critic_learning_rate", critic_lr is None or critic_lr > 0, "None or > 0")
        require(
            self,
            "critic_learning_rate",
            critic_lr is None or self.critic == "separate",
            "None with critic 'value_head' (the value head learns with the policy)",
        )
        require(self, "critic_warmup", self.critic_warmup >= 0, "an integer >= 0")
        require(
            self,
            "critic_warmup",
            self.critic_warmup == 0 or self.critic == "separate",
            "0 with critic 'value_head' (the value head trains the policy's trunk)",
        )
        warmup_fits = self.max_steps is None or self.critic_warmup < self.max_steps
        require(self, "critic_warmup", warmup_fits, f"less than max_steps ({self.max_steps})")
        require(self, "kl_coef", self.kl_coef >= 0, "a number >= 0")
        require(self, "kl_target", self.kl_target > 0, "a number > 0")
        require(self, "gamma", 0 <= self.gamma <= 1, "a number in [0, 1]")
        require(self, "lam", 0 <= self.lam <= 1, "a number in [0, 1]")
        value_clip = self.clip_range_value
        require(self, "clip_range_value", value_clip is None or value_clip > 0, "None or > 0")
        for name in ("vf_coef", "entropy_coef", "ptx_coef"):
            require(self, name, getattr(self, name) >= 0, "a number >= 0")
        require(
            self, "ptx_data", self.ptx_coef == 0 or bool(self.ptx_data), "a path when ptx_coef > 0"
        )
        require(
            self,
            "forward_batch_size",
            self.forward_batch_size is None or self.forward_batch_size >= 1,
            "None or >= 1",
        )

    def critic_start(self, tokenizer) -> str | None:
        """Where the separate critic starts (None: a value head on the policy's trunk). The
        critic reads the policy's token ids, so it cannot start from a model with a tokenizer
        of its own, such as a reward model of another family (which can still score)."""
        if self.critic != "separate":
            return None
        start = self.critic_model or next(iter(self.reward_models), self.model)
        if start == self.model:
            return start
        own = saved_tokenizer(start, trust_remote_code=self.trust_remote_code)
        if own is not None and not same_tokenizer(own, tokenizer):
            field = "critic_model" if self.critic_model else "reward_model"
            raise UsageError(
                f"PPOConfig.{field} = {start!r}: the critic starts from it, but its tokenizer "
                f"is not the policy's ({self.model!r}), and the critic reads the policy's "
                f"tokens. Set critic_model to a model with the policy's tokenizer (e.g. "
                f"--critic_model {self.model}, the policy itself) or --critic value_head"
            )
        return start

    @property
    def rollout_settings(self) -> RolloutSettings:
        """How each iteration's experience is made."""
        return RolloutSettings(
            sampling=self.sampling,
            kl_estimator=self.kl_estimator,
            gamma=self.gamma,
            lam=self.lam,
            estimator=self.advantage_estimator,
            whiten_advantages=self.whiten_advantages,
            scores=ScoreOptions.of(self),
            forward_batch_size=self.forward_batch_size,
        )

    @property
    def loss_settings(self) -> PolicyLossSettings:
        """The policy objective of the update."""
        return PolicyLossSettings(
            temperature=self.temperature,
            clip_range=self.clip_range,
            clip_range_high=self.clip_range_high,
            kl_in_loss=self.kl_in_loss,
            entropy_coef=self.entropy_coef,
        )

    @property
    def minibatch_size(self) -> int:
        """Sequences per optimiser step on one process."""
        return self.effective_batch_size

    def num_mini_batches(self, world: int = 1) -> int:
        """Optimiser steps per PPO epoch on ``world`` processes, each taking its share of the
        rollout (``rollout_batch_size / world`` prompts) in minibatches of ``minibatch_size``."""
        return self.rollout_batch_size // (self.minibatch_size * world)

    def check_world(self, world: int) -> None:
        """Fail unless the rollout splits evenly over ``world`` processes, each share into
        whole minibatches."""
        share = self.rollout_batch_size // world
        require(
            self,
            "rollout_batch_size",
            self.rollout_batch_size % world == 0 and share % self.minibatch_size == 0,
            f"a multiple of the world size ({world} processes) times batch_size * "
            f"gradient_accumulation_steps = {self.minibatch_size}, so that every process "
            "makes the same whole minibatches",
        )

    def loop_batch_size(self, world: int) -> int:
        """This process's share of the rollout's prompts."""
        self.check_world(world)
        return self.rollout_batch_size // world

    def loop_steps(self, num_examples: int, batches_per_epoch: int) -> int:
        """PPO iterations of the run for a prompt set of ``num_examples``."""
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
