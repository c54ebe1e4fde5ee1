"""Evaluation metrics against hand computations, and `evaluate` end to end on tiny models."""

import copy
import itertools
import json
import logging
import math

import pytest
import torch

from rlhfkit.data import Comparison, DataError
from rlhfkit.evaluation.evaluate import EvalConfig, evaluate
from rlhfkit.evaluation.measures import (
    PolicySamples,
    paired_difference,
    reward_model_accuracy,
    sample_kl,
    standard_error,
    summarize,
    win_rate,
)
from rlhfkit.experience.generation import SamplingConfig
from rlhfkit.experience.scorers import RewardModelScorer
from rlhfkit.interact.sampling import best_of_n_expected, best_of_n_kl, sample_responses
from rlhfkit.models.loading import RewardModel
from rlhfkit.tasks.ifeval import ifeval_figures, ifeval_results

PROMPTS = ["The cat sees", "A small bird wants a new", "We"]


def test_win_rate_counts_ties_as_half():
    assert win_rate(torch.tensor([1.0, 2.0, 3.0, 5.0]), torch.tensor([0.0, 2.0, 4.0, 1.0])) == 0.625
    with pytest.raises(ValueError, match="shapes"):
        win_rate(torch.zeros(2), torch.zeros(3))


def test_best_of_n_kl_hand_values():
    assert best_of_n_kl(1) == 0.0
    assert best_of_n_kl(2) == pytest.approx(math.log(2) - 0.5)
    assert best_of_n_kl(16) == pytest.approx(2.772588722 - 0.9375)


def test_best_of_n_expected_equals_average_over_all_subsets():
    gen = torch.Generator().manual_seed(0)
    proxy = torch.randn(3, 6, generator=gen)  # distinct values: no ties in the pick
    gold = torch.randn(3, 6, generator=gen)
    for n in range(1, 7):
        proxy_n, gold_n = best_of_n_expected(proxy, gold, n)
        for p in range(3):
            subsets = list(itertools.combinations(range(6), n))
            picks = [max(s, key=lambda i: proxy[p, i].item()) for s in subsets]
            assert proxy_n[p].item() == pytest.approx(
                sum(proxy[p, i].item() for i in picks) / len(picks), abs=1e-5
            )
            assert gold_n[p].item() == pytest.approx(
                sum(gold[p, i].item() for i in picks) / len(picks), abs=1e-5
            )
    with pytest.raises(ValueError, match="pool size"):
        best_of_n_expected(proxy, gold, 7)


def test_summarize_distinct_n_and_win_rates():
    mine = PolicySamples(
        ["p", "q"],
        ["a b a b", "c d"],
        torch.tensor([4.0, 2.0]),
        kl=torch.tensor([1.0, 3.0]),
        reward=torch.tensor([1.0, 0.0]),
        gold=torch.tensor([0.5, 0.5]),
    )
    base = PolicySamples(
        ["p", "q"],
        ["x", "y"],
        torch.tensor([1.0, 1.0]),
        reward=torch.tensor([0.0, 0.0]),
        gold=torch.tensor([0.5, 1.0]),
    )
    row = summarize("m", mine, base)
    # unigrams a b a b c d: 4 distinct of 6; bigrams ab ba ab cd: 3 distinct of 4
    assert row["distinct_1"] == pytest.approx(4 / 6)
    assert row["distinct_2"] == pytest.approx(3 / 4)
    assert row["kl"] == 2.0 and row["length"] == 3.0 and row["gold"] == 0.5
    assert row["win_rate_rm"] == 0.75  # one win, one tie
    assert row["win_rate_gold"] == 0.25  # one tie, one loss
    assert row["gold_gain"] == -0.25 and row["gold_gain_se"] == pytest.approx(0.25)
    assert summarize("m", mine, None)["win_rate_gold"] is None
    assert summarize("m", mine, None)["gold_gain_se"] is None


