"""Making experience: rewards on the last real token, temperature-consistent log-probs, value
alignment, GAE and whitening, minibatch selection."""

import dataclasses
import threading
from types import SimpleNamespace

import pytest
import torch
from peft import PeftModel
from transformers import LlamaConfig, LlamaForCausalLM

from rlhfkit.data import pad
from rlhfkit.experience.generation import SamplingConfig
from rlhfkit.experience.rewards import RunningMoments, ScoreOptions
from rlhfkit.experience.rollout import (
    ExperienceMaker,
    Rollout,
    RolloutModels,
    RolloutSettings,
    explained_variance,
    rows_in_loss,
)
from rlhfkit.experience.scorers import FunctionScorer, ScoreError
from rlhfkit.models.lora import add_lora
from rlhfkit.models.passes import critic_values, sequence_inputs
from rlhfkit.ops.advantages import gae
from rlhfkit.ops.masks import last_token_index, masked_mean
from rlhfkit.runtime.machine import Runtime

EOS, PAD, VOCAB = 0, 1, 12


class BigramLM(torch.nn.Module):
    """A causal LM whose next-token logits depend only on the current token: a table (V, V).

    Exact, cheap, and it handles a KV cache trivially (nothing to cache)."""

    def __init__(self, table: torch.Tensor):
        super().__init__()
        self.table = torch.nn.Parameter(table.clone())

    def forward(
        self,
        input_ids,
        attention_mask=None,
        position_ids=None,
        use_cache=False,
        past_key_values=None,
        logits_to_keep=0,
    ):
        logits = self.table[input_ids]  # (B, T, V)
        # As transformers' slice_logits_to_keep: the last n positions, or these positions.
        if torch.is_tensor(logits_to_keep):
            logits = logits[:, logits_to_keep]
        elif logits_to_keep:
            logits = logits[:, -logits_to_keep:]
        return SimpleNamespace(logits=logits, past_key_values=past_key_values)


class PositionCritic(torch.nn.Module):
    """values (B, T) = the position index: shows which position each value is read from."""

    def forward(self, input_ids, attention_mask):
        return torch.arange(input_ids.shape[1], dtype=torch.float32).expand(input_ids.shape)


class Tokenizer:
    eos_token_id, pad_token_id = EOS, PAD

    def __len__(self):
        return VOCAB

    def batch_decode(self, ids, skip_special_tokens=True):
        return [" ".join(str(t) for t in row.tolist() if t not in (EOS, PAD)) for row in ids]


def _table(seed=0):
    torch.manual_seed(seed)
    table = torch.randn(VOCAB, VOCAB)
    table[:, PAD] = 5.0  # pad is likely under the model, so generation must suppress it
    table[7, EOS] = 8.0  # token 7 is almost always followed by EOS
    return table


def _rollout(
    table=None,
    kl_coef=0.0,
    temperature=1.0,
    greedy=False,
    scorer=None,
    critic=None,
    parallel=False,
    policy=None,
    **settings,
):
    query, query_mask = pad([[3, 4, 5], [7], [2, 6]], PAD, side="left")  # ragged, left-padded
    reference = BigramLM(_table(seed=1))
    if policy is None:
        policy = BigramLM(_table() if table is None else table)
    elif isinstance(policy, PeftModel):
        reference = None  # the policy with its adapter off
    sampling = SamplingConfig(max_new_tokens=5, temperature=temperature, greedy=greedy)
    maker = ExperienceMaker(
        RolloutModels(policy, reference, critic or PositionCritic()),
        scorer or FunctionScorer(lambda p, r: [float(len(x)) for x in r]),
        Tokenizer(),
        RolloutSettings(sampling=sampling, **settings),
        Runtime(torch.device("cpu"), bf16=False, attention=None, side_by_side=parallel),
    )
    return maker.make(
        query,
        query_mask,
        kl_coef=kl_coef,
        moments=RunningMoments(),
        generator=torch.Generator().manual_seed(0),
    )


