"""The RL stage without a critic (the GRPO, RLOO and REINFORCE++ presets of `RLTrainer`):
group advantages, the loss against a plain loop, learning a trivially learnable reward with
the reference unchanged, several updates per generation, LoRA reference, the command end to
end."""

import dataclasses
import functools
import json
from pathlib import Path

import pytest
import torch

from helpers import (
    TargetFraction,
    on_device,
    stage_config,
    stopped_and_resumed_equals_straight,
    tiny_corpus,
    tiny_lm,
    tiny_prompts,
)
from rlhfkit.config import ConfigError, load_config
from rlhfkit.data import PromptCollator
from rlhfkit.experience.rollout import estimate_advantages, rollout_stats
from rlhfkit.experience.scorer_loading import build_scorer
from rlhfkit.ops.advantages import group_advantages
from rlhfkit.trainers.rl import RLTrainer, run_rl
from rlhfkit.trainers.rl_config import RLConfig


def _config(tmp_path, **overrides):
    return stage_config(
        functools.partial(RLConfig.preset, "grpo"), tmp_path / "run",
        **{"reward_functions": ["unused:unused"], "rollout_batch_size": 4, "num_generations": 4,
           "batch_size": 16, "max_new_tokens": 8, "max_steps": 20, "learning_rate": 3e-3,
           "log_every": 5, "sample_every": 10, "seed": 0, **overrides},
    )  # fmt: skip


def _advantages(scores, config, kl=None, kl_coef=0.0):
    """(B,) the advantage of each response as the config's experience settings estimate it
    (every token of a response gets its response's), from (B,) scores; responses of 2
    tokens."""
    mask = torch.ones(len(scores), 2)
    rewards = torch.zeros(len(scores), 2)
    settings = config.rollout_settings(1)
    advantages, returns, values = estimate_advantages(
        settings, scores, kl, kl_coef, rewards, None, mask
    )
    assert returns is None and values is None  # no critic
    torch.testing.assert_close(advantages[:, 0], advantages[:, 1])
    return advantages[:, 0]


def test_advantage_dispatch_by_hand(tmp_path):
    scores = torch.tensor([1.0, 2.0, 3.0, 6.0])
    std = (14 / 3) ** 0.5  # unbiased std of the group
    grpo = _advantages(scores, _config(tmp_path))
    torch.testing.assert_close(grpo, (scores - 3.0) / (std + 1e-6))
    dr_grpo = _advantages(scores, _config(tmp_path, scale_rewards=False))
    torch.testing.assert_close(dr_grpo, scores - 3.0)
    rloo = _advantages(scores, _config(tmp_path, advantage_estimator="rloo"))
    torch.testing.assert_close(rloo, torch.tensor([1 - 11 / 3, 2 - 10 / 3, 0.0, 4.0]))
    # The KL in the scores: each response's total reward is its score less beta x its KL.
    kl = torch.tensor([[0.5, 0.5], [0.0, 0.0], [1.0, 1.0], [0.0, 2.0]])
    in_scores = _advantages(scores, _config(tmp_path, scale_rewards=False), kl, 0.5)
    totals = torch.tensor([0.5, 2.0, 2.0, 5.0])
    torch.testing.assert_close(in_scores, totals - totals.mean())


def _loss(trainer, batch):
    """One micro-batch as an iteration makes and learns from it: its experience, then its
    loss; the statistics of both."""
    rollout = trainer.make_experience(batch)
    loss, stats = trainer.policy_loss(rollout)
    return loss, rollout_stats(rollout, trainer.config.num_generations) | stats


