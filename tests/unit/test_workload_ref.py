"""sharing.api.workload: a pod's workload and its recommendation's name; the GPURecommendation model."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from sharing.api.crd import GPURecommendation, SharingPolicySpec, to_wire
from sharing.api.workload import WorkloadRef, recommendation_name, workload_of


def _pod(owner: dict[str, Any] | None = None, labels: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "web-7d9f-abcde", "namespace": "serve", "labels": labels or {}}
    if owner is not None:
        meta["ownerReferences"] = [owner]
    return {"metadata": meta}


def test_a_deployments_pod_belongs_to_the_deployment_across_rollouts() -> None:
    owner = {"kind": "ReplicaSet", "name": "web-7d9f", "controller": True}
    assert workload_of(_pod(owner, {"pod-template-hash": "7d9f"})) == WorkloadRef("serve", "Deployment", "web")


def test_a_replicaset_whose_name_lacks_the_hash_stays_the_workload() -> None:
    owner = {"kind": "ReplicaSet", "name": "web", "controller": True}
    assert workload_of(_pod(owner, {"pod-template-hash": "7d9f"})) == WorkloadRef("serve", "ReplicaSet", "web")
    assert workload_of(_pod(owner)) == WorkloadRef("serve", "ReplicaSet", "web")


def test_other_controllers_and_bare_pods() -> None:
    stateful = {"kind": "StatefulSet", "name": "db", "controller": True}
    assert workload_of(_pod(stateful)) == WorkloadRef("serve", "StatefulSet", "db")
    not_controlling = {"kind": "StatefulSet", "name": "db"}
    assert workload_of(_pod(not_controlling)) == WorkloadRef("serve", "Pod", "web-7d9f-abcde")
    assert workload_of(_pod()) == WorkloadRef("serve", "Pod", "web-7d9f-abcde")


def test_recommendation_names_are_valid_and_distinct() -> None:
    assert recommendation_name(WorkloadRef("ns", "Deployment", "web")) == "deployment-web"
    long_a = recommendation_name(WorkloadRef("ns", "Deployment", "a" * 300))
    long_b = recommendation_name(WorkloadRef("ns", "Deployment", "a" * 299 + "b"))
    assert len(long_a) <= 253 and long_a != long_b
    odd = recommendation_name(WorkloadRef("ns", "Custom_Kind", "x"))
    assert odd.startswith("custom-kind-x-") and odd == odd.lower()


def test_recommendation_round_trips_and_rejects_duplicates() -> None:
    obj = {"apiVersion": "gpupack.io/v1alpha1", "kind": "GPURecommendation",
           "metadata": {"name": "deployment-web", "namespace": "serve"},
           "spec": {"targetRef": {"kind": "Deployment", "name": "web"}},
           "status": {"source": "Agents", "mode": "Off",
                      "containers": [{"containerName": "main", "gpuMilli": 150, "gpuMemory": "23Gi",
                                      "observedSeconds": 7200, "confidenceDays": 0.08}]}}
    rec = GPURecommendation.model_validate(obj)
    assert rec.status is not None and rec.status.containers[0].gpu_memory_bytes == 23 * 1024**3
    assert to_wire(rec)["status"]["containers"][0]["gpuMilli"] == 150
    obj["status"]["containers"].append(dict(obj["status"]["containers"][0]))
    with pytest.raises(ValidationError, match="duplicate"):
        GPURecommendation.model_validate(obj)


def test_right_sizing_is_off_unless_a_policy_says_otherwise() -> None:
    assert SharingPolicySpec().right_sizing is None
    spec = SharingPolicySpec.model_validate({"rightSizing": {"mode": "Recreate", "computeOvercommit": 1.5}})
    assert spec.right_sizing is not None and spec.right_sizing.max_evictions_per_hour == 1
    with pytest.raises(ValidationError):
        SharingPolicySpec.model_validate({"rightSizing": {"mode": "Auto"}})


def test_right_sizing_mode_label_wins_then_the_most_cautious_policy() -> None:
    from sharing.rules.right_sizing import right_sizing_for

    recreate = SharingPolicySpec.model_validate({"rightSizing": {"mode": "Recreate", "computeOvercommit": 1.5}})
    initial_for_a = SharingPolicySpec.model_validate({
        "rightSizing": {"mode": "Initial", "computeOvercommit": 2.0, "maxEvictionsPerHour": 3},
        "namespaces": [{"names": ["a"], "allowedModes": ["mps"]}]})
    silent = SharingPolicySpec()
    assert right_sizing_for([("s", silent)], "a", {}).mode == "Off"
    assert right_sizing_for([("r", recreate)], "b", {}).mode == "Recreate"
    both = right_sizing_for([("r", recreate), ("i", initial_for_a)], "a", {})
    assert (both.mode, both.compute_overcommit, both.max_evictions_per_hour) == ("Initial", 1.5, 1)
    assert right_sizing_for([("r", recreate), ("i", initial_for_a)], "b", {}).mode == "Recreate"
    opted_in = right_sizing_for([("s", silent)], "a", {"gpupack.io/right-sizing": "Recreate"})
    assert (opted_in.mode, opted_in.source, opted_in.evicts) == ("Recreate", "namespace label", True)
    opted_out = right_sizing_for([("r", recreate)], "b", {"gpupack.io/right-sizing": "Off"})
    assert opted_out.mode == "Off" and not opted_out.sizes_new_pods
    odd = right_sizing_for([("r", recreate)], "b", {"gpupack.io/right-sizing": "yes"})
    assert odd.mode == "Recreate" and odd.ignored_label is not None and "yes" in odd.ignored_label
