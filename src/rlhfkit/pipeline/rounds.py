"""Iterated RLHF: InstructGPT's steps 2 and 3 again, on comparisons of the current policy.

Ouyang et al. 2022, section 3.1: "Steps 2 and 3 can be iterated continuously; more comparison
data is collected on the current best policy, which is used to train a new RM and then a new
policy." Round 1 is the pipeline's own reward model and PPO. Round r >= 2 lives in
``<run>/round_<r>/`` and is made of steps, each written whole or not at all:

1. ``samples/``: K responses per prompt from the round r-1 policy, on prompts no round used
   before (``prompt_slices``), the last ``round_heldout`` share marked as held out;
2. ``labels/``: their rankings (``train.jsonl``, ``test.jsonl``), by the simulated labeller
   (``labelling/simulated.py``), or by people: the tasks go into ``labels.db`` for
   ``rlhfkit label serve``, the pipeline stops (``LabelsPending``), and once every task has
   ``labels_per_task`` votes a later start exports them (``labelling/export.py``);
3. ``reward_data/``: every comparison so far, the original reward data and the training
   labels of rounds 2..r, in one file;
4. ``rm/``: the reward model trained on it, from the SFT model or the previous reward model;
5. ``rm_accuracy.json``: the previous and the new reward model on the round's held-out
   comparisons: how far off its training distribution the old one had drifted;
6. ``ppo/``, ``ppo_eval/``: PPO against the new reward model, from the SFT model or the
   previous policy, its KL reference the SFT model in every round.

Steps 1-3 and 5 write through atomic directories and files (``checkpoint.py``), 4 and 6 are
trainers that resume from their checkpoints, so a restarted pipeline goes on at the first step
missing on disk, and a half-labelled round is never trained on.

Departure from InstructGPT: its later comparisons also came from earlier policies and from
people's own demonstrations; here each round's come from the last policy only.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlhfkit import checkpoint as ckpt
from rlhfkit.config import ConfigError
from rlhfkit.data import Comparison, PromptRecord, load_records
from rlhfkit.errors import RunError
from rlhfkit.labelling.export import export_records, write_jsonl
from rlhfkit.labelling.simulated import SimulatedLabeller, gold_agreement
from rlhfkit.labelling.store import Store
from rlhfkit.pipeline.config import PipelineConfig, RoundStages, Stages
from rlhfkit.pipeline.ppo_eval import PPO_EVAL_DIR, ppo_points, train_ppo
from rlhfkit.tasks import DEMO_DATA_DIR, REWARD_FUNCTIONS
from rlhfkit.tracking import read_jsonl

logger = logging.getLogger(__name__)

SAMPLES = "samples"
LABELS = "labels"
REWARD_DATA = "reward_data"
RM_ACCURACY = "rm_accuracy.json"
LABELS_DB = "labels.db"
INFO = "info.json"


@dataclass
class Step:
    """One resumable piece of the pipeline: ``done()`` looks at the disk, ``run()`` makes
    it (and may return a ``LabelsPending`` to stop the pipeline there)."""

    name: str
    done: Callable[[], bool]
    run: Callable[[], Any]
    measured: Callable[[], dict | None] | None = None
    """The stage's own seconds and peak memory, where ``run()`` only waits for a process that
    trained it (``arms.py``)."""


@dataclass
class LabelsPending:
    """A round waiting for people's votes: where, and how many are still missing."""

    round: int
    db: Path
    tasks: int
    tasks_missing: int
    votes_missing: int
    labels_per_task: int

    @property
    def path(self) -> Path:
        """Where the run stands: the database the labellers work in."""
        return self.db

    def headline(self) -> str:
        """What the command line says instead of "done"."""
        return f"stopped: round {self.round} waits for labels ({self.tasks_missing} tasks)"

    def message(self) -> str:
        serve = f"rlhfkit label serve --db {self.db} --labels_per_task {self.labels_per_task}"
        return (
            f"round {self.round} waits for labels: {self.tasks_missing} of {self.tasks} tasks "
            f"in {self.db} still need votes ({self.votes_missing} votes missing; each task "
            f"needs {self.labels_per_task}, skips not counted). Label them with `{serve}` "
            "(it prints the address, http://127.0.0.1:8000 by default), then start "
            "`rlhfkit pipeline` again with the same config: it goes on from here."
        )


