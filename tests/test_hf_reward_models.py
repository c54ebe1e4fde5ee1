"""Reward models in the standard Hugging Face format, in and out: a one-label
``AutoModelForSequenceClassification`` (TRL's reward models) scores the same in rlhfkit and in
transformers, keeps its trained head as a scorer, a critic's start and `rlhfkit rm`'s start, and
what `rlhfkit rm` writes is that format. The TRL checks run where the assets of the TRL
benchmarks are (``benchmarks/trl/make_assets.py``: ``runs/trl-assets``, or the directory
``$TRL_BENCH_ASSETS`` names); CI has none."""

import json
import os
from pathlib import Path

import pytest
import torch
from transformers import (
    AutoModelForSequenceClassification,
    AutoTokenizer,
)

from helpers import tiny_corpus, tiny_llama
from rlhfkit.config import RewardConfig
from rlhfkit.data import Comparison, encode_comparisons
from rlhfkit.experience.scorer_loading import load_reward_scorer
from rlhfkit.experience.scorers import ScoreInput
from rlhfkit.models.loading import RewardModel, ValueModel
from rlhfkit.trainers.reward import RewardTrainer, run_reward

TRL_ASSETS = Path(
    os.environ.get("TRL_BENCH_ASSETS", Path(__file__).resolve().parents[1] / "runs" / "trl-assets")
)
TRL_STEP1_LOSS = 0.743634  # TRL's RewardTrainer, first batch of 8 pairs, from reward_model_init
needs_trl_assets = pytest.mark.skipif(
    not (TRL_ASSETS / "manifest.json").is_file(),
    reason="no assets of benchmarks/trl/make_assets.py (TRL's starting point and reward model)",
)


def _pairs(n: int) -> list[dict]:
    """Comparisons whose chosen response says 'good' and rejected 'big' (tiny corpus words)."""
    lines = tiny_corpus(2 * n, seed=3)
    return [
        {"prompt": lines[2 * i], "chosen": " It is a good ball.", "rejected": " It is big."}
        for i in range(n)
    ]


def _texts(rows: list[dict], eos: str) -> list[str]:
    """prompt + response + EOS of every chosen, then every rejected response (TRL's texts)."""
    return [r["prompt"] + r["chosen"] + eos for r in rows] + [
        r["prompt"] + r["rejected"] + eos for r in rows
    ]


def _stock_scores(path, texts: list[str]) -> tuple[torch.Tensor, dict]:
    """transformers alone: the saved tokenizer, right padding, the classifier's logits."""
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "right"
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    model = AutoModelForSequenceClassification.from_pretrained(path).eval()
    with torch.no_grad():
        return model(**batch).logits[:, 0], batch


@pytest.fixture(scope="module")
def classifier_dir(tmp_path_factory, tiny_model_dir, tiny_tokenizer):
    """A trained-looking one-label GPT2ForSequenceClassification made by transformers alone
    (as TRL's RewardTrainer leaves one), with the tokenizer beside it."""
    path = tmp_path_factory.mktemp("classifier")
    no_dropout = {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}  # as TRL's bench
    model = AutoModelForSequenceClassification.from_pretrained(
        tiny_model_dir, num_labels=1, **no_dropout
    )
    model.config.pad_token_id = tiny_tokenizer.pad_token_id
    with torch.no_grad():
        model.score.weight.copy_(torch.randn(model.score.weight.shape, generator=_gen(3)))
    model.save_pretrained(path)
    tiny_tokenizer.save_pretrained(path)
    return path


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def test_a_transformers_classifier_scores_the_same_in_rlhfkit(classifier_dir, tiny_tokenizer):
    texts = _texts(_pairs(4), tiny_tokenizer.eos_token)
    expected, batch = _stock_scores(classifier_dir, texts)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    rm = RewardModel.from_pretrained(classifier_dir).eval()
    stock = AutoModelForSequenceClassification.from_pretrained(classifier_dir)
    assert torch.equal(rm.score.weight, stock.score.weight)  # the trained head, kept
    with torch.no_grad():
        torch.testing.assert_close(rm(ids, mask), expected, atol=1e-6, rtol=1e-6)
        values = ValueModel.from_pretrained(classifier_dir)(ids, mask)  # the critic's start
    last = mask.sum(1) - 1
    torch.testing.assert_close(
        values[torch.arange(len(texts)), last], expected, atol=1e-6, rtol=1e-6
    )

    scorer = load_reward_scorer(str(classifier_dir), tiny_tokenizer)  # as ppo, eval, bon, chat
    assert scorer.tokenizer is None  # the policy's tokenizer: its token ids, no re-tokenising
    split = [tiny_tokenizer(r["prompt"])["input_ids"] for r in _pairs(4)]
    query = [torch.tensor(q) for q in split] * 2
    response = [ids[i, len(query[i]) : int(mask[i].sum())] for i in range(len(texts))]
    batch = ScoreInput.from_ids(tiny_tokenizer, *_left(query), *_right(response))
    torch.testing.assert_close(scorer(batch), expected, atol=1e-5, rtol=0)  # left-padded query