@pytest.mark.parametrize("padding_free", [True, False])
def test_loss_and_gradient_equal_a_plain_loop(padding_free, tiny_tokenizer, tmp_path):
    scorer = TargetFraction()
    beta = 0.1
    prompts = tiny_prompts(tiny_tokenizer)
    reference = tiny_lm(tiny_tokenizer, seed=1)  # differs from the policy: the KL term is not 0
    trainer = RLTrainer(
        _config(tmp_path, kl_coef=beta, padding_free=padding_free),
        tiny_lm(tiny_tokenizer),
        tiny_tokenizer,
        prompts,
        scorer,
        reference=reference,
    )
    assert trainer.models.packed == padding_free
    batch = PromptCollator(tiny_tokenizer.pad_token_id)(prompts[:4])
    loss, metrics = _loss(trainer, batch)
    loss.backward()
    weight = trainer.model.transformer.wte.weight
    grad = weight.grad.clone()
    weight.grad = None

    # The same loss, one unpadded row at a time. The surrogate at ratio 1 has the value
    # -sum_i A_i len_i / tokens and the gradient of -sum_i A_i sum_t logp_it / tokens; the
    # KL term is beta * sum_it k3_it / tokens with k3 = exp(ref - logp) - (ref - logp) - 1.
    samples = scorer.last
    advantages = group_advantages(scorer.score(samples), 4)
    lengths = samples.response_mask.sum(1)
    surrogate, kl, k1 = torch.zeros(()), torch.zeros(()), 0.0
    for i in range(len(advantages)):
        prompt = samples.query[i][samples.query_mask[i] != 0]
        response = samples.response[i, : lengths[i]]
        ids = torch.cat([prompt, response])[None]
        rows = slice(len(prompt) - 1, -1)  # logits at t predict token t + 1
        logp = trainer.model(ids).logits[0, rows].log_softmax(-1).gather(-1, response[:, None])
        with torch.no_grad():
            ref = reference(ids).logits[0, rows].log_softmax(-1).gather(-1, response[:, None])
        surrogate = surrogate - advantages[i] * logp.sum()
        kl = kl + (torch.exp(ref - logp) - (ref - logp) - 1).sum()
        k1 += float((logp - ref).sum().detach())
    ((surrogate + beta * kl) / lengths.sum()).backward()
    expected_value = (-(advantages * lengths).sum() + beta * kl.detach()) / lengths.sum()
    assert loss.item() == pytest.approx(expected_value.item(), abs=1e-5)
    assert float(metrics["loss/kl_k3"]) == pytest.approx(
        float(kl.detach() / lengths.sum()), rel=1e-4
    )
    assert float(metrics["loss/kl_k3"]) > 0.01
    assert float(metrics["kl/ref"]) == pytest.approx(k1 / len(advantages), rel=1e-4)
    torch.testing.assert_close(grad, weight.grad, atol=1e-6, rtol=1e-4)
    assert float(metrics["policy/ratio"]) == pytest.approx(1.0)
    assert float(metrics["policy/clipfrac"]) == 0.0


class _HalfGroupsUniform(TargetFraction):
    """TargetFraction, but every score of the first two groups (of four) is the same: the
    groups ``skip_uniform_groups`` leaves out."""

    def score(self, batch):
        scores = super().score(batch).clone()
        scores[:8] = 0.5
        return scores


@pytest.mark.parametrize(
    "aggregation, skip, weighted",
    [
        ("sequence_mean", False, False),
        ("constant", False, False),
        ("token_mean", True, False),
        ("sequence_mean", True, False),
        ("token_mean", False, True),
    ],
)
def test_loss_aggregations_and_skipped_groups_equal_a_plain_loop(
    aggregation, skip, weighted, tiny_tokenizer, tmp_path
):
    scorer, beta, max_new_tokens = _HalfGroupsUniform(), 0.1, 8
    prompts = tiny_prompts(tiny_tokenizer)
    reference = tiny_lm(tiny_tokenizer, seed=1)
    config = _config(
        tmp_path,
        kl_coef=beta,
        loss_aggregation=aggregation,
        skip_uniform_groups=skip,
        kl_importance_weight=weighted,
        max_new_tokens=max_new_tokens,
    )
    trainer = RLTrainer(
        config, tiny_lm(tiny_tokenizer), tiny_tokenizer, prompts, scorer, reference=reference
    )
    loss, metrics = _loss(trainer, PromptCollator(tiny_tokenizer.pad_token_id)(prompts[:4]))
    loss.backward()
    weight = trainer.model.transformer.wte.weight
    grad, weight.grad = weight.grad.clone(), None

    # Row by row: each response's surrogate -A sum_t logp and its k3 sum, then aggregated as
    # the setting says over the rows in the loss (with skip: not those of the first 2 groups).
    samples = scorer.last
    advantages = group_advantages(scorer.score(samples), 4)
    lengths = samples.response_mask.sum(1)
    kept = range(8, 16) if skip else range(16)
    terms, values = [], []
    for i in kept:
        prompt = samples.query[i][samples.query_mask[i] != 0]
        response = samples.response[i, : lengths[i]]
        ids = torch.cat([prompt, response])[None]
        rows = slice(len(prompt) - 1, -1)
        logp = trainer.model(ids).logits[0, rows].log_softmax(-1).gather(-1, response[:, None])
        with torch.no_grad():
            ref = reference(ids).logits[0, rows].log_softmax(-1).gather(-1, response[:, None])
        k3 = (torch.exp(ref - logp) - (ref - logp) - 1).sum()
        if weighted:  # k3's value, the gradient of sum_t (log pi - log ref) log pi: k1's
            k1 = (logp - ref).detach()
            k3 = k3.detach() + (k1 * logp).sum() - (k1 * logp).sum().detach()
        terms.append(-advantages[i] * logp.sum() + beta * k3)
        values.append(-advantages[i] * lengths[i] + beta * k3.detach())
    if aggregation == "token_mean":
        divisors = [float(sum(lengths[i] for i in kept))] * len(kept)
    elif aggregation == "sequence_mean":
        divisors = [float(lengths[i]) * len(kept) for i in kept]
    else:  # constant: every row of the micro-batch counts, kept or not
        divisors = [16.0 * max_new_tokens] * len(kept)
    sum(t / d for t, d in zip(terms, divisors, strict=True)).backward()
    expected = sum(float(v) / d for v, d in zip(values, divisors, strict=True))
    assert float(loss) == pytest.approx(expected, abs=1e-5)
    torch.testing.assert_close(grad, weight.grad, atol=1e-6, rtol=1e-4)
    assert float(metrics["score/groups_without_signal"]) >= 0.5


