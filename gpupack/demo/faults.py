"""``gpupack demo --fault``: GPUs fail during the run, and the demo measures how the cluster routes around them.

The built-in scenario, at fixed points of the submission window:

1. (30 %) XID 94 (a contained ECC error) on a MIG instance in use on ``h100-a``: the
   instance is withdrawn, the pod on it gets an Event, its neighbours keep running;
2. (45 %) the H100 with the most pods on it (either node) falls off the bus (XID 79,
   then ``GPU_IS_LOST``): the GPU and its instances leave capacity until the node
   reboots, and its pods keep their devices;
3. (60 %) an uncorrected ECC burst on GPU 0 of the MPS node ``a100-a``: the device
   plugin keeps advertising it (it ignores ECC), so gpupack keeps new pods off the
   node (``gpupack.io/gpu-degraded``);
4. (80 %) an admin acknowledges the ECC fault (``gpupack.io/health-acknowledged``),
   and ``a100-a`` takes pods again.

Faults are posted to the simulated nodes' inboxes (``node.nvml.simulated``), exactly
as ``gpupack agent fault`` does. What is measured, from the moment a fault is posted:
when the GPUNode status shows it, when the controller's planning cycle leaves it out
(its ``gpupack_controller_faulted_devices`` / ``gpupack_controller_degraded_node``
metrics), and when the node stops offering it (the device leaves the Node's
allocatable, or the node is labelled degraded). Also counted: pods bound to a
failed device (or, for a degraded node, to the node) after the agent reported the
fault, which must be none, and MIG instances in use on healthy GPUs that vanished,
which must be none.
"""

from __future__ import annotations

import urllib.request
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from node.nvml.simulated import post_to_inbox
from sharing.api.keys import DEGRADED_LABEL, HEALTH_ACK_ANNOTATION, mig_resource

StepKind = Literal["xid-busy-instance", "lose-gpu", "ecc", "acknowledge"]


@dataclass(frozen=True)
class Step:
    at: float
    """Fraction of the submission window at which the step happens."""
    kind: StepKind
    node: str
    gpu: int | None = None


SCENARIO: tuple[Step, ...] = (
    Step(0.30, "xid-busy-instance", "h100-a"),  # or the other MIG node, whichever has a busy instance first
    Step(0.45, "lose-gpu", "h100-b"),  # the GPU with the most pods on either MIG node
    Step(0.60, "ecc", "a100-a", 0),
    Step(0.80, "acknowledge", "a100-a", 0),
)
XID_CONTAINED_ECC = 94


@dataclass
class FaultRecord:
    what: str
    node: str
    gpu: int
    gi: int | None
    """The failed MIG instance's GPU-instance id (None: the whole GPU)."""
    profiles: tuple[str, ...]
    """Profiles of the instances the fault takes away (MIG), for the allocatable check."""
    withdrawn: bool
    """The device plugin withdraws it (else gpupack marks the node degraded)."""
    posted: float
    reported: float | None = None
    reported_wall: datetime | None = None
    planner: float | None = None
    advertised: float | None = None
    ended: float | None = None

    @property
    def excluded(self) -> float | None:
        if self.planner is None or self.advertised is None:
            return None
        return max(self.planner, self.advertised) - self.posted


