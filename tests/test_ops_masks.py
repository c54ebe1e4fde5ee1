"""Masked reductions and padding helpers (rlhfkit.ops.masks)."""

import math
import threading

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhfkit.ops.masks import (
    additive_mask,
    last_token_index,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
    position_ids_from_mask,
    truncate_after_eos,
)

X = torch.tensor([[1.0, 2.0, 3.0, 100.0], [4.0, 5.0, -7.0, -8.0]])
MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])


def test_masked_sum_and_mean_hand_example():
    torch.testing.assert_close(masked_sum(X, MASK), torch.tensor(15.0))
    torch.testing.assert_close(masked_sum(X, MASK, dim=-1), torch.tensor([6.0, 9.0]))
    torch.testing.assert_close(masked_mean(X, MASK), torch.tensor(3.0))  # 15 / 5 tokens
    torch.testing.assert_close(masked_mean(X, MASK.bool(), dim=-1), torch.tensor([2.0, 4.5]))


def test_masked_mean_of_empty_row_is_zero_not_nan():
    mask = torch.tensor([[1, 1, 0, 0], [0, 0, 0, 0]])
    torch.testing.assert_close(masked_mean(X, mask, dim=-1), torch.tensor([1.5, 0.0]))
    torch.testing.assert_close(masked_mean(X, torch.zeros_like(mask)), torch.tensor(0.0))


def test_mask_shape_mismatch_names_both_shapes():
    with pytest.raises(ValueError, match=r"mask shape \(2, 3\) does not match x shape \(2, 4\)"):
        masked_mean(X, MASK[:, :3])


def test_masked_var_hand_example_and_bessel():
    # real values 1 2 3 4 5: mean 3, squared deviations sum 10
    torch.testing.assert_close(masked_var(X, MASK), torch.tensor(10.0 / 4))
    torch.testing.assert_close(masked_var(X, MASK, unbiased=False), torch.tensor(10.0 / 5))
    torch.testing.assert_close(masked_var(X, MASK), torch.tensor([1.0, 2, 3, 4, 5]).var())


def test_masked_var_needs_enough_real_elements():
    one = torch.tensor([[1, 0, 0, 0], [0, 0, 0, 0]])
    with pytest.raises(ValueError, match="at least 2 real positions.*got 1"):
        masked_var(X, one)
    torch.testing.assert_close(masked_var(X, one, unbiased=False), torch.tensor(0.0))
    with pytest.raises(ValueError, match="at least 1 real positions.*got 0"):
        masked_var(X, torch.zeros_like(one), unbiased=False)


def test_masked_whiten():
    white = masked_whiten(X, MASK)
    real = MASK.bool()
    torch.testing.assert_close(white[real].mean(), torch.tensor(0.0), atol=1e-6, rtol=0)
    torch.testing.assert_close(white[real].std(), torch.tensor(1.0))
    assert (white[~real] == 0).all()
    kept = masked_whiten(X, MASK, shift_mean=False)
    torch.testing.assert_close(kept[real].mean(), torch.tensor(3.0))
    torch.testing.assert_close(kept[real], white[real] + 3.0)


class PairSum:
    """An all-reduce (sum) between two threads, as two data-parallel processes would do it."""

    def __init__(self):
        self.barrier, self.slots = threading.Barrier(2, timeout=10), [None, None]

    def reduce_for(self, index):
        def reduce(tensor):
            self.slots[index] = tensor
            self.barrier.wait()
            total = self.slots[0] + self.slots[1]
            self.barrier.wait()  # both have read before either writes again
            return total

        return reduce


