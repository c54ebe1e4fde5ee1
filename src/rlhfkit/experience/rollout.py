"""Making experience: the one ``Rollout`` record and the forward passes that fill it.

A rollout follows InstructGPT / Ziegler et al. 2019 as lm-human-preferences and TRL's
``PPOTrainer`` implement it: sample a response per prompt, then (no gradient, eval mode) run
ONE forward of the full query + response sequence through each of the policy, the frozen
reference and the critic, score the responses, shape per-token rewards (-beta * KL plus the
score at the last real token), and compute advantages by the estimator the settings name:
GAE over the critic's values (PPO), or a baseline without a critic (GRPO's group z-score,
RLOO's leave-one-out, REINFORCE++'s whitened returns). Every RL stage makes its experience
here and only here.

Sampling temperature: the behaviour policy samples from softmax(logits / T), so the log-probs
the update uses (rollout, reference and update alike) are computed from ``logits / T`` too, as
in lm-human-preferences and TRL; at T != 1 they are not the log-probs of the temperature-1
model. Departure shared with TRL: top-k / top-p filtering is not reflected in the log-probs
(the ratio and KL use the full softmax), so keep them off for RL unless you accept that bias.

``ExperienceMaker`` makes it; the passes themselves (inputs, response logits, critic values)
are in ``models/passes.py``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from rlhfkit.data import PromptColumns
from rlhfkit.errors import NonFiniteError
from rlhfkit.experience.episodes import (
    EpisodeOutput,
    EpisodeSettings,
    run_episodes,
    shown_stats,
)
from rlhfkit.experience.generation import GenerationOutput, SamplingConfig, generate
from rlhfkit.experience.rewards import RunningMoments, ScoreOptions, process_scores, shape_rewards
from rlhfkit.experience.scorers import ScoreInput, Scorer
from rlhfkit.models.loading import (
    ValueModel,
    check_vocabulary,
    freeze,
    load_causal_lm,
    model_device,
)
from rlhfkit.models.lora import add_lora, reference_mode
from rlhfkit.models.passes import (
    ValueHeadLM,
    causal_lm,
    critic_values,
    response_logprobs,
    sequence_inputs,
)
from rlhfkit.ops.advantages import (
    gae,
    group_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
)
from rlhfkit.ops.logprobs import entropy_from_logits
from rlhfkit.ops.masks import masked_mean, masked_var, masked_whiten
from rlhfkit.runtime.distributed import sum_over_ranks
from rlhfkit.runtime.machine import Runtime
from rlhfkit.runtime.packing import packing_enabled
from rlhfkit.runtime.parallel import run_parallel


@dataclass
class Rollout:
    """One batch of experience. Tensors share the batch dimension B; each field's shape and
    meaning is written beside it, and the library uses these names everywhere."""

    query: torch.Tensor  # (B, Tq) prompt ids, left-padded
    query_mask: torch.Tensor  # (B, Tq)
    response: torch.Tensor  # (B, Tr) sampled ids, pad after the first EOS
    # (B, Tr) 1 for the policy's tokens up to and including EOS (its last turn's, in an
    # episode), 0 for padding and for the environment's tokens
    response_mask: torch.Tensor
    # (B, Tr) log pi_old(token) at the sampling temperature; None when the policy's pass
    # was left to the update (one update from the sampling policy: pi_old is pi, detached)
    logprobs: torch.Tensor | None
    ref_logprobs: torch.Tensor | None  # (B, Tr) log pi_ref(token); None without a reference
    entropy: torch.Tensor | None  # (B, Tr) entropy of pi_old at each position (nats)
    values: torch.Tensor | None  # (B, Tr) critic values V(s_t); None without a critic
    raw_scores: torch.Tensor  # (B,) scorer output before penalty / normalisation / clipping
    scores: torch.Tensor  # (B,) the score added at the last real token
    kl: torch.Tensor | None  # (B, Tr) per-token KL(pi || ref) estimate used in the rewards
    rewards: torch.Tensor  # (B, Tr) -beta * kl + score at the last real token
    advantages: torch.Tensor  # (B, Tr) by the settings' estimator, whitened if configured
    returns: torch.Tensor | None  # (B, Tr) GAE advantages (before whitening) + values
    eos_emitted: torch.Tensor  # (B,) bool, False where the response ran out of tokens
    prompts: list[str]  # B decoded prompts
    responses: list[str]  # B decoded responses (special tokens removed)
    # (B,) bool, False for rows left out of the loss (their group's scores are all equal:
    # skip_uniform_groups; they ran out of tokens: mask_truncated); None keeps every row
    kept: torch.Tensor | None = None
    timings: dict[str, float] = field(default_factory=dict)  # seconds per phase
    # (B,) raw scores of each part of a scorer of several, by key (an ensemble's members, a
    # sum's terms: ``Scorer.scored``); {} for a scorer of one part
    score_parts: dict[str, torch.Tensor] = field(default_factory=dict)
    # the B prompts as the data wrote them and their rows' other columns (what reward
    # functions are given); None for prompts without data
    prompt_columns: PromptColumns | None = None
    # (B, Tr) 1 for the environment's tokens inside an episode (tool results, the other
    # side's messages): context every pass reads, never an action (no loss, KL, advantage);
    # None for one prompt and one response
    env_mask: torch.Tensor | None = None
    # what each episode did, by name (``episodes.EPISODE_STATS``), (B,) each; {} for bandits
    episode_stats: dict[str, torch.Tensor] = field(default_factory=dict)
    # each episode's messages after the prompt and the environment that played it; None for
    # bandits
    completions: list[list[dict]] | None = None
    environments: list | None = None

    def __len__(self) -> int:
        return self.query.shape[0]

    @property
    def loss_mask(self) -> torch.Tensor:
        """(B, Tr) the response tokens the loss counts: every real one of the kept rows."""
        if self.kept is None:
            return self.response_mask
        return self.response_mask * self.kept[:, None].to(self.response_mask.dtype)

    @property
    def attention_mask(self) -> torch.Tensor:
        """(B, Tr) every real response token, the policy's and the environment's."""
        if self.env_mask is None:
            return self.response_mask
        return self.response_mask | self.env_mask

    @property
    def sequences(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(query, query_mask, response, attention_mask): ``passes.sequence_inputs``'
        arguments, the environment's tokens of an episode included."""
        return self.query, self.query_mask, self.response, self.attention_mask

    def select(self, index: torch.Tensor) -> Rollout:
        """The rows ``index`` (a minibatch), with all-padding columns trimmed away.

        Trimming the query columns (left padding) and response columns (right padding) that
        no selected row uses saves compute and changes no masked result.
        """
        rows = index.tolist()
        picked = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "timings":  # of the whole batch
                continue
            if isinstance(value, dict):
                value = {key: part[index] for key, part in value.items()}
            elif isinstance(value, PromptColumns):
                value = value.select(rows)
            elif value is not None:
                value = [value[i] for i in rows] if isinstance(value, list) else value[index]
            picked[f.name] = value
        first = int(picked["query_mask"].any(0).nonzero().min())
        attention = picked["response_mask"]
        if picked["env_mask"] is not None:
            attention = attention | picked["env_mask"]
        end = int(attention.any(0).nonzero().max()) + 1
        for name in _QUERY_FIELDS:
            picked[name] = picked[name][:, first:]
        for name in _RESPONSE_FIELDS:
            if picked[name] is not None:
                picked[name] = picked[name][:, :end]
        return Rollout(**picked)

    @classmethod
    def concat(cls, rollouts: list[Rollout], pad_id: int) -> Rollout:
        """The rows of ``rollouts`` one after another (generation batches of one iteration):
        queries left-padded and responses right-padded to the widest, ids with ``pad_id``,
        the other per-token tensors with 0 (masked out everywhere they are read)."""
        if len(rollouts) == 1:
            return rollouts[0]
        joined: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            parts = [getattr(r, f.name) for r in rollouts]
            if f.name == "timings":
                joined[f.name] = {k: sum(p.get(k, 0.0) for p in parts) for k in parts[0]}
            elif f.name == "kept":
                joined[f.name] = _kept_rows(parts, rollouts)
            elif f.name in ("score_parts", "episode_stats"):
                joined[f.name] = {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
            elif f.name == "prompt_columns":
                joined[f.name] = None if parts[0] is None else PromptColumns.concat(parts)
            elif isinstance(parts[0], list):
                joined[f.name] = [item for part in parts for item in part]
            elif parts[0] is None:
                joined[f.name] = None
            elif f.name in _QUERY_FIELDS or f.name in _RESPONSE_FIELDS:
                fill = pad_id if f.name in ("query", "response") else 0
                joined[f.name] = _padded_cat(parts, fill, left=f.name in _QUERY_FIELDS)
            else:
                joined[f.name] = torch.cat(parts)
        return cls(**joined)

    def check_finite(self) -> None:
        """A `NonFiniteError` naming the first of the numbers PPO learns from that is NaN or
        inf: the scores, then the per-token tensors at real response tokens (padding may hold
        anything). One NaN there would turn the update's loss and then every weight into NaN."""
        require_finite_values("rollout scores", self.scores)
        for name in _CHECKED_FIELDS:
            if getattr(self, name) is not None:
                require_finite_values(f"rollout {name}", getattr(self, name), self.response_mask)


def _kept_rows(parts: list[torch.Tensor | None], rollouts: list[Rollout]) -> torch.Tensor | None:
    """The ``kept`` rows of rollouts joined: None if every part keeps every row."""
    if all(part is None for part in parts):
        return None
    every = [torch.ones(len(r), dtype=torch.bool, device=r.query.device) for r in rollouts]
    return torch.cat([e if p is None else p for p, e in zip(parts, every, strict=True)])


def _padded_cat(parts: list[torch.Tensor], fill: float, left: bool) -> torch.Tensor:
    """(B_i, T_i) tensors as one (sum B_i, max T_i), each padded with ``fill`` on the left
    (queries) or the right (responses)."""
    width = max(part.shape[1] for part in parts)
    padded = []
    for part in parts:
        extra = width - part.shape[1]
        padding = (extra, 0) if left else (0, extra)
        padded.append(torch.nn.functional.pad(part, padding, value=fill))
    return torch.cat(padded)


def require_finite_values(
    quantity: str, values: torch.Tensor, mask: torch.Tensor | None = None
) -> None:
    """A `NonFiniteError` naming ``quantity``, its first non-finite value and how many there
    are, where ``values`` (at ``mask``, if given) hold NaN or inf on any process. Every process
    calls it at the same point and all of them stop together (one collective on several)."""
    kept = values if mask is None else values[mask.bool()]
    bad = ~torch.isfinite(kept)
    count = int(sum_over_ranks(bad.sum()).item())
    if not count:
        return
    if bad.any():
        detail = f"{quantity} ({int(bad.sum())} of {kept.numel()} values not finite)"
        raise NonFiniteError(detail, kept[bad][0].item())
    raise NonFiniteError(f"{quantity} of another process", math.nan)


_CHECKED_FIELDS = ("logprobs", "ref_logprobs", "values", "kl", "rewards", "advantages", "returns")
ESTIMATORS = ("gae", "sequence", "grpo", "rloo", "reinforce++")  # by a critic, or without one
GROUP_ESTIMATORS = ("grpo", "rloo")
_QUERY_FIELDS = ("query", "query_mask")
_RESPONSE_FIELDS = (
    "response",
    "response_mask",
    "logprobs",
    "ref_logprobs",
    "entropy",
    "values",
    "kl",
    "rewards",
    "advantages",
    "returns",
    "env_mask",
)


@dataclass
class RolloutSettings:
    """How experience is made (each RL trainer fills it from its config).

    Attributes:
        sampling: sampling settings for the responses.
        kl_estimator: "k1" (InstructGPT), "k2" or "k3", for the per-token KL penalty.
        gamma, lam: GAE discount and lambda.
        estimator: the advantage estimator, by name (``ESTIMATORS``). With a critic: "gae"
            (a value per token, InstructGPT) or "sequence" (one value per response: the
            critic's value of the prompt is the baseline of every token's return to the end,
            A_t = G_t - V(prompt); GAE with that value at every token and lambda 1 computes
            it, the values telescoping away). Without one, from each response's total reward
            (its score less beta x its KL): "grpo" (the group's z-score, Shao et al. 2024;
            centred only without ``scale_by_std``: Dr. GRPO), "rloo" (minus the mean of the
            rest of the group, Ahmadian et al. 2024); or "reinforce++" (each token's return
            to the end, whitened over the batch, Hu 2025). The group estimators give every
            token of a response its response's advantage.
        group_size: responses per prompt, contiguous rows (the group estimators).
        scale_by_std: "grpo" only: divide by the group's std.
        skip_uniform_groups: leave the groups whose scores are all equal out of the loss
            (``Rollout.kept``; DAPO's dynamic sampling without the re-sampling).
        mask_truncated: leave the responses without EOS out of the loss (``Rollout.kept``;
            DAPO's overlong filtering); their scores still count in their group's baseline.
        whiten_advantages: normalise advantages over the batch (mean 0, std 1).
        policy_pass: run the policy's no-grad pass for pi_old. Off only where the update
            takes one step from the sampling policy, so that its own pass is pi_old; it runs
            anyway where the rewards read the policy's log-probs (a KL penalty) or a value
            head gives the values.
        scores: missing-EOS penalty, normalisation and clipping of scores.
        forward_batch_size: rows per forward pass after sampling; None = the whole batch.
        episodes: turns and token budget of an episode, where the maker has an environment.
    """

    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    kl_estimator: str = "k1"
    gamma: float = 1.0
    lam: float = 0.95
    estimator: str = "gae"
    group_size: int = 1
    scale_by_std: bool = True
    skip_uniform_groups: bool = False
    mask_truncated: bool = False
    whiten_advantages: bool = True
    policy_pass: bool = True
    scores: ScoreOptions = field(default_factory=ScoreOptions)
    forward_batch_size: int | None = None
    episodes: EpisodeSettings = field(default_factory=EpisodeSettings)

    def __post_init__(self) -> None:
        if self.estimator not in ESTIMATORS:
            raise ValueError(f"estimator={self.estimator!r} is not one of {ESTIMATORS}")

    @property
    def has_critic(self) -> bool:
        """Whether the estimator reads a critic's values."""
        return self.estimator in ("gae", "sequence")


@dataclass
class RolloutModels:
    """The models a rollout runs. ``reference=None`` means the policy with its LoRA adapter
    disabled, or, with ``has_reference=False``, no reference at all (no KL anywhere: GRPO
    with beta 0); ``critic=None`` means the policy is a ``ValueHeadLM`` if the estimator
    reads values, and no critic otherwise."""

    policy: nn.Module
    reference: nn.Module | None
    critic: nn.Module | None
    has_reference: bool = True

    @functools.cached_property
    def packed(self) -> bool:
        """Whether every model takes packed inputs (``packing.enable_packing``), so that the
        passes over query + response run on the real tokens only."""
        return all(packing_enabled(m) for m in (self.policy, self.reference, self.critic) if m)


def load_rollout_models(
    model: str,
    tokenizer,
    *,
    critic: str | None,
    value_head: bool = False,
    reference: str | None = None,
    has_reference: bool = True,
    lora: dict | None = None,
    trust_remote_code: bool = False,
) -> RolloutModels:
    """Policy from ``model``, frozen reference from ``reference`` (None: ``model`` too; none
    at all without ``has_reference``); the critic as a separate ``ValueModel`` from the
    checkpoint ``critic``, or with ``value_head`` a value head on the policy, or neither. Each
    gets a row for every id of ``tokenizer`` (``match_vocabulary``): the critic reads the
    policy's ids, the pad a tokenizer without one gained included.

    With ``lora`` (``add_lora`` arguments) policy and critic get adapters and the reference is
    the policy with its adapter disabled (``reference=None``), never a second copy.
    ``trust_remote_code`` lets the code the models ship run (``load_causal_lm``).
    """
    loading = {"tokenizer": tokenizer, "trust_remote_code": trust_remote_code}
    policy = load_causal_lm(model, **loading)
    reference_model = None
    if has_reference and not lora:
        reference_model = freeze(load_causal_lm(reference or model, **loading))
    if lora:
        policy = add_lora(policy, **lora)
    value_model = None
    if critic is not None:
        value_model = ValueModel.from_pretrained(critic, **loading)
        if lora:
            value_model = add_lora(value_model, **lora)
    elif value_head:
        policy = ValueHeadLM(policy)
    return RolloutModels(policy, reference_model, value_model, has_reference)


def _policy_pass(
    models: RolloutModels, inputs: dict, response: torch.Tensor, temperature: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(logprobs, entropy, values), each (b, Tr), of the policy for one chunk; values those of
    its value head, None without one."""
    logprobs, logits, values = response_logprobs(models.policy, inputs, response, temperature)
    entropy = entropy_from_logits(logits)  # (b, Tr)
    return logprobs, entropy, None if values is None else values.float()


def _reference_logprobs(
    models: RolloutModels, inputs: dict, response: torch.Tensor, temperature: float
) -> torch.Tensor:
    """ref_logprobs (b, Tr) for one chunk: the reference model, or the policy with its LoRA
    adapter disabled."""
    if models.reference is None:
        with reference_mode(causal_lm(models.policy)) as lm:
            return response_logprobs(lm, inputs, response, temperature).logprobs
    return response_logprobs(models.reference, inputs, response, temperature).logprobs


@dataclass
class ExperienceMaker:
    """What makes experience for every RL stage, in one object: the models, the scorer, the
    tokenizer, the settings and the runtime (device, precision, passes side by side on a CPU).

    ``make(query, query_mask)`` is one batch of experience, as a numbered recipe:
    1. sample a response per prompt from the policy;
    2. one no-grad pass of query + response through the policy and the critic (log-probs,
       entropy, values) and, beside them, through the reference, and score the responses;
    3. turn raw scores into the scores the update uses (missing-EOS penalty, normalisation,
       clipping);
    4. shape per-token rewards: -beta * KL each token, plus the score at the last real token;
    5. advantages by the estimator the settings name (GAE with the critic, or a group or
       batch baseline without one), whitened if asked; groups without signal marked.
    ``sample`` is step 1 alone: evaluation, best-of-n and the labelling tasks draw their
    responses from it (``sampler`` makes a maker for that alone).
    """

    models: RolloutModels
    scorer: Scorer | None
    tokenizer: Any
    settings: RolloutSettings
    runtime: Runtime
    # makes the environment of each episode (``episodes.environment_factory``); None: one
    # prompt, one response
    environment: Callable[[], Any] | None = None

    def __post_init__(self) -> None:
        """Refuse at once a model that has no embedding for some of the policy's ids, rather
        than meet an ``IndexError`` in the first pass that reads a pad."""
        readers = [("policy", self.models.policy), ("reference", self.models.reference)]
        readers += [("critic", self.models.critic)]
        readers += self.scorer.id_readers() if self.scorer is not None else []
        for role, model in readers:
            if model is not None:
                check_vocabulary(model, self.tokenizer, role)

    @classmethod
    def sampler(
        cls,
        policy: nn.Module,
        tokenizer,
        sampling: SamplingConfig,
        runtime: Runtime | None = None,
        environment: Callable[[], Any] | None = None,
        episodes: EpisodeSettings | None = None,
    ) -> ExperienceMaker:
        """A maker that only samples, or plays episodes with ``environment`` (no scorer),
        from ``policy`` on its own device, in fp32 unless ``runtime`` says otherwise."""
        if runtime is None:
            device = model_device(policy)
            runtime = Runtime.inference(device)
        models = RolloutModels(policy, reference=None, critic=None)
        settings = RolloutSettings(sampling=sampling, episodes=episodes or EpisodeSettings())
        return cls(models, None, tokenizer, settings, runtime, environment)

    def frozen_weights_cast(self) -> AbstractContextManager:
        """The frozen linear weights of every model the maker runs, the scorer's included,
        held in the autocast dtype for a block (``Runtime.frozen_weights_cast``)."""
        models = [self.models.policy, self.models.reference, self.models.critic]
        models += self.scorer.models() if self.scorer is not None else []
        return self.runtime.frozen_weights_cast(models)

    @torch.no_grad()
    def sample(
        self,
        query: torch.Tensor,
        query_mask: torch.Tensor,
        generator=None,
        sampling: SamplingConfig | None = None,
    ) -> GenerationOutput:
        """Step 1: a response per row of the left-padded ``query`` (B, Tq), every model in
        eval mode (the caller switches back); ``sampling`` in place of the settings' (a turn
        of an episode)."""
        for model in (self.models.policy, self.models.reference, self.models.critic):
            if model is not None:
                model.eval()
        with self.runtime.autocast():
            return generate(
                causal_lm(self.models.policy),
                query,
                query_mask,
                sampling or self.settings.sampling,
                eos_token_id=self.tokenizer.eos_token_id,
                pad_token_id=self.tokenizer.pad_token_id,
                generator=generator,
            )

    @torch.no_grad()
    def make(
        self,
        query: torch.Tensor,
        query_mask: torch.Tensor,
        *,
        kl_coef: float,
        moments: RunningMoments | None = None,
        generator: torch.Generator | None = None,
        prompt_columns: PromptColumns | None = None,
        env_seeds: Sequence[int] | None = None,
    ) -> Rollout:
        """Steps 1-5 on ``query``, ``query_mask`` (B, Tq), or with an environment on episodes
        from ``prompt_columns`` (reset with ``env_seeds``). ``kl_coef`` is the current beta,
        ``moments`` the running score statistics, ``generator`` the sampling random source,
        ``prompt_columns`` what the data says of each row. ``timings``: the seconds of
        ``generate``, ``forward`` (every pass and the scoring) and ``score`` (the scorer)."""
        settings, timings, started = self.settings, {}, time.perf_counter()
        step1 = self._sample_or_play(query, query_mask, generator, prompt_columns, env_seeds)
        query, query_mask, out = step1  # 1
        timings["generate"] = time.perf_counter() - started
        started = time.perf_counter()
        batch = self.score_input(query, query_mask, out, prompt_columns)
        policy_pass = settings.policy_pass or settings.has_critic or kl_coef > 0
        passes = self._passes(query, query_mask, out, batch, policy_pass)  # 2
        logprobs, entropy, values, ref_logprobs, scored, timings["score"] = passes
        raw_scores, score_parts = self._with_env_rewards(out, *scored)
        timings["forward"] = time.perf_counter() - started
        moments = moments or RunningMoments()
        scores = process_scores(raw_scores, out.eos_emitted, settings.scores, moments)  # 3
        mask = out.response_mask
        if logprobs is None or ref_logprobs is None:  # no KL measured: the score alone
            kl_coef = 0.0
        rewards, kl = self._rewards(scores, logprobs, ref_logprobs, mask, kl_coef)  # 4
        step5 = estimate_advantages(settings, scores, kl, kl_coef, rewards, values, mask)  # 5
        advantages, returns, values = step5
        return Rollout(
            query=query,
            query_mask=query_mask,
            response=out.response,
            response_mask=mask,
            logprobs=logprobs,
            ref_logprobs=ref_logprobs,
            entropy=entropy,
            values=values,
            raw_scores=raw_scores,
            scores=scores,
            kl=kl,
            rewards=rewards,
            advantages=advantages,
            returns=returns,
            eos_emitted=out.eos_emitted,
            prompts=batch.prompts,
            responses=batch.responses,
            kept=rows_in_loss(settings, scores, out.eos_emitted),
            timings=timings,
            score_parts=score_parts,
            prompt_columns=prompt_columns,
            **_episode_fields(batch),
        )

    def _sample_or_play(self, query, query_mask, generator, prompt_columns, env_seeds) -> tuple:
        """Step 1: (query, query_mask, out): a response per row of ``query``, or with an
        environment an episode per row of ``prompt_columns``, its query the episode's."""
        if self.environment is None:
            return query, query_mask, self.sample(query, query_mask, generator)
        out = self.play(prompt_columns, env_seeds, generator)
        return out.query, out.query_mask, out

    def _with_env_rewards(
        self, out: GenerationOutput, raw_scores: torch.Tensor, parts: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The raw scores: for episodes the environment's rewards plus the scorer's, if there
        is one, each then a part of them; the scorer's alone otherwise."""
        if not isinstance(out, EpisodeOutput):
            return raw_scores, parts
        env_rewards = out.env_rewards.to(raw_scores.dtype)
        if self.scorer is None:
            return env_rewards, {}
        return raw_scores + env_rewards, {
            "environment": env_rewards,
            **(parts or {"scorer": raw_scores}),
        }

    def play(
        self,
        starts: PromptColumns | None,
        seeds: Sequence[int] | None,
        generator: torch.Generator | None = None,
    ) -> EpisodeOutput:
        """Step 1 with an environment: an episode per row of ``starts`` (the prompts as the
        data wrote them and their columns), its environment reset with ``seeds``."""
        if starts is None:
            raise ValueError("episodes start from the data's prompts: give prompt_columns")
        seeds = list(seeds) if seeds is not None else [None] * len(starts)
        sampling = self.settings.sampling

        def turn(query, query_mask, max_new_tokens) -> GenerationOutput:
            turn_sampling = dataclasses.replace(sampling, max_new_tokens=max_new_tokens)
            return self.sample(query, query_mask, generator, turn_sampling)

        return run_episodes(
            turn,
            self.tokenizer,
            self.environment,
            starts,
            seeds,
            self.settings.episodes,
            sampling.max_new_tokens,
            self.runtime.device,
        )

    def score_input(self, query, query_mask, out, prompt_columns) -> ScoreInput:
        """What a scorer reads of a sample (``out``, of ``sample`` or ``play``): for episodes
        the whole episode as ids, the policy's last turn as the response text, the episode's
        messages, environments and statistics beside them."""
        if not isinstance(out, EpisodeOutput):
            return ScoreInput.from_ids(
                self.tokenizer, query, query_mask, out.response, out.response_mask, prompt_columns
            )
        return ScoreInput(
            prompts=self.tokenizer.batch_decode(query, skip_special_tokens=True),
            responses=out.answers,
            query=query,
            query_mask=query_mask,
            response=out.response,
            response_mask=out.response_mask,
            eos_token_id=self.tokenizer.eos_token_id,
            prompt_columns=prompt_columns,
            completions=out.completions,
            environments=out.environments,
            env_mask=out.env_mask,
            episode_stats=out.stats,
        )

    def _rewards(self, scores, logprobs, ref_logprobs, mask, kl_coef) -> tuple:
        """Step 4: (rewards, kl), (B, Tr) each; kl None where a log-prob is missing (no
        reference, or no policy pass), the rewards then the score alone."""
        if logprobs is None or ref_logprobs is None:
            zeros = torch.zeros(mask.shape, device=mask.device)
            return shape_rewards(scores, zeros, zeros, mask, 0.0)[0], None
        estimator = self.settings.kl_estimator
        return shape_rewards(scores, logprobs, ref_logprobs, mask, kl_coef, estimator)

    def _passes(
        self,
        query: torch.Tensor,
        query_mask: torch.Tensor,
        out: GenerationOutput,
        batch,
        policy_pass: bool,
    ) -> tuple:
        """Step 2: (logprobs, entropy, values, ref_logprobs) (B, Tr) each, raw scores (B,) and
        the scorer's seconds; logprobs and entropy None without ``policy_pass``, values
        without a critic or value head, ref_logprobs without a reference.

        When the runtime says so the passes run in two groups side by side, each on half the
        CPU's threads (``parallel.py``): the same numbers, sooner (docs/ppo.md). The policy
        module's passes go together: its own, and the reference's when that is the policy
        with its LoRA adapter off, the critic's then going beside them with the scorer;
        a separate reference goes beside the policy with the scorer, the critic with the
        policy. A group without a model pass beside the policy's gains nothing, so then
        everything runs in turn."""
        models, temperature = self.models, self.settings.sampling.temperature
        rows = torch.arange(len(query), device=query.device).split(
            self.settings.forward_batch_size or len(query)
        )
        sequences = (query, query_mask, out.response, batch.attention_mask)
        chunks = [
            (sequence_inputs(*(x[r] for x in sequences), packed=models.packed), out.response[r])
            for r in rows
        ]

        def policy() -> list[torch.Tensor | None]:  # logprobs, entropy, values of a value head
            parts = [_policy_pass(models, *chunk, temperature) for chunk in chunks]
            return [None if p[0] is None else torch.cat(p) for p in zip(*parts, strict=True)]

        def critic() -> torch.Tensor:
            width = out.response.shape[1]
            return torch.cat([critic_values(models.critic, c[0], width) for c in chunks]).float()

        def reference() -> torch.Tensor:
            return torch.cat([_reference_logprobs(models, *chunk, temperature) for chunk in chunks])

        def score() -> tuple[tuple[torch.Tensor, dict[str, torch.Tensor]], float]:
            started = time.perf_counter()
            if self.scorer is None:  # an environment's rewards alone
                return (torch.zeros(len(query), device=query.device), {}), 0.0
            return self.scorer.scored(batch), time.perf_counter() - started

        passes = {"score": score}
        if policy_pass:
            passes["policy"] = policy
            if models.critic is not None:
                passes["critic"] = critic
        if models.has_reference:
            passes["reference"] = reference
        results = self._run_in_groups(passes)
        logprobs, entropy, values = results.get("policy", [None, None, None])
        values = results.get("critic", values)
        return (logprobs, entropy, values, results.get("reference"), *results["score"])

    def _run_in_groups(self, passes: dict[str, Callable[[], Any]]) -> dict[str, Any]:
        """Each of ``passes`` (by name: policy, critic, reference, score) run under autocast,
        in two groups side by side where the runtime says so (``_passes``); their results."""
        with_policy = {"policy", "reference" if self.models.reference is None else "critic"}
        groups = [
            [n for n in passes if n in with_policy],
            [n for n in passes if n not in with_policy],
        ]

        def group(names: list[str]) -> Callable[[], dict]:
            def run() -> dict:
                with self.runtime.autocast():
                    return {name: passes[name]() for name in names}

            return run

        beside = self.runtime.side_by_side and bool({"critic", "reference"} & set(groups[1]))
        results = {}
        for part in run_parallel(
            [group(names) for names in groups], enabled=beside and all(groups)
        ):
            results.update(part)
        return results


def _episode_fields(batch: ScoreInput) -> dict[str, Any]:
    """The ``Rollout`` fields of episodes, as the scorer read them (None or {} for bandits)."""
    return {
        "env_mask": batch.env_mask,
        "episode_stats": batch.episode_stats or {},
        "completions": batch.completions,
        "environments": batch.environments,
    }


def estimate_advantages(
    settings: RolloutSettings,
    scores: torch.Tensor,
    kl: torch.Tensor | None,
    kl_coef: float,
    rewards: torch.Tensor,
    values: torch.Tensor | None,
    mask: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Step 5 of ``ExperienceMaker.make``: (advantages, returns, values), (B, Tr) each, by
    ``settings.estimator``; returns and values None without a critic.

    ``scores`` (B,) are the processed scores, ``kl`` (B, Tr) the per-token KL estimate (None
    where none was measured), ``kl_coef`` its weight in the ``rewards`` (B, Tr), ``values``
    (B, Tr) the critic's. The group estimators take each response's score less kl_coef x its
    summed KL (its total reward)."""
    if settings.estimator in GROUP_ESTIMATORS:
        totals = scores if kl is None or kl_coef == 0 else scores - kl_coef * kl.sum(1)
        if settings.estimator == "rloo":
            per_response = rloo_advantages(totals, settings.group_size)  # (B,)
        else:
            per_response = group_advantages(totals, settings.group_size, settings.scale_by_std)
        advantages = per_response[:, None].expand(mask.shape)  # (B, Tr)
        return _whitened(settings, advantages, mask), None, None
    if settings.estimator == "reinforce++":  # over this batch: its returns' own moments
        return reinforce_pp_advantages(rewards, mask), None, None
    lam = settings.lam
    if settings.estimator == "sequence":  # V(prompt), read at the first response token
        values, lam = values[:, :1].expand_as(values) * (mask != 0), 1.0
    advantages, returns = gae(rewards, values, mask, settings.gamma, lam)
    return _whitened(settings, advantages, mask), returns, values


def _whitened(settings: RolloutSettings, advantages: torch.Tensor, mask: torch.Tensor):
    """``advantages`` whitened over the whole batch, on every process, if ``settings`` ask."""
    if not settings.whiten_advantages:
        return advantages
    return masked_whiten(advantages, mask, reduce=sum_over_ranks)


def rows_in_loss(
    settings: RolloutSettings, scores: torch.Tensor, eos_emitted: torch.Tensor
) -> torch.Tensor | None:
    """(B,) bool: the rows the loss counts (``Rollout.kept``), those of groups whose scores
    differ where ``skip_uniform_groups``, that end in EOS where ``mask_truncated``; None when
    neither leaves any out."""
    kept = None
    if settings.skip_uniform_groups:
        kept = varied_groups(scores, settings.group_size)
    if settings.mask_truncated:
        kept = eos_emitted if kept is None else kept & eos_emitted
    return kept


def varied_groups(scores: torch.Tensor, group_size: int) -> torch.Tensor:
    """(B,) bool: True for the rows of the groups (``group_size`` contiguous rows) whose
    ``scores`` (B,) differ."""
    grouped = scores.view(-1, group_size)  # (P, k)
    varied = grouped.amax(dim=1) > grouped.amin(dim=1)  # (P,)
    return varied.repeat_interleave(group_size)


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """1 - Var(returns - values) / Var(returns) over real tokens: 1 is a perfect critic, 0 one
    that predicts no better than a constant (the diagnostic of OpenAI baselines)."""
    variance = masked_var(returns, mask).item()
    return (
        float("nan")
        if variance == 0
        else 1.0 - masked_var(returns - values, mask).item() / variance
    )


def rollout_stats(rollout: Rollout, group_size: int = 1) -> dict[str, float]:
    """What an RL run should show per iteration about its experience; with groups of
    ``group_size`` responses per prompt, how much their scores differ too."""
    mask = rollout.response_mask
    stats = {
        "score/mean": rollout.raw_scores.mean().item(),
        "score/std": rollout.raw_scores.std().item() if len(rollout) > 1 else 0.0,
        "score/processed_mean": rollout.scores.mean().item(),
        "reward/total": rollout.rewards.sum(1).mean().item(),
        "advantage/abs_mean": masked_mean(rollout.advantages.abs(), mask).item(),
        "response/length": mask.sum(1).float().mean().item(),
        "response/eos_rate": rollout.eos_emitted.float().mean().item(),
        **{f"time/{phase}": seconds for phase, seconds in rollout.timings.items()},
    }
    for key, values in shown_stats(rollout.episode_stats).items():
        stats[f"episode/{key}"] = values.float().mean().item()
    for key, scores in rollout.score_parts.items():
        stats[f"score/{key}/mean"] = scores.float().mean().item()
        stats[f"score/{key}/std"] = scores.float().std().item() if len(rollout) > 1 else 0.0
    if rollout.kl is not None:  # KL(pi || ref) per response: summed over its tokens
        stats["kl/ref"] = rollout.kl.sum(1).mean().item()
    if rollout.entropy is not None:
        stats["policy/entropy"] = masked_mean(rollout.entropy, mask).item()
    if rollout.values is not None:
        variance = explained_variance(rollout.values, rollout.returns, mask)
        stats["value/explained_variance"] = variance
    if group_size > 1:
        group_std = rollout.raw_scores.view(-1, group_size).std(dim=1)  # (P,)
        stats["score/group_std"] = group_std.mean().item()
        stats["score/groups_without_signal"] = (group_std == 0).float().mean().item()
    return stats