@dataclass
class FaultScenario:
    """Drives :data:`SCENARIO` against a running demo stack and measures it; call :meth:`step` every poll."""

    state_files: dict[str, Path]
    """Node -> its simulated NVML state file."""
    submit_seconds: float
    controller_metrics_url: str
    admin: Any
    say: Any
    steps: list[Step] = field(default_factory=lambda: list(SCENARIO))
    records: list[FaultRecord] = field(default_factory=list)
    placed_on_unhealthy: set[str] = field(default_factory=set)
    destroyed_in_use: set[str] = field(default_factory=set)
    _in_use: dict[str, tuple[str, int]] = field(default_factory=dict)
    """MIG instances in use on healthy devices at the last poll (uuid -> node, GPU)."""
    _bindings: dict[str, str] = field(default_factory=dict)
    """Pod name -> the node it is bound to."""

    def busy(self) -> bool:
        """Steps left, or a fault not yet seen everywhere it is measured."""
        return bool(self.steps) or any(r.reported is None or r.planner is None or r.advertised is None
                                       for r in self.records)

    def step(self, now: float, gpunodes: list[dict[str, Any]], nodes: list[dict[str, Any]],
             scheduled_at: dict[str, datetime]) -> None:
        by_name = {g["metadata"]["name"]: g for g in gpunodes}
        node_objs = {n["metadata"]["name"]: n for n in nodes}
        while self.steps and now >= self.steps[0].at * self.submit_seconds:
            if not self._inject(self.steps[0], now, by_name):
                break  # not possible yet (no busy instance): try again at the next poll
            self.steps.pop(0)
        metrics = self._controller_metrics() if any(r.planner is None for r in self.records) else {}
        for record in self.records:
            self._observe(record, now, by_name.get(record.node, {}), node_objs.get(record.node, {}), metrics)
        self._count_misplaced(by_name, node_objs, scheduled_at)
        self._count_destroyed(by_name)

    # ------------------------------------------------------------------ inject
    def _inject(self, step: Step, now: float, gpunodes: dict[str, dict[str, Any]]) -> bool:
        if step.kind == "xid-busy-instance":
            busy = [(name, g["index"], i) for name in (step.node, *sorted(gpunodes)) if name.startswith("h100")
                    for g in ((gpunodes.get(name) or {}).get("status") or {}).get("gpus") or []
                    for i in g.get("instances") or []
                    if i.get("pods") and isinstance(i.get("giId"), int) and not i.get("health") and not g.get("health")]
            if not busy:
                return False
            node, gpu, inst = busy[0]
            step = Step(step.at, step.kind, node)
        if step.kind == "xid-busy-instance":
            post_to_inbox(self.state_files[step.node], {"op": "xid", "gpu": gpu, "xid": XID_CONTAINED_ECC,
                                                        "gi": inst["giId"]})
            what = (f"XID {XID_CONTAINED_ECC} on MIG instance {inst['profile']}@{inst['start']} of GPU {gpu} of "
                    f"{step.node} (used by {', '.join(inst['pods'])})")
            self.records.append(FaultRecord(what, step.node, gpu, inst["giId"], (inst["profile"],), True, now))
        elif step.kind == "lose-gpu":
            # The healthy GPU with the most pods on it, on either MIG node (its pods keep their devices, and no
            # new pod gets one); ties go to the step's node.
            faulted = {(r.node, r.gpu) for r in self.records}
            gpus = [(name, g) for name in sorted(gpunodes) if name.startswith("h100")
                    for g in ((gpunodes.get(name) or {}).get("status") or {}).get("gpus") or []
                    if (name, g["index"]) not in faulted and not g.get("health")
                    and not any(i.get("health") for i in g.get("instances") or [])]
            if not gpus:
                return False
            node, target = max(gpus, key=lambda ng: (sum(1 for i in ng[1].get("instances") or [] if i.get("inUse")),
                                                     len(ng[1].get("instances") or []), ng[0] == step.node,
                                                     ng[1]["index"]))
            step = Step(step.at, step.kind, node)
            post_to_inbox(self.state_files[step.node], {"op": "lose", "gpu": target["index"]})
            profiles = tuple(i["profile"] for i in target.get("instances") or [])
            self.records.append(FaultRecord(f"GPU {target['index']} of {step.node} falls off the bus", step.node,
                                            target["index"], None, profiles, True, now))
        elif step.kind == "ecc":
            assert step.gpu is not None
            post_to_inbox(self.state_files[step.node], {"op": "ecc", "gpu": step.gpu, "count": 2, "retire": True})
            self.records.append(FaultRecord(f"uncorrected ECC errors on GPU {step.gpu} of {step.node}", step.node,
                                            step.gpu, None, (), False, now))
        else:
            self._acknowledge(step, gpunodes, now)
        self.say(f"[{now:5.1f}s] FAULT: " + (self.records[-1].what if step.kind != "acknowledge" else
                                             f"an admin acknowledges the faults of GPU {step.gpu} of {step.node}"))
        return True

    def _acknowledge(self, step: Step, gpunodes: dict[str, dict[str, Any]], now: float) -> None:
        from kubernetes import client

        from node.health.ack import acknowledge

        assert step.gpu is not None
        annotations = ((gpunodes.get(step.node) or {}).get("metadata") or {}).get("annotations") or {}
        value = acknowledge(annotations, [step.gpu], datetime.now(timezone.utc))
        client.CustomObjectsApi(self.admin).patch_cluster_custom_object(
            "gpupack.io", "v1alpha1", "gpunodes", step.node, {"metadata": {"annotations": {HEALTH_ACK_ANNOTATION: value}}})
        for record in self.records:
            if record.node == step.node and record.gpu == step.gpu and record.ended is None:
                record.ended = now

    # ----------------------------------------------------------------- observe
    def _observe(self, record: FaultRecord, now: float, gpunode: dict[str, Any], node: dict[str, Any],
                 metrics: dict[tuple[str, str], float]) -> None:
        status = gpunode.get("status") or {}
        if record.reported is None and _health_shown(status, record):
            record.reported, record.reported_wall = now, datetime.now(timezone.utc)
        if record.planner is None and record.reported is not None:
            if record.withdrawn:
                seen = metrics.get(("gpupack_controller_faulted_devices", record.node), 0.0) >= 1
            else:
                seen = metrics.get(("gpupack_controller_degraded_node", record.node), 0.0) >= 1
            if seen:
                record.planner = now
        if record.advertised is None:
            if not record.withdrawn:
                off = ((node.get("metadata") or {}).get("labels") or {}).get(DEGRADED_LABEL) == "true"
            else:
                off = _withdrawn_from(node, record, gpunode)
            if off:
                record.advertised = now

    def _controller_metrics(self) -> dict[tuple[str, str], float]:
        try:
            with urllib.request.urlopen(self.controller_metrics_url, timeout=2) as response:
                text = response.read().decode()
        except OSError:
            return {}
        out: dict[tuple[str, str], float] = {}
        for line in text.splitlines():
            for name in ("gpupack_controller_faulted_devices", "gpupack_controller_degraded_node"):
                prefix = name + '{node="'
                if line.startswith(prefix):
                    node, _, value = line[len(prefix):].partition('"} ')
                    out[(name, node)] = float(value)
        return out

    def _count_misplaced(self, gpunodes: dict[str, dict[str, Any]], nodes: dict[str, dict[str, Any]],
                         scheduled_at: dict[str, datetime]) -> None:
        for record in self.records:
            if record.reported_wall is None or record.ended is not None:
                continue
            status = (gpunodes.get(record.node) or {}).get("status") or {}
            if record.withdrawn:
                pods = [p for g in status.get("gpus") or [] if g.get("index") == record.gpu
                        for i in g.get("instances") or [] if record.gi is None or i.get("giId") == record.gi
                        for p in i.get("pods") or []]
            else:
                pods = [name for name, _ in self._bound_to(record.node)]
            for pod in pods:
                name = pod.rsplit("/", 1)[-1]
                at = scheduled_at.get(name)
                if at is not None and at > record.reported_wall:
                    self.placed_on_unhealthy.add(f"{pod} on {record.what}")

    def _bound_to(self, node: str) -> list[tuple[str, str]]:
        return [(name, where) for name, where in self._bindings.items() if where == node]

    def bindings(self, pods: list[dict[str, Any]]) -> None:
        """Which node each pod is bound to (from the demo's pod list)."""
        for pod in pods:
            where = (pod.get("spec") or {}).get("nodeName")
            if where:
                self._bindings[pod["metadata"]["name"]] = where

    def _count_destroyed(self, gpunodes: dict[str, dict[str, Any]]) -> None:
        now_in_use: dict[str, tuple[str, int]] = {}
        present: set[str] = set()
        reporting: set[tuple[str, int]] = set()
        for name, obj in gpunodes.items():
            for g in (obj.get("status") or {}).get("gpus") or []:
                reporting.add((name, g["index"]))
                for i in g.get("instances") or []:
                    uuid = i.get("uuid") or f"{name}/{g['index']}/{i.get('start')}"
                    present.add(uuid)
                    if i.get("inUse") and not g.get("health") and not i.get("health"):
                        now_in_use[uuid] = (name, g["index"])
        for uuid, where in self._in_use.items():
            if uuid not in present and where in reporting:
                self.destroyed_in_use.add(uuid)
        self._in_use = now_in_use

    # ----------------------------------------------------------------- summary
    def summary(self) -> dict[str, Any]:
        from gpupack.demo.progress import percentile

        def offsets(attr: str) -> list[float]:
            return [getattr(r, attr) - r.posted for r in self.records if getattr(r, attr) is not None]

        excluded = [x for r in self.records if (x := r.excluded) is not None]
        return {
            "faults_injected": len(self.records),
            "faults_excluded": len(excluded),
            "pods_placed_on_unhealthy": len(self.placed_on_unhealthy),
            "in_use_instances_destroyed": len(self.destroyed_in_use),
            "fault_to_status_seconds_p50": _round(percentile(offsets("reported"), 50)),
            "fault_to_status_seconds_p95": _round(percentile(offsets("reported"), 95)),
            "fault_to_planner_seconds_p95": _round(percentile(offsets("planner"), 95)),
            "fault_to_withdrawn_seconds_p95": _round(percentile(offsets("advertised"), 95)),
            "fault_to_excluded_seconds_p50": _round(percentile(excluded, 50)),
            "fault_to_excluded_seconds_p95": _round(percentile(excluded, 95)),
            "faults": [{"what": r.what, "withdrawn_by_device_plugin": r.withdrawn,
                        "to_status_seconds": _after(r, r.reported), "to_planner_seconds": _after(r, r.planner),
                        "to_withdrawn_seconds": _after(r, r.advertised), "to_excluded_seconds": _round(r.excluded)}
                       for r in self.records],
        }

    def lines(self) -> list[str]:
        out = []
        for r in self.records:
            parts = [f"{name} {getattr(r, attr) - r.posted:.1f}s" for name, attr in
                     (("status", "reported"), ("planner", "planner"), ("withdrawn", "advertised"))
                     if getattr(r, attr) is not None]
            out.append(f"  fault: {r.what}: " + (", ".join(parts) or "not seen"))
        out.extend(f"  PLACED ON A FAILED DEVICE: {p}" for p in sorted(self.placed_on_unhealthy))
        out.extend(f"  IN-USE INSTANCE DESTROYED: {u}" for u in sorted(self.destroyed_in_use))
        return out


