"""One reading of a ``GPUNode`` object for every component that reads one.

The webhook's inventory (``sharing.admission.inventory``) and the controller's snapshot
(``controller.state.build``) both build their own view of a node from what this
returns, so the same object reads the same way in both. Lenient by design: the
agent is the only writer of a GPUNode's status and the API server validates it
against the CRD, but one odd entry must not take a node, or the front door,
down. The rules, applied alike everywhere:

* a GPU entry that is not an object, or has no non-negative integer ``index``,
  is left out (and said so in ``skipped``): its position in the list is no index;
* an instance entry without a profile name, or whose ``start`` is not an
  integer, is left out the same way;
* an instance is in use when the agent says ``inUse`` or lists pods on it;
* a GPU that does not report its memory gets its product's catalog figure;
* sharing is what the status reports, else what the spec asks;
* a ``layoutRefusal`` that does not validate is no refusal;
* a ``health`` entry (a fault of the GPU or of one instance) that does not validate still
  makes the device unhealthy (the safe reading), with the reason ``Unreadable``; a node is
  degraded when the agent says so or when any fault is not withdrawn by the device plugin;
* a mig-parted config the agent asks to have published (operator mode) counts only
  under one of its own node's names (``gpupack-<node>-g<n>``) and with entries in
  mig-parted's format; anything else is left out (and said so in ``skipped``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any

from pydantic import ValidationError

from mig.catalog import find_model
from mig.migparted import MigConfigEntry, MigPartedConfig
from mig.model import GpuModel
from sharing.api.crd import DeviceHealth, LayoutRefusal
from sharing.api.keys import is_mig_config_of, per_node_name
from sharing.api.fields import as_int as _int
from sharing.api.fields import as_list as _list
from sharing.api.fields import as_map as _map
from sharing.api.fields import is_int as _is_int
from sharing.api.modes import NodeSharingMode


@dataclass(frozen=True)
class InstanceReading:
    profile: str
    start: int
    size: int
    in_use: bool
    health: DeviceHealth | None = None
    """The instance's fault while it lasts (None: healthy)."""
    pods: tuple[str, ...] = ()
    """``namespace/name`` of the pods the agent found using it (the kubelet's device assignments)."""

    @property
    def healthy(self) -> bool:
        return self.health is None


@dataclass(frozen=True)
class GpuReading:
    index: int
    memory_mib: int
    mig_enabled: bool
    instances: tuple[InstanceReading, ...]
    gpu_percent: int | None
    """Latest utilisation sample, when NVML gave one."""
    layout_refusal: LayoutRefusal | None = None
    """The agent gave up on this GPU's requested layout (for the generation it names);
    an answer that does not validate is no answer."""
    health: DeviceHealth | None = None
    """The GPU's fault while it lasts (None: healthy)."""

    @property
    def healthy(self) -> bool:
        return self.health is None

    @property
    def faulted(self) -> bool:
        """The GPU or one of its instances has a fault: no layout change, no sharing switch."""
        return self.health is not None or any(i.health is not None for i in self.instances)


@dataclass(frozen=True)
class SharingReading:
    mode: NodeSharingMode
    replicas: int
    in_use: int
    """Replicas handed out, when the agent reports it (0 if unknown)."""


@dataclass(frozen=True)
class MigConfigRequest:
    """A mig-parted config a node's agent asks the controller to publish into mig-manager's ConfigMap."""

    name: str
    """One of the node's own names (``sharing.api.keys.mig_config_name``)."""
    entries: tuple[MigConfigEntry, ...]


@dataclass(frozen=True)
class GpuNodeReading:
    name: str
    generation: int
    observed_generation: int
    product: str
    model: GpuModel | None
    gpus: tuple[GpuReading, ...]
    """By index."""
    sharing: SharingReading
    """What the status reports, else what the spec asks."""
    spec_sharing: SharingReading
    skipped: tuple[str, ...] = ()
    """One line per entry left out."""
    heartbeat: str | None = None
    """``status.heartbeatTime`` as written (RFC 3339; ``kube.times.parse_time`` reads it): when
    the agent last wrote the status. None from agents that do not write one."""
    mig_config_request: MigConfigRequest | None = None
    """Operator mode: the config the agent waits to see published (a reconfiguration Applying)."""
    degraded: bool = False
    """A fault the device plugin keeps advertising: no new gpupack pod may go to this node."""


