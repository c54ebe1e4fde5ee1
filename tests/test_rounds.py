"""Iterated RLHF (`PipelineConfig.rounds`) on the tiny model: round 2 labels samples of the
round-1 policy, its reward model trains on both rounds' comparisons, a kill between rounds
and inside a round resumes exactly, and people's votes stop and restart the pipeline."""

import json
import logging
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from safetensors.torch import load_file

from helpers import tiny_corpus, write_jsonl, write_pipeline_data
from rlhfkit import checkpoint as ckpt
from rlhfkit.cli import _print_summary
from rlhfkit.config import ConfigError, load_config
from rlhfkit.evaluation.report import ROUNDS_PNG, write_report
from rlhfkit.labelling.prepare import PrepareConfig, sample_tasks
from rlhfkit.labelling.simulated import (
    SimulatedLabeller,
    calibrate_tau,
    gold_agreement,
    plackett_luce,
    prefers,
)
from rlhfkit.labelling.store import Store
from rlhfkit.pipeline.config import PipelineConfig, stage_configs
from rlhfkit.pipeline.rounds import pairs_of, plan_rounds
from rlhfkit.pipeline.run import run_pipeline
from rlhfkit.tracking import read_jsonl

ROOT = Path(__file__).resolve().parents[1]
TINY_CONFIG = ROOT / "tests" / "pipeline_tiny.yaml"
PROMPTS_PER_ROUND = 8


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory) -> Path:
    """prompts/, sft/, comparisons/ as test_pipeline's, and round_prompts.jsonl: 4-word
    prompts that the comparisons (3-word prompts) do not hold."""
    root = tmp_path_factory.mktemp("rounds_data")
    write_pipeline_data(root)
    fresh = list(dict.fromkeys(" ".join(s.split()[:4]) for s in tiny_corpus(80, seed=7)))
    write_jsonl(root / "round_prompts.jsonl", [{"prompt": p} for p in fresh])
    return root


def _overrides(run_dir: Path, data: Path, model: Path, **more) -> dict:
    return {
        "output_dir": str(run_dir),
        "base_model": str(model),
        "data_dir": str(data),
        "rounds": 2,
        "round_prompts": str(data / "round_prompts.jsonl"),
        "prompts_per_round": PROMPTS_PER_ROUND,
        "responses_per_prompt": 4,
        "labeller_tau": 0.5,
        "round_heldout": 0.25,
        "round_reward": {"max_steps": None, "num_epochs": 1},
        **more,
    }


def _config(run_dir: Path, data: Path, model: Path, **more) -> PipelineConfig:
    return load_config(PipelineConfig, TINY_CONFIG, **_overrides(run_dir, data, model, **more))


@pytest.fixture(scope="module")
def two_rounds(tmp_path_factory, tiny_data, tiny_model_dir):
    """Two rounds with the simulated labeller, uninterrupted; and what it logged."""
    config = _config(tmp_path_factory.mktemp("rounds") / "run", tiny_data, tiny_model_dir)
    handler, logger = _Records(), logging.getLogger("rlhfkit")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        report = run_pipeline(config)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    return config, report, handler.text


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


def _round_one_only(finished: Path, target: Path) -> None:
    """A copy of a finished run as a kill between round 1 and round 2 leaves it."""
    shutil.copytree(finished, target)
    shutil.rmtree(target / "round_2")
    for name in ("eval.json", "report.md"):
        (target / name).unlink()


def _weights(final: Path) -> dict:
    return load_file(final / "model.safetensors")


def _same_weights(a: Path, b: Path) -> None:
    wa, wb = _weights(a), _weights(b)
    assert wa.keys() == wb.keys()
    for name in wa:
        assert wa[name].equal(wb[name]), name


