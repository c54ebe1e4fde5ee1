"""Token log-probs, shifting, entropy and id validation (rlhfkit.ops.logprobs)."""

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from rlhfkit.ops.logprobs import (
    check_token_ids,
    entropy_from_logits,
    shifted_logprobs,
    token_logprobs,
)


def reference_logprobs(logits, labels):
    return logits.log_softmax(-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)


def random_case(batch=3, length=5, vocab=11, seed=0, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, length, vocab, generator=gen, dtype=dtype) * 3
    labels = torch.randint(vocab, (batch, length), generator=gen)
    return logits, labels


def test_token_logprobs_hand_example():
    # softmax([0, 0, ln 2]) = [1/4, 1/4, 1/2]
    logits = torch.tensor([[[0.0, 0.0, math.log(2.0)], [0.0, 0.0, math.log(2.0)]]])
    out = token_logprobs(logits, torch.tensor([[2, 0]]))
    torch.testing.assert_close(out, torch.tensor([[math.log(0.5), math.log(0.25)]]))


@pytest.mark.parametrize("chunk_size", [1, 2, 4, 7, 15, 1024])
def test_token_logprobs_equals_log_softmax_gather_with_gradients(chunk_size):
    # chunk_size < T exercises the split along time, > T the split along rows.
    logits, labels = random_case()
    upstream = torch.randn(labels.shape, dtype=torch.float64)
    ours_in = logits.clone().requires_grad_()
    ref_in = logits.clone().requires_grad_()
    ours = token_logprobs(ours_in, labels, chunk_size=chunk_size)
    ref = reference_logprobs(ref_in, labels)
    torch.testing.assert_close(ours, ref)
    (ours * upstream).sum().backward()
    (ref * upstream).sum().backward()
    torch.testing.assert_close(ours_in.grad, ref_in.grad)


def test_token_logprobs_gradcheck():
    logits, labels = random_case(batch=2, length=3, vocab=4)
    logits.requires_grad_()
    assert torch.autograd.gradcheck(lambda x: token_logprobs(x, labels, chunk_size=2), (logits,))


def test_token_logprobs_non_contiguous_and_bf16():
    logits, labels = random_case(dtype=torch.float32)
    transposed = logits.transpose(0, 1).contiguous().transpose(0, 1)  # same values, odd strides
    torch.testing.assert_close(
        token_logprobs(transposed, labels, chunk_size=4), reference_logprobs(logits, labels)
    )
    half = token_logprobs(logits.bfloat16(), labels)
    assert half.dtype == torch.float32  # ratios need float32
    torch.testing.assert_close(half, reference_logprobs(logits.bfloat16().float(), labels))


class FullSizeAllocations(TorchDispatchMode):
    """Count aten ops that return a new tensor of at least ``numel`` elements.

    A dispatch mode (not a function mode) because it also sees the autograd engine's ops in
    backward. Views and in-place ops share their input's storage and are not counted.
    """

    def __init__(self, numel):
        super().__init__()
        self.numel, self.ops = numel, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)}
        for item in out if isinstance(out, (tuple, list)) else (out,):
            if (
                isinstance(item, torch.Tensor)
                and item.numel() >= self.numel
                and item.untyped_storage().data_ptr() not in inputs
            ):
                self.ops.append(str(func))
        return out


@pytest.mark.parametrize("fn", [token_logprobs, shifted_logprobs])
def test_logprobs_never_allocate_a_second_full_tensor(fn):
    logits, labels = random_case(batch=4, length=8, vocab=50, dtype=torch.float32)
    logits.requires_grad_()
    with FullSizeAllocations(logits.numel()) as forward:
        out = fn(logits, labels, chunk_size=8)
    with FullSizeAllocations(logits.numel()) as backward:
        out.sum().backward()
    assert forward.ops == []
    assert backward.ops == ["aten.empty_like.default"]  # the gradient buffer, nothing else
    # The probe does catch the naive version: log_softmax output, scatter, softmax backward.
    with FullSizeAllocations(logits.numel()) as naive:
        reference_logprobs(logits, labels).sum().backward()
    assert len(naive.ops) >= 3


def test_shifted_logprobs_reads_logits_at_t_for_token_t_plus_1():
    # Position t puts all its mass on token (t + 1) % 3; ids 0 1 2 0 follow that rule.
    vocab, length = 3, 4
    logits = torch.full((1, length, vocab), -30.0)
    for t in range(length):
        logits[0, t, (t + 1) % vocab] = 30.0
    ids = torch.tensor([[0, 1, 2, 0]])
    out = shifted_logprobs(logits, ids)
    assert out.shape == (1, length - 1)
    torch.testing.assert_close(out, torch.zeros(1, 3), atol=1e-20, rtol=0)
    # Unshifted alignment scores every token as near-impossible: the classic bug.
    assert (token_logprobs(logits, ids) < -50).all()


