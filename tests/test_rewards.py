"""Scorers, score processing, per-token reward shaping and KL controllers, by hand."""

import copy
import math

import pytest
import torch
from transformers import GPT2Config, GPT2Model

from rlhfkit.data import pad
from rlhfkit.experience.rewards import (
    AdaptiveKLController,
    FixedKLController,
    RunningMoments,
    ScoreOptions,
    process_scores,
    shape_rewards,
)
from rlhfkit.experience.scorer_loading import load_function
from rlhfkit.experience.scorers import (
    FunctionScorer,
    RewardModelScorer,
    ScoreError,
    ScoreInput,
    WeightedScorer,
    as_scorer,
    with_final_eos,
)
from rlhfkit.models.loading import RewardModel
from rlhfkit.runtime.packing import enable_packing

PAD = 1


def _batch(responses=("a", "bb", "ccc")):
    n = len(responses)
    query, query_mask = pad([[5, 6], [7], [8, 9, 10]][:n], PAD, side="left")
    response, response_mask = pad([[11, 0], [12, 13], [14]][:n], PAD)
    return ScoreInput(
        prompts=[f"p{i}" for i in range(n)],
        responses=list(responses),
        query=query,
        query_mask=query_mask,
        response=response,
        response_mask=response_mask,
    )


# --------------------------------------------------------------------------- scorers
def test_function_scorer_gives_a_float_tensor():
    scores = FunctionScorer(lambda prompts, responses: [len(r) for r in responses])(_batch())
    assert scores.dtype == torch.float32
    assert scores.tolist() == [1.0, 2.0, 3.0]


def test_non_finite_score_names_the_sample():
    scorer = FunctionScorer(lambda p, r: [0.0, float("nan"), 1.0], name="judge")
    with pytest.raises(ScoreError, match=r"judge .*nan.* sample 1 \(prompt='p1', response='bb'\)"):
        scorer(_batch())


def test_raising_function_names_the_first_sample_that_raises():
    def picky(prompts, responses):
        return [1.0 / (len(r) - 2) for r in responses]  # "bb" divides by zero

    with pytest.raises(
        ScoreError, match=r"ZeroDivisionError.*sample 1 \(prompt='p1', response='bb'\)"
    ):
        FunctionScorer(picky)(_batch())


def test_wrong_number_of_scores_is_an_error():
    with pytest.raises(ScoreError, match="returned 2 scores for 3 responses"):
        FunctionScorer(lambda p, r: [1.0, 2.0])(_batch())


def test_weighted_scorer_sums_weighted_parts():
    length = FunctionScorer(lambda p, r: [len(x) for x in r], name="length")
    one = FunctionScorer(lambda p, r: [1.0] * len(r), name="one")
    scorer = WeightedScorer([(length, 2.0), (one, -0.5)])
    assert scorer(_batch()).tolist() == [1.5, 3.5, 5.5]
    assert scorer.name == "2*length + -0.5*one"


@pytest.fixture(scope="module")
def tiny_reward_model():
    torch.manual_seed(0)
    backbone = GPT2Model(GPT2Config(n_layer=1, n_head=2, n_embd=16, n_positions=32, vocab_size=20))
    return RewardModel(backbone).eval()


def test_reward_model_scorer_reads_the_last_real_token_whatever_the_padding(tiny_reward_model):
    """Left-padded queries and early-stopping responses score as each sample alone."""
    batch = _batch()
    scores = RewardModelScorer(tiny_reward_model)(batch)
    for i in range(3):
        q = batch.query[i][batch.query_mask[i] != 0]
        r = batch.response[i][batch.response_mask[i] != 0]
        alone = torch.cat([q, r])[None]
        expected = tiny_reward_model(alone, torch.ones_like(alone))
        assert torch.allclose(scores[i], expected[0], atol=1e-5)


