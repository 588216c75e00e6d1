"""The options a request has: which MIG profiles, which shared nodes, at what waste.

For one pod's asks (``(milli, memory)`` per container, and each container's
role), :func:`mig_option` finds the best GPU model and per-container profiles,
and :func:`shared_option` the best MPS or time-sliced nodes; each
:class:`Option` says what it wastes, whether capacity exists now, and the node
affinity terms that keep the pod on compatible nodes. ``sharing.admission.decision``
chooses among them.

Waste is the part of a GPU a container is given but did not ask for, in GPU
fractions: compute (granted share minus ``milli/1000``) plus memory (granted
memory minus asked, over the GPU's memory; 0 when the container gave no memory
figure).

Shared (MPS/time-sliced) GPUs: a node sharing each GPU into ``r`` replicas gives
a container ``1/r`` of a GPU's compute and memory, so it is compatible when
``r * milli <= 1000`` and ``memory <= gpu_memory / r``. Time-slicing isolates
neither, but gpupack applies the same rule so that ``r`` co-located pods fit.

On the DRA node pool (``dra=True``; the inventory is then the pool's,
``Inventory.pool``) there are no replicas: a shared GPU gives each claim the
share it asks, rounded by ``sharing.dra.share_policy.SharePolicy``, so any
share up to a whole GPU fits and waste is only the rounding; ``whole`` is for
containers asking a whole GPU (1000 milli, or more memory than a share may
hold). MIG profiles are chosen as on the device plugin's pool; instances are
created per claim (dynamic MIG), so a MIG-enabled GPU of the model is capacity.
Every DRA option's affinity is the pool's label alone: the claim, not node
labels, says which devices fit, and the packing engine pins it.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from mig.fit import covering_profiles
from mig.model import GpuModel, Profile
from sharing.dra.share_policy import SHARES
from sharing.admission.inventory import Inventory, NodeView, AdmissionPolicy
from sharing.admission.inventory_index import SharedGroup
from sharing.rules.replicas import fits_split, most_replicas, needs_whole_gpu
from sharing.api.modes import AllocationMode
from sharing.api.request import MAX_MILLI, ContainerRequest
from sharing.api.keys import BACKEND_LABEL, PRODUCT_LABEL, REPLICAS_LABEL, SHARED_RESOURCE, STRATEGY_LABEL, WHOLE_RESOURCE

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

DRA_TERMS: Final[tuple[Term, ...]] = ((Expression(BACKEND_LABEL, "In", ("dra",)),),)
"""The affinity of every option on the DRA node pool."""
DRA_SHARES: Final = SHARES
"""How the DRA pool's shared GPUs round a claim (the node agent's default request policy)."""


@dataclass(frozen=True)
class Option:
    mode: AllocationMode
    waste: float
    has_capacity: bool
    terms: tuple[Term, ...]
    profiles: tuple[Profile, ...] = ()
    model: GpuModel | None = None
    replicas: int | None = None
    can_come: bool = True
    """Capacity can exist without a repair: some node the option could use is healthy (MIG: a healthy
    MIG-enabled GPU on a node not degraded, which the controller can reshape; a share: a healthy
    shared GPU on a node not degraded, whose replicas free up). False when every such node is
    degraded or its GPUs unhealthy: a pod decided so would wait for a repair, however idle the
    capacity of another mode (issue 33, item 5). The decision ranks it after has_capacity."""


def option_rank(option: Option) -> tuple[bool, bool, float]:
    """How options of one request compare, best first (the one rule, for ``auto`` and for the MIG
    model choice): capacity that exists now, then capacity that can come without a repair
    (:attr:`Option.can_come`), then least waste."""
    return (not option.has_capacity, not option.can_come, option.waste)


class NoMigOption(Exception):
    """No GPU model of the cluster has profiles (allowed by the policy) covering the request."""

    def __init__(self, reason: str, never_fits: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.never_fits = never_fits
        """True when profiles exist but no node could ever hold the pod's instances at once."""


