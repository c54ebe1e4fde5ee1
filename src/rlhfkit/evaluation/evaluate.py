"""``rlhfkit eval``: every saved model of a run, best-of-n of the reference and the reward
model's accuracy, on the same held-out prompts, written to one JSON file (``eval.json``) that
the report reads. What each number means, and the papers behind it: ``measures.py``.

Before any model is loaded, every model path is checked (a missing one is named by its field,
e.g. the default ``reference``, ``runs/sft/final``, before ``rlhfkit sft`` has written it) and
the prompts and comparisons are read, so a bad file stops the command at once.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from rlhfkit.checkpoint import write_json
from rlhfkit.config import RewardModelOptions, _check_literals, require
from rlhfkit.data import PromptExample, load_prompts, load_records
from rlhfkit.evaluation.measures import (
    PolicySamples,
    best_of_n_curve,
    evaluate_policy,
    gold_scorer,
    ifeval_scores,
    pass_rates,
    reward_model_accuracy,
    side_by_side,
    summarize,
    unasked_rates,
)
from rlhfkit.experience.generation import SamplingConfig
from rlhfkit.experience.scorer_loading import load_reward_models, reward_data_check
from rlhfkit.experience.scorers import EnsembleScorer, RewardModelScorer, trl_style
from rlhfkit.models.loading import (
    check_model_source,
    freeze,
    load_causal_lm,
    load_tokenizer,
    model_device,
)
from rlhfkit.runtime.machine import Runtime
from rlhfkit.tasks import BREAKDOWNS, DEMO_DATA_DIR, REWARD_FUNCTIONS, Breakdown
from rlhfkit.trainers.rl_config import EpisodeOptions

logger = logging.getLogger(__name__)

EVAL_FILE = "eval.json"


@dataclass
class EvalConfig(EpisodeOptions, RewardModelOptions):
    """What to evaluate, on which prompts, and how to sample; with tools or an environment,
    an episode from each prompt (the table then has turns, tool calls and tool errors per
    episode)."""

    models: dict[str, str] = field(default_factory=dict)
    """Rows of the table: name -> causal LM directory (e.g. base, sft, ppo, dpo)."""
    reference: str = "runs/sft/final"
    """The SFT model: reference of the KL, baseline of the win rates, sampler of best-of-n."""
    reward_model: str | list[str] | None = "runs/rm/final"
    """Reward model directory (the proxy score), or several as an ensemble (`reward_ensemble`);
    None skips reward and best-of-n."""
    task: str | None = "sentiment"
    """Gold judge from ``rlhfkit.tasks.REWARD_FUNCTIONS`` ('sentiment', 'digits',
    'instructions', 'ifeval', 'math'); None = none. A judge written TRL's way gets each prompt's
    columns; where the prompts carry IFEval's columns, every row also has IFEval's four
    figures."""
    prompts: str = str(DEMO_DATA_DIR / "prompts")
    """Held-out prompts (any record kind with a prompt); default: the bundled demo prompts."""
    split: str = "test"
    """Split of ``prompts`` (and of ``comparisons``) to read."""
    max_prompts: int | None = 256
    """Evaluate on the first this many prompts; None = all."""
    best_of_n_prompts: int = 64
    """Best-of-n samples max(best_of_n) responses for each of the first this many prompts."""
    max_prompt_length: int = 64
    """Prompts longer than this many tokens keep their last tokens."""
    chat_template: bool = True
    """Give plain-string prompts to a tokenizer that has a chat template as one user message
    through it, as the training stages do (`chat_template` there); False keeps raw text."""
    max_new_tokens: int = 24
    """Most tokens per response."""
    temperature: float = 1.0
    """Sampling temperature; the KL is measured at the same temperature."""
    batch_size: int = 64
    """Rows per generation / scoring batch."""
    seed: int = 0
    """Seed of the sampling generator, the same for every model."""
    best_of_n: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16])
    """n of the best-of-n curve; the largest n also becomes a row of the table."""
    comparisons: str | None = None
    """Held-out comparisons for the reward model's accuracy (against labels and gold)."""
    max_comparisons: int | None = 200
    """Use the first this many comparisons; None = all."""
    max_length: int = 256
    """Most tokens of prompt + response when the reward model scores a comparison (as the
    reward model's training `max_length`: longer ones keep the response's end cut)."""
    num_samples: int = 6
    """Prompts whose responses are kept side by side for the report."""
    output: str = "runs/eval/eval.json"
    """Where the results are written."""
    device: str | None = None
    """torch device; None = CUDA when available, else CPU."""
    mixed_precision: Literal["no", "bf16"] = "no"
    """'bf16': every model pass (sampling, KL, scores) under bf16 autocast, as the training
    stages' option; 'no' keeps fp32, whose numbers do not depend on the kernels' bf16 paths."""

    def __post_init__(self) -> None:
        self._check_episodes()
        require(
            self,
            "task",
            self.task is None or self.task in REWARD_FUNCTIONS,
            f"None or one of {sorted(REWARD_FUNCTIONS)}",
        )
        positive = ("max_prompt_length", "max_new_tokens", "batch_size", "num_samples")
        require(self, "max_length", self.max_length >= 2, "an integer >= 2 (prompt + response)")
        for name in (*positive, "best_of_n_prompts"):
            require(self, name, getattr(self, name) >= 1, "an integer >= 1")
        for name in ("max_prompts", "max_comparisons"):
            value = getattr(self, name)
            require(self, name, value is None or value >= 1, "None or an integer >= 1")
        require(self, "temperature", self.temperature > 0, "a number > 0")
        _check_literals(self)
        require(self, "best_of_n", all(n >= 1 for n in self.best_of_n), "integers >= 1")
        self._check_reward_models()


