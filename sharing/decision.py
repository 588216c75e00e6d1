"""Mode choice and per-container decision: what a gpupack request becomes.

Given a :class:`~sharing.request.PodRequest`, the namespace's
:class:`~sharing.inventory.Policy` and the cluster :class:`~sharing.inventory.Inventory`,
:func:`decide` returns a :class:`PodDecision`: one mode for the whole pod (the
device plugin's sharing config is node-wide and all containers of a pod land on
one node, so mixing modes in a pod could never schedule), per container the
resource to request (``nvidia.com/mig-<profile>`` or ``nvidia.com/gpu.shared``)
and MPS limits, the node affinity that keeps the pod on compatible nodes, and
whether the pod waits at the ``gpupack.io/capacity`` gate.

Waste, the measure ``auto`` minimises, is the part of a GPU a container is
given but did not ask for, in GPU fractions: compute (granted share minus
``milli/1000``) plus memory (granted memory minus asked, over the GPU's memory;
0 when the container gave no memory figure). Ties go to the stronger isolation:
MIG, then MPS, then time-slicing. An option whose capacity exists now always
beats one that would have to wait at the gate.

Shared (MPS/time-sliced) GPUs: a node sharing each GPU into ``r`` replicas gives
a container ``1/r`` of a GPU's compute and memory, so it is compatible when
``r * milli <= 1000`` and ``memory <= gpu_memory / r``. Time-slicing isolates
neither, but gpupack applies the same rule so that ``r`` co-located pods fit.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from mig.model import GpuModel, Profile
from sharing.inventory import Inventory, NodeView, Policy
from sharing.request import (
    MAX_MILLI,
    MODES,
    SHARING_ANNOTATION,
    AdmissionRefusal,
    ContainerKind,
    ContainerRequest,
    Mode,
    PodRequest,
    Reason,
)

SHARED_RESOURCE: Final = "nvidia.com/gpu.shared"
GATE: Final = "gpupack.io/capacity"
ALLOCATION_ANNOTATION: Final = "gpupack.io/allocation"
ALLOCATION_VERSION: Final = "v1"
# GPU feature discovery labels (nvidia.com/*) the affinity selects on.
PRODUCT_LABEL: Final = "nvidia.com/gpu.product"
STRATEGY_LABEL: Final = "nvidia.com/gpu.sharing-strategy"
REPLICAS_LABEL: Final = "nvidia.com/gpu.replicas"
MPS_THREADS_ENV: Final = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
MPS_MEMORY_ENV: Final = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
_RANK: Final[dict[str, int]] = {"mig": 0, "mps": 1, "time-slicing": 2}
_GIB: Final = 1024**3
_MIB: Final = 1024**2


@dataclass(frozen=True)
class Expression:
    key: str
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"key": self.key, "operator": self.operator}
        if self.values:
            out["values"] = list(self.values)
        return out


Term = tuple[Expression, ...]
"""Expressions ANDed; a pod's terms are ORed (Kubernetes nodeSelectorTerms)."""


@dataclass(frozen=True)
class ContainerDecision:
    kind: ContainerKind
    index: int
    name: str
    milli: int
    memory_bytes: int | None
    resource: str
    profile: str | None = None
    env: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class PodDecision:
    mode: Mode
    containers: tuple[ContainerDecision, ...]
    terms: tuple[Term, ...]
    gated: bool
    reason: str
    policy: str
    gpu_model: str | None = None
    replicas: int | None = None

    def annotation(self) -> dict[str, Any]:
        """The ``gpupack.io/allocation`` record (documented in docs/webhook.md)."""
        out: dict[str, Any] = {
            "version": ALLOCATION_VERSION,
            "mode": self.mode,
            "gated": self.gated,
            "policy": self.policy,
            "reason": self.reason,
        }
        if self.gpu_model is not None:
            out["gpuModel"] = self.gpu_model
        if self.replicas is not None:
            out["replicas"] = self.replicas
        out["containers"] = [
            {
                "name": c.name,
                "kind": c.kind,
                "milli": c.milli,
                **({"memoryBytes": c.memory_bytes} if c.memory_bytes is not None else {}),
                "resource": c.resource,
                **({"profile": c.profile} if c.profile else {}),
            }
            for c in self.containers
        ]
        return out


