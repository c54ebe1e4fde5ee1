"""PPO trainer: learns a trivially learnable reward, scorers are interchangeable, exact resume,
LoRA reference without a second copy, value-head critic, PPO-ptx, config checks."""

import json
from contextlib import nullcontext

import pytest
import torch
from safetensors.torch import load_file

from helpers import TARGETS, TargetFraction, on_device, stage_config, tiny_lm, tiny_prompts
from rlhfkit import checkpoint as ckpt
from rlhfkit.config import ConfigError
from rlhfkit.data import SFTExample
from rlhfkit.experience import generation
from rlhfkit.experience.scorer_loading import build_scorer
from rlhfkit.experience.scorers import RewardModelScorer
from rlhfkit.models.loading import ValueModel, freeze
from rlhfkit.models.lora import add_lora, reference_mode
from rlhfkit.models.passes import ValueHeadLM
from rlhfkit.runtime.machine import Runtime
from rlhfkit.tracking import read_jsonl
from rlhfkit.trainers.checkpoints import OPTIMIZER_FILE
from rlhfkit.trainers.rl import RLTrainer
from rlhfkit.trainers.rl_config import RLConfig


def _config(tmp_path, **overrides):
    return stage_config(
        RLConfig, tmp_path / "run",
        **{"reward_model": None, "reward_functions": ["unused:unused"], "max_steps": 2,
           "rollout_batch_size": 16, "batch_size": 8, "max_new_tokens": 8,
           "learning_rate": 1e-3, "seed": 0, "cpu": False, **overrides},
    )  # fmt: skip


def _trainer(tiny_tokenizer, tmp_path, scorer=None, eval_prompts=None, **overrides):
    policy, reference = tiny_lm(tiny_tokenizer), tiny_lm(tiny_tokenizer)
    critic = ValueModel(tiny_lm(tiny_tokenizer, seed=1).transformer)
    return RLTrainer(
        _config(tmp_path, **overrides),
        policy,
        tiny_tokenizer,
        tiny_prompts(tiny_tokenizer),
        scorer or TargetFraction(),
        reference=reference,
        critic=critic,
        eval_prompts=eval_prompts,
    )


def _weights(module):
    """A CPU copy of every tensor of ``module`` (comparable whatever device it trained on)."""
    return {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}


@pytest.mark.slow
def test_ppo_learns_a_trivial_reward_with_bounded_kl_and_a_fixed_reference(
    tiny_tokenizer, tmp_path, device
):
    # Short responses and 16-sequence minibatches: each token carries a large share of the
    # score and Adam's steps are not dominated by noise (measured: 0.07 -> 0.72 in 25 iterations,
    # KL 6.6 nats per response).
    trainer = _trainer(
        tiny_tokenizer,
        tmp_path,
        **on_device(device),
        max_steps=25,
        rollout_batch_size=32,
        batch_size=16,
        max_new_tokens=4,
        vf_coef=0.5,
    )
    reference_before = _weights(trainer.models.reference)
    scores, kls = [], []
    for _ in range(trainer.config.max_steps):
        metrics, _ = trainer.step()
        scores.append(metrics["score/mean"])
        kls.append(metrics["kl/ref"])
    assert scores[0] < 0.15, scores
    assert sum(scores[-3:]) / 3 > 0.5, scores
    assert max(kls) < 12.0, kls  # nats per 4-token response; beta = 0.05 keeps it bounded
    after = _weights(trainer.models.reference)
    assert all(torch.equal(reference_before[k], after[k]) for k in after)


def test_function_and_model_scorers_with_the_same_scores_give_the_same_step(
    tiny_tokenizer, tmp_path
):
    class ScoreModel(torch.nn.Module):
        """A "reward model" on token ids: +1 per target token, read from ids and mask."""

        def forward(self, input_ids, attention_mask):
            hits = (input_ids >= TARGETS.start) & (input_ids < TARGETS.stop) & (attention_mask != 0)
            return hits.sum(1).float() - 2.0

    model_trainer = _trainer(tiny_tokenizer, tmp_path / "a", RewardModelScorer(ScoreModel()))
    _, rollout = model_trainer.step()

    recorded = rollout.raw_scores.tolist()
    # A plain Python function, as users pass it (wrapped by the trainer).
    function_trainer = _trainer(tiny_tokenizer, tmp_path / "b", lambda prompts, responses: recorded)
    _, rollout_b = function_trainer.step()
    assert rollout_b.responses == rollout.responses  # same seed, same samples
    a, b = _weights(model_trainer.trainable), _weights(function_trainer.trainable)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(
        a["policy.lm_head.weight"], _weights(tiny_lm(tiny_tokenizer))["lm_head.weight"]
    )


