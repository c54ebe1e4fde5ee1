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

Speed (docs/ppo.md): passes on real tokens only (``packing.py``), LM head on response positions,
optional bf16 autocast (fp32 weights, optimiser, loss math), the fused GELU, and on a CPU
independent model work side by side on half the cores each (``ppo_update.py``, ``rollout.py``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

import torch
from accelerate.utils import set_seed
from torch import nn

from rlhfkit import checkpoint as ckpt
from rlhfkit.data import (
    IGNORE_INDEX,
    PromptCollator,
    SFTCollator,
    encode_demonstrations,
    load_prompts,
    load_records,
)
from rlhfkit.experience.rewards import AdaptiveKLController, FixedKLController, RunningMoments
from rlhfkit.experience.rollout import (
    Rollout,
    RolloutModels,
    load_rollout_models,
    make_rollout,
    rollout_stats,
)
from rlhfkit.experience.scorer_loading import build_scorer
from rlhfkit.experience.scorers import Scorer, as_scorer
from rlhfkit.models.loading import disable_dropout, freeze, load_tokenizer, prepare_model
from rlhfkit.models.passes import (
    ValueHeadLM,
    causal_lm,
    critic_values,
    response_logits,
    sequence_inputs,
)
from rlhfkit.ops.logprobs import entropy_from_logits, shifted_logprobs, token_logprobs
from rlhfkit.ops.losses import ppo_policy_loss, ppo_value_loss
from rlhfkit.ops.masks import masked_mean, position_ids_from_mask
from rlhfkit.runtime.allocator import retain_freed_memory
from rlhfkit.tracking import Tracker, format_metrics
from rlhfkit.trainers.loop import WATCH_RL, epoch_order
from rlhfkit.trainers.ppo_checkpoint import PPOCheckpoints, PPOState
from rlhfkit.trainers.ppo_config import PPOConfig
from rlhfkit.trainers.ppo_update import (
    Learner,
    accumulate,
    shuffled_minibatches,
    update_learners,
)

logger = logging.getLogger(__name__)

EVAL_KEYS = ("score", "kl", "length")  # PPOTrainer.evaluate's, logged under eval/


class PPOTrainer(PPOCheckpoints):
    """PPO on ``prompts`` (token id lists) against ``scorer`` (a ``Scorer``, a reward model, or
    a Python function ``f(prompts, responses) -> list[float]``).

    ``reference=None`` needs a LoRA policy (the adapter is disabled for the reference);
    ``critic=None`` needs a ``ValueHeadLM`` policy. ``ptx_examples`` are ``SFTExample``s;
    ``eval_prompts`` (token id lists) are scored every ``eval_every`` iterations and at the end.
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
        eval_prompts: list[list[int]] | None = None,
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
        self.eval_prompts = eval_prompts or []
        # Not an accelerate.Accelerator: its state is a process-wide singleton whose precision
        # cannot change, and a pipeline runs fp32 SFT before a bf16 PPO in one process.
        device = torch.device("cuda" if torch.cuda.is_available() and not config.cpu else "cpu")
        self.device = device
        retain_freed_memory(device)  # no page faults on each step's activations
        for model in (policy, reference, critic):
            if model is not None:
                model.to(device)
                prepare_model(model, config.attention, packed=config.padding_free)
                if config.disable_dropout:
                    disable_dropout(model)
        if reference is not None:
            freeze(reference)
        self.policy, self.critic = policy, critic
        self.scorer = as_scorer(scorer).to(device)
        for model in self.scorer.models():  # a reward model: the same GELU and attention
            prepare_model(model, config.attention, packed=config.padding_free)
        self.models = RolloutModels(policy, reference, critic)
        self.packed = self.models.packed  # the update's passes as the rollout's
        self.trainable = nn.ModuleDict({"policy": policy, **({"critic": critic} if critic else {})})
        steps = config.total_optimizer_steps(len(prompts))
        losses = {"policy": self._policy_loss, "critic": self._critic_loss}
        self.learners = [
            Learner.build(name, module, losses[name], config, steps, self.autocast)
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
            self.parallel,
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
        minibatches = shuffled_minibatches(
            rollout, cfg.ppo_epochs, cfg.minibatch_size, cfg.batch_size, self.shuffle_generator
        )
        return update_learners(self.learners, minibatches, self.parallel)

    def _policy_loss(self, mb: Rollout) -> tuple[torch.Tensor, dict[str, float]]:
        """The clipped policy loss of one micro-batch, minus the entropy bonus, plus ptx (and
        plus the value loss when the critic is a value head on the policy's trunk)."""
        cfg = self.config
        inputs = sequence_inputs(*mb.sequences, packed=self.packed)
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
        inputs = sequence_inputs(*mb.sequences, packed=self.packed)
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
        tracker.start_progress(total, self.state.iteration, "PPO", WATCH_RL)
        sums: dict[str, float] = {}
        try:
            while self.state.iteration < target:
                metrics, rollout = self.step()
                self.state.iteration += 1
                tracker.advance()
                accumulate(sums, metrics)
                it = self.state.iteration
                if it % self.config.log_every == 0 or it == target:
                    count = it % self.config.log_every or min(self.config.log_every, it)
                    tracker.log({f"train/{k}": v / count for k, v in sums.items()}, it)
                    sums = {}
                if it == 1 or it % self.config.sample_every == 0:
                    tracker.log_samples(self._samples(rollout), it)
                if it == total or (self.config.eval_every and it % self.config.eval_every == 0):
                    evaluation = self.evaluate()
                    tracker.log({f"eval/{k}": v for k, v in evaluation.items()}, it)
                    logger.info("eval iteration %d: %s", it, format_metrics(evaluation))
                if self.config.save_every and it % self.config.save_every == 0:
                    self.save_checkpoint()
            if self.state.iteration < total:
                self.save_checkpoint()
            else:
                self._finish(tracker)
        finally:
            tracker.close()
        return self.state

    def evaluate(self) -> dict[str, float]:
        """One fixed-seed sample per held-out prompt: the mean raw score, KL to the reference
        (summed over the response, as ``kl/ref``) and length. Training's random streams, score
        statistics and KL coefficient are left as they were."""
        if not self.eval_prompts:
            return {}
        generator = torch.Generator(self.device).manual_seed(self.config.seed + 2)
        collate = PromptCollator(self.tokenizer.pad_token_id)
        size, sums = self.config.eval_batch_size, {}
        with ckpt.preserved_rng():
            for start in range(0, len(self.eval_prompts), size):
                batch = collate(self.eval_prompts[start : start + size])
                query, mask = batch["query"].to(self.device), batch["query_mask"].to(self.device)
                rollout = make_rollout(
                    self.models,
                    self.scorer,
                    query,
                    mask,
                    self.tokenizer,
                    self.settings,
                    0.0,
                    RunningMoments(),
                    generator,
                    self.autocast,
                    self.parallel,
                )
                totals = (rollout.raw_scores, rollout.kl, rollout.response_mask)
                accumulate(
                    sums, {k: t.sum().item() for k, t in zip(EVAL_KEYS, totals, strict=True)}
                )
        return {key: value / len(self.eval_prompts) for key, value in sums.items()}

    def _samples(self, rollout: Rollout) -> list[dict]:
        rows = zip(rollout.prompts, rollout.responses, rollout.raw_scores.tolist(), strict=True)
        kept = list(rows)[: self.config.num_samples]
        return [{"prompt": p, "response": r, "score": s} for p, r, s in kept]

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
        prompts = load_prompts(
            config.train_data, config.train_split, tokenizer, config.max_prompt_length, None
        )
        eval_prompts = config.eval_data and load_prompts(
            config.eval_data,
            config.eval_split,
            tokenizer,
            config.max_prompt_length,
            config.max_eval_samples,
        )
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
            eval_prompts=eval_prompts,
        )


def run_ppo(config: PPOConfig) -> Path:
    """Build a ``PPOTrainer`` from ``config``, train it, return the final model's directory
    (the ``rlhfkit ppo`` command)."""
    PPOTrainer.from_config(config).train()
    return config.final_dir
