"""The PPO update's schedule: policy and critic side by side, the policy's tail on all
threads, statistics averaged over the minibatches; each micro-batch's token weight."""

import threading
import types

import torch

from rlhfkit.runtime import distributed
from rlhfkit.trainers.ppo_update import POLICY_SHARE_BESIDE_CRITIC, token_weights, update_learners


class RecordingLearner:
    """Stands in for a Learner: records where and on how many threads it learned."""

    def __init__(self, name, side_by_side=None):
        self.name, self.calls, self.side_by_side = name, [], side_by_side

    def learn(self, minibatches):
        self.calls.append((len(minibatches), threading.get_ident(), torch.get_num_threads()))
        if threading.current_thread() is not threading.main_thread():
            self.side_by_side.wait()  # both learners in their threads at once, or it breaks
        return {f"loss/{self.name}": float(len(minibatches)), "lr": 0.5 * len(minibatches)}


def test_policy_beside_the_critic_then_its_tail_on_all_threads(two_threads):
    side_by_side = threading.Barrier(2, timeout=10)
    policy = RecordingLearner("policy", side_by_side)
    critic = RecordingLearner("critic", side_by_side)
    stats = update_learners([policy, critic], list(range(16)), parallel=True)
    beside = 13  # ceil(16 * 0.8)
    assert POLICY_SHARE_BESIDE_CRITIC == 0.8
    here = threading.get_ident()
    (head, head_thread, head_threads), (tail, tail_thread, tail_threads) = policy.calls
    assert (head, tail) == (beside, 16 - beside)
    assert head_thread != here and head_threads == 1
    assert tail_thread == here and tail_threads == 2
    [(critic_count, critic_thread, critic_threads)] = critic.calls
    assert critic_count == 16 and critic_thread not in (here, head_thread) and critic_threads == 1
    # Sums over the policy's two parts, divided by the number of minibatches.
    assert stats == {"loss/policy": 1.0, "loss/critic": 1.0, "lr": 0.5}


def test_one_after_the_other_when_not_parallel_or_without_a_critic(two_threads):
    policy, critic = RecordingLearner("policy"), RecordingLearner("critic")
    update_learners([policy, critic], list(range(16)), parallel=False)
    here = threading.get_ident()
    assert policy.calls == [(16, here, 2)]
    assert critic.calls == [(16, here, 2)]
    value_head = RecordingLearner("policy")
    stats = update_learners([value_head], list(range(4)), parallel=True)
    assert value_head.calls == [(4, here, 2)]
    assert stats == {"loss/policy": 1.0, "lr": 0.5}


def _micro(lengths):
    """A stand-in micro-batch: only its response mask matters to the token weights."""
    mask = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    for row, length in enumerate(lengths):
        mask[row, :length] = 1
    return types.SimpleNamespace(response_mask=mask)


def test_token_weights_are_one_on_one_process():
    minibatches = [[_micro([3, 1]), _micro([2])], [_micro([5])]]
    weighted = token_weights(minibatches)
    assert [[w for _, w in mb] for mb in weighted] == [[1.0, 1.0], [1.0]]
    assert [[m for m, _ in mb] for mb in weighted] == minibatches


def test_token_weights_make_the_mean_over_every_processes_tokens(monkeypatch):
    # This process holds 4 and 2 response tokens in its two micro-batches; the other process
    # 12 and 2. Averaged over 2 processes, weight * own mean must give the global token mean.
    other = torch.tensor([12.0, 2.0], dtype=torch.float64)
    monkeypatch.setattr(distributed, "world_size", lambda: 2)
    monkeypatch.setattr(distributed, "sum_over_ranks", lambda counts: counts + other)
    [[(_, first)], [(_, second)]] = token_weights([[_micro([3, 1])], [_micro([2])]])
    assert first == 4 * 2 / 16 and second == 2 * 2 / 4
    # Per-token losses: this process 1.0 each (mean 1), the other 3.0 each (mean 3), and the
    # other's weight is 12 * 2 / 16. The processes' average is the mean over all 16 tokens.
    assert (first * 1.0 + (12 * 2 / 16) * 3.0) / 2 == (4 * 1.0 + 12 * 3.0) / 16
