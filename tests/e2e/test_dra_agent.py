"""The node agent on the ``dra`` backend against the real control plane: it publishes the node's
ResourceSlices, kube-scheduler allocates a claim from them, a lost GPU is withdrawn, a restart
changes nothing.

One simulated H100 node (two GPUs, MIG on), its agent run as ``gpupack agent run --backend dra
--simulate H100-80GB:2`` (a process, as the DaemonSet runs it) with the ``gpupack-node-agent``
ServiceAccount's token, so its RBAC (``manifests/rbac/node-agent-dra.yaml``) is exercised. A
SharingPolicy selects the node (dynamic layouts, three allowed profiles). There is no kubelet and
no kubelet plugin: a bound pod and an allocated claim are the end of the road, and no MIG
instance is created for them.

What is checked, with generous deadlines and no timing assertions:

* the slices appear as ``sharing.dra`` builds them (a counter slice, a device slice; the
  policy's profiles only; owned by the Node), and steady ticks write nothing (the
  resourceVersions stay) -- on the real API server, which respells quantities;
* a ResourceClaim for a ``gpupack-mig`` ``3g.40gb`` device and a pod using it are allocated
  and bound by kube-scheduler, to this node's pool;
* ``gpupack agent fault ... lose --gpu 1`` removes GPU 1's devices and counter set, at the
  next pool generation, in every slice;
* the agent restarted adopts the pool: same slices, same resourceVersions, same generation.

A second test adds the kubelet plugin (``gpupack dra-plugin serve``, the DaemonSet's other
container, same ServiceAccount and simulated GPUs) and plays the kubelet against its socket: it
reads the allocated claim from the API server, creates the MIG instance kube-scheduler chose, and
its health stream reports the device Healthy, then Unhealthy with the agent's reason once the agent
has written GPU 0's loss into the GPUNode.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpupack.devcluster.process import ManagedProcess
from kube.times import parse_time
from node.advertising.dra import SLICES_PUBLISHED
from node.base.kube import Kube
from sharing.dra import names
from sharing.dra.results import allocated_node
from tests.e2e.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
POLICY_RBAC = ROOT / "manifests" / "agent" / "rbac-policies.yaml"
WAIT_S = 60.0
PROFILES = ["1g.10gb", "3g.40gb", "7g.80gb"]
DEVICES_PER_GPU = 7 + 2 + 1  # placements of the allowed profiles on an H100


def _json(response: Any) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(response.data)
    return data


@dataclass
class DraNode:
    """One simulated DRA node, its agent process, and the admin's view of what it publishes."""

    admin: Any
    tmp: Path
    namespace: str
    name: str = field(default_factory=lambda: f"dra-agent-{uuid.uuid4().hex[:6]}")
    kubeconfig: Path | None = None
    """The agent's: set once the node exists (its token is bound to a pod on the node)."""
    agent: ManagedProcess | None = None
    restarts: int = 0

    def __post_init__(self) -> None:
        self.core = client.CoreV1Api(self.admin)
        self.custom = client.CustomObjectsApi(self.admin)
        self.resource = client.ResourceV1Api(self.admin)
        self.kube = Kube(self.admin)

    @property
    def state_file(self) -> Path:
        return self.tmp / f"{self.name}.json"

    def create(self) -> None:
        self.core.create_node(client.V1Node(metadata=client.V1ObjectMeta(
            name=self.name, labels={"e2e-run": self.name, "kubernetes.io/hostname": self.name})))
        resources = {"cpu": "16", "memory": "64Gi", "pods": "110"}
        self.core.patch_node_status(self.name, {"status": {
            "capacity": resources, "allocatable": resources,
            "conditions": [{"type": "Ready", "status": "True", "reason": "E2E", "message": "no kubelet"}]}})
        self.core.patch_node(self.name, {"spec": {"taints": None}})  # no node-lifecycle controller lifts it
        self.custom.create_cluster_custom_object("gpupack.io", "v1alpha1", "sharingpolicies", {
            "apiVersion": "gpupack.io/v1alpha1", "kind": "SharingPolicy", "metadata": {"name": self.name},
            "spec": {"nodeSelector": {"matchLabels": {"e2e-run": self.name}}, "allowedProfiles": PROFILES}})

    def start_agent(self) -> None:
        assert self.kubeconfig is not None, "create() the node and set its agent's kubeconfig first"
        self.restarts += 1
        self.agent = ManagedProcess(f"agent-{self.name}-{self.restarts}", [
            sys.executable, "-m", "gpupack", "agent", "run", "--node", self.name, "--backend", "dra",
            "--simulate", "H100-80GB:2", "--state-file", str(self.state_file), "--poll-seconds", "0.5",
            "--heartbeat-seconds", "2", "--metrics-port", "0", "--kubeconfig", str(self.kubeconfig)],
            self.tmp / f"agent-{self.name}-{self.restarts}.log")
        self.agent.start()

    def stop_agent(self) -> None:
        if self.agent is not None and self.agent.running():
            self.agent.stop(grace_s=10.0)
        self.agent = None

    def log(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-3000:] for p in sorted(self.tmp.glob("agent-*.log")))

    # ------------------------------------------------------------ what the API server holds
    def pool(self) -> list[dict[str, Any]]:
        return sorted(self.kube.list_resource_slices(self.name, names.DRIVER), key=lambda s: s["metadata"]["name"])

    def versions(self) -> dict[str, tuple[str, int]]:
        return {s["metadata"]["name"]: (s["metadata"]["resourceVersion"], s["spec"]["pool"]["generation"])
                for s in self.pool()}

    def gpunode(self) -> dict[str, Any]:
        try:
            found: dict[str, Any] = self.custom.get_cluster_custom_object(  # type: ignore[assignment]
                "gpupack.io", "v1alpha1", "gpunodes", self.name)
            return found
        except ApiException as exc:
            if exc.status == 404:
                return {}
            raise

    def condition(self) -> dict[str, Any]:
        status = self.gpunode().get("status") or {}
        return next((c for c in status.get("conditions") or [] if c["type"] == SLICES_PUBLISHED), {})

    def wait(self, what: str, probe: Callable[[], Any]) -> Any:
        if self.agent is not None and not self.agent.running():
            raise AssertionError(f"the agent exited:\n{self.log()}")
        try:
            return wait_for(what, probe, WAIT_S, interval_s=0.2)
        except BaseException:  # pytest.fail's Failed is one: show what the agent said
            print(self.log())
            raise

    def claim_and_pod(self, name: str, profile: str) -> None:
        self.resource.create_namespaced_resource_claim(self.namespace, {  # type: ignore[arg-type]
            "apiVersion": names.API_VERSION, "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": names.MIG_CLASS,
                "selectors": [{"cel": {"expression": f'device.attributes["{names.DRIVER}"].profile == "{profile}"'}}],
            }}]}}}, _preload_content=False)
        self.core.create_namespaced_pod(self.namespace, cast(Any, {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeSelector": {"e2e-run": self.name},
                     "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
                     "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                                     "resources": {"claims": [{"name": "gpu"}]}}]}}))

    def allocation(self, claim: str) -> list[dict[str, Any]]:
        stored = _json(self.resource.read_namespaced_resource_claim(claim, self.namespace, _preload_content=False))
        return list((((stored.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or [])

    def cleanup(self) -> None:
        self.stop_agent()
        for item in self.pool():  # no garbage collector here to follow the owner reference
            self.kube.delete_resource_slice(item["metadata"]["name"])
        deletes: list[Callable[[], Any]] = [
            lambda: self.core.delete_collection_namespaced_pod(self.namespace, grace_period_seconds=0),
            lambda: self.custom.delete_cluster_custom_object("gpupack.io", "v1alpha1", "sharingpolicies", self.name),
            lambda: self.custom.delete_cluster_custom_object("gpupack.io", "v1alpha1", "gpunodes", self.name),
            lambda: self.core.delete_node(self.name)]
        for delete in deletes:
            try:
                delete()
            except ApiException as exc:
                if exc.status != 404:
                    raise


@pytest.fixture
def dra_node(admin_client: Any, gpupack_installed: list[dict[str, Any]], apply_manifests: Callable[..., Any],
             agent_kubeconfig: Callable[[str], Path], namespace: str, tmp_path: Path) -> Iterator[DraNode]:
    apply_manifests(ROOT / "manifests" / "dra", POLICY_RBAC)  # DeviceClasses; the agent reads SharingPolicies
    node = DraNode(admin_client, tmp_path, namespace)
    node.create()
    node.kubeconfig = agent_kubeconfig(node.name)  # a token bound to a pod on its node: node isolation is on
    yield node
    node.cleanup()


def _devices(pool: list[dict[str, Any]]) -> list[str]:
    return [d["name"] for s in pool for d in s["spec"].get("devices") or []]


def _counter_sets(pool: list[dict[str, Any]]) -> list[str]:
    return [c["name"] for s in pool for c in s["spec"].get("sharedCounters") or []]


def test_the_agent_publishes_withdraws_and_adopts_its_nodes_slices(dra_node: DraNode) -> None:
    node = dra_node
    node.start_agent()

    # 1. published: a counter slice and a device slice, the policy's profiles only, owned by the Node
    pool = node.wait(f"{node.name}'s ResourceSlices", lambda: (
        p if len(_devices(p := node.pool())) == 2 * DEVICES_PER_GPU else None))
    assert [s["metadata"]["name"] for s in pool] == [f"{node.name}-gpu.gpupack.io-counters-000",
                                                     f"{node.name}-gpu.gpupack.io-devices-000"]
    assert _counter_sets(pool) == ["gpu-0", "gpu-1"]
    stored_node: Any = node.core.read_node(node.name)
    node_uid = stored_node.metadata.uid
    for item in pool:
        assert item["spec"]["pool"] == {"name": node.name, "generation": 1, "resourceSliceCount": 2}
        assert item["spec"]["nodeName"] == node.name and item["spec"]["driver"] == names.DRIVER
        assert [(o["kind"], o["uid"]) for o in item["metadata"]["ownerReferences"]] == [("Node", node_uid)]
    profiles = {d["attributes"][names.PROFILE]["string"] for s in pool for d in s["spec"].get("devices") or []}
    assert profiles == set(PROFILES)
    cond = node.wait("the ResourceSlicesPublished condition", lambda: node.condition() or None)
    assert cond["status"] == "True" and f"{2 * DEVICES_PER_GPU} device(s) on 2 GPU(s)" in cond["message"], cond
    published = node.versions()

    # 2. kube-scheduler allocates a 3g.40gb placement from the pool and binds the pod
    node.claim_and_pod("mig-3g", "3g.40gb")
    def bound() -> bool:
        pod: Any = node.core.read_namespaced_pod("mig-3g", node.namespace)
        return bool(pod.spec.node_name == node.name)

    node.wait("the pod bound to the DRA node", bound)
    (result,) = node.allocation("mig-3g")
    assert result["driver"] == names.DRIVER and result["pool"] == node.name, result
    assert result["device"].startswith("gpu-0-mig-3g-40gb-"), result  # first fit: GPU 0's slice comes first
    assert node.versions() == published, "steady ticks wrote to the slices"

    # 3. a lost GPU: its devices and counter set go, every slice at the next generation
    run = subprocess.run([sys.executable, "-m", "gpupack", "agent", "fault", "--state-file", str(node.state_file),
                          "lose", "--gpu", "1"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    def gpu_1_withdrawn() -> list[dict[str, Any]] | None:
        now = node.pool()
        gone = not [d for d in _devices(now) if d.startswith("gpu-1-")]
        return now if gone and {s["spec"]["pool"]["generation"] for s in now} == {2} else None

    pool = node.wait("GPU 1 withdrawn from the slices", gpu_1_withdrawn)
    assert _counter_sets(pool) == ["gpu-0"] and len(_devices(pool)) == DEVICES_PER_GPU
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in pool} == {2}
    node.wait("the condition naming the lost GPU", lambda: "GPU 1 (lost)" in node.condition().get("message", ""))
    assert [r["device"] for r in node.allocation("mig-3g")] == [result["device"]]  # the claim keeps its device

    # 4. restarted, the agent adopts the pool as it is: nothing written, no new generation
    before = node.versions()
    node.stop_agent()
    time.sleep(1.1)  # heartbeats are stamped to the second: the next one is the new agent's
    started = time.time()
    node.start_agent()
    node.wait("the restarted agent's first status", lambda: (
        (t := parse_time((node.gpunode().get("status") or {}).get("heartbeatTime"))) is not None
        and t.timestamp() >= int(started)))
    time.sleep(2.0)  # a few more ticks at 0.5 s
    assert node.agent is not None and node.agent.running(), node.log()
    assert node.versions() == before, "the restarted agent rewrote slices that had not changed"
    assert node.condition()["status"] == "True" and "at generation 2" in node.condition()["message"]


def test_the_kubelet_plugin_prepares_the_allocated_claim_and_reports_the_agents_faults(
        dra_node: DraNode, apply_manifests: Callable[..., Any]) -> None:
    import tempfile

    from mig.catalog import get_model
    from node.draplugin.claims import ClaimRef
    from node.draplugin.client import KubeletClient
    from node.kubeletapi import dra_health_v1_pb2 as dra_health
    from node.nvml.simulated import SimulatedNvml

    apply_manifests(ROOT / "manifests" / "agent-dra" / "rbac.yaml")  # the plugin's `get` on ResourceClaims
    node = dra_node
    node.start_agent()
    node.wait(f"{node.name}'s ResourceSlices", lambda: len(_devices(node.pool())) == 2 * DEVICES_PER_GPU)
    node.claim_and_pod("mig-1g", "1g.10gb")
    node.wait("the claim allocated", lambda: node.allocation("mig-1g") or None)
    (result,) = node.allocation("mig-1g")
    claim: Any = node.resource.read_namespaced_resource_claim("mig-1g", node.namespace)
    # kube-scheduler confines the allocation to the slice's node in the shape the controller reads it by
    # (sharing.dra.results.allocated_node): a result whose pool is another node is then not counted.
    stored = _json(node.resource.read_namespaced_resource_claim("mig-1g", node.namespace, _preload_content=False))
    assert allocated_node(stored["status"]["allocation"]) == node.name == result["pool"]
    ref = ClaimRef(claim.metadata.uid, node.namespace, "mig-1g")

    with tempfile.TemporaryDirectory(prefix="dra.") as short:  # unix socket paths hold ~107 bytes
        plugin_dir, registry = Path(short) / "p", Path(short) / "r"
        plugin = ManagedProcess(f"plugin-{node.name}", [
            sys.executable, "-m", "gpupack", "dra-plugin", "serve", "--node", node.name,
            "--simulate", "H100-80GB:2", "--state-file", str(node.state_file), "--kubeconfig", str(node.kubeconfig),
            "--plugin-dir", str(plugin_dir), "--registration-dir", str(registry), "--cdi-dir", str(Path(short) / "cdi"),
            "--health-interval-seconds", "0.5"], node.tmp / f"plugin-{node.name}.log")
        plugin.start()
        try:
            socket = plugin_dir / "dra.sock"
            node.wait("the plugin's DRA socket", lambda: (registry / "gpu.gpupack.io-reg.sock").exists())
            with KubeletClient(socket, timeout_s=WAIT_S) as kubelet:
                answer = kubelet.prepare([ref]).claims[ref.uid]
                assert answer.error == "", answer.error
                assert [d.device_name for d in answer.devices] == [result["device"]]
                sim = SimulatedNvml(get_model("H100-80GB"), 2, node.state_file, seed=node.name)
                start = int(result["device"].rsplit("-", 1)[1])
                assert [(i.profile, i.placement.start) for i in sim.gpu_instances(0)] == [("1g.10gb", start)]

                def device_health(wanted: int) -> Any:
                    for message in kubelet.watch_health(200):
                        for device in message.devices:
                            if device.device.device_name == result["device"] and device.health == wanted:
                                return device
                    return None

                healthy = device_health(dra_health.HEALTHY)
                assert healthy is not None and healthy.device.pool_name == node.name
                run = subprocess.run([sys.executable, "-m", "gpupack", "agent", "fault", "--state-file",
                                      str(node.state_file), "lose", "--gpu", "0"],
                                     cwd=ROOT, capture_output=True, text=True, timeout=60)
                assert run.returncode == 0, run.stderr
                sick = device_health(dra_health.UNHEALTHY)
                assert sick is not None, (Path(node.tmp / f"plugin-{node.name}.log").read_text()[-3000:], node.log())
                assert "GPU 0" in sick.message, sick.message
        finally:
            plugin.stop(grace_s=10.0)