# --------------------------------------------------------------------- the loop
def test_round_two_labels_the_round_one_policy_and_trains_on_every_comparison(two_rounds):
    config, report, log = two_rounds
    run, r2 = config.run_dir, config.run_dir / "round_2"
    info = ckpt.read_json(r2 / "samples" / "info.json")
    assert info["policy"] == str(run / "ppo" / "final")
    rows = read_jsonl(r2 / "samples" / "samples.jsonl")
    prompts = [json.loads(line)["prompt"] for line in (r2 / "samples/prompts.jsonl").open()]
    assert len(prompts) == PROMPTS_PER_ROUND and all(len(p.split()) == 4 for p in prompts)
    assert [r["split"] for r in rows].count("test") == round(len(rows) * 0.25)

    # the texts are what the round-1 policy samples with these settings, not what SFT does
    resampled = sample_tasks(PrepareConfig(**info["sampling"]))
    assert [rs for _, rs in resampled] == [r["responses"] for r in rows]
    sft = sample_tasks(PrepareConfig(**{**info["sampling"], "models": [str(run / "sft/final")]}))
    assert [rs for _, rs in sft] != [r["responses"] for r in rows]

    # the simulated labeller ranked every sample by the gold judge
    train = read_jsonl(r2 / "labels" / "train.jsonl")
    test = read_jsonl(r2 / "labels" / "test.jsonl")
    assert len(train) + len(test) == len(rows)
    assert all(sorted(r["ranking"]) == list(range(len(r["responses"]))) for r in train)

    # round 2's reward model read the 12 original comparisons and round 2's training rankings
    data = read_jsonl(r2 / "reward_data" / "train.jsonl")
    assert len(data) == 12 + len(train)
    sources = ckpt.read_json(r2 / "reward_data" / "sources.json")
    assert [s["records"] for s in sources["sources"]] == [12, len(train)]
    assert sources["pairs"] == 12 + sum(map(pairs_of, train)) == sum(map(pairs_of, data))
    assert f"loaded {len(data)} comparisons from {r2 / 'reward_data' / 'train.jsonl'}" in log
    saved = ckpt.read_json(r2 / "rm" / "final" / ckpt.STATE_FILE)
    assert saved["config"]["train_data"] == str(r2 / "reward_data" / "train.jsonl")
    assert saved["config"]["model"] == str(run / "sft" / "final")  # round_reward_init: sft

    accuracy = ckpt.read_json(r2 / "rm_accuracy.json")
    assert accuracy["on"] == "held-out" and accuracy["records"] == len(test)
    assert accuracy["before"]["model"] == str(run / "reward" / "final")
    for which in ("before", "after"):
        assert 0 <= accuracy[which]["accuracy_gold"] <= 1

    # PPO again against the new reward model, the KL reference the SFT model
    ppo_state = ckpt.read_json(r2 / "ppo" / "final" / ckpt.STATE_FILE)
    assert ppo_state["config"]["reward_model"] == str(r2 / "rm" / "final")
    assert ppo_state["config"]["model"] == str(run / "sft" / "final")
    points = read_jsonl(r2 / "ppo_eval" / "metrics.jsonl")
    assert [p["step"] for p in points] == [0, 1, 2] and points[0]["kl"] == 0.0

    rows = ckpt.read_json(run / "eval.json")["rows"]
    assert [r["model"] for r in rows][:5] == ["base", "sft", "ppo", "dpo", "ppo_round2"]
    text = report.read_text()
    assert "## Rounds (iterated RLHF)" in text and f"plots/{ROUNDS_PNG}" in text
    assert (run / "plots" / ROUNDS_PNG).stat().st_size > 0
    assert "### Round 2: samples of" in text


def test_a_kill_between_rounds_and_inside_a_round_resumes_exactly(
    two_rounds, tiny_data, tiny_model_dir, tmp_path
):
    """Killed (SIGKILL) right after round 2's PPO checkpointed its first iteration, started
    from a run that had finished round 1 only: started again, it ends where an uninterrupted
    run ends."""
    config, _, _ = two_rounds
    run = tmp_path / "run"
    _round_one_only(config.run_dir, run)
    overrides = _overrides(run, tiny_data, tiny_model_dir)
    script = f"""
import json, os, signal, sys
import torch
torch.set_num_threads(1)
from rlhfkit.config import load_config
from rlhfkit.pipeline import ppo_eval
from rlhfkit.pipeline.config import PipelineConfig
from rlhfkit.pipeline.run import run_pipeline

record = ppo_eval.PPOEvalPoints.record
def killed_after_checkpoint_1(self, iteration):
    if iteration == 1 and self.dir.parent.name == "round_2":
        os.kill(os.getpid(), signal.SIGKILL)
    record(self, iteration)
ppo_eval.PPOEvalPoints.record = killed_after_checkpoint_1
run_pipeline(load_config(PipelineConfig, {str(TINY_CONFIG)!r}, **json.loads(sys.argv[1])))
"""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, "-c", script, json.dumps(overrides)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert result.returncode == -signal.SIGKILL, result.stderr[-3000:]
    r2 = run / "round_2"
    assert ckpt.is_complete(r2 / "rm") and not ckpt.is_complete(r2 / "ppo")
    assert [p.name for p in ckpt.checkpoint_dirs(r2 / "ppo")] == ["checkpoint-1"]

    run_pipeline(load_config(PipelineConfig, TINY_CONFIG, **overrides))
    done = config.run_dir / "round_2"
    for part in ("samples/samples.jsonl", "labels/train.jsonl", "reward_data/train.jsonl"):
        assert (r2 / part).read_text() == (done / part).read_text(), part
    _same_weights(r2 / "rm" / "final", done / "rm" / "final")
    _same_weights(r2 / "ppo" / "final", done / "ppo" / "final")
    _same_weights(r2 / "ppo" / "final" / "critic", done / "ppo" / "final" / "critic")

    def curve(path):
        return [{k: p[k] for k in ("step", "kl", "gold", "reward")} for p in read_jsonl(path)]

    assert curve(r2 / "ppo_eval/metrics.jsonl") == curve(done / "ppo_eval/metrics.jsonl")


