"""PPO against a reward model: InstructGPT's step 3 (Ouyang et al. 2022, section 3.5).

Each iteration reads: generate -> score -> shape rewards -> GAE -> update (``rollout.py``
makes the experience, ``rewards.py`` the scores and per-token rewards, ``ops/`` every
formula). The update makes ``ppo_epochs`` passes over the rollout in shuffled minibatches,
with the clipped policy loss, the clipped value loss, an optional entropy bonus and an
optional PPO-ptx language-model term, as in lm-human-preferences and TRL's ``PPOTrainer``.

Models: the policy starts from the SFT model; the frozen reference is a second copy of it,
or with LoRA the same model with the adapter disabled (never a second copy). The critic is a
separate ``ValueModel`` initialised from the reward model (InstructGPT) or a value head on
the policy's trunk (``critic="value_head"``).

Departures from TRL 1.12: policy and critic have one AdamW each and their gradients are
clipped per model (the value loss's larger gradients would otherwise shrink the policy's
step); minibatch order comes from a seeded generator saved in checkpoints, so a resumed run
is exact; padding columns a minibatch does not use are trimmed before its forward pass.

Speed (measured on the issue's CPU workload, see benchmarks/bench_ppo.py): the LM head runs
only on response positions (``logits_to_keep``); optional bf16 autocast keeps fp32 weights,
optimiser and loss math; AdamW is the fused kernel; GPT-2's Python GELU is replaced by torch's
fused one (``models.prepare_model``); the rollout's entropy is logged instead of a per-
minibatch (b, Tr, V) entropy pass when there is no entropy bonus; on a CPU, policy and
separate critic learn side by side, each on half the cores (``parallel.py``).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import torch
from accelerate.utils import set_seed
from torch import nn

from rlhfkit.data import (
    IGNORE_INDEX,
    PromptCollator,
    SFTCollator,
    encode_demonstrations,
    encode_prompts,
    load_records,
)
from rlhfkit.models import atomic_dir, disable_dropout, freeze, load_tokenizer, prepare_model
from rlhfkit.ops.logprobs import entropy_from_logits, shifted_logprobs, token_logprobs
from rlhfkit.ops.losses import ppo_policy_loss, ppo_value_loss
from rlhfkit.ops.masks import masked_mean, position_ids_from_mask
from rlhfkit.parallel import run_parallel
from rlhfkit.rewards import (
    AdaptiveKLController,
    FixedKLController,
    RunningMoments,
    Scorer,
    as_scorer,
    build_scorer,
)
from rlhfkit.rollout import (
    Rollout,
    RolloutModels,
    ValueHeadLM,
    causal_lm,
    critic_values,
    load_rollout_models,
    make_rollout,
    response_logits,
    rollout_stats,
    sequence_inputs,
)
from rlhfkit.tracking import Tracker
from rlhfkit.trainers import checkpoint as ckpt
from rlhfkit.trainers.loop import OPTIMIZER_FILE, build_optimizer, build_scheduler, epoch_order
from rlhfkit.trainers.ppo_config import PPOConfig

logger = logging.getLogger(__name__)

WEIGHTS_FILE = "trainable.safetensors"
# The share of the policy's minibatches that run beside the critic's (one core each) before
# the rest run on all cores. Its step costs ~1.25x the critic's (the LM head and log-softmax);
# on benchmarks/bench_ppo.py's update, 13 of 16 beside the critic took 1.18 s, 16 of 16 1.29 s.
POLICY_SHARE_BESIDE_CRITIC = 0.8
RNG_FILE = "rng_state_0.safetensors"


@dataclasses.dataclass
class PPOState:
    """Where a PPO run is, besides weights, optimiser and random streams."""

    iteration: int = 0
    prompt_epoch: int = 0  # pass over the prompts
    prompt_index: int = 0  # rollout batches of the current pass already used
    ptx_epoch: int = 0  # pass over the ptx examples
    ptx_index: int = 0  # ptx micro-batches of the current pass already used
    total_iterations: int = 0
    complete: bool = False


@dataclasses.dataclass
class Learner:
    """One model the update trains, with its own AdamW and schedule: the policy, or the
    separate critic. With one optimiser each, the policy's and the critic's steps share
    nothing but the minibatches, so they can run side by side (``parallel.py``); AdamW is
    elementwise, so this is the same update as one optimiser over both."""

    name: str
    module: nn.Module
    loss: Callable[[Rollout], tuple[torch.Tensor, dict[str, float]]]
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler

    @classmethod
    def build(cls, name: str, module: nn.Module, loss, config: PPOConfig, steps: int) -> Learner:
        optimizer = build_optimizer(module, config)
        return cls(name, module, loss, optimizer, build_scheduler(optimizer, config, steps))

    def step(self, max_grad_norm: float | None) -> dict[str, float]:
        """Clip this model's gradients (the value loss's larger gradients would otherwise
        shrink the policy's step), step, and clear; the norm before clipping and the lr."""
        params = [p for p in self.module.parameters() if p.requires_grad]
        norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm or float("inf"))
        stats = {f"grad_norm/{self.name}": norm.item(), "lr": self.scheduler.get_last_lr()[0]}
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return stats