def test_with_final_eos_by_hand():
    """Row 0 ends with EOS (2); row 1 ran out of tokens; row 2 was cut and right-padded."""
    sequence = torch.tensor([[1, 5, 6, 7, 2, 1], [5, 6, 7, 8, 9, 9], [1, 5, 6, 3, 1, 1]])
    mask = torch.tensor([[0, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1], [0, 1, 1, 1, 0, 0]])
    got, got_mask = with_final_eos(sequence, mask, eos_token_id=2)
    assert got_mask.tolist() == [
        [0, 1, 1, 1, 1, 0, 0],
        [1, 1, 1, 1, 1, 1, 1],
        [0, 1, 1, 1, 1, 0, 0],
    ]
    real = [row[keep.bool()].tolist() for row, keep in zip(got, got_mask, strict=True)]
    assert real == [[5, 6, 7, 2], [5, 6, 7, 8, 9, 9, 2], [5, 6, 3, 2]]
    assert sequence.shape == (3, 6) and mask[1, -1] == 1  # the inputs are left as they were
    ended = sequence[:1], mask[:1]
    assert with_final_eos(*ended, eos_token_id=2) == ended  # nothing to add: the same tensors


def test_a_response_cut_short_is_scored_at_an_appended_eos(tiny_reward_model):
    """As the reward model was trained: every response ends with EOS, a cut one too. Padded
    and packed, each row scores as the row alone with its EOS."""
    eos = 2
    query, query_mask = pad([[5, 6], [7], [8, 9, 10]], PAD, side="left")
    response, response_mask = pad([[11, eos], [12, 13], [14]], PAD)  # rows 1 and 2 cut
    batch = ScoreInput(["p0", "p1", "p2"], ["a", "b", "c"], query, query_mask, response,
                       response_mask, eos_token_id=eos)  # fmt: skip
    alone = [[5, 6, 11, eos], [7, 12, 13, eos], [8, 9, 10, 14, eos]]
    expected = torch.stack([tiny_reward_model(torch.tensor([x]), torch.ones(1, len(x)))[0]
                            for x in alone])  # fmt: skip
    torch.testing.assert_close(RewardModelScorer(tiny_reward_model)(batch), expected)
    packed = copy.deepcopy(tiny_reward_model)
    assert enable_packing(packed)
    torch.testing.assert_close(RewardModelScorer(packed)(batch), expected)
    batch.eos_token_id = None  # what ends a response unknown: read at the last token, as is
    at_last = tiny_reward_model(torch.tensor([[7, 12, 13]]), torch.ones(1, 3))[0]
    torch.testing.assert_close(RewardModelScorer(tiny_reward_model)(batch)[1], at_last)


def test_as_scorer_dispatch(tiny_reward_model):
    assert isinstance(as_scorer(tiny_reward_model), RewardModelScorer)
    assert isinstance(as_scorer(lambda p, r: [0.0] * len(p)), FunctionScorer)
    scorer = FunctionScorer(len)
    assert as_scorer(scorer) is scorer
    with pytest.raises(TypeError, match="cannot score"):
        as_scorer(3)


def test_load_function():
    assert load_function("math:sqrt") is math.sqrt
    with pytest.raises(ValueError, match="module:function"):
        load_function("math.sqrt")
    with pytest.raises(ValueError, match="module math has no attribute 'nope'"):
        load_function("math:nope")


# --------------------------------------------------------------------------- score processing
def test_running_moments_match_the_whole_data():
    data = torch.tensor([1.0, 4.0, -2.0, 8.0, 0.5, 3.0, 3.0])
    moments = RunningMoments()
    for part in (data[:3], data[3:4], data[4:]):
        moments.update(part)
    assert moments.count == 7
    assert moments.mean == pytest.approx(data.mean().item())
    assert moments.std == pytest.approx(data.std().item())
    restored = RunningMoments()
    restored.load_state_dict(moments.state_dict())
    assert restored.std == moments.std


