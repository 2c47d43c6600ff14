"""RL's task-strength filter (`rl.min_strength`): a task whose tests accept too many plausible
wrong fixes (its stored `strength`, measured by `jaxswe tasks validate --strength` or `tasks filter
--min-strength`; envs.strength) is dropped before RL can learn the wrong fix its tests pay for."""

from __future__ import annotations

import sys
from typing import Any


def strength_pool(
    task_ids: list[str], strengths: dict[str, float | None], min_strength: float
) -> tuple[list[str], dict[str, Any]]:
    """(the task ids kept, counts for the summary): a task is dropped when its strength is below
    `min_strength`; a task with no measured strength is kept and counted as `unmeasured`."""
    kept = [t for t in task_ids if strengths.get(t) is None or strengths[t] >= min_strength]
    measured = [strengths[t] for t in kept if strengths.get(t) is not None]
    counts = {
        "min_strength": min_strength,
        "kept": len(kept),
        "dropped": len(task_ids) - len(kept),
        "unmeasured": len(kept) - len(measured),
        "mean_strength": sum(measured) / len(measured) if measured else None,
    }
    if counts["unmeasured"]:
        print(f"jaxswe rl: rl.min_strength: {counts['unmeasured']} of the tasks kept have no measured "
              "strength (jaxswe tasks filter --min-strength stores it)", file=sys.stderr)  # fmt: skip
    return kept, counts