def test_scores_land_on_the_last_real_token_with_left_padding_and_early_eos():
    rollout = _rollout()
    mask = rollout.response_mask
    assert mask[1].tolist() == [1, 0, 0, 0, 0]  # prompt "7" answers EOS at once
    assert mask.sum(1).max() == 5  # another row runs to the end
    last = last_token_index(mask)
    expected = torch.zeros_like(rollout.rewards)
    expected[torch.arange(3), last] = rollout.scores
    assert torch.equal(rollout.rewards, expected)  # kl_coef = 0: only the score
    assert rollout.response[1, 1:].tolist() == [PAD] * 4
    assert PAD not in rollout.response[mask != 0].tolist()


def test_kl_penalty_is_on_real_tokens_only():
    rollout = _rollout(kl_coef=0.1)
    real = rollout.response_mask != 0
    kl = rollout.logprobs - rollout.ref_logprobs
    last = last_token_index(rollout.response_mask)
    expected = torch.where(real, -0.1 * kl, 0.0)
    expected[torch.arange(3), last] += rollout.scores
    assert torch.allclose(rollout.rewards, expected, atol=1e-6)
    assert rollout.kl[~real].abs().sum() == 0


def test_logprobs_are_those_of_the_sampling_distribution_at_the_temperature():
    table = _table()
    rollout = _rollout(table=table, temperature=2.0)
    previous = torch.cat([rollout.query[:, -1:], rollout.response[:, :-1]], dim=1)  # (B, Tr)
    expected = (
        (table[previous] / 2.0).log_softmax(-1).gather(-1, rollout.response[..., None])[..., 0]
    )
    real = rollout.response_mask != 0
    assert torch.allclose(rollout.logprobs[real], expected[real], atol=1e-5)


def test_values_are_read_where_each_response_token_is_predicted():
    query, query_mask = pad([[3, 4, 5], [7]], PAD, side="left")
    response, response_mask = pad([[2, 2], [EOS]], PAD)
    inputs = sequence_inputs(query, query_mask, response, response_mask)
    values = critic_values(PositionCritic(), inputs, response_len=2)
    # Tq = 3: token 0 of the response is predicted at position 2 (the last query token).
    assert values.tolist() == [[2.0, 3.0], [2.0, 3.0]]


def test_advantages_are_whitened_gae_and_returns_are_unwhitened():
    rollout = _rollout(kl_coef=0.05, gamma=0.9, lam=0.8)
    advantages, returns = gae(rollout.rewards, rollout.values, rollout.response_mask, 0.9, 0.8)
    assert torch.allclose(rollout.returns, returns)
    mask = rollout.response_mask
    assert masked_mean(rollout.advantages, mask).abs() < 1e-6
    raw = _rollout(kl_coef=0.05, gamma=0.9, lam=0.8, whiten_advantages=False)
    assert torch.allclose(raw.advantages, advantages)


def test_the_sequence_estimator_baselines_each_return_with_the_prompts_value():
    rollout = _rollout(kl_coef=0.05, estimator="sequence", whiten_advantages=False)
    per_token = _rollout(kl_coef=0.05)  # the same samples, a value per token
    mask = rollout.response_mask
    for i in range(len(rollout)):
        n = int(mask[i].sum())
        rewards = rollout.rewards[i, :n].tolist()
        baseline = per_token.values[i, 0].item()  # the critic's value of the prompt
        for t in range(n):
            expected = sum(rewards[t:]) - baseline  # A_t = G_t - V(prompt), by hand
            assert rollout.advantages[i, t].item() == pytest.approx(expected, abs=1e-5)
            assert rollout.returns[i, t].item() == pytest.approx(sum(rewards[t:]), abs=1e-5)
            assert rollout.values[i, t].item() == baseline
    assert (rollout.advantages[mask == 0] == 0).all()