@pytest.mark.parametrize("padding_free", [True, False])
def test_the_reward_model_gets_the_trainers_gelu_attention_and_packing(
    padding_free, tiny_tokenizer, tmp_path
):
    from transformers.activations import NewGELUActivation

    from rlhfkit.experience.scorers import WeightedScorer
    from rlhfkit.models.loading import RewardModel
    from rlhfkit.runtime.activations import TanhGELU

    reward_model = RewardModel(tiny_lm(tiny_tokenizer, seed=2).transformer)
    scorer = WeightedScorer([(RewardModelScorer(reward_model), 1.0), (TargetFraction(), 0.5)])
    assert scorer.models() == [reward_model]
    overrides = dict(attn_implementation="eager", padding_free=padding_free)
    _trainer(tiny_tokenizer, tmp_path, scorer, **overrides)
    assert not any(isinstance(m, NewGELUActivation) for m in reward_model.modules())
    assert any(isinstance(m, TanhGELU) for m in reward_model.modules())
    attention = reward_model.backbone.config._attn_implementation  # packing wraps the kernel
    assert attention == ("rlhfkit_packed_eager" if padding_free else "eager")


def test_policy_and_critic_side_by_side_make_the_same_step(tiny_tokenizer, tmp_path, two_threads):
    trainers = {
        parallel: _trainer(tiny_tokenizer, tmp_path / str(parallel), parallel_critic=parallel)
        for parallel in (False, True)
    }
    metrics = {parallel: trainer.step()[0] for parallel, trainer in trainers.items()}
    # One intra-op thread per model instead of two changes float rounding, nothing else (Adam
    # scales a near-zero gradient's rounding up to a step of lr = 1e-3 at most; seen: 3e-6).
    a, b = _weights(trainers[False].trainable), _weights(trainers[True].trainable)
    assert all(torch.allclose(a[k], b[k], rtol=1e-4, atol=2e-5) for k in a)
    assert not torch.equal(
        a["policy.lm_head.weight"], _weights(tiny_lm(tiny_tokenizer))["lm_head.weight"]
    )
    for key in ("loss/policy", "loss/value", "grad_norm/policy", "grad_norm/critic", "lr"):
        assert metrics[True][key] == pytest.approx(metrics[False][key], rel=1e-4, abs=1e-6)


