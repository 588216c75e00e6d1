"""The replay's progress bar on stderr: one line redrawn in place on a terminal, a line per step otherwise.

``gpupack demo`` prints a line per interval (``gpupack.demo``); a replay runs
for minutes to hours with one number that matters (pods done of pods to
submit), so it draws a bar. When stderr is not a terminal (CI logs, a pipe)
the bar is printed as a plain line every ``log_every`` percent instead, so a
log keeps a readable trace without a thousand carriage returns.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TextIO

WIDTH = 30


def _clock() -> float:
    return time.monotonic()


def format_duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def bar_line(done: int, total: int, bound: int, unplaceable: int, elapsed_s: float, alloc_percent: float) -> str:
    """``[#####.....]  120/1350 pods  bound 100  never placed 20  alloc 41.2%  2m10s, ETA 21m30s``."""
    share = done / total if total else 1.0
    filled = int(round(WIDTH * share))
    eta = elapsed_s / done * (total - done) if done else None
    when = format_duration(elapsed_s) + (f", ETA {format_duration(eta)}" if eta is not None and done < total else "")
    width = len(str(total))
    return (f"[{'#' * filled}{'.' * (WIDTH - filled)}] {done:>{width}}/{total} pods  bound {bound}  "
            f"never placed {unplaceable}  alloc {alloc_percent:.1f}%  {when}")


@dataclass
class ProgressBar:
    total: int
    stream: TextIO = field(default_factory=lambda: sys.stderr)
    log_every: float = 5.0
    """Percent between lines when the stream is not a terminal."""
    clock: Callable[[], float] = _clock
    started: float = 0.0
    _last_logged: float = -1.0
    _drawn: bool = False

    def __post_init__(self) -> None:
        self.started = self.clock()

    @property
    def interactive(self) -> bool:
        isatty = getattr(self.stream, "isatty", None)
        return bool(isatty and isatty())

    def update(self, done: int, bound: int, unplaceable: int, alloc_percent: float) -> None:
        line = bar_line(done, self.total, bound, unplaceable, self.clock() - self.started, alloc_percent)
        if self.interactive:
            self.stream.write("\r" + line)
            self._drawn = True
        else:
            percent = 100.0 * done / self.total if self.total else 100.0
            if percent - self._last_logged < self.log_every and done < self.total:
                return
            self._last_logged = percent
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False
