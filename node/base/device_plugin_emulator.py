"""SIMULATION ONLY: what the NVIDIA device plugin and GPU feature discovery would advertise.

On nodes backed by the simulated NVML there is no kubelet device plugin, so this
module computes, from the current (simulated) layout and the node's sharing
config, exactly the Node capacity/allocatable and GFD-style labels the real
components would publish, and the agent patches them onto the Node. Everything it
writes is also marked with the label ``gpupack.io/simulated=true``.

Rules followed (NVIDIA device plugin, GPU Operator docs):

* MIG strategy ``mixed``: one resource per profile, ``nvidia.com/mig-<profile>``;
  GPUs with MIG off are ``nvidia.com/gpu``.
* Sharing (time-slicing or MPS, node-wide) applies to ``nvidia.com/gpu`` only
  (gpupack's config lists only that resource; MPS does not work on MIG devices):
  each full GPU becomes ``replicas`` devices, renamed to ``nvidia.com/gpu.shared``
  (``renameByDefault: true``, which gpupack always sets).
* GFD labels: ``nvidia.com/gpu.count``/``.product``/``.memory``/``.replicas``/
  ``.sharing-strategy``, ``nvidia.com/mig.capable``, ``nvidia.com/mig.strategy``,
  and per profile ``nvidia.com/mig-<profile>.count``/``.memory``/``.slices.gi``/``.slices.ci``.
* While ``nvidia.com/gpu.deploy.device-plugin=false`` (mig-manager's and gpupack's
  pause) the plugin is gone: allocatable of every ``nvidia.com/*`` resource is 0.
* A resource that is no longer advertised stays on the Node with 0, as the kubelet
  leaves stale extended resources.
* A device the plugin reports unhealthy (``withheld``, see ``node.health.plugin``)
  stays in capacity and leaves allocatable, as the kubelet counts it: a MIG
  instance is one of its profile, a whole GPU one ``nvidia.com/gpu``, a shared GPU
  all its replicas. A lost GPU is not enumerated at all.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from node.base.snapshot import NodeSnapshot
from sharing.api.keys import (
    DEPLOY_DEVICE_PLUGIN_LABEL,
    NVIDIA_PREFIX,
    PRODUCT_LABEL,
    REPLICAS_LABEL,
    SHARED_RESOURCE,
    SIMULATED_LABEL,
    STRATEGY_LABEL,
    WHOLE_RESOURCE,
    mig_resource,
)

RESOURCE_PREFIXES = (NVIDIA_PREFIX,)
_GFD_LABEL_PREFIXES = ("nvidia.com/gpu.", "nvidia.com/mig-", "nvidia.com/mig.capable", "nvidia.com/mig.strategy")
# Labels under GFD's prefixes that other components own (the GPU Operator's deploy switches).
_FOREIGN_PREFIX = "nvidia.com/gpu.deploy."


@dataclass(frozen=True)
class Advertisement:
    resources: dict[str, int]
    labels: dict[str, str]
    unhealthy: dict[str, int] = field(default_factory=dict)
    """Devices per resource in capacity but not allocatable (the plugin reports them unhealthy)."""


def advertise(snapshot: NodeSnapshot, sharing_mode: str, replicas: int,
              withheld: frozenset[str] = frozenset()) -> Advertisement:
    resources: Counter[str] = Counter()
    unhealthy: Counter[str] = Counter()
    labels: dict[str, str] = {SIMULATED_LABEL: "true"}
    full = [g for g in snapshot.gpus if not g.info.mig_enabled and g.error is None]
    mig = [g for g in snapshot.gpus if g.info.mig_enabled and g.error is None]
    shared = sharing_mode in ("time-slicing", "mps") and replicas > 1
    if full:
        withheld_full = sum(1 for g in full if g.info.uuid in withheld)
        if shared:
            resources[SHARED_RESOURCE] += len(full) * replicas
            unhealthy[SHARED_RESOURCE] += withheld_full * replicas
        else:
            resources[WHOLE_RESOURCE] += len(full)
            unhealthy[WHOLE_RESOURCE] += withheld_full
    profile_info: dict[str, tuple[int, int, int]] = {}
    for gpu in mig:
        assert gpu.model is not None
        for inst in gpu.instances:
            resources[mig_resource(inst.profile)] += 1
            unhealthy[mig_resource(inst.profile)] += inst.uuid in withheld
            prof = gpu.model.profile(inst.profile) if gpu.model.has_profile(inst.profile) else None
            if prof is not None:
                profile_info[inst.profile] = (prof.memory_mib, prof.compute_slices, prof.compute_slices)
    if snapshot.gpus:
        first = snapshot.gpus[0]
        labels.update({
            "nvidia.com/gpu.present": "true",
            "nvidia.com/gpu.count": str(len(snapshot.gpus)),
            PRODUCT_LABEL: first.product,
            "nvidia.com/gpu.memory": str(first.info.memory_total_mib),
            REPLICAS_LABEL: str(replicas if shared and full else 1),
            STRATEGY_LABEL: sharing_mode if shared and full else "none",
            "nvidia.com/mig.capable": "true" if any(g.info.mig_capable for g in snapshot.gpus) else "false",
            "nvidia.com/mig.strategy": "mixed",
        })
    for profile, (memory, gi, ci) in sorted(profile_info.items()):
        base = mig_resource(profile)
        labels.update({f"{base}.count": str(resources[base]), f"{base}.memory": str(memory),
                       f"{base}.slices.gi": str(gi), f"{base}.slices.ci": str(ci)})
    return Advertisement(dict(resources), labels, {k: v for k, v in unhealthy.items() if v})


def node_patches(
    adv: Advertisement, node: Mapping[str, Any]
) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(status patch, metadata patch) turning ``node`` into what ``adv`` says; None = no change."""
    labels: Mapping[str, str] = node.get("metadata", {}).get("labels") or {}
    status = node.get("status", {})
    capacity: Mapping[str, str] = status.get("capacity") or {}
    allocatable: Mapping[str, str] = status.get("allocatable") or {}
    paused = labels.get(DEPLOY_DEVICE_PLUGIN_LABEL) == "false"
    want_cap: dict[str, str] = {k: str(v) for k, v in adv.resources.items()}
    for name in capacity:
        if name.startswith(RESOURCE_PREFIXES) and name not in want_cap:
            want_cap[name] = "0"
    want_alloc = {k: ("0" if paused else str(max(0, int(v) - adv.unhealthy.get(k, 0)))) for k, v in want_cap.items()}
    status_patch = None
    if any(capacity.get(k) != v for k, v in want_cap.items()) or any(allocatable.get(k) != v for k, v in want_alloc.items()):
        status_patch = {"status": {"capacity": want_cap, "allocatable": want_alloc}}
    label_patch: dict[str, str | None] = {k: v for k, v in adv.labels.items() if labels.get(k) != v}
    for name in labels:
        if name.startswith(_GFD_LABEL_PREFIXES) and name not in adv.labels and not name.startswith(_FOREIGN_PREFIX):
            label_patch[name] = None  # profile no longer present: GFD drops its labels
    meta_patch = {"metadata": {"labels": label_patch}} if label_patch else None
    return status_patch, meta_patch

