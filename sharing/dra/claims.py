"""The pod's side on a DRA node pool: claims from gpupack requests, and checks of users' own claims.

Two pure functions of the webhook's future DRA path (docs/dra.md, "Claims from
pod requests"); no Kubernetes client:

* :func:`pod_claims` turns a pod's decided GPU containers (each a milli and
  memory ask, the pod's mode, a MIG profile) into the spec of one
  ResourceClaimTemplate (``resource.k8s.io/v1``) with one device request per
  GPU container, plus the pod patch data: ``spec.resourceClaims[]`` and each
  container's ``resources.claims[]``. Request names are ``gpu-<n>`` in the
  order of the containers; the template is named after a hash of its canonical
  spec (``gpupack-<10 hex>``), so every pod of the same shape shares one
  template per namespace, whatever its containers are called.
* :func:`check_claim` checks a user's ResourceClaim or ResourceClaimTemplate
  against what gpupack's devices can serve and returns every problem with the
  webhook's wording where the two overlap (``sharing.request``).

Shares are rounded by :class:`~sharing.dra.share_policy.SharePolicy`, as
kube-scheduler rounds them: a claim says what it will consume.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from enum import StrEnum
from typing import Any, Final, Literal, NotRequired, Protocol, TypedDict

from mig.catalog import CATALOG
from sharing.dra import names
from sharing.dra.model import DraModelError
from sharing.dra.share_policy import GPU_MILLI, SHARES, SharePolicy
from sharing.dra.wire import SelectorJSON, quantity
from sharing.modes import AllocationMode
from sharing.options import fmt_bytes
from sharing.request import AdmissionRefusal, Reason, parse_quantity
from sharing.backend import POD_CLAIM  # the name of gpupack's entry in ``spec.resourceClaims`` (one claim per pod)

TEMPLATE_PREFIX: Final = "gpupack-"
HASH_LENGTH: Final = 10
MANAGED_BY: Final = {"app.kubernetes.io/managed-by": "gpupack"}
GPUPACK_CLASSES: Final = frozenset(names.CLASS_OF_KIND.values())
CAPACITIES_OF_CLASS: Final[Mapping[str, tuple[str, ...]]] = {
    names.SHARED_CLASS: (names.MILLI, names.MEMORY),
    names.MIG_CLASS: (names.MEMORY,),
    names.GPU_CLASS: (names.MEMORY,),
}
"""The capacities each class's devices have: a request naming another never finds a device."""
KNOWN_PROFILES: Final = frozenset(p.name for m in CATALOG for p in m.profiles)


# ------------------------------------------------------------------ wire shapes
class CapacityRequirementsJSON(TypedDict):
    requests: dict[str, str]


class ExactRequestJSON(TypedDict):
    deviceClassName: str
    count: int
    selectors: NotRequired[list[SelectorJSON]]
    capacity: NotRequired[CapacityRequirementsJSON]


class DeviceRequestJSON(TypedDict):
    name: str
    exactly: ExactRequestJSON


class DeviceClaimJSON(TypedDict):
    requests: list[DeviceRequestJSON]


class ClaimSpecJSON(TypedDict):
    devices: DeviceClaimJSON


class TemplateMetadataJSON(TypedDict):
    labels: dict[str, str]


class TemplateSpecJSON(TypedDict):
    """``ResourceClaimTemplate.spec``: labels copied onto each claim, and the claim's spec."""

    metadata: TemplateMetadataJSON
    spec: ClaimSpecJSON


class PodResourceClaimJSON(TypedDict):
    name: str
    resourceClaimTemplateName: str


class ContainerClaimJSON(TypedDict):
    name: str
    request: str


# ------------------------------------------------------------------ building
class ContainerShape(Protocol):
    """What a decided container says (``sharing.decision.ContainerDecision`` is one)."""

    @property
    def kind(self) -> Literal["containers", "initContainers"]: ...
    @property
    def index(self) -> int: ...
    @property
    def milli(self) -> int: ...
    @property
    def memory_bytes(self) -> int | None: ...
    @property
    def profile(self) -> str | None: ...


