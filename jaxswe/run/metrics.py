"""Per-iteration metrics: one JSON object per line in metrics.jsonl, mirrored to TensorBoard and
to the config's experiment trackers (jaxswe.run.loggers: W&B, MLflow).

Rows are keyed by `step` (the iteration). A resumed run calls `truncate_after(step)` so rows of
iterations whose checkpoint never committed are dropped, and TensorBoard purges them likewise.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jaxswe.distributed import is_main
from jaxswe.run.files import write_text_atomic
from jaxswe.run.layout import StageDir


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """All complete rows of a metrics JSONL file (a torn last line is ignored)."""
    path = Path(path)
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return rows


def truncate_after(path: str | Path, step: int) -> int:
    """Keep only rows with `step <= step` (and no torn line); return how many rows were dropped."""
    path = Path(path)
    rows = read_rows(path)
    kept = [r for r in rows if r.get("step", -1) <= step]
    write_text_atomic(path, "".join(json.dumps(r) + "\n" for r in kept))
    return len(rows) - len(kept)


def _scalar(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float):
        return float(value) if math.isfinite(float(value)) else None
    return None


class MetricsLogger:
    """Appends rows to `<dir>/metrics.jsonl` and sends their scalars to the trackers
    (jaxswe.run.loggers; by default TensorBoard under `<dir>/tb`).

    `start_step` is the first step this process will log; on resume, rows (and TensorBoard events)
    from that step on are removed first so nothing is duplicated. `trackers(start_step)` opens the
    trackers. Only process 0 writes (elsewhere `log` does nothing).
    """

    def __init__(
        self, directory: str | Path, *, start_step: int = 0, trackers: Callable[[int], list] | None = None
    ):
        from jaxswe.run.loggers import TensorBoardTracker

        self.directory = Path(directory)
        self.path = StageDir(self.directory).metrics
        self._trackers: list | None = None
        if not is_main():
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        if self.path.exists():
            truncate_after(self.path, start_step - 1)
        self.path.touch()
        opened = trackers(start_step) if trackers else [TensorBoardTracker(self.directory, start_step)]
        self._trackers = opened

    def log(self, step: int, row: dict[str, Any]) -> None:
        """Write one row (flushed and fsynced: it is durable once this returns)."""
        if self._trackers is None:
            return
        full = {"step": int(step), **row}
        with self.path.open("a") as f:
            f.write(json.dumps(full, default=float) + "\n")
            f.flush()
            os.fsync(f.fileno())
        scalars = {k: s for k, v in row.items() if (s := _scalar(v)) is not None}
        for tracker in self._trackers:
            tracker.log(int(step), scalars)

    def close(self) -> None:
        for tracker in self._trackers or []:
            tracker.close()
        self._trackers = None
