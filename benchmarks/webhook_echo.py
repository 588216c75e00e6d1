"""Baseline for the webhook benchmark: the cheapest FastAPI admission endpoint.

It reads the body, parses it, and answers ``allowed: true`` with the uid: the
floor any Python webhook on this stack pays (TLS, HTTP, ASGI, JSON). The
benchmark reports gpupack's numbers next to this one, so the ratio means
something on a noisy 2-core machine.
"""

from __future__ import annotations

import json

from fastapi import FastAPI, Request
from starlette.responses import Response

app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)


@app.post("/mutate")
async def mutate(request: Request) -> Response:
    review = json.loads(await request.body())
    uid = review["request"]["uid"]
    answer = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": {"uid": uid, "allowed": True}}
    return Response(json.dumps(answer), media_type="application/json")


@app.get("/readyz")
async def readyz() -> Response:
    return Response("ready")
