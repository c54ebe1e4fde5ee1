"""The one RL trainer: PPO, GRPO, RLOO and REINFORCE++ as settings of one iteration.

An iteration is one step of the shared loop (``loop.py``) and reads top to bottom in
``step``:

1. make experience: for each generation batch of prompts, sample ``num_generations``
   responses per prompt, score them, shape the rewards and compute the advantages
   (``ExperienceMaker.make`` in ``experience/rollout.py``);
2. learn from it: ``ppo_epochs`` passes over the iteration's experience in minibatches, one
   optimiser step per minibatch and trained model, with the clipped policy loss
   (``ppo_update.policy_loss``), the clipped value loss where there is a critic, an optional
   entropy bonus and an optional PPO-ptx language-model term;
3. log: the experience's statistics, the update's, the KL coefficient (adapted towards its
   target where asked) and sample texts.

What the algorithms differ in is the config (``rl_config.py``), never this loop:

- PPO (InstructGPT's step 3, Ouyang et al. 2022, section 3.5; as lm-human-preferences and
  TRL's ``PPOTrainer`` 1.12): a critic (a separate ``ValueModel`` started from the reward
  model, or a value head on the policy's trunk), GAE, the KL penalty in the per-token
  rewards, four epochs of shuffled minibatches; ``critic_warmup`` iterations first train the
  separate critic alone, the policy left as it starts (verl, OpenRLHF).
- GRPO (Shao et al. 2024, "DeepSeekMath", sec. 4.1), RLOO (Ahmadian et al. 2024) and
  REINFORCE++ (Hu 2025): groups of responses per prompt as each other's baseline, no critic;
  GRPO and RLOO put a k3 KL term in the loss, REINFORCE++ the KL penalty in the rewards. With
  one optimiser step per iteration the update's own forward pass gives the "old" log-probs
  (the ratio is 1, the clip inactive), as TRL's ``GRPOTrainer`` with ``num_iterations=1``.

Models: the policy starts from the SFT model; the frozen reference is a second copy of it,
or with LoRA the same model with the adapter disabled (never a second copy), and there is
none where no KL is measured (``kl_coef`` 0).

Departures from TRL: policy and critic have one AdamW each and their gradients are clipped
per model (the value loss's larger gradients would otherwise shrink the policy's step);
minibatch order comes from a seeded generator saved in checkpoints, so a resumed run is
exact; padding columns a minibatch does not use are trimmed before its forward pass; rewards
from a reward model are read at the EOS the policy emitted, as the reward model was trained
(TRL's GRPO scores the text without EOS).

Speed (docs/ppo.md, "Speed on a CPU"): passes on real tokens only (``runtime/packing.py``),
the LM head on response positions, optional bf16 autocast (fp32 weights, optimiser, loss
math), the fused GELU, and on a CPU independent model work side by side on half the cores
each (``ppo_update.py``, ``rollout.py``); the runtime (``runtime/machine.py``) decides which,
once.
"""

from __future__ import annotations

import copy
import functools
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from accelerate.utils import set_seed
from torch import nn

from rlhfkit import checkpoint as ckpt
from rlhfkit.data import (
    PromptCollator,
    PromptExample,
    SFTCollator,
    encode_demonstrations,
    load_records,
)
from rlhfkit.experience.episodes import transcript
from rlhfkit.experience.rewards import AdaptiveKLController, FixedKLController, RunningMoments
from rlhfkit.experience.rollout import (
    ExperienceMaker,
    Rollout,
    RolloutModels,
    load_rollout_models,
    rollout_stats,
)
from rlhfkit.experience.scorers import ScoreInput, Scorer, as_scorer, prepare_scorer
from rlhfkit.models.loading import disable_dropout, freeze, load_tokenizer
from rlhfkit.models.lora import add_lora, base_view, is_lora_lm, merged_copy
from rlhfkit.models.passes import (
    ValueHeadLM,
    causal_lm,
    critic_values,
    labelled_logprobs,
    sequence_inputs,
)
from rlhfkit.ops.losses import ppo_value_loss
from rlhfkit.ops.masks import masked_mean
from rlhfkit.runtime.distributed import mean_over_ranks, rank_seed, stream_seed
from rlhfkit.runtime.sharding import shard
from rlhfkit.trainers.checkpoints import TRAINED_WEIGHTS
from rlhfkit.trainers.loop import WATCH_RL, Batch, Position, Stream, Trainer
from rlhfkit.trainers.optim import Learner, MinibatchLearner, accumulate
from rlhfkit.trainers.ppo_update import policy_loss, shuffled_minibatches, update_learners
from rlhfkit.trainers.rl_config import RLConfig
from rlhfkit.trainers.rl_inputs import load_rl_prompts

