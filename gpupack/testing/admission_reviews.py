"""Builders for AdmissionReviews and pods, shared by the tests, the benchmark and
the CLI's dry run. Plain dicts, shaped like what the API server sends."""

from __future__ import annotations

import copy
import uuid
from typing import Any
from sharing.api.keys import MEMORY_RESOURCE, MILLI_RESOURCE, SHARING_ANNOTATION


def gpu_container(
    name: str = "main", milli: object = "250", memory: object | None = None, **extra: Any
) -> dict[str, Any]:
    limits: dict[str, Any] = {MILLI_RESOURCE: milli}
    if memory is not None:
        limits[MEMORY_RESOURCE] = memory
    return {"name": name, "image": "example.com/app:1", "resources": {"limits": limits}, **extra}


def make_pod(
    *containers: dict[str, Any],
    name: str = "pod-1",
    namespace: str = "default",
    mode: str | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    init: list[dict[str, Any]] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    notes = dict(annotations or {})
    if mode is not None:
        notes[SHARING_ANNOTATION] = mode
    if notes:
        metadata["annotations"] = notes
    if labels:
        metadata["labels"] = labels
    body: dict[str, Any] = {"containers": [copy.deepcopy(c) for c in (containers or (gpu_container(),))], **spec}
    if init:
        body["initContainers"] = copy.deepcopy(init)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": body}


def make_review(
    obj: Any,
    *,
    uid: str | None = None,
    operation: str = "CREATE",
    kind: str = "Pod",
    group: str = "",
    version: str = "v1",
    namespace: str = "default",
    dry_run: bool = False,
) -> dict[str, Any]:
    resource = {"Pod": "pods", "SharingPolicy": "sharingpolicies"}.get(kind, kind.lower() + "s")
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid or str(uuid.uuid4()),
            "kind": {"group": group, "version": version, "kind": kind},
            "resource": {"group": group, "version": version, "resource": resource},
            "namespace": namespace,
            "operation": operation,
            "userInfo": {"username": "tester"},
            "object": obj,
            "oldObject": None,
            "dryRun": dry_run,
        },
    }