def test_missing_eos_penalty_reaches_the_rewards():
    options = ScoreOptions(missing_eos_penalty=10.0)
    rollout = _rollout(scores=options)
    assert torch.equal(
        rollout.scores,
        torch.where(rollout.eos_emitted, rollout.raw_scores, rollout.raw_scores - 10),
    )
    assert not rollout.eos_emitted.all() and rollout.eos_emitted.any()


def test_truncated_responses_are_left_out_of_the_loss():
    assert _rollout().kept is None
    rollout = _rollout(mask_truncated=True)
    eos = rollout.eos_emitted
    assert not eos.all() and eos.any()
    assert torch.equal(rollout.kept, eos)
    torch.testing.assert_close(rollout.loss_mask, rollout.response_mask * eos[:, None])


@pytest.mark.parametrize(
    "skip, truncated, expected",
    [
        (True, False, [False, False, True, True, True, True]),
        (False, True, [True, False, True, False, True, True]),
        (True, True, [False, False, True, False, True, True]),
        (False, False, None),
    ],
)
def test_rows_in_loss_hand_example(skip, truncated, expected):
    # groups of 2: the first scores alike (no signal), the others differ
    scores = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5, 0.2])
    eos = torch.tensor([True, False, True, False, True, True])
    settings = RolloutSettings(
        estimator="grpo", group_size=2, skip_uniform_groups=skip, mask_truncated=truncated
    )
    kept = rows_in_loss(settings, scores, eos)
    assert (kept if kept is None else kept.tolist()) == expected


def test_chunked_forward_gives_the_same_rollout():
    whole, chunked = _rollout(kl_coef=0.1), _rollout(kl_coef=0.1, forward_batch_size=2)
    for name in ("logprobs", "ref_logprobs", "values", "rewards", "advantages"):
        assert torch.allclose(getattr(whole, name), getattr(chunked, name), atol=1e-6), name


def test_side_by_side_passes_give_the_same_rollout(two_threads):
    meet = {}  # with parallel: critic and scorer must be running at once, or the barrier breaks

    class MeetingCritic(PositionCritic):
        def forward(self, input_ids, attention_mask):
            if "barrier" in meet:
                meet["barrier"].wait()
            return super().forward(input_ids, attention_mask)

    def score(prompts, responses):
        if "barrier" in meet:
            meet["barrier"].wait()
        return [float(len(r)) for r in responses]

    runs = {}
    for parallel in (False, True):
        if parallel:
            meet["barrier"] = threading.Barrier(2, timeout=30)
        runs[parallel] = _rollout(
            kl_coef=0.1, scorer=FunctionScorer(score), critic=MeetingCritic(), parallel=parallel
        )
    for field in dataclasses.fields(Rollout):
        if field.name != "timings":
            a, b = getattr(runs[False], field.name), getattr(runs[True], field.name)
            assert torch.equal(a, b) if torch.is_tensor(a) else a == b, field.name
    assert set(runs[True].timings) == {"generate", "forward", "score"}


def test_a_lora_policy_and_its_reference_run_beside_the_critic_and_scorer(two_threads):
    """With LoRA the reference is the policy with its adapter off: both passes run in one
    group, the critic's and the scorer beside them; the same rollout as all in turn."""
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, initializer_range=0.5,
    )  # fmt: skip
    policy = add_lora(LlamaForCausalLM(config).eval(), target_modules=["q_proj", "v_proj"])
    with torch.no_grad():
        for name, weight in policy.named_parameters():
            if "lora_B" in name:  # a trained adapter: the reference differs from the policy
                weight.normal_(0, 0.5)
    meet = {}  # with parallel: the policy's passes and the scorer at once, or the barrier breaks

    def wait(module, args, kwargs):
        if not kwargs.get("use_cache") and meet.pop("policy", None):  # a pass, not sampling
            meet["barrier"].wait()

    def score(prompts, responses):
        if "barrier" in meet:
            meet["barrier"].wait()
        return [float(len(r)) for r in responses]

    policy.register_forward_pre_hook(wait, with_kwargs=True)
    runs = {}
    for parallel in (False, True):
        if parallel:
            meet.update(barrier=threading.Barrier(2, timeout=30), policy=True)
        runs[parallel] = _rollout(
            kl_coef=0.1, scorer=FunctionScorer(score), policy=policy, parallel=parallel
        )
    assert "policy" not in meet  # the policy ran a pass after sampling: the barrier was met
    assert not torch.equal(runs[True].logprobs, runs[True].ref_logprobs)
    for field in dataclasses.fields(Rollout):
        if field.name != "timings":
            a, b = getattr(runs[False], field.name), getattr(runs[True], field.name)
            assert torch.equal(a, b) if torch.is_tensor(a) else a == b, field.name


