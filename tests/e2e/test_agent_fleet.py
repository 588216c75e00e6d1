"""``gpupack agent fleet`` on a real control plane with KWOK nodes (``kwok_plane``).

* A node the fleet serves is, through the API, the node ``gpupack agent run`` serves: the
  same GPUNode status and the same Node labels and resources (names, UUIDs and times aside).
* A CI-sized fleet, 50 KWOK nodes in one process: every GPUNode is published and every node
  advertised; at rest, each node's only API writes are its heartbeats, as many as the heartbeat
  period allows (counted by the fleet, asserted as counts, not timings); the agents read nothing
  from the API server (the caches do); nodes that appear or lose the annotation while it runs are
  served or dropped, and a malformed annotation gets an Event.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpupack.cli_agent import open_backend
from gpupack.devcluster import kwok
from gpupack.devcluster.apply import apply_objects, gpupack_manifests
from gpupack.devcluster.controlplane import ControlPlane
from gpupack.fleet.agents import Fleet, FleetSettings, fleet_configmaps
from gpupack.fleet.kube import ApiCounts, FleetCaches, SharedKube, counting_api_client, reads, writes
from node.base.settings import AgentSettings
from sharing.api.keys import HOSTNAME_LABEL, SIMULATED_GPUS_ANNOTATION
from tests.e2e.waiting import wait_for

WAIT_S = 90.0
FLEET_SIZE = 50
HEARTBEAT_S = 10.0
WINDOW_S = 30.0
UUID = re.compile(r"\b(GPU|MIG)-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b")
TIMES = {"heartbeatTime", "lastTransitionTime", "lastHeartbeatTime", "since", "time"}


def _eventually(what: str, probe: Callable[[], Any], timeout_s: float = WAIT_S) -> Any:
    """Poll ``probe`` (``tests.e2e.waiting.wait_for``, every 0.5 s) with this module's patience."""
    return wait_for(what, probe, timeout_s, interval_s=0.5)


@pytest.fixture(scope="module")
def api(kwok_plane: ControlPlane) -> Iterator[Any]:
    with kwok_plane.admin_client() as admin:
        apply_objects(admin, gpupack_manifests(), field_manager="gpupack-e2e")
        yield admin


def _gpunode(api: Any, name: str) -> dict[str, Any]:
    try:
        obj: dict[str, Any] = client.CustomObjectsApi(api).get_cluster_custom_object(  # type: ignore[assignment]
            "gpupack.io", "v1alpha1", "gpunodes", name)
        return obj
    except ApiException as exc:
        if exc.status == 404:
            return {}
        raise


def _node(api: Any, name: str) -> dict[str, Any]:
    data: dict[str, Any] = api.sanitize_for_serialization(client.CoreV1Api(api).read_node(name))
    return data


def _normal(value: Any, names: tuple[str, ...]) -> Any:
    """``value`` without what differs between two nodes by nature: times, GPU and MIG UUIDs, names."""
    if isinstance(value, dict):
        return {k: _normal(v, names) for k, v in value.items() if k not in TIMES}
    if isinstance(value, list):
        return [_normal(v, names) for v in value]
    if isinstance(value, str):
        value = UUID.sub(r"\1-UUID", value)
        for name in names:
            value = value.replace(name, "NODE")
    return value