def test_missing_eos_penalty_subtracts_or_replaces():
    scores = torch.tensor([2.0, 2.0, -3.0])
    eos = torch.tensor([True, False, False])
    subtract = ScoreOptions(missing_eos_penalty=1.0)
    replace = ScoreOptions(missing_eos_penalty=1.0, missing_eos_replace=True)
    assert process_scores(scores, eos, subtract, RunningMoments()).tolist() == [2.0, 1.0, -4.0]
    assert process_scores(scores, eos, replace, RunningMoments()).tolist() == [2.0, -1.0, -1.0]


def test_normalise_then_clip():
    scores = torch.tensor([0.0, 2.0, 4.0])  # mean 2, unbiased std 2
    eos = torch.ones(3, dtype=torch.bool)
    scale = process_scores(scores, eos, ScoreOptions(normalize="scale"), RunningMoments())
    assert scale.tolist() == pytest.approx([0.0, 1.0, 2.0])
    options = ScoreOptions(normalize="standardize", clip=0.5)
    assert process_scores(scores, eos, options, RunningMoments()).tolist() == [-0.5, 0.0, 0.5]


def test_score_options_are_checked():
    with pytest.raises(ValueError, match="normalize='z'"):
        ScoreOptions(normalize="z")
    with pytest.raises(ValueError, match="clip=0"):
        ScoreOptions(clip=0)
    with pytest.raises(ValueError, match="missing_eos_replace"):
        ScoreOptions(missing_eos_replace=True)


# --------------------------------------------------------------------------- reward shaping
def test_shape_rewards_by_hand_with_an_early_stop():
    scores = torch.tensor([1.0, -2.0])
    logprobs = torch.tensor([[-1.0, -2.0, -0.5], [-1.0, -1.0, 9.0]])
    ref_logprobs = torch.tensor([[-1.5, -1.0, -0.5], [-2.0, -1.0, 9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])  # row 1 stopped (EOS) at position 1
    rewards, kl = shape_rewards(scores, logprobs, ref_logprobs, mask, kl_coef=0.1)
    assert kl.tolist() == [[0.5, -1.0, 0.0], [1.0, 0.0, 0.0]]
    expected = [[-0.05, 0.1, 0.0 + 1.0], [-0.1, 0.0 - 2.0, 0.0]]
    assert torch.allclose(rewards, torch.tensor(expected))


def test_shape_rewards_k3_is_non_negative_and_zero_on_padding():
    logprobs = torch.tensor([[-1.0, -2.0], [-0.3, 5.0]])
    ref_logprobs = torch.tensor([[-2.0, -1.0], [-0.3, -5.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    _, kl = shape_rewards(torch.zeros(2), logprobs, ref_logprobs, mask, 1.0, estimator="k3")
    r = math.exp(-1.0)  # ref / pi for the first token: exp(-2 - -1)
    assert kl[0, 0].item() == pytest.approx(r - 1 - math.log(r))
    assert (kl >= 0).all() and kl[1, 1] == 0


# --------------------------------------------------------------------------- KL controllers
def test_adaptive_kl_controller_by_hand():
    controller = AdaptiveKLController(0.1, target=6.0, horizon=10000)
    controller.update(current_kl=9.0, n_steps=32)  # error 0.5 clipped to 0.2
    assert controller.value == pytest.approx(0.1 * (1 + 0.2 * 32 / 10000))
    controller.update(current_kl=6.6, n_steps=100)  # error 0.1
    assert controller.value == pytest.approx(0.1 * 1.00064 * (1 + 0.1 * 100 / 10000))
    before = controller.value
    controller.update(current_kl=0.0, n_steps=500)  # error -1 clipped to -0.2
    assert controller.value == pytest.approx(before * (1 - 0.2 * 500 / 10000))
    restored = AdaptiveKLController(1.0, 6.0, 10000)
    restored.load_state_dict(controller.state_dict())
    assert restored.value == controller.value


def test_fixed_kl_controller_does_not_move():
    controller = FixedKLController(0.05)
    controller.update(100.0, 32)
    assert controller.value == 0.05
