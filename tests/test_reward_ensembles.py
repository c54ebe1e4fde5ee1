"""Reward-model ensembles: `reward_model` as a list of directories, their scores combined by
`reward_ensemble` (`EnsembleScorer`), in every command that scores and in `rlhfkit eval`; a run
logs each member's scores beside their combination."""

import json
import subprocess
import sys

import pytest
import torch

from rlhfkit.config import ConfigError
from rlhfkit.data import Comparison
from rlhfkit.errors import UsageError
from rlhfkit.evaluation.evaluate import EvalConfig, evaluate
from rlhfkit.evaluation.measures import reward_model_accuracy
from rlhfkit.experience.scorer_loading import build_scorer, load_reward_scorer
from rlhfkit.experience.scorers import (
    EnsembleScorer,
    FunctionScorer,
    RewardModelScorer,
    ScoreInput,
    WeightedScorer,
    distinct_keys,
)
from rlhfkit.interact.sampling import BestOfNConfig
from rlhfkit.models.loading import RewardModel
from rlhfkit.ops import ENSEMBLE_RULES, combine_scores
from rlhfkit.trainers.rl_config import RLConfig

PROMPTS = ["The cat", "A dog ran", "We saw", "It was a"]


@pytest.fixture(scope="module")
def members(tmp_path_factory, tiny_model_dir):
    """Two reward models of the tiny model's vocabulary whose heads score differently."""
    paths = []
    for seed in (1, 2):
        path = tmp_path_factory.mktemp(f"member{seed}")
        model = RewardModel.from_pretrained(tiny_model_dir)
        torch.manual_seed(seed)
        torch.nn.init.normal_(model.score.weight, std=0.5)
        model.save_pretrained(path)
        paths.append(str(path))
    return paths


def _batch(tokenizer, responses: list[str]) -> ScoreInput:
    tokenizer.padding_side = "left"
    query = tokenizer(PROMPTS[: len(responses)], return_tensors="pt", padding=True)
    tokenizer.padding_side = "right"
    response = tokenizer(responses, return_tensors="pt", padding=True)
    return ScoreInput(
        PROMPTS[: len(responses)],
        responses,
        query.input_ids,
        query.attention_mask,
        response.input_ids,
        response.attention_mask,
    )


def test_an_ensemble_scores_by_its_rule(members, tiny_tokenizer):
    batch = _batch(tiny_tokenizer, [" sat on a mat", " ran far", " a red ball", " nice"])
    each = torch.stack([load_reward_scorer(p, tiny_tokenizer)(batch) for p in members])  # (2, 4)
    assert not torch.allclose(each[0], each[1])
    for rule in ENSEMBLE_RULES:
        scorer = build_scorer(members, ensemble=rule, ensemble_coef=0.5, tokenizer=tiny_tokenizer)
        assert isinstance(scorer, EnsembleScorer)
        assert scorer.name == f"{rule} of 2 reward models"
        torch.testing.assert_close(scorer(batch), combine_scores(each, rule, 0.5))
    assert len(scorer.models()) == 2 and len(scorer.id_readers()) == 2


def test_an_ensemble_counts_as_one_scorer_beside_reward_functions(members, tiny_tokenizer):
    batch = _batch(tiny_tokenizer, [" 12 and 7", " a fine day"])
    ensemble = build_scorer(members, tokenizer=tiny_tokenizer)
    scorer = build_scorer(members, ["digits"], [2.0, 1.0], tokenizer=tiny_tokenizer)
    assert isinstance(scorer, WeightedScorer) and len(scorer.parts) == 2
    digits = build_scorer(None, ["digits"])
    torch.testing.assert_close(scorer(batch), 2.0 * ensemble(batch) + digits(batch))


def test_scored_gives_each_members_and_each_terms_scores(members, tiny_tokenizer):
    batch = _batch(tiny_tokenizer, [" 12 and 7", " a fine day", " 3", " nice"])
    each = [load_reward_scorer(p, tiny_tokenizer)(batch) for p in members]
    ensemble = build_scorer(members, ensemble="min", tokenizer=tiny_tokenizer)
    total, parts = ensemble.scored(batch)
    assert list(parts) == ["reward_model_0", "reward_model_1"]
    torch.testing.assert_close(parts["reward_model_1"], each[1])
    torch.testing.assert_close(total, torch.minimum(each[0], each[1]))

    scorer = build_scorer(members, ["digits"], [2.0, 0.5], tokenizer=tiny_tokenizer)
    total, parts = scorer.scored(batch)
    digits = build_scorer(None, ["digits"])(batch)
    assert list(parts) == [
        "reward_models",
        "reward_models/reward_model_0",
        "reward_models/reward_model_1",
        "digits",
    ]
    torch.testing.assert_close(parts["digits"], digits)  # unweighted: the term's own score
    torch.testing.assert_close(total, 2.0 * parts["reward_models"] + 0.5 * digits)
    torch.testing.assert_close(total, scorer(batch))
    assert build_scorer(None, ["digits"]).scored(batch)[1] == {}  # one part: none to show


def test_part_keys_are_metric_names_and_distinct():
    two = [FunctionScorer(lambda p, r: [0.0] * len(p), name="my.mod:fn") for _ in range(2)]
    assert two[0].key == "my.mod_fn"
    assert distinct_keys([*two, FunctionScorer(len, name="gold")]) == [
        "my.mod_fn_0",
        "my.mod_fn_1",
        "gold",
    ]


