"""DPO trainer: sequence log-probs, reference handling (precomputed, on the fly, LoRA), learning.

The toy task is separable by one token: the chosen response ends with "!", the rejected one is
the same words ending with "?". Held-out pairs use subject/verb combinations never trained on.
"""

import math
import random
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from helpers import (
    OBJECTS,
    SUBJECTS,
    VERBS,
    stage_config,
    stopped_and_resumed_equals_straight,
    tiny_lm,
    write_jsonl,
)
from rlhfkit import checkpoint as ckpt
from rlhfkit.config import ConfigError, load_config
from rlhfkit.data import Comparison, PairCollator, PreferenceExample, Ranking, encode_comparisons
from rlhfkit.models.loading import disable_dropout
from rlhfkit.models.passes import labelled_logprobs
from rlhfkit.ops.masks import masked_sum
from rlhfkit.trainers.dpo import (
    DPOCollator,
    DPOPair,
    DPOTrainer,
    load_pairs,
    preference_pairs,
    sequence_logps,
)
from rlhfkit.trainers.dpo_config import DPOConfig
from rlhfkit.trainers.loop import epoch_order


def _toy_pairs(tokenizer):
    rng = random.Random(0)
    records = [
        Comparison(f"{s.capitalize()} {v}", f" {o}!", f" {o}?")
        for s in SUBJECTS
        for v in VERBS
        for o in [rng.choice(OBJECTS)]
    ]
    rng.shuffle(records)
    pairs = preference_pairs(encode_comparisons(records, tokenizer, 64)[0])
    return pairs[:40], pairs[40:]


def _config(tmp_path, **overrides):
    return stage_config(
        DPOConfig, tmp_path / "dpo",
        **{"eval_data": None, "batch_size": 8, "eval_batch_size": 16, "max_steps": 20,
           "learning_rate": 1e-3, "log_every": 5, **overrides},
    )  # fmt: skip