@dataclass(frozen=True)
class _Option:
    mode: Mode
    waste: float
    has_capacity: bool
    terms: tuple[Term, ...]
    profiles: tuple[Profile, ...] = ()
    model: GpuModel | None = None
    replicas: int | None = None
    why: str = ""


def _fmt_bytes(n: int) -> str:
    return f"{n / _GIB:.4g}Gi" if n >= _GIB else f"{n / _MIB:.4g}Mi"


# --- MIG ----------------------------------------------------------------------


def profile_waste(model: GpuModel, profile: Profile, milli: int, memory: int | None) -> float:
    compute = profile.compute_slices / model.compute_slices - milli / MAX_MILLI
    mem = 0.0 if memory is None else (profile.memory_bytes - memory) / (model.memory_mib * _MIB)
    return compute + mem


def covering_profile(model: GpuModel, milli: int, memory: int | None, policy: Policy) -> Profile | None:
    """The least-waste profile of ``model`` covering the ask that ``policy`` allows.

    Media-extension (``+me``) profiles are never chosen: they exist once per GPU
    and only matter to pods that ask for the media engines, which this request
    API cannot express.
    """
    best: Profile | None = None
    best_key: tuple[float, int] = (math.inf, 0)
    for profile in model.profiles:
        if profile.media_extensions or not policy.allows_profile(profile.name):
            continue
        # Integer test: compute_slices / compute_total >= milli / 1000.
        if profile.compute_slices * MAX_MILLI < milli * model.compute_slices:
            continue
        if memory is not None and profile.memory_bytes < memory:
            continue
        key = (profile_waste(model, profile, milli, memory), profile.memory_slices)
        if key < best_key:
            best, best_key = profile, key
    return best


Role = Literal["app", "sidecar", "init"]


def role(c: ContainerRequest) -> Role:
    if c.kind == "containers":
        return "app"
    return "sidecar" if c.sidecar else "init"


def peak_devices(names: Sequence[str], roles: Sequence[Role]) -> dict[str, int]:
    """Devices of each resource a pod holds at its peak, counted as the scheduler
    counts them: app containers and sidecars add up; a plain init container runs
    alone beside the sidecars (counted as if all had started), and the kubelet
    hands its device on afterwards."""
    together = Counter(n for n, r in zip(names, roles) if r != "init")
    sidecars = Counter(n for n, r in zip(names, roles) if r == "sidecar")
    peak = dict(together)
    for name, r in zip(names, roles):
        if r == "init":
            peak[name] = max(peak.get(name, 0), 1 + sidecars.get(name, 0))
    return peak


def _mig_option(
    asks: list[tuple[int, int | None]], roles: tuple[Role, ...], policy: Policy, inventory: Inventory
) -> _Option | str:
    options: list[_Option] = []
    failures: list[str] = []
    models = inventory.mig_models
    for model in models:
        profiles: list[Profile] = []
        for milli, memory in asks:
            profile = covering_profile(model, milli, memory, policy)
            if profile is None:
                failures.append(
                    f"{model.product}: no profile{' allowed by the policy' if policy.allowed_profiles else ''} "
                    f"covers milli={milli}" + (f", memory={_fmt_bytes(memory)}" if memory is not None else "")
                )
                break
            profiles.append(profile)
        else:
            need = peak_devices([p.name for p in profiles], roles)
            capacity = any(
                node.model is model and all(node.free_instances(name) >= n for name, n in need.items())
                for node in inventory.nodes
            )
            waste = sum(profile_waste(model, p, m, mem) for p, (m, mem) in zip(profiles, asks))
            # Any product with the same profile names can host the pod: the name
            # fixes compute and memory slices, and the resource name is the same.
            products = sorted(
                m.product for m in models if all(m.has_profile(p.name) for p in profiles)
            )
            terms = ((Expression(PRODUCT_LABEL, "In", tuple(products)),),)
            options.append(_Option("mig", waste, capacity, terms, tuple(profiles), model))
    if not options:
        if not models:
            return "the cluster has no MIG-capable GPUs"
        return "; ".join(failures)
    return min(options, key=lambda o: (not o.has_capacity, o.waste, o.model.product if o.model else ""))


