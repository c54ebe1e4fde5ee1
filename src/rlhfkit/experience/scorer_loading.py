"""A scorer from what a user names: a reward-model directory (or several, an ensemble), a
``module:function``, a bundled task, perplexity under a causal LM, or a weighted sum of several
(``scorers.py`` defines what a scorer is; this module finds and loads one).

``module:function`` imports that module and calls that function on every sampled batch: it runs
the user's own code, by design, with the user's rights. A spec that does not resolve (no colon,
a module that does not import, a name that is missing or not callable) and a reward-model
directory without its head are ``UsageError``s that say which and what is allowed.

A reward model is a one-label sequence classifier (what ``rlhfkit rm``, TRL and transformers
write) or rlhfkit's older backbone + ``score_head.*``. One that shares the policy's tokenizer
scores the policy's token ids; one with a tokenizer of its own (saved beside it) scores the
decoded texts in its own tokens (``scorers.RewardModelScorer``).
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType

import torch

from rlhfkit import tasks
from rlhfkit.data import PromptRecord
from rlhfkit.errors import UsageError
from rlhfkit.experience.perplexity import PerplexityScorer
from rlhfkit.experience.scorers import (
    EnsembleScorer,
    FunctionScorer,
    RewardModelScorer,
    Scorer,
    WeightedScorer,
    needed_columns,
)
from rlhfkit.models.loading import (
    RewardModel,
    check_model_source,
    freeze,
    is_reward_model,
    load_causal_lm,
    same_tokenizer,
    saved_tokenizer,
)

logger = logging.getLogger(__name__)


def load_function(path: str, kind: str = "reward function") -> Callable:
    """Import ``"package.module:function"``, the form reward functions, tools and
    environments take in configs; errors name ``kind`` and what it should be."""
    expected = _EXPECTED[kind]
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute:
        raise UsageError(
            f"{kind} {path!r}: expected 'module:{'Class' if kind == 'environment' else 'function'}'"
            f", {expected} in a module Python can import"
        )
    function = getattr(_import(path, module_name, kind), attribute, None)
    if not callable(function):
        what = "has no attribute" if function is None else f"has a {type(function).__name__}"
        raise UsageError(
            f"{kind} {path!r}: module {module_name} {what} {attribute!r}; name {expected}"
        )
    return function


_EXPECTED = {
    "reward function": "a reward function (TRL's f(prompts, completions, **columns) or "
    "f(prompts, responses)) that returns a list of floats",
    "tool": "a function with type hints and a docstring whose Args: describe each argument",
    "environment": "a Gymnasium text environment class (or a function of no arguments that "
    "makes one), or a class whose public methods are tools",
}


def _import(path: str, module_name: str, kind: str) -> ModuleType:
    """The module of a ``module:name`` spec; its import runs the user's code."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name == module_name or module_name.startswith(f"{error.name}."):
            raise UsageError(
                f"{kind} {path!r}: no module named {error.name!r} on the Python path "
                "(for a module file in the current directory, run the `rlhfkit` command with "
                "PYTHONPATH=.)"
            ) from error
        raise UsageError(f"{kind} {path!r}: importing {module_name} failed: {error}") from error
    except Exception as error:  # the user's module raised while importing
        raise UsageError(
            f"{kind} {path!r}: importing {module_name} raised {type(error).__name__}: {error}"
        ) from error


def build_scorer(
    reward_model: str | Sequence[str] | None,
    reward_functions: Sequence[str] = (),
    weights: Sequence[float] | None = None,
    *,
    ensemble: str = "mean",
    ensemble_coef: float = 1.0,
    tokenizer=None,
    model: torch.nn.Module | None = None,
    trust_remote_code: bool = False,
) -> Scorer:
    """A frozen reward model (a directory from ``rlhfkit reward``; several: an ensemble whose
    scores ``ensemble`` combines, ``EnsembleScorer``) and/or reward functions (names, see
    ``reward_function_scorer``), summed with ``weights`` (in that order, an ensemble counting
    as one; None = all 1). ``tokenizer`` and ``model`` as in ``parse_scorer``;
    ``trust_remote_code`` lets the code a reward model or perplexity model ships run
    (``load_causal_lm``)."""
    trust = trust_remote_code
    parts: list[Scorer] = []
    if reward_model is not None:
        parts.append(
            load_reward_models(
                reward_model, tokenizer, ensemble, ensemble_coef, trust_remote_code=trust
            )
        )
    parts += [
        reward_function_scorer(spec, tokenizer=tokenizer, model=model, trust_remote_code=trust)
        for spec in reward_functions
    ]
    if not parts:
        raise ValueError("build_scorer needs a reward model or at least one reward function")
    weights = list(weights) if weights is not None else [1.0] * len(parts)
    if len(weights) != len(parts):
        raise ValueError(f"{len(weights)} weights for {len(parts)} scorers")
    if len(parts) == 1 and weights[0] == 1.0:
        return parts[0]
    return WeightedScorer(list(zip(parts, weights, strict=True)))