logger = logging.getLogger(__name__)


class RLTrainer(Trainer):
    """RL on ``prompts`` (token id lists, or ``data.PromptExample``s whose prompts as written
    and columns reach the reward functions) against ``scorer`` (a ``Scorer``, a reward model,
    or a Python reward function, ``scorers.FunctionScorer``), as ``config`` says.

    ``policy`` is a causal LM (a ``ValueHeadLM`` with ``critic: value_head``; LoRA adapters
    are added here where ``config.lora`` asks and it has none); ``critic`` the separate
    critic where ``config.critic`` is 'separate'. ``reference=None`` is the policy with its
    adapter disabled under LoRA, else a copy of the starting policy. ``ptx_examples`` are
    ``SFTExample``s; ``eval_prompts`` (as ``prompts``) are scored every ``eval_every``
    iterations and at the end.
    """

    learner_name = "policy"
    checkpoint_layout = TRAINED_WEIGHTS  # a resume needs the trained weights only
    drop_last = True  # every iteration samples rollout_batch_size prompts
    watch = WATCH_RL

    def __init__(
        self,
        config: RLConfig,
        policy: nn.Module,
        tokenizer,
        prompts: list[list[int] | PromptExample],
        scorer: Scorer | nn.Module | Callable | None,
        *,
        reference: nn.Module | None = None,
        critic: nn.Module | None = None,
        ptx_examples: list | None = None,
        eval_prompts: list[list[int] | PromptExample] | None = None,
        environment: Callable[[], Any] | None = None,
    ) -> None:
        _check_inputs(config, policy, prompts, critic, ptx_examples)
        policy, critic, reference = _with_lora_and_reference(config, policy, critic, reference)
        collate = PromptCollator(tokenizer.pad_token_id)
        super().__init__(config, policy, prompts, collate, tokenizer=tokenizer)
        # The bare models (the rollout samples from them, `final/` holds them) are the
        # experience maker's, `self.models`; `self.model` and `self.critic_engine` are what
        # the update runs (data-parallel wrappers of the policy and the critic on several
        # processes).
        self.ptx_examples = ptx_examples or []
        self.eval_prompts = eval_prompts or []
        self.gold = config.gold_scorer(tokenizer)
        if scorer is not None:
            scorer = prepare_scorer(as_scorer(scorer), self.runtime, config.padding_free)
        elif environment is None:
            raise ValueError("RLTrainer: give a scorer, or an environment whose rewards count")
        side_by_side = self.runtime.side_by_side and config.has_reference
        if reference is None and side_by_side and is_lora_lm(self.unwrapped_model):
            # Its own module on the base weights: the reference pass runs beside the policy's.
            reference = base_view(self.unwrapped_model)
        models = RolloutModels(self.unwrapped_model, reference, critic, config.has_reference)
        self._prepare_models(models)
        self._build_learners(critic)
        settings = config.rollout_settings(self.runtime.world)
        self.maker = ExperienceMaker(models, scorer, tokenizer, settings, self.runtime, environment)
        self.update_schedule = self._update_schedule()
        self.kl_controller = (
            AdaptiveKLController(config.kl_coef, config.kl_target, config.kl_horizon)
            if config.adaptive_kl
            else FixedKLController(config.kl_coef)
        )
        self.moments = RunningMoments()  # of every score seen, for score_normalize
        self._seed_generators()
        rank, world = self.runtime.rank, self.runtime.world
        self.ptx_stream = Stream(
            len(self.ptx_examples), config.batch_size, config.seed, True, rank, world
        )
        if self.ptx_examples:
            self.ptx_stream.check_split("ptx_data")
        self.ptx_position = Position()
        self.state_parts = {
            "kl_controller": self.kl_controller,
            "score_moments": self.moments,
            "ptx_position": self.ptx_position,
        }

    def _seed_generators(self) -> None:
        """This process's random streams of sampling, minibatch shuffling and environment
        resets, seeded from the config's seed and the rank; checkpoints keep them."""
        seed, rank = self.config.seed, self.runtime.rank
        self.sample_generator = torch.Generator(self.runtime.device)
        self.sample_generator.manual_seed(rank_seed(seed, rank))
        self.shuffle_generator = torch.Generator().manual_seed(rank_seed(seed + 1, rank))
        self.env_generator = torch.Generator().manual_seed(rank_seed(seed + 3, rank))
        self.generators = {"sample": self.sample_generator, "shuffle": self.shuffle_generator}
        if self.maker.environment is not None:
            self.generators["environment"] = self.env_generator

    def _build_learners(self, critic: nn.Module | None) -> None:
        """The policy's learning-rate schedule over the steps it takes (after the critic's
        warmup), and the separate critic ready to learn with its own AdamW and schedule."""
        config = self.config
        if config.critic_warmup:
            policy = self.learners[self.learner_name]
            steps = config.policy_optimizer_steps(self.state.total_steps, self.runtime.world)
            self.learners[self.learner_name] = Learner.build(
                self.learner_name, policy.module, config, steps, policy.optimizer
            )
        self.critic_engine: nn.Module | None = None
        if critic is not None:
            lr = config.critic_learning_rate
            self.critic_engine, optimizer = self.distribute("critic", critic, lr)
            self.learners["critic"] = Learner.build(
                "critic", critic, config, self.optimizer_steps, optimizer, "lr/critic"
            )

    def _update_schedule(self) -> list[MinibatchLearner]:
        """Each learner with its loss and the module its loss runs, the wrapper whose gradient
        synchronisation waits for a minibatch's last micro-batch."""
        losses = {"policy": self.policy_loss, "critic": self._critic_loss}
        engines = {"policy": self.model, "critic": self.critic_engine}
        return [
            MinibatchLearner(
                learner,
                losses[name],
                self.config.gradient_accumulation_steps,
                self.runtime.autocast,
                functools.partial(self.no_sync, engines[name]),
            )
            for name, learner in self.learners.items()
        ]

    def _prepare_models(self, models: RolloutModels) -> None:
        """Policy, reference and critic on the runtime's device with its kernels; dropout off
        where asked; the reference frozen and, with FSDP, sharded like the trained ones."""
        reference = models.reference
        for model in (models.policy, reference, models.critic):
            if model is not None:
                trained = model is not reference
                self.runtime.prepare(model, packed=self.config.padding_free, trained=trained)
                if self.config.disable_dropout:
                    disable_dropout(model)
        if reference is not None:
            freeze(reference)
            if self.runtime.sharded:  # frozen too: 1/N of its memory each
                shard(reference)

    @property
    def scorer(self) -> Scorer:
        return self.maker.scorer

    @property
    def plot_keys(self) -> tuple[str, ...]:
        """The curves of `curves.png`: score, KL, entropy, length, and the critic's fit."""
        keys = ("score/mean", "kl/ref", "policy/entropy", "response/length")
        if self.config.critic != "none":
            keys += ("value/explained_variance",)
        return tuple(f"train/{key}" for key in keys)

    @property
    def models(self) -> RolloutModels:
        return self.maker.models

    # ----------------------------------------------------------------- one iteration
    def train_step(self) -> dict[str, float]:
        metrics, rollout = self.step()
        iteration = self.state.step + 1
        if self.tracker is not None and (
            iteration == 1 or iteration % self.config.sample_every == 0
        ):
            self.tracker.log_samples(self._samples(rollout), iteration)
        return metrics

    def step(self) -> tuple[dict[str, float], Rollout]:
        """One iteration: make experience from the next prompts, learn from it, log. Returns
        the metrics and the iteration's experience."""
        started = time.perf_counter()
        batches = self.config.generation_batches(self.runtime.world)
        with self.maker.frozen_weights_cast():
            parts = [self.make_experience(self.next_batch()) for _ in range(batches)]  # 1
            rollout = Rollout.concat(parts, self.tokenizer.pad_token_id)
            update_started = time.perf_counter()
            metrics = self.update(rollout)  # 2
        for part in parts:  # 3
            accumulate(metrics, rollout_stats(part, self.config.num_generations), 1 / batches)
        metrics["kl/coef"] = self.kl_controller.value
        if "kl/ref" in metrics:  # the whole batch's KL, the same on every process
            kl = mean_over_ranks(metrics["kl/ref"])
            self.kl_controller.update(kl, len(rollout) * self.runtime.world)
        metrics["time/update"] = time.perf_counter() - update_started
        metrics["time/iteration"] = time.perf_counter() - started
        return metrics, rollout

    def make_experience(self, batch: Batch) -> Rollout:
        """``num_generations`` responses per prompt of ``batch`` (a group's rows contiguous),
        scored, with their rewards and advantages; checked finite."""
        k = self.config.num_generations
        columns = batch.get("prompt_columns")
        if "sample_seed" in batch:  # from next_batch; other batches draw on where it stands
            self.sample_generator.manual_seed(batch["sample_seed"])
        rollout = self.maker.make(
            batch["query"].repeat_interleave(k, dim=0),  # (B, Tq)
            batch["query_mask"].repeat_interleave(k, dim=0),  # (B, Tq)
            kl_coef=0.0 if self.config.kl_in_loss else self.kl_controller.value,
            moments=self.moments,
            generator=self.sample_generator,
            prompt_columns=columns.repeat(k) if columns is not None else None,
            env_seeds=self._env_seeds(len(batch["query"]), k, self.env_generator),
        )
        rollout.check_finite()
        return rollout

    def _env_seeds(self, prompts: int, k: int, generator: torch.Generator) -> list[int] | None:
        """The seeds that reset the environments of ``prompts`` x ``k`` episodes, the same
        for a group's ``k`` (their baseline is each other: one start); None without an
        environment."""
        if self.maker.environment is None:
            return None
        seeds = torch.randint(2**31 - 1, (prompts,), generator=generator)
        return seeds.repeat_interleave(k).tolist()

    def next_batch(self) -> Batch:
        """The next prompts; with ``sample_seeds: data``, with the seed of their samples
        (``sample_seed``), drawn from their place in the data: a generation batch's groups
        are the same whichever process samples them, on any number of processes, and after a
        resume."""
        batch = super().next_batch()
        if self.config.sample_seeds == "data":
            number = self.stream.number(self.state.batch_index - 1)
            batch["sample_seed"] = stream_seed(self.config.seed, self.state.epoch, number)
        return batch

    def update(self, rollout: Rollout) -> dict[str, float]:
        """``ppo_epochs`` passes over ``rollout`` in minibatches (shuffled where a pass has
        several): one optimiser step per minibatch and learner, over
        ``gradient_accumulation_steps`` micro-batches; in the critic's warmup, the critic's
        alone. Returns mean statistics."""
        self.trainable.train()
        cfg = self.config
        minibatches = shuffled_minibatches(
            rollout, cfg.ppo_epochs, cfg.minibatch_size, cfg.batch_size, self.shuffle_generator
        )
        learners = self.update_schedule
        if self.state.step < cfg.critic_warmup:
            learners = learners[1:]  # the critic: the policy is the schedule's first
        return update_learners(learners, minibatches, self.runtime.side_by_side)

    def policy_loss(
        self, mb: Rollout, token_weight: float = 1.0
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The policy loss of one micro-batch (``ppo_update.policy_loss``: clipped surrogate,
        the KL term where it is in the loss, the entropy bonus), plus the value loss when the
        critic is a value head on the policy's trunk, these token means times
        ``token_weight`` (``ppo_update.token_weights``); plus ptx."""
        cfg = self.config
        loss, stats, values = policy_loss(
            self.model, mb, cfg.loss_settings, self.kl_controller.value, self.models.packed
        )
        if values is not None:
            value_loss, value_stats = self._value_loss(values, mb)
            loss = loss + value_loss
            stats |= value_stats
        loss = token_weight * loss
        if cfg.ptx_coef > 0:
            ptx_loss = self._ptx_loss()
            loss = loss + cfg.ptx_coef * ptx_loss
            stats["loss/ptx"] = ptx_loss.detach()
        return loss, stats

    def _critic_loss(
        self, mb: Rollout, token_weight: float
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The separate critic's share of the loss on one micro-batch (a token mean, times
        ``token_weight``)."""
        inputs = sequence_inputs(*mb.sequences, packed=self.models.packed)
        values = critic_values(self.critic_engine, inputs, mb.response.shape[1])
        loss, stats = self._value_loss(values, mb)
        return token_weight * loss, stats

    def _value_loss(
        self, values: torch.Tensor, mb: Rollout
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``vf_coef`` times the clipped value loss of ``values`` (b, Tr): at every response
        token, or with the sequence estimator at the first only (the value of the prompt)."""
        cfg = self.config
        mask = mb.response_mask
        if cfg.advantage_estimator == "sequence":
            mask = torch.cat([mask[:, :1], torch.zeros_like(mask[:, 1:])], dim=1)
        loss, clip_stats = ppo_value_loss(
            values.float(), mb.values, mb.returns, mask, cfg.clip_range_value
        )
        stats = {"loss/value": loss.detach(), "value/clipfrac": clip_stats["vf_clipfrac"]}
        return cfg.vf_coef * loss, stats

    def _ptx_loss(self) -> torch.Tensor:
        """InstructGPT's PPO-ptx term: the LM loss (response tokens) on one demonstration batch,
        the next of the ptx stream (a pass is a permutation of (seed, pass); an incomplete last
        batch is skipped)."""
        indices = self.ptx_position.advance(self.ptx_stream)
        collate = SFTCollator(self.tokenizer.pad_token_id)
        batch = collate([self.ptx_examples[int(i)] for i in indices])
        batch = {k: v.to(self.runtime.device) for k, v in batch.items()}
        logprobs, mask = labelled_logprobs(self.models.policy, batch)  # (b, K) each
        return -masked_mean(logprobs, mask)

    def _samples(self, rollout: Rollout) -> list[dict]:
        """The first ``num_samples`` of the iteration's responses, with their scores and
        advantages (their mean over the response), so that hacking is seen."""
        advantages = masked_mean(rollout.advantages, rollout.response_mask, dim=1)  # (B,)
        responses = rollout.responses
        if rollout.completions is not None:  # episodes, turn by turn
            responses = [transcript(completion) for completion in rollout.completions]
        return [
            {
                "prompt": rollout.prompts[i],
                "response": responses[i],
                "score": float(rollout.raw_scores[i]),
                "advantage": float(advantages[i]),
            }
            for i in range(min(self.config.num_samples, len(rollout)))
        ]

    # ----------------------------------------------------------------- evaluation
    def evaluate(self) -> dict[str, float]:
        """One fixed-seed sample per held-out prompt: the mean raw score (and each part's, for
        a scorer of several), KL to the reference (summed over the response, as ``kl/ref``),
        length, and the gold functions' score.
        Training's random streams, score statistics and KL coefficient are left as they
        were."""
        if not self.eval_prompts:
            return {}
        generator = torch.Generator(self.runtime.device).manual_seed(self.config.seed + 2)
        env_generator = torch.Generator().manual_seed(self.config.seed + 2)
        sums: dict[str, torch.Tensor] = {}
        for batch in self.eval_batches(self.eval_prompts, self.collate_fn):
            rollout = self.maker.make(
                batch["query"],
                batch["query_mask"],
                kl_coef=0.0,
                generator=generator,
                prompt_columns=batch.get("prompt_columns"),
                env_seeds=self._env_seeds(len(batch["query"]), 1, env_generator),
            )
            totals = {
                "score": rollout.raw_scores.sum(),
                **{f"score/{key}": part.sum() for key, part in rollout.score_parts.items()},
                "length": rollout.response_mask.sum(),
            }
            if rollout.kl is not None:
                totals["kl"] = rollout.kl.sum()
            if self.gold is not None:
                totals["gold"] = self.gold(self._scored(rollout)).sum()
            accumulate(sums, totals)
        return {key: value / len(self.eval_prompts) for key, value in sums.items()}

    def _scored(self, rollout: Rollout) -> ScoreInput:
        """``rollout`` as a scorer reads it (its texts decoded once, by the maker)."""
        return ScoreInput(
            rollout.prompts, rollout.responses, rollout.query, rollout.query_mask,
            rollout.response, rollout.response_mask, self.tokenizer.eos_token_id,
            rollout.prompt_columns, rollout.completions, rollout.environments,
            rollout.env_mask, rollout.episode_stats or None,
        )  # fmt: skip

    # ----------------------------------------------------------------- the trained models
    def model_attributes(self) -> dict[str, str]:
        attributes = {"model": "policy", "models.policy": "policy"}
        if self.models.critic is not None:
            attributes |= {"models.critic": "critic", "critic_engine": "critic"}
        return attributes

    def model_sources(self) -> dict[str, str]:
        critic = self.config.critic_start(self.tokenizer) if self.models.critic else None
        return {"policy": self.config.model, **({"critic": critic} if critic else {})}

    @property
    def trainable(self) -> nn.ModuleDict:
        """The trained models by name: the policy, and the separate critic if there is one."""
        return nn.ModuleDict(self.checkpoints.trained_models({}))

    def save_model(self, path: Path) -> None:
        """The policy with the tokenizer in ``path``; the critic in ``path/critic``, or the
        value head in ``path/value_head.safetensors``. With LoRA both are merged copies, so
        ``eval``, ``chat``, the next stage and stock transformers load them as plain models
        (with the tokenizer's added pad token, if any, in the saved vocabulary)."""
        policy, critic = self.models.policy, self.models.critic
        merged_copy(causal_lm(policy)).save_pretrained(path)
        self.tokenizer.save_pretrained(path)
        if critic is not None:
            merged_copy(critic).save_pretrained(path / "critic")
        elif isinstance(policy, ValueHeadLM):
            ckpt.save_state(policy.value_head.state_dict(), path / "value_head.safetensors")

    # ----------------------------------------------------------------- from a config
    @classmethod
    def from_config(cls, config: RLConfig) -> RLTrainer:
        """Load tokenizer, data, models and scorer as ``config`` says (the data first: a data
        error stops the run before any model is loaded)."""
        trust = config.trust_remote_code
        tokenizer = load_tokenizer(config.model, padding_side="left", trust_remote_code=trust)
        prompts, eval_prompts = load_rl_prompts(config, tokenizer)
        ptx = None
        if config.ptx_coef > 0:
            demos = load_records(config.ptx_data, "demonstrations")
            ptx, _ = encode_demonstrations(
                demos, tokenizer, config.ptx_max_length, chat_template=config.chat_template
            )
        set_seed(config.seed)  # a value head's initial weights, LoRA's
        models = load_rollout_models(
            config.model,
            tokenizer,
            critic=config.critic_start(tokenizer),
            value_head=config.critic == "value_head",
            reference=config.reference,
            has_reference=config.has_reference,
            lora=config.lora_settings,
            trust_remote_code=trust,
        )
        scorer = None
        if config.has_scorer:
            scorer = config.scorer(tokenizer=tokenizer, trust=config.trust_remote_code)
        return cls(
            config,
            models.policy,
            tokenizer,
            prompts,
            scorer,
            reference=models.reference,
            critic=models.critic,
            ptx_examples=ptx,
            eval_prompts=eval_prompts,
            environment=config.environment_factory(),
        )


def _check_inputs(config: RLConfig, policy, prompts, critic, ptx_examples) -> None:
    if config.critic == "value_head" and not isinstance(policy, ValueHeadLM):
        raise ValueError("critic='value_head' needs a ValueHeadLM policy")
    if (config.critic == "separate") != (critic is not None):
        raise ValueError(f"critic={config.critic!r}: a critic model given is {critic is not None}")
    if len(prompts) < config.rollout_batch_size:
        raise ValueError(f"{len(prompts)} prompts < rollout_batch_size={config.rollout_batch_size}")
    if config.ptx_coef > 0 and not ptx_examples:
        raise ValueError("ptx_coef > 0 needs ptx_examples")


def _with_lora_and_reference(
    config: RLConfig, policy: nn.Module, critic: nn.Module | None, reference: nn.Module | None
) -> tuple[nn.Module, nn.Module | None, nn.Module | None]:
    """The policy and critic with LoRA adapters where ``config.lora`` asks and they have
    none; the reference: as given, else (without LoRA, where a KL is measured) a copy of the
    starting policy, made before any step."""
    if config.lora and not is_lora_lm(causal_lm(policy)):
        if isinstance(policy, ValueHeadLM):
            raise ValueError("lora with a ValueHeadLM policy: give one whose LM has adapters")
        policy = add_lora(policy, **config.lora_settings)
        if critic is not None:
            critic = add_lora(critic, **config.lora_settings)
    if reference is None and not config.lora and config.has_reference:
        reference = copy.deepcopy(causal_lm(policy))
    return policy, critic, reference


def run_rl(config: RLConfig) -> Path:
    """Build an ``RLTrainer`` from ``config``, train it, and return the final model's
    directory (the ``rlhfkit ppo``, ``grpo``, ``rloo`` and ``reinforce++`` commands). A
    complete run is not loaded again."""
    if config.resume and ckpt.is_complete(config.output_dir):
        logger.info("%s is already complete; nothing to do", config.output_dir)
        return config.final_dir
    RLTrainer.from_config(config).train()
    return config.final_dir