# --- MPS and time-slicing ------------------------------------------------------


def _shared_option(
    mode: Literal["mps", "time-slicing"],
    asks: list[tuple[int, int | None]],
    roles: tuple[Role, ...],
    inventory: Inventory,
) -> _Option:
    compatible: list[tuple[float, NodeView]] = []
    for node in inventory.shared_nodes(mode):
        r, gpu_bytes = node.replicas, node.gpu_memory_mib * _MIB
        if gpu_bytes == 0:
            continue
        if all(r * milli <= MAX_MILLI and (mem is None or mem * r <= gpu_bytes) for milli, mem in asks):
            waste = sum(
                (1 / r - milli / MAX_MILLI) + (0.0 if mem is None else 1 / r - mem / gpu_bytes) for milli, mem in asks
            )
            compatible.append((waste, node))
    if not compatible:
        # No node shares GPUs this way (or none finely enough) yet: the pod
        # waits at the gate; the controller narrows the affinity once it has
        # shared a node to fit.
        return _Option(
            mode,
            math.inf,
            False,
            ((Expression(STRATEGY_LABEL, "In", (mode,)),),),
            why=f"no node shares GPUs by {mode} into replicas that fit",
        )
    replicas_needed = peak_devices([SHARED_RESOURCE] * len(asks), roles)[SHARED_RESOURCE]
    with_room = [(w, n) for w, n in compatible if n.shared_free >= replicas_needed]
    pool = with_room or compatible
    waste, best = min(pool, key=lambda wn: (wn[0], wn[1].name))
    pairs = sorted({(n.product, n.replicas) for _, n in pool})
    terms = tuple(
        (
            Expression(STRATEGY_LABEL, "In", (mode,)),
            Expression(REPLICAS_LABEL, "In", (str(r),)),
            *((Expression(PRODUCT_LABEL, "In", (p,)),) if p else ()),
        )
        for p, r in pairs
    )
    return _Option(mode, waste, bool(with_room), terms, replicas=best.replicas)


# --- the decision --------------------------------------------------------------


def _mps_env(milli: int, memory: int | None) -> tuple[tuple[str, str], ...]:
    # The device plugin already caps each replica at 1/r of the GPU; these
    # per-client limits narrow that to what the container asked for.
    env = [(MPS_THREADS_ENV, str(max(1, math.ceil(milli / 10))))]
    if memory is not None:
        env.append((MPS_MEMORY_ENV, f"0={math.ceil(memory / _MIB)}M"))
    return tuple(env)


def decide(request: PodRequest, policy: Policy, inventory: Inventory) -> PodDecision:
    """Decide one pod; raises :class:`AdmissionRefusal` for a pod to deny."""
    allowed = policy.allowed_modes
    if request.mode != "auto" and request.mode not in allowed:
        raise AdmissionRefusal(
            Reason.MODE_FORBIDDEN,
            f"sharing mode {request.mode!r} ({SHARING_ANNOTATION}) is forbidden in namespace "
            f"{request.namespace!r} by SharingPolicy {policy.name!r}; allowed modes: "
            f"{', '.join(allowed) if allowed else 'none'}",
        )
    if not allowed:
        raise AdmissionRefusal(
            Reason.MODE_FORBIDDEN,
            f"every sharing mode is forbidden in namespace {request.namespace!r}: SharingPolicy "
            f"{policy.name!r} has no namespace rule that selects it (allowed modes: none)",
        )
    asks = [
        (c.milli, c.memory_bytes if c.memory_bytes is not None else policy.default_memory_bytes)
        for c in request.containers
    ]
    largest = inventory.max_gpu_memory_mib * _MIB
    for c, (_, mem) in zip(request.containers, asks):
        if largest and mem is not None and mem > largest:
            raise AdmissionRefusal(
                Reason.MEMORY_TOO_LARGE,
                f"container {c.name!r} asks for {_fmt_bytes(mem)} of GPU memory; the largest GPU in the "
                f"cluster has {_fmt_bytes(largest)}",
            )
    roles = tuple(role(c) for c in request.containers)
    best = _choose(request.mode, tuple(asks), roles, policy, inventory)
    return _materialise(best, request, asks, policy)


