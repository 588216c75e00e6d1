"""What the demo shows: counts, per-GPU layouts and the allocation figures, from the API server.

Everything here reads the cluster through plain list calls and pure helpers
(``controller.state.build``/``controller.metrics``), so what it reports is what
``kubectl`` would show, not what the demo believes it did.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from controller.planning.draplan import dra_nodes
from controller.state.dra_usage import read_usage
from controller.metrics import cluster_figures
from controller.state.build import build_snapshot
from kube.times import parse_time
from sharing.api.allocation import Allocation, AllocationError, has_capacity_gate
from sharing.api.keys import ALLOCATION_ANNOTATION
from sharing.dra.names import DRIVER
from sharing.packing.specs import GPU_MILLI


@dataclass
class ClaimCounter:
    """The DRA demo's ``claims_allocated``: distinct ResourceClaims (by UID) with a device of gpupack's
    driver seen allocated. A claim is deleted with its finished pod, so the count is accumulated
    over every look, not read once at the end."""

    seen: set[str] = field(default_factory=set)

    def observe(self, claims: list[dict[str, Any]]) -> None:
        from node.draplugin.claims import ClaimError, ClaimRef, allocation_from_claim

        for obj in claims:
            meta = obj.get("metadata") or {}
            ref = ClaimRef(str(meta.get("uid") or ""), str(meta.get("namespace") or ""), str(meta.get("name") or ""))
            try:
                devices = allocation_from_claim(obj, ref)
            except ClaimError:
                continue  # not allocated yet (or not readable): not counted
            if any(d.driver == DRIVER for d in devices):
                self.seen.add(ref.uid)

    @property
    def allocated(self) -> int:
        return len(self.seen)


@dataclass
class Tracker:
    """Accumulates what was seen over the run."""

    layouts_seen: dict[tuple[str, int], set[tuple[str, ...]]] = field(default_factory=dict)
    scheduled_at: dict[str, datetime] = field(default_factory=dict)
    created_at: dict[str, datetime] = field(default_factory=dict)
    reshaped_pods: set[str] = field(default_factory=set)

    def observe(self, gpunodes: list[dict[str, Any]], pods: list[dict[str, Any]], now: datetime) -> None:
        for g in gpunodes:
            for gpu in (g.get("status") or {}).get("gpus") or []:
                key = (g["metadata"]["name"], int(gpu.get("index", 0)))
                layout = tuple(sorted(i.get("profile", "?") for i in gpu.get("instances") or [])) if gpu.get("migEnabled") else ("full",)
                self.layouts_seen.setdefault(key, set()).add(layout)
        for p in pods:
            meta = p.get("metadata") or {}
            name = meta.get("name", "")
            created = parse_time(meta.get("creationTimestamp"))
            if created is not None:
                self.created_at.setdefault(name, created)
            allocation = _allocation(p)
            # Every pod is gated under placement: engine; the ones whose capacity had to
            # be created are those the webhook found none for.
            if allocation is not None and not allocation.capacity_existed:
                self.reshaped_pods.add(name)
            if (p.get("spec") or {}).get("nodeName") and name not in self.scheduled_at:
                self.scheduled_at[name] = now

    @property
    def gpus_reshaped(self) -> int:
        """GPUs whose layout changed at least once while the demo watched."""
        return sum(1 for seen in self.layouts_seen.values() if len(seen) > 1)

    def latencies(self, gated: bool) -> list[float]:
        out = []
        for name, at in self.scheduled_at.items():
            if (name in self.reshaped_pods) == gated and name in self.created_at:
                out.append(max(0.0, (at - self.created_at[name]).total_seconds()))
        return sorted(out)


def _allocation(pod: dict[str, Any]) -> Allocation | None:
    try:
        return Allocation.from_annotation(((pod.get("metadata") or {}).get("annotations") or {}).get(ALLOCATION_ANNOTATION))
    except AllocationError:
        return None


def counts(pods: list[dict[str, Any]]) -> Counter[str]:
    c: Counter[str] = Counter()
    for p in pods:
        if _allocation(p) is None:
            continue
        c["admitted"] += 1
        spec = p.get("spec") or {}
        if has_capacity_gate(spec):
            c["gated"] += 1
        elif spec.get("nodeName"):
            c["scheduled"] += 1
        else:
            c["pending"] += 1
    return c


@dataclass(frozen=True)
class Figures:
    allocation_ratio: float
    """GPU milli the scheduled pods asked for over GPUs x 1000: the simulator's accounting."""
    occupied_ratio: float
    """What their replicas and MIG instances reserve over all GPUs (``controller.metrics``)."""
    fragmentation: float


def figures(gpunodes: list[dict[str, Any]], nodes: list[dict[str, Any]], pods: list[dict[str, Any]],
            claims: list[dict[str, Any]] | None = None) -> Figures:
    """``claims``: the ResourceClaims, on a DRA node pool (what each GPU holds is theirs to say)."""
    snapshot = build_snapshot(gpunodes, nodes, pods, [])
    holds = read_usage(claims, dra_nodes(snapshot), snapshot.pods).holds if claims else ()
    occupied, frag, gpus = cluster_figures(snapshot, holds)
    # The webhook replaces gpupack.io/gpu-milli with the device plugin's resource and
    # keeps the ask in the allocation annotation, which pod_from_object reads into
    # Pod.milli (one entry per container; 1000 = a whole GPU). Only bound pods count,
    # as in the simulator, where a pod allocates once it is placed.
    asked = sum(sum(p.milli) for p in snapshot.pods if p.bound)
    return Figures(asked / (gpus * GPU_MILLI) if gpus else 0.0, occupied, frag)


def gpu_lines(gpunodes: list[dict[str, Any]]) -> list[str]:
    lines = []
    for g in sorted(gpunodes, key=lambda o: o["metadata"]["name"]):
        status = g.get("status") or {}
        sharing = status.get("sharing") or (g.get("spec") or {}).get("sharing") or {}
        cells = []
        for gpu in status.get("gpus") or []:
            if gpu.get("migEnabled"):
                inst = gpu.get("instances") or []
                used = sum(1 for i in inst if i.get("inUse"))
                names = Counter(i.get("profile", "?") for i in inst)
                body = "+".join(f"{n}x{p}" if n > 1 else p for p, n in sorted(names.items())) or "empty"
                cells.append(f"[{body} {used}/{len(inst)}]")
            else:
                mode = sharing.get("mode", "none")
                cells.append(f"[{mode} x{sharing.get('replicas', 1)}]" if mode != "none" else "[full]")
        lines.append(f"  {g['metadata']['name']:8} " + " ".join(cells))
    return lines


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]
