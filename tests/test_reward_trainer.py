"""Reward trainer: metrics and loss dispatch by hand, learning a separable preference (pairs and
K-way rankings), frozen parameters, InstructGPT normalisation, reward centring, dropout, run
from files."""

import json
import random

import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from helpers import stage_config
from rlhfkit.config import ConfigError, RewardConfig
from rlhfkit.data import (
    Comparison,
    Demonstration,
    PairCollator,
    Ranking,
    SFTCollator,
    encode_comparisons,
    encode_demonstrations,
)
from rlhfkit.models.loading import RewardModel
from rlhfkit.ops.losses import pairwise_logsigmoid_loss, ranking_loss, reward_centering
from rlhfkit.trainers.reward import (
    RewardTrainer,
    preference_loss,
    ranking_metrics,
    run_reward,
)

SUBJECTS = ["The cat", "A dog", "My friend", "The teacher", "A small bird", "The robot"]
OBJECTS = ["ball", "tree", "food", "book", "sky", "park"]
# The marker words, best first: the preference depends on them alone.
MARKERS = ["good", "new", "big"]


def _answer(rng: random.Random, marker: str) -> str:
    return f" It is a {marker} {rng.choice(OBJECTS)}."


def pairs(n: int, seed: int) -> list[Comparison]:
    rng = random.Random(seed)
    return [
        Comparison(f"Q: what does {rng.choice(SUBJECTS)} see?", _answer(rng, "good"),
                   _answer(rng, "big"))
        for _ in range(n)
    ]  # fmt: skip


def rankings(n: int, seed: int) -> list[Ranking]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        order = rng.sample(range(3), 3)  # shuffled responses; `ranking` lists them best first
        responses = [_answer(rng, MARKERS[k]) for k in order]
        out.append(Ranking(f"Q: what does {rng.choice(SUBJECTS)} see?", responses,
                           [order.index(k) for k in range(3)]))  # fmt: skip
    return out


def _config(tmp_path, **overrides):
    return stage_config(
        RewardConfig, tmp_path / "rm",
        **{"eval_data": None, "batch_size": 8, "max_steps": 12, "learning_rate": 2e-3,
           "log_every": 5, "max_length": 48, "resume": True, **overrides},
    )  # fmt: skip


def _model(model_dir):
    torch.manual_seed(0)
    return RewardModel.from_pretrained(model_dir)


def test_ranking_metrics_by_hand():
    scores = torch.tensor([[3.0, 1.0, 2.0], [2.0, 0.0, 0.0], [1.0, 2.0, 3.0]])
    valid = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 1]])
    m = ranking_metrics(scores, valid)
    # pairs (0,1) (0,2) (1,2): row 0 -> +2 +1 -1; row 1 -> +2 only; row 2 -> -1 -2 -1
    assert m["accuracy"] == pytest.approx(3 / 7)
    assert m["margin"] == pytest.approx((2 + 1 - 1 + 2 - 1 - 2 - 1) / 7)
    assert m["ranking_accuracy"] == pytest.approx((2 / 3 + 0) / 2)  # rows with K = 3
    assert m["ranking_exact"] == 0.0
    assert "ranking_accuracy" not in ranking_metrics(scores[1:2, :2], valid[1:2, :2])


def test_loss_dispatch():
    chosen, rejected = torch.tensor([1.0, -1.0]), torch.tensor([0.0, 0.5])
    table = torch.stack([chosen, rejected], 1)  # (N, 2)
    valid = torch.ones_like(table, dtype=torch.bool)
    got = preference_loss(table, valid, "logsigmoid", margin=0.5)
    expected = -torch.nn.functional.logsigmoid(chosen - rejected - 0.5).mean()
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(got, pairwise_logsigmoid_loss(chosen, rejected, torch.tensor(0.5)))
    got = preference_loss(table, valid, "logexp")
    torch.testing.assert_close(got, torch.log1p(torch.exp(rejected - chosen)).mean())
    three = torch.tensor([[1.0, 0.0, -1.0]])  # K = 3: InstructGPT's ranking loss, margin unused
    valid = torch.ones_like(three, dtype=torch.bool)
    torch.testing.assert_close(
        preference_loss(three, valid, margin=0.5), ranking_loss(three, valid)
    )