# --------------------------------------------------------------------------- what they need of data
RecordCheck = Callable[[PromptRecord], str | None]


def reward_data_check(reward_functions: Sequence[str]) -> RecordCheck | None:
    """What the named reward functions need of each prompt record, as ``load_records``'
    ``check``: the columns a function written TRL's way names without a default
    (``scorers.needed_columns``), and a bundled task's own check of its columns
    (``tasks.PROMPT_CHECKS``: an answer that parses, constraints it knows). None when no
    function needs anything. Resolving a module:function imports it; perplexity and reward
    models need nothing of the data."""
    checks = [
        (spec, fn, tasks.PROMPT_CHECKS.get(spec))
        for spec in reward_functions
        if (fn := _data_function(spec)) is not None
    ]
    checks = [(spec, needed_columns(fn), own) for spec, fn, own in checks]
    checks = [(spec, needed, own) for spec, needed, own in checks if needed or own]
    if not checks:
        return None

    def check(record: PromptRecord) -> str | None:
        for spec, needed, own in checks:
            missing = [name for name in needed if record.columns.get(name) is None]
            if missing:
                have = ", ".join(sorted(record.columns)) or "none but the prompt"
                return (
                    f"reward function {spec!r} needs the column(s) "
                    f"{', '.join(map(repr, missing))}, which this record lacks (its columns: "
                    f"{have})"
                )
            problem = own(record.prompt, record.columns) if own is not None else None
            if problem:
                return f"reward function {spec!r}: {problem}"
        return None

    return check


def _data_function(spec: str) -> Callable | None:
    """The Python function a reward function spec names, None for perplexity."""
    if spec in tasks.BUNDLED_REWARDS:
        return tasks.BUNDLED_REWARDS[spec]
    if ":" in spec and spec.partition(":")[0] != "perplexity":
        return load_function(spec)
    return None


def check_no_columns_needed(scorer: Scorer, command: str) -> None:
    """A ``UsageError`` where a reward function of ``scorer`` needs dataset columns that
    ``command``, which scores prompts typed or given without data, cannot pass it."""
    needed = scorer.columns_needed()
    if needed:
        name, columns = next(iter(needed.items()))
        raise UsageError(
            f"reward function {name!r} needs the column(s) {', '.join(map(repr, columns))} of "
            f"a dataset's rows, and `rlhfkit {command}` passes none: score with it in "
            "ppo, grpo, rloo, bon or eval, on data that has them"
        )


# --------------------------------------------------------------------------- scorers from specs
_BUNDLED_SPECS = f"{' | '.join(sorted(tasks.BUNDLED_REWARDS))} (rlhfkit.tasks)"
SCORER_SPECS = (
    f"{_BUNDLED_SPECS}, perplexity (under the policy), "
    "perplexity:PATH (under the causal LM at PATH), a reward model directory, module:function"
)


def parse_scorer(spec: str, *, tokenizer=None, model: torch.nn.Module | None = None) -> Scorer:
    """A ``Scorer`` from a command-line spec (see ``SCORER_SPECS``).

    ``model`` is the causal LM bare "perplexity" is measured under; ``tokenizer`` is the
    policy's: a reward model with another one scores texts (``load_reward_scorer``).
    """
    named = spec in tasks.BUNDLED_REWARDS or spec.partition(":")[0] == "perplexity"
    if not named and Path(spec).is_dir():
        return load_reward_scorer(spec, tokenizer)
    return reward_function_scorer(spec, tokenizer=tokenizer, model=model)


REWARD_FUNCTION_SPECS = (
    f"{_BUNDLED_SPECS}, perplexity (under the policy), "
    "perplexity:PATH (under the causal LM at PATH), module:function"
)


