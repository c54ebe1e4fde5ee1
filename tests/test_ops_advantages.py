"""GAE and group baselines (rlhfkit.ops.advantages)."""

import statistics

import pytest
import torch

from rlhfkit.ops.advantages import (
    gae,
    group_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
)


def test_gae_three_step_hand_example_with_padding():
    # gamma 0.9, lam 0.8, V after the last token = 0:
    # delta_2 = 2 - 1.5 = 0.5;           A_2 = 0.5
    # delta_1 = 0 + 0.9 * 1.5 - 1 = 0.35; A_1 = 0.35 + 0.72 * 0.5 = 0.71
    # delta_0 = 1 + 0.9 * 1 - 0.5 = 1.4;  A_0 = 1.4 + 0.72 * 0.71 = 1.9112
    rewards = torch.tensor([[1.0, 0.0, 2.0, 55.0, float("nan")]])  # padding holds junk
    values = torch.tensor([[0.5, 1.0, 1.5, -9.0, float("inf")]])
    mask = torch.tensor([[1, 1, 1, 0, 0]])
    advantages, returns = gae(rewards, values, mask, gamma=0.9, lam=0.8)
    torch.testing.assert_close(advantages, torch.tensor([[1.9112, 0.71, 0.5, 0.0, 0.0]]))
    torch.testing.assert_close(returns, torch.tensor([[2.4112, 1.71, 2.0, 0.0, 0.0]]))


def loop_gae(rewards, values, lengths, gamma, lam):
    """Eq. 16 written out: A_t = sum_l (gamma lam)^l delta_{t+l}, one row at a time."""
    out = []
    for r, v, n in zip(rewards, values, lengths, strict=True):
        row = [0.0] * len(r)
        for t in range(n):
            for k in range(t, n):
                next_value = v[k + 1] if k + 1 < n else 0.0
                delta = r[k] + gamma * next_value - v[k]
                row[t] += (gamma * lam) ** (k - t) * delta
        out.append(row)
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 0.95), (0.9, 0.8), (0.99, 0.0)])
def test_gae_equals_plain_loop_on_right_padded_batch(gamma, lam):
    gen = torch.Generator().manual_seed(0)
    batch, length = 8, 9
    rewards = torch.randn(batch, length, generator=gen, dtype=torch.float64)
    values = torch.randn(batch, length, generator=gen, dtype=torch.float64)
    lengths = torch.randint(1, length + 1, (batch,), generator=gen)
    mask = (torch.arange(length) < lengths[:, None]).long()
    expected = loop_gae(rewards.tolist(), values.tolist(), lengths.tolist(), gamma, lam)
    junk = torch.randn(batch, length, generator=gen, dtype=torch.float64) * 1e6
    padded_rewards = torch.where(mask.bool(), rewards, junk)
    padded_values = torch.where(mask.bool(), values, junk)
    advantages, returns = gae(padded_rewards, padded_values, mask, gamma, lam)
    torch.testing.assert_close(advantages, expected)
    torch.testing.assert_close(returns, (expected + values) * mask)


def test_gae_steps_over_an_episodes_environment_tokens():
    # The hand example with two environment tokens between its first and second token: the
    # recursion steps over them (no reward, no value, no discount), so the policy's tokens
    # get the advantages and returns they get without them, and the others 0.
    rewards = torch.tensor([[1.0, 7.0, 7.0, 0.0, 2.0, 0.0]])
    values = torch.tensor([[0.5, 9.0, 9.0, 1.0, 1.5, 0.0]])
    mask = torch.tensor([[1, 0, 0, 1, 1, 0]])
    advantages, returns = gae(rewards, values, mask, gamma=0.9, lam=0.8)
    expected = torch.tensor([[1.9112, 0.0, 0.0, 0.71, 0.5, 0.0]])
    torch.testing.assert_close(advantages, expected)
    torch.testing.assert_close(returns, expected + values * mask)


@pytest.mark.parametrize("gamma, lam", [(1.0, 0.95), (0.9, 0.8)])
def test_gae_with_holes_equals_gae_of_the_policy_tokens_alone(gamma, lam):
    torch.manual_seed(0)
    mask = (torch.rand(4, 12) > 0.4).long()
    rewards, values = torch.randn(4, 12), torch.randn(4, 12)
    advantages, returns = gae(rewards, values, mask, gamma, lam)
    for row in range(4):
        kept = mask[row].bool()
        compact, compact_returns = gae(
            rewards[row][kept][None], values[row][kept][None], mask[row][kept][None], gamma, lam
        )
        torch.testing.assert_close(advantages[row][kept], compact[0])
        torch.testing.assert_close(returns[row][kept], compact_returns[0])
        assert (advantages[row][~kept] == 0).all()


def test_gae_lambda_one_returns_are_reward_to_go():
    # gamma = lam = 1: returns are the undiscounted sum of future rewards, whatever the values.
    rewards = torch.tensor([[0.1, -0.2, 0.3, 1.0]])
    values = torch.tensor([[5.0, -3.0, 2.0, 7.0]])
    _, returns = gae(rewards, values, torch.ones(1, 4), gamma=1.0, lam=1.0)
    torch.testing.assert_close(returns, torch.tensor([[1.2, 1.1, 1.3, 1.0]]))


