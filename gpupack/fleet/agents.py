"""SIMULATION: many simulated nodes' agents in one process (``gpupack agent fleet``).

A fleet serves every Node annotated ``gpupack.io/simulated-gpus=MODEL:COUNT``
(:data:`sharing.api.keys.SIMULATED_GPUS_ANNOTATION`; optionally only those a label
selector picks), typically KWOK nodes, so that 1,250 simulated nodes need one
process instead of 1,250. Each node gets what ``gpupack agent run --simulate
MODEL:COUNT --emulate-device-plugin --node NAME`` would give it, built by the same
code: its own ``node.agent.Agent`` with its own simulated NVML backend (opened by
the function the CLI passes in, the one ``agent run`` uses), its own emulated
device plugin, idle clocks, health monitor and metrics. A node labelled
``gpupack.io/backend=dra`` gets the ``dra`` backend instead (the agent publishes its
ResourceSlices; no kubelet plugin runs for it, as for ``agent run --backend dra``).

What is shared is only what costs the API server:

- **reads** come from watch caches (``gpupack.fleet.kube``): one list and one watch per
  kind for the whole fleet instead of five requests per node per tick;
- **ticks** are driven by :class:`gpupack.fleet.schedule.FleetSchedule`: a few worker
  threads, each agent's :meth:`~node.agent.Agent.step` (the step ``run_forever``
  loops over) run at the time it asked for, or earlier when something it reads
  changes. The first steps of the nodes found at start are spread over
  ``stagger_seconds``, so their heartbeats do not all fall in the same second.

Nodes that appear or lose the annotation while the fleet runs are added or dropped
(a node whose annotation or backend label changes gets a new agent). A node whose
annotation cannot be served (a malformed ``MODEL:COUNT``, an unknown model, a state
file for another count) is logged once and gets a Warning Event; the others go on.

Per node and in total the fleet counts the API requests it makes, by verb and
resource (``gpupack.fleet.kube.ApiCounts``), and reports them (:meth:`Fleet.report`,
the Prometheus endpoint).
"""

from __future__ import annotations

import logging
import threading
import time
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from kube.errors import KubeError
from kube.informer import wait_all_synced
from node.agent import Agent, Pause
from gpupack.fleet.kube import FLEET, ApiCounts, Kind, SharedKube, reads, writes
from gpupack.fleet.schedule import FleetSchedule, Step
from node.health.xids import XID_TABLE_CONFIGMAP
from node.metrics import AgentMetrics
from node.nvml.protocol import NvmlBackend
from node.base.settings import AgentSettings
from sharing.api.backend import node_backend
from sharing.api.keys import SIMULATED_GPUS_ANNOTATION

log = logging.getLogger("gpupack.fleet")

BackendOpener = Callable[[AgentSettings], tuple[NvmlBackend | None, str]]
"""Opens a node's NVML backend from its settings: ``gpupack.cli_agent.open_backend``, what ``agent run`` calls."""