def test_a_lora_policys_reference_beside_it_is_a_view_of_its_base_weights(
    tiny_tokenizer, tmp_path, two_threads
):
    """Side by side, a LoRA policy's reference is a module of its own on the policy's own base
    weights (no copy), computing what the policy with its adapter off computes, so its pass
    runs beside the policy's; the step is the one taken with the passes in turn."""
    trainers = {}
    for parallel in (False, True):
        policy = add_lora(tiny_lm(tiny_tokenizer), r=4, alpha=8)
        with torch.no_grad():
            for name, weight in policy.named_parameters():
                if "lora_B" in name:  # a trained adapter: the reference differs from the policy
                    weight.normal_(0, 0.1, generator=torch.Generator().manual_seed(0))
        config = _config(tmp_path / str(parallel), lora=True, parallel_critic=parallel)
        critic = ValueModel(tiny_lm(tiny_tokenizer, seed=1).transformer)
        trainers[parallel] = RLTrainer(
            config, policy, tiny_tokenizer, tiny_prompts(tiny_tokenizer), TargetFraction(),
            critic=critic,
        )  # fmt: skip
    assert trainers[False].models.reference is None  # in turn: the policy, adapter off
    view, policy = trainers[True].models.reference, trainers[True].models.policy
    assert not any("lora_" in name for name in view.state_dict())
    weights = {p.data_ptr() for p in policy.parameters()}
    assert {p.data_ptr() for p in view.parameters()} <= weights  # shared, not copied
    ids = torch.tensor([tiny_tokenizer("Number 1. The cat")["input_ids"]])
    with torch.no_grad():
        assert not torch.equal(view(ids).logits, policy(ids).logits)
        with reference_mode(policy) as reference:
            assert torch.equal(view(ids).logits, reference(ids).logits)
    rollouts = {parallel: trainer.step()[1] for parallel, trainer in trainers.items()}
    torch.testing.assert_close(rollouts[True].ref_logprobs, rollouts[False].ref_logprobs)
    a, b = _weights(trainers[False].trainable), _weights(trainers[True].trainable)
    assert all(torch.allclose(a[k], b[k], rtol=1e-4, atol=2e-5) for k in a)


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"advantage_estimator": "sequence", "kl_in_loss": True, "clip_range_high": 0.3},
        {"critic_warmup": 1, "lr_scheduler": "linear", "critic_learning_rate": 1e-2},
    ],
    ids=["defaults", "sequence-kl_in_loss-clip_higher", "critic_warmup-critic_lr"],
)
def test_resume_continues_exactly(options, tiny_tokenizer, tmp_path, device):
    straight = _trainer(
        tiny_tokenizer, tmp_path / "straight", **on_device(device, max_steps=2, **options)
    )
    straight.train()

    first = _trainer(
        tiny_tokenizer, tmp_path / "resumed", **on_device(device, max_steps=2, **options)
    )
    first.train(stop_after=1)
    assert (tmp_path / "resumed" / "run" / "checkpoint-1").is_dir()
    resumed = on_device(device, max_steps=2, resume=True, **options)
    second = _trainer(tiny_tokenizer, tmp_path / "resumed", **resumed)
    second.train()
    assert second.state.step == 2 and second.state.complete
    a, b = _weights(straight.trainable), _weights(second.trainable)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert (tmp_path / "resumed" / "run" / "final" / "critic").is_dir()
    lines = (tmp_path / "resumed" / "run" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2  # one row per iteration, none duplicated by the resume


def test_held_out_evaluation_is_logged_and_leaves_training_unchanged(tiny_tokenizer, tmp_path):
    plain = _trainer(tiny_tokenizer, tmp_path / "plain", max_steps=3)
    plain.train()
    held_out = tiny_prompts(tiny_tokenizer, 80)[64:]  # not among the training prompts
    evaluated = _trainer(
        tiny_tokenizer, tmp_path / "evaluated", eval_prompts=held_out, max_steps=3, eval_every=2
    )
    evaluated.train()
    a, b = _weights(plain.trainable), _weights(evaluated.trainable)
    assert all(torch.equal(a[k], b[k]) for k in a)  # no random stream or statistic disturbed
    rows = [json.loads(line) for line in (tmp_path / "evaluated" / "run" / "metrics.jsonl").open()]
    evals = [row for row in rows if "eval/score" in row]
    assert [row["step"] for row in evals] == [2, 3]  # every 2 iterations, and at the end
    last = evals[-1]
    assert 0 <= last["eval/score"] <= 1 and last["eval/kl"] > 0
    assert 1 <= last["eval/length"] <= 8  # max_new_tokens
    # The same fixed-seed samples every time: the numbers are reproducible.
    assert evaluated.evaluate() == evaluated.evaluate()
    assert evaluated.evaluate()["score"] == pytest.approx(last["eval/score"])


def test_gold_functions_score_the_held_out_samples_beside_the_scorer(tiny_tokenizer, tmp_path):
    chars = build_scorer(None, ["helpers:response_chars"], tokenizer=tiny_tokenizer)
    gold = ["helpers:response_chars", "helpers:response_chars"]  # summed: twice the score
    held_out = tiny_prompts(tiny_tokenizer, 80)[64:]
    trainer = _trainer(tiny_tokenizer, tmp_path, chars, eval_prompts=held_out, gold_functions=gold)
    metrics = trainer.evaluate()
    assert metrics["score"] > 0 and metrics["gold"] == pytest.approx(2 * metrics["score"])
    with pytest.raises(ConfigError, match="gold_functions .* when eval_data is None"):
        _config(tmp_path, eval_data=None, gold_functions=["digits"])


def test_ppo_keeps_the_policy_of_its_best_gold_evaluation_as_final(tiny_tokenizer, tmp_path):
    chars = build_scorer(None, ["helpers:response_chars"], tokenizer=tiny_tokenizer)
    held_out = tiny_prompts(tiny_tokenizer, 80)[64:]
    trainer = _trainer(
        tiny_tokenizer, tmp_path, chars, eval_prompts=held_out, max_steps=4, eval_every=1,
        gold_functions=["helpers:response_chars"], metric_for_best_model="eval/gold",
        load_best_model_at_end=True,
    )  # fmt: skip
    trainer.train()
    golds = {
        row["step"]: row["eval/gold"]
        for row in read_jsonl(tmp_path / "run" / "metrics.jsonl")
        if "eval/gold" in row
    }
    step = max(golds, key=lambda s: (golds[s], -s))  # the first of the highest
    saved = json.loads((tmp_path / "run" / "final" / "trainer_state.json").read_text())
    assert sorted(golds) == [1, 2, 3, 4] and len(set(golds.values())) > 1
    assert saved["best"] == {"metric": "eval/gold", "value": golds[step], "step": step}
    assert saved["step"] == step and saved["last_step"] == 4
    for part in ("model.safetensors", "critic/model.safetensors"):
        kept = load_file(tmp_path / "run" / "best" / part)
        final = load_file(tmp_path / "run" / "final" / part)
        assert all(torch.equal(kept[k], final[k]) for k in kept), part
    with pytest.raises(ConfigError, match="metric_for_best_model = 'gold' .* needs gold_functions"):
        _config(tmp_path, eval_every=1, metric_for_best_model="gold")


def test_a_checkpoint_with_one_optimiser_for_both_models_is_refused_by_name(
    tiny_tokenizer, tmp_path
):
    first = _trainer(tiny_tokenizer, tmp_path, max_steps=2)
    first.train(stop_after=1)
    optimizer_file = tmp_path / "run" / "checkpoint-1" / OPTIMIZER_FILE
    # The layout of earlier versions: a single optimiser's state, not one per learner by name.
    ckpt.save_state(first.learners["policy"].optimizer.state_dict(), optimizer_file)
    (optimizer_file.parent / ckpt.MANIFEST_FILE).unlink()  # which wrote no manifest either
    second = _trainer(tiny_tokenizer, tmp_path, max_steps=2, resume=True)
    with pytest.raises(ValueError, match="no optimiser state for policy, critic.*resume: false"):
        second.train()


def test_lora_reference_is_the_policy_with_the_adapter_off(tiny_tokenizer, tmp_path, device):
    policy = add_lora(tiny_lm(tiny_tokenizer), r=4, alpha=8)
    critic = ValueModel(tiny_lm(tiny_tokenizer, seed=1).transformer)
    base_before = {k: v.clone() for k, v in policy.state_dict().items() if "lora_" not in k}
    trainer = RLTrainer(
        _config(tmp_path, **on_device(device, lora=True, max_steps=1)),
        policy,
        tiny_tokenizer,
        tiny_prompts(tiny_tokenizer),
        TargetFraction(),
        reference=None,
        critic=critic,
    )
    metrics, rollout = trainer.step()
    # At the first rollout the adapter (B = 0) changes nothing: KL to the reference is 0.
    assert torch.allclose(rollout.logprobs, rollout.ref_logprobs, atol=1e-5)
    after = _weights(policy)
    assert all(torch.equal(base_before[k], after[k]) for k in base_before)
    assert any(not torch.equal(v, 0 * v) for k, v in after.items() if "lora_B" in k)


def test_policy_and_critic_started_from_bf16_weights_are_saved_in_bf16(tiny_tokenizer, tmp_path):
    """Under bf16 autocast each trained model whose start was stored in bf16 is saved in bf16
    (the weights its passes used), the policy's and the critic's, and trains on in float32."""
    start = tmp_path / "bf16_start"
    tiny_lm(tiny_tokenizer).to(torch.bfloat16).save_pretrained(start)
    overrides = dict(model=str(start), critic_model=str(start), mixed_precision="bf16")
    trainer = _trainer(tiny_tokenizer, tmp_path, **overrides, max_steps=1)
    trainer.train()
    final = tmp_path / "run" / "final"
    for weights in (
        "model.safetensors",
        "critic/model.safetensors",
        "critic/score_head.safetensors",
    ):
        assert {v.dtype for v in load_file(final / weights).values()} == {torch.bfloat16}
    policy = trainer.models.policy.state_dict()
    saved = load_file(final / "model.safetensors")
    assert all(torch.equal(v, policy[k].to(torch.bfloat16)) for k, v in saved.items())
    assert all(v.dtype == torch.float32 for v in trainer.trainable.state_dict().values())


def test_frozen_weights_cast_once_an_iteration_take_the_same_steps(
    tiny_tokenizer, tmp_path, monkeypatch
):
    """Under bf16 autocast a LoRA run holds its frozen weights (the base weights, the tied LM
    head, the reward model's) in bf16 for each iteration: the steps it takes are those of
    casting them at every pass, and the weights are float32 again between iterations."""

    def run(name):
        policy = add_lora(tiny_lm(tiny_tokenizer), r=4, alpha=8)
        critic = add_lora(ValueModel(tiny_lm(tiny_tokenizer, seed=1).transformer), r=4, alpha=8)
        rm = freeze(ValueModel(tiny_lm(tiny_tokenizer, seed=2).transformer, per_token=False))
        config = _config(tmp_path / name, lora=True, max_steps=2, mixed_precision="bf16")
        scorer = RewardModelScorer(rm)
        trainer = RLTrainer(config, policy, tiny_tokenizer, tiny_prompts(tiny_tokenizer), scorer,
                             critic=critic)  # fmt: skip
        seen = set()
        hook = lambda module, args: seen.add(module.weight.dtype)  # noqa: E731
        policy.base_model.model.transformer.h[0].mlp.c_fc.register_forward_pre_hook(hook)
        trainer.train()
        assert all(v.dtype == torch.float32 for v in trainer.trainable.state_dict().values())
        assert all(v.dtype == torch.float32 for v in rm.state_dict().values())
        return _weights(trainer.trainable), seen

    cast_once, seen = run("once")
    assert seen == {torch.bfloat16}
    monkeypatch.setattr(Runtime, "frozen_weights_cast", lambda self, models: nullcontext())
    monkeypatch.setattr(generation, "frozen_weights_cast_once", lambda model: nullcontext())
    every_pass, seen = run("every_pass")
    assert seen == {torch.float32}
    assert all(torch.equal(cast_once[k], v) for k, v in every_pass.items())


def test_a_lora_run_writes_plain_models_that_stock_transformers_load(tiny_tokenizer, tmp_path):
    from transformers import AutoModelForCausalLM

    from rlhfkit.models.lora import merge_lora

    policy = add_lora(tiny_lm(tiny_tokenizer), r=4, alpha=8)
    critic = add_lora(ValueModel(tiny_lm(tiny_tokenizer, seed=1).transformer), r=4, alpha=8)
    trainer = RLTrainer(
        _config(tmp_path, lora=True, max_steps=1),
        policy,
        tiny_tokenizer,
        tiny_prompts(tiny_tokenizer),
        TargetFraction(),
        critic=critic,
    )
    trainer.train()
    final = tmp_path / "run" / "final"
    loaded = AutoModelForCausalLM.from_pretrained(final)  # a plain model: no adapter files
    assert not (final / "adapter_config.json").exists()
    ids = torch.tensor([tiny_tokenizer("Number 1. The cat")["input_ids"]])
    trained = merge_lora(policy).eval()  # the live model, adapters folded in, for comparison
    torch.testing.assert_close(loaded(ids).logits, trained(ids).logits, atol=1e-5, rtol=0)
    plain_critic = ValueModel.from_pretrained(final / "critic")
    assert not any("lora_" in name for name in plain_critic.state_dict())


def test_value_head_critic_and_ptx_term(tiny_tokenizer, tmp_path):
    policy = ValueHeadLM(tiny_lm(tiny_tokenizer))
    ids = tiny_tokenizer("Number 1. The cat sees a red ball.")["input_ids"]
    ptx = [SFTExample(ids, [-100] * 3 + ids[3:])] * 8
    trainer = RLTrainer(
        _config(tmp_path, critic="value_head", ptx_coef=0.5, ptx_data="unused"),
        policy,
        tiny_tokenizer,
        tiny_prompts(tiny_tokenizer),
        TargetFraction(),
        reference=tiny_lm(tiny_tokenizer),
        critic=None,
        ptx_examples=ptx,
    )
    head_before = policy.value_head.weight.clone()
    metrics, _ = trainer.step()
    assert metrics["loss/ptx"] > 0
    assert not torch.equal(head_before, policy.value_head.weight)
    assert set(trainer.trainable) == {"policy"}


def test_kl_in_the_loss_leaves_the_rewards_to_the_score(tiny_tokenizer, tmp_path):
    trainer = _trainer(tiny_tokenizer, tmp_path, cpu=True, kl_in_loss=True, kl_coef=0.2)
    with torch.no_grad():  # a reference that differs from the policy: the KL is not 0
        for p in trainer.models.reference.parameters():
            p.add_(0.05 * torch.randn_like(p))
    metrics, rollout = trainer.step()
    mask = rollout.response_mask
    last = mask.sum(1) - 1  # (B,) index of each response's last real token
    expected = torch.zeros_like(rollout.rewards)
    expected[torch.arange(len(last)), last] = rollout.scores
    torch.testing.assert_close(rollout.rewards, expected)  # no -beta * KL per token
    assert metrics["loss/kl_k3"] > 0 and metrics["kl/ref"] != 0


def test_ppo_with_groups_samples_each_prompt_k_times_and_learns_with_its_critic(
    tiny_tokenizer, tmp_path
):
    """The one RL stage combines what the presets keep apart: GAE over a critic's values on
    groups of responses a prompt, in generation batches seeded by their place in the data."""
    trainer = _trainer(
        tiny_tokenizer, tmp_path, cpu=True, num_generations=4, rollout_batch_size=4,
        generation_prompts=2, sample_seeds="data", batch_size=8,
    )  # fmt: skip
    critic_before = _weights(trainer.models.critic)
    metrics, rollout = trainer.step()
    assert len(rollout) == 16 and rollout.values is not None
    assert rollout.prompts[:4] == [rollout.prompts[0]] * 4  # a group's rows are contiguous
    assert trainer.state.batch_index == 2  # two generation batches of 2 prompts
    assert metrics["score/group_std"] >= 0 and "value/explained_variance" in metrics
    moved = _weights(trainer.models.critic)
    assert any(not torch.equal(moved[k], v) for k, v in critic_before.items())


def test_the_sequence_estimators_critic_learns_the_prompts_value_only(tiny_tokenizer, tmp_path):
    trainer = _trainer(tiny_tokenizer, tmp_path, cpu=True, advantage_estimator="sequence")
    _, rollout = trainer.step()
    mb = rollout.select(torch.arange(len(rollout)))
    values = torch.randn_like(mb.values)
    loss, _ = trainer._value_loss(values, mb)
    elsewhere = values.clone()
    elsewhere[:, 1:] += 10.0  # any value after the prompt's: not the critic's target
    torch.testing.assert_close(trainer._value_loss(elsewhere, mb)[0], loss)
    first = values.clone()
    first[:, 0] += 10.0
    assert trainer._value_loss(first, mb)[0] > loss


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("rollout_batch_size", 12),  # not a multiple of batch_size 8
        ("clip_range", 0.0),
        ("clip_range_high", -0.1),
        ("advantage_estimator", "td"),
        ("kl_estimator", "k4"),
        ("reward_weights", [1.0, 2.0]),
        ("ptx_coef", -1.0),
        ("max_steps", 0),
        ("critic_learning_rate", 0.0),
        ("critic_warmup", -1),
        ("critic_warmup", 2),  # not less than max_steps 2
    ],
)
def test_config_errors_name_the_field(tmp_path, field, value):
    with pytest.raises(ConfigError, match=field):
        _config(tmp_path, **{field: value})


