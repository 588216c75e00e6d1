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
  webhook's wording where the two overlap (``sharing.api.request``).

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
from sharing.api.crd import MAX_GPUS_PER_NODE
from sharing.dra import names
from sharing.dra.model import DraModelError
from sharing.dra.share_policy import GPU_MILLI, SHARES, SharePolicy
from sharing.dra.wire import SelectorJSON, quantity
from sharing.admission.inventory import AdmissionPolicy
from sharing.api.modes import AllocationMode, Mode
from sharing.admission.options import fmt_bytes
from sharing.api.request import AdmissionRefusal, Reason, parse_quantity
from sharing.api.backend import POD_CLAIM  # the name of gpupack's entry in ``spec.resourceClaims`` (one claim per pod)

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
    """What a decided container says (``sharing.admission.decision.ContainerDecision`` is one)."""

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
    order ``sharing.api.request`` lists them: init containers first): ``gpu-<position>``. The one
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
    """Refusals only a claim can earn (the others are ``sharing.api.request.Reason``)."""

    CAPACITY_OFF_STEP = "CapacityOffStep"
    SHARED_COUNT = "SharedCount"
    DEVICE_COUNT = "DeviceCount"
    UNKNOWN_PROFILE = "UnknownProfile"
    PROFILE_NOT_MIG = "ProfileNotMig"
    PROFILE_FORBIDDEN = "ProfileForbidden"


@dataclass(frozen=True)
class ClaimProblem:
    reason: Reason | ClaimReason
    message: str

    def __str__(self) -> str:
        return self.message


def _attribute_pattern(attribute: str) -> re.Pattern[str]:
    """``device.attributes["gpu.gpupack.io"].<attribute> == "<value>"`` (or ``["<attribute>"]``): the value."""
    return re.compile(
        r'device\.attributes\[\s*["\']' + re.escape(names.DRIVER) + r'["\']\s*\]'
        r'(?:\.' + attribute + r'|\[\s*["\']' + attribute + r'["\']\s*\])\s*==\s*["\']([^"\']*)["\']')


_PROFILE_SELECTOR = _attribute_pattern("profile")
_SHARING_SELECTOR = _attribute_pattern("sharing")
SHARED_MODES: Final[tuple[Mode, ...]] = ("mps", "time-slicing")
MODES_OF_CLASS: Final[Mapping[str, tuple[Mode, ...]]] = {
    names.MIG_CLASS: ("mig",),
    names.SHARED_CLASS: SHARED_MODES,
    names.GPU_CLASS: SHARED_MODES,
}
"""The sharing modes a namespace must be allowed (one of) to claim a class's devices: what the
webhook gives a pod of the namespace on the DRA pool (a whole GPU is what a shared-mode request
gets when no share holds it, as ``sharing.admission.record_policy`` reads mode ``whole``)."""


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


@dataclass(frozen=True)
class ClaimBounds:
    """What one namespace's claims may ask of gpupack's devices, beside what the devices can serve."""

    policy: AdmissionPolicy | None = None
    """The namespace's merged SharingPolicy (``sharing.admission.inventory.admission_policy``); None: not checked."""
    most_gpus: int = MAX_GPUS_PER_NODE
    """The most whole GPUs one request may count: the DRA pool's largest node's GPUs."""


def _check_count(where: str, cls: str, exact: Mapping[str, Any], most_gpus: int) -> list[ClaimProblem]:
    """One device per request of a MIG placement or a share, as the webhook's claims ask; whole GPUs up to
    what one node has. ``allocationMode: All`` is unbounded, so never."""
    mode, count = exact.get("allocationMode", "ExactCount"), exact.get("count", 1)
    asked = "allocationMode All" if mode == "All" else f"count {count!r}"
    if cls == names.SHARED_CLASS and (mode == "All" or count != 1):
        return [ClaimProblem(
            ClaimReason.SHARED_COUNT,
            f"{where}: a request of {names.SHARED_CLASS} takes a share of one GPU, so its count must be 1 "
            f"(got {asked}); for several GPUs use one request per share, or {names.GPU_CLASS} with a count")]
    if cls == names.MIG_CLASS and (mode == "All" or count != 1):
        return [ClaimProblem(
            ClaimReason.DEVICE_COUNT,
            f"{where}: a request of {names.MIG_CLASS} takes one MIG placement, so its count must be 1 "
            f"(got {asked}); a pod's containers each get their own request")]
    whole = isinstance(count, int) and not isinstance(count, bool) and 1 <= count <= most_gpus
    if cls == names.GPU_CLASS and (mode == "All" or not whole):
        return [ClaimProblem(
            ClaimReason.DEVICE_COUNT,
            f"{where}: a request of {names.GPU_CLASS} counts whole GPUs, 1..{most_gpus} (the most one node of the "
            f"DRA pool has); got {asked}")]
    return []


