"""The node agent: observe NVML and the API server, reconcile MIG, publish status.

One loop, one tick at a time (``Agent.tick``), each tick converging from what the
API server holds plus what NVML reports, so a restarted agent needs nothing from
its predecessor's memory:

1. read the Node, this node's ``GPUNode`` (created if missing), pods on the node,
   and an NVML snapshot;
2. (simulation) emulate the device plugin's allocation of pods to devices;
3. reconcile MIG: resume an active journal, or start one GPU's reshape when its
   spec differs and the affected instances are idle (direct mode), or drive the
   mig-manager handshake (operator mode);
4. after a reshape, make the device plugin re-advertise and wait for the Node's
   allocatable to show it, then close the journal;
5. write the sharing config, emulate the device plugin's advertisement
   (simulation), and publish status (rate-limited) with conditions and metrics.

Journal writes are never rate-limited: they are the write-ahead log of a reshape,
and an NVML step only runs after its journal write succeeded.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from dataclasses import replace
from typing import Any

import httpx
from pydantic import ValidationError

from mig.errors import MigError
from mig.migparted import builtin_config, layout_for
from mig.model import PlacedInstance, Placement
from node import conditions as C
from node.dcgm import Activity, parse_activity
from node.device_plugin_emulator import DEPLOY_DEVICE_PLUGIN, advertise, node_patches
from node.inventory import NodeSnapshot, read_snapshot, status_from_snapshot
from node.journal import NVML_PHASES, Journal, format_instance
from node.kube import Kube, KubeError
from node.metrics import AgentMetrics
from node.mig_loop import drive_gpu
from node.nvml.errors import NvmlError
from node.nvml.protocol import GpuInstance, NvmlBackend
from node.nvml.simulated import SimulatedNvml
from node.operator_mode import (
    DEVICE_PLUGIN_CONFIG_LABEL, MIG_CONFIG_LABEL, MIG_CONFIG_STATE_LABEL, MIG_PARTED_KEY, device_plugin_config, device_plugin_config_name,
    handshake_state, merge_mig_parted, plan_node_config,
)
from node.planning import IdleTracker, StartDecision
from node.podresources import PodResourcesError, device_owners, list_pod_devices
from node.pods import SIM_PID_BASE, PodUse, assign_pods, busy_instances, pod_uid_of_pid, pod_uses, pods_by_device, sim_pid
from node.reconciler import MigReconciler, finish
from node.settings import AgentSettings
from sharing.api import GPUNodeSpec

log = logging.getLogger("gpupack.agent")
COMPONENT = "gpupack-node-agent"
PAUSED_VALUE = "paused-for-mig-change"  # the value mig-manager uses; the plugin DaemonSet selects "true"
EVENT_REPEAT_SECONDS = 600.0


def _iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def journal_wire(journal: Journal) -> dict[str, Any]:
    """``GPUNode.status.reconfiguration``: the typed fields the controller reads, plus the journal."""
    done = sum(1 for s in journal.steps if s.startswith(("destroyed ", "created ")))
    plan = [{"op": "destroy", "instance": format_instance(i)} for i in journal.destroy]
    plan += [{"op": "create", "instance": format_instance(i)} for i in journal.create]
    return {"phase": journal.phase, "step": done, "plan": plan, "targetGeneration": journal.generation,
            "startedAt": _iso(journal.started_at), "message": journal.reason[:4096] or None,
            "mode": "direct", "gpuIndex": journal.gpu_index, "journal": journal.to_dict()}


def journal_from_status(raw: Mapping[str, Any] | None) -> Journal | None:
    if not raw or raw.get("mode") != "direct" or "journal" not in raw:
        return None
    return Journal.from_dict(raw["journal"])


class KubeJournalStore:
    """Journals go to the API server synchronously; a failed write stops the step."""

    def __init__(self, kube: Kube, node: str, on_write: Callable[[dict[str, Any]], None]) -> None:
        self._kube, self._node, self._on_write = kube, node, on_write

    def save(self, journal: Journal) -> None:
        obj = self._kube.patch_gpunode_status(self._node, {"reconfiguration": journal_wire(journal)})
        self._on_write(obj)


class Agent:
    def __init__(
        self, settings: AgentSettings, backend: NvmlBackend | None, kube: Kube, *,
        backend_error: str = "", metrics: AgentMetrics | None = None,
        clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.s = settings
        self.backend = backend
        self.backend_error = backend_error
        self.kube = kube
        self.metrics = metrics or AgentMetrics()
        self.clock, self.sleep = clock, sleep
        self.idle = IdleTracker()
        self._rv = ""
        self._latest_generation = 0
        self._processed_generation = 0
        self._uid = ""
        self._last_status: dict[str, Any] | None = None
        self._last_patch = -1e18
        self._events: dict[tuple[str, str], float] = {}
        self._busy_ctx: tuple[dict[str, list[str]], list[PodUse]] = ({}, [])
        self._dp_config_written = ""
        self._dcgm_at = -1e18
        self._dcgm_cache: Activity | None = None
        self.ticks = 0

    @property
    def simulated(self) -> bool:
        return isinstance(self.backend, SimulatedNvml)

    # ------------------------------------------------------------------ plumbing
    def _remember(self, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        self._rv = str(meta.get("resourceVersion") or self._rv)
        # Every write returns the whole object: a spec change that landed during this tick
        # shows up here, and the loop must not then wait for a watch event that already passed.
        self._latest_generation = int(meta.get("generation") or self._latest_generation)

    def _event(self, type_: str, reason: str, message: str) -> None:
        key, now = (reason, message), self.clock()
        if now - self._events.get(key, -1e18) < EVENT_REPEAT_SECONDS:
            return
        if len(self._events) > 256:  # messages carry durations etc.: forget the old ones
            self._events = {k: t for k, t in self._events.items() if now - t < EVENT_REPEAT_SECONDS}
        self._events[key] = now
        involved = {"apiVersion": "gpupack.io/v1alpha1", "kind": "GPUNode", "name": self.s.node_name, "uid": self._uid}
        try:
            self.kube.event(involved, type_, reason, message, COMPONENT)
        except KubeError as exc:
            log.warning("event %s not recorded: %s", reason, exc)

    def _snapshot(self) -> NodeSnapshot:
        if self.backend is None:
            return NodeSnapshot("nvml", error=self.backend_error or "NVML backend not available")
        return read_snapshot(self.backend, self.backend.kind, self._dcgm_activity())

    def _dcgm_activity(self) -> Activity | None:
        """dcgm-exporter's per-instance activity, if configured and reachable (else None, logged)."""
        if not self.s.dcgm_exporter_url:
            return None
        now = self.clock()
        if now - self._dcgm_at < 1.0:  # several snapshots per tick share one scrape
            return self._dcgm_cache
        self._dcgm_at = now
        self._dcgm_cache = None
        try:
            response = httpx.get(self.s.dcgm_exporter_url, timeout=2.0)
            response.raise_for_status()
            self._dcgm_cache = parse_activity(response.text)
            return self._dcgm_cache
        except (httpx.HTTPError, ValueError) as exc:
            log.warning("dcgm-exporter at %s not used: %s", self.s.dcgm_exporter_url, exc)
            return None

    def _busy(self, index: int, instances: tuple[GpuInstance, ...]) -> frozenset[PlacedInstance]:
        """Re-read right before every NVML step: processes now, plus the tick's pod map."""
        assert self.backend is not None
        with_process = {p.gi_id for p in self.backend.processes(index) if p.gi_id is not None}
        by_device, unresolved = self._busy_ctx
        unknown = {u.resource.removeprefix("nvidia.com/mig-") for u in unresolved if u.resource.startswith("nvidia.com/mig-")}
        return frozenset(i.placed for i in instances
                         if i.gi_id in with_process or by_device.get(i.uuid) or i.profile in unknown)

    # ---------------------------------------------------------------------- tick
    def tick(self) -> float:
        """One pass; returns how long to wait before the next (seconds)."""
        self.ticks += 1
        name = self.s.node_name
        node = self.kube.get_node(name)
        obj = self.kube.get_gpunode(name) or self.kube.create_gpunode(name, (node.get("metadata") or {}).get("uid"))
        self._remember(obj)
        self._uid = str(obj["metadata"].get("uid", ""))
        generation = int(obj["metadata"].get("generation") or 0)
        self._processed_generation = generation
        status = obj.get("status") or {}
        labels: dict[str, str] = dict((node.get("metadata") or {}).get("labels") or {})
        conds: list[C.Cond] = []
        try:
            spec: GPUNodeSpec | None = GPUNodeSpec.model_validate(obj.get("spec") or {})
            conds.append(C.Cond(C.SPEC_VALID, "True", "Valid", "spec accepted"))
        except ValidationError as exc:
            spec = None
            conds.append(C.Cond(C.SPEC_VALID, "False", "InvalidSpec", str(exc)[:2000]))

        snapshot = self._snapshot()
        uses = pod_uses(self.kube.list_node_pods(name), name)
        replicas = spec.sharing.replicas if spec else 1
        if self.simulated and self.s.emulate_device_plugin and snapshot.error is None:
            self._emulate_allocation(snapshot, uses, labels, replicas)
            snapshot = self._snapshot()
        self._busy_ctx = self._pod_map(snapshot, uses)
        now = self.clock()
        for gpu in snapshot.gpus:
            # Idle clocks run for every GPU from the agent's start, not only once a spec asks for a change.
            self.idle.observe(gpu.info.uuid, [i.placed for i in gpu.instances],
                              busy_instances(gpu, *self._busy_ctx), now)
        if snapshot.error:
            conds.append(C.Cond(C.NVML_READY, "False", "NvmlUnavailable", snapshot.error))
            self.metrics.nvml_errors.labels("unavailable").inc()
        else:
            detail = f"{len(snapshot.gpus)} GPU(s) via {snapshot.backend}" + (
                "; " + "; ".join(snapshot.warnings) if snapshot.warnings else "")
            conds.append(C.Cond(C.NVML_READY, "True", "Simulated" if self.simulated else "Ready", detail))
            for warning in snapshot.warnings:
                self._event("Warning", "GpuInventoryWarning", warning)

        wait = self.s.poll_seconds
        reconf = status.get("reconfiguration")
        if spec is not None and snapshot.error is None:
            if self.s.mode == "direct":
                layout, active = self._reconcile_direct(spec, generation, snapshot, reconf, labels)
            else:
                layout, active = self._reconcile_operator(spec, generation, snapshot, reconf, labels)
            conds.append(layout)
            if active:
                wait = min(wait, 0.5)
            snapshot = self._snapshot()
            node = self.kube.get_node(name)
            labels = dict((node.get("metadata") or {}).get("labels") or {})
        sharing = {"mode": spec.sharing.mode, "replicas": spec.sharing.replicas} if spec else None
        if spec is not None and not self.s.emulate_device_plugin:
            # The real device plugin reads its sharing config from the ConfigMap; the emulator
            # (simulation) takes it straight from the spec instead.
            self._write_sharing_config(spec, labels)
        if self.s.emulate_device_plugin and snapshot.error is None:
            conds.append(self._emulate_advertisement(snapshot, node, spec))
        self._publish(snapshot, generation if spec else status.get("observedGeneration"), sharing, status, conds)
        busy_gi = {g.info.index: g.busy_gi_ids() for g in snapshot.gpus}
        self.metrics.observe(snapshot, busy_gi)
        return wait

    def run_forever(self, stop: Callable[[], bool] = lambda: False) -> None:
        while not stop():
            try:
                wait = self.tick()
            except KubeError as exc:
                self.metrics.api_errors.labels(str(exc.status)).inc()
                log.warning("Kubernetes API error, retrying: %s", exc)
                wait = self.s.poll_seconds
            except NvmlError as exc:
                self.metrics.nvml_errors.labels(exc.name).inc()
                log.warning("NVML error outside a reconfiguration step, retrying: %s", exc)
                wait = self.s.poll_seconds
            except Exception:  # noqa: BLE001 - log and retry; never crash-loop the DaemonSet
                log.exception("agent tick failed; retrying")
                wait = self.s.poll_seconds
            if stop():
                break
            if self._latest_generation != self._processed_generation:
                continue  # the spec changed while we worked: go again now
            if wait < self.s.poll_seconds or not self._rv:
                self.sleep(wait)
            else:
                try:
                    self.kube.wait_gpunode_change(self.s.node_name, self._rv, wait)
                except KubeError:
                    self.sleep(wait)

    # ------------------------------------------------------------- pods/devices
    def _pod_map(self, snapshot: NodeSnapshot, uses: list[PodUse]) -> tuple[dict[str, list[str]], list[PodUse]]:
        if self.simulated:
            uid_of_pid = {sim_pid(u.uid, o): u.uid for u in uses for o in range(u.count)}
            return pods_by_device(snapshot, uses, uid_of_pid)
        uid_of_pid = {}
        for gpu in snapshot.gpus:
            for proc in gpu.processes:
                uid = pod_uid_of_pid(proc.pid)
                if uid:
                    uid_of_pid[proc.pid] = uid
        by_device, unresolved = pods_by_device(snapshot, uses, uid_of_pid)
        try:
            owners = device_owners(list_pod_devices(Path(self.s.pod_resources_socket)))
        except PodResourcesError as exc:
            log.debug("PodResources API not used: %s", exc)
            return by_device, unresolved
        # The kubelet knows which device each admitted pod got, process or not.
        for device, keys in owners.items():
            holders = by_device.setdefault(device, [])
            holders.extend(k for k in keys if k not in holders)
        known = {k for keys in owners.values() for k in keys}
        return by_device, [u for u in unresolved if u.key not in known]

    def _emulate_allocation(self, snapshot: NodeSnapshot, uses: list[PodUse], labels: Mapping[str, str],
                            replicas: int) -> None:
        """SIMULATION: hand devices to pods as the device plugin would, with a process in each."""
        sim = self.backend
        assert isinstance(sim, SimulatedNvml)
        device_at: dict[int, tuple[int, int | None, str]] = {}
        for gpu in snapshot.gpus:
            uuid_of = {i.gi_id: i.uuid for i in gpu.instances}
            for proc in gpu.processes:
                device = uuid_of.get(proc.gi_id, "") if proc.gi_id is not None else gpu.info.uuid
                device_at[proc.pid] = (gpu.info.index, proc.gi_id, device)
        existing = {f"{u.uid}/{o}": device_at[sim_pid(u.uid, o)][2]
                    for u in uses for o in range(u.count) if sim_pid(u.uid, o) in device_at}
        paused = labels.get(DEPLOY_DEVICE_PLUGIN, "true") != "true"
        wanted = existing if paused else assign_pods(snapshot, uses, existing, replicas)
        where: dict[str, tuple[int, int | None]] = {}
        for gpu in snapshot.gpus:
            where[gpu.info.uuid] = (gpu.info.index, None)
            for inst in gpu.instances:
                where[inst.uuid] = (gpu.info.index, inst.gi_id)
        keep: set[int] = set()
        for slot, device in wanted.items():
            uid, ordinal = slot.rsplit("/", 1)
            pid = sim_pid(uid, int(ordinal))
            keep.add(pid)
            if pid not in device_at and device in where:
                index, gi_id = where[device]
                sim.start_process(index, pid, 1024, gi_id)
        for pid, (index, _gi, _dev) in device_at.items():
            if pid >= SIM_PID_BASE and pid not in keep:
                sim.stop_process(index, pid)

    # ------------------------------------------------------------- direct mode
    def _pinned(self, spec: GPUNodeSpec, snapshot: NodeSnapshot) -> dict[int, tuple[PlacedInstance, ...]]:
        """GPUs whose spec pins the start of every instance: their exact target layout."""
        pinned: dict[int, tuple[PlacedInstance, ...]] = {}
        for g in spec.gpus:
            gpu = snapshot.gpu(g.index)
            if gpu is None or gpu.model is None or not g.layout or any(i.start is None for i in g.layout):
                continue
            if not all(gpu.model.has_profile(i.profile) for i in g.layout):
                continue  # decide_start refuses with the list of valid profiles
            pinned[g.index] = tuple(sorted(
                PlacedInstance(i.profile, Placement(int(i.start or 0), gpu.model.profile(i.profile).memory_slices))
                for i in g.layout))
        return pinned

    def _desired(self, spec: GPUNodeSpec, snapshot: NodeSnapshot) -> tuple[dict[int, list[str] | None], dict[int, str]]:
        desired: dict[int, list[str] | None] = {}
        problems: dict[int, str] = {}
        for g in spec.gpus:
            gpu = snapshot.gpu(g.index)
            if gpu is None:
                problems[g.index] = f"no such GPU on this node ({len(snapshot.gpus)} GPU(s))"
            elif not g.mig_enabled:
                desired[g.index] = None
            elif g.layout is not None:
                desired[g.index] = [i.profile for i in g.layout]
            elif g.mig_config is not None:
                if gpu.model is None:
                    problems[g.index] = "not MIG-capable"
                    continue
                try:
                    desired[g.index] = layout_for(builtin_config(g.mig_config), gpu.model, g.index)
                except MigError as exc:
                    problems[g.index] = str(exc)
        return desired, problems

    def _reconcile_direct(self, spec: GPUNodeSpec, generation: int, snapshot: NodeSnapshot,
                          reconf: Mapping[str, Any] | None, labels: Mapping[str, str]) -> tuple[C.Cond, bool]:
        assert self.backend is not None
        try:
            journal = journal_from_status(reconf)
        except ValueError as exc:
            self._event("Warning", "JournalUnreadable", str(exc))
            journal = None
        store = KubeJournalStore(self.kube, self.s.node_name, self._remember)
        reconciler = MigReconciler(self.backend, store, self._busy, self.clock,
                                   max_errors=self.s.max_nvml_errors, event=self._event)
        desired, problems = self._desired(spec, snapshot)
        pinned = self._pinned(spec, snapshot)
        now = self.clock()
        decisions: dict[int, StartDecision] = {}
        if journal is not None and journal.phase in NVML_PHASES:
            gpu = snapshot.gpu(journal.gpu_index)
            if gpu is None or gpu.info.uuid != journal.gpu_uuid:
                journal = journal.moved("Advertising", now, "journal names a GPU this node no longer has", outcome="Aborted")
                store.save(journal)
            else:
                assert gpu.model is not None
                journal = drive_gpu(reconciler, self.backend, gpu.model, gpu.info.index, gpu.info.uuid, journal,
                                    desired.get(gpu.info.index), generation, self._busy, self.idle, now,
                                    self.s.idle_seconds, self._pause(store), self.s.retry_seconds).journal
        manager_state = labels.get(MIG_CONFIG_STATE_LABEL, "")
        if (journal is None or not journal.active) and manager_state in ("pending", "rebooting"):
            # mig-manager is reconfiguring this node: two writers on NVML would fight.
            return C.Cond(C.LAYOUT_APPLIED, "False", "MigManagerBusy",
                          f"{MIG_CONFIG_STATE_LABEL}={manager_state}; waiting for mig-manager to finish"), False
        if journal is None or not journal.active:
            for gpu in snapshot.gpus:
                index = gpu.info.index
                if index not in desired:
                    continue
                want = desired[index]
                if gpu.error is not None:
                    problems[index] = f"NVML error, not reshaped: {gpu.error}"
                    continue
                if gpu.info.mig_enabled != gpu.info.mig_pending:
                    problems[index] = "a MIG-mode change is pending until the GPU is reset; not reshaped"
                    continue
                if (want is None) != (not gpu.info.mig_enabled):
                    problems[index] = ("changing MIG mode needs a GPU reset; use operator mode (mig-manager) "
                                       "or switch it on the node")
                    continue
                if want is None or gpu.model is None:
                    continue
                own = journal if journal is not None and journal.gpu_index == index else None
                result = drive_gpu(reconciler, self.backend, gpu.model, index, gpu.info.uuid, own, want, generation,
                                   self._busy, self.idle, now, self.s.idle_seconds, self._pause(store),
                                   self.s.retry_seconds, pinned.get(index))
                if result.decision is not None:
                    decisions[index] = result.decision
                if result.journal is not None and result.journal is not own:
                    journal = result.journal
                    break  # one GPU at a time per node; the policy's max_concurrent is the controller's
        if journal is not None and journal.phase == "Advertising":
            journal = self._advertise(journal, store, snapshot)
        return self._layout_condition(journal, decisions, problems, generation), bool(journal and journal.active)

    def _pause(self, store: KubeJournalStore) -> Callable[[Journal], Journal]:
        def pause(journal: Journal) -> Journal:
            if not self.s.pause_device_plugin or journal.device_plugin_paused:
                return journal
            labels = (self.kube.get_node(self.s.node_name).get("metadata") or {}).get("labels") or {}
            before = labels.get(DEPLOY_DEVICE_PLUGIN)
            journal = replace(journal, device_plugin_paused=True,
                              device_plugin_label="true" if before == PAUSED_VALUE else before)
            store.save(journal)  # write-ahead: a restart knows to un-pause, and to what
            self.kube.patch_node(self.s.node_name, {"metadata": {"labels": {DEPLOY_DEVICE_PLUGIN: PAUSED_VALUE}}})
            if not self.simulated:
                self._wait_device_plugin_gone()
            return journal
        return pause

    def _wait_device_plugin_gone(self, timeout_s: float = 120.0) -> None:
        deadline = self.clock() + timeout_s
        while self.clock() < deadline:
            pods = [p for p in self.kube.list_node_pods(self.s.node_name)
                    if p.get("metadata", {}).get("namespace") == self.s.device_plugin_namespace
                    and _selects(self.s.device_plugin_selector, p.get("metadata", {}).get("labels") or {})]
            if not pods:
                return
            self.sleep(1.0)
        log.warning("device plugin still running on %s after %.0fs; relying on busy checks", self.s.node_name, timeout_s)

    def _advertise(self, journal: Journal, store: KubeJournalStore, snapshot: NodeSnapshot) -> Journal:
        name = self.s.node_name
        if journal.device_plugin_paused:
            self.kube.patch_node(name, {"metadata": {"labels": {DEPLOY_DEVICE_PLUGIN: journal.device_plugin_label}}})
            journal = journal.logged("device plugin resumed", self.clock(), device_plugin_paused=False)
            store.save(journal)
        elif not self.simulated and "device plugin restarted" not in journal.steps:
            self.kube.delete_node_pods(self.s.device_plugin_namespace, self.s.device_plugin_selector, name)
            journal = journal.logged("device plugin restarted", self.clock())
            store.save(journal)
        snapshot = self._snapshot()
        node = self.kube.get_node(name)
        if self.s.emulate_device_plugin:
            self._emulate_advertisement(snapshot, node, None)
            node = self.kube.get_node(name)
        expected = {k: v for k, v in advertise(snapshot, "none", 1).resources.items() if k.startswith("nvidia.com/mig-")}
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        shown = {k: int(v) for k, v in allocatable.items() if k.startswith("nvidia.com/mig-") and str(v) != "0"}
        now = self.clock()
        if shown == expected or now - journal.updated_at > self.s.advertise_timeout_seconds:
            reason = journal.reason if shown == expected else (
                f"{journal.reason}; device plugin did not re-advertise within {self.s.advertise_timeout_seconds:g}s")
            journal = replace(finish(journal, now), reason=reason)
            store.save(journal)
            outcome = journal.phase
            self.metrics.reconfigurations.labels(outcome).inc()
            self.metrics.reconfigure_seconds.observe(now - journal.started_at)
            self._event("Normal" if outcome == "Succeeded" else "Warning", f"MigReconfiguration{outcome}",
                        f"GPU {journal.gpu_index}: {outcome.lower()} in {now - journal.started_at:.1f}s; "
                        f"layout {', '.join(map(format_instance, journal.target if outcome == 'Succeeded' else journal.previous))}"
                        + (f" ({journal.reason})" if journal.reason else ""))
        return journal

    def _layout_condition(self, journal: Journal | None, decisions: Mapping[int, StartDecision],
                          problems: Mapping[int, str], generation: int) -> C.Cond:
        if journal is not None and journal.active:
            return C.Cond(C.LAYOUT_APPLIED, "False", "Reconfiguring",
                          f"GPU {journal.gpu_index}: {journal.phase}" + (f" ({journal.reason})" if journal.reason else ""))
        refused = {i: d.reason for i, d in decisions.items() if d.kind == "refuse"} | dict(problems)
        if refused:
            return C.Cond(C.LAYOUT_APPLIED, "False", "LayoutRefused",
                          "; ".join(f"GPU {i}: {r}" for i, r in sorted(refused.items())))
        waiting = {i: d.reason for i, d in decisions.items() if d.kind == "wait"}
        if waiting:
            return C.Cond(C.LAYOUT_APPLIED, "False", "WaitingForIdle",
                          "; ".join(f"GPU {i}: {r}" for i, r in sorted(waiting.items())))
        if journal is not None and journal.generation == generation and journal.phase in ("Failed", "Aborted"):
            return C.Cond(C.LAYOUT_APPLIED, "False", f"Reconfiguration{journal.phase}",
                          f"GPU {journal.gpu_index}: {journal.reason}")
        return C.Cond(C.LAYOUT_APPLIED, "True", "AsRequested", "every GPU has the requested layout")

    # ----------------------------------------------------------- operator mode
    def _reconcile_operator(self, spec: GPUNodeSpec, generation: int, snapshot: NodeSnapshot,
                            reconf: Mapping[str, Any] | None, labels: Mapping[str, str]) -> tuple[C.Cond, bool]:
        name, now = self.s.node_name, self.clock()
        desired, problems = self._desired(spec, snapshot)
        by_device, unresolved = self._busy_ctx
        idle: set[int] = set()
        for gpu in snapshot.gpus:
            current = [i.placed for i in gpu.instances]
            if busy_instances(gpu, by_device, unresolved):
                continue
            if not gpu.processes and not self.idle.not_idle_long_enough(gpu.info.uuid, current, now, self.s.idle_seconds):
                idle.add(gpu.info.index)
        active = dict(reconf) if reconf and reconf.get("mode") == "operator" and reconf.get("phase") == "Applying" else None
        if active is not None:
            started = dt.datetime.strptime(str(active["startedAt"]), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.timezone.utc)
            state = handshake_state(labels, str(active["migConfig"]), now - started.timestamp(),
                                    self.s.mig_config_timeout_seconds)
            if state == "pending":
                return C.Cond(C.LAYOUT_APPLIED, "False", "Reconfiguring",
                              f"waiting for mig-manager to apply {active['migConfig']}"), True
            phase = {"success": "Succeeded", "failed": "Failed", "timeout": "Failed"}[state]
            message = {"success": "mig-manager applied the config",
                       "failed": "mig-manager reported nvidia.com/mig.config.state=failed",
                       "timeout": f"no result from mig-manager within {self.s.mig_config_timeout_seconds:g}s"}[state]
            obj = self.kube.patch_gpunode_status(name, {"reconfiguration": {**active, "phase": phase, "message": message}})
            self._remember(obj)
            self.metrics.reconfigurations.labels(phase).inc()
            self._event("Normal" if phase == "Succeeded" else "Warning", f"MigReconfiguration{phase}", message)
            return C.Cond(C.LAYOUT_APPLIED, "True" if phase == "Succeeded" else "False",
                          "AsRequested" if phase == "Succeeded" else "ReconfigurationFailed", message), False
        plan = plan_node_config(name, generation, snapshot, desired, frozenset(idle))
        done = reconf if reconf and reconf.get("mode") == "operator" and reconf.get("targetGeneration") == generation else None
        if plan.changed and done is not None:
            # mig-manager already answered for this spec; asking again would loop. A new spec retries.
            return C.Cond(C.LAYOUT_APPLIED, "False", "ReconfigurationFailed" if done.get("phase") == "Failed"
                          else "LayoutMismatch", f"mig-manager {str(done.get('phase')).lower()} for generation "
                          f"{generation} ({done.get('message')}) but GPUs {list(plan.changed)} still differ"), False
        if not plan.changed:
            if plan.held or problems:
                held = {**{i: r for i, r in plan.held.items()}, **problems}
                return C.Cond(C.LAYOUT_APPLIED, "False", "WaitingForIdle" if plan.held else "LayoutRefused",
                              "; ".join(f"GPU {i}: {r}" for i, r in sorted(held.items()))), False
            return C.Cond(C.LAYOUT_APPLIED, "True", "AsRequested", "every GPU has the requested layout"), False
        for _ in range(3):  # read-modify-write of a shared ConfigMap, guarded by resourceVersion
            cm = self.kube.get_configmap(self.s.device_plugin_namespace, self.s.mig_parted_configmap)
            data = dict((cm or {}).get("data") or {})
            data[MIG_PARTED_KEY] = merge_mig_parted(data.get(MIG_PARTED_KEY), name, plan)
            try:
                self.kube.write_configmap(self.s.device_plugin_namespace, self.s.mig_parted_configmap, data,
                                          (cm or {}).get("metadata", {}).get("resourceVersion"))
                break
            except KubeError as exc:
                if not exc.conflict:
                    raise
        else:
            raise KubeError(409, f"ConfigMap {self.s.mig_parted_configmap} kept changing under us")
        entry = {"phase": "Applying", "mode": "operator", "migConfig": plan.name, "targetGeneration": generation,
                 "startedAt": _iso(now), "message": f"GPUs {list(plan.changed)} via mig-manager",
                 "step": 0, "plan": [{"op": "mig-config", "gpus": list(plan.changed)}]}
        self._remember(self.kube.patch_gpunode_status(name, {"reconfiguration": entry}))
        self.kube.patch_node(name, {"metadata": {"labels": {MIG_CONFIG_LABEL: plan.name}}})
        self._event("Normal", "MigReconfigurationStarted", f"set {MIG_CONFIG_LABEL}={plan.name} for GPUs {list(plan.changed)}")
        return C.Cond(C.LAYOUT_APPLIED, "False", "Reconfiguring", f"mig-manager applying {plan.name}"), True

    def _write_sharing_config(self, spec: GPUNodeSpec, labels: Mapping[str, str]) -> None:
        key = device_plugin_config_name(self.s.node_name)
        text = device_plugin_config(spec.sharing.mode, spec.sharing.replicas)
        if text == self._dp_config_written and labels.get(DEVICE_PLUGIN_CONFIG_LABEL) == key:
            return
        ns, cm_name = self.s.device_plugin_namespace, self.s.device_plugin_configmap
        cm = self.kube.get_configmap(ns, cm_name)
        data = dict((cm or {}).get("data") or {})
        if data.get(key) != text:
            data[key] = text
            self.kube.write_configmap(ns, cm_name, data, (cm or {}).get("metadata", {}).get("resourceVersion"))
            if labels.get(DEVICE_PLUGIN_CONFIG_LABEL) == key:
                # Same key, new content: the plugin only re-reads its config when it starts.
                self.kube.delete_node_pods(ns, self.s.device_plugin_selector, self.s.node_name)
        if labels.get(DEVICE_PLUGIN_CONFIG_LABEL) != key:
            self.kube.patch_node(self.s.node_name, {"metadata": {"labels": {DEVICE_PLUGIN_CONFIG_LABEL: key}}})
        self._dp_config_written = text

    # --------------------------------------------------------- emulation/status
    def _emulate_advertisement(self, snapshot: NodeSnapshot, node: Mapping[str, Any], spec: GPUNodeSpec | None) -> C.Cond:
        mode = spec.sharing.mode if spec else "none"
        replicas = spec.sharing.replicas if spec else 1
        adv = advertise(snapshot, mode, replicas)
        status_patch, meta_patch = node_patches(adv, node)
        if meta_patch:
            self.kube.patch_node(self.s.node_name, meta_patch)
        if status_patch:
            self.kube.patch_node_status(self.s.node_name, status_patch)
        summary = ", ".join(f"{k}={v}" for k, v in sorted(adv.resources.items())) or "nothing"
        return C.Cond(C.DEVICE_PLUGIN_READY, "True", "Emulated", f"SIMULATED device plugin advertises {summary}")

    def _publish(self, snapshot: NodeSnapshot, generation: int | None, sharing: Mapping[str, Any] | None,
                 previous: Mapping[str, Any], conds: list[C.Cond]) -> None:
        now = self.clock()
        merged = C.merge_conditions(previous.get("conditions") or [], conds, generation,
                                    dt.datetime.fromtimestamp(now, dt.timezone.utc))
        status = status_from_snapshot(snapshot, self._busy_ctx[0], observed_generation=generation, sharing=sharing,
                                      conditions=merged, reconfiguration=None)
        changed = status != self._last_status
        if now - self._last_patch < self.s.min_patch_seconds and not (changed and generation != (self._last_status or {}).get("observedGeneration")):
            return
        if not changed and now - self._last_patch < self.s.heartbeat_seconds:
            return
        self._remember(self.kube.patch_gpunode_status(self.s.node_name, status))
        self.metrics.patches.inc()
        self._last_status, self._last_patch = status, now


def _selects(selector: str, labels: Mapping[str, str]) -> bool:
    """Equality-based label selector ``a=b,c=d``."""
    for term in filter(None, (t.strip() for t in selector.split(","))):
        key, _, value = term.partition("=")
        if labels.get(key.strip()) != value.strip():
            return False
    return True
