"""Scorers: what gives each sampled response its one scalar score.

A reward model (InstructGPT step 2, scored at the last real token, EOS included as it was in
training; on the policy's token ids, or on the texts in its own tokens when it comes from
another model family), an ensemble of reward models (their scores combined by
``ops.combine_scores``), any Python reward function (TRL's ``f(prompts, completions,
completion_ids, **columns)``, which gets the dataset's columns by name, or rlhfkit's
``f(prompts, responses)``), or a weighted sum of several: all give ``scores`` (B,) through one
interface, ``Scorer``. A non-finite score, a value that is no number, a raising callable is a ``ScoreError`` that names
the sample (index, prompt and response); a wrong number of scores names the counts. A scorer
of several (an ensemble, a sum) also gives each part's scores by name (``Scorer.scored``), so
that a run shows what each reward model and function gave, not only their combination.
``scorer_loading.py`` turns what a user names into a scorer. How scores become PPO's per-token
rewards is ``rewards.py``.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import numbers
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rlhfkit.data import PromptColumns, encode_pairs, pad
from rlhfkit.data.encode import UNSET_CONTEXT
from rlhfkit.errors import RunError, UsageError
from rlhfkit.models.loading import model_device, same_tokenizer
from rlhfkit.ops.ensembles import ENSEMBLE_RULES, combine_scores
from rlhfkit.ops.masks import last_token_index
from rlhfkit.runtime.machine import Runtime
from rlhfkit.runtime.packing import PackedRows, packing_enabled
from rlhfkit.runtime.sharding import shard

logger = logging.getLogger(__name__)

SHOWN_CHARS = 80  # of a prompt or response in a message


class ScoreError(RunError):
    """A scorer failed or gave an unusable score; the message names the sample."""


@dataclass
class ScoreInput:
    """One batch as scorers see it: texts for Python functions, token ids for models, and what
    the data says of each row beside them (``prompt_columns``)."""

    prompts: list[str]  # B decoded prompts
    responses: list[str]  # B decoded responses, special tokens (EOS) removed
    query: torch.Tensor  # (B, Tq) left-padded prompt ids
    query_mask: torch.Tensor  # (B, Tq)
    response: torch.Tensor  # (B, Tr) response ids, pad after EOS
    response_mask: torch.Tensor  # (B, Tr) 1 up to and including EOS
    eos_token_id: int | None = None  # what ends a response; a row without it was cut short
    # the B prompts as the data wrote them and their rows' other columns; None where the
    # prompts came without data (chat, sample, the text environment)
    prompt_columns: PromptColumns | None = None
    # episodes (``episodes.py``): each one's messages after the prompt, the policy's turns
    # and the environment's (``responses`` then hold the policy's last turn), and the B
    # environments that played them; None for one prompt and one response
    completions: list[list[dict]] | None = None
    environments: list | None = None
    # (B, Tr) 1 for an episode's environment tokens (``response_mask`` holds the policy's);
    # None for one prompt and one response
    env_mask: torch.Tensor | None = None
    # what each episode did (``episodes.EPISODE_STATS``), (B,) each; None for bandits
    episode_stats: dict[str, torch.Tensor] | None = None

    @property
    def attention_mask(self) -> torch.Tensor:
        """(B, Tr) every real response token, the environment's in an episode included."""
        return self.response_mask if self.env_mask is None else self.response_mask | self.env_mask

    @classmethod
    def from_ids(
        cls,
        tokenizer,
        query,
        query_mask,
        response,
        response_mask,
        prompt_columns: PromptColumns | None = None,
    ) -> ScoreInput:
        """The batch with its texts decoded from the ids (special tokens, pad and EOS removed)."""
        return cls(
            prompts=tokenizer.batch_decode(query, skip_special_tokens=True),
            responses=tokenizer.batch_decode(response, skip_special_tokens=True),
            query=query,
            query_mask=query_mask,
            response=response,
            response_mask=response_mask,
            eos_token_id=tokenizer.eos_token_id,
            prompt_columns=prompt_columns,
        )

    def row(self, index: int) -> ScoreInput:
        """The batch of row ``index`` alone."""
        rows = slice(index, index + 1)
        columns = self.prompt_columns.select([index]) if self.prompt_columns is not None else None
        return dataclasses.replace(
            self,
            prompts=self.prompts[rows],
            responses=self.responses[rows],
            query=self.query[rows],
            query_mask=self.query_mask[rows],
            response=self.response[rows],
            response_mask=self.response_mask[rows],
            prompt_columns=columns,
            completions=None if self.completions is None else self.completions[rows],
            environments=None if self.environments is None else self.environments[rows],
            env_mask=None if self.env_mask is None else self.env_mask[rows],
            episode_stats=None
            if self.episode_stats is None
            else {k: v[rows] for k, v in self.episode_stats.items()},
        )

    def describe(self, index: int) -> str:
        prompt, response = _shown(self.prompts[index]), _shown(self.responses[index])
        return f"sample {index} (prompt={prompt}, response={response})"