@dataclass
class RoundPlan:
    """What the rounds need from start-up on: each round's prompts and the labeller's tau."""

    prompts: list[list[PromptRecord]]
    tau: float | None


# --------------------------------------------------------------------------- start-up
def plan_rounds(config: PipelineConfig, stages: Stages) -> RoundPlan | None:
    """The rounds' prompts and labeller, checked before any stage runs; None for 1 round."""
    if config.rounds == 1:
        return None
    tau = labeller_tau(config) if config.labeller == "simulated" else None
    return RoundPlan(prompt_slices(config, stages), tau)


def _key(prompt: Any) -> str:
    return json.dumps(prompt, sort_keys=True, ensure_ascii=False)


def prompt_slices(config: PipelineConfig, stages: Stages) -> list[list[PromptRecord]]:
    """Round r's prompts (r = 2, 3, ...): the (r-1)-th ``prompts_per_round`` of the prompts of
    ``round_prompts`` (train split) that the reward data does not hold, duplicates dropped."""
    source = config.round_prompts or config.data("prompts")
    reward = stages.reward
    used = load_records(
        reward.train_data, "prompts", split=reward.train_split, columns=reward.columns
    )
    seen = {_key(r.prompt) for r in used}
    fresh = []
    for record in load_records(source, "prompts", split="train"):
        if _key(record.prompt) not in seen:
            seen.add(_key(record.prompt))
            fresh.append(record)
    n, count = config.prompts_per_round, config.rounds - 1
    if len(fresh) < n * count:
        raise ConfigError(
            f"PipelineConfig.rounds = {config.rounds} is not allowed: rounds 2..{config.rounds} "
            f"need {count} x prompts_per_round = {n * count} prompts that no round used, but "
            f"{source} (train split) holds {len(fresh)} beside those of the reward data "
            f"({reward.train_data}); expected at most {1 + len(fresh) // n} rounds, or lower "
            "prompts_per_round, or give round_prompts with more prompts"
        )
    return [fresh[i * n : (i + 1) * n] for i in range(count)]


def labeller_tau(config: PipelineConfig) -> float:
    """The simulated labeller's tau: ``labeller_tau``, else the data's ``stats.json``'s."""
    if config.labeller_tau is not None:
        return config.labeller_tau
    stats = Path(config.data_dir or DEMO_DATA_DIR) / "stats.json"
    tau = ckpt.read_json(stats).get("labeller_tau") if stats.is_file() else None
    if not isinstance(tau, int | float) or tau <= 0:
        raise ConfigError(
            f"PipelineConfig.labeller_tau = None is not allowed here: it takes the labeller_tau "
            f"of {stats}, which has none; expected a number > 0 (the simulated labeller's "
            "noise, larger is noisier)"
        )
    return float(tau)


# --------------------------------------------------------------------------- the steps
def round_steps(config: PipelineConfig, stages: Stages, plan: RoundPlan) -> list[Step]:
    """Every round's steps, in order."""
    steps = []
    for rnd, prompts in zip(stages.rounds, plan.prompts, strict=True):
        name = f"round{rnd.number}"
        steps += [
            Step(
                f"{name}/samples",
                rnd.path(SAMPLES).is_dir,
                lambda rnd=rnd, prompts=prompts: sample_round(config, stages, rnd, prompts),
            ),
            Step(
                f"{name}/labels",
                rnd.path(LABELS).is_dir,
                lambda rnd=rnd: label_round(config, rnd, plan.tau),
            ),
            Step(
                f"{name}/reward_data",
                rnd.path(REWARD_DATA).is_dir,
                lambda rnd=rnd: write_reward_data(stages, rnd),
            ),
            Step(
                f"{name}/rm",
                lambda rnd=rnd: ckpt.is_complete(rnd.reward.output_dir),
                lambda rnd=rnd: _run_reward(rnd),
            ),
            Step(
                f"{name}/rm_accuracy",
                rnd.path(RM_ACCURACY).is_file,
                lambda rnd=rnd: measure_reward_models(config, rnd),
            ),
            Step(
                f"{name}/ppo",
                lambda rnd=rnd: ckpt.is_complete(rnd.ppo.output_dir),
                lambda rnd=rnd: _run_ppo(config, stages, rnd),
            ),
        ]
    return steps


