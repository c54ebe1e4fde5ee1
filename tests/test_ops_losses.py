"""KL estimators, PPO, pairwise / ranking, reward centring, DPO and RPO losses
(rlhfkit.ops.losses)."""

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from rlhfkit.ops.losses import (
    aggregate_token_loss,
    dpo_loss,
    importance_log_ratio,
    kl_k1,
    kl_k2,
    kl_k3,
    kl_penalty,
    pairwise_logexp_loss,
    pairwise_logsigmoid_loss,
    ppo_policy_loss,
    ppo_value_loss,
    ranking_loss,
    reward_centering,
    rpo_loss,
)

LN2 = math.log(2.0)


def neg_logsig(x):
    return math.log1p(math.exp(-x))


def test_kl_estimators_hand_values():
    # pi(x) = 1/2, ref(x) = 1/4: r = ref / pi = 1/2
    logp, logref = torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)])
    torch.testing.assert_close(kl_k1(logp, logref), torch.tensor([LN2]))
    torch.testing.assert_close(kl_k2(logp, logref), torch.tensor([0.5 * LN2**2]))
    torch.testing.assert_close(kl_k3(logp, logref), torch.tensor([0.5 - 1 + LN2]))
    for name, fn in (("k1", kl_k1), ("k2", kl_k2), ("k3", kl_k3)):
        torch.testing.assert_close(kl_penalty(logp, logref, name), fn(logp, logref))
    # the sign: a policy more likely than the reference is penalised, not rewarded
    assert kl_penalty(logp, logref).item() > 0


def test_kl_per_token_no_reduction_and_k3_nonnegative():
    gen = torch.Generator().manual_seed(0)
    logp, logref = (
        torch.randn(2, 3, 50, generator=gen) * 4,
        torch.randn(2, 3, 50, generator=gen) * 4,
    )
    assert kl_k3(logp, logref).shape == (2, 3, 50)
    assert (kl_k3(logp, logref) >= 0).all()
    assert (kl_k2(logp, logref) >= 0).all()


def test_kl_monte_carlo_means_approach_true_kl():
    pi = torch.tensor([0.5, 0.2, 0.2, 0.1])
    ref = torch.tensor([0.25, 0.25, 0.25, 0.25])
    true_kl = (pi * (pi / ref).log()).sum()  # KL(pi || ref) = 0.1218
    samples = torch.multinomial(
        pi, 200_000, replacement=True, generator=torch.Generator().manual_seed(0)
    )
    logp, logref = pi.log()[samples], ref.log()[samples]
    for estimator in ("k1", "k3"):
        torch.testing.assert_close(
            kl_penalty(logp, logref, estimator).mean(), true_kl, atol=5e-3, rtol=0
        )


def test_kl_unknown_estimator_lists_allowed():
    with pytest.raises(ValueError, match=r"'k4' is not one of \['k1', 'k2', 'k3'\]"):
        kl_penalty(torch.zeros(1), torch.zeros(1), "k4")


def test_ppo_policy_loss_hand_example():
    # ratios 1.5, 0.5, 0.5, 1.0 (+ a padded token full of junk), eps = 0.2
    ratio = torch.tensor([[1.5, 0.5, 0.5, 1.0, 1e30]])
    old = torch.tensor([[-1.0, -2.0, -0.5, -3.0, -1.0]])
    logprobs = (old + ratio.log()).requires_grad_()
    advantages = torch.tensor([[1.0, 1.0, -1.0, -2.0, 1e9]])
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    loss, stats = ppo_policy_loss(logprobs, old, advantages, mask, clip_range=0.2)
    # per token max(-A r, -A clip(r)): max(-1.5, -1.2) = -1.2 (clipped); max(-0.5, -0.8) = -0.5;
    # max(0.5, 0.8) = 0.8 (clipped); max(2, 2) = 2 -> mean 1.1 / 4
    torch.testing.assert_close(loss, torch.tensor(0.275))
    torch.testing.assert_close(stats["clipfrac"], torch.tensor(0.5))
    expected_kl = 0.5 * (math.log(1.5) ** 2 + 2 * LN2**2) / 4
    torch.testing.assert_close(stats["approx_kl"], torch.tensor(expected_kl))
    torch.testing.assert_close(stats["ratio"], torch.tensor(3.5 / 4))
    loss.backward()
    # clipped tokens get no gradient; the others -A r / n_real
    torch.testing.assert_close(logprobs.grad, torch.tensor([[0.0, -0.125, 0.0, 0.5, 0.0]]))