# --------------------------------------------------------------------------- the command
def _device(config: EvalConfig) -> torch.device:
    if config.device is not None:
        return torch.device(config.device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _load_lm(path: str, tokenizer, device: torch.device) -> nn.Module:
    return freeze(load_causal_lm(path, tokenizer=tokenizer)).to(device)


def _check_sources(config: EvalConfig) -> None:
    """Every model to load is there (or could be on the hub), each named by its field."""
    check_model_source(config.reference, "EvalConfig.reference")
    for path in config.reward_models:
        check_model_source(path, "EvalConfig.reward_model")
    for name, path in config.models.items():
        check_model_source(path, f"EvalConfig.models[{name!r}]")


def _load_comparisons(config: EvalConfig) -> list | None:
    """The held-out comparisons for the reward model's accuracy, if it is measured."""
    if config.reward_model is None or not config.comparisons:
        return None
    return load_records(
        config.comparisons, "comparisons", split=config.split, limit=config.max_comparisons
    )


@dataclass
class _Setup:
    """What every part of ``evaluate`` shares: prompts, sampling, scorers, the reference."""

    tokenizer: Any
    prompts: list[PromptExample]  # ids with each record's prompt as written and its columns
    sampling: SamplingConfig
    reward_model: RewardModelScorer | EnsembleScorer | None
    reference: nn.Module
    runtime: Runtime
    common: dict[str, Any]  # reward, gold, seed, batch_size, runtime for evaluate_policy
    breakdown: Breakdown | None  # the parts of the task's gold score, where it has some
    written: list[Any]  # the records' prompts as written, for the report's side-by-side rows
    episodes: dict[str, Any]  # the environment and the episodes' bounds, for evaluate_policy

    @classmethod
    def load(cls, config: EvalConfig) -> _Setup:
        device = _device(config)
        tokenizer = load_tokenizer(config.reference, padding_side="left")
        prompts = load_prompts(
            config.prompts,
            config.split,
            tokenizer,
            config.max_prompt_length,
            config.max_prompts,
            chat_template=config.chat_template,
            check=reward_data_check([config.task] if config.task else []),
        )
        rm = None
        if config.reward_model is not None:
            rm = load_reward_models(
                config.reward_models, tokenizer, config.reward_ensemble, config.reward_ensemble_coef
            ).to(device)
        bf16 = config.mixed_precision == "bf16"
        runtime = Runtime.inference(device, bf16)
        runtime.start()
        common = {
            "reward": rm,
            "gold": gold_scorer(config.task),
            "seed": config.seed,
            "batch_size": config.batch_size,
            "runtime": runtime,
        }
        episodes = {
            "environment": config.environment_factory(),
            "episodes": config.episode_settings(config.max_prompt_length),
        }
        sampling = SamplingConfig(config.max_new_tokens, config.temperature)
        reference = _load_lm(config.reference, tokenizer, device)
        breakdown = BREAKDOWNS.get(config.task)
        written = [example.record.prompt for example in prompts]
        return cls(
            tokenizer, prompts, sampling, rm, reference, runtime, common, breakdown, written,
            episodes,
        )  # fmt: skip

    def run(self, model: nn.Module) -> PolicySamples:
        """Samples (or episodes) of ``model`` on the prompts, scored, with their KL to the
        reference."""
        return evaluate_policy(
            model, self.reference, self.tokenizer, self.prompts, self.sampling,
            **self.common, **self.episodes,
        )  # fmt: skip


def _evaluate_models(config: EvalConfig, setup: _Setup) -> dict[str, PolicySamples]:
    """Samples of the reference (key None) and of every model of ``config.models``."""
    logger.info("eval: the reference %s on %d prompts", config.reference, len(setup.prompts))
    named: dict[str | None, PolicySamples] = {None: setup.run(setup.reference)}
    for name, path in config.models.items():
        if Path(path).resolve() == Path(config.reference).resolve():
            named[name] = named[None]
            continue
        logger.info("eval: %s (%s)", name, path)
        named[name] = setup.run(_load_lm(path, setup.tokenizer, model_device(setup.reference)))
    return named


def evaluate(config: EvalConfig) -> list[dict]:
    """Evaluate every model of ``config`` (plus best-of-n of the reference) on the held-out
    prompts; write everything to ``config.output`` and return the results table."""
    _check_sources(config)
    comparisons = _load_comparisons(config)
    setup = _Setup.load(config)
    with setup.runtime.autocast():
        return _evaluate_all(config, setup, comparisons)


def _evaluate_all(config: EvalConfig, setup: _Setup, comparisons: list | None) -> list[dict]:
    sampled = bool(config.models) or _samples_best_of_n(config, setup)
    named, table, curve, parts, unasked = (
        _sampled_rows(config, setup) if sampled else ({}, [], [], None, None)
    )
    accuracy = None
    if comparisons is not None:
        gold_fn = None if config.task is None else REWARD_FUNCTIONS[config.task]
        if gold_fn is not None and trl_style(gold_fn):  # it needs a prompt's columns, which
            gold_fn = None  # comparisons do not carry
        rm = setup.reward_model  # its own tokenizer, if it has one: comparisons are texts
        tokenizer = rm.tokenizer or setup.tokenizer
        accuracy = reward_model_accuracy(
            rm,
            tokenizer,
            comparisons,
            gold_fn,
            max_length=config.max_length,
            breakdown=setup.breakdown,
        )
    result = {
        "rows": table,
        "best_of_n": curve,
        "reward_model": accuracy,
        "pass_rates": parts,
        "unasked": unasked,
        "samples": side_by_side(named, config.num_samples, setup.written),
        "config": dataclasses.asdict(config),
    }
    Path(config.output).parent.mkdir(parents=True, exist_ok=True)
    write_json(result, config.output)
    logger.info("eval: results in %s", config.output)
    return table


def _samples_best_of_n(config: EvalConfig, setup: _Setup) -> bool:
    """Best-of-n needs a reward model to pick by, and picks among responses, not episodes.
    With neither models nor best-of-n, an evaluation of the reward model alone samples
    nothing."""
    return setup.reward_model is not None and bool(config.best_of_n) and not config.has_episodes


def _sampled_rows(
    config: EvalConfig, setup: _Setup
) -> tuple[dict[str, PolicySamples], list[dict], list[dict], list[dict] | None, list[dict] | None]:
    """Every model's samples (and best-of-n's) on the prompts, the results table with KL to
    the reference, the best-of-n curve, the models' pass rates per part of the gold score and
    their rates of shapes nobody asked for (each None for a task without them)."""
    named = _evaluate_models(config, setup)
    baseline = named.pop(None)
    breakdown = setup.breakdown
    parts = pass_rates(named, breakdown) if breakdown is not None else None
    unasked = None
    if breakdown is not None and breakdown.unasked is not None:
        unasked = unasked_rates(named, breakdown.unasked)
    size = len(setup.prompts)
    table = [
        {**summarize(n, s, baseline), "kl_method": "sampled", "prompts": size}
        for n, s in named.items()
    ]
    for row in table:  # IFEval's figures beside the gold, where the prompts carry its columns
        row.update(ifeval_scores(named[row["model"]], setup.prompts) or {})
    curve: list[dict] = []
    if _samples_best_of_n(config, setup):
        bon_prompts = setup.prompts[: config.best_of_n_prompts]
        name = f"best-of-{max(config.best_of_n)}"
        logger.info("eval: %s of the reference on %d prompts", name, len(bon_prompts))
        curve, named[name] = best_of_n_curve(
            setup.reference,
            setup.tokenizer,
            bon_prompts,
            setup.sampling,
            config.best_of_n,
            **setup.common,
        )
        row = summarize(name, named[name], baseline.first(len(bon_prompts)))
        row.update(ifeval_scores(named[name], bon_prompts) or {})
        table.append({**row, "kl_method": "analytic", "prompts": len(bon_prompts)})
    return named, table, curve, parts, unasked