def test_comparisons_need_members_that_read_the_same_tokens(members, tiny_tokenizer):
    same = [load_reward_scorer(p, tiny_tokenizer) for p in members]
    assert EnsembleScorer(same).tokenizer is None  # both read the policy's ids
    own = RewardModelScorer(same[1].model, tokenizer=tiny_tokenizer)
    with pytest.raises(UsageError, match="the members read different tokens"):
        EnsembleScorer([same[0], own]).tokenizer  # noqa: B018


def test_one_directory_in_a_list_is_that_reward_model(members, tiny_tokenizer):
    assert isinstance(build_scorer(members[:1], tokenizer=tiny_tokenizer), RewardModelScorer)
    with pytest.raises(ValueError, match="at least two reward models"):
        EnsembleScorer([load_reward_scorer(members[0], tiny_tokenizer)])


def test_the_fields_and_their_checks():
    config = RLConfig(reward_model=["a", "b"], reward_ensemble="min")
    assert config.reward_models == ["a", "b"]
    assert RLConfig(reward_model="a").reward_models == ["a"]
    with pytest.raises(ConfigError, match=r"RLConfig.reward_model = \[\] is not allowed"):
        RLConfig(reward_model=[])
    with pytest.raises(ConfigError, match="RLConfig.reward_ensemble_coef = -1.0"):
        RLConfig(reward_model=["a", "b"], reward_ensemble_coef=-1.0)
    with pytest.raises(ConfigError, match="reward_ensemble = 'median'"):
        BestOfNConfig(reward_model=["a", "b"], reward_ensemble="median")
    with pytest.raises(ConfigError, match=r"EvalConfig.reward_model = \[\]"):
        EvalConfig(reward_model=[])


def test_ppo_critic_starts_from_the_first_member(members, tiny_model_dir, tiny_tokenizer):
    config = RLConfig(model=str(tiny_model_dir), reward_model=members)
    assert config.critic_start(tiny_tokenizer) == members[0]


def test_the_command_line_takes_one_directory_or_a_list():
    from rlhfkit.cli import _list_fields, _lists_of_one
    from rlhfkit.config import config_from_namespace, config_parser

    parser = config_parser(RLConfig)
    for value, expected in (("runs/a", "runs/a"), ("[runs/a, runs/b]", ["runs/a", "runs/b"])):
        args = _lists_of_one(["--reward_model", value], _list_fields(RLConfig))
        assert config_from_namespace(RLConfig, parser.parse_args(args)).reward_model == expected


class _Length(torch.nn.Module):
    """A stand-in reward model: ``scale`` x the number of real tokens."""

    def __init__(self, scale: float):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.tensor(scale))

    def forward(self, input_ids, attention_mask):
        return self.scale * attention_mask.sum(1).float()


def test_accuracy_of_an_ensemble_reads_its_combined_score(tiny_tokenizer):
    records = [
        Comparison("The cat", " sees a red ball in the park.", " sees."),  # longer better
        Comparison("A dog", " likes it.", " likes the big tree every day."),  # shorter better
        Comparison("We", " read a new book today.", " paint."),  # longer better
    ]
    members = [RewardModelScorer(_Length(1.0)), RewardModelScorer(_Length(-0.5))]
    # mean: 0.25 x length, longer is better (2 of 3 right); min: -0.5 x length (1 of 3)
    mean = reward_model_accuracy(EnsembleScorer(members, "mean"), tiny_tokenizer, records)
    worst = reward_model_accuracy(EnsembleScorer(members, "min"), tiny_tokenizer, records)
    assert mean["accuracy"] == pytest.approx(2 / 3) and worst["accuracy"] == pytest.approx(1 / 3)


def test_eval_with_an_ensemble(tmp_path, members, tiny_model_dir):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    comparisons = tmp_path / "comparisons.jsonl"
    rows = [{"prompt": "The cat", "chosen": " sat.", "rejected": " ran off."}] * 3
    comparisons.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = EvalConfig(
        reference=str(tiny_model_dir),
        reward_model=members,
        reward_ensemble="mean_minus_var",
        task="sentiment",
        prompts=str(prompts),
        split="train",
        comparisons=str(comparisons),
        max_new_tokens=4,
        best_of_n=[1, 2],
        output=str(tmp_path / "eval.json"),
    )
    rows = evaluate(config)
    assert [r["model"] for r in rows] == ["best-of-2"]
    saved = json.loads((tmp_path / "eval.json").read_text())
    assert saved["reward_model"]["pairs"] == 3
    assert saved["config"]["reward_model"] == members


def test_ppo_trains_against_an_ensemble_from_the_command_line(tmp_path, members, tiny_model_dir):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS * 2))
    command = [sys.executable, "-m", "rlhfkit.cli", "ppo", "--model", str(tiny_model_dir)]
    command += ["--reward_model", f"[{members[0]}, {members[1]}]", "--reward_ensemble", "min"]
    command += ["--train_data", str(prompts), "--eval_data", "null", "--cpu", "true"]
    command += ["--output_dir", str(tmp_path / "run"), "--max_steps", "2"]
    command += ["--rollout_batch_size", "4", "--batch_size", "4", "--ppo_epochs", "1"]
    command += ["--max_new_tokens", "4", "--report_to", "none"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "reward model ensemble: the min of" in result.stderr
    saved = json.loads((tmp_path / "run" / "train_config.json").read_text())
    assert saved["reward_model"] == members and saved["reward_ensemble"] == "min"
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    rows = [row for row in logged if "train/score/mean" in row]
    assert len(rows) == 2
    for row in rows:  # each member's own mean beside the ensemble's: min <= each member's
        members_mean = [row[f"train/score/reward_model_{i}/mean"] for i in (0, 1)]
        assert row["train/score/mean"] <= min(members_mean) + 1e-6
        assert row["train/score/reward_model_0/std"] >= 0
