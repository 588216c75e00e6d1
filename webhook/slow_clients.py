"""Drop clients that are too slow to send a request: a stalled client must not hold the webhook's sockets.

uvicorn closes idle keep-alive connections, but nothing bounds how long a client
may take to *send* a request: a connection that sends part of its headers, or
part of a 3 MB body, and then stalls stays open (over 70 s were observed), holding a
file descriptor and its buffered bytes. Enough of them exhaust the descriptors and
real admissions fail. The API server sends a whole AdmissionReview in well under a
second, so each connection gets ``read_seconds`` to begin its first request, and
every request that many seconds from its first byte to its last; a client that
misses the deadline is disconnected and counted.

Only uvicorn's httptools protocol (installed with gpupack) carries the deadline;
the h11 fallback keeps uvicorn's own behaviour.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


def deadline_protocol(read_seconds: float, on_drop: Callable[[], None] | None = None) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with a deadline for receiving each request."""

    class DeadlineHttpToolsProtocol(HttpToolsProtocol):
        _read_deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm()  # the first request must begin (and end) in time too

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._arm()

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._disarm()  # between requests, uvicorn's keep-alive timeout applies

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._disarm()
            self._read_deadline = self.loop.call_later(read_seconds, self._too_slow)

        def _disarm(self) -> None:
            if self._read_deadline is not None:
                self._read_deadline.cancel()
                self._read_deadline = None

        def _too_slow(self) -> None:
            self._read_deadline = None
            if not self.transport.is_closing():
                if on_drop is not None:
                    on_drop()
                self.transport.close()

    return DeadlineHttpToolsProtocol
