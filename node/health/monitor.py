"""The node agent's health part: signals in, faults, Events and Node marks out.

Once per tick (:meth:`HealthMonitor.tick`) it reads the backend's fault signals,
lets the :class:`~node.health.tracker.HealthTracker` raise and end faults, and
then acts on them:

* Events: on the GPUNode for every fault that begins or ends, and on every pod
  that was using the failed GPU or instance (the pod-to-device map the agent
  already keeps); application XIDs are reported on the GPUNode and those pods too;
* the device plugin: the devices it withdraws by its own rules
  (``node.health.plugin``) are handed to the advertiser, which the emulator
  withholds from the Node's allocatable; when such a fault ends, the plugin is
  restarted (it never marks a device healthy again by itself);
* the Node: label ``gpupack.io/gpu-degraded=true`` while a fault the plugin keeps
  advertising lasts (gpupack's pods keep off, see ``sharing.admission.decision``), and the
  taint ``gpupack.io/gpu-unhealthy`` (effect from the settings) while every GPU of
  the node is unhealthy.

The XID table is the built-in one with the admin's overrides from the ConfigMap
``gpupack-xid-table`` (re-read every minute); a malformed table is reported (a
condition and an Event naming the entry) and the last good one stays in force.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from kube.errors import KubeError
from node.base import conditions as C
from node.base.context import AgentContext
from node.health.ack import read_acknowledgements
from node.health.plugin import withdrawn_devices
from node.health.signals import read_signals
from node.health.tracker import DeviceKey, Fault, HealthReport, HealthTracker, pods_on
from node.health.xids import XID_TABLE_CONFIGMAP, XID_TABLE_KEY, XidRule, XidTableError, merged, parse_overrides
from node.nvml.protocol import XidEvent
from node.base.snapshot import NodeSnapshot
from sharing.api.crd import DeviceHealth
from sharing.api.keys import DEGRADED_LABEL, UNHEALTHY_TAINT

log = logging.getLogger("gpupack.agent")
GPUS_HEALTHY = "GpusHealthy"
TABLE_REFRESH_SECONDS = 60.0
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute", "none")


class HealthMonitor:
    def __init__(self, taint_effect: str = "NoSchedule") -> None:
        if taint_effect not in TAINT_EFFECTS:
            raise ValueError(f"unhealthy taint effect {taint_effect!r} is not one of {', '.join(TAINT_EFFECTS)}")
        self.taint_effect = taint_effect
        self.tracker = HealthTracker()
        self.table_problem: str | None = None
        self._table_at = -1e18
        self.last: HealthReport = HealthReport({})
        self._restart_pending = False

    # ---------------------------------------------------------------- XID table
    def refresh_table(self, ctx: AgentContext, namespace: str, now: float) -> None:
        if now - self._table_at < TABLE_REFRESH_SECONDS:
            return
        self._table_at = now
        try:
            cm = ctx.kube.get_configmap(namespace, XID_TABLE_CONFIGMAP)
        except KubeError as exc:
            log.debug("XID table ConfigMap unreadable (%s); the table in force stays", exc)
            return
        text = ((cm or {}).get("data") or {}).get(XID_TABLE_KEY, "")
        try:
            overrides = parse_overrides(text) if cm is not None else {}
        except XidTableError as exc:
            problem = f"ConfigMap {namespace}/{XID_TABLE_CONFIGMAP} key {XID_TABLE_KEY}: {exc}; the table in force stays"
            if problem != self.table_problem:
                ctx.event("Warning", "XidTableInvalid", problem)
                log.warning("%s", problem)
            self.table_problem = problem
            return
        self.table_problem = None
        self.set_table(merged(overrides))

    def set_table(self, table: Mapping[int, XidRule]) -> None:
        self.tracker.table = table

    # --------------------------------------------------------------------- tick
    def tick(self, ctx: AgentContext, snapshot: NodeSnapshot, gpunode: Mapping[str, Any],
             pods_by_device: Mapping[str, Sequence[str]], now: datetime, *, shared: bool) -> HealthReport:
        if not self.tracker.restored:
            for problem in self.tracker.restore((gpunode.get("status") or {})):
                ctx.event("Warning", "GpuHealthUnreadable", problem)
        if ctx.backend is None or snapshot.error is not None:
            self.last = HealthReport(dict(self.tracker.faults))
            return self.last
        signals, warnings = read_signals(ctx.backend, snapshot)
        for warning in warnings:
            ctx.event("Warning", "GpuHealthUnreadable", warning)
        acks = read_acknowledgements((gpunode.get("metadata") or {}).get("annotations"))
        if acks.problem:
            ctx.event("Warning", "HealthAcknowledgementIgnored", acks.problem)
        report = self.tracker.observe(signals, snapshot, pods_by_device, acks, now, shared=shared)
        self._events(ctx, snapshot, pods_by_device, report)
        self.last = report
        return report

    def _events(self, ctx: AgentContext, snapshot: NodeSnapshot, pods_by_device: Mapping[str, Sequence[str]],
                report: HealthReport) -> None:
        for key, fault in report.began:
            what = _device(key)
            ctx.event("Warning", "GpuUnhealthy" if key[1] is None else "MigInstanceUnhealthy",
                      f"{what} unhealthy: {fault.message} (needs: {fault.recovery}; "
                      f"{'withdrawn by the device plugin' if fault.withdrawn else 'gpupack keeps new pods off the node'})")
            for pod in fault.pods:
                self._pod_event(ctx, pod, "Warning", "GpuFailed",
                                f"the {what} this pod uses on node {ctx.s.node_name} failed: {fault.message}")
        for end in report.ended:
            ctx.event("Normal", "GpuRecovered", f"{_device(end.key)} healthy again ({end.why}); it was: "
                                                f"{end.fault.message}")
        for event in report.application_xids:
            message = _xid_text(event, self.tracker.table)
            ctx.event("Warning", "XidApplicationError", message)
            for pod in pods_on(snapshot, (event.gpu_index, event.gi_id), pods_by_device):
                self._pod_event(ctx, pod, "Warning", "XidApplicationError", message)

    def _pod_event(self, ctx: AgentContext, pod: str, type_: str, reason: str, message: str) -> None:
        namespace, _, name = pod.partition("/")
        try:
            # From this node (source.host): the agent's admission policy admits an Event about a pod only so.
            ctx.kube.event({"apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": name},
                           type_, reason, message, host=ctx.s.node_name)
        except KubeError as exc:
            log.warning("event %s on pod %s not recorded: %s", reason, pod, exc)

    # ------------------------------------------------------------------ outputs
    def withdrawn(self, snapshot: NodeSnapshot) -> frozenset[str]:
        """Device UUIDs the device plugin withholds for the faults in force."""
        return withdrawn_devices(snapshot, ((k, f.withdrawn) for k, f in self.last.faults.items()))

    def plugin_restart_needed(self, snapshot: NodeSnapshot) -> bool:
        """A fault the plugin acted on has ended, and no other one it acted on lasts (a restarted plugin
        would advertise that device again): only a restart makes it advertise the recovered device."""
        self._restart_pending = self._restart_pending or any(end.fault.withdrawn for end in self.last.ended)
        lost = {g.info.index for g in snapshot.gpus if g.lost}  # a restarted plugin does not see those at all
        lasting = any(f.withdrawn and key[0] not in lost for key, f in self.last.faults.items())
        if self._restart_pending and not lasting:
            self._restart_pending = False
            return True
        return False

    def condition(self, snapshot: NodeSnapshot) -> C.Cond:
        faults = self.last.faults
        if self.table_problem:
            extra = f"; {self.table_problem}"
        else:
            extra = ""
        if not faults:
            return C.Cond(GPUS_HEALTHY, "True", "AllHealthy", f"{len(snapshot.gpus)} GPU(s) healthy{extra}")
        lines = [f"{_device(k)}: {f.reason} ({f.recovery})" for k, f in sorted(faults.items(), key=_order)]
        reason = "AllGpusUnhealthy" if self.last.all_gpus_unhealthy(len(snapshot.gpus)) else (
            "Degraded" if self.last.degraded else "DevicesWithdrawn")
        return C.Cond(GPUS_HEALTHY, "False", reason, "; ".join(lines)[:4000] + extra)

    def node_patch(self, node: Mapping[str, Any], gpu_count: int) -> dict[str, Any] | None:
        """The Node merge patch that puts the degraded label and the unhealthy taint where they belong."""
        meta = node.get("metadata") or {}
        labels = meta.get("labels") or {}
        patch: dict[str, Any] = {}
        degraded = self.last.degraded
        if degraded and labels.get(DEGRADED_LABEL) != "true":
            patch.setdefault("metadata", {}).setdefault("labels", {})[DEGRADED_LABEL] = "true"
        elif not degraded and DEGRADED_LABEL in labels:
            patch.setdefault("metadata", {}).setdefault("labels", {})[DEGRADED_LABEL] = None
        taints = [t for t in ((node.get("spec") or {}).get("taints") or []) if isinstance(t, dict)]
        ours = [t for t in taints if t.get("key") == UNHEALTHY_TAINT]
        want = self.taint_effect != "none" and self.last.all_gpus_unhealthy(gpu_count)
        wanted = [{"key": UNHEALTHY_TAINT, "value": "all-gpus", "effect": self.taint_effect}] if want else []
        if [(t.get("value"), t.get("effect")) for t in ours] != [(t["value"], t["effect"]) for t in wanted]:
            patch.setdefault("spec", {})["taints"] = [t for t in taints if t.get("key") != UNHEALTHY_TAINT] + wanted
            # Taints are a list: guard the read-modify-write so no other writer's taint is lost.
            if meta.get("resourceVersion"):
                patch.setdefault("metadata", {})["resourceVersion"] = meta["resourceVersion"]
        return patch or None

    def health_by_device(self) -> dict[DeviceKey, DeviceHealth]:
        return {k: f.status() for k, f in self.last.faults.items()}


def _device(key: DeviceKey) -> str:
    index, gi = key
    return f"GPU {index}" if gi is None else f"MIG instance {gi} of GPU {index}"


def _order(item: tuple[DeviceKey, Fault]) -> tuple[int, int]:
    (index, gi), _ = item
    return index, -1 if gi is None else gi


def _xid_text(event: XidEvent, table: Mapping[int, XidRule]) -> str:
    rule = table.get(event.xid)
    where = f"GPU {event.gpu_index}" + ("" if event.gi_id is None else f" (MIG instance {event.gi_id})")
    return f"XID {event.xid} on {where}: {rule.description if rule else 'an application error'}; the GPU stays healthy"