_CACHE_LIMIT: Final = 4096


def _choose(
    requested: str,
    asks: tuple[tuple[int, int | None], ...],
    roles: tuple[Role, ...],
    policy: Policy,
    inventory: Inventory,
) -> _Option:
    """The best option, memoised per inventory snapshot: most pods of a cluster ask
    for the same few shapes, and a snapshot never changes once built."""
    key = ("decision", requested, asks, roles, policy)
    cached = inventory.cache.get(key)
    if cached is None:
        try:
            cached = _choose_uncached(requested, list(asks), roles, policy, inventory)
        except AdmissionRefusal as refusal:
            cached = refusal
        if len(inventory.cache) >= _CACHE_LIMIT:
            inventory.cache.clear()
        inventory.cache[key] = cached
    if isinstance(cached, AdmissionRefusal):
        raise AdmissionRefusal(cached.reason, cached.message)
    assert isinstance(cached, _Option)
    return cached


def _choose_uncached(
    requested: str,
    asks: list[tuple[int, int | None]],
    roles: tuple[Role, ...],
    policy: Policy,
    inventory: Inventory,
) -> _Option:
    allowed = policy.allowed_modes
    modes: tuple[Mode, ...] = tuple(m for m in MODES if m == requested or (requested == "auto" and m in allowed))
    options: list[_Option] = []
    failures: list[str] = []
    for mode in modes:
        if mode == "mig":
            mig = _mig_option(asks, roles, policy, inventory)
            if isinstance(mig, str):
                if requested == "mig":
                    raise AdmissionRefusal(
                        Reason.NO_MIG_MODEL, f"no known GPU model can satisfy the mig request: {mig}"
                    )
                failures.append(f"mig: {mig}")
            else:
                options.append(mig)
        else:
            options.append(_shared_option(mode, asks, roles, inventory))
    if requested == "auto":
        # Shared modes with no compatible node are only a fallback when asked
        # for explicitly: auto never gates on a kind of node that does not exist.
        options = [o for o in options if o.mode == "mig" or o.waste != math.inf]
        if not options:
            failures += [f"{m}: no node shares GPUs by {m} into replicas that fit" for m in modes if m != "mig"]
            raise AdmissionRefusal(
                Reason.NO_COMPATIBLE_NODES,
                "no GPU in the cluster can host this request in an allowed mode (" + "; ".join(failures) + ")",
            )
    return min(options, key=lambda o: (not o.has_capacity, o.waste, _RANK[o.mode]))


def _materialise(
    best: _Option, request: PodRequest, asks: list[tuple[int, int | None]], policy: Policy
) -> PodDecision:
    containers: list[ContainerDecision] = []
    for i, (c, (milli, mem)) in enumerate(zip(request.containers, asks)):
        if best.mode == "mig":
            profile = best.profiles[i]
            containers.append(
                ContainerDecision(c.kind, c.index, c.name, milli, mem, profile.resource_name, profile.name)
            )
        else:
            env = _mps_env(milli, mem) if best.mode == "mps" else ()
            containers.append(ContainerDecision(c.kind, c.index, c.name, milli, mem, SHARED_RESOURCE, None, env))
    if best.mode == "mig":
        assert best.model is not None
        where = f"{', '.join(sorted({p.name for p in best.profiles}))} on {best.model.product}"
    else:
        where = f"{best.mode} replicas" + (f" (1/{best.replicas} GPU)" if best.replicas else "")
    reason = (
        f"{request.mode} -> {best.mode}: {where}; "
        + ("capacity available" if best.has_capacity else f"gated on {GATE} until capacity exists")
    )
    return PodDecision(
        mode=best.mode,
        containers=tuple(containers),
        terms=best.terms,
        gated=not best.has_capacity,
        reason=reason,
        policy=policy.name,
        gpu_model=best.model.product if best.model else None,
        replicas=best.replicas,
    )