def test_kl_in_reward_moves_the_kl_from_the_loss_to_the_scores(tiny_tokenizer, tmp_path):
    scorer, beta = TargetFraction(), 0.5
    prompts = tiny_prompts(tiny_tokenizer)
    reference = tiny_lm(tiny_tokenizer, seed=1)
    config = _config(tmp_path, kl_coef=beta, kl_in_loss=False)
    trainer = RLTrainer(
        config, tiny_lm(tiny_tokenizer), tiny_tokenizer, prompts, scorer, reference=reference
    )
    loss, metrics = _loss(trainer, PromptCollator(tiny_tokenizer.pad_token_id)(prompts[:4]))
    assert "loss/kl_k3" not in metrics
    samples = scorer.last
    lengths = samples.response_mask.sum(1)
    k1 = []
    for i in range(len(lengths)):  # each response's k1 KL summed over its tokens, row by row
        prompt = samples.query[i][samples.query_mask[i] != 0]
        response = samples.response[i, : lengths[i]]
        ids = torch.cat([prompt, response])[None]
        rows = slice(len(prompt) - 1, -1)
        with torch.no_grad():
            logp = trainer.model(ids).logits[0, rows].log_softmax(-1).gather(-1, response[:, None])
            ref = reference(ids).logits[0, rows].log_softmax(-1).gather(-1, response[:, None])
        k1.append(float((logp - ref).sum()))
    penalised = scorer.score(samples) - beta * torch.tensor(k1)
    advantages = group_advantages(penalised, 4)
    # At ratio 1 the surrogate's value is -sum_i A_i len_i / tokens, with no KL term.
    expected = -(advantages * lengths).sum() / lengths.sum()
    assert loss.item() == pytest.approx(expected.item(), abs=1e-5)
    assert float(metrics["kl/ref"]) == pytest.approx(sum(k1) / len(k1), rel=1e-4)


