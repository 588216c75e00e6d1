"""One controller cycle against the API: read, plan, write, measure.

``Controller.cycle`` lists GPUNodes, Nodes, pods and SharingPolicies (through
:class:`controller.kube.Kube`, the only API door; in ``controller run`` a
:class:`controller.watch_caches.CachedKube` answers from watch caches), builds the
snapshot (re-reading only the objects that changed since the last cycle,
:class:`controller.state.incremental.SnapshotCache`), runs the planner, and applies the result:

1. the per-GPU idle record (an annotation on each GPUNode);
2. new layouts and sharing configs (``GPUNode.spec``), and the mig-parted configs
   agents in GPU Operator mode ask for, into mig-manager's ConfigMap
   (``controller.writes.mig_configs``);
3. released pods: pin (affinity), then lift the gate — two guarded patches; on the DRA
   node pool the pod's ResourceClaim, pinned to the engine's device, is created first
   (``controller.dracycle``);
4. preemptions (``controller.planning.preemption``): the preemptor pinned with its victims
   recorded, then each victim's ``DisruptionTarget`` condition, Event and deletion
   (``controller.writes.preemption``);
5. evictions: pods of failed GPUs (``--evict-on-gpu-fault``) and, in namespaces whose
   right-sizing mode is ``Recreate``, pods far from their recommendation
   (``controller.planning.right_size_evictions``), both through one eviction writer.

Every write is independent: one failure is counted and logged, the rest of
the cycle goes on, and the next cycle starts again from what the API server
holds (nothing the controller remembers is needed to converge).
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any, TypeVar

from controller.dracycle import DraCycle
from controller.planning.draplan import DraPlacement, DraPlan
from controller.planning.evictions import Eviction, Outcome, eviction_outcome, evictions
from controller.planning.right_size_candidates import read_recommendations
from controller.planning.right_size_evictions import EvictionMemory, RightSizeEviction, namespace_modes, plan_evictions
from controller.planning.right_size_rollouts import make_before_break, rollout_patch
from controller.kube import Kube
from controller.planning.migplan import LayoutChange
from controller.writes.mig_configs import published_config
from controller.metrics import ControllerMetrics, cluster_figures
from controller.state.snapshot import FailedDevice, Snapshot
from controller.writes.wait_status import StatusPatch, placement_patches
from controller.writes.patches import gpus_spec, release_ops, sharing_spec
from controller.writes.preemption import (
    PREEMPTED_EVENT, disruption_patch, event_message, plain_preemptor_ops, preemptor_ops,
)
from controller.planning.budgets import protected_pods
from controller.planning.preemption import Preemption
from controller.planning.planner import Plan, Release, SharingChange, Wait, plan
from controller.settings import ControllerSettings
from controller.state.pods import pod_from_object
from controller.planning.readmit import readmissions, with_messages
from controller.writes.policy_status import needs_write, policy_reports, status_for
from controller.state.build import busy_by_node, encode_idle, idle_record, scoped, update_idle
from controller.state.incremental import SnapshotCache
from kube.errors import KubeError
from mig.migparted import MigConfigError
from sharing.api.crd import read_policies
from sharing.api.gpunode import MigConfigRequest
from sharing.api.kueue_workload import NEVER_EVENT, verdicts_by_pod
from sharing.admission.inventory import Inventory, build_inventory, name_and_labels
from kube.times import parse_time
from sharing.api.keys import IDLE_SINCE_ANNOTATION, MIG_PARTED_CONFIG_KEY

log = logging.getLogger("gpupack.controller")

_Item = TypeVar("_Item")
_Outcome = TypeVar("_Outcome")


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


@dataclass
class CycleReport:
    plan: Plan = field(default_factory=Plan)
    released: list[str] = field(default_factory=list)
    evicted: list[str] = field(default_factory=list)
    """Pods evicted from failed GPUs this cycle (``--evict-on-gpu-fault``)."""
    right_size_evicted: list[str] = field(default_factory=list)
    """Pods evicted this cycle to be recreated at their recommended size (``Recreate``)."""
    right_size_blocked: list[str] = field(default_factory=list)
    """Pods ``Recreate`` would evict this cycle that a PodDisruptionBudget kept (429)."""
    right_size_rolled_out: list[str] = field(default_factory=list)
    """Deployments (``namespace/name``) rolled out this cycle to resize their only replica (``Recreate``)."""
    preempted: list[str] = field(default_factory=list)
    """Pods deleted this cycle to make room for a pod of higher priority (``controller.planning.preemption``)."""
    readmitted: list[str] = field(default_factory=list)
    """Gated pods deleted for their owners to re-create, stranded in their mode (``controller.planning.readmit``)."""
    errors: list[str] = field(default_factory=list)
    dra: DraPlan = field(default_factory=DraPlan)
    """The DRA pool's placements and waits (``controller.planning.draplan``)."""
    allocation_ratio: float = 0.0
    fragmentation: float = 0.0
    seconds: float = 0.0