def test_centring_adds_its_weighted_term_to_each_loss():
    table = torch.tensor([[1.0, -0.5], [2.0, 1.0]])  # (r_c + r_r)^2: 0.25 and 9, mean 4.625
    valid = torch.ones_like(table, dtype=torch.bool)
    for loss in ("logsigmoid", "logexp"):
        plain = preference_loss(table, valid, loss)
        torch.testing.assert_close(
            preference_loss(table, valid, loss, center_coef=0.1), plain + 0.1 * 4.625
        )
    three, valid = torch.tensor([[1.0, 0.0, -1.0]]), torch.ones(1, 3, dtype=torch.bool)
    centred = preference_loss(three, valid, center_coef=0.5)  # (1+0)^2, (1-1)^2, (0-1)^2: 2/3
    torch.testing.assert_close(centred, ranking_loss(three, valid) + 0.5 * 2 / 3)


def test_trainer_with_centring_computes_its_loss_and_centres_the_rewards(
    tiny_model_dir, tiny_tokenizer, tmp_path
):
    train, _ = encode_comparisons(pairs(32, seed=1), tiny_tokenizer, 48)
    config = _config(tmp_path, center_rewards_coef=0.5)
    trainer = RewardTrainer(config, _model(tiny_model_dir), tiny_tokenizer, train)
    batch = trainer.collate(train[:8])
    loss, metrics = trainer.compute_loss(batch)
    with torch.no_grad():
        scores = trainer.model(batch["input_ids"], batch["attention_mask"])  # chosen, rejected
        chosen, rejected = scores[:8], scores[8:]
    expected = pairwise_logsigmoid_loss(chosen, rejected) + 0.5 * ((chosen + rejected) ** 2).mean()
    assert float(loss.detach()) == pytest.approx(float(expected), abs=1e-5)
    assert metrics["centering"] == pytest.approx(float(((chosen + rejected) ** 2).mean()), abs=1e-5)

    sums = {}
    for coef in (0.0, 1.0):
        model = _model(tiny_model_dir)
        with torch.no_grad():
            model.score.bias.fill_(3.0)  # start off-centre: every reward about 3
        config = _config(tmp_path / str(coef), center_rewards_coef=coef, max_steps=8)
        trainer = RewardTrainer(config, model, tiny_tokenizer, train)
        trainer.train()
        model.eval()
        with torch.no_grad():
            table, valid = trainer.score_table(trainer.collate(train))
        sums[coef] = float(reward_centering(table, valid))
    assert sums[1.0] < 0.25 * sums[0.0], sums


@pytest.mark.parametrize("disable", [True, False])
def test_dropout_is_off_by_default(tiny_model_dir, tiny_tokenizer, tmp_path, disable):
    model = _model(tiny_model_dir)
    assert max(m.p for m in model.modules() if isinstance(m, torch.nn.Dropout)) > 0
    train, _ = encode_comparisons(pairs(2, seed=1), tiny_tokenizer, 48)
    RewardTrainer(_config(tmp_path, disable_dropout=disable), model, tiny_tokenizer, train)
    dropouts = [m.p for m in model.modules() if isinstance(m, torch.nn.Dropout)]
    assert (max(dropouts) == 0) == disable
    assert RewardConfig.disable_dropout is True


def test_config_refuses_a_negative_centring_weight():
    with pytest.raises(ConfigError, match="RewardConfig.center_rewards_coef = -0.1"):
        RewardConfig(center_rewards_coef=-0.1)


