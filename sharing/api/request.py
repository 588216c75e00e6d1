"""Request model: what a pod asks of gpupack, parsed and validated.

A container asks for part of a GPU with two extended resources in
``resources.limits`` (see the architecture brief):

* ``gpupack.io/gpu-milli``: compute share, 1..1000 (1000 = one whole GPU);
* ``gpupack.io/gpu-memory``: GPU memory as a Kubernetes quantity (optional).

The pod annotation ``gpupack.io/sharing`` picks the mode (default ``auto``).

This module works on the raw pod dict as the API server sends it (no pydantic:
it runs on every pod create, see ``webhook``), and every refusal is an
:class:`AdmissionRefusal` carrying a machine-readable :class:`Reason` code, so
the webhook can count denials by reason and users get a message naming the
container, the value and the valid choices.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from enum import StrEnum
from typing import Any, Final, Literal

from mig import units
from mig.errors import RequestError
from sharing.api.modes import MODES
from sharing.api.keys import MEMORY_RESOURCE, MILLI_RESOURCE, NVIDIA_PREFIX, OWN_PREFIX, SHARING_ANNOTATION

RESOURCES: Final = (MILLI_RESOURCE, MEMORY_RESOURCE)
MAX_MILLI: Final = 1000

REQUESTED_MODES: Final = ("auto",) + MODES

ContainerKind = Literal["containers", "initContainers"]


class Reason(StrEnum):
    """Why a request was refused (label value of the denial metric)."""

    MALFORMED_POD = "MalformedPod"
    INVALID_QUANTITY = "InvalidQuantity"
    MILLI_OUT_OF_RANGE = "MilliOutOfRange"
    MISSING_MILLI = "MissingMilli"
    UNKNOWN_RESOURCE = "UnknownResource"
    MIXED_RESOURCES = "MixedResources"
    REQUESTS_LIMITS_MISMATCH = "RequestsLimitsMismatch"
    EPHEMERAL_CONTAINER = "EphemeralContainer"
    UNKNOWN_MODE = "UnknownMode"
    MODE_FORBIDDEN = "ModeForbidden"
    MEMORY_TOO_LARGE = "MemoryTooLarge"
    NO_MIG_MODEL = "NoMigModel"
    NO_COMPATIBLE_NODES = "NoCompatibleNodes"
    INVENTORY_NOT_SYNCED = "InventoryNotSynced"
    FORGED_ALLOCATION = "ForgedAllocation"
    POD_NEVER_FITS = "PodNeverFits"


class AdmissionRefusal(ValueError):
    """A pod gpupack must not admit; ``str()`` is the message shown to the user."""

    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


# --- quantities -------------------------------------------------------------

def parse_quantity(value: object, *, what: str) -> Decimal:
    """A Kubernetes quantity (``250m``, ``1e3``, ``20Gi``, ``7``) as an exact Decimal.

    ``mig.units.parse_quantity`` does the parsing; this names ``what`` and turns a
    bad value into ``AdmissionRefusal(INVALID_QUANTITY)``.
    """
    try:
        return units.parse_quantity(value)
    except RequestError as exc:
        raise AdmissionRefusal(Reason.INVALID_QUANTITY, f"{what}: {exc}") from None


def parse_milli(value: object, *, container: str) -> int:
    """``gpupack.io/gpu-milli`` as an integer in 1..1000."""
    what = f"container {container!r}: {MILLI_RESOURCE}"
    quantity = parse_quantity(value, what=what)
    if quantity != quantity.to_integral_value():
        raise AdmissionRefusal(
            Reason.MILLI_OUT_OF_RANGE,
            f"{what}={value!r} is not a whole number; it counts thousandths of a GPU, "
            f"so ask for an integer in 1..{MAX_MILLI} (e.g. 250 for a quarter GPU)",
        )
    milli = int(quantity)
    if not 1 <= milli <= MAX_MILLI:
        raise AdmissionRefusal(
            Reason.MILLI_OUT_OF_RANGE,
            f"{what}={value!r} is outside 1..{MAX_MILLI} (1000 = one whole GPU; "
            f"for more than one GPU ask for nvidia.com/gpu instead)",
        )
    return milli


def parse_memory(value: object, *, container: str) -> int:
    """``gpupack.io/gpu-memory`` in bytes (positive, whole bytes)."""
    what = f"container {container!r}: {MEMORY_RESOURCE}"
    quantity = parse_quantity(value, what=what)
    if quantity <= 0 or quantity != quantity.to_integral_value():
        raise AdmissionRefusal(
            Reason.INVALID_QUANTITY, f"{what}={value!r} must be a positive whole number of bytes such as '20Gi'"
        )
    return int(quantity)


# --- the request model -------------------------------------------------------


@dataclass(frozen=True)
class ContainerRequest:
    """One container's ask: where it sits in the pod spec and how much it wants."""

    kind: ContainerKind
    index: int
    name: str
    milli: int
    memory_bytes: int | None
    """``None`` when the container did not ask; the policy's default or the mode fills it."""
    sidecar: bool = False
    """An init container with ``restartPolicy: Always``: it keeps running beside the app containers."""
    predicted_milli: int | None = None
    """Right-sized from its workload's recommendation (``sharing.admission.right_sizing``): the compute
    it is predicted to use (a duty cycle, not a share of the SMs), while ``milli`` is what shared
    placement counts (``sharing.rules.right_sizing.accounted_milli``). None: not right-sized."""

    @property
    def concurrent(self) -> bool:
        """Holds its device while the app containers run (app containers and sidecars)."""
        return self.kind == "containers" or self.sidecar


