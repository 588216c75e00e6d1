"""Admission as functions: an AdmissionReview dict in, an AdmissionReview dict out.

``mutate(review, inventory, settings)`` answers ``POST /mutate`` for pods and
``validate(review, inventory, settings)`` answers ``POST /validate`` for
SharingPolicy objects and for ResourceClaims and ResourceClaimTemplates that
ask for gpupack's devices (``webhook.claim_validation``); the HTTP layer
(``webhook.app``) only decodes bytes and encodes the answer. Both never raise: every input, however malformed, gets a well-formed
``admission.k8s.io/v1`` AdmissionReview carrying the request's uid where one
could be read, and either ``allowed: true`` (with a reason in
``status.message``) or ``allowed: false`` with a specific message. An
unexpected exception becomes a denial that says so (fail closed, like the
``failurePolicy: Fail`` the webhook is registered with), never an HTTP 500.

No API call and no side effect happens here: the decision depends only on the
request and the inventory snapshot, so ``dryRun`` requests are answered exactly
like real ones and a reinvoked webhook sees its own work and changes nothing.
"""

from __future__ import annotations

import base64
import json
import logging
import re
from dataclasses import dataclass, replace
from typing import Any, Final, Literal

from sharing.api.backend import pod_claim_name
from sharing.api.allocation import gpu_ask
from sharing.admission.decision import DecisionMemo, PodDecision, cpu_pod_decision, decide, policy_for
from sharing.admission.dra_claims import names_gpupack_class
from sharing.admission.inventory import Inventory
from sharing.api.keys import BACKEND_LABEL, CAPACITY_GATE, SKIP_LABEL
from sharing.api.fields import as_map
from sharing.admission.patch import build_patch
from sharing.admission.pool_choice import UnknownBackend, choose_pool
from sharing.admission.right_sizing import RecommendationLookup, size_pod
from sharing.rules.right_sizing import right_sizing_for
from sharing.api.request import AdmissionRefusal, Reason, parse_pod, pod_wants_gpupack
from webhook import claim_validation
from webhook.forged_marks import refuse_forged_marks, refuse_taken_claim_name
from webhook.jsonio import dumps
from webhook.policy_validation import policy_problems
from webhook.settings import WebhookSettings

log = logging.getLogger("gpupack.webhook")

API_VERSION: Final = "admission.k8s.io/v1"
KIND: Final = "AdmissionReview"
_UID_RE: Final = re.compile(rb'"uid"\s*:\s*("(?:[^"\\]|\\.){1,256}")')

Outcome = Literal["allowed", "denied", "error"]
NO_DRA_NODE_WARNING: Final = (f"gpupack: the cluster has no node of the DRA pool ({BACKEND_LABEL}=dra) yet; "
                              f"the pod waits at scheduling gate {CAPACITY_GATE} until one can hold it")


@dataclass(frozen=True)
class Answer:
    """An answered review plus what the metrics need to know about it."""

    review: dict[str, Any]
    outcome: Outcome
    reason: str | None = None
    decision: PodDecision | None = None
    right_sized: bool = False
    """The pod's request was sized from its workload's recommendation."""


