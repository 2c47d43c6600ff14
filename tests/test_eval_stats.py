import math
from itertools import combinations

import numpy as np
import pytest

from jaxswe.stages.eval_stats import format_table, pass_at_1_interval, pass_at_k, summarize


def _brute_pass_at_k(n, c, k):
    outcomes = [1] * c + [0] * (n - c)
    subsets = list(combinations(range(n), k))
    return sum(any(outcomes[i] for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n,c,k", [(5, 0, 1), (5, 2, 1), (5, 2, 3), (6, 1, 5), (4, 4, 2), (7, 3, 4)])
def test_pass_at_k_matches_enumeration(n, c, k):
    assert pass_at_k(n, c, k) == pytest.approx(_brute_pass_at_k(n, c, k), abs=1e-12)
    assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k))


def test_pass_at_k_bad_input():
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 4)


def test_pass_at_1_interval():
    """The union of the t interval from the per-task spread and the Wilson interval over tasks:
    never a zero-width interval from a handful of episodes."""
    per_task = {"a": [True, True], "b": [False, False], "c": [True, False], "d": [True, True]}
    mean, lo, hi = pass_at_1_interval(per_task)
    rates = np.array([1, 0, 0.5, 1.0])
    assert mean == pytest.approx(rates.mean())
    half = 3.182 * rates.std(ddof=1) / 2  # Student t, 3 degrees of freedom: wider than Wilson here
    assert (lo, hi) == pytest.approx((max(0, rates.mean() - half), min(1, rates.mean() + half)))
    # every one of 16 tasks solved: Wilson's 16 / (16 + 1.96^2) below, not 1.0
    mean, lo, hi = pass_at_1_interval({str(i): [True] for i in range(16)})
    assert mean == hi == 1.0 and lo == pytest.approx(16 / (16 + 1.96**2))
    mean, lo, hi = pass_at_1_interval({"only": [False, False]})  # one task: Wilson alone
    assert mean == lo == 0.0 and hi == pytest.approx(1.96**2 / (1 + 1.96**2))


def test_summarize_report():
    per_task = {"a": [True, False, False], "b": [False, False, False]}
    rep = summarize(per_task, ["submitted"] * 4 + ["max_turns", "error"], [2, 3, 4, 5, 6, 7], [1, 2, 5])
    assert rep["pass_at_1"] == pytest.approx(1 / 6)
    assert rep["pass_at_2"] == pytest.approx((1 - 1 / 3) / 2)
    assert "pass_at_5" not in rep  # more than the samples taken
    assert rep["ended_by"]["submitted"] == pytest.approx(4 / 6)
    assert rep["ended_by"]["context"] == 0
    assert rep["mean_turns"] == pytest.approx(4.5)
    assert rep["per_task"]["a"] == {"samples": 3, "successes": 1, "rate": pytest.approx(1 / 3)}
    assert "1/3" in format_table(rep)
