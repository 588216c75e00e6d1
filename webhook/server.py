"""Run the webhook: TLS, inventory source, app and uvicorn put together.

The only place that wires concrete I/O: everything it starts is built by the
functions of the other ``webhook`` modules, which the tests drive directly.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import importlib.util
import logging
import socket
from typing import Any

import uvicorn
from kube.client import api_client
from webhook.app import AdmissionApp, build_app
from webhook.inventory_source import FileWatch, InventoryHolder, load_file
from webhook.inventory_watch import KubernetesWatch
from webhook.priority_watch import PriorityWatch
from webhook.recommendation_watch import RecommendationWatch
from webhook.metrics import Metrics
from webhook.settings import WebhookSettings
from webhook.source_limits import SourceLimiter
from webhook.tls import ReloadingTLS

# Longer than the API server's idle-connection timeout for webhook clients (Go's
# default 90 s), so the server never closes a kept-alive connection the API
# server is about to reuse (that race costs a failed admission call).
KEEP_ALIVE_SECONDS = 120


def fastest(module: str, fallback: str) -> str:
    """uvloop/httptools when installed (optional extras), asyncio/h11 otherwise."""
    return module if importlib.util.find_spec(module) is not None else fallback


def _http_protocol(settings: WebhookSettings, metrics: Metrics) -> Any:
    """httptools with a request deadline (``webhook.slow_clients``) when installed, else uvicorn's h11."""
    if fastest("httptools", "h11") == "h11":
        return "h11"
    from webhook.slow_clients import deadline_protocol

    limiter = SourceLimiter(settings.max_connections_per_source, on_refuse=metrics.refused_per_source.inc)
    return deadline_protocol(settings.request_read_seconds, on_drop=metrics.slow_clients.inc, limiter=limiter,
                             handshake_seconds=settings.tls_handshake_seconds,
                             on_handshake_unfinished=metrics.handshakes_unfinished.inc)


class HandshakeDeadlineServer(uvicorn.Server):
    """uvicorn's server, its listening socket created with a TLS handshake deadline.

    uvicorn calls ``loop.create_server`` without ``ssl_handshake_timeout``, so the
    event loop's default (60 s) applied: a TCP connection that never starts TLS
    held its socket that long, before the HTTP layer (and ``request_read_seconds``)
    ever saw it. uvicorn has no option for it, so for the duration of ``startup``
    the running loop's ``create_server`` is shadowed by one that passes the
    deadline; the loop's own method is restored right after.
    """

    def __init__(self, config: uvicorn.Config, handshake_seconds: float) -> None:
        super().__init__(config)
        self.handshake_seconds = handshake_seconds

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        loop = asyncio.get_running_loop()
        with_deadline = functools.partial(loop.create_server, ssl_handshake_timeout=self.handshake_seconds)
        setattr(loop, "create_server", with_deadline)  # an instance attribute shadows the method
        try:
            await super().startup(sockets)
        finally:
            delattr(loop, "create_server")


def build(settings: WebhookSettings, kubeconfig: str | None = None) -> tuple[uvicorn.Server, AdmissionApp]:
    """The uvicorn server and app for ``settings`` (nothing started yet)."""
    metrics = Metrics()
    tls = ReloadingTLS(settings.tls_cert, settings.tls_key, on_reload=metrics.tls_reloads.inc)
    holder = InventoryHolder()
    on_startup = None
    recommendations = None
    priorities = None
    if settings.inventory_file:
        load_file(holder, settings.inventory_file)
        on_startup = FileWatch(holder, settings.inventory_file, every=2.0).start
    else:
        # Credentials load now, so a bad kubeconfig is reported before the server starts.
        api = api_client(kubeconfig)
        watch = KubernetesWatch.from_api(holder, api, settings)
        recommendations = RecommendationWatch.from_api(api, settings)
        priorities = PriorityWatch.from_api(api, settings) if settings.scheduler_extender else None
        started: list[RecommendationWatch | PriorityWatch] = [recommendations]
        if priorities is not None:
            started.append(priorities)

        def on_startup() -> None:
            watch.start()
            for informer in started:
                informer.start()
    app = build_app(holder, settings, metrics, tls, on_startup, recommendations, priorities)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        ssl_context_factory=lambda _config, _default: tls.context,
        log_level=settings.log_level,
        access_log=settings.access_log,
        loop=fastest("uvloop", "asyncio"),
        http=_http_protocol(settings, metrics),
        timeout_keep_alive=KEEP_ALIVE_SECONDS,
        limit_concurrency=settings.max_connections,
        lifespan="on",
        server_header=False,
        date_header=False,
    )
    return HandshakeDeadlineServer(config, settings.tls_handshake_seconds), app


def serve(settings: WebhookSettings, kubeconfig: str | None = None) -> int:
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    server, _ = build(settings, kubeconfig)
    # Everything imported and built so far lives for the whole process; keep it
    # out of the cyclic GC. Otherwise a full collection walks ~70k objects (the
    # CLI imports every command group) and stalls the event loop for ~20 ms on
    # the 2-core VM: a latency spike for every request in flight.
    gc.collect()
    gc.freeze()
    server.run()
    return 0