def _health_shown(status: dict[str, Any], record: FaultRecord) -> bool:
    for g in status.get("gpus") or []:
        if g.get("index") != record.gpu:
            continue
        if record.gi is None:
            return bool(g.get("health"))
        return bool(g.get("health")) or any(i.get("giId") == record.gi and i.get("health")
                                            for i in g.get("instances") or [])
    return False


def _withdrawn_from(node: dict[str, Any], record: FaultRecord, gpunode: dict[str, Any]) -> bool:
    """The node no longer offers the device: a withheld MIG instance leaves allocatable (capacity stays);
    a lost GPU's instances leave capacity, which then holds no more of their profiles than the node's
    other GPUs report (reshapes elsewhere may add instances of the same profiles meanwhile)."""
    status = node.get("status") or {}
    capacity = {k: int(v) for k, v in (status.get("capacity") or {}).items() if str(v).isdigit()}
    allocatable = {k: int(v) for k, v in (status.get("allocatable") or {}).items() if str(v).isdigit()}
    if record.gi is not None:
        resource = mig_resource(record.profiles[0])
        return allocatable.get(resource, 0) < capacity.get(resource, 0)
    others: dict[str, int] = {}
    for g in (gpunode.get("status") or {}).get("gpus") or []:
        if g.get("index") != record.gpu:
            for i in g.get("instances") or []:
                others[i["profile"]] = others.get(i["profile"], 0) + 1
    return all(capacity.get(mig_resource(p), 0) <= others.get(p, 0) for p in set(record.profiles))


def _after(record: FaultRecord, at: float | None) -> float | None:
    return None if at is None else round(at - record.posted, 2)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)
