"""The PPO update's schedule: policy and critic side by side, the policy's tail on all
threads, statistics averaged over the minibatches."""

import threading

import torch

from rlhfkit.trainers.ppo_update import POLICY_SHARE_BESIDE_CRITIC, update_learners


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