class NeverFits(Exception):
    """No node of the cluster could hold the pod's devices at once, however it were laid out."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def mig_could_fit(model: GpuModel, need: Mapping[str, int], gpus: int) -> bool:
    """Whether ``gpus`` GPUs of ``model`` could hold ``need`` (profile -> instances at once) in some layout.

    Necessary conditions only: each profile within its per-GPU maximum times the GPUs,
    and all instances' compute slices within the GPUs' total. A pod that fails them can
    never run; one that passes may still wait for capacity.
    """
    if any(n > gpus * model.profile(name).max_count for name, n in need.items()):
        return False
    return sum(n * model.profile(name).compute_slices for name, n in need.items()) <= gpus * model.compute_slices


def fmt_bytes(n: int) -> str:
    return f"{n / _GIB:.4g}Gi" if n >= _GIB else f"{n / _MIB:.4g}Mi"


# --- MIG ----------------------------------------------------------------------


def profile_waste(model: GpuModel, profile: Profile, milli: int, memory: int | None) -> float:
    compute = profile.compute_slices / model.compute_slices - milli / MAX_MILLI
    mem = 0.0 if memory is None else (profile.memory_bytes - memory) / (model.memory_mib * _MIB)
    return compute + mem


def covering_profile(model: GpuModel, milli: int, memory: int | None, policy: AdmissionPolicy) -> Profile | None:
    """The smallest profile of ``model`` covering the ask that ``policy`` allows.

    The order is ``mig.fit``'s (fewest memory slices, then fewest compute slices),
    so the webhook and ``gpupack mig fit`` always agree. Media-extension (``+me``)
    profiles are never chosen: they exist once per GPU and only matter to pods
    that ask for the media engines, which this request API cannot express.
    """
    for profile in covering_profiles(model, milli, memory or 0):
        if not profile.media_extensions and policy.allows_profile(profile.name):
            return profile
    return None


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


def mig_option(
    asks: list[tuple[int, int | None]], roles: tuple[Role, ...], policy: AdmissionPolicy, inventory: Inventory,
    *, dra: bool = False,
) -> Option:
    """The least-waste MIG option (capacity that exists first); :class:`NoMigOption` says why there is none.

    ``dra``: the DRA pool's rules (module docstring): capacity is a node of the model with a
    healthy MIG-enabled GPU, where the claim's instance can be created."""
    options: list[Option] = []
    failures: list[str] = []
    never_fits: list[str] = []
    models = inventory.mig_models
    for model in models:
        profiles: list[Profile] = []
        for milli, memory in asks:
            profile = covering_profile(model, milli, memory, policy)
            if profile is None:
                failures.append(
                    f"{model.product}: no profile{' allowed by the policy' if policy.allowed_profiles else ''} "
                    f"covers milli={milli}" + (f", memory={fmt_bytes(memory)}" if memory is not None else "")
                )
                break
            profiles.append(profile)
        else:
            need = peak_devices([p.name for p in profiles], roles)
            hosts = inventory.index.mig_host_gpus(model.product)
            if not any(mig_could_fit(model, need, gpus) for gpus in hosts):
                asked = ", ".join(f"{n} x {name}" for name, n in sorted(need.items()))
                failures.append(f"{model.product}: the pod holds {asked} at once, more than any node of "
                                f"{max(hosts, default=0)} such GPUs can ever hold")
                never_fits.append(model.product)
                continue
            room = inventory.index.mig_room(model.product)
            capacity = room if dra else inventory.index.mig_free(model.product, need)
            waste = sum(profile_waste(model, p, m, mem) for p, (m, mem) in zip(profiles, asks))
            # Any product with the same profile names can host the pod: the name
            # fixes compute and memory slices, and the resource name is the same.
            products = sorted(
                m.product for m in models if all(m.has_profile(p.name) for p in profiles)
            )
            terms = DRA_TERMS if dra else ((Expression(PRODUCT_LABEL, "In", tuple(products)),),)
            options.append(Option("mig", waste, capacity, terms, tuple(profiles), model, can_come=room))
    if not options:
        raise NoMigOption("it has no MIG-capable GPUs" if not models else "; ".join(failures),
                          never_fits=bool(models) and len(never_fits) == len(failures))
    return min(options, key=lambda o: (*option_rank(o), o.model.product if o.model else ""))


