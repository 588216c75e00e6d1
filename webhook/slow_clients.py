"""Drop clients that are too slow to send a request: a stalled client must not hold the webhook's sockets.

uvicorn closes idle keep-alive connections, but nothing bounds how long a client
may take to *send* a request: a connection that sends part of its headers, or
part of a 3 MB body, and then stalls stays open (over 70 s were observed), holding a
file descriptor and its buffered bytes. Enough of them exhaust the descriptors and
real admissions fail. The API server sends a whole AdmissionReview in well under a
second, so each connection gets ``read_seconds`` to begin its first request, and
every request that many seconds from its first byte to its last; a client that
misses the deadline is disconnected and counted.

The same protocol enforces the per-source connection cap (``webhook.source_limits``):
a connection from a source that already holds ``max_connections_per_source`` is
aborted as soon as it is made (no HTTP answer, never a 500), before it can count
against the global cap. It also counts connections whose TLS handshake did not
finish: the event loop aborts those after ``tls_handshake_seconds``
(``webhook.server``) without telling the protocol, whose ``connection_made`` is
then never called; a timer armed when the loop creates the protocol (at accept,
before the handshake) notices that.

Only uvicorn's httptools protocol (installed with gpupack) carries the deadline
and the per-source cap; the h11 fallback keeps uvicorn's own behaviour.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from webhook.source_limits import SourceLimiter


def deadline_protocol(read_seconds: float, on_drop: Callable[[], None] | None = None, *,
                      limiter: SourceLimiter | None = None, handshake_seconds: float | None = None,
                      on_handshake_unfinished: Callable[[], None] | None = None) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with a deadline for receiving each request and a per-source cap."""

    class DeadlineHttpToolsProtocol(HttpToolsProtocol):
        _read_deadline: asyncio.TimerHandle | None = None
        _handshake_check: asyncio.TimerHandle | None = None
        _source: str | None = None  # set while this connection counts against its source's limit
        _refused = False  # aborted by the per-source cap: uvicorn never saw it

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            if handshake_seconds is not None and on_handshake_unfinished is not None:
                # Called at accept; over TLS, connection_made follows only once the handshake is done.
                self._handshake_check = self.loop.call_later(handshake_seconds, on_handshake_unfinished)

        def connection_made(self, transport: Any) -> None:
            if self._handshake_check is not None:
                self._handshake_check.cancel()
                self._handshake_check = None
            if limiter is not None:
                peer = transport.get_extra_info("peername")
                source = str(peer[0]) if isinstance(peer, tuple) and peer else None
                if source is not None and not limiter.admit(source):
                    # Refused before uvicorn counts it against max_connections; abort at once
                    # (close() would wait for the peer's TLS close_notify).
                    self._refused = True
                    transport.abort()
                    return
                self._source = source
            super().connection_made(transport)
            self._arm()  # the first request must begin (and end) in time too

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._arm()

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._disarm()  # between requests, uvicorn's keep-alive timeout applies

        def connection_lost(self, exc: Exception | None) -> None:
            if self._refused:
                return  # uvicorn's connection_made never ran: nothing of its to undo
            self._disarm()
            if self._source is not None and limiter is not None:
                limiter.release(self._source)
                self._source = None
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
