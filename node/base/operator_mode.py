"""GPU Operator mode: reshape through mig-manager and share through the device plugin's config.

Instead of calling NVML, the agent (1) asks for a mig-parted config for its node in
its GPUNode's status (``status.reconfiguration.migConfigEntries``); the controller, the
only writer of the ConfigMap mig-manager reads, publishes it there
(``controller.writes.mig_configs``), so an agent can never change another node's entry;
(2) once it is published, the agent points the node's ``nvidia.com/mig.config`` label
at it, and (3) follows ``nvidia.com/mig.config.state`` to ``success`` or ``failed``
(with a timeout). mig-manager destroys and recreates *every* instance
of a GPU whose entry changes and does not evict pods, so the config changes only
GPUs that are entirely idle; every other GPU gets an entry equal to its current
layout, which mig-manager leaves alone.

Each request gets a fresh config name (``gpupack-<node>-g<generation>``) because
mig-manager acts on label *changes*; the controller prunes this node's older entries.

Sharing: the per-node device-plugin config (time-slicing or MPS with ``replicas``,
``renameByDefault: true`` so shares are ``nvidia.com/gpu.shared``) is written under
the key ``gpupack-<node>`` of the device plugin's ConfigMap and selected with the
``nvidia.com/device-plugin.config`` label.

The functions here are pure; ``node.layouts.mig_manager`` does the I/O through ``node.base.kube``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import yaml

from mig.migparted import MigConfigEntry
from node.base.snapshot import NodeSnapshot
from sharing.api.keys import MIG_CONFIG_LABEL, MIG_CONFIG_STATE_LABEL, WHOLE_RESOURCE, mig_config_name

HandshakeState = Literal["pending", "success", "failed", "timeout"]


@dataclass(frozen=True)
class NodeMigPlan:
    name: str
    entries: tuple[MigConfigEntry, ...]
    changed: tuple[int, ...]
    """GPU indices whose layout the config changes."""
    held: dict[int, str]
    """GPU index -> why it keeps its current layout although the spec differs."""


def plan_node_config(
    node: str,
    generation: int,
    snapshot: NodeSnapshot,
    desired: Mapping[int, Sequence[str] | None],
    idle_gpus: frozenset[int],
) -> NodeMigPlan:
    """Per-device mig-parted entries: desired layout for idle GPUs, current layout for the rest.

    ``desired[i]`` is a profile multiset, or None for MIG disabled; GPUs missing
    from ``desired`` keep their layout. ``idle_gpus``: GPUs with no instance busy or
    recently busy (mig-manager recreates every instance of a GPU it changes).
    """
    entries: list[MigConfigEntry] = []
    changed: list[int] = []
    held: dict[int, str] = {}
    for gpu in snapshot.gpus:
        index = gpu.info.index
        current: list[str] | None = [i.profile for i in gpu.instances] if gpu.info.mig_enabled else None
        want = desired.get(index, current) if index in desired else current
        differs = (want is None) != (current is None) or (
            want is not None and current is not None and Counter(want) != Counter(current))
        if differs and index not in idle_gpus:
            held[index] = "GPU has instances in use or not idle long enough; mig-manager would recreate them all"
            want = current
        elif differs:
            changed.append(index)
        entries.append(_entry(index, want))
    return NodeMigPlan(mig_config_name(node, generation), tuple(entries), tuple(changed), held)


def _entry(index: int, profiles: Sequence[str] | None) -> MigConfigEntry:
    if profiles is None:
        return MigConfigEntry.model_validate({"devices": [index], "mig-enabled": False})
    return MigConfigEntry.model_validate(
        {"devices": [index], "mig-enabled": True, "mig-devices": dict(sorted(Counter(profiles).items()))})


def handshake_state(labels: Mapping[str, str], config_name: str, waited_s: float, timeout_s: float) -> HandshakeState:
    """Where mig-manager is with ``config_name``, from the Node's labels."""
    if labels.get(MIG_CONFIG_LABEL) == config_name:
        state = labels.get(MIG_CONFIG_STATE_LABEL, "")
        if state == "success":
            return "success"
        if state == "failed":
            return "failed"
    return "timeout" if waited_s >= timeout_s else "pending"


def device_plugin_config(mode: str, replicas: int) -> str:
    """The NVIDIA device plugin's config file (``version: v1``) for a node-wide sharing mode."""
    doc: dict[str, Any] = {"version": "v1", "flags": {"migStrategy": "mixed"}}
    if mode in ("time-slicing", "mps") and replicas > 1:
        key = "timeSlicing" if mode == "time-slicing" else "mps"
        doc["sharing"] = {key: {"renameByDefault": True,
                                "resources": [{"name": WHOLE_RESOURCE, "replicas": replicas}]}}
    return yaml.safe_dump(doc, sort_keys=False)