# --- MPS and time-slicing ------------------------------------------------------


def shared_option(
    mode: Literal["mps", "time-slicing"],
    asks: list[tuple[int, int | None]],
    roles: tuple[Role, ...],
    inventory: Inventory,
) -> Option:
    # Node by node, grouped (``sharing.admission.inventory_index``): the nodes of a group fit alike and waste alike.
    compatible: list[tuple[float, SharedGroup]] = []
    for group in inventory.index.shared_groups(mode):
        r, gpu_bytes = group.replicas, group.gpu_memory_mib * _MIB
        if gpu_bytes == 0:
            continue
        if fits_split(r, asks, gpu_bytes):
            waste = sum(
                (1 / r - milli / MAX_MILLI) + (0.0 if mem is None else 1 / r - mem / gpu_bytes) for milli, mem in asks
            )
            compatible.append((waste, group))
    if not compatible:
        # No node shares GPUs this way (or none finely enough) yet: the pod
        # waits at the gate; the controller narrows the affinity once it has
        # shared a node to fit.
        return Option(
            mode,
            math.inf,
            False,
            ((Expression(STRATEGY_LABEL, "In", (mode,)),),),
        )
    replicas_needed = peak_devices([SHARED_RESOURCE] * len(asks), roles)[SHARED_RESOURCE]
    most = max((full * most_replicas(asks, mib * _MIB) for full, mib in inventory.index.full_gpu_shapes), default=0)
    if replicas_needed > most:
        raise NeverFits(f"{mode}: the pod holds {replicas_needed} replicas at once; no node could ever "
                        f"offer more than {most} (its full GPUs, each split as finely as the pod's asks allow)")
    with_room = [(w, g) for w, g in compatible if g.most_free >= replicas_needed]
    pool = with_room or compatible
    # The best node: least waste, then first by name (among the nodes with room, when any has).
    waste = min(w for w, _ in pool)
    tied = [g for w, g in pool if w == waste]
    best = tied[0] if len(tied) == 1 else min(tied, key=lambda g: g.first_name(replicas_needed if with_room else 0))
    pairs = sorted({(g.product, g.replicas) for _, g in pool})
    terms = tuple(
        (
            Expression(STRATEGY_LABEL, "In", (mode,)),
            Expression(REPLICAS_LABEL, "In", (str(r),)),
            *((Expression(PRODUCT_LABEL, "In", (p,)),) if p else ()),
        )
        for p, r in pairs
    )
    # Replicas can free up only on a healthy node (``NodeView.shared_room``); on degraded ones never.
    can_come = any(g.room for _, g in compatible)
    return Option(mode, waste, bool(with_room), terms, replicas=best.replicas, can_come=can_come)


# --- whole GPUs ----------------------------------------------------------------


def wants_whole_gpus(asks: list[tuple[int, int | None]], inventory: Inventory) -> bool:
    """A shared-mode request some container of which no split into two or more replicas holds.

    Such a pod could only get a GPU split into one replica: a whole GPU under another
    resource name, on a node that then cannot take whole-GPU pods. It gets plain whole
    GPUs instead (``sharing.rules.replicas``), where whole-GPU pods go.
    """
    gpu_bytes = inventory.max_gpu_memory_mib * _MIB
    return any(needs_whole_gpu(milli, mem, gpu_bytes) for milli, mem in asks)


