"""A cap on the connections one source address may hold open at once.

The webhook's global cap (``max_connections``, uvicorn's ``limit_concurrency``)
bounds memory under a flood, but a single client that opens that many
connections and sends nothing makes every admission -- the API server's
included -- answer 503 until its connections time out; with ``failurePolicy:
Fail`` that stops every GPU pod in the cluster. Counting open connections per
peer address and refusing (closing at once) those beyond
``max_connections_per_source`` keeps one source from taking the whole cap, so the
API server's own connections still get through.

Refusals are logged once per change of state, not once per connection: a
source is *limited* from its first refusal until its open connections fall to
half the limit (hysteresis, so a flood that churns at the limit does not log a
line per connection); each change is one log line. Pure bookkeeping, no I/O
but the log: the protocol in ``webhook.slow_clients`` calls it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

log = logging.getLogger("gpupack.webhook.connections")


class SourceLimiter:
    """Open connections per source address, refused beyond ``limit``."""

    def __init__(self, limit: int, on_refuse: Callable[[], None] | None = None) -> None:
        if limit < 1:
            raise ValueError(f"the per-source connection limit must be at least 1, got {limit}")
        self.limit = limit
        self.on_refuse = on_refuse
        self._open: dict[str, int] = {}
        self._limited: dict[str, int] = {}  # source -> connections refused since it became limited

    def admit(self, source: str) -> bool:
        """Count a new connection from ``source``; False (and counted as refused) when it is over the limit."""
        held = self._open.get(source, 0)
        if held >= self.limit:
            refused = self._limited.get(source)
            if refused is None:
                log.warning("refusing connections from %s: it holds %d open, the per-source limit "
                            "(max_connections_per_source)", source, held)
                refused = 0
            self._limited[source] = refused + 1
            if self.on_refuse is not None:
                self.on_refuse()
            return False
        self._open[source] = held + 1
        return True

    def release(self, source: str) -> None:
        """A connection that ``admit`` accepted has closed."""
        held = self._open.get(source, 0) - 1
        if held > 0:
            self._open[source] = held
        else:
            self._open.pop(source, None)
        if source in self._limited and held <= self.limit // 2:
            refused = self._limited.pop(source)
            log.info("accepting connections from %s again (%d open; %d refused while over the limit)",
                     source, max(held, 0), refused)

    def open_connections(self, source: str) -> int:
        return self._open.get(source, 0)

    def is_limited(self, source: str) -> bool:
        return source in self._limited