def test_rm_learns_separable_pairs_with_frozen_embeddings(tiny_model_dir, tiny_tokenizer, tmp_path):
    train, _ = encode_comparisons(pairs(64, seed=1), tiny_tokenizer, 48)
    held_out, _ = encode_comparisons(pairs(32, seed=2), tiny_tokenizer, 48)
    demos, _ = encode_demonstrations(
        [Demonstration(c.prompt, c.chosen) for c in pairs(16, seed=3)], tiny_tokenizer, 48
    )
    model = _model(tiny_model_dir)
    wpe = model.backbone.wpe.weight
    wpe.requires_grad_(False)
    frozen = wpe.detach().clone()
    trainer = RewardTrainer(
        _config(tmp_path), model, tiny_tokenizer, train, held_out, normalize_examples=demos
    )
    before = trainer.run_evaluation()
    trainer.train()
    after = trainer.state.eval_metrics
    assert before["accuracy"] < 0.8 and after["accuracy"] >= 0.9, (before, after)
    assert after["margin"] > before["margin"] + 1.0
    assert torch.equal(wpe.detach(), frozen)

    # Normalised at the end: the demonstrations now score 0 on average.
    model.eval()
    batch = SFTCollator(tiny_tokenizer.pad_token_id)(demos)
    with torch.no_grad():
        mean = model(batch["input_ids"], batch["attention_mask"]).mean()
    assert abs(mean.item()) < 1e-4
    reloaded = RewardModel.from_pretrained(tmp_path / "rm" / "final")
    torch.testing.assert_close(reloaded.score.bias, model.score.bias)


def test_rm_learns_k_way_rankings(tiny_model_dir, tiny_tokenizer, tmp_path):
    train, _ = encode_comparisons(rankings(48, seed=4), tiny_tokenizer, 48)
    held_out, _ = encode_comparisons(rankings(24, seed=5), tiny_tokenizer, 48)
    trainer = RewardTrainer(
        _config(tmp_path, batch_size=6), _model(tiny_model_dir), tiny_tokenizer, train, held_out
    )
    before = trainer.run_evaluation()
    trainer.train()
    after = trainer.state.eval_metrics
    assert before["ranking_accuracy"] < 0.8, before
    assert after["ranking_accuracy"] >= 0.9 and after["ranking_exact"] >= 0.8, after


def comparisons_of_rankings(n: int, seed: int) -> list[Comparison]:
    """Every pair of K = 3 marker responses a prompt, as separate comparisons: 3 per prompt,
    each prompt numbered, so no two are the same."""
    return [
        Comparison(f"{r.prompt} ({n})", r.responses[better], r.responses[worse])
        for n, r in enumerate(rankings(n, seed))
        for i, better in enumerate(r.ranking)
        for worse in r.ranking[i + 1 :]
    ]


@pytest.mark.parametrize("options", [{}, {"margin": 0.5, "center_rewards_coef": 0.1}])
def test_grouped_comparisons_give_the_loss_and_metrics_of_their_pairs(
    tiny_model_dir, tiny_tokenizer, tmp_path, options
):
    examples, _ = encode_comparisons(comparisons_of_rankings(6, seed=8), tiny_tokenizer, 48)
    results = {}
    for grouped in (False, True):
        config = _config(tmp_path / str(grouped), group_by_prompt=grouped, **options)
        trainer = RewardTrainer(config, _model(tiny_model_dir), tiny_tokenizer, examples, examples)
        trainer.model.eval()
        batch = trainer.collate(trainer.train_data)
        with torch.no_grad():
            loss, metrics = trainer.compute_loss(batch)
        results[grouped] = (batch["input_ids"].shape[0], loss, metrics, trainer.run_evaluation())
    (
        (rows, loss, metrics, evaluation),
        (grouped_rows, grouped_loss, grouped_metrics, grouped_eval),
    ) = (
        results[False],
        results[True],
    )
    assert (rows, grouped_rows) == (36, 18)  # 18 pairs of 18 responses: each scored once
    torch.testing.assert_close(grouped_loss, loss, atol=1e-5, rtol=0)
    for key in ("accuracy", "margin"):
        assert grouped_metrics[key] == pytest.approx(metrics[key], abs=1e-5)
        assert grouped_eval[key] == pytest.approx(evaluation[key], abs=1e-5)