def test_the_paired_gain_s_error_is_that_of_the_per_prompt_differences():
    # differences 0.5, 0.0, 0.5, 1.0: mean 0.5, sample variance 1/6, se sqrt(1/6 / 4)
    scores = torch.tensor([1.0, 0.5, 0.5, 1.0])
    baseline = torch.tensor([0.5, 0.5, 0.0, 0.0])
    gain, se = paired_difference(scores, baseline)
    assert gain == pytest.approx(0.5) and se == pytest.approx(math.sqrt(1 / 24))
    # a prompt's difficulty shared by both models cancels; the unpaired error grows with it
    difficulty = torch.tensor([0.0, 3.0, 6.0, 9.0])
    harder, harder_baseline = scores - difficulty, baseline - difficulty
    assert paired_difference(harder, harder_baseline) == pytest.approx((gain, se))
    unpaired = math.hypot(standard_error(harder), standard_error(harder_baseline))
    assert unpaired > 10 * se
    assert paired_difference(scores, None) == (None, None)
    with pytest.raises(ValueError, match="shapes"):
        paired_difference(scores, baseline[:3])


def _encode(tokenizer, texts):
    return [tokenizer(t)["input_ids"] for t in texts]


def _perturbed(model, seed, scale=0.05):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=gen))
    return model


def _hand_logprob(model, prompt_ids, response_ids):
    """log p(response | prompt) from one unpadded forward and a plain loop over tokens."""
    ids = torch.tensor([prompt_ids + response_ids])
    with torch.no_grad():
        logp = model(ids).logits[0].log_softmax(-1)
    return sum(logp[len(prompt_ids) - 1 + t, tok].item() for t, tok in enumerate(response_ids))


