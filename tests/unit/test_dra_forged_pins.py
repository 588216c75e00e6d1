"""A pin (``gpupack.io/dra-pinned``) counts only when gpupack's controller could have written it
(issue 33, item 1): a tenant's claim carrying one, on any DeviceClass, promises nothing and is
adopted by no pod; the controller's own claims still count. ``controller.state.dra_usage.pin_untrusted``."""

from __future__ import annotations

from typing import Any

from controller.state.dra_usage import read_usage
from controller.state.pods import pod_from_object
from controller.state.build import node_from_objects
from controller.state.snapshot import Node, Pod
from sharing.admission.dra_claims import MANAGED_BY
from sharing.dra.pinned import ANNOTATION, Pinned, PinnedDevice
from sharing.dra.share_policy import SharePolicy
from sharing.api.keys import DRA_REQUEUES_ANNOTATION, PLACEMENT_CONDITION
from sharing.api.placement_status import NO_CAPACITY, WAITING_FOR_CAPACITY
from controller.writes.dra_claims import claim_body
from controller.reconcile import Controller
from tests.unit.test_controller_manifests import _base_install
from controller.settings import ControllerSettings
from tests.unit.test_controller_dra import (
    NOW, cluster, controller, dra_allocation, dra_pod, gpunode, node_object, pinned_node,
)

EVERY_GPU = Pinned("a", (PinnedDevice("a", "gpu", 0), PinnedDevice("a", "gpu", 1)))


