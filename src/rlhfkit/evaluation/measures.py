"""Measures of policies on held-out prompts: gold score, reward, KL to the reference, win
rate, length and diversity; best-of-n at several n; reward-model accuracy. The ``rlhfkit
eval`` command that runs them over saved models is ``evaluate.py``.

What is measured follows the papers whose pictures it reproduces:

- Gold and proxy (reward-model) score against KL(pi || ref), the over-optimisation picture of
  Gao et al. 2022, "Scaling Laws for Reward Model Overoptimization". The KL of a sampled policy
  is the Monte-Carlo estimate on its own samples, sum over response tokens of
  log pi(y_t | ...) - log ref(y_t | ...), averaged over samples (Stiennon et al. 2020 report
  the same quantity). The reference is the SFT model.
- Best-of-n (Nakano et al. 2021; Stiennon et al. 2020): the KL of the best-of-n policy to the
  sampling policy is the analytic log n - (n - 1) / n (Gao et al. 2022, eq. 1), an upper bound
  that is tight for continuous score distributions. Gold and proxy at each n use the unbiased
  estimator of Nakano et al. (WebGPT, appendix): from a pool of N >= n samples per prompt, the
  expected score of the proxy's pick over all n-subsets of the pool, instead of one draw.
- Win rate against the SFT model, paired by prompt (InstructGPT's preference against a
  baseline): a win counts 1, a tie 1/2.
- The gold gain over the SFT model, paired by prompt: the mean of the per-prompt differences
  and its standard error. Both models answer the same prompts, so the prompts' difficulty,
  shared by the two, cancels: the paired error is smaller than the two models' own errors
  combined, and it is the one that says whether a gain is more than noise.
- Diversity: corpus distinct-1/2 (Li et al. 2016) via ``tasks.distinct_n``.
- Where a task's gold score is made of checkable parts (the constraint kinds of the
  instructions task, as IFEval's per-instruction accuracy, Zhou et al. 2023), the share of
  each model's responses meeting each part, among the prompts that ask for it, and pooled over
  the parts held out of training and over the rest (``pass_rates``); and where the task
  says which shapes a prompt leaves unasked (all lowercase, a list), the share of each
  model's responses that take them anyway, a side effect the gold score does not see
  (``unasked_rates``).

Every model samples with the same seed and the same prompts, so two runs of the same model
give the same numbers. Sampling is at the training temperature (1 by default) without top-k /
top-p, so the samples come from the distribution whose KL is measured.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from rlhfkit.data import PairCollator, PromptExample, encode_comparisons, ranked_scores
from rlhfkit.experience.episodes import EpisodeSettings, shown_stats, transcript
from rlhfkit.experience.generation import SamplingConfig
from rlhfkit.experience.scorers import (
    EnsembleScorer,
    FunctionScorer,
    RewardModelScorer,
    ScoreInput,
    Scorer,
)
from rlhfkit.interact.sampling import (
    best_of_n_expected,
    best_of_n_kl,
    sample_responses,
)
from rlhfkit.models.lora import reference_mode
from rlhfkit.models.passes import response_logprobs, sequence_inputs
from rlhfkit.ops.masks import masked_sum
from rlhfkit.runtime.machine import Runtime
from rlhfkit.tasks import REWARD_FUNCTIONS, Breakdown, distinct_n, ifeval
from rlhfkit.tasks.completions import prompt_text


# --------------------------------------------------------------------------- pure metrics
def win_rate(scores: torch.Tensor, baseline: torch.Tensor) -> float:
    """Share of prompts where ``scores`` (P,) beats ``baseline`` (P,), ties counting 1/2."""
    if scores.shape != baseline.shape:
        raise ValueError(f"win_rate: shapes {tuple(scores.shape)} and {tuple(baseline.shape)}")
    wins = (scores > baseline).float() + 0.5 * (scores == baseline).float()
    return wins.mean().item()


@torch.no_grad()
def response_logprob(model: nn.Module, batch: ScoreInput, temperature: float = 1.0):
    """log pi(response | query) per row (B,): the sum of the log-probs of the policy's
    response tokens (an episode's environment tokens are context, not its)."""
    inputs = sequence_inputs(batch.query, batch.query_mask, batch.response, batch.attention_mask)
    logprobs = response_logprobs(model, inputs, batch.response, temperature).logprobs  # (B, Tr)
    return masked_sum(logprobs.float(), batch.response_mask, dim=1)  # (B,)


@torch.no_grad()
def sample_kl(
    policy: nn.Module,
    reference: nn.Module | None,
    batches: Sequence[ScoreInput],
    temperature: float = 1.0,
) -> torch.Tensor:
    """Per-sample KL estimate log pi(y|x) - log ref(y|x), (N,), on samples y ~ pi.

    ``reference=None``: the policy with its LoRA adapter disabled (``lora.reference_mode``).
    Computed at the precision of the surrounding autocast, which must be the one the samples
    were drawn at: a model trained under bf16 autocast is, in float32, a different model
    (docs/instructions.md, "Measuring KL"), and samples of one view scored by the other
    estimate no KL at all.
    """
    policy.eval()
    kls = []
    for batch in batches:
        logp = response_logprob(policy, batch, temperature)  # (B,)
        if reference is None:
            with reference_mode(policy) as ref:
                ref_logp = response_logprob(ref, batch, temperature)
        else:
            reference.eval()
            ref_logp = response_logprob(reference, batch, temperature)
        kls.append((logp - ref_logp).cpu())
    return torch.cat(kls)


def score_batches(scorer: Scorer, batches: Sequence[ScoreInput]) -> torch.Tensor:
    """Scores (N,) of every sample, on the CPU."""
    return torch.cat([scorer(batch).cpu() for batch in batches])


# --------------------------------------------------------------------------- one policy
@dataclass
class PolicySamples:
    """Samples of one policy with their scores; tensors (N,), one entry per sample."""

    prompts: list[str]
    responses: list[str]
    length: torch.Tensor  # response tokens, EOS included
    kl: torch.Tensor | None = None
    reward: torch.Tensor | None = None
    gold: torch.Tensor | None = None
    # what each episode did (``episodes.EPISODE_STATS``); None for one response per prompt
    episodes: dict[str, torch.Tensor] | None = None

    def first(self, count: int) -> PolicySamples:
        """The first ``count`` samples."""
        tensors = (None if t is None else t[:count] for t in (self.kl, self.reward, self.gold))
        episodes = None
        if self.episodes is not None:
            episodes = {key: values[:count] for key, values in self.episodes.items()}
        return PolicySamples(
            self.prompts[:count], self.responses[:count], self.length[:count], *tensors, episodes
        )


def _mean(x: torch.Tensor | None) -> float | None:
    return None if x is None else x.float().mean().item()


def standard_error(x: torch.Tensor | None) -> float | None:
    """The standard error of the mean of ``x`` (None for fewer than two values)."""
    if x is None or len(x) < 2:
        return None
    return (x.float().std() / math.sqrt(len(x))).item()


def paired_difference(
    scores: torch.Tensor | None, baseline: torch.Tensor | None
) -> tuple[float | None, float | None]:
    """The mean of ``scores - baseline`` (P,), paired by prompt, and its standard error;
    (None, None) where either is missing."""
    if scores is None or baseline is None:
        return None, None
    if scores.shape != baseline.shape:
        raise ValueError(
            f"paired_difference: shapes {tuple(scores.shape)}, {tuple(baseline.shape)}"
        )
    difference = scores.float() - baseline.float()
    return _mean(difference), standard_error(difference)


def summarize(name: str, samples: PolicySamples, baseline: PolicySamples | None) -> dict:
    """One row of the results table (None where a scorer or the baseline is missing)."""

    def wins(key: str) -> float | None:
        mine, theirs = getattr(samples, key), getattr(baseline, key, None)
        return None if mine is None or theirs is None else win_rate(mine, theirs)

    gain, gain_se = paired_difference(samples.gold, getattr(baseline, "gold", None))
    return {
        "model": name,
        **episode_figures(samples),
        "gold": _mean(samples.gold),
        "gold_se": standard_error(samples.gold),
        "gold_gain": gain,
        "gold_gain_se": gain_se,
        "reward": _mean(samples.reward),
        "kl": _mean(samples.kl),
        "win_rate_rm": wins("reward"),
        "win_rate_gold": wins("gold"),
        "length": _mean(samples.length),
        "distinct_1": distinct_n(samples.responses, 1),
        "distinct_2": distinct_n(samples.responses, 2),
    }


EPISODE_FIGURES = ("turns", "tool_calls", "tool_errors", "truncated")
"""What the results table shows of episodes: means per episode, with standard errors."""


def episode_figures(samples: PolicySamples) -> dict[str, float | None]:
    """Turns, tool calls and failed tool calls (where the episodes had tools) and the share
    cut short, per episode, each with its standard error, and the turns of the episodes that
    succeeded (gold > 0); {} for samples that are no episodes."""
    if samples.episodes is None:
        return {}
    figures: dict[str, float | None] = {}
    shown = shown_stats(samples.episodes)  # no tool figures for episodes without tools
    for key in (key for key in EPISODE_FIGURES if key in shown):
        values = shown[key]
        figures[key], figures[f"{key}_se"] = _mean(values), standard_error(values)
    if samples.gold is not None:
        won = samples.episodes["turns"][samples.gold > 0]
        figures["turns_to_success"] = _mean(won) if len(won) else None
        figures["turns_to_success_se"] = standard_error(won)
    return figures


def evaluate_samples(
    batches: Sequence[ScoreInput],
    *,
    policy: nn.Module | None = None,
    reference: nn.Module | None = None,
    reward: Scorer | None = None,
    gold: Scorer | None = None,
    temperature: float = 1.0,
) -> PolicySamples:
    """Score samples of ``policy``: KL to ``reference`` (when a policy is given), reward,
    gold. ``reference=None`` with a LoRA policy uses the adapter-disabled policy."""
    kl = None
    if policy is not None:
        kl = sample_kl(policy, reference, batches, temperature)
    episodes = None
    if batches and batches[0].episode_stats is not None:
        keys = batches[0].episode_stats
        episodes = {k: torch.cat([b.episode_stats[k].cpu() for b in batches]) for k in keys}
    return PolicySamples(
        prompts=[p for b in batches for p in b.prompts],
        responses=[r for b in batches for r in _shown_responses(b)],
        length=torch.cat([b.response_mask.sum(1).cpu() for b in batches]).float(),
        kl=kl,
        reward=None if reward is None else score_batches(reward, batches),
        gold=None if gold is None else score_batches(gold, batches),
        episodes=episodes,
    )


def _shown_responses(batch: ScoreInput) -> list[str]:
    """The responses of ``batch`` as the report shows them: episodes turn by turn."""
    if batch.completions is None:
        return batch.responses
    return [transcript(completion) for completion in batch.completions]


def evaluate_policy(
    policy: nn.Module,
    reference: nn.Module | None,
    tokenizer,
    prompts: Sequence[Sequence[int] | PromptExample],
    sampling: SamplingConfig,
    *,
    reward: Scorer | None,
    gold: Scorer | None,
    seed: int,
    batch_size: int,
    runtime: Runtime | None = None,
    environment: Callable[[], Any] | None = None,
    episodes: EpisodeSettings | None = None,
) -> PolicySamples:
    """Sample from ``policy`` on ``prompts`` (or play an episode from each, with
    ``environment``) and score the samples (see ``evaluate_samples``); ``runtime``: the
    precision of the sampling (fp32 when None), as ``sample_responses``."""
    batches = sample_responses(
        policy, tokenizer, prompts, sampling, seed=seed, batch_size=batch_size, runtime=runtime,
        environment=environment, episodes=episodes,
    )  # fmt: skip
    return evaluate_samples(
        batches,
        policy=policy,
        reference=reference,
        reward=reward,
        gold=gold,
        temperature=sampling.temperature,
    )


# --------------------------------------------------------------------------- best-of-n
def best_of_n_curve(
    sampler: nn.Module,
    tokenizer,
    prompts: Sequence[Sequence[int] | PromptExample],
    sampling: SamplingConfig,
    ns: Sequence[int],
    *,
    reward: Scorer,
    gold: Scorer | None,
    seed: int,
    batch_size: int,
    runtime: Runtime | None = None,
) -> tuple[list[dict], PolicySamples]:
    """Best-of-n of ``sampler`` picked by ``reward``, from one pool of max(ns) samples per
    prompt: the curve (one dict per n: n, analytic KL, expected reward and gold) and the
    picks at the largest n (one per prompt, with the analytic KL) for the results table."""
    pool = max(ns)
    batches = sample_responses(
        sampler,
        tokenizer,
        prompts,
        sampling,
        seed=seed,
        batch_size=batch_size,
        repeat=pool,
        runtime=runtime,
    )
    scored = evaluate_samples(batches, reward=reward, gold=gold)
    proxy = scored.reward.view(len(prompts), pool)  # (P, N)
    golds = proxy if scored.gold is None else scored.gold.view(len(prompts), pool)  # (P, N)
    curve = []
    for n in sorted(set(ns)):
        proxy_n, gold_n = best_of_n_expected(proxy, golds, n)  # (P,) each
        curve.append(
            {
                "n": n,
                "kl": best_of_n_kl(n),
                "reward": proxy_n.mean().item(),
                "gold": None if scored.gold is None else gold_n.mean().item(),
            }
        )
    rows = torch.arange(len(prompts)) * pool + proxy.argmax(1)  # (P,) index of each pick
    picks = PolicySamples(
        [scored.prompts[i] for i in rows],
        [scored.responses[i] for i in rows],
        scored.length[rows],
        kl=torch.full((len(prompts),), best_of_n_kl(pool)),
        reward=scored.reward[rows],
        gold=None if scored.gold is None else scored.gold[rows],
    )
    return curve, picks


# --------------------------------------------------------------------------- reward model
@torch.no_grad()
def reward_model_accuracy(
    scorer: RewardModelScorer | EnsembleScorer,
    tokenizer,
    records: Sequence,
    gold_fn=None,
    *,
    max_length: int = 256,
    batch_size: int = 32,
    breakdown: Breakdown | None = None,
) -> dict[str, Any]:
    """Pairwise accuracy of a reward model (or an ensemble's combined score) on held-out
    comparisons or rankings (all pairs), in the tokens of ``tokenizer``, the one it reads.

    ``accuracy``: share of the labels' (better, worse) pairs that the model orders the same
    way. With ``gold_fn(prompts, responses)``: ``accuracy_gold`` against the gold judge's
    order and ``label_gold_agreement`` of the labels themselves (pairs the judge ties skipped),
    and what the model's pick is worth: ``pick_gold``, the mean gold of the response it scores
    highest in each record, beside ``mean_gold`` and ``best_gold``, the mean of a record's
    responses and its best one (on rankings of K samples: best-of-K under it). With a task's
    ``breakdown`` too, ``by_part``: those counted again for every part (a constraint kind) the
    record's prompt asks for, to see what the reward model has learnt.
    """
    examples, _ = encode_comparisons(records, tokenizer, max_length)
    collate = PairCollator(tokenizer.pad_token_id)
    counts = _record_counts()
    by_part: dict[str, dict[str, float]] = {}
    for start in range(0, len(examples), batch_size):
        batch = collate(examples[start : start + batch_size])
        scores = scorer.score_ids(batch["input_ids"], batch["attention_mask"])  # (R,)
        table, _ = ranked_scores(scores.cpu(), batch["group"], batch["rank"])  # (n, K)
        for record, row in zip(records[start : start + batch_size], table.tolist(), strict=True):
            prompt, responses = _prompt_text(record.prompt), record.best_first
            golds = None if gold_fn is None else gold_fn([prompt] * len(responses), responses)
            scored = row[: len(responses)]
            _count_record(counts, scored, golds)
            if breakdown is not None and golds is not None:
                for part in breakdown.parts(prompt, responses[0]):
                    _count_record(by_part.setdefault(part, _record_counts()), scored, golds)
    result = _accuracies(counts, gold_fn is not None)
    if by_part:
        result["by_part"] = {p: _accuracies(c, True) for p, c in sorted(by_part.items())}
    return result


def _record_counts() -> dict[str, float]:
    pairs = {"pairs": 0, "correct": 0, "gold_pairs": 0, "gold_correct": 0, "label_agree": 0}
    return {**pairs, "records": 0, "pick_gold": 0.0, "mean_gold": 0.0, "best_gold": 0.0}


def _accuracies(counts: dict[str, float], gold: bool) -> dict[str, Any]:
    """The shares and means ``reward_model_accuracy`` reports, from its counts."""
    result = {"pairs": counts["pairs"], "accuracy": counts["correct"] / max(counts["pairs"], 1)}
    if gold:
        gold_pairs = max(counts["gold_pairs"], 1)
        result["gold_pairs"] = counts["gold_pairs"]
        result["accuracy_gold"] = counts["gold_correct"] / gold_pairs
        result["label_gold_agreement"] = counts["label_agree"] / gold_pairs
        records = max(counts["records"], 1)
        for name in ("pick_gold", "mean_gold", "best_gold"):
            result[name] = counts[name] / records
    return result


def _count_record(counts: dict, scores: list[float], golds: list[float] | None) -> None:
    """Add one record's pairs (i better than j by the labels, i < j) and, with ``golds``, the
    gold of the model's pick among its responses to ``counts``."""
    if golds is not None:
        counts["records"] += 1
        counts["pick_gold"] += golds[max(range(len(scores)), key=scores.__getitem__)]
        counts["mean_gold"] += sum(golds) / len(golds)
        counts["best_gold"] += max(golds)
    for i, j in itertools.combinations(range(len(scores)), 2):
        counts["pairs"] += 1
        counts["correct"] += scores[i] > scores[j]
        if golds is not None and golds[i] != golds[j]:
            gold_says_i = golds[i] > golds[j]
            counts["gold_pairs"] += 1
            counts["gold_correct"] += (scores[i] > scores[j]) == gold_says_i
            counts["label_agree"] += gold_says_i


def _prompt_text(prompt: Any) -> str:
    """A record's prompt as text (chat prompts: the last message)."""
    return prompt if isinstance(prompt, str) else prompt[-1]["content"]


def gold_scorer(task: str | None) -> Scorer | None:
    """The gold judge of a built-in task as a scorer (None for no task)."""
    return None if task is None else FunctionScorer(REWARD_FUNCTIONS[task], name=f"gold:{task}")


def _tally(
    named: dict[str, PolicySamples], judge: Callable[[str, str], dict[str, bool]]
) -> dict[str, dict[str, list[int]]]:
    """part -> model -> [responses that have it, prompts it applies to], where ``judge`` maps
    (prompt, response) to whether the response has each part that applies to the prompt."""
    counts: dict[str, dict[str, list[int]]] = {}
    for name, samples in named.items():
        for prompt, response in zip(samples.prompts, samples.responses, strict=True):
            for part, has in judge(prompt, response).items():
                tally = counts.setdefault(part, {}).setdefault(name, [0, 0])
                tally[0] += int(has)
                tally[1] += 1
    return counts


def _share_row(
    counts: dict[str, dict[str, list[int]]],
    models: Iterable[str],
    parts: list[str],
    count_key: str,
    **label,
) -> dict[str, Any]:
    """``label``, then how many prompts the ``parts`` apply to (under ``count_key``) and per
    model the share of its responses that have them (every model answered the same prompts)."""
    out: dict[str, Any] = dict(label)
    for name in models:
        out[count_key] = sum(counts[p][name][1] for p in parts)
        out[name] = sum(counts[p][name][0] for p in parts) / out[count_key]
    return out


def ifeval_scores(
    samples: PolicySamples, prompts: Sequence[PromptExample]
) -> dict[str, float] | None:
    """IFEval's four figures (``tasks.ifeval.ifeval_figures``) of ``samples``, the i-th sample
    answering ``prompts[i]``, over the prompts whose columns carry IFEval instructions, keyed
    ``ifeval_prompt_strict`` and so on; None where none does."""
    results = []
    for example, response in zip(prompts, samples.responses, strict=False):
        try:
            ids, arguments = ifeval.constraints_of(example.record.columns)
        except ValueError:  # a prompt without IFEval's columns: the figures leave it out
            continue
        if ids:
            prompt = prompt_text(example.record.prompt)
            results.append(ifeval.ifeval_results(prompt, response, ids, arguments))
    if not results:
        return None
    figures = ifeval.ifeval_figures(results)
    return {f"ifeval_{name}": value for name, value in figures.items()}


def pass_rates(named: dict[str, PolicySamples], breakdown: Breakdown) -> list[dict]:
    """One row per part of the gold score (training parts first, then held-out ones), then the
    training and the held-out parts pooled: ``asked``, how many prompts ask for it, and per
    model the share of its responses that meet it (every model answered the same prompts)."""
    counts = _tally(named, breakdown.parts)
    ordered = sorted(counts, key=lambda p: (p in breakdown.held_out, p))
    rows = [
        _share_row(counts, named, [p], "asked", part=p, held_out=p in breakdown.held_out)
        for p in ordered
    ]
    for held_out, label in ((False, "all training parts"), (True, "all held-out parts")):
        parts = [p for p in ordered if (p in breakdown.held_out) == held_out]
        if parts:
            rows.append(_share_row(counts, named, parts, "asked", part=label, held_out=held_out))
    return rows


def unasked_rates(
    named: dict[str, PolicySamples], unasked: Callable[[str, str], dict[str, bool]]
) -> list[dict]:
    """One row per shape a prompt can leave unasked (``Breakdown.unasked``): ``unasked``, how
    many prompts do not ask for it, and per model the share of its responses to them that
    take it anyway, a side effect the gold score does not see."""
    counts = _tally(named, unasked)
    return [_share_row(counts, named, [s], "unasked", shape=s) for s in sorted(counts)]


def side_by_side(
    named: dict[str, PolicySamples], count: int, prompts: Sequence[Any] | None = None
) -> list[dict]:
    """The first ``count`` prompts with every model's response and scores, for the report.
    ``prompts``: the records' prompts as written (a chat prompt shows its last message); without
    them a row shows the prompt the model was given, the chat template's text included. No
    models (an evaluation of the reward model alone): no rows."""
    rows = []
    for i in range(min([count, *(len(s.responses) for s in named.values())]) if named else 0):
        first = next(iter(named.values()))
        responses = {
            name: {
                "text": s.responses[i],
                "gold": None if s.gold is None else s.gold[i].item(),
                "reward": None if s.reward is None else s.reward[i].item(),
            }
            for name, s in named.items()
        }
        prompt = first.prompts[i] if prompts is None else _prompt_text(prompts[i])
        rows.append({"prompt": prompt, "responses": responses})
    return rows