def test_reinforce_pp_gradient_equals_a_plain_loop(tiny_tokenizer, tmp_path):
    """REINFORCE++: per-token rewards -beta k1 (the score at the last token), returns to the
    end of the response, whitened over the micro-batch's tokens; no KL term in the loss."""
    scorer, beta = TargetFraction(), 0.5
    prompts = tiny_prompts(tiny_tokenizer)
    reference = tiny_lm(tiny_tokenizer, seed=1)
    config = _config(tmp_path, kl_coef=beta, advantage_estimator="reinforce++", kl_in_loss=False)
    trainer = RLTrainer(
        config, tiny_lm(tiny_tokenizer), tiny_tokenizer, prompts, scorer, reference=reference
    )
    loss, metrics = _loss(trainer, PromptCollator(tiny_tokenizer.pad_token_id)(prompts[:4]))
    assert "loss/kl_k3" not in metrics
    loss.backward()
    weight = trainer.model.transformer.wte.weight
    grad, weight.grad = weight.grad.clone(), None

    samples = scorer.last
    scores = scorer.score(samples).tolist()
    lengths = samples.response_mask.sum(1).tolist()
    logps, returns = [], []
    for i, n in enumerate(lengths):
        prompt = samples.query[i][samples.query_mask[i] != 0]
        response = samples.response[i, :n]
        ids = torch.cat([prompt, response])[None]
        rows = slice(len(prompt) - 1, -1)
        logp = trainer.model(ids).logits[0, rows].log_softmax(-1).gather(-1, response[:, None])
        with torch.no_grad():
            ref = reference(ids).logits[0, rows].log_softmax(-1).gather(-1, response[:, None])
        rewards = (-beta * (logp.detach() - ref)).view(-1).tolist()
        rewards[-1] += scores[i]
        returns.append([sum(rewards[t:]) for t in range(n)])
        logps.append(logp.view(-1))
    flat = [g for row in returns for g in row]
    mean = sum(flat) / len(flat)
    std = (sum((g - mean) ** 2 for g in flat) / (len(flat) - 1)) ** 0.5
    surrogate = sum(
        -((torch.tensor(row) - mean) / std * logp).sum()
        for row, logp in zip(returns, logps, strict=True)
    )
    (surrogate / sum(lengths)).backward()
    torch.testing.assert_close(grad, weight.grad, atol=1e-5, rtol=1e-3)


@pytest.mark.slow
@pytest.mark.parametrize(
    "overrides",
    [
        {"advantage_estimator": "grpo"},
        {"advantage_estimator": "rloo"},
        {"importance_sampling_level": "sequence", "ppo_epochs": 2},  # GSPO
    ],
)
def test_learns_a_trivial_reward_and_the_reference_does_not_move(
    overrides, tiny_tokenizer, tmp_path
):
    prompts = tiny_prompts(tiny_tokenizer)
    config = _config(tmp_path, **overrides)
    trainer = RLTrainer(
        config,
        tiny_lm(tiny_tokenizer),
        tiny_tokenizer,
        prompts,
        TargetFraction(),
        eval_prompts=prompts[:32],
    )
    before = {k: v.clone() for k, v in trainer.models.reference.state_dict().items()}
    start = trainer.run_evaluation()["score"]
    trainer.train()
    end = trainer.state.eval_metrics["score"]
    assert start < 0.15
    assert end > 0.16 and end - start > 0.08
    for name, value in trainer.models.reference.state_dict().items():
        assert torch.equal(value, before[name]), name
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    kls = [row["train/kl/ref"] for row in logged if "train/kl/ref" in row]
    assert kls[-1] > kls[0] > 0  # the policy moved away from the reference, and it is measured
    samples = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").open()]
    assert {s["step"] for s in samples} == {1, 10, 20}
    assert {"prompt", "response", "score", "advantage"} <= set(samples[0])


def test_the_policy_pass_of_the_experience_is_the_update_s_first(tiny_tokenizer, tmp_path):
    """With several updates per generation the experience carries pi_old from its own pass;
    before any step, the loss against it is the loss of the update's pass as pi_old."""
    prompts = tiny_prompts(tiny_tokenizer)
    reference = tiny_lm(tiny_tokenizer, seed=1)
    config = _config(tmp_path, ppo_epochs=2, kl_coef=0.1)
    trainer = RLTrainer(
        config, tiny_lm(tiny_tokenizer), tiny_tokenizer, prompts, TargetFraction(),
        reference=reference,
    )  # fmt: skip
    rollout = trainer.make_experience(PromptCollator(tiny_tokenizer.pad_token_id)(prompts[:4]))
    assert rollout.logprobs is not None and rollout.kl is not None
    loss, stats = trainer.policy_loss(rollout)
    on_policy, _ = trainer.policy_loss(dataclasses.replace(rollout, logprobs=None))
    assert loss.item() == pytest.approx(on_policy.item(), abs=1e-6)
    assert stats["policy/ratio"] == pytest.approx(1.0, abs=1e-6)
    assert stats["policy/clipfrac"] == 0.0