def test_rm_learns_from_comparisons_grouped_by_prompt(tiny_model_dir, tiny_tokenizer, tmp_path):
    train, _ = encode_comparisons(comparisons_of_rankings(48, seed=4), tiny_tokenizer, 48)
    held_out, _ = encode_comparisons(comparisons_of_rankings(24, seed=5), tiny_tokenizer, 48)
    config = _config(tmp_path, batch_size=6, group_by_prompt=True)
    trainer = RewardTrainer(config, _model(tiny_model_dir), tiny_tokenizer, train, held_out)
    assert len(trainer.train_data) == 48  # 144 comparisons, one example per prompt
    before = trainer.run_evaluation()
    trainer.train()
    after = trainer.state.eval_metrics
    assert before["accuracy"] < 0.8, before
    assert after["accuracy"] >= 0.9, after


def test_rm_with_lora_learns_resumes_exactly_and_writes_a_merged_model(
    tiny_model_dir, tiny_tokenizer, tmp_path
):
    train, _ = encode_comparisons(pairs(64, seed=1), tiny_tokenizer, 48)
    held_out, _ = encode_comparisons(pairs(32, seed=2), tiny_tokenizer, 48)
    lora = dict(lora=True, lora_r=8, learning_rate=1e-2, save_every=6)

    def trainer(out, **overrides):
        config = _config(out, **lora, **overrides)
        return RewardTrainer(config, _model(tiny_model_dir), tiny_tokenizer, train, held_out)

    straight = trainer(tmp_path / "straight")
    before = straight.run_evaluation()
    straight.train()
    assert straight.state.eval_metrics["accuracy"] > before["accuracy"] + 0.2
    first = trainer(tmp_path / "resumed")
    first.train(stop_after=6)
    assert (tmp_path / "resumed" / "rm" / "checkpoint-6" / "adapter_model.safetensors").is_file()
    second = trainer(tmp_path / "resumed", resume=True)
    second.train()
    live = {k: v for k, v in straight.unwrapped_model.state_dict().items()}
    resumed = second.unwrapped_model.state_dict()
    assert all(torch.equal(v, resumed[k]) for k, v in live.items())

    final = RewardModel.from_pretrained(tmp_path / "straight" / "rm" / "final").eval()
    assert not any("lora_" in k for k in final.state_dict())  # merged: a plain backbone
    batch = PairCollator(tiny_tokenizer.pad_token_id)(held_out[:4])
    model = straight.unwrapped_model.eval()
    with torch.no_grad():
        expected = model(batch["input_ids"], batch["attention_mask"])
        got = final(batch["input_ids"], batch["attention_mask"])
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    stock = AutoModelForSequenceClassification.from_pretrained(
        tmp_path / "straight" / "rm" / "final"
    )
    with torch.no_grad():  # the merged model is the standard format too
        logits = stock.eval()(batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    torch.testing.assert_close(logits[:, 0], expected, atol=1e-5, rtol=0)


def test_run_reward_from_files(tiny_model_dir, tmp_path):
    rows = [{"prompt": c.prompt, "chosen": c.chosen, "rejected": c.rejected} for c in pairs(12, 6)]
    rows += [{"prompt": r.prompt, "responses": r.responses, "ranking": r.ranking}
             for r in rankings(4, 7)]  # fmt: skip
    path = tmp_path / "comparisons.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = _config(
        tmp_path, model=str(tiny_model_dir), train_data=str(path), eval_data=str(path), max_steps=2
    )
    final = run_reward(config)
    loaded = RewardModel.from_pretrained(final).eval()
    assert json.loads((final / "config.json").read_text())["architectures"] == [
        "GPT2ForSequenceClassification"
    ]
    assert (final / "tokenizer.json").is_file()
    state = json.loads((final / "trainer_state.json").read_text())
    assert state["complete"] and {"accuracy", "ranking_accuracy"} <= set(state["eval_metrics"])
    assert loaded.score.weight.shape == (1, 64)
    # transformers alone, with the saved tokenizer, scores prompt + response + EOS as rlhfkit.
    tokenizer = AutoTokenizer.from_pretrained(final)
    texts = [r["prompt"] + r["chosen"] + tokenizer.eos_token for r in rows[:6]]
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    stock = AutoModelForSequenceClassification.from_pretrained(final).eval()
    with torch.no_grad():
        expected = stock(**batch).logits[:, 0]
        got = loaded(batch["input_ids"], batch["attention_mask"])
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