def _accumulate(totals: dict[str, float], values: dict[str, float], weight: float = 1.0) -> None:
    for key, value in values.items():
        totals[key] = totals.get(key, 0.0) + weight * value


class PPOTrainer:
    """PPO on ``prompts`` (token id lists) against ``scorer`` (a ``Scorer``, a reward model, or
    a Python function ``f(prompts, responses) -> list[float]``).

    ``reference=None`` needs a LoRA policy (the adapter is disabled for the reference);
    ``critic=None`` needs a ``ValueHeadLM`` policy. ``ptx_examples`` are ``SFTExample``s.
    """

    def __init__(
        self,
        config: PPOConfig,
        policy: nn.Module,
        tokenizer,
        prompts: list[list[int]],
        scorer: Scorer | nn.Module | Callable,
        *,
        reference: nn.Module | None = None,
        critic: nn.Module | None = None,
        ptx_examples: list | None = None,
    ) -> None:
        if critic is None and not isinstance(policy, ValueHeadLM):
            raise ValueError("critic=None needs a ValueHeadLM policy (critic='value_head')")
        if len(prompts) < config.rollout_batch_size:
            raise ValueError(
                f"{len(prompts)} prompts < rollout_batch_size={config.rollout_batch_size}"
            )
        if config.ptx_coef > 0 and not ptx_examples:
            raise ValueError("ptx_coef > 0 needs ptx_examples")
        self.config, self.tokenizer, self.prompts = config, tokenizer, prompts
        self.ptx_examples = ptx_examples or []
        # Not an accelerate.Accelerator: its state is a process-wide singleton whose precision
        # cannot change, and a pipeline runs fp32 SFT before a bf16 PPO in one process.
        device = torch.device("cuda" if torch.cuda.is_available() and not config.cpu else "cpu")
        self.device = device
        for model in (policy, reference, critic):
            if model is not None:
                model.to(device)
                prepare_model(model, config.attention)
                if config.disable_dropout:
                    disable_dropout(model)
        if reference is not None:
            freeze(reference)
        self.policy, self.critic = policy, critic
        self.scorer = as_scorer(scorer).to(device)
        self.models = RolloutModels(policy, reference, critic)
        self.trainable = nn.ModuleDict({"policy": policy, **({"critic": critic} if critic else {})})
        steps = config.total_optimizer_steps(len(prompts))
        losses = {"policy": self._policy_loss, "critic": self._critic_loss}
        self.learners = [
            Learner.build(name, module, losses[name], config, steps)
            for name, module in self.trainable.items()
        ]
        # Policy and critic side by side on the CPU's cores (``parallel.py``); on a GPU
        # their kernels queue on one device anyway.
        parallel = config.parallel_critic
        self.parallel = device.type == "cpu" if parallel is None else parallel
        self.kl_controller = (
            AdaptiveKLController(config.kl_coef, config.kl_target, config.kl_horizon)
            if config.adaptive_kl
            else FixedKLController(config.kl_coef)
        )
        self.moments = RunningMoments()
        self.sample_generator = torch.Generator(device).manual_seed(config.seed)
        self.shuffle_generator = torch.Generator().manual_seed(config.seed + 1)
        self.settings = config.rollout_settings
        self.state = PPOState(total_iterations=config.total_iterations(len(prompts)))
        self.output_dir = Path(config.output_dir)
        self._prepared = False  # resume / clean-up happen on the first train() call only

    def autocast(self) -> torch.autocast:
        """bf16 autocast when ``mixed_precision="bf16"`` (weights and loss math stay fp32)."""
        bf16 = self.config.mixed_precision == "bf16"
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=bf16)

    # ----------------------------------------------------------------- one iteration
    def step(self) -> tuple[dict[str, float], Rollout]:
        """One PPO iteration: make a rollout, then update on it. Returns metrics and rollout."""
        started = time.perf_counter()
        collate = PromptCollator(self.tokenizer.pad_token_id)
        batch = self._next("prompt", self.prompts, collate, self.config.rollout_batch_size)
        rollout = make_rollout(
            self.models,
            self.scorer,
            batch["query"],
            batch["query_mask"],
            self.tokenizer,
            self.settings,
            self.kl_controller.value,
            self.moments,
            self.sample_generator,
            self.autocast,
        )
        update_started = time.perf_counter()
        metrics = {**rollout_stats(rollout), **self.update(rollout)}
        metrics["kl/coef"] = self.kl_controller.value
        self.kl_controller.update(metrics["kl/ref"], len(rollout))
        metrics["time/update"] = time.perf_counter() - update_started
        metrics["time/iteration"] = time.perf_counter() - started
        return metrics, rollout

    def update(self, rollout: Rollout) -> dict[str, float]:
        """``ppo_epochs`` passes over ``rollout`` in shuffled minibatches: one optimiser step
        per minibatch and learner, over ``gradient_accumulation_steps`` micro-batches.
        Returns mean statistics."""
        self.trainable.train()
        cfg = self.config
        minibatches = []
        for _ in range(cfg.ppo_epochs):
            order = torch.randperm(len(rollout), generator=self.shuffle_generator)
            for minibatch in order.to(rollout.query.device).split(cfg.minibatch_size):
                micros = minibatch.split(cfg.batch_size)
                minibatches.append([rollout.select(micro) for micro in micros])
        policy, *others = self.learners
        beside = len(minibatches)
        if self.parallel and others:
            # Side by side the policy, whose LM head makes its step the longer, would finish
            # last: its last minibatches run on all threads once the critic is done.
            beside = math.ceil(len(minibatches) * POLICY_SHARE_BESIDE_CRITIC)
        tasks = [functools.partial(self._learn, policy, minibatches[:beside])]
        tasks += [functools.partial(self._learn, learner, minibatches) for learner in others]
        sums = run_parallel(tasks, enabled=self.parallel)
        _accumulate(sums[0], self._learn(policy, minibatches[beside:]))
        stats: dict[str, float] = {}
        for learner_sums in sums:  # disjoint keys but "lr", which all learners share
            stats |= {key: value / len(minibatches) for key, value in learner_sums.items()}
        return stats

    def _learn(self, learner: Learner, minibatches: list[list[Rollout]]) -> dict[str, float]:
        """``learner``'s optimiser steps, one per minibatch; the sums of its statistics."""
        accumulation = self.config.gradient_accumulation_steps
        sums: dict[str, float] = {}
        for micros in minibatches:
            for mb in micros:
                with self.autocast():
                    loss, stats = learner.loss(mb)
                (loss / accumulation).backward()
                _accumulate(sums, stats, 1 / accumulation)
            _accumulate(sums, learner.step(self.config.max_grad_norm))
        return sums

    def _policy_loss(self, mb: Rollout) -> tuple[torch.Tensor, dict[str, float]]:
        """The clipped policy loss of one micro-batch, minus the entropy bonus, plus ptx (and
        plus the value loss when the critic is a value head on the policy's trunk)."""
        cfg = self.config
        inputs = sequence_inputs(mb.query, mb.query_mask, mb.response, mb.response_mask)
        logits, values = response_logits(self.policy, inputs, mb.response.shape[1], cfg.temperature)
        mb_logprobs = token_logprobs(logits, mb.response)  # (b, Tr)
        mask = mb.response_mask
        loss, pg_stats = ppo_policy_loss(
            mb_logprobs, mb.logprobs, mb.advantages, mask, cfg.clip_range
        )
        stats = {
            "loss/policy": loss.item(),
            "policy/approx_kl": pg_stats["approx_kl"].item(),
            "policy/clipfrac": pg_stats["clipfrac"].item(),
            "policy/ratio": pg_stats["ratio"].item(),
        }
        if values is not None:
            value_loss, value_stats = self._value_loss(values, mb)
            loss = loss + value_loss
            stats |= value_stats
        if cfg.entropy_coef > 0:
            # Without a bonus the rollout's entropy is all that is logged: no (b, Tr, V) pass.
            entropy = masked_mean(entropy_from_logits(logits), mask)
            loss = loss - cfg.entropy_coef * entropy
            stats["loss/entropy"] = entropy.item()
        if cfg.ptx_coef > 0:
            ptx_loss = self._ptx_loss()
            loss = loss + cfg.ptx_coef * ptx_loss
            stats["loss/ptx"] = ptx_loss.item()
        return loss, stats

    def _critic_loss(self, mb: Rollout) -> tuple[torch.Tensor, dict[str, float]]:
        """The separate critic's share of the loss on one micro-batch."""
        inputs = sequence_inputs(mb.query, mb.query_mask, mb.response, mb.response_mask)
        return self._value_loss(critic_values(self.critic, inputs, mb.response.shape[1]), mb)

    def _value_loss(
        self, values: torch.Tensor, mb: Rollout
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """``vf_coef`` times the clipped value loss of ``values`` (b, Tr)."""
        cfg = self.config
        loss, clip_stats = ppo_value_loss(
            values.float(), mb.values, mb.returns, mb.response_mask, cfg.clip_range_value
        )
        stats = {"loss/value": loss.item(), "value/clipfrac": clip_stats["vf_clipfrac"].item()}
        return cfg.vf_coef * loss, stats

    def _ptx_loss(self) -> torch.Tensor:
        """InstructGPT's PPO-ptx term: the LM loss (response tokens) on one demonstration batch."""
        collate = SFTCollator(self.tokenizer.pad_token_id)
        batch = self._next("ptx", self.ptx_examples, collate, self.config.batch_size)
        mask = batch["attention_mask"]
        logits = causal_lm(self.policy)(
            input_ids=batch["input_ids"],
            attention_mask=mask,
            position_ids=position_ids_from_mask(mask),
            use_cache=False,
        ).logits  # (b, T, V)
        logprobs = shifted_logprobs(logits, batch["input_ids"])  # (b, T - 1)
        return -masked_mean(logprobs, batch["labels"][:, 1:] != IGNORE_INDEX)

    def _next(self, stream: str, examples: list, collate, size: int) -> dict[str, torch.Tensor]:
        """The next ``size`` examples of ``stream`` ("prompt" or "ptx"), collated. Each pass
        is a permutation drawn from (seed, pass) alone (an incomplete last batch is skipped),
        so a resumed run continues the same order."""
        epoch = getattr(self.state, f"{stream}_epoch")
        index = getattr(self.state, f"{stream}_index")
        if index >= max(len(examples) // size, 1):
            epoch, index = epoch + 1, 0
        order = epoch_order(len(examples), self.config.seed, epoch)
        setattr(self.state, f"{stream}_epoch", epoch)
        setattr(self.state, f"{stream}_index", index + 1)
        batch = collate([examples[int(i)] for i in order[index * size : (index + 1) * size]])
        return {k: v.to(self.device) for k, v in batch.items() if torch.is_tensor(v)}

    # ----------------------------------------------------------------- the run
    def train(self, stop_after: int | None = None) -> PPOState:
        """Run to ``total_iterations`` (resuming from the newest checkpoint if configured);
        ``stop_after`` makes at most that many iterations, then checkpoints and returns."""
        if not self._prepared:
            self._prepared = True
            if self._prepare_run():
                return self.state
        total = self.state.total_iterations
        target = total if stop_after is None else min(total, self.state.iteration + stop_after)
        tracker = Tracker(
            self.output_dir, resume_step=self.state.iteration, tensorboard=self.config.tensorboard
        )
        tracker.start_progress(total, self.state.iteration, "PPO")
        sums: dict[str, float] = {}
        try:
            while self.state.iteration < target:
                metrics, rollout = self.step()
                self.state.iteration += 1
                tracker.advance()
                _accumulate(sums, metrics)
                it = self.state.iteration
                if it % self.config.log_every == 0 or it == target:
                    count = it % self.config.log_every or min(self.config.log_every, it)
                    # Under train/, as every trainer of the shared loop logs.
                    tracker.log({f"train/{k}": v / count for k, v in sums.items()}, it)
                    sums = {}
                if it == 1 or it % self.config.sample_every == 0:
                    tracker.log_samples(self._samples(rollout), it)
                if self.config.save_every and it % self.config.save_every == 0:
                    self.save_checkpoint()
            if self.state.iteration < total:
                self.save_checkpoint()
            else:
                self._finish(tracker)
        finally:
            tracker.close()
        return self.state

    def _samples(self, rollout: Rollout) -> list[dict]:
        scores = rollout.raw_scores.tolist()
        rows = range(min(self.config.num_samples, len(rollout)))
        return [
            {"prompt": rollout.prompts[i], "response": rollout.responses[i], "score": scores[i]}
            for i in rows
        ]

    def _prepare_run(self) -> bool:
        """Resume or clear ``output_dir``; True if the run is already complete."""
        if self.config.resume:
            if ckpt.is_complete(self.output_dir):
                logger.info("%s holds a finished run; skipping", self.output_dir)
                self.state.complete = True
                return True
            latest = ckpt.latest_checkpoint(self.output_dir)
            if latest is not None:
                self.load_checkpoint(latest)
        else:
            for old in [*ckpt.checkpoint_dirs(self.output_dir), self.output_dir / "final"]:
                logger.warning("resume=False: deleting %s", old)
                shutil.rmtree(old, ignore_errors=True)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        ckpt.write_json(self.config.to_dict(), self.output_dir / "train_config.json")
        return False

    def _finish(self, tracker: Tracker) -> None:
        self.save_checkpoint()
        self.state.complete = True
        with atomic_dir(self.config.final_dir) as tmp:
            self.save_models(tmp)
            ckpt.write_json(self._state_json(), tmp / ckpt.STATE_FILE)
        keys = ("score/mean", "kl/ref", "policy/entropy", "value/explained_variance")
        keys = tuple(f"train/{key}" for key in keys)
        tracker.plot(keys, self.output_dir / "curves.png")
        logger.info("finished: final policy in %s", self.config.final_dir)

    def save_models(self, path: Path) -> None:
        """The policy with the tokenizer in ``path`` (with LoRA: the adapter, which
        ``from_pretrained`` loads onto its base), the critic in ``path/critic`` (or the value
        head in ``path/value_head.safetensors``)."""
        causal_lm(self.policy).save_pretrained(path)
        self.tokenizer.save_pretrained(path)
        if self.critic is not None:
            self.critic.save_pretrained(path / "critic")
        else:
            ckpt.save_state(self.policy.value_head.state_dict(), path / "value_head.safetensors")

    # ----------------------------------------------------------------- checkpoints
    def _state_json(self) -> dict:
        return {
            **dataclasses.asdict(self.state),
            "scheduler": {
                learner.name: learner.scheduler.state_dict() for learner in self.learners
            },
            "kl_controller": self.kl_controller.state_dict(),
            "score_moments": self.moments.state_dict(),
            "config": self.config.to_dict(),
        }

    def save_checkpoint(self) -> Path:
        """``checkpoint-<iteration>``: trainable weights, optimiser, random streams, state."""
        path = self.output_dir / f"{ckpt.CHECKPOINT_PREFIX}{self.state.iteration}"
        weights = {k: p for k, p in self.trainable.named_parameters() if p.requires_grad}
        rng = {
            **ckpt.rng_state(),
            "sample": self.sample_generator.get_state(),
            "shuffle": self.shuffle_generator.get_state(),
        }
        with atomic_dir(path) as tmp:
            ckpt.save_state(weights, tmp / WEIGHTS_FILE)
            optimizers = {learner.name: learner.optimizer.state_dict() for learner in self.learners}
            ckpt.save_state(optimizers, tmp / OPTIMIZER_FILE)
            ckpt.save_state(rng, tmp / RNG_FILE)
            ckpt.write_json(self._state_json(), tmp / ckpt.STATE_FILE)
        ckpt.rotate_checkpoints(self.output_dir, self.config.keep_last)
        logger.info("saved checkpoint %s", path)
        return path

    def load_checkpoint(self, path: Path) -> None:
        """Restore everything ``save_checkpoint`` wrote, for an exact continuation."""
        weights = ckpt.load_state(path / WEIGHTS_FILE)
        with torch.no_grad():
            for name, param in self.trainable.named_parameters():
                if param.requires_grad:
                    param.copy_(weights[name])
        optimizers = ckpt.load_state(path / OPTIMIZER_FILE)
        saved = ckpt.read_json(path / ckpt.STATE_FILE)
        for learner in self.learners:
            learner.optimizer.load_state_dict(optimizers[learner.name])
            learner.scheduler.load_state_dict(saved["scheduler"][learner.name])
        self.kl_controller.load_state_dict(saved["kl_controller"])
        self.moments.load_state_dict(saved["score_moments"])
        fields = {f.name for f in dataclasses.fields(PPOState)}
        self.state = PPOState(**{k: v for k, v in saved.items() if k in fields})
        self.state.total_iterations = self.config.total_iterations(len(self.prompts))
        rng = ckpt.load_state(path / RNG_FILE)
        self.sample_generator.set_state(rng.pop("sample"))
        self.shuffle_generator.set_state(rng.pop("shuffle"))
        ckpt.set_rng_state(rng)
        logger.info("resumed from %s at iteration %d", path, self.state.iteration)

    # ----------------------------------------------------------------- from a config
    @classmethod
    def from_config(cls, config: PPOConfig) -> PPOTrainer:
        """Load tokenizer, models, scorer and data as ``config`` says."""
        set_seed(config.seed)
        tokenizer = load_tokenizer(config.model, padding_side="left")
        critic = None
        if config.critic == "separate":
            critic = config.critic_model or config.reward_model or config.model
        models = load_rollout_models(
            config.model,
            tokenizer,
            critic=critic,
            lora=config.lora_settings,
        )
        records = load_records(config.train_data, "prompts", split=config.train_split)
        prompts, _ = encode_prompts(records, tokenizer, config.max_prompt_length)
        ptx = None
        if config.ptx_coef > 0:
            demos = load_records(config.ptx_data, "demonstrations")
            ptx, _ = encode_demonstrations(demos, tokenizer, config.ptx_max_length)
        scorer = build_scorer(config.reward_model, config.reward_functions, config.reward_weights)
        return cls(
            config,
            models.policy,
            tokenizer,
            prompts,
            scorer,
            reference=models.reference,
            critic=models.critic,
            ptx_examples=ptx,
        )


def run_ppo(config: PPOConfig) -> Path:
    """Build a ``PPOTrainer`` from ``config``, train it, return the final model's directory
    (the ``rlhfkit ppo`` command)."""
    PPOTrainer.from_config(config).train()
    return config.final_dir
