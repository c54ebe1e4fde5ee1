"""Best-of-n sampling: sample n responses per prompt, score them, keep the best.

Follows Nakano et al. 2021 (WebGPT, "rejection sampling") and Stiennon et al. 2020: the
policy is not trained; a scorer (a reward model or a Python function, ``scorers.Scorer``)
picks among n samples. The best-of-n policy drifts from the sampling policy by at most
KL = log n - (n - 1) / n nats (Gao et al. 2022, eq. 1; exact for continuous scores without
ties), which is reported beside the score it reached so that it can be compared with the
KL that PPO or DPO spend for the same score. The picks can be written as a demonstrations
file, the data of rejection-sampling fine-tuning (SFT on the best samples; Llama 2, sec. 3.2.3).

``sample_responses`` (seeded sampling of k responses per prompt), the KL formula and WebGPT's
unbiased best-of-n estimator (``best_of_n_expected``) live here and serve ``rlhfkit.evaluation.measures``
too; the ``bon`` command writes the picks as a demonstrations file. Departure: prompts whose best response is empty (EOS first) are left
out of the file, since a demonstration needs a non-empty response.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rlhfkit.config import DEMO_DATA, RewardOptions, SamplingOptions, require
from rlhfkit.data import (
    PromptCollator,
    PromptExample,
    PromptRecord,
    encode_prompts,
    load_records,
)
from rlhfkit.experience.episodes import EpisodeSettings
from rlhfkit.experience.generation import SamplingConfig
from rlhfkit.experience.rollout import ExperienceMaker
from rlhfkit.experience.scorer_loading import reward_data_check
from rlhfkit.experience.scorers import ScoreInput, Scorer
from rlhfkit.models.loading import freeze, load_causal_lm, load_tokenizer
from rlhfkit.runtime.machine import Runtime

logger = logging.getLogger(__name__)


def best_of_n_kl(n: int) -> float:
    """Analytic KL(best-of-n || sampler) = log n - (n - 1) / n (Gao et al. 2022, eq. 1)."""
    if n < 1:
        raise ValueError(f"best_of_n_kl: n={n}, allowed: n >= 1")
    return math.log(n) - (n - 1) / n


def best_of_n_expected(
    proxy: torch.Tensor, gold: torch.Tensor, n: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Expected proxy and gold score of best-of-n (pick = highest proxy), per prompt.

    ``proxy``, ``gold``: (P, N) scores of a pool of N samples per prompt. The expectation is
    over all n-subsets of the pool (WebGPT's unbiased estimator): with the pool sorted by proxy
    ascending, the sample of rank i (1-based) is the pick of C(i - 1, n - 1) of the C(N, n)
    subsets. Returns ``(proxy_mean, gold_mean)``, each (P,).
    """
    pool = proxy.shape[1]
    if not 1 <= n <= pool:
        raise ValueError(f"best_of_n_expected: n={n}, allowed: 1 <= n <= pool size {pool}")
    order = proxy.argsort(dim=1)  # (P, N) ascending
    ranks = torch.arange(1, pool + 1, dtype=torch.float64)
    # log C(i-1, n-1) - log C(N, n) with lgamma, exact enough and free of overflow
    log_weight = _log_comb(ranks - 1, n - 1) - _log_comb(torch.tensor(float(pool)), n)
    weight = torch.where(ranks >= n, log_weight.exp(), 0.0)  # (N,) sums to 1
    sorted_proxy = proxy.double().gather(1, order)  # (P, N)
    sorted_gold = gold.double().gather(1, order)  # (P, N)
    return (sorted_proxy * weight).sum(1).float(), (sorted_gold * weight).sum(1).float()


def _log_comb(k: torch.Tensor, r: int) -> torch.Tensor:
    """log C(k, r) elementwise (-inf where k < r)."""
    k = k.double()
    value = torch.lgamma(k + 1) - math.lgamma(r + 1) - torch.lgamma((k - r).clamp(min=0) + 1)
    return torch.where(k >= r, value, float("-inf"))