def _shown(text: str) -> str:
    """``text`` quoted and escaped (repr), its middle cut if long."""
    if len(text) <= SHOWN_CHARS:
        return repr(text)
    half = SHOWN_CHARS // 2
    return f"{text[:half]!r}...{text[-half:]!r}"


class Scorer(ABC):
    """Gives one score per response. Subclasses implement ``score``; calling checks it."""

    name: str = "scorer"

    @abstractmethod
    def score(self, batch: ScoreInput) -> torch.Tensor:
        """(B,) scores for ``batch``."""

    def models(self) -> list[torch.nn.Module]:
        """The models the scorer runs (none for a Python function)."""
        return []

    def columns_needed(self) -> dict[str, list[str]]:
        """The dataset columns each reward function in it needs, by its name ({}: none)."""
        return {}

    def id_readers(self) -> list[tuple[str, torch.nn.Module]]:
        """The models that read the policy's token ids, each with the name an error gives it
        (none for a Python function, nor for a reward model that reads its own tokens)."""
        return []

    def to(self, device: torch.device | str) -> Scorer:
        """Move every model the scorer runs to ``device``."""
        for model in self.models():
            model.to(device)
        return self

    @property
    def key(self) -> str:
        """The scorer's name as a metric's name: ``score/<key>/mean`` where a run logs it as a
        part (``scored``)."""
        return re.sub(r"[^\w.-]+", "_", self.name).strip("_") or "scorer"

    def score_parts(self, batch: ScoreInput) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``score``, and the (B,) scores of the parts it combines by key: none here; a scorer
        of several overrides it."""
        return self.score(batch), {}

    def __call__(self, batch: ScoreInput) -> torch.Tensor:
        return self.scored(batch)[0]

    def scored(self, batch: ScoreInput) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """(B,) checked float scores for ``batch``, and each part's (B,) scores by key (an
        ensemble's members, a sum's terms unweighted, nested as ``term/member``; {} for a
        scorer of one part)."""
        scores, parts = self.score_parts(batch)
        expected = (len(batch.prompts),)
        if tuple(scores.shape) != expected:
            raise ScoreError(
                f"{self.name} returned scores of shape {tuple(scores.shape)}, expected {expected}"
            )
        bad = (~torch.isfinite(scores)).nonzero().flatten().tolist()
        if bad:
            raise ScoreError(
                f"{self.name} gave the non-finite score {scores[bad[0]].item()} for "
                f"{batch.describe(bad[0])} ({len(bad)} non-finite in the batch)"
            )
        return scores.float(), parts


TRL_ARGUMENTS = ("prompts", "completions", "completion_ids", "environments")
"""What TRL hands reward functions besides the dataset's columns (``environments`` where the
policy played episodes)."""


def trl_style(fn: Callable) -> bool:
    """Whether ``fn`` is a reward function written TRL's way (``FunctionScorer``): it names
    ``completions``, or takes ``**kwargs`` and names no ``responses``."""
    parameters = _parameters(fn)
    if parameters is None:
        return False
    takes_any = any(p.kind is p.VAR_KEYWORD for p in parameters.values())
    return "completions" in parameters or (takes_any and "responses" not in parameters)


def needed_columns(fn: Callable) -> list[str]:
    """The dataset columns a reward function written TRL's way cannot run without: the
    parameters it names without a default, but TRL's own (``TRL_ARGUMENTS``)."""
    parameters = _parameters(fn)
    if parameters is None or not trl_style(fn):
        return []
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [
        name
        for name, p in parameters.items()
        if p.kind in named and p.default is p.empty and name not in TRL_ARGUMENTS
    ]