def test_ppo_policy_loss_unclipped_equals_ratio_objective():
    # far from the clip range the loss is just -mean(A r) and its gradient -A r / n
    gen = torch.Generator().manual_seed(0)
    old = torch.randn(3, 4, generator=gen)
    logprobs = (old + 0.01 * torch.randn(3, 4, generator=gen)).requires_grad_()
    advantages = torch.randn(3, 4, generator=gen)
    loss, stats = ppo_policy_loss(logprobs, old, advantages, torch.ones(3, 4), clip_range=0.5)
    torch.testing.assert_close(loss, -(advantages * (logprobs - old).exp()).mean())
    assert stats["clipfrac"].item() == 0.0
    assert not any(s.requires_grad for s in stats.values())


def test_clip_higher_moves_only_the_upper_bound():
    # the hand example above with eps_low 0.2, eps_high 0.6: the first token (r = 1.5, A = 1)
    # is no longer clipped: max(-1.5, -1.5) = -1.5; the third (r = 0.5, A = -1) still is
    ratio = torch.tensor([[1.5, 0.5, 0.5, 1.0]])
    old = torch.tensor([[-1.0, -2.0, -0.5, -3.0]])
    logprobs = (old + ratio.log()).requires_grad_()
    advantages = torch.tensor([[1.0, 1.0, -1.0, -2.0]])
    mask = torch.ones(1, 4)
    loss, stats = ppo_policy_loss(logprobs, old, advantages, mask, 0.2, clip_range_high=0.6)
    torch.testing.assert_close(loss, torch.tensor((-1.5 - 0.5 + 0.8 + 2.0) / 4))
    torch.testing.assert_close(stats["clipfrac"], torch.tensor(0.25))
    loss.backward()
    torch.testing.assert_close(logprobs.grad, torch.tensor([[-0.375, -0.125, 0.0, 0.5]]))
    same, _ = ppo_policy_loss(logprobs, old, advantages, mask, 0.2, clip_range_high=0.2)
    torch.testing.assert_close(same, ppo_policy_loss(logprobs, old, advantages, mask, 0.2)[0])


def test_sequence_level_ratio_hand_example():
    # GSPO, eps = 0.2. Response 0: token log-ratios ln 2, 0 (+ a padded token full of junk):
    # s = exp(ln 2 / 2) = sqrt 2, A = 1 -> max(-sqrt 2, -1.2) = -1.2, clipped, at both tokens.
    # Response 1: log-ratios -ln 2, -ln 2, ln 4: s = exp(0) = 1, A = -1 -> 1 at its 3 tokens.
    old = torch.tensor([[-1.0, -2.0, -1.0], [-0.5, -3.0, -2.0]])
    log_ratio = torch.tensor([[LN2, 0.0, 69.0], [-LN2, -LN2, 2 * LN2]])
    logprobs = (old + log_ratio).requires_grad_()
    advantages = torch.tensor([[1.0, 1.0, 1e9], [-1.0, -1.0, -1.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    loss, stats = ppo_policy_loss(
        logprobs, old, advantages, mask, 0.2, aggregation="sequence_mean", ratio_level="sequence"
    )
    torch.testing.assert_close(loss, torch.tensor((-1.2 + 1.0) / 2))
    torch.testing.assert_close(stats["clipfrac"], torch.tensor(2 / 5))
    torch.testing.assert_close(stats["ratio"], torch.tensor((2 * math.sqrt(2) + 3) / 5))
    # approx_kl stays per token: 0.5 (ln2^2 + 0 + ln2^2 + ln2^2 + (2 ln2)^2) / 5
    torch.testing.assert_close(stats["approx_kl"], torch.tensor(0.5 * 7 * LN2**2 / 5))
    loss.backward()
    # response 0 is clipped: no gradient; response 1's term s / 2 has d s / d logp_t = s / 3
    expected = torch.tensor([[0.0, 0.0, 0.0], [1 / 6, 1 / 6, 1 / 6]])
    torch.testing.assert_close(logprobs.grad, expected)
    token_mean, _ = ppo_policy_loss(logprobs, old, advantages, mask, 0.2, ratio_level="sequence")
    torch.testing.assert_close(token_mean, torch.tensor((2 * -1.2 + 3 * 1.0) / 5))


def test_sequence_level_ratio_equals_the_plain_loop():
    gen = torch.Generator().manual_seed(4)
    old = torch.randn(5, 6, generator=gen)
    logprobs = old + 0.3 * torch.randn(5, 6, generator=gen)
    lengths = [6, 1, 0, 4, 3]
    mask = torch.tensor([[int(t < n) for t in range(6)] for n in lengths])
    got = importance_log_ratio(logprobs, old, mask, "sequence")
    for i, n in enumerate(lengths):
        mean = sum((logprobs[i, :n] - old[i, :n]).tolist()) / n if n else 0.0
        torch.testing.assert_close(got[i, :n], torch.full((n,), mean))
        assert (got[i, n:] == 0).all()
    token = importance_log_ratio(logprobs, old, mask)
    torch.testing.assert_close(token, (logprobs - old) * mask)
    with pytest.raises(ValueError, match=r"'word' is not one of \['token', 'sequence'\]"):
        importance_log_ratio(logprobs, old, mask, "word")


@pytest.mark.parametrize("aggregation", ["token_mean", "sequence_mean", "constant"])
def test_sequence_level_ratio_has_the_token_gradient_at_the_sampling_policy(aggregation):
    # At pi = pi_old, with one advantage per response, GSPO's gradient is the token level's.
    gen = torch.Generator().manual_seed(5)
    old = torch.randn(4, 5, generator=gen)
    advantages = torch.randn(4, 1, generator=gen).expand(4, 5)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 0, 0]])
    grads = []
    for level in ("token", "sequence"):
        logprobs = old.clone().requires_grad_()
        loss, _ = ppo_policy_loss(
            logprobs, old, advantages, mask, 0.2, aggregation=aggregation, max_tokens=5,
            ratio_level=level,
        )  # fmt: skip
        loss.backward()
        grads.append(logprobs.grad)
    torch.testing.assert_close(grads[0], grads[1])


