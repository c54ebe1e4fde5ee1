"""Best-of-n: the pick is the arg-max of the scorer, the analytic KL, the demonstrations file."""

import json
import math

import pytest
import torch

from rlhfkit.data import Demonstration, load_records
from rlhfkit.experience.generation import SamplingConfig
from rlhfkit.experience.scorers import FunctionScorer
from rlhfkit.interact.sampling import (
    BestOfN,
    BestOfNConfig,
    best_of_n,
    run_bon,
    write_demonstrations,
)

PROMPTS = ["The cat likes", "A dog sees", "My friend finds"]


class RecordingScorer(FunctionScorer):
    """Scores a response by a fixed hash of its text and remembers every (prompt, response)."""

    def __init__(self):
        self.seen: list[tuple[str, str, float]] = []
        super().__init__(self._score, name="hash")

    def _score(self, prompts, responses):
        scores = [float(sum(map(ord, r)) % 97) for r in responses]
        self.seen += list(zip(prompts, responses, scores, strict=True))
        return scores


def test_pick_is_the_arg_max_of_each_prompts_own_samples(tiny_model, tiny_tokenizer):
    scorer = RecordingScorer()
    n = 5
    sampling = SamplingConfig(max_new_tokens=8)
    result = best_of_n(tiny_model, tiny_tokenizer, PROMPTS, scorer, n, sampling, seed=3)
    assert result.all_scores.shape == (len(PROMPTS), n)
    assert len(scorer.seen) == len(PROMPTS) * n
    for i, prompt in enumerate(PROMPTS):
        own = scorer.seen[i * n : (i + 1) * n]  # prompt-major rows
        assert all(p == prompt for p, _, _ in own)
        best = max(own, key=lambda row: row[2])  # max keeps the first of ties, as argmax
        assert result.responses[i] == best[1]
        assert float(result.scores[i]) == best[2]
        assert result.all_scores[i].tolist() == [s for _, _, s in own]
    assert result.prompts == PROMPTS


def test_same_seed_same_picks(tiny_model, tiny_tokenizer):
    scorer = FunctionScorer(lambda p, r: [float(len(x)) for x in r])
    sampling = SamplingConfig(max_new_tokens=8)
    runs = [
        best_of_n(tiny_model, tiny_tokenizer, PROMPTS, scorer, 4, sampling, seed=7)
        for _ in range(2)
    ]
    assert runs[0].responses == runs[1].responses


@pytest.mark.parametrize(
    ("n", "expected"),
    [(1, 0.0), (2, math.log(2) - 0.5), (4, 1.3862944 - 0.75), (16, 2.7725887 - 0.9375)],
)
def test_kl_of_best_of_n_by_hand(n, expected):
    result = BestOfN([], [], torch.zeros(0), torch.zeros(0, n), n)
    assert result.kl == pytest.approx(expected, abs=1e-6)


def test_summary_puts_score_beside_kl():
    all_scores = torch.tensor([[1.0, 3.0], [0.0, -2.0]])
    result = BestOfN(["a", "b"], ["x", "y"], torch.tensor([3.0, 0.0]), all_scores, 2)
    summary = result.summary()
    assert summary["score_best_of_n"] == 1.5
    assert summary["score_single_sample"] == 0.5
    assert summary["kl_bound"] == pytest.approx(math.log(2) - 0.5)


def test_demonstrations_file_loads_back_without_empty_picks(tmp_path):
    chat = [{"role": "user", "content": "hi"}]
    result = BestOfN(
        ["Once upon", chat, "Empty"],
        [" a time.", "hello there", "  "],
        torch.tensor([1.0, 2.0, 3.0]),
        torch.zeros(3, 2),
        2,
    )
    path = write_demonstrations(result, tmp_path / "picks" / "demo.jsonl")
    records = load_records(path, "demonstrations")
    assert records == [Demonstration("Once upon", " a time."), Demonstration(chat, "hello there")]
    assert json.loads(path.read_text().splitlines()[1])["score"] == 2.0


def test_bon_command_writes_picks_and_summary(tiny_model_dir, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    out = tmp_path / "bon" / "picks.jsonl"
    config = BestOfNConfig(
        model=str(tiny_model_dir),
        reward_model=None,
        reward_functions=["digits"],
        n=4,
        prompts=str(prompts),
        output=str(out),
        max_new_tokens=8,
        device="cpu",
    )
    assert run_bon(config) == out
    summary = json.loads(out.with_suffix(".summary.json").read_text())
    assert summary["n"] == 4 and summary["kl_bound"] == pytest.approx(math.log(4) - 0.75)
    assert summary["score_best_of_n"] >= summary["score_single_sample"]
    assert all(r.response.strip() for r in load_records(out, "demonstrations"))


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="BestOfNConfig.n = 0"):
        BestOfNConfig(n=0)