@dataclass(frozen=True)
class ContainerClaim:
    """Where a container's claim reference goes: ``spec.<kind>[index].resources.claims``."""

    kind: Literal["containers", "initContainers"]
    index: int
    claims: tuple[ContainerClaimJSON, ...]


@dataclass(frozen=True)
class PodClaims:
    """The template to keep in the pod's namespace and what to patch into the pod."""

    template_name: str
    template_spec: TemplateSpecJSON
    pod_claims: tuple[PodResourceClaimJSON, ...]
    containers: tuple[ContainerClaim, ...]

    def template(self, namespace: str) -> dict[str, Any]:
        """The whole ResourceClaimTemplate object, ready to create."""
        return {"apiVersion": names.API_VERSION, "kind": "ResourceClaimTemplate",
                "metadata": {"name": self.template_name, "namespace": namespace, "labels": dict(MANAGED_BY)},
                "spec": self.template_spec}


def _attribute_selector(attribute: str, value: str) -> SelectorJSON:
    domain, _, ident = attribute.partition("/")
    return {"cel": {"expression": f'device.attributes["{domain}"].{ident} == {json.dumps(value)}'}}


def _memory_selector(memory_bytes: int) -> SelectorJSON:
    domain, _, ident = names.MEMORY.partition("/")
    return {"cel": {"expression": f'device.capacity["{domain}"].{ident}.compareTo(quantity("{quantity(memory_bytes)}")) >= 0'}}


def device_request(name: str, mode: AllocationMode, container: ContainerShape, policy: SharePolicy) -> DeviceRequestJSON:
    """One container's request: a share (``mps``, ``time-slicing``), a MIG profile, or a whole GPU."""
    exact: ExactRequestJSON
    if mode in ("mps", "time-slicing"):
        exact = {"deviceClassName": names.SHARED_CLASS, "count": 1,
                 "selectors": [_attribute_selector(names.SHARING, mode)],
                 "capacity": {"requests": {names.MILLI: quantity(policy.consumed_milli(container.milli)),
                                           names.MEMORY: quantity(policy.consumed_memory(container.memory_bytes))}}}
    elif mode == "mig":
        if container.profile not in KNOWN_PROFILES:
            raise DraModelError(f"mode mig needs a known MIG profile, got {container.profile!r}")
        exact = {"deviceClassName": names.MIG_CLASS, "count": 1,
                 "selectors": [_attribute_selector(names.PROFILE, container.profile)]}
    else:
        exact = {"deviceClassName": names.GPU_CLASS, "count": 1}
        if container.memory_bytes is not None:
            exact["selectors"] = [_memory_selector(container.memory_bytes)]
    return {"name": name, "exactly": exact}


def template_name(spec: TemplateSpecJSON) -> str:
    """``gpupack-`` and the first hex digits of the SHA-256 of the spec's canonical JSON."""
    canonical = json.dumps(spec, sort_keys=True, separators=(",", ":"))
    return TEMPLATE_PREFIX + hashlib.sha256(canonical.encode()).hexdigest()[:HASH_LENGTH]


def request_name(position: int) -> str:
    """The name of the device request of a pod's ``position``-th GPU container (0-based, in the
    order ``sharing.request`` lists them: init containers first): ``gpu-<position>``. The one
    naming: templates here, the webhook's allocation record and the claims the controller makes."""
    return f"gpu-{position}"


def pod_claims(mode: AllocationMode, containers: Sequence[ContainerShape], policy: SharePolicy = SHARES) -> PodClaims:
    """The claim template and pod patch data for a pod's GPU containers, in pod order.

    ``containers`` are the decided GPU containers (``PodDecision.containers``),
    one device request each, named ``gpu-0``, ``gpu-1``, ...
    """
    if not containers:
        raise DraModelError("a pod without GPU containers needs no claim")
    requests = [device_request(request_name(n), mode, c, policy) for n, c in enumerate(containers)]
    spec: TemplateSpecJSON = {"metadata": {"labels": dict(MANAGED_BY)}, "spec": {"devices": {"requests": requests}}}
    name = template_name(spec)
    return PodClaims(
        template_name=name,
        template_spec=spec,
        pod_claims=({"name": POD_CLAIM, "resourceClaimTemplateName": name},),
        containers=tuple(ContainerClaim(c.kind, c.index, ({"name": POD_CLAIM, "request": r["name"]},))
                         for c, r in zip(containers, requests)),
    )