def test_sample_kl_matches_hand_computation(tiny_model, tiny_tokenizer, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    policy = _perturbed(tiny_model, seed=1).eval()
    reference = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    prompts = _encode(tiny_tokenizer, PROMPTS)  # different lengths: left padding is exercised
    sampling = SamplingConfig(max_new_tokens=6)
    batches = sample_responses(policy, tiny_tokenizer, prompts, sampling, seed=3, batch_size=2)
    kl = sample_kl(policy, reference, batches)
    hand = []
    for batch in batches:
        for row in range(len(batch.prompts)):
            prompt_ids = batch.query[row][batch.query_mask[row] == 1].tolist()
            response_ids = batch.response[row][batch.response_mask[row] == 1].tolist()
            hand.append(
                _hand_logprob(policy, prompt_ids, response_ids)
                - _hand_logprob(reference, prompt_ids, response_ids)
            )
    assert kl.tolist() == pytest.approx(hand, abs=1e-4)
    assert sample_kl(policy, policy, batches).abs().max().item() == 0.0


def test_sampling_is_seeded(tiny_model, tiny_tokenizer):
    prompts = _encode(tiny_tokenizer, PROMPTS)
    sampling = SamplingConfig(max_new_tokens=5)

    def draw(seed):
        batches = sample_responses(
            tiny_model, tiny_tokenizer, prompts, sampling, seed=seed, batch_size=4, repeat=2
        )
        return [r for b in batches for r in b.responses]

    first = draw(0)
    assert len(first) == 6 and first == draw(0) and first != draw(1)


class _LengthReward(torch.nn.Module):
    """A stand-in reward model: the number of real tokens (longer is better)."""

    def __init__(self):
        super().__init__()
        self.dummy = torch.nn.Parameter(torch.zeros(()))

    def forward(self, input_ids, attention_mask):
        return attention_mask.sum(1).float()


def _length_reward() -> RewardModelScorer:
    return RewardModelScorer(_LengthReward())


def test_reward_model_accuracy_against_labels_and_gold(tiny_tokenizer):
    records = [
        Comparison("The cat", " sees a red ball in the park.", " sees."),  # model right
        Comparison("A dog", " likes it.", " likes the big tree every day."),  # model wrong
        Comparison("We", " read a new book today.", " paint."),  # model right
    ]
    # gold: prefers the longer text except in record 0, where it ties
    golds = {" sees a red ball in the park.": 1.0, " sees.": 1.0}

    def gold_fn(prompts, responses):
        return [golds.get(r, float(len(r))) for r in responses]

    result = reward_model_accuracy(_length_reward(), tiny_tokenizer, records, gold_fn, batch_size=2)
    assert result["pairs"] == 3
    assert result["accuracy"] == pytest.approx(2 / 3)
    # record 0 is a gold tie (skipped); in records 1 and 2 the model agrees with gold
    assert result["accuracy_gold"] == 1.0
    assert result["label_gold_agreement"] == 0.5
    # its picks (the longer text) have gold 1, 30 and 23 (lengths); the records' means 1, 20
    # and 15; their best 1, 30 and 23
    assert result["pick_gold"] == pytest.approx(54 / 3)
    assert result["mean_gold"] == pytest.approx(36 / 3)
    assert result["best_gold"] == pytest.approx(54 / 3)


def test_the_pick_of_a_ranking_is_its_highest_scored_response(tiny_tokenizer):
    from rlhfkit.data import Ranking

    # ranked best first by the labels; the length model picks " a b c d" (gold 0.5)
    record = Ranking("Say", [" a", " a b", " a b c d"], ranking=[1, 0, 2])
    golds = {" a b": 1.0, " a": 0.0, " a b c d": 0.5}

    def gold_fn(prompts, responses):
        return [golds[r] for r in responses]

    result = reward_model_accuracy(_length_reward(), tiny_tokenizer, [record], gold_fn)
    assert result["pick_gold"] == 0.5 and result["best_gold"] == 1.0
    assert result["mean_gold"] == pytest.approx(0.5)


def test_reward_model_accuracy_per_part_of_the_gold_score(tiny_tokenizer):
    from rlhfkit.tasks import Breakdown

    records = [
        Comparison("short A", " one two three four five.", " one."),  # model right
        Comparison("short B", " one.", " one two three four five six."),  # model wrong
        Comparison("long A", " a b c d e f g.", " a b."),  # model right
    ]

    def gold_fn(prompts, responses):
        return [
            float(len(r)) if "B" not in p else -float(len(r))
            for p, r in zip(prompts, responses, strict=True)
        ]

    def parts(prompt, response):
        return {"short": True} if prompt.startswith("short") else {"long": True, "both": True}

    result = reward_model_accuracy(
        _length_reward(), tiny_tokenizer, records, gold_fn, breakdown=Breakdown(parts)
    )
    assert result["accuracy_gold"] == pytest.approx(2 / 3)
    by_part = result["by_part"]
    assert list(by_part) == ["both", "long", "short"]
    assert by_part["short"]["gold_pairs"] == 2 and by_part["short"]["accuracy_gold"] == 0.5
    assert by_part["long"]["accuracy_gold"] == 1.0 and by_part["both"]["gold_pairs"] == 1
    assert "by_part" not in reward_model_accuracy(
        _length_reward(), tiny_tokenizer, records, gold_fn
    )


def test_evaluate_the_reward_model_alone(tmp_path, tiny_model_dir, caplog):
    """No models and no best-of-n: only the reward model on the held-out rankings, which
    `rlhfkit eval` shows instead of an empty table, and no prompt sampled."""
    from rlhfkit.pipeline.run import run_eval

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "The cat"}) + "\n")
    rankings = tmp_path / "rankings.jsonl"
    record = {"prompt": "A dog", "responses": [" ran off.", " sat.", " is happy"]}
    rankings.write_text(json.dumps({**record, "ranking": [2, 0, 1]}) + "\n")
    rm_dir = tmp_path / "rm"
    RewardModel.from_pretrained(tiny_model_dir).save_pretrained(rm_dir)
    config = EvalConfig(
        models={},
        reference=str(tiny_model_dir),
        reward_model=str(rm_dir),
        prompts=str(prompts),
        split="train",
        comparisons=str(rankings),
        best_of_n=[],
        max_new_tokens=2,
        output=str(tmp_path / "eval.json"),
    )
    with caplog.at_level(logging.INFO):
        run_eval(config)
    assert "gold of its pick among each record's responses" in caplog.text
    assert "eval: the reference" not in caplog.text  # nothing to sample
    assert "results on held-out prompts" not in caplog.text
    saved = json.loads((tmp_path / "eval.json").read_text())
    assert saved["rows"] == []
    assert saved["reward_model"]["pairs"] == 3 and "pick_gold" in saved["reward_model"]
    assert saved["samples"] == [] and saved["best_of_n"] == []