def test_loss_aggregations_hand_example():
    per_token = torch.tensor([[1.0, 2.0, 3.0], [4.0, 7.0, 7.0], [9.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])  # the last response is empty
    # every real token alike: (1 + 2 + 3 + 4) / 4
    assert aggregate_token_loss(per_token, mask, "token_mean").item() == 2.5
    # per response (6 / 3 = 2, then 4), the empty one left out: (2 + 4) / 2
    assert aggregate_token_loss(per_token, mask, "sequence_mean").item() == 3.0
    # over a constant 3 rows x 5 tokens: 10 / 15
    constant = aggregate_token_loss(per_token, mask, "constant", max_tokens=5)
    torch.testing.assert_close(constant, torch.tensor(10 / 15))
    with pytest.raises(ValueError, match="max_tokens"):
        aggregate_token_loss(per_token, mask, "constant")
    with pytest.raises(ValueError, match="token_mean"):
        aggregate_token_loss(per_token, mask, "sum")


def test_sequence_mean_matches_the_plain_loop():
    gen = torch.Generator().manual_seed(3)
    per_token = torch.randn(6, 9, generator=gen)
    lengths = [9, 1, 4, 0, 7, 2]
    mask = torch.tensor([[int(t < n) for t in range(9)] for n in lengths])
    means = [sum(per_token[i, :n].tolist()) / n for i, n in enumerate(lengths) if n]
    expected = sum(means) / len(means)
    got = aggregate_token_loss(per_token, mask, "sequence_mean")
    torch.testing.assert_close(got, torch.tensor(expected))


def test_ppo_value_loss_hand_example():
    values = torch.tensor([[1.0, 1.0, 0.4, 99.0]], requires_grad=True)
    old = torch.tensor([[0.5, 0.5, 0.5, 0.0]])
    returns = torch.tensor([[0.0, 1.0, 0.45, -99.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    loss, stats = ppo_value_loss(values, old, returns, mask, clip_range=0.2)
    # clipped values 0.7, 0.7, 0.4 -> errors max(1, 0.49) = 1; max(0, 0.09) = 0.09 (clipped);
    # max(0.0025, 0.0025) = 0.0025
    torch.testing.assert_close(loss, torch.tensor(0.5 * (1 + 0.09 + 0.0025) / 3))
    torch.testing.assert_close(stats["vf_clipfrac"], torch.tensor(1 / 3))
    loss.backward()
    # the clipped token's value is frozen; the others get (v - R) / n_real
    torch.testing.assert_close(values.grad, torch.tensor([[1 / 3, 0.0, -0.05 / 3, 0.0]]))
    unclipped, stats = ppo_value_loss(values, old, returns, mask, clip_range=None)
    torch.testing.assert_close(unclipped, torch.tensor(0.5 * (1 + 0 + 0.0025) / 3))
    assert stats["vf_clipfrac"].item() == 0.0


def test_pairwise_losses_hand_example():
    chosen, rejected = torch.tensor([2.0, 0.0]), torch.tensor([1.0, 1.0])
    expected = (neg_logsig(1.0) + neg_logsig(-1.0)) / 2
    torch.testing.assert_close(pairwise_logsigmoid_loss(chosen, rejected), torch.tensor(expected))
    torch.testing.assert_close(pairwise_logexp_loss(chosen, rejected), torch.tensor(expected))
    with_margin = pairwise_logsigmoid_loss(chosen, rejected, margin=torch.tensor([0.5, 0.0]))
    torch.testing.assert_close(with_margin, torch.tensor((neg_logsig(0.5) + neg_logsig(-1.0)) / 2))


def test_pairwise_losses_are_stable_for_large_differences():
    chosen, rejected = torch.tensor([1000.0, -1000.0]), torch.tensor([-1000.0, 1000.0])
    for fn in (pairwise_logsigmoid_loss, pairwise_logexp_loss):
        torch.testing.assert_close(fn(chosen, rejected), torch.tensor(1000.0))


def test_ranking_loss_hand_example_k3():
    scores = torch.tensor([[3.0, 1.0, 0.0]])  # best first
    expected = (neg_logsig(2.0) + neg_logsig(3.0) + neg_logsig(1.0)) / 3
    torch.testing.assert_close(ranking_loss(scores), torch.tensor(expected))


def loop_ranking_loss(scores, valid):
    per_prompt = []
    for row, ok in zip(scores.tolist(), valid.tolist(), strict=True):
        pairs = [(i, j) for i, j in itertools.combinations(range(len(row)), 2) if ok[i] and ok[j]]
        if pairs:
            per_prompt.append(sum(neg_logsig(row[i] - row[j]) for i, j in pairs) / len(pairs))
    return sum(per_prompt) / len(per_prompt)


def test_ranking_loss_equals_loop_and_counts_each_prompt_once():
    gen = torch.Generator().manual_seed(0)
    scores = torch.randn(12, 5, generator=gen, dtype=torch.float64)
    lengths = torch.randint(1, 6, (12,), generator=gen)  # a prompt with 1 response has no pair
    lengths[0] = 5
    valid = torch.arange(5) < lengths[:, None]
    torch.testing.assert_close(
        ranking_loss(scores, valid),
        torch.tensor(loop_ranking_loss(scores, valid), dtype=torch.float64),
    )
    torch.testing.assert_close(
        ranking_loss(scores),
        torch.tensor(loop_ranking_loss(scores, torch.ones(12, 5)), dtype=torch.float64),
    )


def test_ranking_loss_k2_is_pairwise_loss():
    chosen, rejected = torch.randn(6), torch.randn(6)
    torch.testing.assert_close(
        ranking_loss(torch.stack([chosen, rejected], 1)), pairwise_logsigmoid_loss(chosen, rejected)
    )


# policy chosen/rejected, reference chosen/rejected; log-ratios +1 and -1, h = 2
DPO_CASE = [torch.tensor([-1.0]), torch.tensor([-3.0]), torch.tensor([-2.0]), torch.tensor([-2.0])]


@pytest.mark.parametrize(
    ("loss_type", "label_smoothing", "expected"),
    [
        ("sigmoid", 0.0, neg_logsig(1.0)),  # beta h = 1
        ("conservative", 0.1, 0.9 * neg_logsig(1.0) + 0.1 * neg_logsig(-1.0)),
        ("ipo", 0.0, (2.0 - 1.0) ** 2),  # 1 / (2 beta) = 1
    ],
)
def test_dpo_loss_hand_examples(loss_type, label_smoothing, expected):
    losses, chosen_rewards, rejected_rewards = dpo_loss(
        *DPO_CASE, beta=0.5, loss_type=loss_type, label_smoothing=label_smoothing
    )
    torch.testing.assert_close(losses, torch.tensor([expected]))
    torch.testing.assert_close(chosen_rewards, torch.tensor([0.5]))
    torch.testing.assert_close(rejected_rewards, torch.tensor([-0.5]))


def test_dpo_gradients_reach_policy_only():
    policy_chosen, policy_rejected, ref_chosen, ref_rejected = (
        t.clone().requires_grad_() for t in DPO_CASE
    )
    losses, chosen_rewards, _ = dpo_loss(
        policy_chosen, policy_rejected, ref_chosen, ref_rejected, 0.5
    )
    losses.sum().backward()
    # d/d policy_chosen of -log sigmoid(beta h) = -beta sigmoid(-beta h)
    torch.testing.assert_close(policy_chosen.grad, -0.5 * torch.sigmoid(torch.tensor([-1.0])))
    torch.testing.assert_close(policy_rejected.grad, -policy_chosen.grad)
    assert ref_chosen.grad is None and ref_rejected.grad is None
    assert not chosen_rewards.requires_grad


def test_dpo_sigmoid_matches_formula_on_batch():
    gen = torch.Generator().manual_seed(0)
    logps = [torch.randn(8, generator=gen) * 5 for _ in range(4)]
    losses, _, _ = dpo_loss(*logps, beta=0.1)
    h = (logps[0] - logps[2]) - (logps[1] - logps[3])
    torch.testing.assert_close(losses, -F.logsigmoid(0.1 * h))


def test_dpo_errors():
    with pytest.raises(
        ValueError, match=r"'kto' is not one of \['conservative', 'ipo', 'sigmoid'\]"
    ):
        dpo_loss(*DPO_CASE, beta=0.1, loss_type="kto")
    with pytest.raises(ValueError, match="needs loss_type='conservative'"):
        dpo_loss(*DPO_CASE, beta=0.1, label_smoothing=0.1)
    with pytest.raises(ValueError, match="0 < label_smoothing < 0.5"):
        dpo_loss(*DPO_CASE, beta=0.1, loss_type="conservative")
    with pytest.raises(ValueError, match="beta must be > 0"):
        dpo_loss(*DPO_CASE, beta=0.0)


def test_reward_centering_hand_examples():
    # Pairs: (1 + -1)^2 = 0 and (2 + 0)^2 = 4, mean 2 (TRL's mean((r_chosen + r_rejected)^2)).
    assert float(reward_centering(torch.tensor([[1.0, -1.0], [2.0, 0.0]]))) == pytest.approx(2.0)
    # K = 3: (1+2)^2, (1+3)^2, (2+3)^2 = 9, 16, 25, mean 50/3; the second prompt has two
    # responses, (1 - 1)^2 = 0; each prompt counts once: (50/3 + 0) / 2.
    scores = torch.tensor([[1.0, 2.0, 3.0], [1.0, -1.0, 7.0]])
    valid = torch.tensor([[1, 1, 1], [1, 1, 0]])
    assert float(reward_centering(scores, valid)) == pytest.approx(25 / 3)


def test_reward_centering_of_pairs_is_the_papers_term_and_its_gradient():
    gen = torch.Generator().manual_seed(0)
    table = torch.randn(6, 2, generator=gen).requires_grad_()
    centring = reward_centering(table, torch.ones(6, 2))
    torch.testing.assert_close(centring, ((table[:, 0] + table[:, 1]) ** 2).mean())
    centring.backward()
    expected = 2 * (table[:, 0] + table[:, 1]).detach() / 6  # d/dr of mean((c + r)^2)
    torch.testing.assert_close(table.grad, torch.stack([expected, expected], 1))


def test_rpo_loss_hand_example_is_a_token_mean_over_the_batch():
    dpo_losses = torch.tensor([0.5, 1.5])  # mean 1
    # Chosen responses of 1 and 5 tokens, each with a summed log-prob of -3: the NLL per token
    # over the batch is 6 / 6 = 1 (the mean of per-response means would be 1.8).
    chosen_logps = torch.tensor([-3.0, -3.0], requires_grad=True)
    tokens = torch.tensor([1.0, 5.0])
    loss, nll = rpo_loss(dpo_losses, chosen_logps, tokens, alpha=0.5)
    assert float(nll) == pytest.approx(1.0) and not nll.requires_grad
    assert float(loss.detach()) == pytest.approx(1.0 + 0.5 * 1.0)
    loss.backward()
    torch.testing.assert_close(chosen_logps.grad, torch.full((2,), -0.5 / 6))
    loss, _ = rpo_loss(dpo_losses, chosen_logps, tokens, alpha=0.0)
    assert float(loss.detach()) == pytest.approx(1.0)  # alpha 0: plain DPO
    with pytest.raises(ValueError, match="alpha must be >= 0"):
        rpo_loss(dpo_losses, chosen_logps, tokens, alpha=-1.0)
