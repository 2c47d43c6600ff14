"""Which problems an RL iteration gets: a seeded epoch order over the pool, success history, and
stage 2's filter (drop tasks solved in >= 2/3 of past attempts and tasks never solved)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np

from jaxswe.errors import UserError
from jaxswe.run.files import read_json
from jaxswe.run.layout import StageDir

History = dict[str, list[int]]  # task id -> outcome (1 resolved, 0 not) of every scored attempt


@dataclass(frozen=True)
class DataOrder:
    """Position in the seeded stream of problems: epoch number and offset inside that epoch."""

    epoch: int = 0
    cursor: int = 0

    def to_json(self) -> dict[str, int]:
        return {"epoch": self.epoch, "cursor": self.cursor}

    @classmethod
    def from_json(cls, obj: Mapping[str, int]) -> DataOrder:
        return cls(epoch=int(obj["epoch"]), cursor=int(obj["cursor"]))


def epoch_permutation(task_ids: Sequence[str], seed: int, epoch: int) -> list[str]:
    """The pool in the order of `epoch` (a fresh seeded shuffle each epoch)."""
    rng = np.random.default_rng([seed, epoch])
    return [task_ids[i] for i in rng.permutation(len(task_ids))]


def next_problems(
    task_ids: Sequence[str], count: int, order: DataOrder, seed: int
) -> tuple[list[str], DataOrder]:
    """The next `count` distinct problems of the stream and the advanced order.

    An iteration never repeats a task; when the pool is smaller than `count`, it gets every task.
    """
    if not task_ids:
        raise ValueError("the task pool is empty")
    count = min(count, len(task_ids))
    picked: list[str] = []
    epoch, cursor = order.epoch, order.cursor
    while len(picked) < count:
        perm = epoch_permutation(task_ids, seed, epoch)
        while cursor < len(perm) and len(picked) < count:
            if perm[cursor] not in picked:
                picked.append(perm[cursor])
            cursor += 1
        if cursor >= len(perm):
            epoch, cursor = epoch + 1, 0
    return picked, DataOrder(epoch, cursor)


def record_outcomes(
    history: History, outcomes: Mapping[str, Sequence[bool]] | Iterable[tuple[str, Sequence[bool]]]
) -> History:
    """A new history with each task's scored outcomes appended. `outcomes` is a mapping or a list
    of (task, results) pairs: a task drawn twice in one iteration (a resample round) is two pairs,
    and both groups' outcomes are kept."""
    pairs = outcomes.items() if isinstance(outcomes, Mapping) else outcomes
    new = {k: list(v) for k, v in history.items()}
    for task, results in pairs:
        new.setdefault(task, []).extend(int(bool(r)) for r in results)
    return new


def as_fraction(value: float | str) -> Fraction:
    """A threshold as an exact fraction: "2/3", or a number read as the nearest fraction with a
    denominator <= 100 (2/3 and 0.6667 are both exactly 2/3, so a task solved 2 of 3 times is
    dropped either way)."""
    try:
        return Fraction(str(value)).limit_denominator(100)
    except (ValueError, ZeroDivisionError):
        raise ValueError(f"not a fraction: {value!r}") from None


def merge_histories(*histories: Mapping[str, Sequence[int]]) -> History:
    """Concatenate several histories (e.g. all stage-1 runs)."""
    out: History = {}
    for h in histories:
        for task, results in h.items():
            out.setdefault(task, []).extend(int(r) for r in results)
    return out


def filter_by_history(
    task_ids: Sequence[str],
    history: Mapping[str, Sequence[int]],
    *,
    drop_solved_fraction: float | str = "2/3",
    drop_never_solved: bool = True,
) -> tuple[list[str], dict[str, int]]:
    """Keep tasks that are neither mostly solved (solved fraction >= `drop_solved_fraction`,
    compared exactly, see `as_fraction`) nor (if asked) never solved in past attempts.

    Tasks without any past attempt are kept (nothing is known about them). Returns the kept ids
    and counts of what was dropped and why.
    """
    threshold = as_fraction(drop_solved_fraction)
    kept, too_easy, never = [], 0, 0
    for task in task_ids:
        results = history.get(task, [])
        if results:
            rate = Fraction(sum(results), len(results))
            if rate >= threshold:
                too_easy += 1
                continue
            if drop_never_solved and rate == 0:
                never += 1
                continue
        kept.append(task)
    return kept, {"kept": len(kept), "dropped_solved": too_easy, "dropped_never_solved": never}


def load_history(path: str | Path) -> History:
    """The success history saved by an RL run (its dir, stage dir, or history.json)."""
    path = Path(path)
    for candidate in (path, StageDir(path).history, StageDir(path / "rl").history):
        if candidate.is_file():
            return {k: [int(x) for x in v] for k, v in read_json(candidate).items()}
    raise UserError(f"{path}: no success history (history.json) found; is it an RL run dir?")