# ------------------------------------------------------------------ checking users' claims
class ClaimReason(StrEnum):
    """Refusals only a claim can earn (the others are ``sharing.request.Reason``)."""

    CAPACITY_OFF_STEP = "CapacityOffStep"
    SHARED_COUNT = "SharedCount"
    UNKNOWN_PROFILE = "UnknownProfile"
    PROFILE_NOT_MIG = "ProfileNotMig"


@dataclass(frozen=True)
class ClaimProblem:
    reason: Reason | ClaimReason
    message: str

    def __str__(self) -> str:
        return self.message


_PROFILE_SELECTOR = re.compile(
    r'device\.attributes\[\s*["\']' + re.escape(names.DRIVER) + r'["\']\s*\]'
    r'(?:\.profile|\[\s*["\']profile["\']\s*\])\s*==\s*["\']([^"\']*)["\']')


def _specs(obj: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """(where, exact-or-subrequest) for every request of a claim or template."""
    spec = obj.get("spec")
    if obj.get("kind") == "ResourceClaimTemplate" and isinstance(spec, Mapping):
        spec = spec.get("spec")
    devices = spec.get("devices") if isinstance(spec, Mapping) else None
    requests = devices.get("requests") if isinstance(devices, Mapping) else None
    found: list[tuple[str, Mapping[str, Any]]] = []
    for request in requests if isinstance(requests, list) else []:
        if not isinstance(request, Mapping):
            continue
        name = str(request.get("name", "?"))[:64]
        if isinstance(request.get("exactly"), Mapping):
            found.append((f"request {name!r}", request["exactly"]))
        alternatives = request.get("firstAvailable")
        for sub in alternatives if isinstance(alternatives, list) else []:
            if isinstance(sub, Mapping):
                found.append((f"request {name + '/' + str(sub.get('name', '?'))!r}", sub))
    return found


def _check_milli(what: str, value: object) -> list[ClaimProblem]:
    amount = parse_quantity(value, what=what)
    if amount != amount.to_integral_value():
        return [ClaimProblem(Reason.MILLI_OUT_OF_RANGE,
                             f"{what}={value!r} is not a whole number; it counts thousandths of a GPU, "
                             f"so ask for an integer in 1..{GPU_MILLI} (e.g. 250 for a quarter GPU)")]
    if not 1 <= amount <= GPU_MILLI:
        return [ClaimProblem(Reason.MILLI_OUT_OF_RANGE,
                             f"{what}={value!r} is outside 1..{GPU_MILLI} (1000 = one whole GPU; "
                             f"for more than one GPU ask for {names.GPU_CLASS} with a count instead)")]
    return []


def _check_memory(what: str, value: object, shared: bool, policy: SharePolicy, largest: int | None) -> list[ClaimProblem]:
    amount: Decimal = parse_quantity(value, what=what)
    if amount <= 0 or amount != amount.to_integral_value():
        return [ClaimProblem(Reason.INVALID_QUANTITY,
                             f"{what}={value!r} must be a positive whole number of bytes such as '20Gi'")]
    if largest is None:
        return []
    if amount > largest:
        return [ClaimProblem(Reason.MEMORY_TOO_LARGE,
                             f"{what} asks for {fmt_bytes(int(amount))} of GPU memory; the largest GPU in the "
                             f"cluster has {fmt_bytes(largest)}")]
    consumed, most = policy.consumed_memory(int(amount)), policy.max_memory(largest)
    if shared and consumed > most:
        return [ClaimProblem(ClaimReason.CAPACITY_OFF_STEP,
                             f"{what}={value!r} rounds up to {fmt_bytes(consumed)} in units of "
                             f"{fmt_bytes(policy.memory_step_bytes)}, more than the largest shared GPU serves "
                             f"({fmt_bytes(most)}, whole units of its {fmt_bytes(largest)})")]
    return []


def _check_request(where: str, exact: Mapping[str, Any], policy: SharePolicy, largest: int | None,
                   profiles: Collection[str]) -> list[ClaimProblem]:
    cls = exact.get("deviceClassName")
    if not isinstance(cls, str) or cls not in GPUPACK_CLASSES:
        return []
    problems: list[ClaimProblem] = []
    shared = cls == names.SHARED_CLASS
    capacity = exact.get("capacity")
    wanted = capacity.get("requests") if isinstance(capacity, Mapping) else None
    for key, value in (wanted.items() if isinstance(wanted, Mapping) else ()):
        key = str(key)[:128]
        what = f"{where}: {key}"
        try:
            if key not in CAPACITIES_OF_CLASS[cls]:
                problems.append(ClaimProblem(
                    Reason.UNKNOWN_RESOURCE,
                    f"{where}: unknown capacity {key!r} for device class {cls}; valid capacities: "
                    f"{', '.join(CAPACITIES_OF_CLASS[cls])}"))
            elif key == names.MILLI:
                problems += _check_milli(what, value)
            else:
                problems += _check_memory(what, value, shared, policy, largest)
        except AdmissionRefusal as refusal:
            problems.append(ClaimProblem(refusal.reason, refusal.message))
    mode, count = exact.get("allocationMode", "ExactCount"), exact.get("count", 1)
    if shared and (mode == "All" or count != 1):
        problems.append(ClaimProblem(
            ClaimReason.SHARED_COUNT,
            f"{where}: a request of {names.SHARED_CLASS} takes a share of one GPU, so its count must be 1 "
            f"(got {'allocationMode All' if mode == 'All' else f'count {count}'}); "
            f"for several GPUs use one request per share, or {names.GPU_CLASS} with a count"))
    selectors = exact.get("selectors")
    for selector in selectors if isinstance(selectors, list) else []:
        cel = selector.get("cel") if isinstance(selector, Mapping) else None
        expression = cel.get("expression") if isinstance(cel, Mapping) else None
        for profile in _PROFILE_SELECTOR.findall(expression if isinstance(expression, str) else ""):
            if cls != names.MIG_CLASS:
                problems.append(ClaimProblem(
                    ClaimReason.PROFILE_NOT_MIG,
                    f"{where}: selects MIG profile {profile!r} in device class {cls}; only {names.MIG_CLASS} "
                    f"devices have a {names.PROFILE} attribute"))
            elif profile not in profiles:
                problems.append(ClaimProblem(
                    ClaimReason.UNKNOWN_PROFILE,
                    f"{where}: unknown MIG profile {profile!r}; valid profiles: {', '.join(sorted(profiles))}"))
    return problems


def names_gpupack_class(obj: Mapping[str, Any]) -> bool:
    """Whether any request of this ResourceClaim or template (alternatives too) names one of
    gpupack's DeviceClasses: only those are :func:`check_claim`'s business."""
    return any(isinstance(cls := exact.get("deviceClassName"), str) and cls in GPUPACK_CLASSES
               for _, exact in _specs(obj))


def check_claim(obj: Mapping[str, Any], *, policy: SharePolicy = SHARES,
                largest_gpu_memory_bytes: int | None = None,
                profiles: Collection[str] = KNOWN_PROFILES) -> tuple[ClaimProblem, ...]:
    """Every reason gpupack's devices could never serve a request of this ResourceClaim or template.

    Only requests (``exactly`` and ``firstAvailable`` alternatives) naming one
    of gpupack's DeviceClasses are checked. ``largest_gpu_memory_bytes``: the
    largest GPU of the cluster (``Inventory.max_gpu_memory_mib``); None skips
    the memory bounds. ``profiles``: the MIG profile names the cluster's GPUs
    have (default: every model of ``mig.catalog``). An empty tuple: admit.
    """
    problems: list[ClaimProblem] = []
    for where, exact in _specs(obj):
        problems += _check_request(where, exact, policy, largest_gpu_memory_bytes, profiles)
    return tuple(problems)
