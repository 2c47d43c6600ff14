"""Progress of a long loop on stderr: a tqdm bar on a terminal; elsewhere (a log file, a pipe) a
plain line every tenth of the total or every `every_s` seconds, whichever comes first, and at
the end, e.g. `jaxswe sft 40/200 steps, loss 1.23, 3.1 s/step` (a bar there is one endless line)."""

from __future__ import annotations

import sys
import time
from typing import Any

from tqdm import tqdm


class Progress:
    """`update(n, **stats)` after each unit of work; `write(line)` prints a line above the bar."""

    def __init__(
        self,
        name: str,
        total: int,
        *,
        unit: str,
        initial: int = 0,
        enabled: bool = True,
        lines: bool = True,
        every_s: float = 30.0,
    ):
        self.name, self.total, self.unit, self.every_s = name, total, unit, every_s
        self.done = self._start = self._last_done = initial
        self._t0 = self._last_t = time.monotonic()
        self.enabled = enabled
        self.lines = lines and enabled and not sys.stderr.isatty()
        self.bar = None
        if enabled and sys.stderr.isatty():
            self.bar = tqdm(total=total, initial=initial, desc=name, unit=unit, file=sys.stderr)

    def update(self, n: int = 1, **stats: Any) -> None:
        self.done += n
        if self.bar is not None:
            self.bar.set_postfix(stats, refresh=False)
            self.bar.update(n)
        elif self.lines:
            now = time.monotonic()
            tenth = max(1, -(-self.total // 10))  # at most ~10 lines however small the total
            if (
                self.done >= self.total
                or self.done // tenth > self._last_done // tenth
                or now - self._last_t >= self.every_s
            ):
                self.write(self.line(now, stats))
                self._last_t, self._last_done = now, self.done

    def line(self, now: float, stats: dict[str, Any]) -> str:
        """`jaxswe NAME done/total UNITs, key value, ..., seconds per unit`."""
        per = (now - self._t0) / max(self.done - self._start, 1)
        extra = "".join(f", {k} {v:.3g}" if isinstance(v, float) else f", {k} {v}" for k, v in stats.items())
        return f"jaxswe {self.name} {self.done}/{self.total} {self.unit}s{extra}, {per:.3g} s/{self.unit}"

    def write(self, line: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(line, file=sys.stderr)
        else:
            print(line, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
