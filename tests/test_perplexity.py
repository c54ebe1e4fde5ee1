"""Perplexity reward: hand-computed values, a plain per-token loop, padding, and the user's crash."""

import math

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

from rlhfkit.data import pad
from rlhfkit.experience.perplexity import PerplexityScorer, response_log_perplexity
from rlhfkit.experience.scorers import ScoreInput
from rlhfkit.ops.logprobs import log_perplexity

QUERIES = [[5, 17, 42], [9], [33, 2, 71, 8, 19]]
RESPONSES = [[11, 12, 0], [100, 3, 7, 250, 0], [64]]  # 0 is the tiny tokenizer's EOS


@pytest.fixture(scope="module")
def lm(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()


def batch(extra=0):
    """Library layout (query left-, response right-padded) plus ``extra`` pad columns each."""
    query, query_mask = pad(QUERIES, pad_id=1, side="left")  # (3, 5)
    response, response_mask = pad(RESPONSES, pad_id=1)  # (3, 5)
    fill = torch.ones(len(QUERIES), extra, dtype=torch.long)
    masked = torch.zeros_like(fill)
    return (
        torch.cat([fill, query], dim=1),
        torch.cat([masked, query_mask], dim=1),
        torch.cat([response, fill], dim=1),
        torch.cat([response_mask, masked], dim=1),
    )


def loop_log_perplexity(model, query_ids, response_ids):
    """One forward per response token on the unpadded prefix: the definition, plainly."""
    total = 0.0
    for j, token in enumerate(response_ids):
        context = torch.tensor([query_ids + response_ids[:j]])
        with torch.no_grad():
            next_logits = model(context).logits[0, -1]  # (V,)
        total += next_logits.log_softmax(-1)[token].item()
    return -total / len(response_ids)


def test_uniform_model_has_perplexity_vocab_size():
    logits = torch.zeros(2, 4, 5)  # every token has probability 1/5
    ids = torch.tensor([[1, 2, 3, 4], [0, 0, 1, 2]])
    mask = torch.tensor([[0, 0, 1, 1], [0, 1, 1, 1]])
    ppl = log_perplexity(logits, ids, mask).exp()
    torch.testing.assert_close(ppl, torch.tensor([5.0, 5.0]))


def test_hand_computed_log_perplexity():
    probs = torch.tensor([0.5, 0.25, 0.25])
    logits = probs.log().expand(1, 3, 3).clone()  # the same distribution at every position
    ids = torch.tensor([[2, 0, 1]])  # scored: 0 (p = 1/2) then 1 (p = 1/4); token 2 is context
    value = log_perplexity(logits, ids, torch.tensor([[0, 1, 1]]))
    expected = (math.log(2) + math.log(4)) / 2  # perplexity 2 ** 1.5
    assert value.item() == pytest.approx(expected, rel=1e-6)
    assert value.exp().item() == pytest.approx(2**1.5, rel=1e-6)


def test_matches_a_loop_over_tokens(lm):
    value = response_log_perplexity(lm, *batch())
    for i, (q, r) in enumerate(zip(QUERIES, RESPONSES, strict=True)):
        assert value[i].item() == pytest.approx(loop_log_perplexity(lm, q, r), abs=1e-5)


def test_padding_does_not_change_the_value(lm):
    reference = response_log_perplexity(lm, *batch())
    wider = response_log_perplexity(lm, *batch(extra=3))
    torch.testing.assert_close(wider, reference)
    # Query right-padded, response left-padded, pads holding -100: still the same numbers.
    query, query_mask = pad(QUERIES, pad_id=-100, side="right")
    response, response_mask = pad(RESPONSES, pad_id=-100, side="left")
    torch.testing.assert_close(
        response_log_perplexity(lm, query, query_mask, response, response_mask), reference
    )


def test_scorer_gives_minus_log_perplexity(lm):
    query, query_mask, response, response_mask = batch()
    inputs = ScoreInput(["q"] * 3, ["r"] * 3, query, query_mask, response, response_mask)
    expected = -response_log_perplexity(lm, query, query_mask, response, response_mask)
    torch.testing.assert_close(PerplexityScorer(lm)(inputs), expected)
    assert bool((expected < 0).all())  # log-probs of an untrained model: far from certain


# ---- the user's crash: IndexError: Target 24844 is out of bounds
def test_the_original_crash_and_our_errors(lm):
    vocab = lm.get_input_embeddings().num_embeddings  # 400
    ids = torch.tensor([[5, 17, 42, 24844]])
    logits = torch.randn(1, 4, vocab)
    # What the user's code did: unshifted cross-entropy straight on the ids.
    with pytest.raises(IndexError, match="Target 24844 is out of bounds"):
        F.cross_entropy(logits.view(-1, vocab), ids.view(-1))
    mask = torch.tensor([[0, 0, 1, 1]])
    with pytest.raises(ValueError, match=r"token id 24844 at position \(0, 3\), outside the vocab"):
        log_perplexity(logits, ids, mask)
    query, query_mask, response, response_mask = batch()
    response[1, 2] = 24844
    with pytest.raises(ValueError, match="response contains token id 24844"):
        response_log_perplexity(lm, query, query_mask, response, response_mask)


def test_float_ids_are_named(lm):
    query, query_mask, response, response_mask = batch()
    with pytest.raises(ValueError, match="query must be integer token ids, got dtype float32"):
        response_log_perplexity(lm, query.float(), query_mask, response, response_mask)
    with pytest.raises(ValueError, match="input_ids must be integer token ids"):
        log_perplexity(torch.zeros(1, 3, 8), torch.tensor([[1.0, 2.0, 3.0]]), torch.ones(1, 3))


def test_logits_and_labels_of_different_lengths():
    logits = torch.zeros(1, 4, 8)
    labels = torch.tensor([[1, 2, 3]])  # already shifted by the caller, logits were not
    with pytest.raises(ValueError, match=r"input_ids has shape \(1, 3\) but logits has shape"):
        log_perplexity(logits, labels, torch.ones(1, 3))


def test_mask_shape_and_empty_rows_are_rejected(lm):
    query, query_mask, response, response_mask = batch()
    with pytest.raises(ValueError, match="response must be \\(B, T\\) with a response_mask"):
        response_log_perplexity(lm, query, query_mask, response, response_mask[:, :-1])
    response_mask[2] = 0
    with pytest.raises(ValueError, match=r"rows \[2\] have no target token"):
        response_log_perplexity(lm, query, query_mask, response, response_mask)
    query_mask[0] = 0
    with pytest.raises(ValueError, match=r"rows \[0\] have an empty query"):
        response_log_perplexity(lm, query, query_mask, response, response_mask)
    with pytest.raises(ValueError, match="marks token 0"):
        log_perplexity(torch.zeros(1, 2, 4), torch.tensor([[1, 2]]), torch.ones(1, 2))