@dataclass(frozen=True)
class FleetSettings:
    agent: AgentSettings = field(default_factory=lambda: AgentSettings(poll_seconds=30.0))
    """Every node's agent settings but its name, simulated GPUs and backend. ``poll_seconds`` is long
    (30 s) because a change of anything the agent reads wakes it at once; ``heartbeat_seconds`` stays
    the agent's 60 s: the one write per node per minute a fleet at rest makes."""
    selector: str = ""
    """Label selector narrowing the annotated Nodes served (empty: all of them)."""
    workers: int = 4
    """Threads stepping agents. Steps are mostly Python (the GIL) plus the API writes' round trips:
    a few threads hide the round trips; more only contend."""
    state_dir: str = ""
    """Directory for each node's simulated NVML state (``NODE.json``), so a restarted fleet sees the same
    GPUs; empty: in memory."""
    metrics_port: int = 0
    """One Prometheus endpoint for the whole fleet (each agent's metrics with a ``node`` label); 0: off."""
    report_every_seconds: float = 60.0
    """A log line this often: nodes served, steps per second, API writes per node per minute; 0: never."""
    stagger_seconds: float = 10.0
    """The first steps of the nodes found at start are spread over this long (by a hash of the name)."""
    sync_timeout_seconds: float = 60.0
    """How long to wait for the caches' first lists before serving anyway (the caches keep trying)."""

    def validate(self) -> None:
        self.agent.validate()
        if self.workers < 1:
            raise ValueError(f"workers must be at least 1, got {self.workers}")
        for name in ("report_every_seconds", "stagger_seconds", "sync_timeout_seconds"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative, got {getattr(self, name)}")


@dataclass
class Member:
    """One served node."""

    name: str
    simulated: str
    """The annotation's ``MODEL:COUNT``."""
    backend_label: str
    agent: Agent


@dataclass(frozen=True)
class FleetReport:
    """What the fleet did between two reports."""

    nodes: int
    seconds: float
    steps: int
    requests: Mapping[Kind, int]
    """Requests made by the agents' steps (the caches' own lists and watches are in ``fleet_requests``)."""
    fleet_requests: Mapping[Kind, int]
    informer_lists: int
    lag_seconds: float = 0.0
    """Seconds the steps started after they were due, summed."""

    @property
    def steps_per_second(self) -> float:
        return self.steps / self.seconds if self.seconds > 0 else 0.0

    @property
    def mean_lag_seconds(self) -> float:
        return self.lag_seconds / self.steps if self.steps else 0.0

    @property
    def writes_per_node_minute(self) -> float:
        if self.seconds <= 0 or self.nodes == 0:
            return 0.0
        return writes(self.requests) / self.nodes / (self.seconds / 60.0)

    def line(self) -> str:
        kinds = ", ".join(f"{verb} {resource} {n}" for (verb, resource), n in sorted(self.requests.items())) or "none"
        return (f"{self.nodes} nodes served; {self.steps_per_second:.2f} steps/s, {self.mean_lag_seconds:.2f}s late "
                f"on average; "
                f"{self.writes_per_node_minute:.2f} API writes per node per minute; "
                f"{reads(self.requests)} API reads by agents; {self.informer_lists} cache lists in all; "
                f"over {self.seconds:.0f}s: {kinds}")


class Fleet:
    def __init__(self, settings: FleetSettings, kube: SharedKube, counts: ApiCounts, open_backend: BackendOpener,
                 *, clock: Callable[[], float] = time.monotonic) -> None:
        self.s = settings
        self.kube = kube
        self.counts = counts
        self.open_backend = open_backend
        self.clock = clock
        self.members: dict[str, Member] = {}
        self.schedule = FleetSchedule(clock)
        self._refused: dict[str, str] = {}
        """Node -> the annotation value refused last (so a refusal is reported once)."""
        self._members_lock = threading.Lock()
        self._last_report: tuple[float, int, dict[str, Counter[Kind]], float] = (clock(), 0, {}, 0.0)
        kube.wake = self.schedule.wake

    # ------------------------------------------------------------------ membership
    def wanted(self) -> dict[str, tuple[str, str]]:
        """Node -> (``MODEL:COUNT``, backend label) for every cached Node with the annotation."""
        out: dict[str, tuple[str, str]] = {}
        for node in self.kube.caches.nodes.items():
            meta = node.get("metadata") or {}
            value = (meta.get("annotations") or {}).get(SIMULATED_GPUS_ANNOTATION)
            if value is not None and meta.get("name"):
                out[str(meta["name"])] = (str(value), node_backend(meta.get("labels")))
        return out

    def settings_for(self, name: str, simulated: str, backend: str) -> AgentSettings:
        """What ``agent run --node NAME --simulate MODEL:COUNT --emulate-device-plugin`` would run with (on a
        ``dra`` node: ``--backend dra`` instead of the emulator)."""
        state = str(Path(self.s.state_dir) / f"{name}.json") if self.s.state_dir else ""
        return self.s.agent.with_(node_name=name, simulate=simulated, state_file=state, metrics_port=0,
                                  backend=backend, emulate_device_plugin=backend != "dra")

    def sync(self, *, stagger: bool = False) -> None:
        """Serve the annotated Nodes the cache holds now; drop the others."""
        wanted = self.wanted()
        with self._members_lock:
            for name in [n for n, m in self.members.items() if wanted.get(n) != (m.simulated, m.backend_label)]:
                self._drop(name)
            for name, (simulated, backend) in sorted(wanted.items()):
                if name not in self.members:
                    self._add(name, simulated, backend, self._stagger(name) if stagger else 0.0)
            for name in set(self._refused) - set(wanted):
                del self._refused[name]

    def _stagger(self, name: str) -> float:
        return (zlib.crc32(name.encode()) % 1000) / 1000.0 * self.s.stagger_seconds

    def _add(self, name: str, simulated: str, backend: str, delay_s: float) -> None:
        if self._refused.get(name) == f"{simulated} {backend}":
            return
        try:
            settings = self.settings_for(name, simulated, backend)
            settings.validate()
            nvml, error = self.open_backend(settings)
        except Exception as exc:  # noqa: BLE001 - one node's bad annotation must not stop the others
            self._refuse(name, simulated, backend, exc)
            return
        self._refused.pop(name, None)
        agent = Agent(settings, nvml, self.kube, backend_error=error, metrics=AgentMetrics())
        self.members[name] = Member(name, simulated, backend, agent)
        self.schedule.add(name, agent.step, delay_s)
        log.info("serving node %s: %s simulated GPUs, %s backend", name, simulated, backend)

    def _refuse(self, name: str, simulated: str, backend: str, exc: Exception) -> None:
        self._refused[name] = f"{simulated} {backend}"
        message = f"node {name} not served: annotation {SIMULATED_GPUS_ANNOTATION}={simulated!r}: {exc}"
        log.warning("%s", message)
        node = self.kube.caches.nodes.get(name) or {}
        involved = {"apiVersion": "v1", "kind": "Node", "name": name,
                    "uid": (node.get("metadata") or {}).get("uid")}
        try:
            with self.counts.acting_for(name):
                self.kube.event(involved, "Warning", "SimulatedGpusInvalid", message)
        except KubeError as exc2:
            log.warning("event SimulatedGpusInvalid on node %s not recorded: %s", name, exc2)

    def _drop(self, name: str, *, quiet: bool = False) -> None:
        member = self.members.pop(name)
        self.schedule.remove(name)
        if member.agent.backend is not None:
            member.agent.backend.close()
        if not quiet:
            log.info("node %s no longer served", name)

    # ------------------------------------------------------------------ stepping
    def run_step(self, name: str, step: Step) -> Pause:
        """One node's step, its API requests counted as that node's; never raises (``Agent.step`` does not
        either: this is the last guard of a worker thread)."""
        try:
            with self.counts.acting_for(name):
                return step()
        except Exception:  # noqa: BLE001
            log.exception("node %s: step failed outside the agent's own handling", name)
            return Pause(self.s.agent.poll_seconds, on_change=False)

    def start_caches(self) -> None:
        self.kube.caches.start()
        missing = wait_all_synced(self.kube.caches.all(), self.s.sync_timeout_seconds)
        if missing:
            log.warning("caches not filled after %.0fs: %s; serving what they hold (they keep trying)",
                        self.s.sync_timeout_seconds, ", ".join(missing))

    def run_once(self) -> FleetReport:
        """Fill the caches, step every served node once (on ``workers`` threads), stop; what it did."""
        self.start_caches()
        try:
            self.sync()
            self._last_report = self._now_counts()
            with ThreadPoolExecutor(self.s.workers, thread_name_prefix="fleet") as pool:
                done = list(pool.map(lambda m: self.run_step(m.name, m.agent.step), list(self.members.values())))
            self.schedule.steps += len(done)
            return self.report()
        finally:
            self.close()

    def run(self, stop: threading.Event) -> None:
        """Serve until ``stop`` is set."""
        self.start_caches()
        self.sync(stagger=True)
        log.info("fleet serving %d nodes with %d workers", len(self.members), self.s.workers)
        workers = [threading.Thread(target=self.schedule.work, args=(self.run_step,), name=f"fleet-{i}", daemon=True)
                   for i in range(self.s.workers)]
        for worker in workers:
            worker.start()
        self._last_report = self._now_counts()
        next_report = self.clock() + self.s.report_every_seconds
        version = self.kube.caches.nodes.version
        try:
            while not stop.is_set():
                version = self.kube.caches.nodes.wait_changed(version, 1.0)
                self.sync()
                if self.s.report_every_seconds and self.clock() >= next_report:
                    next_report = self.clock() + self.s.report_every_seconds
                    log.info("fleet: %s", self.report().line())
        finally:
            self.schedule.stop()
            for worker in workers:
                worker.join(timeout=30)
            self.close()

    def close(self) -> None:
        self.kube.caches.stop()
        with self._members_lock:
            served = len(self.members)
            for name in list(self.members):
                self._drop(name, quiet=True)
        log.info("fleet stopped: %d nodes no longer served", served)

    # ------------------------------------------------------------------ reporting
    def _now_counts(self) -> tuple[float, int, dict[str, Counter[Kind]], float]:
        return self.clock(), self.schedule.steps, self.counts.by_node(), self.schedule.lag_seconds

    def report(self) -> FleetReport:
        """What happened since the previous report (or the start)."""
        (then, steps_then, counts_then, lag_then), now = self._last_report, self._now_counts()
        self._last_report = now
        agents: Counter[Kind] = Counter()
        fleet: Counter[Kind] = Counter()
        for node, counts in now[2].items():
            delta = counts - counts_then.get(node, Counter())
            (fleet if node == FLEET else agents).update(delta)
        return FleetReport(len(self.members), now[0] - then, now[1] - steps_then, dict(agents), dict(fleet),
                           self.kube.caches.lists(), now[3] - lag_then)

    def node_requests(self) -> dict[str, Counter[Kind]]:
        """Every request so far per served node."""
        counts = self.counts.by_node()
        return {name: counts.get(name, Counter()) for name in self.members}

    # ------------------------------------------------------------------ metrics
    def serve_metrics(self) -> CollectorRegistry | None:
        if not self.s.metrics_port:
            return None
        registry = CollectorRegistry()
        registry.register(FleetCollector(self))
        start_http_server(self.s.metrics_port, registry=registry)
        return registry


class FleetCollector:
    """The fleet's own metrics, and every served agent's (``node.metrics``) with a ``node`` label."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet

    def collect(self) -> Iterator[Metric]:
        fleet = self.fleet
        nodes = GaugeMetricFamily("gpupack_fleet_nodes", "Nodes the fleet serves.")
        nodes.add_metric([], len(fleet.members))
        yield nodes
        steps = CounterMetricFamily("gpupack_fleet_steps", "Agent steps run.")
        steps.add_metric([], fleet.schedule.steps)
        yield steps
        lag = CounterMetricFamily("gpupack_fleet_step_lag_seconds",
                                  "Seconds the agents' steps started after they were due, summed (grows faster than "
                                  "steps when the workers cannot keep up).")
        lag.add_metric([], fleet.schedule.lag_seconds)
        yield lag
        lists = CounterMetricFamily("gpupack_fleet_cache_lists", "Lists made by the fleet's watch caches.")
        lists.add_metric([], fleet.kube.caches.lists())
        yield lists
        requests = CounterMetricFamily("gpupack_fleet_api_requests",
                                       "API requests by verb and resource; by: agents' steps, or the caches (fleet).",
                                       labels=["verb", "resource", "by"])
        summed: Counter[tuple[str, str, str]] = Counter()
        for node, counts in fleet.counts.by_node().items():
            by = "fleet" if node == FLEET else "agents"
            for (verb, resource), n in counts.items():
                summed[(verb, resource, by)] += n
        for labels, n in sorted(summed.items()):
            requests.add_metric(list(labels), n)
        yield requests
        yield from merged_with_node_label((m.name, m.agent.metrics.registry) for m in list(fleet.members.values()))


def merged_with_node_label(registries: Iterable[tuple[str, CollectorRegistry]]) -> Iterator[Metric]:
    """The metrics of several registries as one family per name, each sample labelled with its ``node``."""
    families: dict[str, Metric] = {}
    for node, registry in registries:
        for family in registry.collect():
            merged = families.get(family.name)
            if merged is None:
                merged = families[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
            for sample in family.samples:
                merged.add_sample(sample.name, {**sample.labels, "node": node}, sample.value, sample.timestamp,
                                  sample.exemplar)
    yield from families.values()


def fleet_configmaps(settings: AgentSettings) -> list[tuple[str, str]]:
    """The ConfigMaps every agent reads on its own schedule, cached for the fleet: the XID table."""
    return [(settings.namespace, XID_TABLE_CONFIGMAP)]


__all__ = ["BackendOpener", "Fleet", "FleetReport", "FleetSettings", "Member", "fleet_configmaps"]

