"""Evaluation statistics: Pass@1 with a 95% interval, unbiased Pass@k, how episodes ended."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np

ENDINGS = ("submitted", "max_turns", "context", "error")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased estimator of Chen et al. (2021): 1 - C(n-c, k) / C(n, k), n samples, c correct."""
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got n={n}, c={c}")
    if k <= 0 or k > n:
        raise ValueError(f"need 1 <= k <= n, got k={k}, n={n}")
    if n - c < k:
        return 1.0
    return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def pass_at_1_interval(per_task_successes: Mapping[str, Sequence[bool]]) -> tuple[float, float, float]:
    """Pass@1 = mean over tasks of each task's success rate over its samples, with a 95% interval
    over the tasks: the union of a Student-t interval from the spread of the per-task rates and the
    Wilson score interval of the mean over as many trials as tasks. The Wilson part keeps it honest
    where the spread says nothing (every task solved, or one task: 16 of 16 gives 0.81-1.00, not
    1.00-1.00); a rate in [0, 1] with mean p varies at most p(1 - p), so that part is never too
    narrow, and with several samples a task it is the conservative side."""
    rates = np.array([np.mean(v) for v in per_task_successes.values() if len(v)], np.float64)
    if rates.size == 0:
        return 0.0, 0.0, 0.0
    mean, n = float(rates.mean()), rates.size
    z2 = 1.96**2
    center = (mean + z2 / (2 * n)) / (1 + z2 / n)
    wilson = 1.96 * math.sqrt(mean * (1 - mean) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    lo, hi = center - wilson, center + wilson
    if n > 1:
        half = t975(n - 1) * float(rates.std(ddof=1)) / math.sqrt(n)
        lo, hi = min(lo, mean - half), max(hi, mean + half)
    return mean, max(0.0, lo), min(1.0, hi)


# Student t 0.975 quantiles by degrees of freedom (a df between two keys takes the lower key's, the
# wider interval); with a handful of tasks the normal 1.96 would understate the interval.
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
         10: 2.228, 12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042, 60: 2.000, 120: 1.980}  # fmt: skip


def t975(df: int) -> float:
    """The 0.975 quantile of Student's t with `df` degrees of freedom (conservative between keys)."""
    if df < 1:
        raise ValueError(f"need df >= 1, got {df}")
    return _T975[max(k for k in _T975 if k <= df)] if df <= 120 else 1.96


def paired_difference(before: Mapping[str, float], after: Mapping[str, float]) -> dict:
    """Pass@1 of `after` minus `before` paired over the tasks both evaluated: the mean of the
    per-task rate differences with a 95% Student-t interval from their spread (tasks are the unit)."""
    tasks = sorted(set(before) & set(after))
    diffs = np.array([after[t] - before[t] for t in tasks], np.float64)
    mean = float(diffs.mean()) if diffs.size else 0.0
    half = t975(diffs.size - 1) * float(diffs.std(ddof=1)) / math.sqrt(diffs.size) if diffs.size > 1 else 0.0
    lo, hi = mean - half, mean + half
    return {"diff": mean, "ci95": [lo, hi], "num_tasks": len(tasks), "significant": bool(lo > 0 or hi < 0)}


def fixed_task_difference(before: Mapping[str, Sequence[int]], after: Mapping[str, Sequence[int]]) -> dict:
    """Pass@1 of `after` minus `before` on exactly these tasks (episodes are the unit, the tasks
    fixed), from (successes, samples) per task over the tasks both evaluated: `diff` is the mean
    per-task rate difference; the 95% interval is Agresti-Caffo's, averaged over tasks (each rate
    smoothed by one success and one failure, centre and binomial variances from the smoothed
    rates, so a task at 0/n or n/n still counts). The two stages' episodes are treated as
    independent: sampled with the same seeds, their outcomes correlate positively and the
    interval is conservative."""
    tasks = sorted(set(before) & set(after))
    diff, centre, var, episodes = 0.0, 0.0, 0.0, 0
    for t in tasks:
        for sign, (c, n) in ((1, after[t]), (-1, before[t])):
            if n < 1:
                raise ValueError(f"task {t}: no samples")
            smoothed = (c + 1) / (n + 2)
            diff += sign * c / n
            centre += sign * smoothed
            var += smoothed * (1 - smoothed) / (n + 2)
            episodes += n
    k = max(len(tasks), 1)
    half = 1.96 * math.sqrt(var) / k
    lo, hi = centre / k - half, centre / k + half
    return {
        "diff": diff / k,
        "ci95": [lo, hi],
        "num_episodes": episodes,
        "method": "independent",
        "significant": bool(lo > 0 or hi < 0),
    }