def forged(name: str, namespace: str = "tenant", pinned: Pinned = EVERY_GPU, **meta: Any) -> dict[str, Any]:
    """The attack of issue 33: a claim on a DeviceClass that is not gpupack's, pinning every GPU of the node."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"namespace": namespace, "name": name, "labels": dict(MANAGED_BY),
                         "annotations": {ANNOTATION: pinned.to_annotation(), DRA_REQUEUES_ANNOTATION: "99"}, **meta},
            "spec": {"devices": {"requests": [{"name": "a", "exactly": {"deviceClassName": "tenant-class"}}]}}}


def _node() -> Node:
    node = node_from_objects(gpunode("a", 2), node_object("a"))
    assert node is not None
    return node


def _pod(name: str, mode: str = "mps", claim: str | None = None) -> tuple[dict[str, Any], Pod]:
    obj = dra_pod(name, "team", dra_allocation(mode, claim or f"gpupack-pod-{name}"), uid=f"uid-{name}")  # type: ignore[arg-type]
    pod = pod_from_object(obj)
    assert pod is not None
    return obj, pod


def test_a_tenants_pins_promise_nothing_and_are_named_once() -> None:
    _, pod = _pod("p")
    usage = read_usage([forged("c1"), forged("c2")], [_node()], [pod])
    assert usage.holds == ()
    assert [p.split(":")[0] for p in usage.problems] == ["ResourceClaim tenant/c1", "ResourceClaim tenant/c2"]
    assert all("not written by gpupack" in p for p in usage.problems)
    assert usage.claims["tenant/c1"].pinned is None and usage.claims["tenant/c1"].requeues == 0


def test_the_controllers_own_claim_still_promises() -> None:
    obj, pod = _pod("p")
    pinned = Pinned("a", (PinnedDevice("gpu-0", "shared", 1, 300, 2**30),))
    body = claim_body(obj, dra_allocation("mps", "gpupack-pod-p"), pinned, SharePolicy(), requeues=2)
    usage = read_usage([body], [_node()], [pod])
    assert [(h.claim, h.device.gpu, h.allocated) for h in usage.holds] == [("team/gpupack-pod-p", 1, False)]
    assert usage.problems == () and usage.claims["team/gpupack-pod-p"].requeues == 2


def test_a_pin_its_pods_record_would_not_give_is_not_trusted_even_on_the_pods_own_claim() -> None:
    obj, pod = _pod("p")  # an mps pod: the controller never pins it a whole GPU
    owner = {"ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "uid-p", "controller": True}]}
    whole = Pinned("a", (PinnedDevice("gpu-0", "gpu", 0),))
    cases = {
        "no owner": forged("gpupack-pod-p", "team", Pinned("a", (PinnedDevice("gpu-0", "shared", 0, 300, 2**30),))),
        "wrong kind": claim_body(obj, dra_allocation("mps", "gpupack-pod-p"),
                                 Pinned("a", (PinnedDevice("gpu-0", "shared", 0, 300, 2**30),)), SharePolicy()),
        "foreign class": forged("gpupack-pod-p", "team", Pinned("a", (PinnedDevice("a", "shared", 0, 300, 2**30),)),
                                **owner),
    }
    cases["wrong kind"]["metadata"]["annotations"][ANNOTATION] = whole.to_annotation()
    for why, claim in cases.items():
        usage = read_usage([claim], [_node()], [pod])
        assert usage.holds == (), why
        assert usage.claims["team/gpupack-pod-p"].pinned is None, why


def test_a_forged_pin_on_every_gpu_does_not_stop_placement() -> None:
    obj, _ = _pod("p")
    kube = cluster(obj)
    for index in range(3):
        kube.claims[f"tenant/c{index}"] = forged(f"c{index}")
    report = controller(kube).cycle()
    assert report.released == ["team/p"] and pinned_node(kube.pod_patches[0][1]) == ["a"]


def test_a_forged_claim_under_the_pods_claim_name_is_not_adopted() -> None:
    obj, _ = _pod("p")
    kube = cluster(obj)
    owner = [{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "uid-p", "controller": True}]
    kube.claims["team/gpupack-pod-p"] = forged("gpupack-pod-p", "team", Pinned("a", (PinnedDevice("gpu-0", "gpu", 1),)),
                                               ownerReferences=owner)
    report = controller(kube).cycle()
    assert report.released == [] and kube.pod_patches == []


# ------------------------------------------------------------------ issue 33, item 8: why a DRA pod waits
def _placement(kube: Any, pod: str) -> list[tuple[str, str, str]]:
    """The gpupack.io/Placement conditions the cycle wrote on ``pod``: (status, reason, message)."""
    return [(c["status"], c["reason"], c["message"]) for key, body in kube.status_patches if key == pod
            for c in body["status"]["conditions"] if c["type"] == PLACEMENT_CONDITION]


def test_a_gated_dra_pod_says_why_it_waits() -> None:
    obj, _ = _pod("p", mode="whole")  # node a shares its GPUs by MPS: no whole GPU for it
    kube = cluster(obj)
    report = controller(kube).cycle()
    assert report.released == [] and report.dra.waiting
    ((status, reason, message),) = _placement(kube, "team/p")
    assert status == "False" and reason in (NO_CAPACITY, WAITING_FOR_CAPACITY) and message


def test_a_dra_pod_a_promise_holds_back_says_so() -> None:
    """Its node's GPUs are promised to the controller's own claims of other pods: the pod waits, and says why."""
    first, _ = _pod("first")
    kube = cluster(first)
    control = controller(kube)
    assert control.cycle().released == ["team/first"]
    first["spec"].pop("schedulingGates")  # released and bound; its claim not allocated yet: a promise
    first["spec"]["nodeName"] = "a"
    big = dra_pod("big", "team", dra_allocation("mps", "gpupack-pod-big", milli=(1000, 1000)), uid="uid-big")
    kube.pods = [first, big]
    report = control.cycle()
    assert report.released == [] and [w.pod for w in report.dra.waiting] == ["team/big"]
    ((status, reason, _),) = _placement(kube, "team/big")
    assert status == "False" and reason in (NO_CAPACITY, WAITING_FOR_CAPACITY)


def test_a_controller_placing_one_namespace_counts_the_promises_of_the_others() -> None:
    """Another namespace's released pod that kube-scheduler set aside (Unschedulable) is not in the scoped
    cycle's pods; its claim's pin is still the controller's own, and still holds both GPUs of node a."""
    allocation = dra_allocation("mps", "gpupack-pod-o", milli=(1000, 1000))
    other = dra_pod("o", "elsewhere", allocation, uid="uid-o")
    pinned = Pinned("a", (PinnedDevice("gpu-0", "shared", 0, 1000, 2**30), PinnedDevice("gpu-1", "shared", 1, 1000, 2**30)))
    body = claim_body(other, allocation, pinned, SharePolicy())
    other["spec"].pop("schedulingGates")
    other["status"] = {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}
    mine, _ = _pod("p")
    kube = cluster(other, mine)
    kube.claims["elsewhere/gpupack-pod-o"] = body
    report = Controller(kube, ControllerSettings(namespaces="team"), clock=lambda: NOW).cycle()  # type: ignore[arg-type]
    assert report.released == [] and [w.pod for w in report.dra.waiting] == ["team/p"]


# ------------------------------------------------------------------ the admission policy, in the base install
def test_the_base_install_refuses_gpupack_annotations_on_claims_from_all_but_the_controller() -> None:
    """``gpupack-claim-marks`` is installed and bound, matches claims of every version on CREATE and UPDATE,
    and exempts exactly the account the controller's Deployment runs as."""
    objects = _base_install()
    (deployment,) = [o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == "gpupack-controller"]
    account = (f"system:serviceaccount:{deployment['metadata']['namespace']}:"
               f"{deployment['spec']['template']['spec']['serviceAccountName']}")
    (policy,) = [o for o in objects if o["kind"] == "ValidatingAdmissionPolicy"
                 and o["metadata"]["name"] == "gpupack-claim-marks"]
    assert [b for b in objects if b["kind"] == "ValidatingAdmissionPolicyBinding"
            and b["spec"] == {"policyName": "gpupack-claim-marks", "validationActions": ["Deny"]}]
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert (rule["apiGroups"], rule["apiVersions"], rule["resources"]) == (["resource.k8s.io"], ["*"], ["resourceclaims"])
    assert set(rule["operations"]) == {"CREATE", "UPDATE"} and policy["spec"]["failurePolicy"] == "Fail"
    exempt = {c["name"]: c["expression"] for c in policy["spec"]["matchConditions"]}
    assert exempt["not-gpupack-controller"] == f"request.userInfo.username != '{account}'"