class BadReview(Exception):
    """The envelope itself is unusable; answered with a denial."""

    def __init__(self, message: str, uid: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.uid = uid


def uid_hint(body: bytes) -> str:
    """The uid of a review we refuse to parse (too large or not JSON), if visible."""
    match = _UID_RE.search(body[:8192])
    if match is None:
        return ""
    try:
        uid = json.loads(match.group(1))  # a JSON string literal: undo its escapes
    except ValueError:
        return ""
    return uid if isinstance(uid, str) else ""


def envelope(review: Any) -> tuple[str, dict[str, Any]]:
    """``(uid, request)`` of an ``admission.k8s.io/v1`` review; raises :class:`BadReview`."""
    if not isinstance(review, dict):
        raise BadReview("the body is not a JSON object; expected an admission.k8s.io/v1 AdmissionReview")
    request = review.get("request")
    uid = request.get("uid") if isinstance(request, dict) else None
    uid = uid if isinstance(uid, str) else ""
    if review.get("apiVersion") != API_VERSION:
        raise BadReview(
            f"apiVersion {str(review.get('apiVersion'))[:64]!r} is not supported; send {API_VERSION} "
            f"(admissionReviewVersions: [v1])",
            uid,
        )
    if review.get("kind") != KIND:
        raise BadReview(f"kind {str(review.get('kind'))[:64]!r} is not {KIND}", uid)
    if not isinstance(request, dict):
        raise BadReview("the AdmissionReview has no request", uid)
    if not uid:
        raise BadReview("request.uid is missing or not a string", uid)
    if not isinstance(request.get("kind"), dict):
        raise BadReview("request.kind (group, version, kind of the object) is missing", uid)
    return uid, request


STATUS_REASONS: Final = {400: "BadRequest", 403: "Forbidden", 413: "RequestEntityTooLarge"}
"""metav1.StatusReason for each code a denial uses."""


def review_response(
    uid: str,
    allowed: bool,
    *,
    message: str = "",
    reason: str = "",
    code: int = 403,
    patch: list[dict[str, Any]] | None = None,
    warnings: list[str] | None = None,
    causes: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    """``causes``: a denial's causes, each with its own reason (default: one, ``reason``)."""
    response: dict[str, Any] = {"uid": uid, "allowed": allowed}
    if patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(dumps(patch)).decode("ascii")
    if not allowed:
        response["status"] = {"code": code, "reason": STATUS_REASONS.get(code, "Forbidden"), "message": message}
        if causes or reason:
            response["status"]["details"] = {"causes": causes or [{"reason": reason, "message": message}]}
    elif message:
        response["status"] = {"code": 200, "message": message}
    if warnings:
        response["warnings"] = warnings
    return {"apiVersion": API_VERSION, "kind": KIND, "response": response}


def _resource_is(request: dict[str, Any], group: str, kind: str) -> bool:
    raw = request.get("kind")
    return isinstance(raw, dict) and raw.get("group", "") == group and raw.get("kind") == kind


def _allow(uid: str, why: str) -> Answer:
    return Answer(review_response(uid, True, message=why), "allowed")


def _deny(uid: str, reason: str, message: str, code: int = 403) -> Answer:
    return Answer(review_response(uid, False, message=message, reason=reason, code=code), "denied", reason)


def review_pod(
    review: Any, inventory: Inventory, settings: WebhookSettings, memo: DecisionMemo | None = None,
    recommendations: RecommendationLookup | None = None,
) -> Answer:
    """Answer a pod review; the full :class:`Answer` (``mutate`` returns its review).

    ``recommendations``: the workloads' GPURecommendations (``webhook.recommendation_watch``), which
    size the pods of namespaces in right-sizing ``Initial`` or ``Recreate``
    (``sharing.admission.right_sizing``); None: no pod is sized."""
    try:
        uid, request = envelope(review)
    except BadReview as bad:
        return _deny(bad.uid, "MalformedReview", bad.message, code=400)
    try:
        return _review_pod(uid, request, inventory, settings.placement == "engine", memo, recommendations)
    except AdmissionRefusal as refusal:
        return _deny(uid, refusal.reason, refusal.message)
    except UnknownBackend as bad:
        return _deny(uid, bad.reason, bad.message)
    except Exception:  # never a 500: fail closed with a message that says so
        log.exception("unexpected error while deciding pod (uid %s)", uid)
        answer = review_response(
            uid, False, message="gpupack webhook internal error; see the webhook's log", reason="InternalError"
        )
        return Answer(answer, "error", "InternalError")


def _review_pod(
    uid: str, request: dict[str, Any], inventory: Inventory, engine_places: bool, memo: DecisionMemo | None,
    recommendations: RecommendationLookup | None,
) -> Answer:
    if not _resource_is(request, "", "Pod") or request.get("subResource"):
        return _allow(uid, "gpupack: not a pod create; nothing to do")
    if request.get("operation") != "CREATE":
        # Container resources are immutable after create, so there is nothing to decide.
        return _allow(uid, f"gpupack: {str(request.get('operation'))[:16]} of a pod; nothing to do")
    pod = request.get("object")
    if not isinstance(pod, dict) or pod.get("kind", "Pod") != "Pod":
        raise AdmissionRefusal(Reason.MALFORMED_POD, "request.object is not a Pod object")
    metadata = pod.get("metadata")
    labels = metadata.get("labels") if isinstance(metadata, dict) else None
    if isinstance(labels, dict) and labels.get(SKIP_LABEL) == "true":
        return _allow(uid, f"gpupack: pod has label {SKIP_LABEL}=true; left untouched")
    wants = pod_wants_gpupack(pod)
    if not wants and isinstance(labels, dict) and labels.get(BACKEND_LABEL) == "dra":
        spec = pod.get("spec")
        # A pod created with spec.nodeName is placed already (and may not carry a scheduling gate).
        if isinstance(spec, dict) and gpu_ask(spec) is None and not spec.get("nodeName"):
            return _cpu_pod(uid, pod, inventory)
    namespace = request.get("namespace")
    if not wants:
        own = namespace if isinstance(namespace, str) else ""
        refuse_forged_marks(pod, policy_for(inventory, own, memo) if inventory.synced else None)
        return _allow(uid, "gpupack: pod asks for no gpupack.io resources; left untouched")
    parsed = parse_pod(pod, namespace if isinstance(namespace, str) else "")
    if parsed is None:
        return _allow(uid, "gpupack: pod asks for no gpupack.io resources; left untouched")
    refuse_taken_claim_name(pod)
    if not inventory.synced:
        raise AdmissionRefusal(
            Reason.INVENTORY_NOT_SYNCED, "gpupack webhook has not synced the GPU inventory yet; retry shortly"
        )
    pool = choose_pool(labels if isinstance(labels, dict) else None, parsed.namespace, inventory)
    policy = policy_for(inventory, parsed.namespace, memo)
    sized = size_pod(parsed, pod, right_sizing_for(inventory.policies, parsed.namespace,
                                                   inventory.namespace_labels.get(parsed.namespace)),
                     recommendations, inventory.pool(pool.backend).max_gpu_memory_mib)
    decision = decide(sized.request, policy, inventory, engine_places=engine_places, memo=memo, backend=pool.backend)
    warnings: list[str] = []
    if pool.backend == "dra":
        # Named now, from the review's uid: the pod may have only a generateName, and the
        # controller creates the claim under this name when it places the pod.
        decision = replace(decision, claim=pod_claim_name(uid))
        if not inventory.pool("dra").nodes:
            warnings.append(NO_DRA_NODE_WARNING)
    patch = build_patch(pod, decision, sized.record)
    if not decision.capacity_exists:
        warnings.append(
            f"gpupack: no free {decision.mode} capacity fits this pod yet; it waits at scheduling gate "
            f"{CAPACITY_GATE} until gpupack creates it"
        )
    message = f"gpupack: {decision.reason} (pool: {pool.why})" + (f"; {sized.note}" if sized.note else "")
    answer = review_response(uid, True, message=message, patch=patch, warnings=warnings or None)
    return Answer(answer, "allowed", decision=decision, right_sized=sized.record is not None)


def _cpu_pod(uid: str, pod: dict[str, Any], inventory: Inventory) -> Answer:
    """A pod that asks for no GPU, labelled for the DRA pool: the packing engine places it there
    (``sharing.admission.decision.cpu_pod_decision``). Any gpupack mark it carries is replaced by the
    webhook's own, so a hand-written one changes nothing; its reinvocation changes nothing either."""
    decision = cpu_pod_decision()
    warnings = None
    if inventory.synced and not inventory.pool("dra").nodes:
        warnings = [NO_DRA_NODE_WARNING]
    message = f"gpupack: {decision.reason} (pool: pod label {BACKEND_LABEL}=dra)"
    answer = review_response(uid, True, message=message, patch=build_patch(pod, decision), warnings=warnings)
    return Answer(answer, "allowed", decision=decision)


def mutate(review: Any, inventory: Inventory, settings: WebhookSettings) -> dict[str, Any]:
    """``POST /mutate``: the AdmissionReview answering a pod review."""
    return review_pod(review, inventory, settings).review


def review_validation(review: Any, inventory: Inventory, settings: WebhookSettings) -> Answer:
    """Answer a ``/validate`` review (create/update), by kind: a SharingPolicy, or a
    ``resource.k8s.io`` ResourceClaim or ResourceClaimTemplate; the full :class:`Answer`."""
    try:
        uid, request = envelope(review)
    except BadReview as bad:
        return _deny(bad.uid, "MalformedReview", bad.message, code=400)
    try:
        if request.get("operation") not in ("CREATE", "UPDATE") or request.get("subResource"):
            return _allow(uid, "gpupack: nothing to validate")
        if _resource_is(request, "gpupack.io", "SharingPolicy"):
            return _review_policy(uid, request)
        kind = next((k for k in claim_validation.KINDS if _resource_is(request, claim_validation.GROUP, k)), None)
        if kind is not None:
            return _review_claim(uid, request, kind, inventory)
        return _allow(uid, "gpupack: not a SharingPolicy, ResourceClaim or ResourceClaimTemplate; nothing to validate")
    except Exception:
        log.exception("unexpected error while validating an object (uid %s)", uid)
        answer = review_response(
            uid, False, message="gpupack webhook internal error; see the webhook's log", reason="InternalError"
        )
        return Answer(answer, "error", "InternalError")


def _review_policy(uid: str, request: dict[str, Any]) -> Answer:
    problems, warnings = policy_problems(request.get("object"))
    if problems:
        message = "invalid SharingPolicy: " + "; ".join(problems)
        return _deny(uid, "InvalidPolicy", message)
    return Answer(review_response(uid, True, message="gpupack: policy is valid", warnings=warnings or None), "allowed")


def _review_claim(uid: str, request: dict[str, Any], kind: str, inventory: Inventory) -> Answer:
    obj = request.get("object")
    if not isinstance(obj, dict):
        return _deny(uid, "MalformedObject", f"request.object is not a {kind} object", code=400)
    if not names_gpupack_class(obj):
        return _allow(uid, f"gpupack: the {kind} names no gpupack DeviceClass; nothing to validate")
    if request.get("operation") == "UPDATE" and claim_validation.same_spec(obj, request.get("oldObject")):
        return _allow(uid, f"gpupack: the {kind}'s spec is unchanged; checked when it was created")
    if not inventory.synced:
        return _deny(uid, Reason.INVENTORY_NOT_SYNCED,
                     "gpupack webhook has not synced the GPU inventory yet; retry shortly")
    metadata = as_map(obj.get("metadata"))
    namespace = str(request.get("namespace") or metadata.get("namespace") or "")
    problems = claim_validation.claim_problems(obj, inventory, namespace)
    if problems:
        name = f"{namespace}/{metadata.get('name') or metadata.get('generateName') or ''}"
        message = claim_validation.denial_message(kind, repr(name[:128]), problems)
        answer = review_response(uid, False, message=message, reason="InvalidClaim",
                                 causes=[{"reason": str(p.reason), "message": p.message} for p in problems])
        return Answer(answer, "denied", "InvalidClaim")
    return _allow(uid, f"gpupack: the {kind}'s gpupack requests can be served")


def validate(review: Any, inventory: Inventory, settings: WebhookSettings) -> dict[str, Any]:
    """``POST /validate``: the AdmissionReview answering a SharingPolicy, ResourceClaim or template review."""
    return review_validation(review, inventory, settings).review
