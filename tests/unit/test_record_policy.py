"""A record is honoured only if the namespace's SharingPolicy could have produced it (issue 33, item 3).

``sharing.admission.record_policy.record_problem`` is the rule; the webhook refuses a pod that arrives with an
out-of-policy record (``webhook.forged_marks``) and the controller neither counts nor releases one
that got past admission (``controller.state.build.assemble``).
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
import yaml

from sharing.api.allocation import Allocation, ContainerAllocation
from sharing.admission.inventory import AdmissionPolicy, Inventory, admission_policy, build_inventory
from sharing.api.keys import ALLOCATION_ANNOTATION, CAPACITY_GATE
from sharing.admission.patch import apply_patch
from sharing.admission.record_policy import record_problem
from webhook.admission import review_pod
from webhook.settings import WebhookSettings
from gpupack.testing.admission_reviews import gpu_container, make_pod, make_review

H100 = "NVIDIA-H100-80GB-HBM3"


def mig_record(profile: str = "1g.10gb", name: str = "c") -> Allocation:
    return Allocation(mode="mig", gated=True, capacity_existed=False, policy="p", reason="r", gpu_model=H100,
                      containers=(ContainerAllocation(name, "containers", 100, None, f"nvidia.com/mig-{profile}",
                                                      profile),))


def shared_record(mode: Any = "mps", fallback: tuple[str, ...] | None = None, replicas: int | None = 4) -> Allocation:
    return Allocation(mode=mode, gated=True, capacity_existed=True, policy="p", reason="r", replicas=replicas,
                      containers=(ContainerAllocation("c", "containers", 250, None, "nvidia.com/gpu.shared"),),
                      backend="dra" if fallback else "device-plugin", claim="gpupack-x" if fallback else None,
                      mig_fallback=fallback)


# ------------------------------------------------------------------ the rule


@pytest.mark.parametrize(("record", "policy", "why"), [
    (mig_record(), AdmissionPolicy("only-mps", allowed_modes=("mps",)), "mode 'mig' is not allowed"),
    (mig_record("7g.80gb"), AdmissionPolicy("small", allowed_profiles=("1g.10gb", "2g.20gb")),
     "MIG profile '7g.80gb' is not allowed"),
    (mig_record("1g.10gb+me"), AdmissionPolicy("any"), "'1g.10gb+me' is not one the webhook chooses"),
    (mig_record("9g.999gb"), AdmissionPolicy("any"), "'9g.999gb' is not one the webhook chooses"),
    (shared_record("whole", replicas=None), AdmissionPolicy("only-mig", allowed_modes=("mig",)),
     "mode 'whole' is given only for a shared-mode request"),
    (shared_record("time-slicing"), AdmissionPolicy("only-mps", allowed_modes=("mps",)),
     "mode 'time-slicing' is not allowed"),
    (shared_record(fallback=("3g.40gb",)), AdmissionPolicy("no-mig", allowed_modes=("mps",)),
     "migFallback names MIG profiles"),
    (shared_record(fallback=("7g.80gb",)), AdmissionPolicy("small", allowed_profiles=("1g.10gb",)),
     "MIG profile '7g.80gb' is not allowed"),
    (shared_record(replicas=500), AdmissionPolicy("any"), "replicas 500 is outside 1..64"),
])
def test_records_the_policy_could_not_have_produced_say_why(record: Allocation, policy: AdmissionPolicy,
                                                            why: str) -> None:
    problem = record_problem(record, policy)
    assert problem is not None and why in problem and repr(policy.name) in problem


@pytest.mark.parametrize(("record", "policy"), [
    (mig_record(), AdmissionPolicy("any")),
    (mig_record("7g.80gb"), AdmissionPolicy("big", allowed_modes=("mig",), allowed_profiles=("7g.80gb",))),
    (shared_record(), AdmissionPolicy("only-mps", allowed_modes=("mps",))),
    (shared_record("whole", replicas=None), AdmissionPolicy("ts", allowed_modes=("time-slicing",))),
    (shared_record(fallback=("3g.40gb",)), AdmissionPolicy("any")),
    (Allocation("cpu", True, True, "p", "r", (), backend="dra"), AdmissionPolicy("none", allowed_modes=())),
])
def test_records_the_policy_could_have_produced_pass(record: Allocation, policy: AdmissionPolicy) -> None:
    assert record_problem(record, policy) is None


# ------------------------------------------------------------------ the webhook

POLICY = {
    "apiVersion": "gpupack.io/v1alpha1", "kind": "SharingPolicy", "metadata": {"name": "tiers"},
    "spec": {"namespaces": [{"selector": {"matchLabels": {"tier": "shared"}}, "allowedModes": ["mps"]},
                            {"names": ["big"], "allowedModes": ["mig"]}],
             "allowedProfiles": ["1g.10gb", "2g.20gb", "3g.40gb"]},
}


def gpunodes() -> list[dict[str, Any]]:
    mig = {"apiVersion": "gpupack.io/v1alpha1", "kind": "GPUNode", "metadata": {"name": "h100"},
           "spec": {"sharing": {"mode": "none", "replicas": 1}},
           "status": {"product": H100, "gpus": [
               {"index": 0, "uuid": "GPU-0", "product": H100, "memoryMiB": 81559, "migEnabled": True,
                "instances": [{"profile": "1g.10gb", "start": 0, "size": 1},
                              {"profile": "7g.80gb", "start": 0, "size": 8}]}]}}
    mps = {"apiVersion": "gpupack.io/v1alpha1", "kind": "GPUNode", "metadata": {"name": "a100"},
           "spec": {"sharing": {"mode": "mps", "replicas": 4}},
           "status": {"product": "NVIDIA-A100-SXM4-80GB", "sharing": {"mode": "mps", "replicas": 4}, "gpus": [
               {"index": 0, "uuid": "GPU-1", "product": "NVIDIA-A100-SXM4-80GB", "memoryMiB": 81920,
                "migEnabled": False}]}}
    return [mig, mps]


NAMESPACES = [{"kind": "Namespace", "metadata": {"name": "team", "labels": {"tier": "shared"}}},
              {"kind": "Namespace", "metadata": {"name": "big"}}]


@pytest.fixture(scope="module")
def inventory() -> Inventory:
    return build_inventory([*gpunodes(), POLICY, *NAMESPACES])


def forged_pod(record: Allocation, namespace: str = "team") -> dict[str, Any]:
    """What a tenant writes by hand: the record, the gate and the limits that match the record."""
    (c,) = record.containers
    pod = make_pod({"name": c.name, "image": "example.com/app:1", "resources": {"limits": {c.resource: "1"}}},
                   namespace=namespace, annotations={ALLOCATION_ANNOTATION: record.to_annotation()})
    pod["spec"]["schedulingGates"] = [{"name": CAPACITY_GATE}]
    return pod


def answer(pod: dict[str, Any], inventory: Inventory) -> dict[str, Any]:
    namespace = pod["metadata"]["namespace"]
    out: dict[str, Any] = review_pod(make_review(pod, uid="u", namespace=namespace), inventory,
                                     WebhookSettings()).review["response"]
    return out


def test_the_merged_policy_reads_the_namespace_labels() -> None:
    specs = [("tiers", build_inventory([POLICY]).policies[0][1])]
    assert admission_policy(specs, "team", {"tier": "shared"}).allowed_modes == ("mps",)
    assert admission_policy(specs, "team", None).allowed_modes == ()  # labels unknown: the selector covers nothing
    assert admission_policy(specs, "big", None).allowed_modes == ("mig",)


def test_a_hand_written_mig_record_in_an_mps_only_namespace_is_refused(inventory: Inventory) -> None:
    """The record matches the pod's own requests, so it used to pass as the webhook's reinvocation."""
    out = answer(forged_pod(mig_record()), inventory)
    assert not out["allowed"]
    assert out["status"]["details"]["causes"][0]["reason"] == "ForgedAllocation"
    assert "mode 'mig' is not allowed in the namespace (allowed modes: mps)" in out["status"]["message"]


def test_a_hand_written_record_naming_a_profile_the_policy_forbids_is_refused(inventory: Inventory) -> None:
    out = answer(forged_pod(mig_record("7g.80gb"), namespace="big"), inventory)
    assert not out["allowed"] and "MIG profile '7g.80gb' is not allowed" in out["status"]["message"]
    # The same hand-written record with an allowed profile is one the webhook could have written.
    assert answer(forged_pod(mig_record("3g.40gb"), namespace="big"), inventory)["allowed"]


@pytest.mark.parametrize(("namespace", "mode"), [("team", None), ("big", "mig")])
def test_the_webhooks_own_reinvocation_still_passes(inventory: Inventory, namespace: str, mode: str | None) -> None:
    pod = make_pod(gpu_container("main", "100", "5Gi"), namespace=namespace, mode=mode)
    first = answer(pod, inventory)
    assert first["allowed"] and "patch" in first
    mutated = apply_patch(pod, json.loads(base64.b64decode(first["patch"])))
    again = answer(mutated, inventory)
    assert again["allowed"] and "patch" not in again


def test_a_record_arriving_before_the_policies_are_synced_waits(inventory: Inventory) -> None:
    from dataclasses import replace

    out = answer(forged_pod(mig_record(), namespace="big"), replace(inventory, synced=False))
    assert not out["allowed"] and out["status"]["details"]["causes"][0]["reason"] == "InventoryNotSynced"


# ------------------------------------------------------------------ the controller


def controller_pod(record: Allocation, namespace: str = "team") -> dict[str, Any]:
    pod = forged_pod(record, namespace)
    pod["apiVersion"] = "v1"
    pod["metadata"].update(uid=f"uid-{namespace}", resourceVersion="10", creationTimestamp="2026-12-01T11:00:00Z")
    pod["status"] = {"phase": "Pending"}
    return pod


def test_the_snapshot_leaves_out_a_record_outside_the_namespaces_policy() -> None:
    from controller.state.build import build_snapshot

    pods = [controller_pod(mig_record()), controller_pod(mig_record(), "big"),
            controller_pod(mig_record("7g.80gb"), "big")]
    snap = build_snapshot(gpunodes(), [], pods, [POLICY], namespaces=NAMESPACES)
    assert [p.key for p in snap.pods] == ["big/pod-1"] and snap.pods[0].profiles == ("1g.10gb",)
    assert sorted(u.split(":")[0] for u in snap.untrusted_pods) == ["big/pod-1", "team/pod-1"]
    assert any("mode 'mig' is not allowed" in u for u in snap.untrusted_pods)
    assert any("MIG profile '7g.80gb' is not allowed" in u for u in snap.untrusted_pods)


@pytest.mark.parametrize(("tier", "released"), [("shared", []), ("mig", ["team/pod-1"])])
def test_the_controller_does_not_release_a_record_that_got_past_admission(
    monkeypatch: pytest.MonkeyPatch, tier: str, released: list[str]
) -> None:
    """A whole cycle, reading from the caches: the namespace's labels decide which rule applies. Under the
    mps-only rule the hand-written mig record is neither released nor given the free 1g.10gb; under a
    rule that allows mig the same pod is released."""
    from controller.watch_caches import ClusterCaches
    from controller.kube import Kube
    from controller.reconcile import Controller
    from controller.settings import ControllerSettings
    from tests.unit.test_controller_caches import cached_kube, lister, one_gpu_node, synced

    policy = json.loads(json.dumps(POLICY))
    policy["metadata"]["resourceVersion"] = "1"
    policy["spec"]["namespaces"].append({"selector": {"matchLabels": {"tier": "mig"}}, "allowedModes": ["mig"]})
    namespace = {"metadata": {"name": "team", "resourceVersion": "2", "labels": {"tier": tier}}}
    pod = controller_pod(mig_record())
    caches = synced(ClusterCaches({"gpunodes": lister(one_gpu_node()), "nodes": lister(), "pods": lister(pod),
                                   "sharingpolicies": lister(policy), "namespaces": lister(namespace)}),
                    "gpunodes", "nodes", "pods", "sharingpolicies", "namespaces")
    patched: list[str] = []

    def json_patch_pod(self: Kube, ns: str, name: str, ops: Any) -> dict[str, Any]:
        patched.append(f"{ns}/{name}")
        return pod

    monkeypatch.setattr(Kube, "json_patch_pod", json_patch_pod)
    monkeypatch.setattr(Kube, "patch_gpunode", lambda self, name, body: one_gpu_node())
    monkeypatch.setattr(Kube, "patch_pod_status", lambda self, ns, name, body: pod)
    events: list[tuple[str, str, str]] = []

    def event(self: Kube, involved: dict[str, Any], type_: str, reason: str, message: str) -> None:
        events.append((f"{involved['namespace']}/{involved['name']}", reason, message))

    monkeypatch.setattr(Kube, "event", event)
    monkeypatch.setattr(Kube, "patch_policy_status", lambda self, name, body: policy)
    controller = Controller(cached_kube(caches), ControllerSettings())
    report = controller.cycle()
    assert report.errors == [] and report.released == released and patched == released
    assert controller.metrics.untrusted_allocations._value.get() == (0 if released else 1)
    if not released:  # the pod's owner is told why, once
        assert events == [("team/pod-1", "UntrustedAllocation", "gpupack neither counts nor releases this pod: "
                           "gpupack.io/allocation is outside SharingPolicy 'tiers': mode 'mig' is not allowed in the "
                           "namespace (allowed modes: mps)")]
        controller.cycle()
        assert len(events) == 1


# ------------------------------------------------------------------ a tenant's own claims (DRA pool)


def claim_review(exact: dict[str, Any], namespace: str) -> dict[str, Any]:
    obj = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "mine", "namespace": namespace},
           "spec": {"devices": {"requests": [{"name": "r", "exactly": exact}]}}}
    return make_review(obj, kind="ResourceClaim", group="resource.k8s.io", version="v1", namespace=namespace)


MIG_2G = {"deviceClassName": "gpupack-mig", "count": 1, "selectors": [
    {"cel": {"expression": 'device.attributes["gpu.gpupack.io"].profile == "2g.20gb"'}}]}


@pytest.mark.parametrize(("exact", "namespace", "why"), [
    (MIG_2G, "team", "gives mig, which SharingPolicy 'tiers' does not allow in this namespace"),
    ({**MIG_2G, "count": 4}, "big", "its count must be 1 (got count 4)"),
    ({"deviceClassName": "gpupack-mig", "count": 1, "selectors": [
        {"cel": {"expression": 'device.attributes["gpu.gpupack.io"].profile == "7g.80gb"'}}]}, "big",
     "MIG profile '7g.80gb' is not allowed in this namespace"),
])
def test_the_validating_webhook_bounds_a_claim_by_its_namespaces_policy(
    inventory: Inventory, exact: dict[str, Any], namespace: str, why: str
) -> None:
    from webhook.admission import review_validation

    out = review_validation(claim_review(exact, namespace), inventory, WebhookSettings()).review["response"]
    assert not out["allowed"] and why in out["status"]["message"]
    assert review_validation(claim_review(MIG_2G, "big"), inventory, WebhookSettings()).review["response"]["allowed"]


# ------------------------------------------------------------------ what a pod may carry at create (item 8)


def test_the_create_policy_lets_through_exactly_the_user_keys_and_the_webhooks_record() -> None:
    """The ValidatingAdmissionPolicy spells the names in CEL; they must be sharing.api.keys' (one reading)."""
    import re
    from pathlib import Path

    from sharing.api.keys import USER_POD_ANNOTATIONS, USER_POD_LABELS, WEBHOOK_POD_ANNOTATIONS

    docs = yaml.safe_load_all((Path(__file__).resolve().parents[2] / "manifests/rbac/pod-marks-policy.yaml").read_text())
    (policy,) = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"
                 and d["metadata"]["name"] == "gpupack-pod-create-marks"]
    assert policy["spec"]["matchConstraints"]["resourceRules"][0]["operations"] == ["CREATE"]
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}

    def listed(name: str) -> set[str]:
        return set(re.findall(r"'(gpupack\.io/[^']+)'", variables[name].split("!(k in", 1)[1]))

    assert listed("unknownAnnotations") == {*USER_POD_ANNOTATIONS, *WEBHOOK_POD_ANNOTATIONS}
    assert listed("unknownLabels") == set(USER_POD_LABELS)