def test_several_updates_per_generation_clip_and_count_their_steps(
    tiny_tokenizer, tmp_path, device
):
    prompts = tiny_prompts(tiny_tokenizer)
    config = _config(
        tmp_path, ppo_epochs=2, rollout_batch_size=8, generation_prompts=4, max_steps=2,
        learning_rate=3e-2, log_every=1, **on_device(device),
    )  # fmt: skip
    trainer = RLTrainer(config, tiny_lm(tiny_tokenizer), tiny_tokenizer, prompts, TargetFraction())
    trainer.train()
    assert trainer.learners["policy"].scheduler.last_epoch == 2 * 2 * 2  # iterations x steps
    assert trainer.state.batch_index == 2 * 2  # each iteration samples two generation batches
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    train = [row for row in logged if "train/policy/clipfrac" in row]
    assert len(train) == 2
    assert all(row["train/policy/clipfrac"] > 0 for row in train)  # the clip acts
    assert all(row["train/policy/ratio"] != pytest.approx(1.0, abs=1e-6) for row in train)
    # Without max_steps, an epoch of 64 prompts is 64 / 8 iterations of 2 minibatches.
    by_epochs = _config(
        tmp_path, rollout_batch_size=8, max_steps=None, num_epochs=1, **on_device(device)
    )
    trainer = RLTrainer(
        by_epochs, tiny_lm(tiny_tokenizer), tiny_tokenizer, prompts, TargetFraction()
    )
    assert trainer.state.total_steps == len(prompts) // 8
    assert trainer.optimizer_steps == 2 * len(prompts) // 8


def test_lora_reference_and_no_reference_without_kl(tiny_tokenizer, tmp_path):
    prompts = tiny_prompts(tiny_tokenizer)
    lm = tiny_lm(tiny_tokenizer)
    base = {k: v.clone() for k, v in lm.state_dict().items()}
    config = _config(tmp_path, lora=True, max_steps=2, learning_rate=1e-2)
    trainer = RLTrainer(config, lm, tiny_tokenizer, prompts, TargetFraction())
    # The reference is the policy with its adapter disabled, or a view of its base weights
    # (to run beside it on a CPU): never a second copy.
    reference = trainer.models.reference
    embeddings = trainer.unwrapped_model.get_base_model().transformer.wte.weight
    assert reference is None or reference.transformer.wte.weight is embeddings
    assert trainer.models.packed
    trainer.train()
    state = trainer.unwrapped_model.get_base_model().state_dict()
    for name, value in base.items():
        key = next(k for k in state if k.replace(".base_layer", "") == name)
        assert torch.equal(state[key], value), name
    no_kl = RLTrainer(
        _config(tmp_path, kl_coef=0.0),
        tiny_lm(tiny_tokenizer),
        tiny_tokenizer,
        prompts,
        TargetFraction(),
    )
    assert no_kl.models.reference is None
    batch = PromptCollator(tiny_tokenizer.pad_token_id)(prompts[:4])
    assert "kl/ref" not in _loss(no_kl, batch)[1]


def test_processed_scores_make_the_advantages(tiny_tokenizer, tmp_path):
    # Leave-one-out advantages of scores clipped to [-0.01, 0.01] are at most 0.02 apart;
    # TargetFraction's raw scores (fractions in [0, 1]) give larger ones.
    prompts = tiny_prompts(tiny_tokenizer)
    batch = PromptCollator(tiny_tokenizer.pad_token_id)(prompts[:4])
    stats = {}
    for clip in (None, 0.01):
        config = _config(tmp_path, advantage_estimator="rloo", score_clip=clip)
        trainer = RLTrainer(
            config, tiny_lm(tiny_tokenizer), tiny_tokenizer, prompts, TargetFraction()
        )
        stats[clip] = _loss(trainer, batch)[1]["advantage/abs_mean"]
    assert stats[0.01] <= 0.02 < stats[None]


