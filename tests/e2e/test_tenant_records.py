"""A tenant's hand-written gpupack marks on the real control plane, with the tenant's own token
(issue 33, items 3 and 8).

* A pod created with a ``gpupack.io/allocation`` that matches its own requests used to pass as the
  webhook's reinvocation whatever the namespace's SharingPolicy said: a ``"mode":"mig"`` record in an
  mps-only namespace, a ``7g.80gb`` record where ``allowedProfiles`` does not list it. The webhook
  now refuses a record the policy in force could not have produced (``ForgedAllocation``).
* A pod could be created with any ``gpupack.io/*`` annotation or label, and it was stored. The
  ValidatingAdmissionPolicy ``gpupack-pod-create-marks`` lets through only the ones a user may set.

The webhook, its namespaces and the ``tenant`` ServiceAccount (every pod verb in its namespace, nothing
else) are ``tests/e2e/test_webhook_e2e.py``'s fixtures.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from sharing.api.allocation import Allocation, ContainerAllocation
from tests.e2e.test_webhook_e2e import (  # noqa: F401 (fixtures)
    GROUP, PREFIX, SELECT_LABEL, VERSION, _refused, _wait, gpu_namespace, tenant, webhook,
)
from gpupack.testing.admission_reviews import gpu_container, make_pod

H100 = "NVIDIA-H100-80GB-HBM3"


@contextmanager
def sharing_policy(admin_client: Any, name: str, spec: dict[str, Any]) -> Iterator[None]:
    """A SharingPolicy that selects no real node (no controller acts on it) for the duration."""
    custom = client.CustomObjectsApi(admin_client)
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "SharingPolicy", "metadata": {"name": PREFIX + name},
            "spec": {"nodeSelector": {"matchLabels": {SELECT_LABEL: "none"}}, **spec}}
    custom.create_cluster_custom_object(GROUP, VERSION, "sharingpolicies", body)
    try:
        yield
    finally:
        custom.delete_cluster_custom_object(GROUP, VERSION, "sharingpolicies", PREFIX + name)


def hand_written(namespace: str, name: str, profile: str) -> dict[str, Any]:
    """A pod as the webhook would have left a mig pod: the record, the gate, the limits the record names."""
    resource = f"nvidia.com/mig-{profile}"
    record = Allocation(mode="mig", gated=True, capacity_existed=False, policy="p", reason="r", gpu_model=H100,
                        containers=(ContainerAllocation("main", "containers", 100, None, resource, profile),))
    pod = make_pod({"name": "main", "image": "example.com/app:1", "resources": {"limits": {resource: "1"}}},
                   name=name, namespace=namespace, annotations={"gpupack.io/allocation": record.to_annotation()})
    pod["spec"]["schedulingGates"] = [{"name": "gpupack.io/capacity"}]
    return pod


def _sees(core: Any, namespace: str, pod: dict[str, Any], word: str) -> Callable[[], bool]:
    """Whether a dry-run create of ``pod`` is refused with ``word`` in the answer (policies arrive asynchronously)."""
    def check() -> bool:
        try:
            core.create_namespaced_pod(namespace, copy.deepcopy(pod), dry_run="All")
        except ApiException as exc:
            return word in str(exc.body)
        return False
    return check


def test_a_hand_written_mig_record_in_an_mps_only_namespace_is_refused(
    tenant: Any, admin_client: Any, gpu_namespace: str
) -> None:
    core = client.CoreV1Api(tenant)
    with sharing_policy(admin_client, f"mps-{gpu_namespace}",
                        {"namespaces": [{"names": [gpu_namespace], "allowedModes": ["mps"]}]}):
        mig = make_pod(gpu_container("main", "100"), name="asks-mig", namespace=gpu_namespace, mode="mig")
        _wait("the webhook to see the mps-only policy", _sees(core, gpu_namespace, mig, "forbidden"))
        refusal = _refused(lambda: core.create_namespaced_pod(gpu_namespace, hand_written(gpu_namespace, "forged",
                                                                                          "1g.10gb")))
        message = json.loads(str(refusal.body))["message"]
        assert refusal.status == 403 and "ForgedAllocation" in str(refusal.body)
        assert "mode 'mig' is not allowed in the namespace (allowed modes: mps)" in message
        # The tenant's honest request is still admitted, in the mode its namespace may use.
        honest = core.create_namespaced_pod(gpu_namespace, make_pod(gpu_container("main", "100"), name="honest",
                                                                    namespace=gpu_namespace))
        assert json.loads(honest.metadata.annotations["gpupack.io/allocation"])["mode"] == "mps"


def test_a_hand_written_record_naming_a_profile_the_policy_forbids_is_refused(
    tenant: Any, admin_client: Any, gpu_namespace: str
) -> None:
    core = client.CoreV1Api(tenant)
    small = ["1g.10gb", "2g.20gb", "3g.40gb"]
    with sharing_policy(admin_client, f"small-{gpu_namespace}",
                        {"namespaces": [{"names": [gpu_namespace], "allowedModes": ["mig"]}], "allowedProfiles": small}):
        whole = make_pod(gpu_container("main", "1000"), name="asks-7g", namespace=gpu_namespace, mode="mig")
        _wait("the webhook to see allowedProfiles", _sees(core, gpu_namespace, whole, "allowed by the policy"))
        refusal = _refused(lambda: core.create_namespaced_pod(gpu_namespace, hand_written(gpu_namespace, "forged-7g",
                                                                                          "7g.80gb")))
        assert refusal.status == 403 and "ForgedAllocation" in str(refusal.body)
        assert "MIG profile '7g.80gb' is not allowed" in json.loads(str(refusal.body))["message"]
        honest = core.create_namespaced_pod(gpu_namespace, make_pod(gpu_container("main", "100"), name="honest-mig",
                                                                    namespace=gpu_namespace))
        assert honest.spec.containers[0].resources.limits == {"nvidia.com/mig-1g.10gb": "1"}


@pytest.mark.parametrize(("marks", "refused_key"), [
    ({"annotations": {"gpupack.io/foo": "1"}}, "not gpupack.io/foo"),
    ({"labels": {"gpupack.io/pool": "a"}}, "labels a pod may be created with are gpupack.io/skip, gpupack.io/backend and gpupack.io/replay"),
    ({"labels": {"gpupack.io/skip": "true"}, "annotations": {"gpupack.io/allocation": "{}"}},
     "is never seen by gpupack's webhook"),
])
def test_a_pod_is_created_only_with_the_gpupack_keys_a_user_may_set(
    tenant: Any, gpu_namespace: str, marks: dict[str, dict[str, str]], refused_key: str
) -> None:
    core = client.CoreV1Api(tenant)
    pod = make_pod({"name": "main", "image": "example.com/app:1"}, name="marked", namespace=gpu_namespace,
                   labels=marks.get("labels"), annotations=marks.get("annotations"))
    _wait("the create-marks ValidatingAdmissionPolicy to be enforced", _sees(core, gpu_namespace, pod, refused_key))
    refusal = _refused(lambda: core.create_namespaced_pod(gpu_namespace, pod))
    assert refusal.status in (403, 422) and refused_key in str(refusal.body)
    assert not core.list_namespaced_pod(gpu_namespace, field_selector="metadata.name=marked").items
    # What a user may set is stored: the mode asked for, skip (without gpupack's marks) and the pool label.
    plain = make_pod({"name": "main", "image": "example.com/app:1"}, name="allowed", namespace=gpu_namespace,
                     labels={"gpupack.io/skip": "true", "gpupack.io/backend": "device-plugin"},
                     annotations={"gpupack.io/sharing": "mps"})
    stored = core.create_namespaced_pod(gpu_namespace, plain)
    assert stored.metadata.annotations == {"gpupack.io/sharing": "mps"}
