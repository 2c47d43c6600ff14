"""Task strength in runs: RL's filter (`rl.min_strength`) and the `task_strength` entry of the RL and
eval summaries. A task whose tests accept too many plausible wrong fixes (its stored `strength`,
measured by `jaxswe tasks validate --strength` or `tasks filter --min-strength`; envs.grading.strength) is
dropped before RL can learn the wrong fix its tests pay for."""

from __future__ import annotations

import sys
from typing import Any


def strength_summary(task_ids: list[str], strengths: dict[str, float | None]) -> dict[str, Any]:
    """The stored test strength of the tasks a run used: how many were measured, their mean and lowest
    strength, the ones below 1.0 (their tests accept a wrong fix) with their strength, how many were
    not measured."""
    measured = {t: strengths[t] for t in dict.fromkeys(task_ids) if strengths.get(t) is not None}
    values = list(measured.values())
    return {
        "measured": len(measured),
        "unmeasured": len(dict.fromkeys(task_ids)) - len(measured),
        "mean_strength": sum(values) / len(values) if values else None,
        "lowest_strength": min(values) if values else None,
        "below_1": {t: s for t, s in sorted(measured.items()) if s < 1.0},
    }


def strength_pool(
    task_ids: list[str], strengths: dict[str, float | None], min_strength: float
) -> tuple[list[str], dict[str, Any]]:
    """(the task ids kept, the summary's `task_strength`): a task is dropped when its strength is
    below `min_strength`; a task with no measured strength is kept and counted as `unmeasured`."""
    kept = [t for t in task_ids if strengths.get(t) is None or strengths[t] >= min_strength]
    counts = {
        "min_strength": min_strength,
        "kept": len(kept),
        "dropped": sorted(set(task_ids) - set(kept)),
        **strength_summary(kept, strengths),
    }
    if counts["unmeasured"]:
        print(f"jaxswe rl: rl.min_strength: {counts['unmeasured']} of the tasks kept have no measured "
              "strength (jaxswe tasks filter --min-strength stores it)", file=sys.stderr)  # fmt: skip
    return kept, counts


def strength_line(task_strength: dict[str, Any] | None) -> str:
    """The summary's `task_strength` in a few words for the stage's console line ("" when no task
    used has a measured strength)."""
    if not task_strength or not task_strength.get("measured"):
        return ""
    weak = len(task_strength["below_1"])
    return (
        f"; test strength mean {task_strength['mean_strength']:.2f}, "
        f"{weak} of {task_strength['measured']} measured tasks below 1.0"
    )