class Controller:
    def __init__(
        self, kube: Kube, settings: ControllerSettings, metrics: ControllerMetrics | None = None,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.kube = kube
        self.settings = settings
        self.metrics = metrics or ControllerMetrics()
        self.dra = DraCycle(kube)
        self.clock = clock
        self.snapshots = SnapshotCache()
        """Each object's reading, kept while the object does not change."""
        # What the last cycle logged: each entry is logged once, when it appears.
        self._skipped: frozenset[str] = frozenset()
        """GPUNode status entries left out as unreadable."""
        self._untrusted: frozenset[str] = frozenset()
        """Pods whose allocation is ignored."""
        self._stale: frozenset[str] = frozenset()
        """GPUNodes whose agent is silent."""
        self._evicted_to_size = EvictionMemory()
        """``Recreate``'s evictions of the last hour, per workload (its budget)."""
        self._blocked_to_size: frozenset[str] = frozenset()
        """Pods whose right-size eviction a PodDisruptionBudget refused last cycle (their Event is written)."""
        self._held_to_size: frozenset[str] = frozenset()
        self._unreadable_recs: frozenset[str] = frozenset()
        self._never_admitted: frozenset[str] = frozenset()
        """Pods Kueue can never admit, as of the last cycle (their Event is written)."""
        self._unreadable_workloads: frozenset[str] = frozenset()
        self._workloads_failing = False

    def cycle(self) -> CycleReport:
        began = time.perf_counter()
        report = CycleReport()
        now = self.clock()
        try:
            gpunodes = self.kube.list_gpunodes()
            pods = self.kube.list_pods()
            nodes, policies = self.kube.list_nodes(), self.kube.list_policies()
            namespaces = self.kube.list_namespaces()
        except KubeError as exc:
            self._fail(report, "read", str(exc))
            return report
        by_name = {str((g.get("metadata") or {}).get("name")): g for g in gpunodes}
        pod_objs = {f"{(p.get('metadata') or {}).get('namespace')}/{(p.get('metadata') or {}).get('name')}": p for p in pods}
        stale_after = self.settings.agent_stale_seconds
        snapshot = self.snapshots.build(gpunodes, nodes, pods, policies, now=now, stale_after_s=stale_after,
                                        namespaces=namespaces)
        if self._idle(snapshot, by_name, now, report):
            # The idle record is input to the planner: plan on what was just written.
            gpunodes = [by_name.get(str((g.get("metadata") or {}).get("name")), g) for g in gpunodes]
            snapshot = self.snapshots.build(gpunodes, nodes, pods, policies, now=now, stale_after_s=stale_after,
                                            namespaces=namespaces)
        self._policy_status(policies, snapshot, now, report)
        self._note_skipped(snapshot.skipped_entries)
        self._note_untrusted(snapshot.untrusted_pods)
        self._note_stale(snapshot)
        self._note_health(snapshot)
        self.metrics.reread.labels("gpunodes").set(self.snapshots.parsed_nodes)
        self.metrics.reread.labels("pods").set(self.snapshots.parsed_pods)
        requests, failed = snapshot.mig_config_requests, snapshot.failed_devices
        every_pod = snapshot.pods  # whose claims' pins are trusted: every namespace's, not only those placed here
        snapshot = self._with_kueue(scoped(snapshot, self.settings.namespace_list))
        result = plan(snapshot, now, policy_name=self.settings.policy, mig_mode_changes=self.settings.mig_mode_changes)
        budgets = _Budgets(self, pod_objs, report)
        protected = budgets.protecting(result.preemptions)
        if protected:  # a victim a PodDisruptionBudget protects: plan again, preferring others
            result = plan(snapshot, now, policy_name=self.settings.policy,
                          mig_mode_changes=self.settings.mig_mode_changes, protected=protected)
        report.plan = result
        self._apply_layouts(result, by_name, report)
        self._publish_mig_configs(requests, report)
        releases: list[tuple[Release, DraPlacement | None]] = [(r, None) for r in result.releases]
        try:
            report.dra = self.dra.plan(snapshot, now, self.settings.policy, every_pod)
            protected = budgets.protecting(report.dra.preemptions)
            if protected:
                report.dra = self.dra.plan(snapshot, now, self.settings.policy, every_pod, protected)
        except KubeError as exc:
            self._fail(report, "dra-claims", f"ResourceClaims not read, nothing placed on the DRA pool: {exc}")
        releases += [(Release(p.pod, p.node, p.reason), p) for p in report.dra.placements]
        self._release(releases, pod_objs, now, report)
        self._preempt((*result.preemptions, *report.dra.preemptions), pod_objs, now, report)
        result = self._readmit(result, snapshot, pod_objs, (gpunodes, nodes, policies, namespaces), now, report)
        self._placement_status(result, snapshot, pod_objs, now, report)
        if self.settings.evict_on_gpu_fault:
            self._evict(failed, pod_objs, report)
        self._right_size_evict(pod_objs, snapshot.untrusted_pods, policies, namespaces, now, report,
                               {n.name: n.gpu_memory_bytes for n in snapshot.nodes})
        ratio, frag, gpus = cluster_figures(snapshot, self.dra.holds)
        report.allocation_ratio, report.fragmentation = ratio, frag
        m = self.metrics
        m.allocation_ratio.set(ratio)
        m.fragmentation.set(frag)
        m.gpus.set(gpus)
        gated = [p for p in snapshot.pods if p.gated and p.key not in report.released]
        m.pending.set(len(gated))
        m.oldest_wait.set(max(((now - p.created).total_seconds() for p in gated), default=0.0))
        report.seconds = time.perf_counter() - began
        m.cycles.observe(report.seconds)
        return report

    # ------------------------------------------------------------------ steps
    def _placement_status(self, result: Plan, snapshot: Snapshot, pod_objs: Mapping[str, Mapping[str, Any]],
                          now: datetime, report: CycleReport) -> None:
        """Say why each gated pod waits (``controller.writes.wait_status``): one write when the reason changes.
        Pods arriving at 20/s each get one, so they are written ``write_workers`` at a time."""
        patches = placement_patches(result, snapshot, pod_objs, now, report.dra, set(report.released))
        self._note_never_admitted((*result.waiting, *report.dra.waiting))

        def write(patch: StatusPatch) -> None:
            self.kube.patch_pod_status(patch.namespace, patch.name, patch.body)

        # A pod deleted meanwhile (404): nothing to say.
        for patch, error in zip(patches, self._write_each(write, patches, gone_ok=True)):
            if error is not None:
                self._fail(report, "placement-status", f"{patch.key}: {error}")

    def _with_kueue(self, snapshot: Snapshot) -> Snapshot:
        """``snapshot`` with Kueue's verdict on the pods it holds (``sharing.api.kueue_workload``), read
        only while some pod carries Kueue's gate; as it was when Kueue's API is not served or unreadable
        (the held pods then say so). A failed read is logged when it starts failing, not every cycle."""
        if not any(p.queue_held and p.gated for p in snapshot.pods):
            return snapshot
        try:
            workloads = self.kube.list_workloads()
        except KubeError as exc:
            if not self._workloads_failing:
                log.warning("Kueue's Workloads not read (held pods say so): %s", exc)
            self._workloads_failing = True
            return snapshot
        self._workloads_failing = False
        if workloads is None:
            return snapshot
        verdicts, unreadable = verdicts_by_pod(workloads)
        self._unreadable_workloads = _log_new(self._unreadable_workloads, unreadable, "%s; left out")
        return replace(snapshot, kueue=verdicts, kueue_read=True)

    def _note_never_admitted(self, waits: Sequence[Wait]) -> None:
        """A Warning Event, once, on each pod Kueue says it can never admit (``Wait.never``), so its
        owner knows to fix the ClusterQueue's quota or the pod's request."""
        never = {w.pod: w.reason for w in waits if w.never}
        for key in sorted(never.keys() - self._never_admitted):
            namespace, _, name = key.partition("/")
            try:
                self.kube.event({"apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": name}, "Warning",
                                NEVER_EVENT, never[key])
            except KubeError as exc:
                log.warning("event on %s not recorded: %s", key, exc)
        self._never_admitted = frozenset(never)

    def _readmit(self, result: Plan, snapshot: Snapshot, pod_objs: Mapping[str, Mapping[str, Any]],
                 objects: tuple[Sequence[Mapping[str, Any]], ...], now: datetime, report: CycleReport) -> Plan:
        """Re-admit the pods stranded in the mode the webhook chose (``controller.planning.readmit``): delete
        those a controller owns (gated: they never ran), with preconditions on uid and
        resourceVersion, and say on the bare ones how to let gpupack choose again. The plan whose
        waits the Placement conditions then report."""
        gpunodes, nodes, policies, namespaces = objects

        def inventory() -> Inventory:
            # List items carry no kind: tag each so build_inventory reads it as what it is.
            return build_inventory([*gpunodes, *({**n, "kind": "Node"} for n in nodes),
                                    *({**p, "kind": "SharingPolicy"} for p in policies),
                                    *({**n, "kind": "Namespace"} for n in namespaces)])

        stranded = readmissions(result, snapshot, pod_objs, inventory, now)
        bare = {r.pod: r for r in stranded if r.owner is None}
        deleted: set[str] = set()
        for item in stranded:
            if item.owner is None:
                continue
            namespace, name = item.pod.split("/", 1)
            try:
                gone_now = self.kube.delete_pod(namespace, name, item.uid, item.resource_version)
            except KubeError as exc:
                if not exc.conflict:  # changed meanwhile (released, say): judged again next cycle
                    self._fail(report, "readmit", f"{item.pod}: {exc}")
                continue
            deleted.add(item.pod)
            if not gone_now:
                continue  # deleted by an earlier cycle: said then
            report.readmitted.append(item.pod)
            log.info("re-admitted %s: %s", item.pod, item.why)
            owner = {**item.owner, "namespace": namespace}
            try:
                self.kube.event(owner, "Normal", "Readmitted",
                                f"gpupack deleted gated pod {name} for its owner to re-create: re-admitted, {item.why}")
            except KubeError as exc:
                log.warning("event on %s not recorded: %s", item.pod, exc)
        return with_messages(result, bare, deleted) if stranded else result

    def _write_each(self, write: Callable[[_Item], object], items: Sequence[_Item], *,
                    gone_ok: bool = False) -> list[str | None]:
        """:meth:`_each` for writes: per item None, or the API's error in words (an object gone,
        404, is no error with ``gone_ok``)."""
        def attempt(item: _Item) -> str | None:
            try:
                write(item)
            except KubeError as exc:
                return None if gone_ok and exc.not_found else str(exc)
            return None

        return self._each(attempt, items)

    def _each(self, write: Callable[[_Item], _Outcome], items: Sequence[_Item]) -> list[_Outcome]:
        """``write`` for every item, ``write_workers`` round trips at a time; the outcomes in order.
        Items must be independent: at most one write per object (two answers of one object racing
        would leave the read-your-writes overlay with the older)."""
        if len(items) <= 1:
            return [write(item) for item in items]
        with ThreadPoolExecutor(max_workers=min(self.settings.write_workers, len(items))) as pool:
            return list(pool.map(write, items))

    def _idle(self, snapshot: Snapshot, by_name: dict[str, dict[str, Any]], now: datetime, report: CycleReport) -> bool:
        """Write each GPUNode's idle record where it changed; ``by_name`` gets a copy of each
        written GPUNode showing it (the objects read are shared with the caches: never changed)."""
        busy = busy_by_node(snapshot.nodes, snapshot.pods)
        todo: list[tuple[str, str]] = []
        for node in snapshot.nodes:
            obj = by_name.get(node.name)
            if obj is None:
                continue
            before = idle_record(obj)
            after = update_idle(before, busy[node.name], now)
            if after != before:
                todo.append((node.name, encode_idle(after)))

        def write(item: tuple[str, str]) -> None:
            name, value = item
            self.kube.patch_gpunode(name, {"metadata": {"annotations": {IDLE_SINCE_ANNOTATION: value}}})

        # In parallel: a new leader writes every node's record in its first cycle (1,250 round trips).
        outcomes = self._write_each(write, todo)
        changed = False
        for (name, value), error in zip(todo, outcomes):
            if error is not None:
                self._fail(report, "idle-record", f"{name}: {error}")
                continue
            obj = by_name[name]
            meta = obj.get("metadata") or {}
            annotations = {**(meta.get("annotations") or {}), IDLE_SINCE_ANNOTATION: value}
            by_name[name] = {**obj, "metadata": {**meta, "annotations": annotations}}
            changed = True
        return changed

    def _apply_layouts(self, result: Plan, by_name: Mapping[str, dict[str, Any]], report: CycleReport) -> None:
        """Write the planned MIG layouts, then the sharing switches: each a patch of one GPUNode's spec,
        the nodes of each step in parallel (one write per node and step)."""
        per_node: dict[str, list[LayoutChange]] = {}
        for change in result.layouts:
            per_node.setdefault(change.node, []).append(change)
        layouts = sorted(per_node.items())

        def write_layout(item: tuple[str, list[LayoutChange]]) -> None:
            name, changes = item
            self.kube.patch_gpunode(name, {"spec": {"gpus": gpus_spec(by_name.get(name, {}), changes)}})

        for (name, changes), error in zip(layouts, self._write_each(write_layout, layouts)):
            if error is not None:
                self._fail(report, "layout", f"{name}: {error}")
                continue
            for change in changes:
                self.metrics.reshapes.labels(change.kind).inc()
                log.info("layout: %s", change.reason)

        def write_sharing(sharing: SharingChange) -> None:
            self.kube.patch_gpunode(sharing.node, {"spec": {"sharing": sharing_spec(sharing)}})

        switches = list(result.sharing)
        for sharing, error in zip(switches, self._write_each(write_sharing, switches)):
            if error is not None:
                self._fail(report, "sharing", f"{sharing.node}: {error}")
                continue
            self.metrics.sharing_changes.labels("demand").inc()
            log.info("sharing: %s -> %s x%d (%s)", sharing.node, sharing.mode, sharing.replicas, sharing.reason)

    def _publish_mig_configs(self, requests: tuple[tuple[str, MigConfigRequest], ...], report: CycleReport) -> None:
        """Copy the mig-parted configs agents ask for (read with the snapshot) into mig-manager's
        ConfigMap (guarded read-modify-write)."""
        if not requests:
            return
        namespace, name = self.settings.mig_parted_namespace, self.settings.mig_parted_configmap
        where = f"ConfigMap {namespace}/{name}"
        for _ in range(3):
            try:
                cm = self.kube.get_configmap(namespace, name)
            except KubeError as exc:
                self._fail(report, "mig-configs", f"{where}: {exc}")
                return
            if cm is None:
                self._fail(report, "mig-configs", f"{where} does not exist: is the GPU Operator's mig-manager "
                                                  "installed (else set --mig-parted-configmap)?")
                return
            data = dict(cm.get("data") or {})
            try:
                text = published_config(data.get(MIG_PARTED_CONFIG_KEY), requests)
            except MigConfigError as exc:
                self._fail(report, "mig-configs", f"{where}: {MIG_PARTED_CONFIG_KEY} is not a mig-parted config, "
                                                  f"left as it is: {exc}")
                return
            if text is None:
                return
            data[MIG_PARTED_CONFIG_KEY] = text
            try:
                self.kube.write_configmap(namespace, name, data, (cm.get("metadata") or {}).get("resourceVersion"))
            except KubeError as exc:
                if exc.conflict:
                    continue
                self._fail(report, "mig-configs", f"{where}: {exc}")
                return
            log.info("mig-configs: %s holds %s", where, ", ".join(request.name for _, request in requests))
            return
        self._fail(report, "mig-configs", f"{where} kept changing under us; trying again next cycle")

    def _evict(self, failed: tuple[FailedDevice, ...], pod_objs: Mapping[str, dict[str, Any]],
               report: CycleReport) -> None:
        """Evict the pods of failed devices that their controllers recreate (``controller.planning.evictions``)."""
        allowed = set(self.settings.namespace_list)
        for eviction in evictions(failed, pod_objs):
            if allowed and eviction.namespace not in allowed:
                continue  # a scoped controller evicts only the pods it places
            if self._post_eviction(eviction, "gpu-fault", report) != "evicted":
                continue
            report.evicted.append(eviction.key)
            self.metrics.evictions.inc()
            try:
                self.kube.event({"apiVersion": "v1", "kind": "Pod", "namespace": eviction.namespace,
                                 "name": eviction.name}, "Warning", "EvictedFromFailedGpu",
                                f"gpupack evicted this pod: {eviction.why}; its controller recreates it elsewhere")
            except KubeError as exc:
                log.warning("event on %s not recorded: %s", eviction.key, exc)

    def _post_eviction(self, eviction: Eviction, cause: str, report: CycleReport) -> Outcome:
        """The controller's one eviction writer: the Eviction API, which honours PodDisruptionBudgets
        (``controller.planning.evictions.eviction_outcome`` reads its answer). ``cause``: who asks
        (``gpu-fault``, ``right-size``), for the log and the blocked-evictions metric."""
        try:
            self.kube.evict_pod(eviction.namespace, eviction.name)
        except KubeError as exc:
            outcome = eviction_outcome(exc.status)
            if outcome == "blocked":  # a PodDisruptionBudget says not now: next cycle
                self.metrics.evictions_blocked.labels(cause).inc()
                log.info("eviction of %s waits for its PodDisruptionBudget: %s", eviction.key, exc)
            elif outcome == "failed":
                grant = (f"; the controller may not evict pods: install {_EVICTION_GRANTS[cause]}"
                         if exc.status == 403 else "")
                self._fail(report, "evict", f"{eviction.key}: {exc}{grant}")
            return outcome
        log.info("evicted %s (%s): %s", eviction.key, cause, eviction.why)
        return "evicted"

    def _right_size_evict(self, pod_objs: Mapping[str, dict[str, Any]], untrusted: Sequence[str],
                          policies: Sequence[Mapping[str, Any]], namespaces: Sequence[Mapping[str, Any]],
                          now: datetime, report: CycleReport, gpu_memory: Mapping[str, int]) -> None:
        """``Recreate``: evict pods far from their workload's recommendation, within each workload's
        budget, never its last ready replica (``controller.planning.right_size_evictions``); a
        Deployment's only replica is moved by a rollout instead, where it surges. Reads the
        GPURecommendations only when some namespace is in ``Recreate``."""
        self._evicted_to_size.begin_cycle(now)
        allowed = set(self.settings.namespace_list)
        ignored = {entry.partition(": ")[0] for entry in untrusted}  # never resized: gpupack ignores their record
        pods = {k: p for k, p in pod_objs.items()
                if (not allowed or k.partition("/")[0] in allowed) and k not in ignored}
        specs = [(e.name, e.spec) for e in read_policies(policies) if e.spec is not None]
        labels = {name: own for name, own in map(name_and_labels, namespaces) if name is not None}
        modes = namespace_modes(specs, labels, {k.partition("/")[0] for k in pods})
        if not any(m.evicts for m in modes.values()):
            self._blocked_to_size = frozenset()
            return
        try:
            recommendations, problems = read_recommendations(self.kube.list_recommendations())
        except KubeError as exc:
            self._fail(report, "right-size-evict", f"GPURecommendations not read, no pod evicted: {exc}")
            return
        self._unreadable_recs = _log_new(self._unreadable_recs, tuple(problems), "GPURecommendation %s; ignored")
        chosen = plan_evictions(pods, modes, recommendations, self._evicted_to_size, now, gpu_memory=gpu_memory)
        held = chosen.held + tuple(self._roll_out(move, now, report) or "" for move in chosen.rollouts)
        self._held_to_size = _log_new(self._held_to_size, tuple(h for h in held if h), "Recreate leaves %s")
        blocked: set[str] = set()
        for item in chosen.evictions:
            eviction, pod_ref = item.eviction, {"apiVersion": "v1", "kind": "Pod", "namespace": item.eviction.namespace,
                                                "name": item.eviction.name}
            outcome = self._post_eviction(eviction, "right-size", report)
            if outcome == "blocked":
                blocked.add(eviction.key)
                if eviction.key in self._blocked_to_size:
                    continue  # said once while it stays blocked
                event = ("Warning", "RightSizeEvictionBlocked",
                         f"gpupack would evict this pod to resize it, but a PodDisruptionBudget forbids it now "
                         f"(it tries again each cycle): {eviction.why}")
            elif outcome == "evicted":
                self._evicted_to_size.record(item.workload, now)
                report.right_size_evicted.append(eviction.key)
                self.metrics.right_size_evictions.labels(item.reason).inc()
                event = ("Normal", "EvictedToRightSize",
                         f"gpupack evicted this pod to resize it: {eviction.why}; its controller recreates it")
            else:
                continue
            try:
                self.kube.event(pod_ref, *event)
            except KubeError as exc:
                log.warning("event on %s not recorded: %s", eviction.key, exc)
        self._blocked_to_size = frozenset(blocked)
        report.right_size_blocked = sorted(blocked)

    def _roll_out(self, move: RightSizeEviction, now: datetime, report: CycleReport) -> str | None:
        """Move a Deployment's only replica make-before-break by a rollout, where the Deployment
        would bring the new pod up first (``controller.planning.right_size_rollouts``); None, or why
        the pod stays."""
        namespace, name = move.workload.namespace, move.workload.name
        left = f"{move.eviction.key}: the last ready replica of {move.workload}"
        try:
            deployment = self.kube.get_deployment(namespace, name)
            if deployment is None:
                return None  # gone meanwhile
            refusal = make_before_break(deployment)
            if refusal is not None:
                return f"{left}, and a rollout would not bring its replacement up first: {refusal}"
            self.kube.patch_deployment(namespace, name, rollout_patch(deployment, now))
        except KubeError as exc:
            if not exc.conflict:  # changed meanwhile: judged again next cycle
                grant = "; install manifests/right-sizing-recreate" if exc.status == 403 else ""
                self._fail(report, "right-size-rollout", f"Deployment {namespace}/{name}: {exc}{grant}")
            return None
        self._evicted_to_size.record(move.workload, now)
        report.right_size_rolled_out.append(f"{namespace}/{name}")
        self.metrics.right_size_rollouts.labels(move.reason).inc()
        log.info("rolled out Deployment %s/%s to resize %s: %s", namespace, name, move.eviction.key, move.eviction.why)
        try:
            self.kube.event({"apiVersion": "apps/v1", "kind": "Deployment", "namespace": namespace, "name": name},
                            "Normal", "RolledOutToRightSize",
                            f"gpupack rolled out this Deployment to resize its only pod {move.eviction.name} "
                            f"(the new pod comes up before the old one goes): {move.eviction.why}")
        except KubeError as exc:
            log.warning("event on Deployment %s/%s not recorded: %s", namespace, name, exc)
        return None

    def _note_health(self, snapshot: Snapshot) -> None:
        """What the planner leaves out for GPU faults this cycle (metrics: also when it began to)."""
        m = self.metrics
        for node in snapshot.nodes:
            faulted = sum(1 for g in node.gpus if not g.healthy) + sum(
                len(g.unhealthy_instances) for g in node.gpus if g.healthy)
            m.faulted_devices.labels(node.name).set(faulted)
            m.degraded_node.labels(node.name).set(1 if node.degraded else 0)

    def _note_skipped(self, entries: tuple[str, ...]) -> None:
        """Log the GPUNode entries the one reader (``sharing.api.gpunode``) left out, once each; count them."""
        self._skipped = _log_new(self._skipped, entries, "GPUNode %s")
        self.metrics.skipped_entries.set(len(self._skipped))

    def _note_stale(self, snapshot: Snapshot) -> None:
        """Log a node turning stale or live again, once each; count the stale ones."""
        stale = frozenset(n.name for n in snapshot.nodes if n.stale)
        for node in snapshot.nodes:
            if node.stale and node.name not in self._stale:
                log.warning("GPUNode %s: agent silent for %.0f s (over %g s); not planning there until it reports",
                            node.name, node.silent_seconds or 0, self.settings.agent_stale_seconds)
        for name in sorted(self._stale - stale):
            log.info("GPUNode %s: agent reports again", name)
        self._stale = stale
        self.metrics.stale_gpunodes.set(len(stale))

    def _note_untrusted(self, pods: tuple[str, ...]) -> None:
        """Log pods whose allocation is ignored (``namespace/name: why``, ``Snapshot.untrusted_pods``), once
        each, with a Warning Event on the pod, so that its owner sees why gpupack leaves it alone; count them."""
        new = frozenset(pods) - self._untrusted
        self._untrusted = _log_new(self._untrusted, pods, "pod %s; ignored")
        self.metrics.untrusted_allocations.set(len(self._untrusted))
        for entry in sorted(new):
            key, _, why = entry.partition(": ")
            namespace, _, name = key.partition("/")
            try:
                self.kube.event({"apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": name}, "Warning",
                                "UntrustedAllocation", f"gpupack neither counts nor releases this pod: {why}")
            except KubeError as exc:
                log.warning("event on %s not recorded: %s", key, exc)

    def _policy_status(
        self, policies: list[dict[str, Any]], snapshot: Snapshot, now: datetime, report: CycleReport
    ) -> None:
        """Each SharingPolicy's status, written only when it says something new."""
        by_name = {str((p.get("metadata") or {}).get("name")): p for p in policies}
        for policy in policy_reports(policies, ((n.name, n.label_map) for n in snapshot.nodes)):
            previous = by_name[policy.name].get("status") or {}
            wanted = status_for(policy, previous, now)
            if not needs_write(previous, wanted):
                continue
            try:
                self.kube.patch_policy_status(policy.name, wanted)
            except KubeError as exc:
                if not exc.not_found:  # deleted meanwhile: nothing to report on
                    self._fail(report, "policy-status", f"SharingPolicy {policy.name}: {exc}")

    def _release(self, releases: Sequence[tuple[Release, DraPlacement | None]], pods: Mapping[str, dict[str, Any]],
                 now: datetime, report: CycleReport) -> None:
        """Pin and ungate released pods, several at once: each pod is one round trip (two on the DRA
        pool: its ResourceClaim is created first, ``controller.dracycle``)."""
        todo = [(r, pods[r.pod], dra) for r, dra in releases if r.pod in pods]
        if not todo:
            return
        outcomes = self._each(lambda item: self._release_one(*item), todo)
        for (_, obj, _), (release, error) in zip(todo, outcomes):
            if error is not None:
                self._fail(report, "release", f"{release.pod}: {error}")
                continue
            report.released.append(release.pod)
            self.metrics.releases.inc()
            created = parse_time((obj.get("metadata") or {}).get("creationTimestamp"))
            if created is not None:
                self.metrics.wait.observe(max(0.0, (now - created).total_seconds()))
            log.info("released %s to %s (%s)", release.pod, release.node, release.reason)

    def _preempt(self, preemptions: Sequence[Preemption], pods: Mapping[str, Mapping[str, Any]], now: datetime,
                 report: CycleReport) -> None:
        """Apply the plan's preemptions (``controller.writes.preemption``): pin the preemptor and record
        its victims first (nothing is deleted if that fails), then each victim's condition, Event and
        deletion. One at a time: preemptions are rare, and each is a few round trips."""
        allowed = set(self.settings.namespace_list)
        for preemption in preemptions:
            obj = pods.get(preemption.preemptor)
            if obj is None:
                continue
            outside = [v.key for v in preemption.victims if allowed and v.key.partition("/")[0] not in allowed]
            if outside:  # a scoped controller deletes only the pods it places
                log.info("not preempting for %s: %s outside this controller's namespaces", preemption.preemptor,
                         ", ".join(outside))
                continue
            if not preemption.resumed:
                namespace, name = preemption.preemptor.split("/", 1)
                parsed = pod_from_object(obj)
                uids = [v.uid for v in preemption.victims]
                try:
                    ops = (plain_preemptor_ops(obj, preemption.node, uids) if preemption.plain else
                           preemptor_ops(obj, preemption.node, uids,
                                         pinned=parsed is not None and parsed.node == preemption.node))
                    self.kube.json_patch_pod(namespace, name, ops)
                except (KubeError, ValueError) as exc:
                    if preemption.plain and isinstance(exc, KubeError) and exc.invalid:
                        # Its resourceVersion test failed: kube-scheduler bound or updated it since the plan.
                        log.info("not preempting for %s: it changed since this cycle's snapshot (planned again "
                                 "next cycle)", preemption.preemptor)
                        continue
                    self._fail(report, "preempt", f"{preemption.preemptor} not pinned, nothing preempted: {exc}")
                    continue
                self.metrics.preemptions.labels(preemption.kind or "unknown").inc()
                log.info("preempting for %s: %s", preemption.preemptor, preemption.reason)
            for victim in preemption.victims:
                self._preempt_victim(preemption, victim.key, victim.uid, victim.priority, now, report)

    def _preempt_victim(self, preemption: Preemption, key: str, uid: str, priority: int, now: datetime,
                        report: CycleReport) -> None:
        namespace, name = key.split("/", 1)
        try:
            self.kube.patch_pod_status(namespace, name, disruption_patch(preemption, now))
        except KubeError as exc:
            if exc.not_found:
                return  # gone already: nothing to preempt
            self._fail(report, "preempt", f"{key}: DisruptionTarget condition not written: {exc}")
        try:
            self.kube.event({"apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": name, "uid": uid},
                            "Normal", PREEMPTED_EVENT, event_message(preemption, priority))
        except KubeError as exc:
            log.warning("event on %s not recorded: %s", key, exc)
        try:
            gone_now = self.kube.delete_pod(namespace, name, uid, None)
        except KubeError as exc:
            self._fail(report, "preempt", f"{key} not deleted: {exc}")
            return
        if gone_now:
            report.preempted.append(key)
            log.info("preempted %s for %s on %s", key, preemption.preemptor, preemption.node)

    def _release_one(self, release: Release, obj: Mapping[str, Any],
                     dra: DraPlacement | None = None) -> tuple[Release, str | None]:
        namespace, name = release.pod.split("/", 1)
        if dra is not None:
            prepared = self.dra.prepare(dra, obj)
            if isinstance(prepared, str):
                return release, prepared
            release = prepared
        try:
            parsed = pod_from_object(obj)
            ops = release_ops(obj, release.node, pinned=parsed is not None and parsed.node == release.node)
            if ops:
                self.kube.json_patch_pod(namespace, name, ops)
        except (KubeError, ValueError) as exc:
            return release, str(exc)
        return release, None

    def _fail(self, report: CycleReport, stage: str, message: str) -> None:
        report.errors.append(f"{stage}: {message}")
        self.metrics.reconcile_errors.labels(stage).inc()
        log.warning("%s failed: %s", stage, message)


class _Budgets:
    """The PodDisruptionBudgets' protected pods, read at most once a cycle and only when a plan preempts
    (``controller.planning.budgets``). Unreadable budgets (no grant, API down) protect nothing: the
    preemption goes on as kube-scheduler's would, and the failure is reported."""

    def __init__(self, controller: Controller, pods: Mapping[str, Mapping[str, Any]], report: CycleReport) -> None:
        self.controller, self.pods, self.report = controller, pods, report
        self._protected: frozenset[str] | None = None

    def protecting(self, preemptions: Sequence[Preemption]) -> frozenset[str]:
        """The protected pods when one of ``preemptions``' victims is among them; else empty."""
        if not preemptions:
            return frozenset()
        if self._protected is None:
            try:
                budgets = self.controller.kube.list_pod_disruption_budgets()
            except KubeError as exc:
                self.controller._fail(self.report, "budgets", f"PodDisruptionBudgets not read, preempting "  # noqa: SLF001
                                      f"without them: {exc}")
                budgets = []
            self._protected = protected_pods(budgets, self.pods)
        victims = {v.key for p in preemptions for v in p.victims}
        return self._protected if victims & self._protected else frozenset()


_EVICTION_GRANTS = {"gpu-fault": "manifests/gpu-fault-evictions", "right-size": "manifests/right-sizing-recreate"}
"""The optional component that grants ``create`` on ``pods/eviction``, per cause."""


def _log_new(logged: frozenset[str], entries: tuple[str, ...], message: str) -> frozenset[str]:
    """Warn about each entry not warned about last cycle (``message % entry``); the entries, for next time."""
    current = frozenset(entries)
    for entry in sorted(current - logged):
        log.warning(message, entry)
    return current
