import math
from itertools import combinations

import numpy as np
import pytest

from jaxswe.stages.eval_stats import (
    fixed_task_difference,
    format_table,
    paired_outcome_difference,
    pass_at_1_interval,
    pass_at_k,
    summarize,
)


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
    rep = summarize(per_task, ["submitted"] * 6, [1] * 6, [1], outcomes={"a": [1, 0, None, 0]})
    assert rep["per_task"]["a"]["outcomes"] == [1, 0, None, 0] and "outcomes" not in rep["per_task"]["b"]


def _pairs(n, cells, rng):
    """n (before, after) outcome pairs drawn with probabilities cells = (both, after only, before only)."""
    both, after_only, before_only = cells
    counts = rng.multinomial(n, [both, after_only, before_only, 1 - both - after_only - before_only])
    kinds = [(1, 1), (0, 1), (1, 0), (0, 0)]
    pairs = [kind for kind, c in zip(kinds, counts, strict=True) for _ in range(c)]
    return {"t": [b for b, _ in pairs]}, {"t": [a for _, a in pairs]}


@pytest.mark.parametrize(
    "n,cells",
    [(64, (0.5, 0.03, 0.03)), (64, (0.5, 0.02, 0.0)), (128, (0.5, 0.06, 0.02)), (128, (0.9, 0.03, 0.0)),
     (256, (0.5, 0.02, 0.0)), (64, (0.05, 0.02, 0.02))],
)  # fmt: skip
def test_paired_interval_covers_the_true_difference_where_discordant_pairs_are_few(n, cells):
    """Two stages sampled with the same seeds mostly agree; the difference is in the few discordant
    pairs, often one-sided. Newcombe's method 11 keeps 95% coverage there (method 10, without the
    continuity correction, covers ~70% at n=64 with discordant pairs 2% / 0%), and under no
    difference it calls a gain significant at most ~2.5% of the time."""
    rng = np.random.default_rng(n)
    true = cells[1] - cells[2]
    reps = 1500
    covered = gains = 0
    for _ in range(reps):
        out = paired_outcome_difference(*_pairs(n, cells, rng))
        lo, hi = out["ci95"]
        covered += lo <= true <= hi
        gains += lo > 0
    assert covered / reps >= 0.93
    if true == 0:
        assert gains / reps <= 0.03


def test_paired_interval_is_tighter_than_independent_and_pairs_by_seed():
    before = {"a": [1] * 20 + [0] * 12, "b": [1] * 8 + [0] * 24}
    after = {"a": [1] * 20 + [1] * 5 + [0] * 7, "b": [1] * 8 + [1] * 4 + [0] * 20}  # 9 pairs gain, none lose
    out = paired_outcome_difference(before, after)
    assert out["method"] == "paired" and out["discordant"] == {"after_only": 9, "before_only": 0}
    assert out["diff"] == pytest.approx(9 / 64) and out["num_episodes"] == 128 and out["significant"]
    counts = lambda o: {t: (sum(v), len(v)) for t, v in o.items()}  # noqa: E731
    independent = fixed_task_difference(counts(before), counts(after))
    assert independent["diff"] == pytest.approx(out["diff"]) and not independent["significant"]
    assert out["ci95"][1] - out["ci95"][0] < 0.7 * (independent["ci95"][1] - independent["ci95"][0])
    # an infra failure on either side drops its pair; no change at all is no gain
    before["a"][0], after["b"][-1] = None, None
    assert paired_outcome_difference(before, after)["num_episodes"] == 124
    same = paired_outcome_difference(before, before)
    assert same["diff"] == 0 and same["ci95"][0] < 0 < same["ci95"][1] and not same["significant"]
    # samples that do not pair (another sample count) fall back to the caller's independent interval
    assert paired_outcome_difference({"a": [1, 0]}, {"a": [1, 0, 1]}) is None
