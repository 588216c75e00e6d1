"""Back-off for loops that retry a failing dependency (the API server, NVML), and quiet logs.

Every long-running loop of gpupack (the node agent's tick, the controller's
cycle, the webhook's watches) retries when what it depends on is down. Without
a pause a loop spins (an agent once made 160 attempts a second, each logging a
traceback, while the API server was down); with a fixed pause every agent of a
fleet retries in lockstep. :class:`Backoff` doubles the pause after each
consecutive failure up to a ceiling, scales it by a random factor in [0.5, 1]
so a fleet spreads out, and says whether a failure is *news* (the first, or a
different problem than the last), so a loop logs once per change of state
rather than once per attempt.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass
class Backoff:
    base_s: float
    """The pause after the first failure (before jitter)."""
    max_s: float
    """The ceiling: an outage is noticed to have ended within about this long."""
    rng: random.Random = field(default_factory=random.Random)
    failures: int = 0
    """Consecutive failures so far (0: the last attempt succeeded)."""
    problem: str | None = None
    """What the last failure was; None while things work."""

    def failed(self, problem: str) -> tuple[float, bool]:
        """Record a failure: the pause before the next attempt, and whether ``problem`` is news."""
        news = problem != self.problem
        self.failures += 1
        self.problem = problem
        ceiling = min(self.max_s, self.base_s * 2 ** min(self.failures - 1, 30))
        return ceiling * (0.5 + 0.5 * self.rng.random()), news

    def succeeded(self) -> int:
        """Record a success; returns how many failures it ends (0: none, nothing to report)."""
        ended, self.failures, self.problem = self.failures, 0, None
        return ended