def test_a_failing_scorer_beside_the_passes_names_the_sample(two_threads):
    def score(prompts, responses):
        return [float("nan") if r == "" else 1.0 for r in responses]

    with pytest.raises(ScoreError, match="non-finite score nan"):
        _rollout(scorer=FunctionScorer(score), parallel=True)


def test_select_trims_unused_padding_and_keeps_masked_results():
    rollout = _rollout()
    index = torch.tensor([1])  # the one-token prompt that stops at once
    mb = rollout.select(index)
    assert isinstance(mb, Rollout)
    assert mb.query.tolist() == [[7]] and mb.response.tolist() == [[EOS]]
    assert mb.prompts == [rollout.prompts[1]] and mb.responses == [rollout.responses[1]]
    assert mb.scores.tolist() == rollout.scores[1:2].tolist()
    assert mb.advantages[0, 0] == rollout.advantages[1, 0]


def test_explained_variance():
    returns = torch.tensor([[1.0, 2.0, 3.0, 9.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    assert explained_variance(returns, returns, mask) == 1.0
    assert explained_variance(torch.full_like(returns, 2.0), returns, mask) == pytest.approx(0.0)


def test_select_trims_every_per_token_field():
    mb = _rollout().select(torch.tensor([1]))  # a one-token prompt and a one-token response
    for f in dataclasses.fields(Rollout):
        value = getattr(mb, f.name)
        if isinstance(value, torch.Tensor) and value.dim() == 2:
            assert value.shape == (1, 1), f.name


def test_concatenated_rollouts_pad_queries_left_and_responses_right():
    def part(query_width, response_width, rows, kept):
        tensor = {name: torch.ones(rows, response_width) for name in (
            "logprobs", "ref_logprobs", "entropy", "values", "kl", "rewards", "advantages",
            "returns")}  # fmt: skip
        return Rollout(
            query=torch.full((rows, query_width), 7), query_mask=torch.ones(rows, query_width),
            response=torch.full((rows, response_width), 5),
            response_mask=torch.ones(rows, response_width), **tensor,
            raw_scores=torch.ones(rows), scores=torch.ones(rows),
            eos_emitted=torch.ones(rows, dtype=torch.bool), prompts=["p"] * rows,
            responses=["r"] * rows, kept=kept, timings={"generate": 1.0},
        )  # fmt: skip

    joined = Rollout.concat([part(2, 3, 2, None), part(4, 1, 1, torch.tensor([False]))], pad_id=0)
    assert joined.query.tolist() == [[0, 0, 7, 7], [0, 0, 7, 7], [7, 7, 7, 7]]
    assert joined.query_mask.tolist() == [[0, 0, 1, 1], [0, 0, 1, 1], [1, 1, 1, 1]]
    assert joined.response.tolist() == [[5, 5, 5], [5, 5, 5], [5, 0, 0]]
    assert joined.response_mask.sum().item() == 7
    assert joined.kept.tolist() == [True, True, False]  # a part that kept every row: all True
    assert joined.prompts == ["p"] * 3 and joined.timings == {"generate": 2.0}
    assert len(joined) == 3 and joined.returns.shape == (3, 3)