def read_gpunode(obj: Mapping[str, Any]) -> GpuNodeReading | None:
    """The node in ``obj`` (a GPUNode dict), or None when it has no name."""
    meta, spec, status = _map(obj.get("metadata")), _map(obj.get("spec")), _map(obj.get("status"))
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        return None
    skipped: list[str] = []
    reported_product = status.get("product")
    product: str = reported_product if isinstance(reported_product, str) else ""
    gpus: list[GpuReading] = []
    for position, raw in enumerate(_list(status.get("gpus"))):
        gpu = _map(raw)
        index = gpu.get("index")
        if not isinstance(raw, Mapping) or not _is_int(index) or index < 0:
            what = "is not an object" if not isinstance(raw, Mapping) else "has no index"
            skipped.append(f"{name}: status.gpus[{position}] {what}; left out")
            continue
        gpu_product = gpu.get("product")
        product = product or (gpu_product if isinstance(gpu_product, str) else "")
        percent = _map(gpu.get("utilization")).get("gpuPercent")
        gpus.append(GpuReading(
            index=index,
            memory_mib=_int(gpu.get("memoryMiB")),
            mig_enabled=gpu.get("migEnabled") is True,
            instances=_instances(gpu.get("instances"), f"{name}: GPU {index}", skipped),
            gpu_percent=percent if _is_int(percent) else None,
            layout_refusal=_refusal(gpu.get("layoutRefusal")),
            health=_health(gpu.get("health")),
        ))
    model = find_model(product) if product else None
    if model is not None:
        gpus = [g if g.memory_mib else replace(g, memory_mib=model.memory_mib) for g in gpus]
    spec_sharing = _sharing(_map(spec.get("sharing")), 0)
    reported = status.get("sharing")
    sharing = _sharing(_map(reported), _int(_map(reported).get("inUse"))) if isinstance(reported, Mapping) else spec_sharing
    generation = _int(meta.get("generation"))
    heartbeat = status.get("heartbeatTime")
    request = _mig_config_request(name, status.get("reconfiguration"), skipped)
    faults = [h for g in gpus for h in (g.health, *(i.health for i in g.instances)) if h is not None]
    degraded = _map(status.get("summary")).get("degraded") is True or any(not h.withdrawn for h in faults)
    return GpuNodeReading(
        name=name,
        generation=generation,
        observed_generation=_int(status.get("observedGeneration"), generation),
        product=product,
        model=model,
        gpus=tuple(sorted(gpus, key=lambda g: g.index)),
        sharing=sharing,
        spec_sharing=spec_sharing,
        skipped=tuple(skipped),
        heartbeat=heartbeat if isinstance(heartbeat, str) else None,
        mig_config_request=request,
        degraded=degraded,
    )


def _instances(raw: Any, where: str, skipped: list[str]) -> tuple[InstanceReading, ...]:
    out = []
    for position, entry in enumerate(_list(raw)):
        inst = _map(entry)
        profile, start = inst.get("profile"), inst.get("start", 0)
        if not isinstance(profile, str) or not profile or not _is_int(start):
            skipped.append(f"{where}: instances[{position}] has no profile or start; left out")
            continue
        in_use = inst.get("inUse") is True or bool(_list(inst.get("pods")))
        users = tuple(sorted(str(p) for p in _list(inst.get("pods")) if isinstance(p, str)))
        out.append(InstanceReading(profile, start, max(1, _int(inst.get("size"), 1)), in_use,
                                   _health(inst.get("health")), users))
    return tuple(sorted(out, key=lambda i: (i.start, i.profile)))


def _mig_config_request(node: str, raw: Any, skipped: list[str]) -> MigConfigRequest | None:
    reconf = _map(raw)
    if reconf.get("mode") != "operator" or reconf.get("phase") != "Applying" or "migConfigEntries" not in reconf:
        return None
    name = reconf.get("migConfig")
    if not isinstance(name, str) or not is_mig_config_of(node, name):
        skipped.append(f"{node}: status.reconfiguration.migConfig {name!r} is not one of this node's config names "
                       f"({per_node_name(node)}-g<generation>); not published")
        return None
    try:
        config = MigPartedConfig.model_validate({"version": "v1", "mig-configs": {name: reconf["migConfigEntries"]}})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"][2:])
        skipped.append(f"{node}: status.reconfiguration.migConfigEntries are not mig-parted entries "
                       f"({where}: {first['msg']}); not published")
        return None
    return MigConfigRequest(name, config.mig_configs[name])


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _health(raw: Any) -> DeviceHealth | None:
    if raw is None:
        return None
    try:
        return DeviceHealth.model_validate(raw)
    except ValidationError as exc:
        # Unreadable is not healthy: the device gets no work until the agent writes a valid entry.
        return DeviceHealth(reason="Unreadable", message=f"health entry does not validate: {exc.errors()[0]['msg']}"[:1024],
                            since=_EPOCH, recovery="Acknowledge")


def _refusal(raw: Any) -> LayoutRefusal | None:
    if raw is None:
        return None
    try:
        return LayoutRefusal.model_validate(raw)
    except ValidationError:
        return None


def _sharing(raw: Mapping[str, Any], in_use: int) -> SharingReading:
    mode = raw.get("mode")
    return SharingReading(
        mode=mode if mode in ("mps", "time-slicing") else "none",
        replicas=max(1, _int(raw.get("replicas"), 1)),
        in_use=max(0, in_use),
    )
