"""The FastAPI app: a few lines of wiring around ``webhook.admission``.

Routes:

* ``POST /mutate`` - pods (AdmissionReview v1) -> ``admission.review_pod``
* ``POST /validate`` - SharingPolicy objects, ResourceClaims and ResourceClaimTemplates ->
  ``admission.review_validation`` (claims are checked against the inventory's DRA pool)
* ``POST /authorize`` - SubjectAccessReview v1 (kube-apiserver's authorization webhook,
  ``manifests/hardened``) -> ``authorization.review_access``: a node agent's pod reads
* ``POST /scheduler/prioritize`` - kube-scheduler's prioritize extender (ExtenderArgs ->
  HostPriorityList, ``sharing.admission.priority_extender``): prefer the nodes holding no GPU pod
  of lower priority than the pod, from the pod watch ``webhook.priority_watch``; served only when that
  watch is given. 200 with the scores, 400 with ``{"error": ...}`` for a body that is not an
  ExtenderArgs, 413 over ``max_body_bytes``, 503 until the pod watch has synced
* ``GET /healthz`` - the process answers (liveness)
* ``GET /readyz`` - 200 only once the inventory view is synced (readiness), so a
  fresh replica gets no admission traffic before it can decide
* ``GET /metrics`` - Prometheus text format

The admission routes are answered on raw ASGI messages (see
:class:`AdmissionApp`), not by pydantic-validated FastAPI endpoints: the body is
read with a size cap, decoded once, and a malformed body must still get an
AdmissionReview answer rather than FastAPI's 422. Every answer to ``/mutate``
and ``/validate`` is HTTP 200 with an AdmissionReview, and to ``/authorize`` HTTP 200
with a SubjectAccessReview, whatever the input; ``/scheduler/prioritize`` chooses its status
(a handler may answer ``(status, body)``), since kube-scheduler reads any non-200 as an error.
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
from starlette.types import Receive, Scope, Send

from sharing.admission.priority_extender import host_priorities, parse_extender_args, score_nodes
from sharing.api.keys import PRIORITIZE_VERB, SCHEDULER_EXTENDER_PREFIX
from webhook.admission import Answer, review_pod, review_response, review_validation, uid_hint
from webhook.authorization import review_access
from webhook.inventory_source import InventoryHolder
from webhook.recommendation_watch import RecommendationWatch
from webhook.jsonio import JSONDecodeError, dumps, loads
from webhook.metrics import Metrics
from webhook.priority_watch import PriorityWatch
from webhook.settings import WebhookSettings
from webhook.tls import ReloadingTLS

log = logging.getLogger("gpupack.webhook")
JSON = "application/json"
PRIORITIZE_PATH = f"{SCHEDULER_EXTENDER_PREFIX}/{PRIORITIZE_VERB}"
"""The route the shipped kube-scheduler configuration's extender calls (``urlPrefix`` + ``prioritizeVerb``)."""

Reply = bytes | tuple[int, bytes]
"""A handler's answer: a JSON body sent with HTTP 200, or an HTTP status and a JSON body."""


class AdmissionApp:
    """The ASGI app: ``POST /mutate`` and ``POST /validate`` answered directly on
    ASGI messages, everything else (health, readiness, metrics, lifespan, 404/405)
    by FastAPI.

    The admission routes skip Starlette's request/response objects and exception
    middleware, which cost about 40 us a call, a tenth of a whole TLS round trip
    on loopback (benchmarks/webhook.md); they need none of it, since their
    answer is always HTTP 200 with an AdmissionReview.
    """

    def __init__(self, api: FastAPI, handlers: dict[str, Callable[[bytes], Reply]], limit: int) -> None:
        self.api = api
        self.handlers = handlers
        self.limit = limit

    @property
    def paths(self) -> set[str]:
        return set(self.handlers) | {p for r in self.api.routes if isinstance(p := getattr(r, "path", None), str)}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        handler = self.handlers.get(scope.get("path", "")) if scope["type"] == "http" else None
        if handler is None or scope["method"] != "POST":
            await self.api(scope, receive, send)
            return
        body = await self._read(scope, receive)
        try:
            reply = handler(body)
        except Exception:  # last line of defence: never a 500 (admission.py already catches)
            log.exception("unexpected error answering %s", scope.get("path"))
            reply = _INTERNAL_ERROR
        status, payload = reply if isinstance(reply, tuple) else (200, reply)
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": payload})

    async def _read(self, scope: Scope, receive: Receive) -> bytes | _TooLarge:
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and value.isdigit() and int(value) > self.limit:
                message = await receive()
                return _TooLarge(message.get("body", b"")[:8192])
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return _TooLarge(b"")  # client went away; the answer is never read
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                return _TooLarge((b"".join(chunks) + chunk)[:8192])
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


_INTERNAL_ERROR = (
    b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"","allowed":false,'
    b'"status":{"code":403,"reason":"Forbidden","message":"gpupack webhook internal error; see its log"}}}'
)


class _TooLarge(bytes):
    """The first bytes of a body over the size limit (for the uid hint)."""


