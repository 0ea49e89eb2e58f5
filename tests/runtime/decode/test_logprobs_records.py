"""runtime/decode/logprobs.py on hand-made rows: masked tokens stay out of `top`, values are the
log-softmax, counts differ per row, and sampling params refuse an out-of-range count."""

from __future__ import annotations

import math

import pytest
import torch

from runtime.decode.logprobs import LOGPROB_FLOOR, forced_logprob, masked_log_softmax, token_logprobs
from runtime.decode.sampling import SamplingParams


def test_records_are_the_masked_log_softmax_and_skip_masked_tokens():
    inf = float("-inf")
    rows = torch.tensor([[2.0, 1.0, inf, 0.0], [inf, inf, 3.0, inf]])
    logp = masked_log_softmax(rows)
    first, second = token_logprobs(logp, [1, 2], [3, 4])
    norm = math.log(math.exp(2.0) + math.exp(1.0) + math.exp(0.0))
    assert math.isclose(first.logprob, 1.0 - norm, rel_tol=1e-6)
    assert [t for t, _ in first.top] == [0, 1, 3]  # best first, the masked token 2 left out
    assert second.logprob == 0.0 and second.top == ((2, 0.0),)  # the only allowed token


def test_counts_per_row_and_a_zero_probability_choice():
    rows = torch.tensor([[0.0, 1.0, float("-inf")], [0.0, 1.0, 2.0]])
    a, b = token_logprobs(masked_log_softmax(rows), [2, 0], [0, 2])
    assert a.top == () and a.logprob == LOGPROB_FLOOR  # JSON has no -inf
    assert [t for t, _ in b.top] == [2, 1]


def test_forced_tokens_are_marked():
    assert forced_logprob(5, 3) == forced_logprob(5, 1)
    assert forced_logprob(5, 3).forced and forced_logprob(5, 0).top == ()


@pytest.mark.parametrize("count", [-1, 21])
def test_sampling_refuses_out_of_range_counts(count):
    with pytest.raises(ValueError, match="logprobs"):
        SamplingParams(logprobs=count).validate()
