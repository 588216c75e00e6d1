"""The webhook's DRA path: a pod bound for the DRA node pool references a ResourceClaim instead of
device-plugin resources (docs/dra-pods.md). ``review_pod`` is called as a function and its patch
applied with ``sharing.admission.patch.apply_patch``."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from mig.catalog import get_model
from sharing.api.allocation import Allocation, trusted_allocation
from sharing.api.backend import pod_claim_name
from sharing.admission.decision import decide
from sharing.admission.dra_claims import pod_claims
from sharing.admission.inventory import Inventory, build_inventory
from sharing.admission.patch import apply_patch
from sharing.api.request import parse_pod
from webhook.admission import review_pod
from webhook.settings import WebhookSettings
from gpupack.testing.admission_reviews import gpu_container, make_pod, make_review

H100, A100, L40S = "NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB", "NVIDIA-L40S"  # L40S: no MIG
SETTINGS = WebhookSettings()
DRA = {"gpupack.io/backend": "dra"}


def gpunode(name: str, product: str = A100, sharing: str = "mps", mig: bool = False, gpus: int = 2) -> dict[str, Any]:
    memory = 46068 if product == L40S else get_model(product).memory_mib
    return {"kind": "GPUNode", "metadata": {"name": name},
            "status": {"product": product, "sharing": {"mode": sharing, "replicas": 4},
                       "gpus": [{"index": i, "uuid": f"GPU-{name}-{i}", "product": product, "memoryMiB": memory,
                                 "migEnabled": mig, "instances": []} for i in range(gpus)]}}


def node(name: str, backend: str) -> dict[str, Any]:
    return {"kind": "Node", "metadata": {"name": name, "labels": {"gpupack.io/backend": backend}}}


def dra_cluster(*gpunodes: dict[str, Any], device_plugin: list[dict[str, Any]] | None = None) -> Inventory:
    objects = [o for g in gpunodes for o in (g, node(g["metadata"]["name"], "dra"))]
    return build_inventory(objects + (device_plugin or []))


MPS_POOL = dra_cluster(gpunode("dra-mps"))


def answer(pod: dict[str, Any], inventory: Inventory, uid: str = "uid-1") -> dict[str, Any]:
    out = review_pod(make_review(pod, uid=uid), inventory, SETTINGS).review["response"]
    assert out["uid"] == uid
    return dict(out)


def admitted(pod: dict[str, Any], inventory: Inventory, uid: str = "uid-1") -> tuple[dict[str, Any], dict[str, Any]]:
    """(the patched pod, the response)."""
    out = answer(pod, inventory, uid)
    assert out["allowed"], out["status"]["message"]
    return apply_patch(pod, json.loads(base64.b64decode(out["patch"]))), out


def record(pod: dict[str, Any]) -> Allocation:
    return Allocation.from_annotation(pod["metadata"]["annotations"]["gpupack.io/allocation"])


def denied(pod: dict[str, Any], inventory: Inventory) -> dict[str, Any]:
    out = answer(pod, inventory)
    assert not out["allowed"]
    return dict(out["status"])


# ------------------------------------------------------------------ the patch
def test_a_dra_pod_references_its_claim_instead_of_device_plugin_resources() -> None:
    user_term = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
    pod = make_pod(gpu_container("c", "300", "20Gi", env=[{"name": "X", "value": "1"}],
                                 resources={"limits": {"gpupack.io/gpu-milli": "300", "gpupack.io/gpu-memory": "20Gi",
                                                       "cpu": "2"},
                                            "requests": {"gpupack.io/gpu-milli": "300", "cpu": "1"}}),
                   labels=DRA,
                   affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                       "nodeSelectorTerms": [user_term]}}})
    patched, out = admitted(pod, MPS_POOL, uid="review-7")
    claim = pod_claim_name("review-7")
    spec = patched["spec"]
    container = spec["containers"][0]
    assert spec["resourceClaims"] == [{"name": "gpupack", "resourceClaimName": claim}]
    # gpupack.io/* dropped, nothing of nvidia.com/* added, no MPS env: the claim carries the share.
    assert container["resources"] == {"limits": {"cpu": "2"}, "requests": {"cpu": "1"},
                                      "claims": [{"name": "gpupack", "request": "gpu-0"}]}
    assert container["env"] == [{"name": "X", "value": "1"}]
    assert spec["schedulingGates"] == [{"name": "gpupack.io/capacity"}]
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [
        {"key": "zone", "operator": "In", "values": ["a"]},
        {"key": "gpupack.io/backend", "operator": "In", "values": ["dra"]},
        {"key": "gpupack.io/gpu-degraded", "operator": "DoesNotExist"}]}]
    allocation = record(patched)
    assert (allocation.backend, allocation.claim, allocation.mode, allocation.gated) == ("dra", claim, "mps", True)
    assert [(c.name, c.milli, c.memory_bytes, c.resource) for c in allocation.containers] == [
        ("c", 300, 20 * 2**30, "gpu-0")]
    assert trusted_allocation(patched["metadata"]["annotations"]["gpupack.io/allocation"], spec)[0] == allocation
    assert "DRA node pool" in out["status"]["message"] and "pod label gpupack.io/backend=dra" in out["status"]["message"]


def test_request_names_follow_the_claim_core_init_containers_first() -> None:
    pod = make_pod(gpu_container("app-a", "200"), gpu_container("app-b", "100"),
                   init=[gpu_container("init", "100")], labels=DRA)
    patched, _ = admitted(pod, MPS_POOL)
    spec = patched["spec"]
    named = {c["name"]: c["resources"]["claims"] for c in spec["initContainers"] + spec["containers"]}
    assert named == {"init": [{"name": "gpupack", "request": "gpu-0"}],
                     "app-a": [{"name": "gpupack", "request": "gpu-1"}],
                     "app-b": [{"name": "gpupack", "request": "gpu-2"}]}
    # The same names sharing.admission.dra_claims gives the same decided containers.
    request = parse_pod(pod, "default")
    assert request is not None
    decision = decide(request, MPS_POOL.policy_for("default"), MPS_POOL, backend="dra")
    core = pod_claims(decision.mode, decision.containers)
    assert [c.claims[0]["request"] for c in core.containers] == [c.resource for c in record(patched).containers]


def test_existing_resource_claims_of_the_user_are_kept() -> None:
    mine = {"name": "scratch", "resourceClaimTemplateName": "fast-disk"}
    pod = make_pod(gpu_container("c", "300"), labels=DRA, resourceClaims=[mine])
    patched, _ = admitted(pod, MPS_POOL, uid="u2")
    assert patched["spec"]["resourceClaims"] == [mine, {"name": "gpupack", "resourceClaimName": pod_claim_name("u2")}]


# ------------------------------------------------------------------ the DRA rules
def test_a_600_milli_mps_pod_shares_on_dra_where_the_device_plugin_would_give_a_whole_gpu() -> None:
    pod = make_pod(gpu_container("c", "600"), mode="mps", labels=DRA)
    patched, _ = admitted(pod, MPS_POOL)
    assert record(patched).mode == "mps"
    plugin_pool = build_inventory([gpunode("dp-mps"), gpunode("dp-whole", sharing="none")])
    patched, _ = admitted(make_pod(gpu_container("c", "600"), mode="mps"), plugin_pool)
    assert record(patched).mode == "whole"


def test_a_pod_asking_a_whole_gpu_gets_a_whole_gpu_device() -> None:
    inventory = dra_cluster(gpunode("dra-mps"), gpunode("dra-whole", sharing="none"))
    patched, _ = admitted(make_pod(gpu_container("c", "1000"), labels=DRA), inventory)
    allocation = record(patched)
    assert allocation.mode == "whole" and allocation.containers[0].resource == "gpu-0"


def test_mig_profiles_on_the_pools_mig_capable_gpus() -> None:
    inventory = dra_cluster(gpunode("dra-mig", product=H100, sharing="none", mig=True))
    patched, out = admitted(make_pod(gpu_container("c", "250", "15Gi"), mode="mig", labels=DRA), inventory)
    allocation = record(patched)
    assert (allocation.mode, allocation.containers[0].profile, allocation.gpu_model) == ("mig", "2g.20gb", H100)
    assert patched["spec"]["resourceClaims"][0]["name"] == "gpupack"
    assert "warnings" not in out  # dynamic MIG: a MIG-enabled GPU of the model is capacity


MPS_AND_MIG_POOL = dra_cluster(gpunode("dra-mps"), gpunode("dra-mig", product=H100, sharing="none", mig=True))


def test_an_auto_pod_given_a_share_records_the_pools_mig_option_for_the_engine() -> None:
    patched, _ = admitted(make_pod(gpu_container("c", "450", "40Gi"), labels=DRA), MPS_AND_MIG_POOL)
    allocation = record(patched)
    # 40Gi is more than 4g.40gb's 40GB: the smallest H100 profile covering it is 7g.80gb.
    assert (allocation.mode, allocation.mig_fallback) == ("mps", ("7g.80gb",))
    assert "or MIG 7g.80gb if no shared GPU has room" in allocation.reason
    text = patched["metadata"]["annotations"]["gpupack.io/allocation"]
    assert trusted_allocation(text, patched["spec"])[0] == allocation


def test_an_explicit_mode_or_a_pool_without_mig_records_no_fallback() -> None:
    explicit, _ = admitted(make_pod(gpu_container("c", "450", "40Gi"), mode="mps", labels=DRA), MPS_AND_MIG_POOL)
    assert (record(explicit).mode, record(explicit).mig_fallback) == ("mps", None)
    l40s = dra_cluster(gpunode("dra-mps", product=L40S))  # no MIG-capable model: no MIG option
    no_mig, _ = admitted(make_pod(gpu_container("c", "450", "40Gi"), labels=DRA), l40s)
    assert (record(no_mig).mode, record(no_mig).mig_fallback) == ("mps", None)
    on_mig, _ = admitted(make_pod(gpu_container("c", "250", "15Gi"), mode="mig", labels=DRA), MPS_AND_MIG_POOL)
    assert (record(on_mig).mode, record(on_mig).mig_fallback) == ("mig", None)


def test_the_fallback_has_one_profile_per_container_in_record_order() -> None:
    pod = make_pod(gpu_container("app", "450", "40Gi"), init=[gpu_container("init", "100", "5Gi")], labels=DRA)
    allocation = record(admitted(pod, MPS_AND_MIG_POOL)[0])
    assert [c.name for c in allocation.containers] == ["init", "app"]
    assert allocation.mig_fallback == ("1g.10gb", "7g.80gb")


def test_the_decision_sees_only_the_dra_pools_nodes() -> None:
    # The device plugin's pool has an H100 MIG node; the DRA pool only L40Ss (no MIG) sharing by MPS.
    mixed = dra_cluster(gpunode("dra-mps", product=L40S), device_plugin=[gpunode("dp-mig", product=H100, sharing="none", mig=True)])
    patched, _ = admitted(make_pod(gpu_container("c", "250"), labels=DRA), mixed)
    assert record(patched).mode == "mps"
    status = denied(make_pod(gpu_container("c", "250"), mode="mig", labels=DRA), mixed)
    assert status["details"]["causes"][0]["reason"] == "NoMigModel"
    assert "DRA node pool" in status["message"]
    # ... and a device-plugin pod of the same cluster never sees the DRA node.
    patched, _ = admitted(make_pod(gpu_container("c", "250")), mixed)
    assert record(patched).mode == "mig" and record(patched).backend == "device-plugin"


def test_a_cluster_of_dra_nodes_only_sends_unlabelled_pods_to_dra() -> None:
    patched, out = admitted(make_pod(gpu_container("c", "300")), MPS_POOL)
    assert record(patched).backend == "dra" and "every GPU node of the cluster is in the DRA pool" in out["status"]["message"]


def test_a_namespace_label_sends_the_pod_to_dra() -> None:
    inventory = build_inventory([gpunode("dp"), gpunode("dra-mps"), node("dra-mps", "dra"),
                                 {"kind": "Namespace", "metadata": {"name": "ml", "labels": DRA}}])
    pod = make_pod(gpu_container("c", "300"), namespace="ml")
    review = make_review(pod, namespace="ml")
    out = review_pod(review, inventory, SETTINGS).review["response"]
    patched = apply_patch(pod, json.loads(base64.b64decode(out["patch"])))
    assert record(patched).backend == "dra"


def test_no_dra_node_yet_admits_the_pod_gated_with_a_warning() -> None:
    only_plugin = build_inventory([gpunode("dp")])
    patched, out = admitted(make_pod(gpu_container("c", "300"), labels=DRA), only_plugin)
    allocation = record(patched)
    assert allocation.backend == "dra" and allocation.gated and not allocation.capacity_existed
    assert any("no node of the DRA pool" in w for w in out["warnings"])
    assert patched["spec"]["schedulingGates"] == [{"name": "gpupack.io/capacity"}]


def test_no_dra_node_and_only_mig_allowed_is_refused_clearly() -> None:
    only_mig = build_inventory([gpunode("dp"), {"kind": "SharingPolicy", "metadata": {"name": "p"},
                                                "spec": {"namespaces": [{"names": ["default"], "allowedModes": ["mig"]}]}}])
    status = denied(make_pod(gpu_container("c", "300"), labels=DRA), only_mig)
    assert "DRA node pool" in status["message"] and status["details"]["causes"][0]["reason"] == "NoCompatibleNodes"


def test_a_backend_label_that_names_no_backend_is_denied() -> None:
    status = denied(make_pod(gpu_container("c", "300"), labels={"gpupack.io/backend": "DRA"}), MPS_POOL)
    assert status["details"]["causes"][0]["reason"] == "UnknownBackend"
    assert "gpupack.io/backend='DRA'" in status["message"] and "device-plugin, dra" in status["message"]


# ------------------------------------------------------------------ reinvocation and forged entries
def test_reinvocation_leaves_a_dra_pod_unchanged() -> None:
    patched, _ = admitted(make_pod(gpu_container("c", "300"), labels=DRA), MPS_POOL)
    again = answer(patched, MPS_POOL, uid="another-review")
    assert again["allowed"] and "patch" not in again and "untouched" in again["status"]["message"]


def test_a_pod_asking_gpupack_resources_may_not_bring_its_own_gpupack_claim_entry() -> None:
    pod = make_pod(gpu_container("c", "300"), labels=DRA, resourceClaims=[{"name": "gpupack", "resourceClaimName": "mine"}])
    status = denied(pod, MPS_POOL)
    assert status["details"]["causes"][0]["reason"] == "ForgedAllocation"
    assert "spec.resourceClaims entry 'gpupack'" in status["message"]


def forged_entry(**annotations: str) -> dict[str, Any]:
    container = {"name": "c", "image": "x", "resources": {"claims": [{"name": "gpupack", "request": "gpu-0"}]}}
    return make_pod(container, annotations=annotations or None,
                    resourceClaims=[{"name": "gpupack", "resourceClaimName": "gpupack-pod-0123456789abcdef"}])


@pytest.mark.parametrize("annotations", [
    {},
    {"gpupack.io/allocation": json.dumps({"mode": "mps", "containers": [
        {"name": "c", "milli": 300, "resource": "gpu-0"}], "backend": "dra", "claim": "gpupack-pod-other"})},
    {"gpupack.io/allocation": json.dumps({"mode": "mps", "containers": [
        {"name": "c", "milli": 300, "resource": "nvidia.com/gpu.shared"}]})},
], ids=["no-record", "record-of-another-claim", "device-plugin-record"])
def test_a_gpupack_claim_entry_without_a_trusted_dra_record_is_denied(annotations: dict[str, str]) -> None:
    status = denied(forged_entry(**annotations), MPS_POOL)
    assert status["details"]["causes"][0]["reason"] == "ForgedAllocation"


def test_a_device_plugin_record_with_a_gpupack_claim_entry_is_denied() -> None:
    pod = forged_entry(**{"gpupack.io/allocation": json.dumps({"mode": "mps", "containers": [
        {"name": "c", "milli": 300, "resource": "nvidia.com/gpu.shared"}]})})
    pod["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/gpu.shared": "1"}
    status = denied(pod, MPS_POOL)
    assert "is not a DRA one" in status["message"]


# ------------------------------------------------------------------ shares that never fit one node
def test_shares_more_than_any_node_holds_at_once_are_refused_as_never_fitting() -> None:
    """All of a pod's shares land on one node: three 700-milli MPS containers need more than the pool's
    node of two GPUs holds in total, so no placement could ever exist and the pod is refused, not left
    waiting; two of them fit (one per GPU) and are admitted."""
    three = make_pod(*(gpu_container(f"c{i}", "700") for i in range(3)), labels=DRA, mode="mps")
    status = denied(three, MPS_POOL)
    assert status["details"]["causes"][0]["reason"] == "PodNeverFits"
    assert "2100 milli" in status["message"] and "dra-mps shares 2 GPU(s)" in status["message"]
    two = make_pod(*(gpu_container(f"c{i}", "700") for i in range(2)), labels=DRA, mode="mps")
    patched, _ = admitted(two, MPS_POOL)
    assert record(patched).mode == "mps"
    # A bigger node in the pool makes the three-share pod possible again.
    assert record(admitted(three, dra_cluster(gpunode("dra-mps"), gpunode("dra-big", gpus=4)))[0]).mode == "mps"


# ------------------------------------------------------------------ pods that ask for no GPU
def cpu_pod(labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    container = {"name": "c", "image": "x", "resources": {"requests": {"cpu": "4", "memory": "8Gi"}}}
    return make_pod(container, labels=DRA if labels is None else labels, **spec)


def test_a_pod_asking_no_gpu_labelled_for_dra_waits_for_the_engine_on_the_pool() -> None:
    patched, out = admitted(cpu_pod(), MPS_POOL)
    assert patched["spec"]["schedulingGates"] == [{"name": "gpupack.io/capacity"}]
    (term,) = patched["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]
    assert {"key": "gpupack.io/backend", "operator": "In", "values": ["dra"]} in term["matchExpressions"]
    assert patched["spec"]["containers"] == cpu_pod()["spec"]["containers"]  # requests untouched
    assert "resourceClaims" not in patched["spec"]
    rec = record(patched)
    assert (rec.mode, rec.backend, rec.claim, rec.containers, rec.gated) == ("cpu", "dra", None, (), True)
    assert trusted_allocation(patched["metadata"]["annotations"]["gpupack.io/allocation"], patched["spec"])[0] == rec
    assert "asks for no GPU" in out["status"]["message"]
    # Reinvoked, the webhook changes nothing.
    again = answer(patched, MPS_POOL, uid="again")
    assert again["allowed"] and "patch" not in again


def test_a_pod_asking_no_gpu_without_the_label_or_asking_a_gpu_itself_is_not_placed_by_gpupack() -> None:
    out = answer(cpu_pod(labels={}), MPS_POOL)
    assert out["allowed"] and "patch" not in out
    plain = cpu_pod()
    plain["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/gpu": "1"}
    out = answer(plain, MPS_POOL)
    assert out["allowed"] and "patch" not in out
    placed = cpu_pod(nodeName="node-1")  # placed by its creator: no gate may be added
    out = answer(placed, MPS_POOL)
    assert out["allowed"] and "patch" not in out


def test_a_cpu_record_on_a_pod_that_asks_for_a_gpu_or_is_not_labelled_is_refused() -> None:
    patched, _ = admitted(cpu_pod(), MPS_POOL)
    text = patched["metadata"]["annotations"]["gpupack.io/allocation"]
    unlabelled = cpu_pod(labels={}, schedulingGates=[{"name": "gpupack.io/capacity"}])
    unlabelled["metadata"]["annotations"] = {"gpupack.io/allocation": text}
    status = denied(unlabelled, MPS_POOL)
    assert status["details"]["causes"][0]["reason"] == "ForgedAllocation" and "mode 'cpu'" in status["message"]
    asks = dict(patched)
    asks["spec"] = {**patched["spec"], "containers": [
        {"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
    allocation, why = trusted_allocation(text, asks["spec"])
    assert allocation is None and "asks for nvidia.com/gpu" in str(why)


def test_a_hand_written_record_on_a_labelled_cpu_pod_is_replaced_by_the_webhooks() -> None:
    forged = cpu_pod()
    forged["metadata"]["annotations"] = {"gpupack.io/allocation": json.dumps(
        {"mode": "mps", "containers": [{"name": "c", "milli": 300, "resource": "nvidia.com/gpu.shared"}]})}
    patched, _ = admitted(forged, MPS_POOL)
    assert record(patched).mode == "cpu"


def test_a_cpu_pod_with_no_dra_node_yet_is_admitted_gated_with_a_warning() -> None:
    patched, out = admitted(cpu_pod(), build_inventory([]))
    assert patched["spec"]["schedulingGates"] and "no node of the DRA pool" in out["warnings"][0]