def _left(seqs):
    width = max(len(s) for s in seqs)
    ids = torch.stack([torch.nn.functional.pad(s, (width - len(s), 0), value=1) for s in seqs])
    mask = torch.stack([torch.arange(width) >= width - len(s) for s in seqs]).long()
    return ids, mask


def _right(seqs):
    width = max(len(s) for s in seqs)
    ids = torch.stack([torch.nn.functional.pad(s, (0, width - len(s)), value=1) for s in seqs])
    mask = torch.stack([torch.arange(width) < len(s) for s in seqs]).long()
    return ids, mask


def _step_one_loss(output_dir: Path) -> float:
    rows = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    return next(r["train/loss"] for r in rows if r["step"] == 1 and "train/loss" in r)


def _first_step_config(model, data, output_dir, **overrides) -> RewardConfig:
    """TRL's bench settings (``common_training_args`` in benchmarks/trl/trl_common.py): one
    batch of 8 pairs, fp32, constant LR, AdamW without weight decay, gradient clipping at 1."""
    fields = dict(
        model=str(model),
        train_data=str(data),
        eval_data=None,
        output_dir=str(output_dir),
        batch_size=8,
        max_steps=1,
        learning_rate=5e-5,
        lr_scheduler="constant",
        weight_decay=0.0,
        max_grad_norm=1.0,
        max_length=128,
        log_every=1,
        cpu=True,
        report_to=[],
    )
    return RewardConfig(**{**fields, **overrides})


def test_rm_training_starts_from_a_classifier_with_its_head(
    classifier_dir, tiny_tokenizer, tmp_path
):
    rows = _pairs(8)
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    final = run_reward(_first_step_config(classifier_dir, data, tmp_path / "rm"))
    scores, _ = _stock_scores(classifier_dir, _texts(rows, tiny_tokenizer.eos_token))
    chosen, rejected = scores[:8], scores[8:]
    expected = -torch.nn.functional.logsigmoid(chosen - rejected).mean().item()
    assert _step_one_loss(tmp_path / "rm") == pytest.approx(expected, abs=1e-5)
    # What it wrote is the standard format again, scored the same by transformers.
    texts = _texts(rows[:3], tiny_tokenizer.eos_token)
    stock, batch = _stock_scores(final, texts)
    rm = RewardModel.from_pretrained(final).eval()
    with torch.no_grad():
        ours = rm(batch["input_ids"], batch["attention_mask"])
    torch.testing.assert_close(ours, stock, atol=1e-5, rtol=0)