def reward_function_scorer(
    spec: str,
    *,
    tokenizer=None,
    model: torch.nn.Module | None = None,
    trust_remote_code: bool = False,
) -> Scorer:
    """A ``Scorer`` from one name of ``reward_functions`` (``REWARD_FUNCTION_SPECS``): the one
    place those names resolve, for every command. ``model`` and ``tokenizer`` as in
    ``parse_scorer``; ``trust_remote_code`` for the model of perplexity:PATH."""
    if spec in tasks.BUNDLED_REWARDS:
        return FunctionScorer(tasks.BUNDLED_REWARDS[spec], name=spec)
    if spec == "perplexity":
        if model is None:
            raise UsageError("reward 'perplexity' needs a model here; use perplexity:PATH")
        return PerplexityScorer(model)
    if spec.startswith("perplexity:"):
        path = spec.removeprefix("perplexity:")
        lm = load_causal_lm(path, tokenizer=tokenizer, trust_remote_code=trust_remote_code)
        return PerplexityScorer(freeze(lm))
    if ":" in spec:
        return FunctionScorer(load_function(spec), name=spec)
    if Path(spec).is_dir():
        raise UsageError(
            f"reward function {spec!r} is a directory: give a reward model as reward_model; "
            f"reward functions are {REWARD_FUNCTION_SPECS}"
        )
    raise UsageError(
        f"reward function {spec!r}: not a known scorer; allowed: {REWARD_FUNCTION_SPECS}"
    )


def load_reward_model(
    path: str, tokenizer=None, *, trust_remote_code: bool = False
) -> torch.nn.Module:
    """A trained, frozen reward model: without its head a directory would score at random.
    With ``tokenizer``, the tokenizer it reads, every id of it gets an embedding (the pad
    ``load_tokenizer`` added) or, the model being of another vocabulary, is refused
    (``match_vocabulary``). ``trust_remote_code`` lets the code it ships run."""
    check_model_source(path, "reward model")
    if not is_reward_model(path):
        raise UsageError(
            f"reward {path!r}: not a reward model (its config.json names no "
            "*ForSequenceClassification architecture, and it has no score_head.json): "
            "`rlhfkit rm` and TRL's RewardTrainer write one; for a causal LM's perplexity use "
            f"perplexity:{path}"
        )
    model = RewardModel.from_pretrained(
        path, tokenizer=tokenizer, trust_remote_code=trust_remote_code
    )
    return freeze(model)


def load_reward_models(
    paths: str | Sequence[str],
    tokenizer=None,
    ensemble: str = "mean",
    ensemble_coef: float = 1.0,
    *,
    trust_remote_code: bool = False,
) -> RewardModelScorer | EnsembleScorer:
    """One reward model's scorer (``load_reward_scorer``), or several as an ensemble whose
    scores ``ensemble`` combines (``ops.combine_scores``)."""
    if isinstance(paths, str):
        paths = [paths]
    members = [load_reward_scorer(p, tokenizer, trust_remote_code=trust_remote_code) for p in paths]
    if len(members) == 1:
        return members[0]
    logger.info("reward model ensemble: the %s of %s", ensemble, ", ".join(paths))
    return EnsembleScorer(members, ensemble, ensemble_coef)


def load_reward_scorer(
    path: str, tokenizer=None, *, trust_remote_code: bool = False
) -> RewardModelScorer:
    """A frozen reward model as a scorer of the policy whose tokenizer is ``tokenizer``: on
    the policy's token ids when it shares that tokenizer (or has none saved, or none is
    given), else from the decoded texts in the tokenizer saved in its directory.
    ``trust_remote_code`` lets the code the model and its tokenizer ship run."""
    trust = trust_remote_code
    own = saved_tokenizer(path, trust_remote_code=trust) if tokenizer is not None else None
    if own is None or same_tokenizer(own, tokenizer):
        return RewardModelScorer(load_reward_model(path, tokenizer, trust_remote_code=trust))
    logger.info(
        "reward model %s has a tokenizer of its own (%d tokens; the policy's has %d): it "
        "scores the decoded texts in its own tokens",
        path,
        len(own),
        len(tokenizer),
    )
    return RewardModelScorer(load_reward_model(path, own, trust_remote_code=trust), tokenizer=own)