def _gpupack(*args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "gpupack", *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("model", ["T4:2", "A100-40GB:2"])
def test_a_fleet_node_is_indistinguishable_from_an_agent_run_node(api: Any, kwok_plane: ControlPlane,
                                                                   model: str) -> None:
    model_name, count = model.split(":")
    tag = model_name.lower().replace("-", "")
    annotation = kwok.simulated_gpus(model_name, int(count))
    start = 900 if tag == "t4" else 910
    (alone,) = kwok.create_nodes(api, 1, prefix=f"alone-{tag}-", start=start, annotations=annotation)
    (served,) = kwok.create_nodes(api, 1, prefix=f"fleet-{tag}-", start=start + 1, annotations=annotation,
                                  labels={"e2e-fleet": tag})
    kwok.wait_ready(api, [alone, served], WAIT_S)
    kubeconfig = str(kwok_plane.kubeconfig)
    _gpupack("agent", "run", "--once", "--kubeconfig", kubeconfig, "--node", alone, "--simulate", model,
             "--emulate-device-plugin", "--metrics-port", "0")
    _gpupack("agent", "fleet", "--once", "--kubeconfig", kubeconfig, "--selector", f"e2e-fleet={tag}")
    one, other = _gpunode(api, alone), _gpunode(api, served)
    assert one.get("status") and other.get("status"), "both GPUNodes published"
    assert _normal(one["status"], (alone,)) == _normal(other["status"], (served,))
    assert one["metadata"]["labels"] == other["metadata"]["labels"]
    assert one["metadata"]["ownerReferences"][0]["kind"] == other["metadata"]["ownerReferences"][0]["kind"] == "Node"
    node_one, node_other = _node(api, alone), _node(api, served)
    labels_one = {k: v for k, v in node_one["metadata"]["labels"].items() if k != HOSTNAME_LABEL}
    labels_other = {k: v for k, v in node_other["metadata"]["labels"].items()
                    if k not in (HOSTNAME_LABEL, "e2e-fleet")}
    assert labels_one == labels_other
    assert any(k.startswith("nvidia.com/") for k in labels_one), "the emulated device plugin labelled the node"
    assert node_one["status"]["allocatable"] == node_other["status"]["allocatable"]
    assert node_one["status"]["capacity"] == node_other["status"]["capacity"]


class RunningFleet:
    def __init__(self, kubeconfig: str, selector: str) -> None:
        self.counts = ApiCounts()
        settings = FleetSettings(
            agent=AgentSettings(poll_seconds=5.0, heartbeat_seconds=HEARTBEAT_S, metrics_port=0),
            selector=selector, workers=4, stagger_seconds=2.0, report_every_seconds=10.0)
        api = counting_api_client(kubeconfig, self.counts, settings.workers + 10)
        kube = SharedKube(api, FleetCaches.connect(api, node_selector=selector,
                                                   configmaps=fleet_configmaps(settings.agent)))
        self.fleet = Fleet(settings, kube, self.counts, open_backend)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.fleet.run, args=(self.stop,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(60)
        assert not self.thread.is_alive(), "the fleet did not stop"


@pytest.fixture(scope="module")
def fleet_nodes(api: Any, kwok_plane: ControlPlane) -> Iterator[tuple[RunningFleet, list[str], list[str]]]:
    """50 KWOK nodes, half with 8 simulated T4s, half with 8 A100-40GBs, served by one fleet."""
    half = FLEET_SIZE // 2
    labels = {"e2e-fleet": "ci"}
    t4 = kwok.create_nodes(api, half, prefix="ci-t4-", start=0, labels=labels,
                           annotations=kwok.simulated_gpus("T4", 8))
    a100 = kwok.create_nodes(api, half, prefix="ci-a100-", start=half, labels=labels,
                             annotations=kwok.simulated_gpus("A100-40GB", 8))
    kwok.wait_ready(api, t4 + a100, WAIT_S)
    running = RunningFleet(str(kwok_plane.kubeconfig), "e2e-fleet=ci")
    try:
        yield running, t4, a100
    finally:
        running.close()


def _published(api: Any, names: list[str]) -> bool:
    listing: Any = client.CustomObjectsApi(api).list_cluster_custom_object("gpupack.io", "v1alpha1", "gpunodes")
    items: list[dict[str, Any]] = listing["items"]
    done = {i["metadata"]["name"] for i in items if len((i.get("status") or {}).get("gpus") or []) == 8}
    return set(names) <= done


def test_a_fleet_of_50_kwok_nodes_publishes_and_advertises_every_node(
        api: Any, fleet_nodes: tuple[RunningFleet, list[str], list[str]]) -> None:
    running, t4, a100 = fleet_nodes
    _eventually(f"{FLEET_SIZE} GPUNodes published", lambda: _published(api, t4 + a100))

    def advertised() -> bool:
        nodes = {n["metadata"]["name"]: n for n in (_node(api, name) for name in t4 + a100)}
        return all(nodes[name]["status"].get("allocatable", {}).get("nvidia.com/gpu") == "8" for name in t4) and all(
            nodes[name]["metadata"].get("labels", {}).get("nvidia.com/gpu.product") for name in a100)

    _eventually("every T4 node advertises nvidia.com/gpu=8 and every A100 node its product", advertised)
    assert len(running.fleet.members) == FLEET_SIZE


def test_at_rest_a_fleet_node_writes_only_its_heartbeats(
        api: Any, fleet_nodes: tuple[RunningFleet, list[str], list[str]]) -> None:
    running, t4, a100 = fleet_nodes
    _eventually(f"{FLEET_SIZE} GPUNodes published", lambda: _published(api, t4 + a100))
    time.sleep(3.0)  # the echoes of the first writes come back and wake nobody
    before = running.fleet.node_requests()
    time.sleep(WINDOW_S)
    after = running.fleet.node_requests()
    per_node = {name: after[name] - before.get(name, Counter()) for name in t4 + a100}
    kinds = Counter[tuple[str, str]]()
    for counts in per_node.values():
        kinds.update(counts)
    assert set(kinds) == {("patch", "gpunodes/status")}, f"at rest a node writes its heartbeat only: {kinds}"
    ceiling = int(WINDOW_S / HEARTBEAT_S) + 1
    too_many = {n: writes(c) for n, c in per_node.items() if writes(c) > ceiling}
    silent = [n for n, c in per_node.items() if writes(c) < 1]
    assert not too_many, f"more writes than heartbeats every {HEARTBEAT_S:.0f}s allow in {WINDOW_S:.0f}s: {too_many}"
    assert not silent, f"nodes that wrote no heartbeat in {WINDOW_S:.0f}s: {silent}"
    assert sum(reads(c) for c in per_node.values()) == 0, "the agents read from the caches, not the API server"


def test_nodes_are_picked_up_and_dropped_while_the_fleet_runs(
        api: Any, fleet_nodes: tuple[RunningFleet, list[str], list[str]]) -> None:
    running, t4, _a100 = fleet_nodes
    core = client.CoreV1Api(api)
    labels = {"e2e-fleet": "ci"}
    (late,) = kwok.create_nodes(api, 1, prefix="ci-late-", start=200, labels=labels,
                                annotations=kwok.simulated_gpus("T4", 4))
    (bad,) = kwok.create_nodes(api, 1, prefix="ci-bad-", start=201, labels=labels,
                               annotations={SIMULATED_GPUS_ANNOTATION: "NO-SUCH-GPU:4"})
    _eventually("the late node's GPUNode", lambda: len((_gpunode(api, late).get("status") or {}).get("gpus") or []) == 4)

    def refused() -> bool:
        events = core.list_event_for_all_namespaces(field_selector=f"involvedObject.name={bad}").items
        return any(e.reason == "SimulatedGpusInvalid" and "NO-SUCH-GPU" in (e.message or "") for e in events)

    _eventually("a Warning Event on the node with a malformed annotation", refused)
    assert bad not in running.fleet.members
    dropped = t4[0]
    core.patch_node(dropped, {"metadata": {"annotations": {SIMULATED_GPUS_ANNOTATION: None}}})
    _eventually("the node without the annotation dropped", lambda: dropped not in running.fleet.members)
    assert late in running.fleet.members and len(running.fleet.members) == FLEET_SIZE


def test_a_spec_change_reshapes_a_fleet_nodes_gpu(
        api: Any, fleet_nodes: tuple[RunningFleet, list[str], list[str]]) -> None:
    """The reshape writes its journal into the GPUNode's status and reads it back on the next steps,
    before the watch cache has it: the fleet's agent must see its own writes (``gpupack.fleet.kube``)."""
    running, _t4, a100 = fleet_nodes
    node = a100[0]
    layout = [{"index": 0, "migEnabled": True, "layout": [{"profile": "3g.20gb"}, {"profile": "3g.20gb"}]}]
    client.CustomObjectsApi(api).patch_cluster_custom_object("gpupack.io", "v1alpha1", "gpunodes", node,
                                                            {"spec": {"gpus": layout}})

    def applied() -> bool:
        status = _gpunode(api, node).get("status") or {}
        profiles = sorted(i["profile"] for i in status["gpus"][0]["instances"])
        allocatable = _node(api, node)["status"].get("allocatable", {})
        phase = (status.get("reconfiguration") or {}).get("phase")
        return (profiles == ["3g.20gb", "3g.20gb"] and allocatable.get("nvidia.com/mig-3g.20gb") == "2"
                and phase in (None, "Succeeded"))

    _eventually("GPU 0 of the fleet node reshaped to two 3g.20gb and advertised", applied)
    assert running.fleet.members[node].agent.metrics.registry.get_sample_value(
        "gpupack_agent_reconfigurations_total", {"outcome": "Succeeded"}) == 1