def test_gold_functions_score_the_held_out_samples_beside_the_scorer(tiny_tokenizer, tmp_path):
    chars = build_scorer(None, ["helpers:response_chars"], tokenizer=tiny_tokenizer)
    gold = ["helpers:response_chars", "helpers:response_chars"]  # summed: twice the score
    prompts = tiny_prompts(tiny_tokenizer, 80)
    config = _config(tmp_path, gold_functions=gold)
    trainer = RLTrainer(
        config, tiny_lm(tiny_tokenizer), tiny_tokenizer, prompts[:64], chars,
        eval_prompts=prompts[64:],
    )  # fmt: skip
    metrics = trainer.evaluate()
    assert metrics["score"] > 0 and metrics["gold"] == pytest.approx(2 * metrics["score"])


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"advantage_estimator": "rloo", "score_normalize": "standardize"},
        {"loss_aggregation": "sequence_mean", "skip_uniform_groups": True, "kl_in_loss": False},
        {"advantage_estimator": "reinforce++", "kl_in_loss": False, "loss_aggregation": "constant"},
        {
            "ppo_epochs": 2,
            "rollout_batch_size": 8,
            "generation_prompts": 4,
            "clip_range_high": 0.28,
        },
        {"ppo_epochs": 2, "rollout_batch_size": 8, "clip_range_high": 0.28},  # shuffled
        {"ppo_epochs": 2, "importance_sampling_level": "sequence", "clip_range": 3e-3},
    ],
)
def test_stop_and_resume_equals_an_uninterrupted_run(overrides, tiny_tokenizer, tmp_path):
    # With score_normalize, the running moments of the scores are part of the checkpoint.
    prompts = tiny_prompts(tiny_tokenizer)

    def trainer(out, **more):
        config = _config(tmp_path, output_dir=str(tmp_path / out), max_steps=2, **overrides, **more)
        return RLTrainer(config, tiny_lm(tiny_tokenizer), tiny_tokenizer, prompts, TargetFraction())

    _, resumed = stopped_and_resumed_equals_straight(trainer, stop_after=1)
    assert resumed.state.step == 2


def test_grpo_command_end_to_end(tiny_model_dir, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in tiny_corpus(16)))
    config = _config(
        tmp_path,
        model=str(tiny_model_dir),
        train_data=str(prompts),
        eval_data=str(prompts),
        max_eval_samples=4,
        reward_functions=["rlhfkit.tasks:digits_reward"],
        max_steps=2,
    )
    final = run_rl(config)
    assert (final / "model.safetensors").is_file()
    assert "score" in json.loads((final / "trainer_state.json").read_text())["eval_metrics"]


def test_config_checks():
    def grpo(**fields):
        return RLConfig.preset("grpo", reward_functions=["m:f"], **fields)

    assert RLConfig.preset("rloo", reward_functions=["m:f"]).advantage_estimator == "rloo"
    with pytest.raises(ConfigError, match="RLConfig.num_generations = 1"):
        grpo(num_generations=1)
    with pytest.raises(ConfigError, match="RLConfig.reward_model = None"):
        RLConfig.preset("grpo")
    with pytest.raises(ConfigError, match="RLConfig.advantage_estimator = 'ppo'"):
        grpo(advantage_estimator="ppo")
    with pytest.raises(ConfigError, match="RLConfig.missing_eos_replace = True"):
        grpo(missing_eos_replace=True)
    with pytest.raises(ConfigError, match="RLConfig.score_clip = 0"):
        grpo(score_clip=0)
    with pytest.raises(ConfigError, match="RLConfig.kl_in_loss = True .* 'reinforce\\+\\+'"):
        grpo(advantage_estimator="reinforce++")
    assert not RLConfig.preset("reinforce++", reward_functions=["m:f"]).kl_in_loss
    with pytest.raises(ConfigError, match="RLConfig.critic = 'none' .* 'gae'"):
        grpo(advantage_estimator="gae")
    with pytest.raises(ConfigError, match="RLConfig.critic = 'separate' .* 'grpo'"):
        grpo(critic="separate")
    with pytest.raises(ConfigError, match="RLConfig.loss_aggregation = 'sum'"):
        grpo(loss_aggregation="sum")
    with pytest.raises(ConfigError, match="RLConfig.importance_sampling_level = 'sequence'"):
        RLConfig.preset(
            "reinforce++", reward_functions=["m:f"], importance_sampling_level="sequence"
        )
    with pytest.raises(ConfigError, match="RLConfig.generation_prompts = 3"):
        grpo(generation_prompts=3)
    with pytest.raises(ConfigError, match="RLConfig.rollout_batch_size = 8"):
        grpo(batch_size=24)  # 8 prompts x 4 responses do not split into micro-batches of 24
    gspo = grpo(importance_sampling_level="sequence", mask_truncated_completions=True)
    assert gspo.loss_settings.ratio_level == "sequence"
    assert gspo.rollout_settings(1).mask_truncated


@pytest.mark.parametrize("name", ["grpo", "rloo"])
def test_shipped_configs_load(name):
    root = Path(__file__).resolve().parents[1]
    defaults = RLConfig.preset_defaults(name)
    config = load_config(RLConfig, root / "configs" / f"{name}.yaml", defaults=defaults)
    assert config.advantage_estimator == name and config.output_dir == f"runs/{name}"
    assert config.critic == "none" and config.kl_in_loss
    assert (root / config.train_data).is_dir()
