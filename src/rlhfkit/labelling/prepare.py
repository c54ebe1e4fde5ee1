"""`rlhfkit label prepare`: fill a labelling database with tasks, K >= 2 responses per prompt.

The responses come either from a file whose records hold a `prompt` and its `responses` (a
list of K >= 2 non-empty strings; read like every rlhfkit data file, so a bad record raises
`DataError` naming file, line and field), or from one or more models sampled here, InstructGPT
style: K responses per prompt, response i drawn from model i mod M (the policy against the
SFT model, say), each model loaded, sampled in batches (`interact.sampling.sample_responses`,
seeded) and freed before the next. Sampled responses that are empty, or the same text as
another response to that prompt, are dropped; a prompt left with fewer than two responses is
left out and counted; so is a record of the file with two identical responses (such a pair
says nothing about which is better). Tasks already in the database are not added again, so
preparing twice from the same file changes nothing; and a prompt that already has a task is
not sampled again, so preparing twice from the same models loads no model the second time.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import logging
from collections.abc import Container
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlhfkit.config import DEMO_DATA, checked_sampling, require
from rlhfkit.data import DataError, Prompt, PromptRecord, Ranking, load_records

# The row validation of rlhfkit.data, for a record kind it has no name for (a prompt with
# unranked responses): the same checks and the same file/line/field messages as its own kinds.
from rlhfkit.experience.generation import SamplingConfig
from rlhfkit.labelling.store import Store

logger = logging.getLogger(__name__)

TaskInput = tuple[Prompt, list[str]]


@dataclass
class PrepareConfig:
    """Fill a labelling database with K >= 2 responses per prompt, from a file of responses
    or sampled from one or more models."""

    db: str = "runs/label/labels.db"
    """The labelling database (SQLite) to create or add tasks to."""
    responses: str | None = None
    """Records with `prompt` and `responses` (K >= 2 strings): .jsonl/.json/.parquet file,
    folder or dataset; instead of `models`."""
    check_tasks: str | None = None
    """Comparisons or rankings with a known answer (the records `rlhfkit rm` trains on):
    each becomes a check task, which every labeller judges once and which measures their
    accuracy (the admin's progress page); beside `responses` or `models`, or alone."""
    models: list[str] = dataclasses.field(default_factory=list)
    """Causal LMs (directories or hub names) to sample the responses from: response i of a
    prompt comes from model i mod M; instead of `responses`."""
    prompts: str = f"{DEMO_DATA}/prompts"
    """Prompts to sample responses for (any record kind with a prompt), with `models`."""
    split: str = "train"
    """Split of `prompts` or `responses` to read when it is a dataset with splits."""
    max_prompts: int | None = None
    """Use only the first this many records of `prompts` or `responses`; None uses all."""
    k: int = 2
    """Responses sampled per prompt (>= 2; at least one from each model): 2 gives pairs to
    compare, more gives InstructGPT's rankings."""
    max_new_tokens: int = 48
    """The longest sampled response, in tokens."""
    temperature: float = 1.0
    """Sampling temperature (> 0)."""
    top_k: int = 0
    """Keep only the k most likely tokens while sampling; 0 keeps all."""
    top_p: float = 1.0
    """Nucleus sampling mass, in (0, 1]."""
    max_prompt_length: int = 128
    """Prompts longer than this many tokens keep their last tokens when sampled."""
    batch_size: int = 32
    """Rows (prompt x response) per generation batch."""
    seed: int = 0
    """Seed of the sampling generator (model m uses seed + m)."""
    device: str | None = None
    """torch device to sample on; None = CUDA when available, else CPU."""

    def __post_init__(self) -> None:
        require(
            self,
            "responses",
            self.responses is None or not self.models,
            "a file of responses, or None when `models` are given (one of the two)",
        )
        require(
            self,
            "responses",
            self.check_tasks is not None or self.responses is not None or bool(self.models),
            "a file of responses, or `models` to sample them (or `check_tasks` alone)",
        )
        require(self, "db", bool(self.db), "a database file path")
        require(self, "k", self.k >= 2, "an integer >= 2 (responses to compare per prompt)")
        require(
            self,
            "models",
            len(self.models) <= self.k,
            f"at most k = {self.k} models (each model samples at least one response)",
        )
        for name in ("max_prompt_length", "batch_size"):
            require(self, name, getattr(self, name) >= 1, "an integer >= 1")
        require(self, "max_prompts", self.max_prompts is None or self.max_prompts >= 1, ">= 1")
        self.sampling  # noqa: B018 (checks the sampling fields)

    @property
    def sampling(self) -> SamplingConfig:
        """The sampling settings, checked; an error names the config field."""
        return checked_sampling(self)


# ------------------------------------------------------------------------ from a file
def read_tasks(source: str, split: str = "train", limit: int | None = None) -> list[TaskInput]:
    """Every task of a file (or folder, or dataset) of prompt + responses records
    (``data``'s "candidates": a bad record names its file, line and field)."""
    records = load_records(source, "candidates", split=split, limit=limit)
    if not records:
        raise DataError(f"{source}: no records")
    tasks = [(r.prompt, r.responses) for r in records if len(set(r.responses)) == len(r.responses)]
    if len(tasks) < len(records):
        logger.warning(
            "%s: %d of %d records left out: two of their responses are the same text",
            source,
            len(records) - len(tasks),
            len(records),
        )
    return tasks


# --------------------------------------------------------------------- from models
def sample_tasks(config: PrepareConfig, done: Container[str] = ()) -> list[TaskInput]:
    """K responses per prompt of `config.prompts`, response i from model i mod M; prompts
    in `done` (as `prompt_key` writes them) are not sampled."""
    import torch

    records = load_records(config.prompts, "prompts", split=config.split, limit=config.max_prompts)
    records = [record for record in records if prompt_key(record.prompt) not in done]
    if not records:
        return []
    device = torch.device(config.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    texts = [[""] * config.k for _ in records]
    for m, name in enumerate(config.models):
        slots = range(m, config.k, len(config.models))
        for p, samples in enumerate(_sample(name, records, len(slots), config, m, device)):
            for slot, text in zip(slots, samples, strict=True):
                texts[p][slot] = text
    return _usable(records, texts)


def _sample(
    name: str,
    records: list[PromptRecord],
    n: int,
    config: PrepareConfig,
    index: int,
    device: Any,
) -> list[list[str]]:
    """`n` sampled responses per prompt from model `name`, which is freed afterwards."""
    from rlhfkit.data import encode_prompts
    from rlhfkit.interact.sampling import sample_responses
    from rlhfkit.models.loading import freeze, load_causal_lm, load_tokenizer

    tokenizer = load_tokenizer(name)
    model = freeze(load_causal_lm(name, tokenizer=tokenizer)).to(device)
    logger.info("sampling %d responses to each of %d prompts from %s", n, len(records), name)
    prompt_ids, _ = encode_prompts(records, tokenizer, config.max_prompt_length)
    batches = sample_responses(
        model,
        tokenizer,
        prompt_ids,
        config.sampling,
        seed=config.seed + index,
        batch_size=config.batch_size,
        repeat=n,
    )  # rows prompt-major: the n samples of prompt 0, then of prompt 1, ...
    flat = [text for batch in batches for text in batch.responses]
    del model, batches
    gc.collect()
    return [flat[p * n : (p + 1) * n] for p in range(len(records))]


def _usable(records: list[PromptRecord], texts: list[list[str]]) -> list[TaskInput]:
    """Tasks of the sampled texts without empty or repeated responses; prompts left with
    fewer than two responses are left out (counted in the log)."""
    tasks, dropped, left_out = [], 0, 0
    for record, samples in zip(records, texts, strict=True):
        kept = list(dict.fromkeys(t for t in samples if t.strip()))
        dropped += len(samples) - len(kept)
        if len(kept) >= 2:
            tasks.append((record.prompt, kept))
        else:
            left_out += 1
    if dropped:
        logger.warning(
            "%d sampled responses were empty or repeated and were dropped; %d of %d prompts "
            "were left out (fewer than 2 responses left)",
            dropped,
            left_out,
            len(records),
        )
    return tasks


def prompt_key(prompt: Prompt) -> str:
    """A prompt as the database stores it (JSON), to compare prompts with the tasks'."""
    return json.dumps(prompt, ensure_ascii=False)


def _prompts_with_tasks(db: str) -> set[str]:
    if not Path(db).is_file():
        return set()
    store = Store(db)
    try:
        return {prompt_key(task.prompt) for task in store.tasks().values()}
    finally:
        store.close()


def read_check_tasks(source: str, split: str = "train") -> tuple[list[TaskInput], list[list[int]]]:
    """The tasks of a file of comparisons or rankings, and each one's known ranking (a
    comparison's responses are chosen then rejected: its ranking is [0, 1])."""
    records = load_records(source, "comparisons", split=split)
    if not records:
        raise DataError(f"{source}: no records")
    tasks, gold = [], []
    for record in records:
        if isinstance(record, Ranking):
            tasks.append((record.prompt, record.responses))
            gold.append(list(record.ranking))
        else:
            tasks.append((record.prompt, [record.chosen, record.rejected]))
            gold.append([0, 1])
    return tasks, gold


def run_prepare(config: PrepareConfig) -> Path:
    """The `rlhfkit label prepare` command: tasks into `config.db`; returns its path."""
    checks, gold = ([], [])
    if config.check_tasks is not None:
        checks, gold = read_check_tasks(config.check_tasks, config.split)
    if config.responses is not None:
        tasks = read_tasks(config.responses, config.split, config.max_prompts)
    elif not config.models:
        tasks = []
    else:
        from rlhfkit.models.loading import check_model_source

        for i, model in enumerate(config.models):  # all of them before the first one loads
            check_model_source(model, f"PrepareConfig.models[{i}]")
        done = _prompts_with_tasks(config.db)
        tasks = sample_tasks(config, done)
        if done:
            logger.info("%s: prompts that already have a task are not sampled again", config.db)
    store = Store(config.db, create=True)
    try:
        added, present = store.add_tasks([*tasks, *checks], [None] * len(tasks) + gold)
        total = len(store.tasks())
    finally:
        store.close()
    logger.info(
        "%s: %d tasks added, %d already there; %d tasks in all", config.db, added, present, total
    )
    if checks:
        logger.info("%d of them check tasks, from %s", len(checks), config.check_tasks)
    return Path(config.db)