def _parameters(fn: Callable) -> Mapping[str, inspect.Parameter] | None:
    try:
        return inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin or C callable: no signature to read
        return None


class FunctionScorer(Scorer):
    """Wraps a Python reward function, called one of two ways, told apart by its signature
    (``trl_style``):

    - TRL's, ``f(prompts=..., completions=..., completion_ids=..., **columns)``, for a
      function that names ``completions`` or takes ``**kwargs``: ``prompts`` as the data
      wrote them (a string or a list of chat messages each), ``completions`` the response
      texts (for chat prompts, each a list of one assistant message, as TRL passes them;
      for episodes, each episode's messages after the prompt, tool results included, and
      ``environments`` the environments that played them),
      ``completion_ids`` each response's token ids up to and including EOS, and every other
      column of the prompts' rows by name, a list aligned with the batch. A function without
      ``**kwargs`` gets only the arguments it names.
    - rlhfkit's, ``f(prompts, responses)``: the decoded prompt (the chat template's
      rendering, special tokens removed) and response texts.

    Either returns one number per response: a list, or a tensor.
    """

    def __init__(self, fn: Callable[..., Sequence[float]], name: str | None = None):
        self.fn = fn
        self.name = name or getattr(fn, "__name__", type(fn).__name__)
        self.trl_style = trl_style(fn)
        parameters = _parameters(fn) or {}
        self._takes_any = any(p.kind is p.VAR_KEYWORD for p in parameters.values())
        self._names = frozenset(parameters)
        self._needed = needed_columns(fn)

    def columns_needed(self) -> dict[str, list[str]]:
        return {self.name: self._needed} if self._needed else {}

    def score(self, batch: ScoreInput) -> torch.Tensor:
        try:
            values = self._call(batch)
        except ScoreError:
            raise
        except Exception as error:
            raise self._blame(batch, error) from error
        return self._check(values, batch).to(batch.response.device)

    def _call(self, batch: ScoreInput) -> object:
        """``fn`` on ``batch``, called the way its signature asks for."""
        if not self.trl_style:
            return self.fn(batch.prompts, batch.responses)
        return self.fn(**self._arguments(batch))

    def _arguments(self, batch: ScoreInput) -> dict[str, Any]:
        """The keyword arguments of a function written TRL's way on ``batch``."""
        given = batch.prompt_columns
        prompts = given.prompts if given is not None else batch.prompts
        columns = given.columns if given is not None else {}
        missing = [name for name in self._needed if name not in columns]
        if missing:
            where = "the data has no such column" if given else "these prompts came without data"
            raise ScoreError(
                f"{self.name} needs the column(s) {', '.join(map(repr, missing))}: {where}"
            )
        chat = [not isinstance(p, str) for p in prompts]
        completions = batch.completions or [
            [{"role": "assistant", "content": text}] if is_chat else text
            for text, is_chat in zip(batch.responses, chat, strict=True)
        ]
        arguments = {
            "prompts": prompts,
            "completions": completions,
            "completion_ids": [
                row[mask.bool()].tolist()
                for row, mask in zip(batch.response, batch.attention_mask, strict=True)
            ],
            **columns,
        }
        if batch.environments is not None:
            arguments["environments"] = batch.environments
        if self._takes_any:
            return arguments
        return {key: value for key, value in arguments.items() if key in self._names}

    def _check(self, values: object, batch: ScoreInput) -> torch.Tensor:
        """``values`` as (B,) floats: one number per response, in order."""
        n = len(batch.prompts)
        if hasattr(values, "tolist"):  # a tensor or numpy array
            values = values.flatten().tolist()
        if not isinstance(values, Sequence) or isinstance(values, str | bytes | Mapping):
            raise ScoreError(
                f"{self.name} returned {type(values).__name__}; it must return a list of "
                f"{n} numbers, one per response"
            )
        if len(values) != n:
            raise ScoreError(
                f"{self.name} returned {len(values)} scores for {n} responses; it must return "
                "one number per response, in order"
            )
        for i, value in enumerate(values):
            if not isinstance(value, numbers.Real):
                shown = _shown(value) if isinstance(value, str) else repr(value)[:SHOWN_CHARS]
                raise ScoreError(
                    f"{self.name} returned {shown} ({type(value).__name__}, not a number) for "
                    f"{batch.describe(i)}"
                )
        return torch.tensor([float(v) for v in values], dtype=torch.float32)

    def _blame(self, batch: ScoreInput, error: Exception) -> ScoreError:
        """Re-run the samples one by one to name the first that makes ``fn`` raise."""
        for i in range(len(batch.prompts)):
            try:
                self._call(batch.row(i))
            except Exception as single_error:
                return ScoreError(
                    f"{self.name} raised {type(single_error).__name__}: {single_error} on "
                    f"{batch.describe(i)}"
                )
        return ScoreError(
            f"{self.name} raised {type(error).__name__}: {error} on the batch of "
            f"{len(batch.prompts)} (no single sample raises on its own)"
        )


