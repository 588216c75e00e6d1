"""The agent fleet (``gpupack.fleet.agents``): its schedule, its shared reads, and its nodes coming and going.

The agents are the real ``node.agent.Agent`` with simulated GPUs; the API server is an
in-memory stand-in behind ``gpupack.fleet.kube.SharedKube``'s write calls (our own wrapper),
and its watch caches are fed events by hand, so a test decides when the cache catches up.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Mapping
from typing import Any

import pytest
from kubernetes import client

from gpupack.cli_agent import open_backend
from kube.informer import Informer
from node.agent import Pause
from gpupack.fleet.agents import Fleet, FleetSettings, merged_with_node_label
from gpupack.fleet.kube import ApiCounts, FleetCaches, SharedKube, request_kind
from gpupack.fleet.schedule import FleetSchedule
from node.metrics import AgentMetrics
from node.base.settings import AgentSettings
from sharing.api.keys import BACKEND_LABEL, SIMULATED_GPUS_ANNOTATION


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


# ---------------------------------------------------------------------- schedule
def recording(ran: list[str]) -> Any:
    """A runner that notes which node it stepped."""
    def run(name: str, step: Any) -> Pause:
        ran.append(name)
        pause: Pause = step()
        return pause
    return run


def test_wakeups_before_a_step_coalesce_into_one_step() -> None:
    clock, ran = Clock(), list[str]()
    schedule = FleetSchedule(clock)
    schedule.add("a", lambda: Pause(30.0, on_change=True))
    assert schedule.run_due(recording(ran)) == 1
    for _ in range(5):
        schedule.wake("a")
    assert schedule.run_due(recording(ran)) == 1
    assert ran == ["a", "a"]
    assert schedule.due_of("a") == 130.0  # then it waits for its poll again
    clock.t = 130.0
    assert schedule.run_due(lambda name, step: step()) == 1


def test_a_wakeup_during_a_step_runs_it_again_right_after() -> None:
    schedule = FleetSchedule(Clock())

    def step() -> Pause:
        schedule.wake("a")  # something changed while the agent was reading
        return Pause(30.0, on_change=True)

    schedule.add("a", step)
    item = schedule.take()
    assert item is not None and schedule.take() is None  # running: never handed out twice
    schedule.done("a", item[1]())
    assert schedule.due_of("a") == 100.0


def test_a_node_backing_off_is_not_woken() -> None:
    clock = Clock()
    schedule = FleetSchedule(clock)
    schedule.add("a", lambda: Pause(8.0, on_change=False))  # what Agent.step answers after a failure
    schedule.run_due(lambda name, step: step())
    schedule.wake("a")
    schedule.wake(None)
    assert schedule.run_due(lambda name, step: step()) == 0 and schedule.due_of("a") == 108.0


def test_wake_all_and_removed_nodes() -> None:
    schedule = FleetSchedule(Clock())
    for name in ("a", "b", "c"):
        schedule.add(name, lambda: Pause(30.0, on_change=True), delay_s=5.0)
    schedule.remove("b")
    schedule.wake(None)
    ran: list[str] = []
    schedule.run_due(recording(ran))
    assert sorted(ran) == ["a", "c"] and "b" not in schedule


def test_workers_never_step_one_node_twice_at_once() -> None:
    schedule = FleetSchedule()
    inside: dict[str, int] = {}
    overlaps, steps = [], []
    lock = threading.Lock()

    def step_of(name: str) -> Any:
        def step() -> Pause:
            with lock:
                inside[name] = inside.get(name, 0) + 1
                if inside[name] > 1:
                    overlaps.append(name)
            time.sleep(0.002)
            with lock:
                inside[name] -= 1
                steps.append(name)
            return Pause(0.001, on_change=True)
        return step

    for name in "abc":
        schedule.add(name, step_of(name))
    workers = [threading.Thread(target=schedule.work, args=(lambda n, s: s(),)) for _ in range(4)]
    for worker in workers:
        worker.start()
    deadline = time.monotonic() + 0.5
    while time.monotonic() < deadline:
        schedule.wake(None)
    schedule.stop()
    for worker in workers:
        worker.join(5)
    assert not overlaps and len(set(steps)) == 3 and not any(w.is_alive() for w in workers)


# ---------------------------------------------------------------------- requests
@pytest.mark.parametrize(("method", "url", "kind"), [
    ("GET", "https://h:6443/api/v1/nodes/n1", ("get", "nodes")),
    ("GET", "https://h:6443/api/v1/nodes?labelSelector=a", ("list", "nodes")),
    ("GET", "https://h:6443/api/v1/pods?watch=true&fieldSelector=x", ("watch", "pods")),
    ("PATCH", "https://h:6443/api/v1/nodes/n1/status", ("patch", "nodes/status")),
    ("POST", "https://h:6443/api/v1/namespaces/default/events", ("create", "events")),
    ("PATCH", "https://h:6443/apis/gpupack.io/v1alpha1/gpunodes/n1/status", ("patch", "gpunodes/status")),
    ("GET", "https://h:6443/api/v1/namespaces/gpupack-system/configmaps/x", ("get", "configmaps")),
    ("PUT", "https://h:6443/apis/resource.k8s.io/v1/resourceslices/s", ("update", "resourceslices")),
], ids=lambda v: v if isinstance(v, str) and not v.startswith("http") else None)
def test_request_kind(method: str, url: str, kind: tuple[str, str]) -> None:
    assert request_kind(method, url) == kind


def test_requests_are_counted_per_node_acting() -> None:
    counts = ApiCounts()
    counts.record(("watch", "pods"))
    with counts.acting_for("n1"):
        counts.record(("patch", "gpunodes/status"))
    assert counts.by_node() == {"": {("watch", "pods"): 1}, "n1": {("patch", "gpunodes/status"): 1}}


# ---------------------------------------------------------------------- shared reads
def _informer(name: str) -> Informer:
    def lister(**_kw: Any) -> Any:
        raise AssertionError("the test feeds this cache by hand")
    return Informer(name, lister)


def node_obj(name: str, rv: int, *, simulated: str | None = "A100-40GB:2", labels: Mapping[str, str] | None = None,
             allocatable: Mapping[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "uid": f"uid-{name}", "resourceVersion": str(rv),
                            "labels": {"kubernetes.io/hostname": name, **(labels or {})}}
    if simulated is not None:
        meta["annotations"] = {SIMULATED_GPUS_ANNOTATION: simulated}
    resources = {"cpu": "8", "pods": "110", **(allocatable or {})}
    return {"metadata": meta, "spec": {}, "status": {"capacity": dict(resources), "allocatable": dict(resources)}}


def pod_obj(name: str, node: str, rv: int, gpus: int = 0) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "resourceVersion": str(rv)},
            "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"limits": limits}}]},
            "status": {"phase": "Running"}}


class FakeApi(SharedKube):
    """SharedKube whose writes land in memory: the answer is what an API server would send; the caches
    see the change only when the test calls :meth:`catch_up` (a watch lags)."""

    def __init__(self) -> None:
        caches = FleetCaches(_informer("nodes"), _informer("gpunodes"), _informer("pods"), _informer("policies"),
                             {("gpupack-system", "gpupack-xid-table"): _informer("xid")})
        super().__init__(client.ApiClient(client.Configuration()), caches)
        self.rv = 1000
        self.server: dict[tuple[str, str], dict[str, Any]] = {}
        self.pending: list[tuple[Informer, dict[str, Any]]] = []
        self.writes: list[tuple[str, str]] = []
        self.events: list[tuple[str, str]] = []
        self.woken: list[str | None] = []
        self.wake = self.woken.append

    def feed(self, informer: Informer, event: str, obj: dict[str, Any]) -> None:
        informer.apply({"type": event, "object": obj})

    def put(self, kind: str, obj: dict[str, Any]) -> None:
        """The API server holds ``obj`` (with a new resourceVersion); the caches hear of it later."""
        self.rv += 1
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self.server[(kind, obj["metadata"]["name"])] = obj
        self.pending.append((self.caches.nodes if kind == "nodes" else self.caches.gpunodes, obj))

    def catch_up(self) -> None:
        for informer, obj in self.pending:
            self.feed(informer, "MODIFIED" if informer.get(obj["metadata"]["name"]) else "ADDED", obj)
        self.pending = []

    def _answer(self, kind: str, name: str) -> dict[str, Any]:
        return copy.deepcopy(self.server[(kind, name)])

    def create_gpunode(self, name: str, node_uid: str | None) -> dict[str, Any]:
        if ("gpunodes", name) in self.server:
            raise AssertionError(f"GPUNode {name} created twice: the agent did not read its own write")
        self.writes.append(("create", name))
        self.put("gpunodes", {"metadata": {"name": name, "generation": 1, "uid": f"g-{name}"}, "spec": {}})
        obj = self._answer("gpunodes", name)
        self._wrote("gpunodes", obj, _trigger("gpunodes"))
        return obj

    def patch_gpunode_status(self, name: str, status: Mapping[str, Any]) -> dict[str, Any]:
        self.writes.append(("patch gpunodes/status", name))
        current = self._answer("gpunodes", name)
        current["status"] = {**(current.get("status") or {}), **copy.deepcopy(dict(status))}
        self.put("gpunodes", current)
        obj = self._answer("gpunodes", name)
        self._wrote("gpunodes", obj, _trigger("gpunodes"))
        return obj

    def patch_node(self, name: str, patch: Mapping[str, Any]) -> None:
        self.writes.append(("patch nodes", name))
        current = self._answer("nodes", name)
        labels = current["metadata"].setdefault("labels", {})
        for key, value in (patch.get("metadata") or {}).get("labels", {}).items():
            if value is None:
                labels.pop(key, None)
            else:
                labels[key] = value
        self.put("nodes", current)
        self._wrote("nodes", self._answer("nodes", name), _trigger("nodes"))

    def patch_node_status(self, name: str, patch: Mapping[str, Any]) -> None:
        self.writes.append(("patch nodes/status", name))
        current = self._answer("nodes", name)
        for key in ("capacity", "allocatable"):
            current["status"][key] = {**current["status"].get(key, {}), **patch["status"][key]}
        self.put("nodes", current)
        self._wrote("nodes", self._answer("nodes", name), _trigger("nodes"))

    def event(self, involved: Mapping[str, Any], type_: str, reason: str, message: str,
              host: str | None = None) -> None:
        self.events.append((str(involved.get("name")), reason))

    def add_node(self, obj: dict[str, Any]) -> None:
        self.server[("nodes", obj["metadata"]["name"])] = copy.deepcopy(obj)
        self.feed(self.caches.nodes, "ADDED", obj)


def _trigger(kind: str) -> Any:
    from gpupack.fleet import kube as fleet_kube
    return fleet_kube._node_trigger if kind == "nodes" else fleet_kube._gpunode_trigger


def test_reads_come_from_the_caches_and_pods_are_indexed_by_node() -> None:
    kube = FakeApi()
    kube.add_node(node_obj("n1", 5))
    kube.feed(kube.caches.pods, "ADDED", pod_obj("p1", "n1", 6))
    kube.feed(kube.caches.pods, "ADDED", pod_obj("p2", "n2", 7))
    kube.feed(kube.caches.policies, "ADDED", {"metadata": {"name": "pol", "resourceVersion": "8"}})
    kube.feed(kube.caches.configmaps[("gpupack-system", "gpupack-xid-table")], "ADDED",
              {"metadata": {"name": "gpupack-xid-table", "namespace": "gpupack-system", "resourceVersion": "9"},
               "data": {"xids.yaml": ""}})
    assert kube.get_node("n1")["metadata"]["uid"] == "uid-n1"
    assert [p["metadata"]["name"] for p in kube.list_node_pods("n1")] == ["p1"]
    assert [p["metadata"]["name"] for p in kube.list_node_pods("n2")] == ["p2"]
    assert [p["metadata"]["name"] for p in kube.list_sharing_policies()] == ["pol"]
    assert kube.get_configmap("gpupack-system", "gpupack-xid-table") is not None
    assert kube.get_gpunode("n1") is None
    kube.feed(kube.caches.pods, "DELETED", pod_obj("p1", "n1", 10))
    assert kube.list_node_pods("n1") == []
    with pytest.raises(Exception) as missing:
        kube.get_node("nope")
    assert "404" in str(missing.value)
    # What a reader gets is its own copy: changing it leaves the cache alone.
    kube.get_node("n1")["metadata"]["labels"]["x"] = "y"
    assert "x" not in kube.get_node("n1")["metadata"]["labels"]


def test_an_agent_reads_its_own_writes_before_the_cache_has_them() -> None:
    kube = FakeApi()
    kube.add_node(node_obj("n1", 5))
    created = kube.create_gpunode("n1", "uid-n1")
    assert kube.get_gpunode("n1") == created  # the cache has not seen it yet
    kube.patch_gpunode_status("n1", {"reconfiguration": {"phase": "Destroying"}})
    assert kube.get_gpunode("n1")["status"]["reconfiguration"]["phase"] == "Destroying"  # type: ignore[index]
    kube.catch_up()
    assert len(kube.written) == 0  # the cache caught up: the overlay is gone
    assert kube.get_gpunode("n1")["status"]["reconfiguration"]["phase"] == "Destroying"  # type: ignore[index]


def test_what_wakes_a_node() -> None:
    kube = FakeApi()
    kube.add_node(node_obj("n1", 5))
    gpunode = {"metadata": {"name": "n1", "generation": 1, "resourceVersion": "6"}, "spec": {}}
    kube.server[("gpunodes", "n1")] = gpunode
    kube.feed(kube.caches.gpunodes, "ADDED", gpunode)
    kube.woken.clear()
    kube.patch_gpunode_status("n1", {"heartbeatTime": "now"})
    kube.patch_node("n1", {"metadata": {"labels": {"nvidia.com/gpu.count": "2"}}})
    kube.catch_up()
    assert kube.woken == []  # the echoes of its own writes
    status_only = {**kube.server[("gpunodes", "n1")], "status": {"other": 1}}
    status_only["metadata"] = {**status_only["metadata"], "resourceVersion": "2000"}
    kube.feed(kube.caches.gpunodes, "MODIFIED", status_only)
    assert kube.woken == []  # status is the agent's own business
    spec = copy.deepcopy(status_only)
    spec["metadata"].update(generation=2, resourceVersion="2001")
    spec["spec"] = {"sharing": {"mode": "mps", "replicas": 2}}
    kube.feed(kube.caches.gpunodes, "MODIFIED", spec)
    kube.feed(kube.caches.pods, "ADDED", pod_obj("p1", "n1", 2002))
    kube.feed(kube.caches.policies, "ADDED", {"metadata": {"name": "pol", "resourceVersion": "2003"}})
    assert kube.woken == ["n1", "n1", None]


# ---------------------------------------------------------------------- the fleet
def _fleet(kube: FakeApi, **agent: Any) -> Fleet:
    settings = FleetSettings(agent=AgentSettings(poll_seconds=30.0, min_patch_seconds=0.01, **agent), workers=2)
    return Fleet(settings, kube, ApiCounts(), open_backend, clock=Clock())


def test_nodes_come_and_go_and_a_bad_annotation_is_reported_once() -> None:
    kube = FakeApi()
    kube.add_node(node_obj("n1", 5))
    kube.add_node(node_obj("bad", 6, simulated="A100-40GB"))
    kube.add_node(node_obj("plain", 7, simulated=None))
    kube.add_node(node_obj("dra", 8, labels={BACKEND_LABEL: "dra"}))
    fleet = _fleet(kube)
    fleet.sync()
    fleet.sync()
    assert sorted(fleet.members) == ["dra", "n1"]
    assert fleet.members["n1"].agent.s.emulate_device_plugin and fleet.members["n1"].agent.s.simulate == "A100-40GB:2"
    assert fleet.members["dra"].agent.s.backend == "dra" and not fleet.members["dra"].agent.s.emulate_device_plugin
    assert kube.events == [("bad", "SimulatedGpusInvalid")]
    kube.feed(kube.caches.nodes, "DELETED", node_obj("dra", 9))
    kube.feed(kube.caches.nodes, "MODIFIED", node_obj("n1", 10, simulated="A100-40GB:4"))
    kube.feed(kube.caches.nodes, "MODIFIED", node_obj("bad", 11, simulated="A100-40GB:1"))
    fleet.sync()
    assert sorted(fleet.members) == ["bad", "n1"] and "dra" not in fleet.schedule
    assert fleet.members["n1"].agent.s.simulate == "A100-40GB:4"  # a new agent for the new GPUs
    fleet.close()


def test_fleet_agents_publish_and_then_write_only_heartbeats() -> None:
    kube = FakeApi()
    for name in ("n1", "n2"):
        kube.add_node(node_obj(name, 5, simulated="T4:2"))  # no MIG: the whole GPUs are advertised
    kube.feed(kube.caches.pods, "ADDED", pod_obj("p1", "n1", 6, gpus=1))
    fleet = _fleet(kube, heartbeat_seconds=60.0)
    fleet.sync()
    assert fleet.schedule.run_due(fleet.run_step) == 2
    for name in ("n1", "n2"):
        status = kube.server[("gpunodes", name)]["status"]
        assert len(status["gpus"]) == 2
        node = kube.server[("nodes", name)]
        assert node["status"]["allocatable"]["nvidia.com/gpu"] == "2"
    # Stepping again before the caches caught up must not create or re-patch anything.
    before = list(kube.writes)
    fleet.schedule.wake(None)
    fleet.schedule.run_due(fleet.run_step)
    kube.catch_up()
    fleet.schedule.wake(None)
    fleet.schedule.run_due(fleet.run_step)
    assert kube.writes == before
    # The pod on n1 got a device from n1's emulated device plugin, n2's agent saw nothing of it.
    backend = fleet.members["n1"].agent.backend
    assert backend is not None and any(backend.processes(i) for i in range(2))
    assert not any(fleet.members["n2"].agent.backend.processes(i) for i in range(2))  # type: ignore[union-attr]
    fleet.close()


def test_each_agents_metrics_are_served_with_a_node_label() -> None:
    a, b = AgentMetrics(), AgentMetrics()
    a.gpus.set(2)
    b.gpus.set(8)
    merged = {m.name: m for m in merged_with_node_label([("a", a.registry), ("b", b.registry)])}
    samples = {s.labels["node"]: s.value for s in merged["gpupack_agent_gpus"].samples}
    assert samples == {"a": 2, "b": 8}


# ---------------------------------------------------------------------- CLI
def test_the_cli_says_what_the_fleet_is(capsys: pytest.CaptureFixture[str]) -> None:
    from gpupack.cli import main

    with pytest.raises(SystemExit):
        main(["agent", "fleet", "--help"])
    out = capsys.readouterr().out
    assert "SIMULATION" in out and SIMULATED_GPUS_ANNOTATION in out and "--selector" in out


def test_the_cli_refuses_bad_settings(capsys: pytest.CaptureFixture[str]) -> None:
    from gpupack.cli import main

    assert main(["agent", "fleet", "--workers", "0", "--kubeconfig", "/nonexistent"]) == 2
    assert "workers must be at least 1" in capsys.readouterr().err


# ---------------------------------------------------------------------- KWOK nodes for the fleet
def test_kwok_nodes_can_be_made_ready_for_the_fleet() -> None:
    from gpupack.devcluster import kwok

    manifest = kwok.node_manifest("sim-0", annotations=kwok.simulated_gpus("T4", 8))
    assert manifest["metadata"]["annotations"] == {SIMULATED_GPUS_ANNOTATION: "T4:8",
                                                   kwok.MANAGED_ANNOTATION: kwok.MANAGED_VALUE}
    for model, count in (("", 8), ("T4:8", 1), ("T4", 0), ("T4", 17)):
        with pytest.raises(ValueError):
            kwok.simulated_gpus(model, count)