@dataclass(frozen=True)
class PodRequest:
    """Every gpupack request of one pod, plus the mode it asked for."""

    namespace: str
    name: str
    mode: Literal["auto", "mig", "mps", "time-slicing"]
    containers: tuple[ContainerRequest, ...]


def _is_gpupack(key: str) -> bool:
    return key.startswith(OWN_PREFIX)


def _is_nvidia(key: str) -> bool:
    return key.startswith(NVIDIA_PREFIX)


def _resource_map(resources: Any, field: str, container: str) -> dict[str, Any]:
    value = resources.get(field) if isinstance(resources, dict) else None
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise AdmissionRefusal(Reason.MALFORMED_POD, f"container {container!r}: resources.{field} must be a map")
    return value


def container_wants_gpupack(container: Any) -> bool:
    """Cheap pre-check: does this container mention any ``gpupack.io/*`` resource?"""
    if not isinstance(container, dict):
        return False
    resources = container.get("resources")
    if not isinstance(resources, dict):
        return False
    for field in ("limits", "requests"):
        value = resources.get(field)
        if isinstance(value, dict) and any(isinstance(k, str) and _is_gpupack(k) for k in value):
            return True
    return False


def pod_wants_gpupack(pod: Any) -> bool:
    """True when any container, init or ephemeral container asks for ``gpupack.io/*``."""
    spec = pod.get("spec") if isinstance(pod, dict) else None
    if not isinstance(spec, dict):
        return False
    for kind in ("containers", "initContainers", "ephemeralContainers"):
        items = spec.get(kind)
        if isinstance(items, list) and any(container_wants_gpupack(c) for c in items):
            return True
    return False


def parse_container(container: dict[str, Any], kind: ContainerKind, index: int) -> ContainerRequest | None:
    """The container's request, ``None`` if it asks nothing of gpupack."""
    name = container.get("name")
    name = name if isinstance(name, str) else f"{kind}[{index}]"
    resources = container.get("resources")
    if resources is not None and not isinstance(resources, dict):
        raise AdmissionRefusal(Reason.MALFORMED_POD, f"container {name!r}: resources must be a map")
    limits = _resource_map(resources, "limits", name)
    requests = _resource_map(resources, "requests", name)
    ours = {k for k in (*limits, *requests) if _is_gpupack(k)}
    if not ours:
        return None
    unknown = sorted(ours - set(RESOURCES))
    if unknown:
        raise AdmissionRefusal(
            Reason.UNKNOWN_RESOURCE,
            f"container {name!r}: unknown resource {unknown[0]!r}; valid gpupack resources: {', '.join(RESOURCES)}",
        )
    nvidia = sorted(k for k in (*limits, *requests) if _is_nvidia(k))
    if nvidia:
        raise AdmissionRefusal(
            Reason.MIXED_RESOURCES,
            f"container {name!r} asks for both gpupack.io/* and {nvidia[0]}; a container gets either "
            f"part of a GPU (gpupack.io/gpu-milli, gpupack.io/gpu-memory) or whole/MIG GPUs (nvidia.com/*), not both",
        )
    for key in sorted(ours):
        if key not in limits:
            raise AdmissionRefusal(
                Reason.REQUESTS_LIMITS_MISMATCH,
                f"container {name!r}: {key} is in resources.requests but not in resources.limits; "
                f"GPU resources must be set in limits (requests, if given, must equal limits)",
            )
        if key in requests and requests[key] != limits[key]:
            if parse_quantity(requests[key], what=f"container {name!r}: requests {key}") != parse_quantity(
                limits[key], what=f"container {name!r}: limits {key}"
            ):
                raise AdmissionRefusal(
                    Reason.REQUESTS_LIMITS_MISMATCH,
                    f"container {name!r}: {key} requests ({requests[key]}) differ from limits ({limits[key]}); "
                    f"GPU resources cannot be overcommitted, so requests must equal limits",
                )
    if MILLI_RESOURCE not in limits:
        raise AdmissionRefusal(
            Reason.MISSING_MILLI,
            f"container {name!r} sets {MEMORY_RESOURCE} without {MILLI_RESOURCE}; say how much compute it needs (1..{MAX_MILLI})",
        )
    milli = parse_milli(limits[MILLI_RESOURCE], container=name)
    memory = parse_memory(limits[MEMORY_RESOURCE], container=name) if MEMORY_RESOURCE in limits else None
    sidecar = kind == "initContainers" and container.get("restartPolicy") == "Always"
    return ContainerRequest(kind=kind, index=index, name=name, milli=milli, memory_bytes=memory, sidecar=sidecar)


