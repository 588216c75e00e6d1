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
   (simulation), and publish status (rate-limited) with conditions and metrics;
6. attribute the GPUs' use to pods (``node.usage``), export it as metrics
   (``pod_usage``) and aggregate it per pod container into the right-sizer's histories,
   written to ``status.usage`` at most every ``usage_publish_seconds``
   (``node.usage.publication``).

The agent is the loop; its parts are chosen once, when it starts, and it never
asks which it got:

- how a layout is applied (steps 3-4): ``node.layouts`` (NVML directly, or
  mig-manager), by ``--mode``;
- how the GPUs are advertised (steps 2, 4, 5): ``node.advertising`` (the stock
  device plugin, or its emulator on simulated nodes; on a DRA node pool,
  ``--backend dra``, the node's ResourceSlices instead);
- which pod owns which device (step 1): ``node.process_owners`` (the kubelet's
  PodResources API and ``/proc``, or the simulator's process ids).

Parts see the agent as ``node.base.context.AgentContext`` and import nothing of it.

Journal writes are never rate-limited: they are the write-ahead log of a reshape,
and an NVML step only runs after its journal write succeeded.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx
from pydantic import ValidationError

from kube.backoff import Backoff
from kube.errors import KubeError
from kube.times import format_time
from mig.model import PlacedInstance
from node.base import conditions as C
from node.base.dcgm import Activity, parse_activity
from node.advertising import advertiser_for
from node.health.monitor import HealthMonitor
from node.base.snapshot import GpuSnapshot, NodeSnapshot, known_from_status, read_snapshot, status_from_snapshot
from node.layouts import layouts_for
from node.base.kube import Kube
from node.metrics import AgentMetrics
from node.nvml.errors import NvmlError
from node.nvml.protocol import GpuInstance, NvmlBackend
from node.base.idle_tracking import IdleTracker
from node.base.reshape_rules import ReshapeRules, reshape_rules
from node.base.pods import PodUse, busy_instances, pod_uses
from node.process_owners import process_owners_for
from node.usage.attribution import Poll, attribute
from node.usage.publication import UsageAggregator, allocated_memory
from node.usage.sampler import ProcessSampler
from sharing.usage.trace_clock import trace_time
from node.base.settings import AgentSettings
from sharing.api.crd import MAX_SHARED_IN_USE, GPUNodeSpec, LayoutRefusal, to_wire
from sharing.api.keys import SHARED_RESOURCE, mig_profile_of

log = logging.getLogger("gpupack.agent")
EVENT_REPEAT_SECONDS = 600.0
MAX_BACKOFF_SECONDS = 15.0
"""The longest pause between attempts while the API server or NVML fails: the agent notices
an outage has ended within about this long."""


@dataclass(frozen=True)
class Pause:
    """What :meth:`Agent.step` asks for before the next step."""

    seconds: float
    """How long to wait (0: go again at once)."""
    on_change: bool
    """A change of this node's GPUNode (its spec, a health acknowledgement) may end the wait early. False
    while backing off after a failure or while a reshape is under way (short, fixed pauses)."""


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
        self.busy_ctx: tuple[dict[str, list[str]], list[PodUse]] = ({}, [])
        self._sample_failure = ""
        self._usage_pods: tuple[list[PodUse], list[dict[str, Any]]] | None = None
        """The last tick's pod uses and pods, which :meth:`sample_usage` attributes to."""
        self.layouts = layouts_for(settings.mode)
        self.advertiser = advertiser_for(settings)
        self.owners = process_owners_for(backend, settings)
        self.sampler = ProcessSampler()
        self.usage = UsageAggregator()
        self._usage_restored = False
        self._usage_at: float | None = None
        """When the histories were last considered for publication (the first tick's time: the first
        publication is one interval after start)."""
        self._usage_written: dict[str, Any] | None = None
        self._dcgm_at = -1e18
        self.rules = ReshapeRules(settings.idle_seconds)
        self._policy_warning = ""
        self._dcgm_cache: Activity | None = None
        self.ticks = 0
        self.health = HealthMonitor(settings.unhealthy_taint_effect)
        self._known: dict[int, GpuSnapshot] = {}
        """Each GPU as last seen answering NVML: what a lost GPU is reported as."""
        self.backoff = Backoff(base_s=min(settings.poll_seconds, MAX_BACKOFF_SECONDS), max_s=MAX_BACKOFF_SECONDS)

    # ------------------------------------------------------------------ plumbing
    def remember(self, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        self._rv = str(meta.get("resourceVersion") or self._rv)
        # Every write returns the whole object: a spec change that landed during this tick
        # shows up here, and the loop must not then wait for a watch event that already passed.
        self._latest_generation = int(meta.get("generation") or self._latest_generation)

    def event(self, type_: str, reason: str, message: str) -> None:
        key, now = (reason, message), self.clock()
        if now - self._events.get(key, -1e18) < EVENT_REPEAT_SECONDS:
            return
        if len(self._events) > 256:  # messages carry durations etc.: forget the old ones
            self._events = {k: t for k, t in self._events.items() if now - t < EVENT_REPEAT_SECONDS}
        self._events[key] = now
        involved = {"apiVersion": "gpupack.io/v1alpha1", "kind": "GPUNode", "name": self.s.node_name, "uid": self._uid}
        try:
            self.kube.event(involved, type_, reason, message)
        except KubeError as exc:
            log.warning("event %s not recorded: %s", reason, exc)

    def withheld(self, snapshot: NodeSnapshot) -> frozenset[str]:
        return self.health.withdrawn(snapshot)

    def faulted(self) -> frozenset[tuple[int, int | None]]:
        return frozenset(self.health.last.faults)

    def snapshot(self) -> NodeSnapshot:
        if self.backend is None:
            return NodeSnapshot("nvml", error=self.backend_error or "NVML backend not available")
        snapshot = read_snapshot(self.backend, self.backend.kind, self._dcgm_activity(), self._known)
        self._known.update({g.info.index: g for g in snapshot.gpus if not g.lost and g.error is None})
        return snapshot

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

    def busy(self, index: int, instances: tuple[GpuInstance, ...]) -> frozenset[PlacedInstance]:
        """Re-read right before every NVML step: processes now, plus the tick's pod map."""
        assert self.backend is not None
        with_process = {p.gi_id for p in self.backend.processes(index) if p.gi_id is not None}
        by_device, unresolved = self.busy_ctx
        unknown = {p for u in unresolved if (p := mig_profile_of(u.resource)) is not None}
        return frozenset(i.placed for i in instances
                         if i.gi_id in with_process or by_device.get(i.uuid) or i.profile in unknown)

    # ---------------------------------------------------------------------- tick
    def tick(self) -> float:
        """One pass; returns how long to wait before the next (seconds)."""
        self.ticks += 1
        name = self.s.node_name
        node = self.kube.get_node(name)
        obj = self.kube.get_gpunode(name) or self.kube.create_gpunode(name, (node.get("metadata") or {}).get("uid"))
        self.remember(obj)
        self._uid = str(obj["metadata"].get("uid", ""))
        generation = int(obj["metadata"].get("generation") or 0)
        self._processed_generation = generation
        status = obj.get("status") or {}
        labels: dict[str, str] = dict((node.get("metadata") or {}).get("labels") or {})
        conds: list[C.Cond] = []
        self.rules = self._reshape_rules(labels)
        try:
            spec: GPUNodeSpec | None = GPUNodeSpec.model_validate(obj.get("spec") or {})
            conds.append(C.Cond(C.SPEC_VALID, "True", "Valid", "spec accepted"))
        except ValidationError as exc:
            spec = None
            conds.append(C.Cond(C.SPEC_VALID, "False", "InvalidSpec", str(exc)[:2000]))

        if not self._known:  # a restarted agent: a GPU lost meanwhile is reported as its predecessor saw it
            self._known = known_from_status(status)
        if not self._usage_restored:  # a restarted agent goes on with the histories it published
            self._usage_restored = True
            self.usage.restore(status)
            # What the API server holds: nothing to write while it stays empty; what a predecessor
            # wrote is rewritten at the first interval (its gone pods are dropped then).
            self._usage_written = None if status.get("usage") else to_wire(self.usage.usage())
        snapshot = self.snapshot()
        pods = self.kube.list_node_pods(name)
        uses = pod_uses(pods, name)
        replicas = spec.sharing.replicas if spec else 1
        if self.advertiser.allocate(self, snapshot, uses, labels, replicas):
            snapshot = self.snapshot()
        self.busy_ctx = self.owners.pods_by_device(snapshot, uses)
        now = self.clock()
        for gpu in snapshot.gpus:
            # Idle clocks run for every GPU from the agent's start, not only once a spec asks for a change.
            self.idle.observe(gpu.info.uuid, [i.placed for i in gpu.instances],
                              busy_instances(gpu, *self.busy_ctx), now)
        shared = spec is not None and spec.sharing.mode in ("mps", "time-slicing") and spec.sharing.replicas > 1
        self.health.refresh_table(self, self.s.namespace, now)
        self.health.tick(self, snapshot, obj, self.busy_ctx[0], dt.datetime.fromtimestamp(now, dt.timezone.utc),
                         shared=shared)
        self.advertiser.health(self, self.health.withdrawn(snapshot), self.health.plugin_restart_needed(snapshot))
        conds.append(self.health.condition(snapshot))
        if snapshot.error:
            conds.append(C.Cond(C.NVML_READY, "False", "NvmlUnavailable", snapshot.error))
            self.metrics.nvml_errors.labels("unavailable").inc()
        else:
            detail = f"{len(snapshot.gpus)} GPU(s) via {snapshot.backend}" + (
                "; " + "; ".join(snapshot.warnings) if snapshot.warnings else "")
            conds.append(C.Cond(C.NVML_READY, "True", "Simulated" if snapshot.backend == "simulated" else "Ready", detail))
            for warning in snapshot.warnings:
                self.event("Warning", "GpuInventoryWarning", warning)

        wait = self.s.poll_seconds
        reconf = status.get("reconfiguration")
        refusals: Mapping[int, LayoutRefusal] = {}
        if spec is not None and snapshot.error is None:
            report = self.layouts.reconcile(self, spec, generation, snapshot, reconf, labels)
            conds.append(report.condition)
            refusals = report.refusals
            if report.active:
                wait = min(wait, 0.5)
            snapshot = self.snapshot()
            node = self.kube.get_node(name)
            labels = dict((node.get("metadata") or {}).get("labels") or {})
        # inUse: the replicas the node's pods hold, so the webhook's choice of a mode for an auto pod
        # sees a full node as full (unreported, it took every replica as free: issue 33, item 5).
        sharing = {"mode": spec.sharing.mode, "replicas": spec.sharing.replicas,
                   "inUse": min(MAX_SHARED_IN_USE, sum(u.count for u in uses if u.resource == SHARED_RESOURCE))} if spec else None
        conds.extend(self.advertiser.publish(self, snapshot, node, spec, labels))
        self._mark_node(node, len(snapshot.gpus))
        self._publish(snapshot, generation if spec else status.get("observedGeneration"), sharing, status, conds,
                      refusals)
        busy_gi = {g.info.index: g.busy_gi_ids() for g in snapshot.gpus}
        self.metrics.observe(snapshot, busy_gi)
        self.metrics.observe_health(self.health.last, snapshot, now)
        self._observe_pod_usage(snapshot, uses, pods, now)
        self._usage_pods = (uses, pods)
        return wait

    def sample_usage(self) -> None:
        """One sample of the pods' GPU use between ticks (``usage_sample_seconds``): NVML read anew,
        the pods and their devices as the last tick saw them (a pod gone since has no process left to
        attribute; one new since waits for the next tick)."""
        if not self.s.pod_usage or self.backend is None or self._usage_pods is None:
            return
        snapshot = self.snapshot()
        if snapshot.error is None:
            self._observe_pod_usage(snapshot, *self._usage_pods, self.clock())

    def _observe_pod_usage(self, snapshot: NodeSnapshot, uses: list[PodUse], pods: list[dict[str, Any]],
                           now: float) -> None:
        """Per-pod use of this poll, as metrics and into the published histories (``node.usage``);
        the tick's last snapshot and pod map."""
        if not self.s.pod_usage or self.backend is None:
            return
        samples = self.sampler.read(self.backend, snapshot)
        poll = Poll(snapshot, uses, self.busy_ctx[0], self.owners.pods_by_pid(snapshot, uses), samples,
                    self._dcgm_activity())
        attributed = attribute(poll)
        self.metrics.observe_pod_usage(attributed)
        self.usage.observe(attributed, {u.key: u.uid for u in uses}, snapshot, allocated_memory(pods),
                           self._usage_time(now))
        self.metrics.observe_pod_limits(self.usage.limits())
        self._publish_usage(now)

    def _usage_time(self, now: float) -> float:
        """When this poll's use happened on the histories' clock: the wall's, or with
        ``usage_trace_clock`` the played trace's (``sharing.usage.trace_clock``)."""
        player = getattr(self.backend, "player", None)
        if not self.s.usage_trace_clock or player is None:
            return now
        return trace_time(now, player.start_s, player.time_scale)

    def _publish_usage(self, now: float) -> None:
        """``status.usage`` every ``usage_publish_seconds`` at most, and only when it changed."""
        if self._usage_at is None:
            self._usage_at = now
        if now - self._usage_at < self.s.usage_publish_seconds:
            return
        self._usage_at = now
        usage = self.usage.usage()
        wire = to_wire(usage)
        if wire == self._usage_written:
            return
        stamped = {**wire, "publishedTime": format_time(now)}
        self.remember(self.kube.patch_gpunode_status(self.s.node_name, {"usage": stamped}))
        self.metrics.usage_patches.inc()
        self._usage_written = wire

    def _mark_node(self, node: Mapping[str, Any], gpu_count: int) -> None:
        """The degraded label and the unhealthy taint (``node.health.monitor``)."""
        patch = self.health.node_patch(node, gpu_count)
        if patch is not None and "spec" in patch:
            # Taints are a list, written guarded by resourceVersion: compute it from the Node as it is now.
            patch = self.health.node_patch(self.kube.get_node(self.s.node_name), gpu_count)
        if patch is not None:
            self.kube.patch_node(self.s.node_name, patch)

    def _reshape_rules(self, labels: Mapping[str, str]) -> ReshapeRules:
        """The SharingPolicies selecting this node; the agent's own settings if none can be read."""
        try:
            policies = self.kube.list_sharing_policies()
        except KubeError as exc:
            if str(exc) != self._policy_warning:
                self._policy_warning = str(exc)
                log.warning("SharingPolicies unreadable, using the agent's own idle time: %s", exc)
            return ReshapeRules(self.s.idle_seconds, problems=(f"SharingPolicies unreadable: {exc}",))
        rules = reshape_rules(labels, policies, self.s.idle_seconds)
        for problem in rules.problems:
            self.event("Warning", "SharingPolicyIgnored", problem)
        return rules

    def step(self) -> Pause:
        """One tick with the loop's failure handling: what ``run_forever`` does before it waits, and what
        a host of many agents (``gpupack.fleet.agents``) calls. A failing tick backs off (:class:`kube.backoff.Backoff`),
        logged once per change; the answer says how long to wait and whether a change of the GPUNode may
        end the wait early."""
        try:
            wait = self.tick()
        except Exception as exc:  # noqa: BLE001 - back off and retry; never crash-loop the DaemonSet
            return Pause(self._failed(exc), on_change=False)
        self._recovered()
        if self._latest_generation != self._processed_generation:
            return Pause(0.0, on_change=False)  # the spec changed while we worked: go again now
        if wait < self.s.poll_seconds or not self._rv:
            return Pause(wait, on_change=False)
        return Pause(wait, on_change=True)

    def run_forever(self, stop: Callable[[], bool] = lambda: False) -> None:
        """:meth:`step` until ``stop``, waiting as each step says (a GPUNode watch ends a wait early)."""
        while not stop():
            pause = self.step()
            if stop():
                break
            try:
                if self.s.usage_sample_seconds > 0 and self.s.pod_usage and pause.seconds > 0:
                    self._sampling_wait(pause.seconds, stop)
                elif pause.on_change:
                    self.kube.wait_gpunode_change(self.s.node_name, self._rv, pause.seconds)
                elif pause.seconds > 0:
                    self.sleep(pause.seconds)
            except Exception as exc:  # noqa: BLE001 - a failed watch backs off like a failed tick
                seconds = self._failed(exc)
                if not stop():
                    self.sleep(seconds)

    def _sampling_wait(self, seconds: float, stop: Callable[[], bool]) -> None:
        """Wait ``seconds``, sampling the pods' use every ``usage_sample_seconds`` meanwhile. A failed
        sample is logged once per kind of failure and waits for the next; the tick reports NVML and API
        errors as it always does."""
        end = self.clock() + seconds
        while not stop():
            left = end - self.clock()
            if left <= 0:
                return
            self.sleep(min(left, self.s.usage_sample_seconds))
            if end - self.clock() <= 0:
                return  # the tick that follows samples too
            try:
                self.sample_usage()
            except Exception as exc:  # noqa: BLE001 - a sample is best effort; the tick handles failures
                problem = type(exc).__name__
                if problem != self._sample_failure:
                    log.warning("usage sample between ticks failed (%s); the next tick samples as usual", exc)
                self._sample_failure = problem
            else:
                self._sample_failure = ""

    def _failed(self, exc: Exception) -> float:
        """Count and (once per change of state) log a failed attempt; returns the pause before the next."""
        if isinstance(exc, KubeError):
            self.metrics.api_errors.labels(str(exc.status)).inc()
            problem, what = f"Kubernetes API {exc.status}", f"Kubernetes API error: {exc}"
        elif isinstance(exc, NvmlError):
            self.metrics.nvml_errors.labels(exc.name).inc()
            problem, what = f"NVML {exc.name}", f"NVML error outside a reconfiguration step: {exc}"
        else:
            problem, what = f"{type(exc).__name__}: {exc}", "agent tick failed"
        pause, news = self.backoff.failed(problem)
        self._last_patch = -1e18  # the first tick that works again writes status: the controller sees us back
        self.metrics.consecutive_failures.set(self.backoff.failures)
        self.metrics.backoff_seconds.set(pause)
        if news:  # once per change of state, not once per attempt
            log.warning("%s; retrying with back-off (next in %.1fs, at most %.0fs)", what, pause, MAX_BACKOFF_SECONDS,
                        exc_info=not isinstance(exc, (KubeError, NvmlError)))
        else:
            log.debug("%s (failure %d in a row)", what, self.backoff.failures)
        return pause

    def _recovered(self) -> None:
        ended = self.backoff.succeeded()
        if ended:
            log.info("recovered after %d failed attempts", ended)
            self.metrics.consecutive_failures.set(0)
            self.metrics.backoff_seconds.set(0)

    # ------------------------------------------------------------------ status
    def _publish(self, snapshot: NodeSnapshot, generation: int | None, sharing: Mapping[str, Any] | None,
                 previous: Mapping[str, Any], conds: list[C.Cond], refusals: Mapping[int, LayoutRefusal]) -> None:
        now = self.clock()
        merged = C.merge_conditions(previous.get("conditions") or [], conds, generation,
                                    dt.datetime.fromtimestamp(now, dt.timezone.utc))
        status = status_from_snapshot(snapshot, self.busy_ctx[0], observed_generation=generation, sharing=sharing,
                                      conditions=merged, reconfiguration=None, refusals=refusals,
                                      health=self.health.health_by_device(), degraded=self.health.last.degraded,
                                      memory_signals=self.health.tracker.memory_seen)
        changed = status != self._last_status
        # A new spec answered, or a fault begun or ended, is published at once: the controller and the
        # webhook must stop using a failed device as soon as possible (node.health).
        began_or_ended = bool(self.health.last.began or self.health.last.ended)
        urgent = changed and (generation != (self._last_status or {}).get("observedGeneration") or began_or_ended)
        if now - self._last_patch < self.s.min_patch_seconds and not urgent:
            return
        if not changed and now - self._last_patch < self.s.heartbeat_seconds:
            return
        # The heartbeat is what tells the controller this agent is alive (sharing.api.gpunode reads it).
        self.remember(self.kube.patch_gpunode_status(self.s.node_name, {**status, "heartbeatTime": format_time(now)}))
        self.metrics.patches.inc()
        self._last_status, self._last_patch = status, now