def _params(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_sequence_logps_equal_a_plain_loop_over_unpadded_rows(tiny_model, tiny_tokenizer):
    disable_dropout(tiny_model).eval()
    examples = [
        PreferenceExample([5, 6, 7], [[8, 9, 0], [10, 0]]),
        PreferenceExample([11], [[12, 13, 14, 15, 0], [16, 17, 0]]),
    ]
    batch = PairCollator(tiny_tokenizer.pad_token_id)(examples)
    with torch.no_grad():
        summed = sequence_logps(tiny_model, batch)
        averaged = sequence_logps(tiny_model, batch, average=True)
    rows = [(e.prompt_ids, r) for k in range(2) for e in examples for r in [e.response_ids[k]]]
    for i, (prompt, response) in enumerate(rows):
        ids = torch.tensor([prompt + response])
        with torch.no_grad():
            logp = tiny_model(ids).logits[0].log_softmax(-1)  # (T, V)
        picked = [float(logp[len(prompt) + t - 1, tok]) for t, tok in enumerate(response)]
        assert float(summed[i]) == pytest.approx(sum(picked), abs=1e-4)
        assert float(averaged[i]) == pytest.approx(sum(picked) / len(picked), abs=1e-5)


def test_rankings_become_all_pairs_better_first():
    ranking = PreferenceExample([1], [[2], [3], [4]])  # best first
    pairs = preference_pairs([ranking])
    assert [p.example.response_ids for p in pairs] == [[[2], [3]], [[2], [4]], [[3], [4]]]


def test_ranking_record_is_encoded_best_first(tiny_tokenizer):
    record = Ranking("A cat", [" sees it.", " likes it.", " helps."], [2, 0, 1])
    (example,), _ = encode_comparisons([record], tiny_tokenizer, 32)
    best = tiny_tokenizer(" helps.")["input_ids"] + [tiny_tokenizer.eos_token_id]
    assert preference_pairs([example])[0].example.response_ids[0] == best


def test_collator_orders_reference_logps_like_rows():
    pairs = [
        DPOPair(PreferenceExample([1], [[2], [3]]), (-1.0, -2.0)),
        DPOPair(PreferenceExample([1], [[4], [5]]), (-3.0, -4.0)),
    ]
    batch = DPOCollator(pad_id=0)(pairs)
    assert batch["ref_logps"].tolist() == [-1.0, -3.0, -2.0, -4.0]
    assert "ref_logps" not in DPOCollator(pad_id=0)([DPOPair(pairs[0].example)])


def test_first_step_starts_at_ln2_and_precomputed_reference_matches_on_the_fly(
    tiny_model_dir, tiny_tokenizer, tmp_path
):
    train, _ = _toy_pairs(tiny_tokenizer)
    results = []
    for precompute in (True, False):
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
        config = _config(tmp_path, precompute_reference=precompute)
        trainer = DPOTrainer(config, model, tiny_tokenizer, train)
        batch = trainer.collate_fn([trainer.train_data[i] for i in range(8)])
        assert ("ref_logps" in batch) == precompute
        assert (trainer.reference is None) == precompute  # precomputing frees the reference
        ref = batch["ref_logps"] if precompute else trainer.reference_logps(batch)
        loss, metrics = trainer.compute_loss(batch)
        results.append(ref)
        assert float(loss) == pytest.approx(math.log(2), abs=1e-5)
        assert float(metrics["margin"]) == pytest.approx(0.0, abs=1e-5)
    torch.testing.assert_close(results[0], results[1], atol=1e-4, rtol=0)


def test_precomputes_only_the_pairs_a_short_run_visits(tiny_model_dir, tiny_tokenizer, tmp_path):
    train, _ = _toy_pairs(tiny_tokenizer)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    trainer = DPOTrainer(_config(tmp_path, max_steps=2), model, tiny_tokenizer, train)
    done = [i for i, pair in enumerate(trainer.train_data) if pair.ref_logps is not None]
    assert sorted(done) == sorted(int(i) for i in epoch_order(len(train), 42, 0)[:16])
    trainer.train()  # both steps find their reference log-probs
    missing = [trainer.train_data[i] for i in range(len(train)) if i not in done][:8]
    with pytest.raises(RuntimeError, match="without precomputed reference log-probs"):
        trainer.compute_loss(trainer.collate_fn(missing))


def _chosen_nll(model, batch):
    """RPO's NLL by hand: minus the chosen rows' token log-probs, over their token count."""
    logprobs, mask = labelled_logprobs(model, batch)
    n = batch["pair_count"]
    return -float(masked_sum(logprobs[:n], mask[:n])) / int(mask[:n].sum())


def test_rpo_alpha_adds_the_chosen_nll_per_token(tiny_model_dir, tiny_tokenizer, tmp_path):
    train, held_out = _toy_pairs(tiny_tokenizer)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    trainer = DPOTrainer(
        _config(tmp_path, rpo_alpha=0.5), model, tiny_tokenizer, train, held_out[:16]
    )
    batch = trainer.collate_fn(trainer.train_data[:8])
    loss, metrics = trainer.compute_loss(batch)
    with torch.no_grad():
        nll = _chosen_nll(trainer.model, batch)
    # At step 1 the policy is the reference: DPO's part is ln 2 exactly.
    assert float(loss.detach()) == pytest.approx(math.log(2) + 0.5 * nll, abs=1e-5)
    assert float(metrics["nll_chosen"]) == pytest.approx(nll, abs=1e-5)
    assert float(metrics["dpo_loss"]) == pytest.approx(math.log(2), abs=1e-5)
    plain = DPOTrainer(_config(tmp_path), model, tiny_tokenizer, train[:8])
    plain_loss, plain_metrics = plain.compute_loss(plain.collate_fn(plain.train_data))
    assert float(plain_loss.detach()) == pytest.approx(math.log(2), abs=1e-5)
    assert "nll_chosen" not in plain_metrics
    # Evaluation: the same formula over the whole held-out set, its chosen tokens pooled.
    held = trainer.collate_fn(trainer.eval_pairs)
    with torch.no_grad():
        held_nll = _chosen_nll(trainer.model, held)
    metrics = trainer.run_evaluation()
    assert metrics["nll_chosen"] == pytest.approx(held_nll, abs=1e-5)
    assert metrics["loss"] == pytest.approx(math.log(2) + 0.5 * held_nll, abs=1e-5)


def test_rpo_keeps_the_chosen_log_probs_up(tiny_model_dir, tiny_tokenizer, tmp_path):
    train, _ = _toy_pairs(tiny_tokenizer)
    logps = {}
    for alpha in (0.0, 1.0):
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
        config = _config(tmp_path / str(alpha), rpo_alpha=alpha, max_steps=8)
        trainer = DPOTrainer(config, model, tiny_tokenizer, train)
        trainer.train()
        batch = trainer.collate_fn(trainer.train_data[:16])
        with torch.no_grad():
            logps[alpha] = float(sequence_logps(trainer.model, batch)[:16].mean())
    assert logps[1.0] > logps[0.0] + 0.5, logps


def test_a_separate_reference_gives_the_precomputed_log_probs(
    tiny_model_dir, tiny_tokenizer, tmp_path
):
    train, _ = _toy_pairs(tiny_tokenizer)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    reference = disable_dropout(tiny_lm(tiny_tokenizer, seed=1, n_positions=128)).eval()
    trainer = DPOTrainer(_config(tmp_path), model, tiny_tokenizer, train, reference=reference)
    assert trainer.reference is None  # freed once its log-probs are computed
    batch = trainer.collate_fn([trainer.train_data[i] for i in range(8)])
    with torch.no_grad():
        expected = sequence_logps(reference, batch)
        policy = sequence_logps(trainer.model, batch)
    torch.testing.assert_close(batch["ref_logps"], expected, atol=1e-4, rtol=0)
    assert not torch.allclose(expected, policy, atol=1e-2)
    loss, _ = trainer.compute_loss(batch)
    assert abs(float(loss.detach()) - math.log(2)) > 1e-3  # not the policy: no longer ln 2


def test_load_pairs_cuts_prompts_and_responses_as_configured(tiny_tokenizer, tmp_path):
    path = tmp_path / "pairs.jsonl"
    record = {"prompt": "The cat likes the big tree", "chosen": " in the park", "rejected": " no."}
    write_jsonl(path, [record])
    config = _config(tmp_path, max_prompt_length=2, max_response_length=3)
    (pair,) = load_pairs(config, str(path), "train", tiny_tokenizer, None)
    assert len(pair.example.prompt_ids) == 2
    assert [len(r) for r in pair.example.response_ids] == [3, 3]


@pytest.mark.slow
def test_dpo_learns_separable_pairs_and_the_reference_does_not_move(
    tiny_model_dir, tiny_tokenizer, tmp_path
):
    train, held_out = _toy_pairs(tiny_tokenizer)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    reference = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    before = _params(reference)
    config = _config(tmp_path, precompute_reference=False)
    trainer = DPOTrainer(config, model, tiny_tokenizer, train, held_out, reference=reference)
    start = trainer.run_evaluation()
    trainer.train()
    end = trainer.state.eval_metrics
    assert start["accuracy"] == 0.0 and start["margin"] == pytest.approx(0.0, abs=1e-5)
    assert end["accuracy"] >= 0.9
    assert end["margin"] > 0.5
    assert end["loss"] < 0.45
    for name, value in _params(reference).items():
        assert torch.equal(value, before[name]), name


@pytest.mark.slow
@pytest.mark.parametrize("loss_type", ["ipo", "conservative"])
def test_variants_learn_with_precomputed_reference(
    loss_type, tiny_model_dir, tiny_tokenizer, tmp_path
):
    train, held_out = _toy_pairs(tiny_tokenizer)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    smoothing = 0.1 if loss_type == "conservative" else 0.0
    config = _config(tmp_path, loss_type=loss_type, label_smoothing=smoothing, max_steps=15)
    trainer = DPOTrainer(config, model, tiny_tokenizer, train, held_out)
    start = trainer.run_evaluation()
    trainer.train()
    end = trainer.state.eval_metrics
    assert end["accuracy"] >= 0.9
    assert end["margin"] > 0.1
    assert end["loss"] < start["loss"] * 0.8


@pytest.mark.slow
def test_lora_reference_is_the_model_with_its_adapter_disabled(
    tiny_model_dir, tiny_tokenizer, tmp_path
):
    train, held_out = _toy_pairs(tiny_tokenizer)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    base = _params(model)
    config = _config(
        tmp_path, lora=True, precompute_reference=False, max_steps=10, learning_rate=1e-2
    )
    trainer = DPOTrainer(config, model, tiny_tokenizer, train, held_out)
    batch = trainer.collate_fn(held_out[:8])
    ref_before = trainer.reference_logps(batch)
    trainer.train()
    end = trainer.state.eval_metrics
    torch.testing.assert_close(trainer.reference_logps(batch), ref_before, atol=1e-4, rtol=0)
    assert end["margin"] > 0.1
    # Only the adapter trained: the base weights are exactly the loaded ones.
    peft_state = trainer.unwrapped_model.get_base_model().state_dict()
    for name, value in base.items():
        key = next(k for k in peft_state if k.replace(".base_layer", "") == name)
        assert torch.equal(peft_state[key], value), name
    # final/ is the merged model, loadable as a plain causal LM with the trained behaviour;
    # the checkpoint holds the adapter, which resume loads back.
    with torch.no_grad():
        trained = sequence_logps(trainer.model, batch)
        merged = AutoModelForCausalLM.from_pretrained(tmp_path / "dpo" / "final")
        torch.testing.assert_close(sequence_logps(merged, batch), trained, atol=1e-4, rtol=0)
        fresh = DPOTrainer(
            config, AutoModelForCausalLM.from_pretrained(tiny_model_dir), tiny_tokenizer, train
        )
        checkpoint = tmp_path / "dpo" / "checkpoint-10"
        fresh.checkpoints.load_trained(checkpoint, ckpt.read_json(checkpoint / ckpt.STATE_FILE))
        torch.testing.assert_close(sequence_logps(fresh.model, batch), trained, atol=1e-5, rtol=0)


def test_resume_with_precomputed_reference_equals_an_uninterrupted_run(
    tiny_model_dir, tiny_tokenizer, tmp_path
):
    # A resumed run precomputes the reference from the starting weights again, before the
    # checkpoint is loaded, so the reference log-probs and the trajectory match.
    train, _ = _toy_pairs(tiny_tokenizer)

    def trainer(out, **overrides):
        config = _config(tmp_path, output_dir=str(tmp_path / out), max_steps=4, **overrides)
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
        return DPOTrainer(config, model, tiny_tokenizer, train)

    stopped_and_resumed_equals_straight(trainer, stop_after=2)


def test_disable_dropout_makes_train_mode_deterministic(tiny_model):
    ids = torch.tensor([[5, 6, 7, 8]])
    tiny_model.train()
    disable_dropout(tiny_model)
    torch.testing.assert_close(tiny_model(ids).logits, tiny_model(ids).logits)


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"beta": 0.0}, "beta"),
        ({"loss_type": "hinge"}, "loss_type"),
        ({"loss_type": "conservative"}, "label_smoothing"),
        ({"label_smoothing": 0.1}, "label_smoothing"),
        ({"lora": True, "reference": "some/model"}, "reference"),
        ({"rpo_alpha": -0.1}, "rpo_alpha"),
        ({"max_prompt_length": 0}, "max_prompt_length"),
        ({"max_response_length": 0}, "max_response_length"),
    ],
)
def test_config_errors_name_the_field(fields, field):
    with pytest.raises(ConfigError, match=f"DPOConfig.{field} = "):
        DPOConfig(**fields)


def test_shipped_config_loads_and_points_at_the_demo_data():
    root = Path(__file__).resolve().parents[1]
    config = load_config(DPOConfig, root / "configs" / "dpo.yaml")
    assert config.output_dir == "runs/dpo" and config.precompute_reference
    for path in (config.train_data, config.eval_data):
        assert (root / path).is_dir(), path