def test_gae_left_padding_matches_right_padding():
    rewards = torch.tensor([[1.0, 0.0, 2.0]])
    values = torch.tensor([[0.5, 1.0, 1.5]])
    right = gae(rewards, values, torch.ones(1, 3), 0.9, 0.8)
    left = gae(
        torch.cat([torch.full((1, 2), 3.0), rewards], 1),
        torch.cat([torch.full((1, 2), 3.0), values], 1),
        torch.tensor([[0, 0, 1, 1, 1]]),
        0.9,
        0.8,
    )
    for r, lft in zip(right, left, strict=True):
        torch.testing.assert_close(lft, torch.cat([torch.zeros(1, 2), r], 1))


def test_gae_outputs_are_detached_targets():
    values = torch.randn(2, 3, requires_grad=True)
    advantages, returns = gae(torch.randn(2, 3), values, torch.ones(2, 3), 1.0, 0.95)
    assert not advantages.requires_grad and not returns.requires_grad


def test_gae_shape_mismatch():
    with pytest.raises(ValueError, match=r"rewards \(2, 3\), values \(2, 4\)"):
        gae(torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3), 1.0, 0.95)


def test_group_advantages_hand_example():
    scores = torch.tensor([1.0, 2.0, 3.0, 5.0, 5.0, 5.0])
    # group 1: mean 2, unbiased std 1; group 2: identical scores -> 0, not NaN
    torch.testing.assert_close(
        group_advantages(scores, 3),
        torch.tensor([-1.0, 0.0, 1.0, 0.0, 0.0, 0.0]),
        atol=1e-5,
        rtol=0,
    )
    torch.testing.assert_close(
        group_advantages(scores, 3, scale_by_std=False), torch.tensor([-1.0, 0, 1, 0, 0, 0])
    )


def test_group_and_rloo_equal_plain_loop():
    gen = torch.Generator().manual_seed(3)
    group_size = 4
    scores = torch.randn(5 * group_size, generator=gen, dtype=torch.float64)
    expected_grpo, expected_dr, expected_rloo = [], [], []
    for start in range(0, len(scores), group_size):
        group = scores[start : start + group_size].tolist()
        mean, std = statistics.mean(group), statistics.stdev(group)
        for i, s in enumerate(group):
            expected_grpo.append((s - mean) / (std + 1e-6))
            expected_dr.append(s - mean)
            others = group[:i] + group[i + 1 :]
            expected_rloo.append(s - sum(others) / len(others))
    check = torch.testing.assert_close
    check(group_advantages(scores, group_size), torch.tensor(expected_grpo, dtype=torch.float64))
    check(
        group_advantages(scores, group_size, scale_by_std=False),
        torch.tensor(expected_dr, dtype=torch.float64),
    )
    check(rloo_advantages(scores, group_size), torch.tensor(expected_rloo, dtype=torch.float64))


def test_rloo_hand_example_and_identity():
    scores = torch.tensor([1.0, 2.0, 3.0])
    torch.testing.assert_close(
        rloo_advantages(torch.tensor([1, 2, 3]), 3), torch.tensor([-1.5, 0.0, 1.5])
    )
    rloo = rloo_advantages(scores, 3)
    torch.testing.assert_close(rloo, torch.tensor([-1.5, 0.0, 1.5]))
    torch.testing.assert_close(rloo, 3 / 2 * (scores - scores.mean()))


@pytest.mark.parametrize("fn", [group_advantages, rloo_advantages])
def test_group_errors(fn):
    with pytest.raises(ValueError, match="batch size 5 is not divisible by group_size 2"):
        fn(torch.zeros(5), 2)
    with pytest.raises(ValueError, match="group_size must be >= 2"):
        fn(torch.zeros(4), 1)
    with pytest.raises(ValueError, match=r"scores must be \(B,\)"):
        fn(torch.zeros(4, 1), 2)


def test_reinforce_pp_hand_example():
    # returns to the end of each response: [1, 1, 1] and [2 - 0.5, 2, pad] = [1.5, 2]
    rewards = torch.tensor([[0.0, 0.0, 1.0], [-0.5, 2.0, 9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    got = reinforce_pp_advantages(rewards, mask)
    real = [1.0, 1.0, 1.0, 1.5, 2.0]
    mean, std = statistics.fmean(real), statistics.stdev(real)  # unbiased, as masked_var
    expected = torch.tensor(
        [[(r - mean) / std for r in real[:3]], [*((r - mean) / std for r in real[3:]), 0.0]]
    )
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)


def test_reinforce_pp_matches_the_plain_loop():
    gen = torch.Generator().manual_seed(1)
    rewards = torch.randn(4, 6, generator=gen)
    lengths = [6, 2, 4, 1]
    mask = torch.tensor([[int(t < n) for t in range(6)] for n in lengths])
    returns = [[sum(rewards[i, t:n].tolist()) for t in range(n)] for i, n in enumerate(lengths)]
    flat = [g for row in returns for g in row]
    mean, std = statistics.fmean(flat), statistics.stdev(flat)
    got = reinforce_pp_advantages(rewards, mask)
    for i, row in enumerate(returns):
        for t, g in enumerate(row):
            assert got[i, t].item() == pytest.approx((g - mean) / std, abs=1e-5)
    assert (got[mask == 0] == 0).all()