def _run_reward(rnd: RoundStages) -> None:
    from rlhfkit.trainers.reward import run_reward

    run_reward(rnd.reward)


def _run_ppo(config: PipelineConfig, stages: Stages, rnd: RoundStages) -> None:
    train_ppo(
        rnd.ppo,
        stages.eval,
        eval_every=config.ppo_eval_every,
        eval_prompts=config.ppo_eval_prompts,
        eval_dir=rnd.path(PPO_EVAL_DIR),
        task=config.task,
        init_policy=rnd.policy_init,
    )


# ------------------------------------------------------------------------ 1. samples
def sample_round(
    config: PipelineConfig, stages: Stages, rnd: RoundStages, prompts: list[PromptRecord]
) -> None:
    """K responses per prompt from the previous round's policy, sampled as PPO samples."""
    from rlhfkit.labelling.prepare import PrepareConfig, sample_tasks

    ppo, final = rnd.ppo, rnd.path(SAMPLES)
    with ckpt.atomic_dir(final) as tmp:
        write_jsonl([{"prompt": r.prompt} for r in prompts], tmp / "prompts.jsonl")
        settings = {
            "models": [rnd.policy_before],
            "prompts": str(tmp / "prompts.jsonl"),
            "k": config.responses_per_prompt,
            "max_new_tokens": ppo.max_new_tokens,
            "temperature": ppo.temperature,
            "top_k": ppo.top_k,
            "top_p": ppo.top_p,
            "max_prompt_length": ppo.max_prompt_length,
            "batch_size": stages.eval.batch_size,
            "seed": config.seed + rnd.number,
        }
        tasks = sample_tasks(PrepareConfig(**settings))
        if not tasks:
            raise RunError(
                f"round {rnd.number}: no prompt of {len(prompts)} got 2 distinct non-empty "
                f"responses from {rnd.policy_before}; nothing to compare"
            )
        heldout = min(round(len(tasks) * config.round_heldout), len(tasks) - 1)
        rows = [
            {
                "prompt": p,
                "responses": rs,
                "split": "test" if i >= len(tasks) - heldout else "train",
            }
            for i, (p, rs) in enumerate(tasks)
        ]
        write_jsonl(rows, tmp / "samples.jsonl")
        settings["prompts"] = str(final / "prompts.jsonl")
        info = {"policy": rnd.policy_before, "sampling": settings, "prompts": len(prompts)}
        ckpt.write_json({**info, "tasks": len(tasks), "heldout": heldout}, tmp / INFO)


def read_samples(rnd: RoundStages) -> list[dict]:
    return read_jsonl(rnd.path(SAMPLES) / "samples.jsonl")


# ------------------------------------------------------------------------- 2. labels
def label_round(config: PipelineConfig, rnd: RoundStages, tau: float | None):
    """The round's rankings, or a ``LabelsPending`` while people have not finished."""
    if config.labeller == "simulated":
        return label_simulated(config, rnd, tau)
    return label_by_people(config, rnd)


def label_simulated(config: PipelineConfig, rnd: RoundStages, tau: float) -> None:
    """Rankings by the gold judge of ``task`` through the simulated labeller (seeded)."""
    rows = read_samples(rnd)
    seed = config.seed + rnd.number
    labeller = SimulatedLabeller(REWARD_FUNCTIONS[config.task], tau, seed)
    labelled = labeller.label([(row["prompt"], row["responses"]) for row in rows])
    records: dict[str, list[dict]] = {"train": [], "test": []}
    for row, (ranking, golds) in zip(rows, labelled, strict=True):
        record = {"prompt": row["prompt"], "responses": row["responses"], "ranking": ranking}
        records[row["split"]].append({**record, "gold": golds})
    agreement = gold_agreement([r for r, _ in labelled], [g for _, g in labelled])
    info = {"labeller": "simulated", "tau": tau, "seed": seed, "agreement_with_gold": agreement}
    _write_labels(rnd, records, info)