def _wilson_cc(successes: int, n: int) -> tuple[float, float]:
    """The continuity-corrected Wilson score 95% interval of a proportion (Newcombe 1998, method 4)."""
    p, q, z2 = successes / n, 1 - successes / n, 1.96**2
    lo = hi = 0.0
    if successes > 0:
        lo = (2 * n * p + z2 - 1 - 1.96 * math.sqrt(z2 - 2 - 1 / n + 4 * p * (n * q + 1))) / (2 * (n + z2))
    if successes < n:
        hi = (2 * n * p + z2 + 1 + 1.96 * math.sqrt(z2 + 2 - 1 / n + 4 * p * (n * q - 1))) / (2 * (n + z2))
    return max(lo, 0.0), (min(hi, 1.0) if successes < n else 1.0)


def paired_outcome_difference(
    before: Mapping[str, Sequence[int | None]], after: Mapping[str, Sequence[int | None]]
) -> dict | None:
    """Pass@1 of `after` minus `before` on exactly these tasks from per-episode outcomes paired by
    sample (same task, same sampling seed: 1, 0, or None for an infra failure), pooled over the
    tasks both evaluated; None unless every such task has as many samples in both. The 95%
    interval is Newcombe's (1998, method 11) for a difference of paired proportions: continuity-
    corrected Wilson intervals of the two rates, combined with the pairs' correlation. Sampled with
    common random numbers, most episodes of two nearby policies are the same tokens, and the
    difference lives in the discordant pairs, so this is far tighter than treating the stages as
    independent; method 11 keeps coverage at 95% or above where the discordant pairs are few and
    one-sided (where method 10 falls to ~70%; tests/stages/test_eval_stats.py)."""
    tasks = sorted(set(before) & set(after))
    if not tasks or any(len(before[t]) != len(after[t]) for t in tasks):
        return None
    pairs = [
        (x, y)
        for t in tasks
        for x, y in zip(before[t], after[t], strict=True)
        if x is not None and y is not None
    ]
    n = len(pairs)
    if n == 0:
        return None
    both = sum(1 for x, y in pairs if x and y)
    after_only = sum(1 for x, y in pairs if y and not x)
    before_only = sum(1 for x, y in pairs if x and not y)
    neither = n - both - after_only - before_only
    p1, p2 = (both + after_only) / n, (both + before_only) / n
    (l1, u1), (l2, u2) = _wilson_cc(both + after_only, n), _wilson_cc(both + before_only, n)
    cross = both * neither - after_only * before_only
    cross = cross - n / 2 if cross > n / 2 else min(cross, 0)
    margins = (both + after_only) * (before_only + neither) * (both + before_only) * (after_only + neither)
    phi = cross / math.sqrt(margins) if margins else 0.0
    below = math.sqrt(max((p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2, 0.0))
    above = math.sqrt(max((u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2, 0.0))
    diff = p1 - p2
    lo, hi = max(diff - below, -1.0), min(diff + above, 1.0)
    return {
        "diff": diff,
        "ci95": [lo, hi],
        "num_episodes": 2 * n,
        "method": "paired",
        "discordant": {"after_only": after_only, "before_only": before_only},
        "significant": bool(lo > 0 or hi < 0),
    }


def summarize(
    per_task_successes: Mapping[str, Sequence[bool]],
    endings: Sequence[str],
    num_turns: Sequence[int],
    ks: Sequence[int],
    outcomes: Mapping[str, Sequence[int | None]] | None = None,
) -> dict:
    """The eval report: pass@1 (+ interval), pass@k for each k <= samples, per-task table (with
    `outcomes`, each task's per-sample outcomes in seed order: 1, 0, None for an infra failure),
    fraction of episodes by ending, mean turns."""
    p1, lo, hi = pass_at_1_interval(per_task_successes)
    n_min = min((len(v) for v in per_task_successes.values()), default=0)
    pass_k = {}
    for k in ks:
        if 1 <= k <= n_min:
            vals = [pass_at_k(len(v), int(sum(v)), k) for v in per_task_successes.values()]
            pass_k[f"pass_at_{k}"] = float(np.mean(vals))
    counts = Counter(endings)
    total = max(len(endings), 1)
    return {
        "pass_at_1": p1,
        "pass_at_1_ci95": [lo, hi],
        **pass_k,
        "num_tasks": len(per_task_successes),
        "num_episodes": len(endings),
        "ended_by": {e: counts.get(e, 0) / total for e in sorted(set(ENDINGS) | set(counts))},
        "mean_turns": float(np.mean(num_turns)) if len(num_turns) else 0.0,
        "per_task": {
            t: {"samples": len(v), "successes": int(sum(v)), "rate": float(np.mean(v)) if len(v) else 0.0}
            | ({"outcomes": list(outcomes[t])} if outcomes and t in outcomes else {})
            for t, v in sorted(per_task_successes.items())
        },
    }


def format_table(report: dict) -> str:
    """The per-task table as aligned text."""
    rows = [("task", "succ/n", "rate")]
    rows += [
        (t, f"{r['successes']}/{r['samples']}", f"{r['rate']:.2f}") for t, r in report["per_task"].items()
    ]
    width = max(len(r[0]) for r in rows)
    return "\n".join(f"{a:<{width}}  {b:>7}  {c:>5}" for a, b, c in rows)