class RewardModelScorer(Scorer):
    """Scores query + response with a reward model (``models.RewardModel``).

    Sharing the policy's tokenizer (``tokenizer=None``), it scores the policy's own ids: the
    sequence keeps the EOS the policy emitted, so the model reads its score at EOS, as it was
    trained; a response cut at the token limit gets one appended (``with_final_eos``), as
    every response of its training data had. With a tokenizer of its own (a reward model of
    another family: ``scorer_loading.load_reward_scorer`` decides), it scores from the texts: the
    decoded prompt and response, through its chat template as a user and an assistant turn if
    it has one, else concatenated, and its EOS appended, as its training encoded them
    (``data.encode_pairs``), cut to ``max_length`` tokens (None: its context).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        name: str = "reward_model",
        *,
        tokenizer=None,
        max_length: int | None = None,
    ):
        self.model = model
        self.name = name
        self.tokenizer = tokenizer
        if tokenizer is not None and max_length is None:
            max_length = context_length(model, tokenizer)
        self.max_length = max_length

    def models(self) -> list[torch.nn.Module]:
        return [self.model]

    def id_readers(self) -> list[tuple[str, torch.nn.Module]]:
        return [] if self.tokenizer is not None else [(self.name, self.model)]

    @torch.no_grad()
    def score(self, batch: ScoreInput) -> torch.Tensor:
        self.model.eval()  # a scorer never runs dropout
        if self.tokenizer is None:
            sequence = torch.cat([batch.query, batch.response], dim=1)  # (B, Tq + Tr)
            mask = torch.cat([batch.query_mask, batch.attention_mask], dim=1)  # (B, Tq + Tr)
            if batch.eos_token_id is not None:
                sequence, mask = with_final_eos(sequence, mask, batch.eos_token_id)
        else:
            sequence, mask = self._encode_texts(batch)  # (B, T) each, right-padded
        if packing_enabled(self.model):  # real tokens only: packing.py
            return self.model(**PackedRows.from_mask(mask).inputs(sequence)).float()  # (B,)
        return self.model(sequence, mask).float()  # (B,) at the last real token

    @torch.no_grad()
    def score_ids(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """(R,) scores of right-padded rows already in the tokens it reads (its own, or the
        policy's), each at its last real token: how held-out comparisons are scored."""
        self.model.eval()
        device = model_device(self.model)
        return self.model(input_ids.to(device), attention_mask.to(device)).float()

    def _encode_texts(self, batch: ScoreInput) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch's texts in the reward model's own tokens, on the model's device."""
        ids, report = encode_pairs(batch.prompts, batch.responses, self.tokenizer, self.max_length)
        if report.tokens_removed:
            logger.warning("%s: texts cut to its %d tokens: %s", self.name, self.max_length, report)
        sequence, mask = pad(ids, self.tokenizer.pad_token_id)
        device = next(self.model.parameters(), batch.query).device
        return sequence.to(device), mask.to(device)


def with_final_eos(
    sequence: torch.Tensor, mask: torch.Tensor, eos_token_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``sequence`` and ``mask`` (B, T) with EOS after the last real token of every row that
    does not end with it, one column wider where any row needs it.

    A reward model learns from responses that all end with EOS (``data.encode_comparisons``
    appends it, to a response cut at the sampling limit too) and reads its score there. Read
    at the last token of a response that ran out of tokens instead, the score comes from a
    position it was never trained at, and is off by an amount the policy can learn to avoid
    by stopping early. Penalising such responses is a choice of its own
    (``missing_eos_penalty``).
    """
    rows = torch.arange(sequence.shape[0], device=sequence.device)  # (B,)
    last = last_token_index(mask)  # (B,)
    cut = sequence[rows, last] != eos_token_id  # (B,) responses without their EOS
    if not cut.any():
        return sequence, mask
    sequence = torch.nn.functional.pad(sequence, (0, 1), value=eos_token_id)  # (B, T + 1)
    mask = torch.nn.functional.pad(mask, (0, 1))  # (B, T + 1)
    rows, after = rows[cut], last[cut] + 1  # the first position after each cut row's tokens
    sequence[rows, after] = eos_token_id
    mask[rows, after] = 1
    return sequence, mask


def context_length(model: torch.nn.Module, tokenizer) -> int:
    """Tokens a model reads at most: its tokenizer's ``model_max_length`` or its config's
    positions, the smaller of those it declares (1024 where it declares neither)."""
    config = getattr(model, "config", None)
    limits = [getattr(config, "max_position_embeddings", None), tokenizer.model_max_length]
    declared = [n for n in limits if isinstance(n, int) and n < UNSET_CONTEXT]
    return min(declared, default=1024)


class EnsembleScorer(Scorer):
    """Several reward models as one scorer: each scores the batch, ``ops.combine_scores``
    makes one score of theirs by ``rule`` (the mean, the lowest, or the mean less ``coef``
    times their variance). Members trained alike (same data and recipe, other seeds or
    batching) score on about the same scale, which the lowest and the variance need; every
    reward model ``rlhfkit rm`` writes is centred on its demonstrations."""

    def __init__(self, members: Sequence[RewardModelScorer], rule: str = "mean", coef: float = 1.0):
        if len(members) < 2:
            raise ValueError(f"an ensemble needs at least two reward models, got {len(members)}")
        if rule not in ENSEMBLE_RULES:
            raise ValueError(f"rule={rule!r}: allowed {', '.join(ENSEMBLE_RULES)}")
        self.members = list(members)
        self.rule, self.coef = rule, coef
        self.name = f"{rule} of {len(self.members)} reward models"

    @property
    def tokenizer(self):
        """The tokenizer every member reads when it scores token ids (None: the policy's);
        scoring ids (``score_ids``) needs them all to read the same."""
        first = self.members[0].tokenizer
        if not all(_same_tokens(first, member.tokenizer) for member in self.members[1:]):
            raise UsageError(
                f"{self.name}: the members read different tokens (some have a tokenizer of "
                "their own); they score sampled responses together, but held-out comparisons "
                "only one by one"
            )
        return first

    def models(self) -> list[torch.nn.Module]:
        return [model for member in self.members for model in member.models()]

    def id_readers(self) -> list[tuple[str, torch.nn.Module]]:
        return [reader for member in self.members for reader in member.id_readers()]

    @property
    def key(self) -> str:
        return "reward_models"

    def score(self, batch: ScoreInput) -> torch.Tensor:
        return self.score_parts(batch)[0]

    def score_parts(self, batch: ScoreInput) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        scores = [member(batch) for member in self.members]
        parts = dict(zip(distinct_keys(self.members), scores, strict=True))
        return combine_scores(torch.stack(scores), self.rule, self.coef), parts  # of (M, B)

    @torch.no_grad()
    def score_ids(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """(R,) combined scores of right-padded rows in the members' shared tokens."""
        scores = [member.score_ids(input_ids, attention_mask) for member in self.members]
        return combine_scores(torch.stack(scores), self.rule, self.coef)  # (R,)


def _same_tokens(a, b) -> bool:
    """Whether two scorers' tokenizers (None: the policy's) give ids the same meaning."""
    return a is b or (a is not None and b is not None and same_tokenizer(a, b))


class WeightedScorer(Scorer):
    """sum_i weight_i * scorer_i(batch): e.g. a reward model plus a format bonus."""

    def __init__(self, parts: Sequence[tuple[Scorer, float]]):
        if not parts:
            raise ValueError("WeightedScorer needs at least one (scorer, weight) pair")
        self.parts = [(as_scorer(scorer), float(weight)) for scorer, weight in parts]
        self.name = " + ".join(f"{w:g}*{s.name}" for s, w in self.parts)

    def models(self) -> list[torch.nn.Module]:
        return [model for scorer, _ in self.parts for model in scorer.models()]

    def columns_needed(self) -> dict[str, list[str]]:
        return {name: cols for s, _ in self.parts for name, cols in s.columns_needed().items()}

    def id_readers(self) -> list[tuple[str, torch.nn.Module]]:
        return [reader for scorer, _ in self.parts for reader in scorer.id_readers()]

    def score(self, batch: ScoreInput) -> torch.Tensor:
        return self.score_parts(batch)[0]

    def score_parts(self, batch: ScoreInput) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        total, parts = 0.0, {}
        for (scorer, weight), key in zip(self.parts, distinct_keys(self.scorers), strict=True):
            scores, inner = scorer.scored(batch)
            total = total + weight * scores
            parts[key] = scores
            parts.update({f"{key}/{name}": values for name, values in inner.items()})
        return total, parts

    @property
    def scorers(self) -> list[Scorer]:
        return [scorer for scorer, _ in self.parts]


def distinct_keys(scorers: Sequence[Scorer]) -> list[str]:
    """Each scorer's ``key``, numbered from 0 where several share one (two reward models)."""
    keys = [scorer.key for scorer in scorers]
    return [
        f"{key}_{keys[:i].count(key)}" if keys.count(key) > 1 else key for i, key in enumerate(keys)
    ]


def as_scorer(source: Scorer | torch.nn.Module | Callable) -> Scorer:
    """A ``Scorer`` as is, a ``torch.nn.Module`` as a reward model, any other callable as a
    reward function (``FunctionScorer``: TRL's signature or rlhfkit's)."""
    if isinstance(source, Scorer):
        return source
    if isinstance(source, torch.nn.Module):
        return RewardModelScorer(source)
    if callable(source):
        return FunctionScorer(source)
    raise TypeError(f"cannot score with {type(source).__name__}: need a Scorer, model or callable")


def prepare_scorer(scorer: Scorer, runtime: Runtime, packed: bool = False) -> Scorer:
    """``scorer`` on the runtime's device, each model in it (a reward model) with the kernels
    the trained models run (attention, GELU, padding-free passes with ``packed``) and, under
    FSDP, sharded as they are: what every RL trainer does with the scorer it is given."""
    scorer = scorer.to(runtime.device)
    for model in scorer.models():
        runtime.prepare(model, packed=packed)
        if runtime.sharded:  # frozen, but 1/N of its memory on each process
            shard(model)
    return scorer