def test_critic_warmup_needs_the_separate_critic(tmp_path):
    with pytest.raises(ConfigError, match="critic_warmup = 1 is not allowed: expected 0 with"):
        _config(tmp_path, critic="value_head", critic_warmup=1)


def test_critic_learning_rate_needs_the_separate_critic(tmp_path):
    with pytest.raises(
        ConfigError, match="critic_learning_rate = 0.01 is not allowed: expected None"
    ):
        _config(tmp_path, critic="value_head", critic_learning_rate=1e-2)


def test_the_critic_learns_at_its_own_rate_and_logs_it(tiny_tokenizer, tmp_path):
    trainer = _trainer(
        tiny_tokenizer, tmp_path, max_steps=2, critic_learning_rate=1e-2, lr_scheduler="linear"
    )
    policy, critic = trainer.learners["policy"], trainer.learners["critic"]
    assert policy.scheduler.base_lrs == [1e-3, 1e-3]  # weight matrices, and the rest
    assert critic.scheduler.base_lrs == [1e-2, 1e-2]
    trainer.train()
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    # Each the mean of the rates of its iteration's 8 steps, i of 16 in a linear decay: 1 - i / 16
    assert [row["train/lr"] for row in rows] == pytest.approx([1e-3 * 0.78125, 1e-3 * 0.28125])
    assert [row["train/lr/critic"] for row in rows] == pytest.approx(
        [1e-2 * 0.78125, 1e-2 * 0.28125]
    )
    default = _trainer(tiny_tokenizer, tmp_path / "default", max_steps=1)
    assert default.learners["critic"].scheduler.base_lrs == [1e-3, 1e-3]