def test_evaluate_end_to_end(tmp_path, tiny_model_dir, tiny_model, tiny_tokenizer):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS * 2))
    other = tmp_path / "other"
    _perturbed(tiny_model, seed=2, scale=0.5).save_pretrained(other)
    tiny_tokenizer.save_pretrained(other)
    rm_dir = tmp_path / "rm"
    torch.manual_seed(0)
    RewardModel.from_pretrained(tiny_model_dir).save_pretrained(rm_dir)
    config = EvalConfig(
        models={"sft": str(tiny_model_dir), "other": str(other)},
        reference=str(tiny_model_dir),
        reward_model=str(rm_dir),
        task="sentiment",
        prompts=str(prompts),
        max_new_tokens=6,
        batch_size=4,
        best_of_n=[1, 2, 4],
        output=str(tmp_path / "out" / "eval.json"),
    )
    rows = evaluate(config)
    assert [r["model"] for r in rows] == ["sft", "other", "best-of-4"]
    sft, other, bon = rows
    assert sft["kl"] == 0.0 and sft["win_rate_rm"] == 0.5 and sft["win_rate_gold"] == 0.5
    assert other["kl"] > 0
    assert bon["kl"] == pytest.approx(best_of_n_kl(4)) and bon["kl_method"] == "analytic"
    assert all(v is not None for row in rows for v in row.values())
    saved = json.loads((tmp_path / "out" / "eval.json").read_text())
    assert saved["rows"] == rows
    curve = saved["best_of_n"]
    assert [c["n"] for c in curve] == [1, 2, 4]
    rewards = [c["reward"] for c in curve]
    assert rewards == sorted(rewards)  # the expected best of n never falls as n grows
    assert curve[-1]["reward"] == pytest.approx(bon["reward"], abs=1e-5)
    assert len(saved["samples"]) == 6 and set(saved["samples"][0]["responses"]) == {
        "sft",
        "other",
        "best-of-4",
    }


def test_side_by_side_shows_the_prompt_as_written(tmp_path, tiny_model, tiny_tokenizer):
    """Through a chat template the model sees the template's text around the prompt; the
    report's rows show what the user wrote (a chat prompt: its last message)."""
    model_dir = tmp_path / "chat_model"
    tokenizer = copy.deepcopy(tiny_tokenizer)
    tokenizer.chat_template = (
        "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }} {% endfor %}[assistant]"
    )
    tiny_model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    written = ["the rain was", [{"role": "user", "content": "she said"}]]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in written))
    out = tmp_path / "eval.json"
    config = EvalConfig(
        models={"sft": str(model_dir)},
        reference=str(model_dir),
        reward_model=None,
        task="sentiment",
        prompts=str(prompts),
        max_new_tokens=4,
        batch_size=2,
        best_of_n=[],
        output=str(out),
    )
    evaluate(config)
    samples = json.loads(out.read_text())["samples"]
    assert [s["prompt"] for s in samples] == ["the rain was", "she said"]


def test_ifeval_figures_beside_the_gold_and_the_columns_reach_the_task_s_judge(
    tmp_path, tiny_model_dir
):
    """Prompts with IFEval's columns: the ifeval task's judge gets them (its gold is the
    share of instructions met, strictly), and every row has IFEval's four figures, computed
    again here from the samples."""
    rows = [
        {
            "prompt": p,
            "instruction_id_list": ["punctuation:no_comma", "change_case:english_lowercase"],
            "kwargs": [{}, {}],
        }
        for p in PROMPTS
    ]
    rows.append({"prompt": "the end", "instruction_id_list": ["detectable_format:title"]})
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "eval.json"
    config = EvalConfig(
        models={"sft": str(tiny_model_dir)},
        reference=str(tiny_model_dir),
        reward_model=None,
        task="ifeval",
        prompts=str(prompts),
        max_new_tokens=6,
        batch_size=4,
        best_of_n=[],
        num_samples=len(rows),
        output=str(out),
    )
    (sft,) = evaluate(config)
    responses = [s["responses"]["sft"]["text"] for s in json.loads(out.read_text())["samples"]]
    results = [
        ifeval_results(r["prompt"], text, r["instruction_id_list"], r.get("kwargs"))
        for r, text in zip(rows, responses, strict=True)
    ]
    expected = ifeval_figures(results)
    for name in ("prompt_strict", "prompt_loose", "instruction_strict", "instruction_loose"):
        assert sft[f"ifeval_{name}"] == pytest.approx(expected[name])
    gold = [sum(s for _, s, _ in r) / len(r) for r in results]
    assert sft["gold"] == pytest.approx(sum(gold) / len(gold))


def test_a_prompt_the_task_s_judge_cannot_take_is_refused_before_sampling(tmp_path, tiny_model_dir):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "say hi", "instruction_id_list": ["no:such"]}) + "\n")
    config = EvalConfig(
        models={}, reference=str(tiny_model_dir), reward_model=None, task="ifeval",
        prompts=str(prompts), best_of_n=[], output=str(tmp_path / "eval.json"),
    )  # fmt: skip
    with pytest.raises(DataError, match=r"prompts.jsonl line 1: reward function 'ifeval': "):
        evaluate(config)