def _check_policy(where: str, cls: str, exact: Mapping[str, Any], policy: AdmissionPolicy | None) -> list[ClaimProblem]:
    """The namespace's SharingPolicy: the class's modes (and a shared request's selected mode), and MIG profiles."""
    if policy is None:
        return []
    allowed = policy.allowed_modes
    modes = MODES_OF_CLASS[cls]
    for mode in _selected(exact, _SHARING_SELECTOR):
        modes = tuple(m for m in modes if m == mode)
    if not any(m in allowed for m in modes):
        return [ClaimProblem(
            Reason.MODE_FORBIDDEN,
            f"{where}: device class {cls} gives {' or '.join(modes) or 'no mode gpupack has'}, which SharingPolicy "
            f"{policy.name!r} does not allow in this namespace (allowed modes: {', '.join(allowed) or 'none'})")]
    if cls != names.MIG_CLASS:
        return []
    return [ClaimProblem(
        ClaimReason.PROFILE_FORBIDDEN,
        f"{where}: MIG profile {profile!r} is not allowed in this namespace by SharingPolicy {policy.name!r} "
        f"(allowed profiles: {', '.join(policy.allowed_profiles)})")
        for profile in _selected(exact, _PROFILE_SELECTOR) if not policy.allows_profile(profile)]


def _selected(exact: Mapping[str, Any], pattern: re.Pattern[str]) -> list[str]:
    """The values a request's CEL selectors compare ``pattern``'s attribute with."""
    found: list[str] = []
    selectors = exact.get("selectors")
    for selector in selectors if isinstance(selectors, list) else []:
        cel = selector.get("cel") if isinstance(selector, Mapping) else None
        expression = cel.get("expression") if isinstance(cel, Mapping) else None
        found += pattern.findall(expression if isinstance(expression, str) else "")
    return found


def _check_request(where: str, exact: Mapping[str, Any], policy: SharePolicy, largest: int | None,
                   profiles: Collection[str], bounds: ClaimBounds) -> list[ClaimProblem]:
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
    problems += _check_count(where, cls, exact, bounds.most_gpus)
    problems += _check_policy(where, cls, exact, bounds.policy)
    for profile in _selected(exact, _PROFILE_SELECTOR):
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
                profiles: Collection[str] = KNOWN_PROFILES,
                bounds: ClaimBounds = ClaimBounds()) -> tuple[ClaimProblem, ...]:
    """Every reason gpupack's devices could never serve a request of this ResourceClaim or template,
    or its namespace may not ask them for it.

    Only requests (``exactly`` and ``firstAvailable`` alternatives) naming one
    of gpupack's DeviceClasses are checked. ``largest_gpu_memory_bytes``: the
    largest GPU of the cluster (``Inventory.max_gpu_memory_mib``); None skips
    the memory bounds. ``profiles``: the MIG profile names the cluster's GPUs
    have (default: every model of ``mig.catalog``). ``bounds``: the count bound
    of whole GPUs and the namespace's SharingPolicy (:class:`ClaimBounds`): on
    every class the count is bounded (one MIG placement or share per request,
    whole GPUs up to one node's), and the class's mode and a selected MIG profile
    must be allowed in the namespace, as the webhook would have decided for a pod
    of it. An empty tuple: admit.
    """
    problems: list[ClaimProblem] = []
    for where, exact in _specs(obj):
        problems += _check_request(where, exact, policy, largest_gpu_memory_bytes, profiles, bounds)
    return tuple(problems)