# --------------------------------------------------------------------------- sampling & scoring
@torch.no_grad()
def sample_responses(
    model: nn.Module,
    tokenizer,
    prompts: Sequence[Sequence[int] | PromptExample],
    sampling: SamplingConfig,
    *,
    seed: int,
    batch_size: int,
    repeat: int = 1,
    runtime: Runtime | None = None,
    environment: Callable[[], Any] | None = None,
    episodes: EpisodeSettings | None = None,
) -> list[ScoreInput]:
    """Sample ``repeat`` responses per prompt (rows prompt-major: prompt 0's, then 1's...);
    ``prompts`` are token id lists, or ``PromptExample``s whose prompts as written and columns
    go with the batches to the reward functions.

    One seeded generator for the whole call, so the same model, prompts and settings always
    give the same samples, drawn as PPO and GRPO draw theirs (``ExperienceMaker.sample``), in
    fp32 on the model's device unless ``runtime`` says otherwise (bf16 autocast).
    With ``environment`` each prompt starts an episode (``episodes.py``: the policy's turns
    and the environment's, as ``episodes`` bounds them), its environment reset with a seed
    of the same seeded stream. Returns the batches as ``ScoreInput``s, ready for any scorer.
    """
    maker = ExperienceMaker.sampler(model, tokenizer, sampling, runtime, environment, episodes)
    device = maker.runtime.device
    generator = torch.Generator(device).manual_seed(seed)
    env_seeds = torch.Generator().manual_seed(seed)
    rows = [p for p in prompts for _ in range(repeat)]
    collate = PromptCollator(tokenizer.pad_token_id)
    batches = []
    for start in range(0, len(rows), batch_size):
        batch = collate(rows[start : start + batch_size])
        query, query_mask = batch["query"].to(device), batch["query_mask"].to(device)  # (B, Tq)
        columns = batch.get("prompt_columns")
        if environment is None:
            out = maker.sample(query, query_mask, generator)
        else:
            seeds = torch.randint(2**31 - 1, (len(query),), generator=env_seeds).tolist()
            out = maker.play(columns, seeds, generator)
            query, query_mask = out.query, out.query_mask
        batches.append(maker.score_input(query, query_mask, out, columns))
    return batches


@dataclass
class BestOfN:
    """The picks of best-of-n over P prompts."""

    prompts: list  # P original prompts (text or chat messages)
    responses: list[str]  # P picked responses (EOS removed)
    scores: torch.Tensor  # (P,) score of each pick
    all_scores: torch.Tensor  # (P, n) scores of every sample, in sampling order
    n: int

    @property
    def kl(self) -> float:
        """Analytic KL(best-of-n || sampler) in nats: log n - (n - 1) / n."""
        return best_of_n_kl(self.n)

    def summary(self) -> dict[str, float]:
        """Mean score of the picks beside the KL they cost, and the mean single sample."""
        return {
            "n": self.n,
            "prompts": len(self.prompts),
            "kl_bound": self.kl,
            "score_best_of_n": self.scores.mean().item(),
            "score_single_sample": self.all_scores.mean().item(),
        }


def best_of_n(
    policy: nn.Module,
    tokenizer,
    prompts: Sequence[str | list | PromptRecord],
    scorer: Scorer,
    n: int,
    sampling: SamplingConfig | None = None,
    *,
    max_prompt_length: int = 128,
    prompts_per_batch: int = 8,
    seed: int = 0,
) -> BestOfN:
    """Sample ``n`` responses per prompt, score them with ``scorer``, keep the highest.

    The n samples of a prompt are generated in the same batch (``prompts_per_batch * n`` rows
    per batch) from one seeded generator. Ties go to the first sample drawn.

    Args:
        policy: the causal LM to sample from (put in eval mode).
        tokenizer: its tokenizer (distinct pad and EOS).
        prompts: texts, chat message lists or ``PromptRecord``s (whose columns reach the
            reward functions).
        scorer: a ``scorers.Scorer`` (reward model or Python function).
        n: samples per prompt (>= 1).
        sampling: sampling settings (default: temperature 1, 32 new tokens).
    """
    if n < 1:
        raise ValueError(f"n={n}: allowed n >= 1")
    if prompts_per_batch < 1:
        raise ValueError(f"prompts_per_batch={prompts_per_batch}: allowed >= 1")
    records = [p if isinstance(p, PromptRecord) else PromptRecord(p) for p in prompts]
    prompt_ids, _ = encode_prompts(records, tokenizer, max_prompt_length)
    examples = [PromptExample(ids, record) for ids, record in zip(prompt_ids, records, strict=True)]
    batches = sample_responses(
        policy,
        tokenizer,
        examples,
        sampling or SamplingConfig(),
        seed=seed,
        batch_size=prompts_per_batch * n,
        repeat=n,
    )  # rows prompt-major: the n samples of prompt 0, then of prompt 1, ...
    all_scores = torch.cat([scorer(batch).cpu() for batch in batches]).view(len(records), n)
    best = all_scores.argmax(dim=1)  # (P,) first maximum
    responses = [r for batch in batches for r in batch.responses]
    return BestOfN(
        prompts=[r.prompt for r in records],
        responses=[responses[i * n + int(k)] for i, k in enumerate(best)],
        scores=all_scores.gather(1, best[:, None]).squeeze(1),
        all_scores=all_scores,
        n=n,
    )