def whole_option(
    asks: list[tuple[int, int | None]], roles: tuple[Role, ...], inventory: Inventory, *, dra: bool = False
) -> Option:
    """One ``nvidia.com/gpu`` per container, on a node that does not share its GPUs (``dra``: one
    whole-GPU device per container, on the DRA pool, whose nodes publish them the same way)."""
    gpu_bytes = inventory.max_gpu_memory_mib * _MIB
    waste = sum(
        (1 - milli / MAX_MILLI) + (0.0 if mem is None or not gpu_bytes else 1 - mem / gpu_bytes) for milli, mem in asks
    )
    needed = peak_devices([WHOLE_RESOURCE] * len(asks), roles)[WHOLE_RESOURCE]
    most = inventory.index.most_full_gpus
    if most and needed > most:
        raise NeverFits(f"whole: the pod holds {needed} whole GPUs at once; the largest node has {most}")
    whole_nodes = inventory.index.has_whole_gpu_nodes
    # As for shared modes: with no node of the kind, the option is only a fallback for an
    # explicit mode (the pod waits for an idle shared node to be switched back).
    return Option(
        "whole",
        waste if whole_nodes else math.inf,
        bool(whole_nodes),
        DRA_TERMS if dra else ((Expression(STRATEGY_LABEL, "NotIn", ("mps", "time-slicing")),),),
    )


# --- shares on the DRA node pool -------------------------------------------------


def dra_wants_whole_gpus(asks: list[tuple[int, int | None]], pool: Inventory) -> bool:
    """A container asking a whole GPU's compute, or more memory than a share of the pool's largest
    GPU may hold: it gets a whole-GPU device (the DRA pool's counterpart of :func:`wants_whole_gpus`)."""
    largest = pool.max_gpu_memory_mib * _MIB
    return any(milli >= MAX_MILLI or (largest and mem is not None and DRA_SHARES.consumed_memory(mem) >
                                      DRA_SHARES.max_memory(largest)) for milli, mem in asks)


def dra_shared_option(mode: Literal["mps", "time-slicing"], asks: list[tuple[int, int | None]], pool: Inventory) -> Option:
    """Shares of ``mode`` on the DRA pool's nodes that share GPUs that way: any share fits a GPU,
    so the waste is what rounding to the share unit adds."""
    compatible: list[tuple[float, NodeView]] = []
    too_small: list[str] = []
    for node in pool.nodes:
        gpu_bytes = node.gpu_memory_mib * _MIB
        if node.sharing != mode or not gpu_bytes or not node.full_gpus:
            continue
        if all(DRA_SHARES.serves(gpu_bytes, milli, mem) for milli, mem in asks):
            # All of a pod's shares are on one node: more than its GPUs hold in total can never fit
            # (a necessary condition only, so no pod that some packing would hold is refused).
            gpus = node.full_gpus
            milli_total = sum(DRA_SHARES.consumed_milli(m) for m, _ in asks)
            memory_total = sum(DRA_SHARES.consumed_memory(mem) for _, mem in asks)
            if milli_total > gpus * MAX_MILLI or memory_total > gpus * DRA_SHARES.max_memory(gpu_bytes):
                too_small.append(f"{node.name} shares {gpus} GPU(s), the pod's {len(asks)} shares take "
                                 f"{milli_total} milli and {fmt_bytes(memory_total)}")
                continue
            waste = sum((DRA_SHARES.consumed_milli(milli) - milli) / MAX_MILLI
                        + (0.0 if mem is None else (DRA_SHARES.consumed_memory(mem) - mem) / gpu_bytes)
                        for milli, mem in asks)
            compatible.append((waste, node))
    if not compatible and too_small:
        raise NeverFits(f"{mode}: no node of the DRA pool has GPUs enough for all of the pod's shares at once "
                        f"({'; '.join(too_small[:3])})")
    if not compatible:
        return Option(mode, math.inf, False, DRA_TERMS)
    room = any(not n.degraded and any(not g.mig_enabled and g.healthy for g in n.gpus) for _, n in compatible)
    return Option(mode, min(w for w, _ in compatible), room, DRA_TERMS)
