"""Run the webhook: TLS, inventory source, app and uvicorn put together.

The only place that wires concrete I/O: everything it starts is built by the
functions of the other ``webhook`` modules, which the tests drive directly.
"""

from __future__ import annotations

import gc
import importlib.util
import logging
from typing import Any

import uvicorn
from kube.client import api_client
from webhook.app import AdmissionApp, build_app
from webhook.inventory_source import FileWatch, InventoryHolder, load_file
from webhook.inventory_watch import KubernetesWatch
from webhook.metrics import Metrics
from webhook.settings import WebhookSettings
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

    return deadline_protocol(settings.request_read_seconds, on_drop=metrics.slow_clients.inc)


def build(settings: WebhookSettings, kubeconfig: str | None = None) -> tuple[uvicorn.Server, AdmissionApp]:
    """The uvicorn server and app for ``settings`` (nothing started yet)."""
    metrics = Metrics()
    tls = ReloadingTLS(settings.tls_cert, settings.tls_key, on_reload=metrics.tls_reloads.inc)
    holder = InventoryHolder()
    on_startup = None
    if settings.inventory_file:
        load_file(holder, settings.inventory_file)
        on_startup = FileWatch(holder, settings.inventory_file, every=2.0).start
    else:
        # Credentials load now, so a bad kubeconfig is reported before the server starts.
        watch = KubernetesWatch.from_api(holder, api_client(kubeconfig), settings)
        on_startup = watch.start
    app = build_app(holder, settings, metrics, tls, on_startup)
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
    return uvicorn.Server(config), app


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