def label_by_people(config: PipelineConfig, rnd: RoundStages) -> LabelsPending | None:
    """The round's tasks into its labelling database; their votes once every task has
    ``labels_per_task`` of them (skips not counted), else what is missing."""
    rows = read_samples(rnd)
    split_of = {_key([row["prompt"], row["responses"]]): row["split"] for row in rows}
    store = Store(rnd.path(LABELS_DB), create=True)
    try:
        store.add_tasks((row["prompt"], row["responses"]) for row in rows)
        tasks = {
            i: t for i, t in store.tasks().items() if _key([t.prompt, t.responses]) in split_of
        }
        votes = [v for v in store.votes() if v.task_id in tasks]
    finally:
        store.close()
    need = config.labels_per_task
    counted = Counter(v.task_id for v in votes if v.choice != "skip")
    short = [need - counted[i] for i in tasks if counted[i] < need]
    if short:
        db = rnd.path(LABELS_DB)
        return LabelsPending(rnd.number, db, len(tasks), len(short), sum(short), need)
    exported, summary = export_records(tasks, votes, config.label_aggregate)
    records: dict[str, list[dict]] = {"train": [], "test": []}
    for record in exported:
        task = tasks[record["task_id"]]
        records[split_of[_key([task.prompt, task.responses])]].append(record)
    if not records["train"]:
        raise RunError(
            f"round {rnd.number}: the votes in {rnd.path(LABELS_DB)} give no training "
            f"comparison (ties and skips carry no preference): {summary['votes_by_choice']}"
        )
    info = {"labeller": "humans", "db": str(rnd.path(LABELS_DB)), "export": summary}
    _write_labels(rnd, records, info)
    return None


def _write_labels(rnd: RoundStages, records: dict[str, list[dict]], info: dict) -> None:
    with ckpt.atomic_dir(rnd.path(LABELS)) as tmp:
        for split, rows in records.items():
            write_jsonl(rows, tmp / f"{split}.jsonl")
        counts = {split: len(rows) for split, rows in records.items()}
        ckpt.write_json({**info, "records": counts}, tmp / INFO)
    logger.info("round %d: labels written to %s (%s)", rnd.number, rnd.path(LABELS), counts)


# -------------------------------------------------------------------- 3. reward data
def pairs_of(record: dict) -> int:
    """The (better, worse) pairs a comparison (1) or a ranking of K (K(K-1)/2) holds."""
    k = len(record["ranking"]) if "ranking" in record else 2
    return k * (k - 1) // 2


def _as_row(record) -> dict:
    if isinstance(record, Comparison):
        return {"prompt": record.prompt, "chosen": record.chosen, "rejected": record.rejected}
    return {"prompt": record.prompt, "responses": record.responses, "ranking": record.ranking}


def write_reward_data(stages: Stages, rnd: RoundStages) -> None:
    """Every comparison so far in one file: the reward data of round 1 (as round 1's reward
    model read it) and the training labels of rounds 2..this one."""
    reward = stages.reward
    original = load_records(
        reward.train_data,
        "comparisons",
        split=reward.train_split,
        columns=reward.columns,
        limit=reward.max_train_samples,
        degenerate_comparisons=reward.degenerate_comparisons,
    )
    rows = [_as_row(r) for r in original]
    sources = [
        {"source": reward.train_data, "records": len(rows), "pairs": sum(map(pairs_of, rows))}
    ]
    for earlier in stages.rounds[: stages.rounds.index(rnd) + 1]:
        path = earlier.path(LABELS) / "train.jsonl"
        new = read_jsonl(path)
        rows += new
        sources.append({"source": str(path), "records": len(new), "pairs": sum(map(pairs_of, new))})
    rename = {ours: theirs for ours, theirs in (reward.columns or {}).items()}
    rows = [{rename.get(k, k): v for k, v in row.items()} for row in rows]
    total = {"records": len(rows), "pairs": sum(s["pairs"] for s in sources)}
    with ckpt.atomic_dir(rnd.path(REWARD_DATA)) as tmp:
        write_jsonl(rows, tmp / "train.jsonl")
        ckpt.write_json({**total, "sources": sources}, tmp / "sources.json")
    logger.info("round %d: the reward model trains on %s", rnd.number, total)