def test_masked_whiten_over_two_processes_is_the_whole_batchs():
    halves = [(X[:1], MASK[:1]), (X[1:], MASK[1:])]
    pair, results = PairSum(), [None, None]

    def whiten(index):
        x, mask = halves[index]
        results[index] = masked_whiten(x, mask, reduce=pair.reduce_for(index))

    threads = [threading.Thread(target=whiten, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    torch.testing.assert_close(torch.cat(results), masked_whiten(X, MASK))


@st.composite
def masked_batches(draw):
    """(x, mask, fill): x (B, T) with at least two real entries, fill for padded slots."""
    batch, length = draw(st.integers(1, 4)), draw(st.integers(2, 6))
    size = batch * length
    values = st.floats(-1e3, 1e3, allow_nan=False)
    x = torch.tensor(draw(st.lists(values, min_size=size, max_size=size)), dtype=torch.float64)
    mask = draw(st.lists(st.booleans(), min_size=size, max_size=size))
    mask[0] = mask[-1] = True
    junk = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.just(math.nan))
    fill = torch.tensor(draw(st.lists(junk, min_size=size, max_size=size)), dtype=torch.float64)
    shape = (batch, length)
    return x.view(shape), torch.tensor(mask).view(shape).long(), fill.view(shape)


@settings(max_examples=60, deadline=None)
@given(masked_batches())
def test_padded_values_never_matter(case):
    x, mask, fill = case
    junked = torch.where(mask.bool(), x, fill)
    real = mask.bool()
    for fn in (masked_sum, masked_mean):
        torch.testing.assert_close(fn(junked, mask), fn(x, mask))
        torch.testing.assert_close(fn(junked, mask, dim=-1), fn(x, mask, dim=-1))
    torch.testing.assert_close(masked_var(junked, mask), masked_var(x, mask))
    torch.testing.assert_close(masked_var(x, mask), x[real].var())
    for shift in (True, False):
        torch.testing.assert_close(
            masked_whiten(junked, mask, shift_mean=shift), masked_whiten(x, mask, shift_mean=shift)
        )


def test_last_token_index_right_left_and_empty():
    mask = torch.tensor(
        [[1, 1, 1, 0, 0], [0, 0, 1, 1, 1], [0, 0, 0, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1]]
    )
    expected = torch.tensor([2, 4, 0, 0, 4])
    torch.testing.assert_close(last_token_index(mask), expected)
    torch.testing.assert_close(last_token_index(mask.bool()), expected)
    assert last_token_index(mask).dtype == torch.long


def test_last_token_index_equals_loop():
    mask = torch.randint(2, (20, 7), generator=torch.Generator().manual_seed(0))
    expected = [max((t for t in range(7) if row[t]), default=0) for row in mask.tolist()]
    assert last_token_index(mask).tolist() == expected


EOS, PAD = 9, 0


def test_truncate_after_eos_hand_example():
    tokens = torch.tensor(
        [
            [5, 6, EOS, 7, EOS],  # first EOS kept, everything after becomes pad
            [5, 6, 7, 8, 4],  # no EOS: untouched, all real
            [5, EOS, PAD, PAD, PAD],  # already padded
            [EOS, 3, 3, 3, 3],
            [5, 6, 7, PAD, PAD],  # no EOS, pads stay masked
        ]
    )
    out, mask = truncate_after_eos(tokens, EOS, PAD)
    expected_tokens = torch.tensor(
        [
            [5, 6, EOS, PAD, PAD],
            [5, 6, 7, 8, 4],
            [5, EOS, PAD, PAD, PAD],
            [EOS, PAD, PAD, PAD, PAD],
            [5, 6, 7, PAD, PAD],
        ]
    )
    expected_mask = torch.tensor(
        [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 0, 0]]
    )
    torch.testing.assert_close(out, expected_tokens)
    torch.testing.assert_close(mask, expected_mask)
    assert mask.dtype == torch.long


def test_truncate_after_eos_equals_loop():
    tokens = torch.randint(0, 12, (30, 8), generator=torch.Generator().manual_seed(1))
    out, mask = truncate_after_eos(tokens, EOS, PAD)
    for row, got, got_mask in zip(tokens.tolist(), out.tolist(), mask.tolist(), strict=True):
        end = row.index(EOS) + 1 if EOS in row else len(row)
        kept = row[:end] + [PAD] * (len(row) - end)
        assert got == kept
        assert got_mask == [int(t < end and tok != PAD) for t, tok in enumerate(row)]


def test_truncate_after_eos_rejects_eos_equal_pad():
    with pytest.raises(ValueError, match="must differ"):
        truncate_after_eos(torch.zeros(1, 3, dtype=torch.long), 0, 0)


def test_position_ids_from_mask():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0]])
    expected = torch.tensor([[0, 0, 0, 1, 2], [0, 1, 2, 2, 2]])
    torch.testing.assert_close(position_ids_from_mask(mask), expected)
    torch.testing.assert_close(position_ids_from_mask(mask.bool()), expected)


def test_additive_mask_by_hand():
    visible = torch.tensor([[True, False], [True, True]])
    low = torch.finfo(torch.float32).min
    assert additive_mask(visible).tolist() == [[0.0, low], [0.0, 0.0]]
