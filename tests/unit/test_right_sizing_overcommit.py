"""Right-sized shares (issue 35, item 3): no SM cap on predicted use, and compute over-commit where the
policy allows, counted by one rule (``sharing.rules.right_sizing.accounted_milli``) in the webhook's
decision, the pod's records, a DRA claim's configuration and the kubelet plugin's MPS limits."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from controller.writes.dra_claims import claim_requests
from gpupack.testing.admission_reviews import gpu_container, make_pod, make_review
from mig.catalog import get_model
from node.draplugin.claims import ClaimError, ClaimRef, allocation_from_claim
from node.draplugin.plan import plan_claim
from node.nvml.simulated import SimulatedNvml
from sharing.admission.decision import MPS_MEMORY_ENV, MPS_THREADS_ENV, decide
from sharing.admission.inventory import Inventory, build_inventory
from sharing.admission.patch import apply_patch
from sharing.admission.right_sizing import size_pod
from sharing.api.allocation import Allocation, AllocationError, ContainerAllocation
from sharing.api.keys import ALLOCATION_ANNOTATION, DRA_PINNED_ANNOTATION, RIGHT_SIZED_ANNOTATION, RIGHT_SIZING_LABEL
from sharing.api.request import PodRequest, parse_pod
from sharing.api.right_sized import RightSizedError, RightSizedFrom
from sharing.dra import names
from sharing.dra.pinned import Pinned, PinnedDevice
from sharing.dra.share_config import claim_config, predicted_by_request
from sharing.dra.share_policy import SharePolicy
from sharing.rules.right_sizing import RightSizing, accounted_milli, right_sizing_for
from tests.unit.test_right_sizing_initial import NS, deployment_pod, lookup_of, recommendation
from webhook.admission import review_pod
from webhook.settings import WebhookSettings

GI = 1024**3
A100 = "NVIDIA-A100-SXM4-80GB"
H100 = get_model("H100-80GB")


# ------------------------------------------------------------------ the one rule


@pytest.mark.parametrize(("predicted", "overcommit", "accounted"), [
    pytest.param(120, 1.0, 120, id="none-over-committed"),
    pytest.param(120, 1.5, 80, id="1.5"),
    pytest.param(600, 1.5, 400, id="1.5-exact-despite-the-float"),
    pytest.param(121, 1.5, 81, id="1.5-rounded-up"),
    pytest.param(999, 2.0, 500, id="almost-a-whole-gpu-at-2"),
    pytest.param(1000, 2.0, 1000, id="a-whole-gpu-is-never-over-committed"),
    pytest.param(1, 4.0, 1, id="never-below-1"),
])
def test_accounted_milli_divides_the_prediction_by_the_overcommit_rounded_up(
        predicted: int, overcommit: float, accounted: int) -> None:
    assert accounted_milli(predicted, overcommit) == accounted
    # The bound it exists for: accounted shares summing to 1000 carry at most 1000 x overcommit predicted.
    assert accounted * overcommit >= predicted


@pytest.mark.parametrize(("predicted", "overcommit", "says"), [
    pytest.param(0, 1.0, "predicted milli must be in 1..1000", id="zero"),
    pytest.param(1001, 1.0, "predicted milli must be in 1..1000", id="over-a-gpu"),
    pytest.param(100, 0.5, "compute_overcommit must be at least 1.0", id="under-1"),
    pytest.param(100, float("nan"), "compute_overcommit must be at least 1.0", id="nan"),
])
def test_accounted_milli_refuses_impossible_input(predicted: int, overcommit: float, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        accounted_milli(predicted, overcommit)


def test_the_namespaces_overcommit_is_the_strictest_policys() -> None:
    policies = build_inventory([policy("loose", 3.0), policy("tight", 1.5)]).policies
    found = right_sizing_for(policies, NS, {RIGHT_SIZING_LABEL: "Initial"})
    assert found.compute_overcommit == 1.5 and found.accounted_milli(300) == 200


# ------------------------------------------------------------------ sizing


def policy(name: str, overcommit: float, mode: str = "Initial") -> dict[str, Any]:
    return {"kind": "SharingPolicy", "metadata": {"name": name},
            "spec": {"rightSizing": {"mode": mode, "computeOvercommit": overcommit}}}


def sized_request(overcommit: float, milli: int = 120, memory: str = "16Gi",
                  **pod_kwargs: Any) -> tuple[PodRequest, RightSizedFrom]:
    pod = deployment_pod(gpu_container("main", "1000", "40Gi"), **pod_kwargs)
    request = parse_pod(pod, NS)
    assert request is not None
    lookup = lookup_of(recommendation(containers=[{"containerName": "main", "gpuMilli": milli, "gpuMemory": memory}]))
    out = size_pod(request, pod, RightSizing("Initial", compute_overcommit=overcommit), lookup, 81920)
    assert out.record is not None
    return out.request, out.record


@pytest.mark.parametrize(("overcommit", "accounted"), [(1.0, 120), (1.5, 80)])
def test_a_sized_container_carries_its_prediction_and_is_accounted_by_the_overcommit(
        overcommit: float, accounted: int) -> None:
    request, record = sized_request(overcommit)
    (container,) = request.containers
    assert (container.milli, container.predicted_milli, container.memory_bytes) == (accounted, 120, 16 * GI)
    (sized,) = record.containers
    assert (sized.milli, sized.accounted, record.compute_overcommit) == (120, accounted, overcommit)
    assert RightSizedFrom.from_annotation(record.to_annotation()) == record


def test_a_right_sized_record_written_before_overcommit_reads_as_none() -> None:
    old = ('{"containers":[{"askedMemoryBytes":null,"askedMilli":1000,"memoryBytes":1,"milli":120,"name":"main"}],'
           '"generation":1,"recommendation":"deployment-web","updated":null,"version":"v1"}')
    record = RightSizedFrom.from_annotation(old)
    assert record.compute_overcommit == 1.0 and record.containers[0].accounted == 120
    for bad, says in (('"computeOvercommit":0.5,', "computeOvercommit 0.5 is not a number in 1.0..4.0"),
                      ('"computeOvercommit":"2",', "computeOvercommit '2'"),
                      ):
        with pytest.raises(RightSizedError, match=says):
            RightSizedFrom.from_annotation(old.replace('"generation"', bad + '"generation"'))
    with pytest.raises(RightSizedError, match=r"containers\[0\]\.accountedMilli"):
        RightSizedFrom.from_annotation(old.replace('"milli":120', '"milli":120,"accountedMilli":-1'))


# ------------------------------------------------------------------ the decision


def shared_node(name: str, mode: str, replicas: int) -> dict[str, Any]:
    return {"kind": "GPUNode", "metadata": {"name": name},
            "status": {"product": A100, "sharing": {"mode": mode, "replicas": replicas},
                       "gpus": [{"index": i, "uuid": f"GPU-{name}-{i}", "product": A100, "memoryMiB": 81920}
                                for i in range(2)]}}


def mig_node(name: str) -> dict[str, Any]:
    return {"kind": "GPUNode", "metadata": {"name": name},
            "status": {"product": A100, "gpus": [{"index": 0, "uuid": f"GPU-{name}", "product": A100,
                                                  "memoryMiB": 81920, "migEnabled": True, "instances": []}]}}


def test_a_right_sized_mps_container_has_no_thread_limit_and_keeps_its_memory_limit() -> None:
    inventory = build_inventory([shared_node("mps-4", "mps", 4)])
    request, _ = sized_request(1.0)
    decision = decide(request, inventory.policy_for(NS), inventory)
    (container,) = decision.containers
    assert decision.mode == "mps" and dict(container.env) == {MPS_THREADS_ENV: "100", MPS_MEMORY_ENV: "0=16384M"}
    assert (container.milli, container.predicted_milli) == (120, 120)


def test_a_container_that_was_not_right_sized_keeps_its_thread_limit() -> None:
    inventory = build_inventory([shared_node("mps-4", "mps", 4)])
    request = parse_pod(make_pod(gpu_container("main", "120", "16Gi")), NS)
    assert request is not None
    (container,) = decide(request, inventory.policy_for(NS), inventory).containers
    assert dict(container.env) == {MPS_THREADS_ENV: "12", MPS_MEMORY_ENV: "0=16384M"}
    assert container.predicted_milli is None and "predictedMilli" not in Allocation(
        "mps", False, True, "", "", (ContainerAllocation("main", "containers", 120, None, "x"),)).to_annotation()


def test_the_replica_rule_counts_the_accounted_milli() -> None:
    """400 predicted milli fit a GPU split into 4 (250 each) only where compute is over-committed 2x."""
    inventory = build_inventory([shared_node("mps-4", "mps", 4)])
    plain, _ = sized_request(1.0, milli=400, mode="mps")
    over, _ = sized_request(2.0, milli=400, mode="mps")
    waits = decide(plain, inventory.policy_for(NS), inventory)
    assert not waits.capacity_exists and "gated" in waits.reason  # needs a GPU split into 2, which no node has
    decision = decide(over, inventory.policy_for(NS), inventory)
    assert (decision.mode, decision.replicas, decision.gated) == ("mps", 4, False)
    assert (decision.containers[0].milli, decision.containers[0].predicted_milli) == (200, 400)


def test_mig_covers_the_predicted_milli_not_the_accounted_one() -> None:
    """300 predicted milli need three sevenths of an A100; accounted at 150 they would take two."""
    inventory = build_inventory([mig_node("mig-a")])
    request, _ = sized_request(2.0, milli=300, memory="8Gi")
    decision = decide(request, inventory.policy_for(NS), inventory)
    assert decision.mode == "mig" and decision.containers[0].profile == "3g.40gb"
    # The same request, not right-sized, at the accounted milli: the smaller profile.
    unsized = parse_pod(make_pod(gpu_container("main", "150", "8Gi")), NS)
    assert unsized is not None
    assert decide(unsized, inventory.policy_for(NS), inventory).containers[0].profile == "2g.20gb"


# ------------------------------------------------------------------ the allocation record


def test_the_allocation_record_keeps_the_prediction_and_reads_old_records() -> None:
    container = ContainerAllocation("main", "containers", 80, 16 * GI, "nvidia.com/gpu.shared", None, 120)
    allocation = Allocation("mps", True, True, "p", "r", (container,))
    text = allocation.to_annotation()
    assert '"predictedMilli":120' in text and Allocation.from_annotation(text) == allocation
    old = json.loads(text)
    del old["containers"][0]["predictedMilli"]
    assert Allocation.from_annotation(json.dumps(old)).containers[0].predicted_milli is None
    old["containers"][0]["predictedMilli"] = 0
    with pytest.raises(AllocationError, match=r"containers\[0\]\.predictedMilli 0 is not 1\.\.1000"):
        Allocation.from_annotation(json.dumps(old))


# ------------------------------------------------------------------ the webhook


def webhook_inventory() -> Inventory:
    namespace = {"kind": "Namespace", "metadata": {"name": NS, "labels": {}}}
    return build_inventory([shared_node("mps-4", "mps", 4), namespace, policy("overcommit", 2.0)])


def test_the_webhook_sizes_with_the_namespaces_overcommit_and_records_both_numbers() -> None:
    pod = deployment_pod(gpu_container("main", "1000", "40Gi"), mode="mps")
    lookup = lookup_of(recommendation(containers=[{"containerName": "main", "gpuMilli": 400, "gpuMemory": "16Gi"}]))
    out = review_pod(make_review(pod, namespace=NS), webhook_inventory(), WebhookSettings(), None, lookup)
    response = out.review["response"]
    assert response["allowed"] and out.right_sized, response
    admitted = apply_patch(pod, json.loads(base64.b64decode(response["patch"])))
    container = admitted["spec"]["containers"][0]
    assert {e["name"]: e["value"] for e in container["env"]} == {MPS_THREADS_ENV: "100", MPS_MEMORY_ENV: "0=16384M"}
    annotations = admitted["metadata"]["annotations"]
    (recorded,) = Allocation.from_annotation(annotations[ALLOCATION_ANNOTATION]).containers
    assert (recorded.milli, recorded.predicted_milli) == (200, 400)
    record = RightSizedFrom.from_annotation(annotations[RIGHT_SIZED_ANNOTATION])
    assert (record.compute_overcommit, record.containers[0].milli, record.containers[0].accounted) == (2.0, 400, 200)
    assert "400m/16Gi (predicted; 200m accounted)" in response["status"]["message"]


# ------------------------------------------------------------------ DRA


def dra_pool() -> Inventory:
    gpunode = {"kind": "GPUNode", "metadata": {"name": "dra-a"},
               "status": {"product": A100, "sharing": {"mode": "mps", "replicas": 4},
                          "gpus": [{"index": 0, "uuid": "GPU-dra-a-0", "product": A100, "memoryMiB": 81920,
                                    "migEnabled": False, "instances": []}]}}
    node = {"kind": "Node", "metadata": {"name": "dra-a", "labels": {"gpupack.io/backend": "dra"}}}
    namespace = {"kind": "Namespace", "metadata": {"name": NS, "labels": {}}}
    return build_inventory([gpunode, node, namespace, policy("overcommit", 2.0)])


def dra_admitted() -> tuple[dict[str, Any], Allocation]:
    pod = deployment_pod(gpu_container("main", "1000", "40Gi"), mode="mps", labels={"gpupack.io/backend": "dra"})
    lookup = lookup_of(recommendation(containers=[{"containerName": "main", "gpuMilli": 400, "gpuMemory": "16Gi"}]))
    out = review_pod(make_review(pod, namespace=NS), dra_pool(), WebhookSettings(), None, lookup)
    response = out.review["response"]
    assert response["allowed"], response
    admitted = apply_patch(pod, json.loads(base64.b64decode(response["patch"])))
    return admitted, Allocation.from_annotation(admitted["metadata"]["annotations"][ALLOCATION_ANNOTATION])


def test_a_right_sized_dra_pod_asks_its_claim_for_the_accounted_milli_and_names_its_prediction() -> None:
    admitted, allocation = dra_admitted()
    assert "env" not in admitted["spec"]["containers"][0]  # on DRA the kubelet plugin sets the limits
    (container,) = allocation.containers
    assert (allocation.backend, container.resource, container.milli, container.predicted_milli) == (
        "dra", "gpu-0", 200, 400)
    pinned = Pinned("dra-a", (PinnedDevice("gpu-0", "shared", 0, 200, 16 * GI),))
    (request,) = claim_requests(allocation, pinned, SharePolicy())
    assert request["exactly"]["capacity"]["requests"][names.MILLI] == "200"  # what kube-scheduler counts
    assert claim_config(allocation) == [{"requests": ["gpu-0"], "opaque": {"driver": names.DRIVER, "parameters": {
        "apiVersion": "gpu.gpupack.io/v1alpha1", "kind": "RightSizedShare", "predictedMilli": 400}}}]


def allocated_claim(config: list[Any] | None, pinned: bool = True) -> dict[str, Any]:
    """The claim as kube-scheduler allocates it: a share of GPU 1, and the claim's config copied;
    ``pinned``: created by the controller (its pin annotation, which only it may write)."""
    share = {"request": "gpu-0", "driver": names.DRIVER, "pool": "node-a", "device": "gpu-1-shared",
             "shareID": "s1", "consumedCapacity": {names.MILLI: "200", names.MEMORY: "16Gi"}}
    devices: dict[str, Any] = {"results": [share]}
    if config is not None:
        devices["config"] = [{"source": "FromClaim", **entry} for entry in config]
    annotations = {DRA_PINNED_ANNOTATION: "{}"} if pinned else {}
    return {"metadata": {"uid": "u1", "annotations": annotations}, "status": {"allocation": {"devices": devices}}}


@pytest.fixture
def nvml(tmp_path: Path) -> SimulatedNvml:
    sim = SimulatedNvml(H100, 2, tmp_path / "sim.json", seed="node-a")
    sim.set_mig_mode(1, False)
    sim.reset_gpu(1)
    return sim


def test_the_kubelet_plugin_gives_a_right_sized_share_no_thread_limit(nvml: SimulatedNvml) -> None:
    _, allocation = dra_admitted()
    ref = ClaimRef("u1", NS, "c")
    (right_sized,) = plan_claim(allocation_from_claim(allocated_claim(list(claim_config(allocation))), ref), nvml,
                                node="node-a", share_mode="mps")
    assert right_sized.mps is not None and right_sized.mps.env() == (
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=16384M")
    (plain,) = plan_claim(allocation_from_claim(allocated_claim(None), ref), nvml, node="node-a", share_mode="mps")
    assert plain.mps is not None and plain.mps.thread_percentage == 20  # unchanged: consumed milli / 10
    # A tenant's own claim (no controller's pin) that names itself right-sized keeps its SM cap.
    tenants = allocated_claim(list(claim_config(allocation)), pinned=False)
    (forged,) = plan_claim(allocation_from_claim(tenants, ref), nvml, node="node-a", share_mode="mps")
    assert forged.mps is not None and forged.mps.thread_percentage == 20


def test_other_drivers_and_kinds_are_left_alone_and_a_bad_entry_of_ours_is_refused() -> None:
    parameters: dict[str, Any] = {"apiVersion": "gpu.gpupack.io/v1alpha1", "kind": "RightSizedShare",
                                  "predictedMilli": 400}
    foreign = {"driver": "net.example.com", "parameters": {"kind": "RightSizedShare"}}
    config = [{"requests": ["gpu-0"], "opaque": foreign},
              {"opaque": {"driver": names.DRIVER, "parameters": {"kind": "SomethingElse"}}},
              {"opaque": {"driver": names.DRIVER, "parameters": parameters}}]  # no requests: every request
    found = predicted_by_request({"devices": {"config": config}}, "status.allocation")
    assert found == {"*": 400}
    bad = {"driver": names.DRIVER, "parameters": {**parameters, "predictedMilli": 0}}
    with pytest.raises(ClaimError, match=r"config\[0\]\.opaque\.parameters\.predictedMilli 0 is not 1\.\.1000"):
        allocation_from_claim(allocated_claim([{"requests": ["gpu-0"], "opaque": bad}]), ClaimRef("u1", NS, "c"))