def build_app(
    holder: InventoryHolder,
    settings: WebhookSettings,
    metrics: Metrics | None = None,
    tls: ReloadingTLS | None = None,
    on_startup: Callable[[], None] | None = None,
    recommendations: RecommendationWatch | None = None,
    priorities: PriorityWatch | None = None,
) -> AdmissionApp:
    """The ASGI app. ``tls`` enables the rotation check loop; ``on_startup`` starts
    the inventory watch (so nothing runs at import or build time); ``recommendations``: the
    GPURecommendations right-sizing sizes pods from (None: no pod is sized); ``priorities``: the
    pod watch the scheduler extender scores from (None: ``/scheduler/prioritize`` is not served)."""
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

    api = FastAPI(title="gpupack admission webhook", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)

    def admit(endpoint: str, decide: Callable[[Any], Answer]) -> Callable[[bytes], bytes]:
        def handle(body: bytes) -> bytes:
            started = time.perf_counter()
            if isinstance(body, _TooLarge):
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
                        review_response(uid_hint(body), False, message=f"body is not valid JSON: {exc}",
                                        reason="MalformedJSON", code=400),
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
            if answer.right_sized:
                metrics.right_sized.inc()
            return payload

        return handle

    async def healthz(request: Request) -> Response:
        return PlainTextResponse("ok")

    async def readyz(request: Request) -> Response:
        if holder.current.synced:
            return PlainTextResponse("ready")
        return PlainTextResponse("inventory not synced yet", status_code=503)

    async def metrics_route(request: Request) -> Response:
        return Response(metrics.render(), media_type=metrics.content_type)

    async def post_only(request: Request) -> Response:  # GET /mutate etc.: 405, as a router would
        return PlainTextResponse("use POST with an AdmissionReview", status_code=405)

    api.router.add_route("/healthz", healthz, methods=["GET"])
    api.router.add_route("/readyz", readyz, methods=["GET"])
    api.router.add_route("/metrics", metrics_route, methods=["GET"])
    api.router.add_route("/mutate", post_only, methods=["GET", "PUT", "DELETE", "PATCH"])
    api.router.add_route("/validate", post_only, methods=["GET", "PUT", "DELETE", "PATCH"])
    def authorize(body: bytes) -> bytes:
        started = time.perf_counter()
        if isinstance(body, _TooLarge):
            answer = review_access(None, settings.node_agent_user)
        else:
            try:
                answer = review_access(loads(body), settings.node_agent_user)
            except JSONDecodeError:
                answer = review_access(None, settings.node_agent_user)
        status = answer["status"]
        outcome = "allowed" if status["allowed"] else ("error" if "evaluationError" in status else "denied")
        metrics.observe("authorize", outcome, time.perf_counter() - started)
        return dumps(answer)

    api.router.add_route("/authorize", post_only, methods=["GET", "PUT", "DELETE", "PATCH"])
    handlers: dict[str, Callable[[bytes], Reply]] = {
        "/mutate": admit("mutate", lambda review: _review_with_memo(review, holder, settings, recommendations)),
        "/validate": admit("validate", lambda review: review_validation(review, holder.current, settings)),
        "/authorize": authorize,
    }
    if priorities is not None:
        watch = priorities

        def prioritize(body: bytes) -> Reply:
            started = time.perf_counter()
            outcome, status, reply = _prioritize(body, watch, settings.max_body_bytes)
            metrics.observe_prioritize(outcome, time.perf_counter() - started)
            return status, dumps(reply)

        async def post_args(request: Request) -> Response:
            return PlainTextResponse("use POST with a kube-scheduler ExtenderArgs", status_code=405)

        api.router.add_route(PRIORITIZE_PATH, post_args, methods=["GET", "PUT", "DELETE", "PATCH"])
        handlers[PRIORITIZE_PATH] = prioritize
    return AdmissionApp(api, handlers, settings.max_body_bytes)


def _prioritize(body: bytes, watch: PriorityWatch, limit: int) -> tuple[str, int, Any]:
    """The outcome (for metrics), HTTP status and JSON answer of one prioritize call. kube-scheduler
    ignores an extender that answers anything but 200 for that pod, so every failure is a plain
    status with ``{"error": ...}`` and the pod is scheduled without this preference."""
    if isinstance(body, _TooLarge):
        return "too_large", 413, {"error": f"ExtenderArgs larger than {limit} bytes; refused unread"}
    if not watch.synced:
        return "not_synced", 503, {"error": "the pod watch has not synced yet; no preference for this pod"}
    try:
        args = parse_extender_args(loads(body))
        scores = score_nodes(args.priority, args.nodes, watch.priorities(args.nodes))
        return "scored", 200, host_priorities(args.nodes, scores)
    except JSONDecodeError as exc:
        return "malformed", 400, {"error": f"body is not valid JSON: {exc}"}
    except ValueError as exc:
        return "malformed", 400, {"error": str(exc)}
    except Exception:  # a bug must not take the route down; the webhook never answers 500, and
        # kube-scheduler ignores any answer but 200 for this pod alike
        log.exception("unexpected error answering a prioritize call")
        return "error", 503, {"error": "internal error scoring nodes; see the webhook's log"}


def _review_with_memo(review: Any, holder: InventoryHolder, settings: WebhookSettings,
                      recommendations: RecommendationWatch | None) -> Answer:
    memo = holder.memo  # read once: the memo and its snapshot always belong together
    lookup = recommendations.lookup if recommendations is not None and recommendations.synced else None
    return review_pod(review, memo.inventory, settings, memo, lookup)


def _inventory_gauges(metrics: Metrics, holder: InventoryHolder) -> None:
    metrics.inventory_nodes.set(len(holder.current.nodes))
    metrics.inventory_skipped_policies.set(len(holder.current.skipped_policies))
    metrics.inventory_skipped_entries.set(len(holder.current.skipped_entries))
    metrics.inventory_synced.set(1 if holder.current.synced else 0)


async def _tls_loop(tls: ReloadingTLS, every: float) -> None:
    while True:
        await asyncio.sleep(every)
        try:
            tls.check()
        except Exception:  # the loop must outlive any surprise
            log.exception("TLS reload check failed")