def test_critic_warmup_trains_the_critic_alone_then_both(tiny_tokenizer, tmp_path):
    # 3 iterations of 2 minibatches x 4 epochs; the first 2 the critic's alone.
    trainer = _trainer(
        tiny_tokenizer, tmp_path, max_steps=3, critic_warmup=2, lr_scheduler="linear"
    )
    policy, critic = trainer.learners["policy"], trainer.learners["critic"]
    start_policy, start_critic = _weights(policy.module), _weights(critic.module)
    trainer.train(stop_after=2)
    assert all(torch.equal(v, start_policy[k]) for k, v in _weights(policy.module).items())
    assert not all(torch.equal(v, start_critic[k]) for k, v in _weights(critic.module).items())
    assert policy.scheduler.last_epoch == 0 and critic.scheduler.last_epoch == 2 * 8
    trainer.train()
    assert not all(torch.equal(v, start_policy[k]) for k, v in _weights(policy.module).items())
    # The policy's linear schedule spans its own 8 steps, to 0; the critic's all 24.
    assert policy.scheduler.last_epoch == 8 and policy.scheduler.get_last_lr()[0] == 0.0
    assert critic.scheduler.last_epoch == 24 and critic.scheduler.get_last_lr()[0] == 0.0
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert ["train/loss/policy" in row for row in rows] == [False, False, True]
    assert all("train/loss/value" in row for row in rows)