def test_people_label_a_round_the_pipeline_waits_then_goes_on(
    two_rounds, tiny_data, tiny_model_dir, tmp_path, caplog, capsys
):
    config, _, _ = two_rounds
    run = tmp_path / "run"
    _round_one_only(config.run_dir, run)
    people = _config(run, tiny_data, tiny_model_dir, labeller="humans", labels_per_task=1)
    caplog.set_level(logging.INFO, logger="rlhfkit.pipeline.run")
    db = run / "round_2" / "labels.db"

    pending = run_pipeline(people)  # stops, exit code 0 from the command line
    assert pending.path == db
    _print_summary("pipeline", people, pending)
    said = capsys.readouterr().out
    assert "rlhfkit pipeline: stopped: round 2 waits for labels" in said and "done" not in said
    assert str(db.resolve()) in said
    tasks = Store(db).tasks()
    samples = read_jsonl(run / "round_2" / "samples" / "samples.jsonl")
    assert [(t.prompt, t.responses) for t in tasks.values()] == [
        (r["prompt"], r["responses"]) for r in samples
    ]
    n = len(tasks)
    assert f"round 2 waits for labels: {n} of {n} tasks in {db}" in caplog.text
    assert f"rlhfkit label serve --db {db} --labels_per_task 1" in caplog.text
    assert not (run / "round_2" / "labels").exists() and not (run / "eval.json").exists()

    def vote(name: str, count: int) -> None:
        store = Store(db)  # as the app does for a person signed in as `name`
        _, labeller = store.sign_in(name=name)
        for _ in range(count):
            shown = store.next_task(labeller, 1)
            order = list(range(shown.task.k))[::-1]
            store.record_vote(labeller, str(uuid.uuid4()), shown.task.id, "rank", order)
        store.close()

    vote("ann", n // 2)
    caplog.clear()
    assert run_pipeline(people).path == db  # half-labelled: still waiting, nothing trained
    missing = n - n // 2
    assert f"{missing} of {n} tasks" in caplog.text and f"({missing} votes missing" in caplog.text
    assert not (run / "round_2" / "labels").exists()

    vote("bob", missing)
    report = run_pipeline(people)
    assert report == run / "report.md"
    train = read_jsonl(run / "round_2" / "labels" / "train.jsonl")
    test = read_jsonl(run / "round_2" / "labels" / "test.jsonl")
    assert len(train) + len(test) == n and all("task_id" in r for r in train)
    assert ckpt.read_json(run / "round_2" / "labels" / "info.json")["labeller"] == "humans"
    assert ckpt.is_complete(run / "round_2" / "ppo")


# --------------------------------------------------------------------- start-up checks
def test_too_few_new_prompts_and_no_labeller_tau_fail_at_start_up(
    tiny_data, tiny_model_dir, tmp_path
):
    config = _config(tmp_path / "run", tiny_data, tiny_model_dir, rounds=40)
    with pytest.raises(
        ConfigError, match=r"PipelineConfig.rounds = 40 .* = 312 prompts that no round used"
    ):
        run_pipeline(config)
    config = _config(tmp_path / "run", tiny_data, tiny_model_dir, labeller_tau=None)
    with pytest.raises(ConfigError, match=r"PipelineConfig.labeller_tau = None .*stats.json"):
        run_pipeline(config)
    assert not (tmp_path / "run" / "sft").exists()  # nothing trained
    with pytest.raises(ConfigError, match="PipelineConfig.labeller = 'robots'"):
        PipelineConfig(labeller="robots")
    with pytest.raises(ConfigError, match="PipelineConfig.responses_per_prompt = 1"):
        PipelineConfig(responses_per_prompt=1)


def test_demo_rounds_config_plans_three_rounds_on_new_prompts():
    config = load_config(PipelineConfig, ROOT / "configs" / "demo_rounds.yaml", output_dir="x")
    stages = stage_configs(config)
    plan = plan_rounds(config, stages)
    assert [len(p) for p in plan.prompts] == [144, 144] and plan.tau > 0
    assert len({p.prompt for s in plan.prompts for p in s}) == 288
    assert [r.ppo.model for r in stages.rounds] == ["x/sft/final"] * 2  # the KL reference
    assert stages.rounds[1].reward_before == "x/round_2/rm/final"
    assert stages.rounds[1].policy_before == "x/round_2/ppo/final"
    assert list(stages.eval.models)[-2:] == ["ppo_round2", "ppo_round3"]


def test_ppo_critic_init_starts_every_rounds_critic_from_the_sft_model():
    demo_rounds = ROOT / "configs" / "demo_rounds.yaml"
    default = stage_configs(load_config(PipelineConfig, demo_rounds, output_dir="x"))
    assert default.ppo.critic_start(None) == "x/reward/final"  # InstructGPT's start
    assert default.rounds[0].ppo.critic_start(None) == "x/round_2/rm/final"
    stages = stage_configs(
        load_config(PipelineConfig, demo_rounds, output_dir="x", ppo_critic_init="sft")
    )
    assert [p.critic_model for p in (stages.ppo, *(r.ppo for r in stages.rounds))] == [
        "x/sft/final"
    ] * 3
    assert stages.ppo.critic_start(None) == "x/sft/final" == stages.ppo.model
    given = load_config(
        PipelineConfig, demo_rounds, output_dir="x", ppo_critic_init="sft",
        ppo={"critic_model": "elsewhere"},
    )  # fmt: skip
    assert stage_configs(given).ppo.critic_model == "elsewhere"
    with pytest.raises(ConfigError, match="PipelineConfig.ppo_critic_init = 'policy'"):
        PipelineConfig(ppo_critic_init="policy")


# --------------------------------------------------------------------- the labeller
def test_simulated_labeller_follows_bradley_terry_and_is_seeded():
    rng = random.Random(0)
    tau, diff = 0.5, 0.4
    share = sum(prefers(diff, 0.0, tau, rng) for _ in range(20000)) / 20000
    assert share == pytest.approx(1 / (1 + math.exp(-diff / tau)), abs=0.01)
    # Plackett-Luce of two responses is the same choice
    firsts = sum(plackett_luce([diff, 0.0], tau, rng)[0] == 0 for _ in range(20000)) / 20000
    assert firsts == pytest.approx(share, abs=0.015)
    assert plackett_luce([0.0, -2000.0, -3000.0], 0.01, rng) == [0, 1, 2]  # no overflow

    def gold(prompts, responses):
        return [len(r) / 10 for r in responses]

    tasks = [("p", ["a", "bbb", "cc", "dddd"])] * 50
    first = SimulatedLabeller(gold, 0.3, seed=1).label(tasks)
    assert first == SimulatedLabeller(gold, 0.3, seed=1).label(tasks)
    assert first != SimulatedLabeller(gold, 0.3, seed=2).label(tasks)
    agreement = gold_agreement([r for r, _ in first], [g for _, g in first])
    assert 0.6 < agreement < 0.95
    tau = calibrate_tau([0.1, -0.3, 0.5, 0.0], 0.75)
    expected = sum(1 / (1 + math.exp(-d / tau)) for d in (0.1, 0.3, 0.5)) / 3
    assert expected == pytest.approx(0.75, abs=1e-6)


def test_rounds_section_of_the_report_escapes_samples(tmp_path):
    result = {"rows": [{"model": "sft", "gold": 0.1, "kl": 0.0}], "config": {}}
    points = [{"iteration": 0, "kl": 0.0, "reward": 0.0, "gold": 0.1}]
    rounds = [
        {"round": 1, "comparisons_from": "data", "policy_from": "sft", "points": points},
        {
            "round": 2,
            "comparisons_from": "runs/x/ppo/final",
            "policy_from": "sft",
            "labels": {"records": {"train": 3, "test": 1}},
            "reward_data": {"pairs": 30},
            "accuracy": {
                "on": "held-out",
                "before": {"accuracy": 0.5, "accuracy_gold": 0.55},
                "after": {"accuracy": 0.75, "accuracy_gold": 0.8},
            },
            "points": [{"iteration": 0, "kl": 0.0, "reward": 0.1, "gold": 0.2}],
            "samples": [{"prompt": "It was", "responses": [" a | b", "<b>x</b>"], "gold": [1, -1]}],
        },
    ]
    text = write_report(tmp_path, result, {}, ppo_points=points, rounds=rounds).read_text()
    assert "| 2 | runs/x/ppo/final | 4 | 30 | 0.500 | 0.550 | 0.750 | 0.800 |" in text
    assert "a \\| b **(+1.00)**" in text and "<b>" not in text
    assert (tmp_path / "plots" / ROUNDS_PNG).stat().st_size > 10_000
    one_round = write_report(tmp_path, result, {}, ppo_points=points, rounds=rounds[:1]).read_text()
    assert "Rounds" not in one_round