def test_shifted_logprobs_equals_sliced_reference_with_gradients():
    logits, ids = random_case(batch=2, length=6, vocab=9)
    ours_in = logits.clone().requires_grad_()
    ref_in = logits.clone().requires_grad_()
    ours = shifted_logprobs(ours_in, ids, chunk_size=3)
    ref = reference_logprobs(ref_in[:, :-1], ids[:, 1:])
    torch.testing.assert_close(ours, ref)
    ours.sum().backward()
    ref.sum().backward()
    torch.testing.assert_close(ours_in.grad, ref_in.grad)
    assert (ours_in.grad[:, -1] == 0).all()  # the last position predicts nothing scored


def test_check_token_ids_float_ids():
    with pytest.raises(ValueError, match="must be integer token ids, got dtype float32") as err:
        token_logprobs(torch.zeros(1, 2, 5), torch.tensor([[1.0, 2.0]]))
    assert "floats" in str(err.value)


def test_check_token_ids_out_of_vocab_names_id_and_vocab():
    with pytest.raises(ValueError, match=r"token id 24844 at position \(0, 1\).*size 100"):
        check_token_ids(torch.tensor([[3, 24844]]), 100)
    with pytest.raises(ValueError, match=r"input_ids contains token id -1 .*size 5"):
        shifted_logprobs(torch.zeros(1, 2, 5), torch.tensor([[1, -1]]))
    with pytest.raises(ValueError, match="-100 marks ignored positions"):
        check_token_ids(torch.tensor([-100, 2]), 5)
    check_token_ids(torch.tensor([0, 4]), 5)  # both ends of the vocabulary are fine


def test_check_token_ids_shape_mismatch_gives_both_shapes():
    with pytest.raises(
        ValueError, match=r"labels has shape \(2, 4\) but logits has shape \(2, 5, 7\)"
    ):
        token_logprobs(torch.zeros(2, 5, 7), torch.zeros(2, 4, dtype=torch.long))


def test_entropy_matches_definition_with_gradients():
    logits, _ = random_case(batch=3, length=5, vocab=7)
    ours_in = logits.clone().requires_grad_()
    ref_in = logits.clone().requires_grad_()
    ours = entropy_from_logits(ours_in, chunk_size=4)
    p = ref_in.softmax(-1)
    ref = -(p * p.log()).sum(-1)
    torch.testing.assert_close(ours, ref)
    ours.sum().backward()
    ref.sum().backward()
    torch.testing.assert_close(ours_in.grad, ref_in.grad)


def test_entropy_hand_values_and_filtered_logits():
    uniform = torch.zeros(1, 1, 4)
    torch.testing.assert_close(entropy_from_logits(uniform), torch.tensor([[math.log(4.0)]]))
    # Top-k filtering leaves -inf logits: entropy of the two survivors, finite gradients.
    filtered = torch.tensor([[[0.0, 0.0, -math.inf, -math.inf]]], requires_grad=True)
    entropy = entropy_from_logits(filtered)
    torch.testing.assert_close(entropy, torch.tensor([[math.log(2.0)]]))
    entropy.sum().backward()
    assert torch.isfinite(filtered.grad).all()


def test_default_blocks_on_cpu_hold_a_fixed_number_of_logits():
    from rlhfkit.ops.logprobs import CPU_BLOCK_ELEMENTS, _positions_per_block

    assert _positions_per_block(torch.empty(1, 1, 4096), None) == CPU_BLOCK_ELEMENTS // 4096
    assert _positions_per_block(torch.empty(1, 1, 50257), None) == CPU_BLOCK_ELEMENTS // 50257
    assert _positions_per_block(torch.empty(1, 1, 4 * CPU_BLOCK_ELEMENTS), None) == 1
    assert _positions_per_block(torch.empty(1, 1, 4096), 7) == 7
    # A vocabulary of CPU_BLOCK_ELEMENTS / 2: two positions per block, five blocks here.
    logits, labels = random_case(batch=2, length=5, vocab=CPU_BLOCK_ELEMENTS // 2, seed=3)
    logits.requires_grad_()
    ours = token_logprobs(logits, labels)
    (expected_grad,) = torch.autograd.grad(reference_logprobs(logits, labels).sum(), logits)
    torch.testing.assert_close(ours, reference_logprobs(logits, labels))
    (grad,) = torch.autograd.grad(ours.sum(), logits)
    torch.testing.assert_close(grad, expected_grad)
    expected_entropy = -(logits.softmax(-1) * logits.log_softmax(-1)).sum(-1)
    torch.testing.assert_close(entropy_from_logits(logits), expected_entropy)
