"""Best-of-n sampling: sample n responses per prompt, score them, keep the best.

Follows Nakano et al. 2021 (WebGPT, "rejection sampling") and Stiennon et al. 2020: the
policy is not trained; a scorer (a reward model or a Python function, ``rewards.Scorer``)
picks among n samples. The best-of-n policy drifts from the sampling policy by at most
KL = log n - (n - 1) / n nats (Gao et al. 2022, eq. 1; exact for continuous scores without
ties), which is reported beside the score it reached so that it can be compared with the
KL that PPO or DPO spend for the same score. The picks can be written as a demonstrations
file, the data of rejection-sampling fine-tuning (SFT on the best samples; Llama 2, sec. 3.2.3).

Sampling and the KL formula are shared with ``rlhfkit.evaluate`` (``sample_responses``,
``best_of_n_kl``); this module adds the picks, the scorer spec of the ``bon`` command and the
demonstrations file. Departure: prompts whose best response is empty (EOS first) are left
out of the file, since a demonstration needs a non-empty response.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from rlhfkit.config import DEMO_DATA, SamplingOptions, _require
from rlhfkit.data import PromptRecord, encode_prompts, load_records
from rlhfkit.evaluate import best_of_n_kl, sample_responses
from rlhfkit.generation import SamplingConfig
from rlhfkit.models import freeze, load_causal_lm, load_tokenizer
from rlhfkit.rewards import FunctionScorer, Scorer, build_scorer
from rlhfkit.tasks import REWARD_FUNCTIONS

logger = logging.getLogger(__name__)


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
        prompts: texts, chat message lists or ``PromptRecord``s.
        scorer: a ``rewards.Scorer`` (reward model or Python function).
        n: samples per prompt (>= 1).
        sampling: sampling settings (default: temperature 1, 32 new tokens).
    """
    if n < 1:
        raise ValueError(f"n={n}: allowed n >= 1")
    if prompts_per_batch < 1:
        raise ValueError(f"prompts_per_batch={prompts_per_batch}: allowed >= 1")
    records = [p if isinstance(p, PromptRecord) else PromptRecord(p) for p in prompts]
    prompt_ids, _ = encode_prompts(records, tokenizer, max_prompt_length)
    batches = sample_responses(
        policy,
        tokenizer,
        prompt_ids,
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


def load_scorer(spec: str) -> Scorer:
    """A scorer from its command-line spec: a reward model directory, a built-in task name
    (``rlhfkit.tasks.REWARD_FUNCTIONS``: 'sentiment', 'digits') or 'module:function'."""
    if Path(spec).is_dir():
        return build_scorer(spec)
    if spec in REWARD_FUNCTIONS:
        return FunctionScorer(REWARD_FUNCTIONS[spec], name=spec)
    if ":" in spec:
        return build_scorer(None, [spec])
    raise ValueError(
        f"scorer={spec!r}: expected a reward model directory, one of "
        f"{sorted(REWARD_FUNCTIONS)}, or 'module:function'"
    )


@dataclass
class BestOfNConfig(SamplingOptions):
    """Best-of-n sampling from a model, written as demonstrations (rejection sampling)."""

    model: str = "runs/sft/final"
    """Causal LM to sample from (name or directory)."""
    scorer: str = "runs/rm/final"
    """Reward model directory, built-in task ('sentiment', 'digits') or 'module:function'."""
    n: int = 16
    """Samples per prompt; the best one is kept."""
    prompts: str = f"{DEMO_DATA}/prompts"
    """Prompts (any record kind with a prompt): .jsonl/.json/.parquet, dataset dir or hub name."""
    split: str = "train"
    """Split of `prompts` to read when it is a dataset with splits."""
    max_prompts: int | None = None
    """Use only the first this many prompts; None uses all."""
    out: str = "runs/bon/demonstrations.jsonl"
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
        for name in ("n", "max_prompt_length", "prompts_per_batch"):
            _require(self, name, getattr(self, name) >= 1, "an integer >= 1")
        _require(self, "max_prompts", self.max_prompts is None or self.max_prompts >= 1, ">= 1")


def run_bon(config: BestOfNConfig) -> Path:
    """The ``rlhfkit bon`` command: best-of-n picks to ``config.out``, summary beside it."""
    device = torch.device(config.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    tokenizer = load_tokenizer(config.model)
    policy = freeze(load_causal_lm(config.model, tokenizer=tokenizer)).to(device)
    scorer = load_scorer(config.scorer).to(device)
    records = load_records(config.prompts, "prompts", split=config.split, limit=config.max_prompts)
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
    path = write_demonstrations(result, config.out)
    summary = {**result.summary(), "scorer": config.scorer, "model": config.model}
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