def parse_mode(pod: dict[str, Any]) -> Literal["auto", "mig", "mps", "time-slicing"]:
    """The ``gpupack.io/sharing`` annotation, validated; ``auto`` when absent."""
    metadata = pod.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, dict) else None
    value = annotations.get(SHARING_ANNOTATION) if isinstance(annotations, dict) else None
    if value is None:
        return "auto"
    if value == "auto":
        return "auto"
    if value == "mig":
        return "mig"
    if value == "mps":
        return "mps"
    if value == "time-slicing":
        return "time-slicing"
    raise AdmissionRefusal(
        Reason.UNKNOWN_MODE,
        f"annotation {SHARING_ANNOTATION}={str(value)[:64]!r} is not a sharing mode; "
        f"valid modes: {', '.join(REQUESTED_MODES)}",
    )


def parse_pod(pod: Any, namespace: str = "") -> PodRequest | None:
    """Every gpupack request of ``pod``; ``None`` if it asks nothing of gpupack.

    Ephemeral containers cannot hold resources in Kubernetes, so a
    ``gpupack.io/*`` request there is refused rather than silently dropped.
    """
    if not isinstance(pod, dict):
        raise AdmissionRefusal(Reason.MALFORMED_POD, "the object is not a Pod")
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        raise AdmissionRefusal(Reason.MALFORMED_POD, "the pod has no spec")
    raw_metadata = pod.get("metadata")
    metadata: dict[str, Any] = raw_metadata if isinstance(raw_metadata, dict) else {}
    found: list[ContainerRequest] = []
    kinds: tuple[ContainerKind, ...] = ("initContainers", "containers")
    for kind in kinds:
        items = spec.get(kind)
        if items is None:
            continue
        if not isinstance(items, list):
            raise AdmissionRefusal(Reason.MALFORMED_POD, f"spec.{kind} must be a list")
        for index, container in enumerate(items):
            if not isinstance(container, dict):
                raise AdmissionRefusal(Reason.MALFORMED_POD, f"spec.{kind}[{index}] must be a map")
            parsed = parse_container(container, kind, index)
            if parsed is not None:
                found.append(parsed)
    ephemeral = spec.get("ephemeralContainers")
    if isinstance(ephemeral, list):
        for index, container in enumerate(ephemeral):
            if container_wants_gpupack(container):
                name = container.get("name", f"ephemeralContainers[{index}]")
                raise AdmissionRefusal(
                    Reason.EPHEMERAL_CONTAINER,
                    f"ephemeral container {name!r} asks for gpupack.io/* resources; "
                    f"ephemeral containers cannot hold resources (they use the pod's)",
                )
    if not found:
        return None
    name = metadata.get("name") or metadata.get("generateName") or ""
    # The review's namespace is authoritative (a pod's own metadata.namespace may
    # be empty on create); policies are looked up by it.
    ns = namespace or metadata.get("namespace") or ""
    return PodRequest(
        namespace=str(ns), name=str(name), mode=parse_mode(pod), containers=tuple(found)
    )