# ------------------------------------------------------------------ 5. rm accuracy
def measure_reward_models(config: PipelineConfig, rnd: RoundStages) -> None:
    """The previous and the new reward model on this round's held-out comparisons (on its
    training ones when ``round_heldout`` is 0): against the labels and the gold judge."""
    from rlhfkit.evaluation.measures import reward_model_accuracy
    from rlhfkit.experience.scorer_loading import load_reward_scorer
    from rlhfkit.models.loading import load_tokenizer

    labels = rnd.path(LABELS)
    on = "held-out" if read_jsonl(labels / "test.jsonl") else "training"
    source = labels / ("test.jsonl" if on == "held-out" else "train.jsonl")
    records = load_records(source, "comparisons")
    gold = REWARD_FUNCTIONS[config.task] if config.task else None
    after = str(rnd.reward.final_dir)
    tokenizer = load_tokenizer(after)
    result: dict[str, Any] = {"on": on, "file": str(source), "records": len(records)}
    for name, path in (("before", rnd.reward_before), ("after", after)):
        accuracy = reward_model_accuracy(
            load_reward_scorer(path, tokenizer),
            tokenizer,
            records,
            gold,
            max_length=rnd.reward.max_length,
            batch_size=rnd.reward.eval_batch_size,
        )
        result[name] = {"model": path, **accuracy}
    ckpt.write_json(result, rnd.path(RM_ACCURACY))
    logger.info(
        "round %d: reward model accuracy on the new policy's %s comparisons: before %.3f, "
        "after %.3f",
        rnd.number,
        on,
        result["before"]["accuracy"],
        result["after"]["accuracy"],
    )


# ------------------------------------------------------------------------ the report
def round_summaries(config: PipelineConfig, stages: Stages, samples: int = 4) -> list[dict]:
    """What the report shows of each round: its PPO evaluation points, and for rounds >= 2
    the comparisons, the reward models' accuracy and a few of the labelled samples."""
    first = {
        "round": 1,
        "policy_from": "sft",
        "comparisons_from": config.data(config.reward_data),
        "points": ppo_points(config.run_dir / PPO_EVAL_DIR),
        "ppo_kept": _kept_step(stages.ppo.final_dir),
    }
    out = [first]
    for rnd in stages.rounds:
        out.append(
            {
                "round": rnd.number,
                "policy_from": rnd.policy_init or "sft",
                "comparisons_from": rnd.policy_before,
                "labels": _read(rnd.path(LABELS) / INFO),
                "reward_data": _read(rnd.path(REWARD_DATA) / "sources.json"),
                "accuracy": _read(rnd.path(RM_ACCURACY)),
                "points": ppo_points(rnd.path(PPO_EVAL_DIR)),
                "samples": _labelled_samples(rnd, samples),
                "ppo_kept": _kept_step(rnd.ppo.final_dir),
            }
        )
    return out


def _kept_step(final_dir: Path) -> int | None:
    """The step whose policy a PPO ``final/`` holds (None before it is written)."""
    state = _read(Path(final_dir) / ckpt.STATE_FILE)
    return None if state is None else state["step"]


def _read(path: Path) -> dict | None:
    return ckpt.read_json(path) if path.is_file() else None


def _labelled_samples(rnd: RoundStages, count: int) -> list[dict]:
    """The first ``count`` labelled records of the round (held-out first), best first."""
    rows = read_jsonl(rnd.path(LABELS) / "test.jsonl") + read_jsonl(
        rnd.path(LABELS) / "train.jsonl"
    )
    return [_best_first(row) for row in rows[:count]]


def _best_first(row: dict) -> dict:
    if "ranking" in row:
        responses = [row["responses"][i] for i in row["ranking"]]
        golds = [row["gold"][i] for i in row["ranking"]] if "gold" in row else None
    else:
        responses, golds = [row["chosen"], row["rejected"]], None
    return {"prompt": row["prompt"], "responses": responses, "gold": golds}
