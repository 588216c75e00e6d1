"""The FastAPI app: a few lines of wiring around ``webhook.admission``.

Routes:

* ``POST /mutate`` - pods (AdmissionReview v1) -> ``admission.review_pod``
* ``POST /validate`` - SharingPolicy objects -> ``admission.review_policy``
* ``GET /healthz`` - the process answers (liveness)
* ``GET /readyz`` - 200 only once the inventory view is synced (readiness), so a
  fresh replica gets no admission traffic before it can decide
* ``GET /metrics`` - Prometheus text format

The admission routes are plain Starlette routes taking the raw request, not
pydantic-validated FastAPI endpoints: the body is read with a size cap, decoded
once, and a malformed body must still get an AdmissionReview answer rather than
FastAPI's 422. Every answer to ``/mutate`` and ``/validate`` is HTTP 200 with an
AdmissionReview, whatever the input.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from webhook.admission import Answer, review_pod, review_policy, review_response, uid_hint
from webhook.inventory_source import InventoryHolder
from webhook.jsonio import JSONDecodeError, dumps, loads
from webhook.metrics import Metrics
from webhook.settings import WebhookSettings
from webhook.tls import ReloadingTLS

log = logging.getLogger("gpupack.webhook")
JSON = "application/json"


async def read_capped(request: Request, limit: int) -> tuple[bytes, bool]:
    """``(body, complete)``: stops reading once past ``limit`` bytes (then ``complete`` is False)."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        first = b""
        async for chunk in request.stream():
            first = chunk[:8192]
            break
        return first, False
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return b"".join(chunks)[:8192] or chunk[:8192], False
        chunks.append(chunk)
    return b"".join(chunks), True


def build_app(
    holder: InventoryHolder,
    settings: WebhookSettings,
    metrics: Metrics | None = None,
    tls: ReloadingTLS | None = None,
    on_startup: Callable[[], None] | None = None,
) -> FastAPI:
    """The ASGI app. ``tls`` enables the rotation check loop; ``on_startup`` starts
    the inventory watch (so nothing runs at import or build time)."""
    metrics = metrics if metrics is not None else Metrics()
    holder.listeners.append(lambda inv: _inventory_gauges(metrics, holder))
    _inventory_gauges(metrics, holder)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if on_startup is not None:
            on_startup()
        task = asyncio.create_task(_tls_loop(tls, settings.tls_reload_seconds)) if tls is not None else None
        try:
            yield
        finally:
            if task is not None:
                task.cancel()

    app = FastAPI(title="gpupack admission webhook", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.state.metrics = metrics
    app.state.holder = holder
    app.state.settings = settings

    async def admit(request: Request, endpoint: str, decide: Callable[[Any], Answer]) -> Response:
        started = time.perf_counter()
        body, complete = await read_capped(request, settings.max_body_bytes)
        if not complete:
            answer = Answer(
                review_response(
                    uid_hint(body),
                    False,
                    message=f"AdmissionReview larger than {settings.max_body_bytes} bytes; refused unread",
                    reason="BodyTooLarge",
                    code=413,
                ),
                "denied",
                "BodyTooLarge",
            )
        else:
            try:
                review = loads(body)
            except JSONDecodeError as exc:
                answer = Answer(
                    review_response(uid_hint(body), False, message=f"body is not valid JSON: {exc}", code=400),
                    "denied",
                    "MalformedJSON",
                )
            else:
                answer = decide(review)
        payload = dumps(answer.review)
        metrics.observe(endpoint, answer.outcome, time.perf_counter() - started)
        if answer.reason is not None:
            metrics.denials.labels(answer.reason).inc()
        if answer.decision is not None:
            metrics.decisions.labels(answer.decision.mode, "true" if answer.decision.gated else "false").inc()
        return Response(payload, media_type=JSON)

    async def mutate_route(request: Request) -> Response:
        return await admit(request, "mutate", lambda review: review_pod(review, holder.current, settings))

    async def validate_route(request: Request) -> Response:
        return await admit(request, "validate", lambda review: review_policy(review, settings))

    async def healthz(request: Request) -> Response:
        return PlainTextResponse("ok")

    async def readyz(request: Request) -> Response:
        if holder.current.synced:
            return PlainTextResponse("ready")
        return PlainTextResponse("inventory not synced yet", status_code=503)

    async def metrics_route(request: Request) -> Response:
        return Response(metrics.render(), media_type=metrics.content_type)

    app.router.add_route("/mutate", mutate_route, methods=["POST"])
    app.router.add_route("/validate", validate_route, methods=["POST"])
    app.router.add_route("/healthz", healthz, methods=["GET"])
    app.router.add_route("/readyz", readyz, methods=["GET"])
    app.router.add_route("/metrics", metrics_route, methods=["GET"])
    return app


def _inventory_gauges(metrics: Metrics, holder: InventoryHolder) -> None:
    metrics.inventory_nodes.set(len(holder.current.nodes))
    metrics.inventory_synced.set(1 if holder.current.synced else 0)


async def _tls_loop(tls: ReloadingTLS, every: float) -> None:
    while True:
        await asyncio.sleep(every)
        try:
            tls.check()
        except Exception:  # the loop must outlive any surprise
            log.exception("TLS reload check failed")