def write_demonstrations(result: BestOfN, path: str | Path) -> Path:
    """Write the picks as JSONL demonstrations (``prompt``, ``response``, ``score``), loadable
    with ``data.load_records(path, "demonstrations")``. Empty picks are left out (logged)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [
        {"prompt": prompt, "response": response, "score": float(score)}
        for prompt, response, score in zip(
            result.prompts, result.responses, result.scores.tolist(), strict=True
        )
        if response.strip()
    ]
    if len(rows) < len(result.prompts):
        logger.warning(
            "best-of-%d: %d of %d picks are empty responses; left out of %s",
            result.n,
            len(result.prompts) - len(rows),
            len(result.prompts),
            path,
        )
    with path.open("w", encoding="utf-8") as f:
        f.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    return path


@dataclass
class BestOfNConfig(RewardOptions, SamplingOptions):
    """Best-of-n sampling from a model, written as demonstrations (rejection sampling).

    The reward_* fields name what scores the samples (bare perplexity: under `model`)."""

    model: str = "runs/sft/final"
    """Causal LM to sample from (name or directory)."""
    reward_model: str | list[str] | None = "runs/rm/final"
    """Reward model directory (from `rlhfkit rm`); a list of directories is an ensemble
    (`reward_ensemble`); None if only reward functions score."""
    n: int = 16
    """Samples per prompt; the best one is kept."""
    prompts: str = f"{DEMO_DATA}/prompts"
    """Prompts (any record kind with a prompt): .jsonl/.json/.parquet, dataset dir or hub name."""
    split: str = "train"
    """Split of `prompts` to read when it is a dataset with splits."""
    max_prompts: int | None = None
    """Use only the first this many prompts; None uses all."""
    output: str = "runs/bon/demonstrations.jsonl"
    """Where the picks are written (JSONL prompt/response/score); a summary goes next to it."""
    max_prompt_length: int = 128
    """Prompts longer than this many tokens keep their last tokens."""
    prompts_per_batch: int = 8
    """Prompts per generation batch (each gives n rows)."""
    seed: int = 0
    """Seed of the sampling generator."""
    device: str | None = None
    """torch device; None = CUDA when available, else CPU."""

    def __post_init__(self) -> None:
        self._check_sampling()
        self._check_rewards()
        for name in ("n", "max_prompt_length", "prompts_per_batch"):
            require(self, name, getattr(self, name) >= 1, "an integer >= 1")
        require(self, "max_prompts", self.max_prompts is None or self.max_prompts >= 1, ">= 1")


def run_bon(config: BestOfNConfig) -> Path:
    """The ``rlhfkit bon`` command: best-of-n picks to ``config.output``, summary beside it."""
    device = torch.device(config.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    check = reward_data_check(config.reward_functions)
    records = load_records(
        config.prompts, "prompts", split=config.split, limit=config.max_prompts, check=check
    )
    tokenizer = load_tokenizer(config.model)
    policy = freeze(load_causal_lm(config.model, tokenizer=tokenizer)).to(device)
    scorer = config.scorer(tokenizer=tokenizer, model=policy).to(device)
    result = best_of_n(
        policy,
        tokenizer,
        records,
        scorer,
        config.n,
        config.sampling,
        max_prompt_length=config.max_prompt_length,
        prompts_per_batch=config.prompts_per_batch,
        seed=config.seed,
    )
    path = write_demonstrations(result, config.output)
    scorer_fields = ("reward_model", "reward_functions", "reward_weights")
    summary = {
        **result.summary(),
        **{name: getattr(config, name) for name in scorer_fields},
        "model": config.model,
    }
    summary_path = path.with_suffix(".summary.json")
    summary_path.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    logger.info(
        "best-of-%d: mean score %.4f (single sample %.4f) at KL <= %.4f nats; picks in %s",
        config.n,
        summary["score_best_of_n"],
        summary["score_single_sample"],
        summary["kl_bound"],
        path,
    )
    return path