def test_a_named_reference_measures_the_kl_from_the_first_step(
    tiny_tokenizer, tiny_model_dir, tmp_path
):
    """Going on from a trained policy, the penalty is still measured from the reference named
    (the SFT model): at the first rollout the policy is its start, yet its KL is not 0."""
    reference_dir = tmp_path / "reference"
    tiny_lm(tiny_tokenizer, seed=1, n_positions=128).save_pretrained(reference_dir)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"Count to {i}:"}) + "\n" for i in range(16)))
    runs = {}
    for name, reference in (("own", None), ("named", str(reference_dir))):
        config = _config(
            tmp_path / name,
            model=str(tiny_model_dir),
            reference=reference,
            train_data=str(prompts),
            reward_functions=["digits"],
            max_steps=1,
        )
        trainer = RLTrainer.from_config(config)
        runs[name] = trainer
        trainer.train()
    loaded = _weights(runs["named"].models.reference)
    saved = _weights(tiny_lm(tiny_tokenizer, seed=1, n_positions=128))
    assert loaded.keys() == saved.keys() and all(torch.equal(loaded[k], saved[k]) for k in saved)
    kl = {n: read_jsonl(tmp_path / n / "run" / "metrics.jsonl")[0]["train/kl/ref"] for n in runs}
    assert kl["own"] == pytest.approx(0.0, abs=1e-5) and kl["named"] > 0.1


def test_a_named_reference_is_refused_with_lora(tmp_path):
    with pytest.raises(ConfigError, match="reference = 'sft' is not allowed: expected None with"):
        _config(tmp_path, lora=True, reference="sft")