def test_rm_resumes_exactly_from_standard_checkpoints(tiny_model_dir, tiny_tokenizer, tmp_path):
    rows = _pairs(32)
    records = [Comparison(r["prompt"], r["chosen"], r["rejected"]) for r in rows]
    train, _ = encode_comparisons(records, tiny_tokenizer, 48)

    def trainer(out, **overrides):
        config = _first_step_config(
            "unused", "unused", out, max_steps=6, learning_rate=1e-3, save_every=3, **overrides
        )
        torch.manual_seed(0)
        return RewardTrainer(
            config, RewardModel.from_pretrained(tiny_model_dir), tiny_tokenizer, train
        )

    straight = trainer(tmp_path / "straight")
    straight.train()
    first = trainer(tmp_path / "resumed")
    first.train(stop_after=3)
    checkpoint = tmp_path / "resumed" / "checkpoint-3"
    assert json.loads((checkpoint / "config.json").read_text())["architectures"] == [
        "GPT2ForSequenceClassification"
    ]
    second = trainer(tmp_path / "resumed", resume=True)
    second.train()
    resumed = second.unwrapped_model.state_dict()
    assert all(torch.equal(v, resumed[k]) for k, v in straight.unwrapped_model.state_dict().items())


# --------------------------------------------------------------------------- TRL's own models
@needs_trl_assets
@pytest.mark.parametrize("name", ["reward_model", "reward_model_init"])
def test_trl_reward_models_score_the_same_in_rlhfkit_and_transformers(name):
    tokenizer = AutoTokenizer.from_pretrained(TRL_ASSETS / "tokenizer")
    rows = [json.loads(x) for x in (TRL_ASSETS / "preference_test.jsonl").read_text().splitlines()]
    texts = _texts(rows[:32], tokenizer.eos_token)
    expected, batch = _stock_scores(TRL_ASSETS / name, texts)
    rm = RewardModel.from_pretrained(TRL_ASSETS / name).eval()
    with torch.no_grad():
        ours = rm(batch["input_ids"], batch["attention_mask"])
    torch.testing.assert_close(ours, expected, atol=1e-6, rtol=1e-6)


@needs_trl_assets
def test_rm_from_trls_starting_point_has_trls_first_step_loss(tmp_path):
    """TRL's bench (trl_rm_bench.py) takes the first 8 pairs of preference.jsonl in file order;
    rlhfkit shuffles, so it trains on a file of just those 8 (one batch, the same mean)."""
    lines = (TRL_ASSETS / "preference.jsonl").read_text().splitlines()[:8]
    data = tmp_path / "first8.jsonl"
    data.write_text("\n".join(lines) + "\n")
    run_reward(_first_step_config(TRL_ASSETS / "reward_model_init", data, tmp_path / "rm"))
    assert _step_one_loss(tmp_path / "rm") == pytest.approx(TRL_STEP1_LOSS, abs=1e-5)


def test_rm_on_a_model_without_a_final_norm_bias_leaves_the_score_bias_alone(
    tiny_tokenizer, tmp_path
):
    """RMSNorm (Llama) has no bias the score bias could be folded into: it is not trained,
    so transformers reads what rlhfkit trained."""
    tiny_llama(tiny_tokenizer).save_pretrained(tmp_path / "lm")
    records = [Comparison(r["prompt"], r["chosen"], r["rejected"]) for r in _pairs(8)]
    train, _ = encode_comparisons(records, tiny_tokenizer, 48)
    settings = _first_step_config("unused", "unused", tmp_path / "rm", max_steps=3)
    trainer = RewardTrainer(
        settings, RewardModel.from_pretrained(tmp_path / "lm"), tiny_tokenizer, train
    )
    trainer.train()
    assert not trainer.unwrapped_model.score.bias.requires_grad
    assert torch.count_nonzero(trainer.unwrapped_model.score.bias) == 0
    texts = _texts(_pairs(3), tiny_tokenizer.eos_token)
    stock, batch = _stock_scores(tmp_path / "rm" / "final", texts)
    with torch.no_grad():
        ours = trainer.unwrapped_model.eval()(batch["input_ids"], batch["attention_mask"])
    torch.testing.assert_close(ours, stock, atol=1e-5, rtol=0)
