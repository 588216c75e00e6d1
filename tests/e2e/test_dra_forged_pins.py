"""A tenant's ResourceClaim cannot stop placement on a DRA pool (issue 33, item 1), on the real
control plane.

The attack: a tenant (a namespaced ServiceAccount bound to the built-in ``edit`` ClusterRole, plus the
ResourceClaim verbs a DRA user needs) creates a ResourceClaim on a DeviceClass that is not gpupack's
(gpupack's webhook never sees it) carrying ``gpupack.io/dra-pinned``, a pin of every GPU of a node.
The controller counted every unallocated claim's pin as a promise, so every new DRA pod waited.

* The API server refuses it: ValidatingAdmissionPolicy ``gpupack-claim-marks``
  (``manifests/rbac/claim-marks-policy.yaml``, installed with gpupack's RBAC) lets only the
  controller's ServiceAccount (and ``system:masters``) set or change ``gpupack.io/*`` annotations on a
  claim of any class; the tenant's token gets 403/422.
* Without the policy, or with such a claim written by an administrator, the controller ignores the pin
  (``controller.state.dra_usage.pin_untrusted``): on a pool whose every GPU is "pinned" by such claims, a new
  DRA pod is released and kube-scheduler allocates it the engine's device.
* A gated DRA pod the engine cannot place carries the ``gpupack.io/Placement`` condition (item 8).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from sharing.api.backend import pod_claim_name
from sharing.dra import names
from sharing.dra.pinned import ANNOTATION, Pinned, PinnedDevice
from sharing.api.keys import DRA_REQUEUES_ANNOTATION, PLACEMENT_CONDITION
from tests.e2e.tenants import tenant_client
from tests.e2e.test_dra_placement import GPUS, Pool, admin, plane, pool  # noqa: F401 (fixtures)
from tests.e2e.waiting import wait_for
from tests.unit.test_controller_dra import dra_allocation, dra_pod

GROUP, VERSION, PLURAL = "resource.k8s.io", "v1", "resourceclaims"
REFUSED = "written by gpupack's controller only"


def claim(name: str, pin: Pinned | None = None, device_class: str = "tenant-class") -> dict[str, Any]:
    """A claim on ``device_class``, carrying ``pin`` as gpupack's pinned annotation."""
    meta: dict[str, Any] = {"name": name}
    if pin is not None:
        meta["annotations"] = {ANNOTATION: pin.to_annotation()}
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ResourceClaim", "metadata": meta,
            "spec": {"devices": {"requests": [{"name": "a", "exactly": {"deviceClassName": device_class}}]}}}


def every_gpu(node: str) -> Pinned:
    return Pinned(node, tuple(PinnedDevice("a", "gpu", i) for i in range(GPUS)))


@pytest.fixture
def tenant(admin_client: Any, namespace: str, sa_kubeconfig: Callable[..., Path]) -> Iterator[Any]:
    """An ApiClient acting as ServiceAccount ``tenant`` of ``namespace`` with the built-in ``edit`` rights there,
    plus every ResourceClaim verb (``edit`` of Kubernetes v1.37 grants none: a cluster using DRA grants them
    to the teams that claim devices)."""
    api = tenant_client(admin_client, namespace, sa_kubeconfig, "claims", [
        {"apiGroups": [GROUP], "resources": [PLURAL], "verbs": ["create", "get", "list", "watch", "update", "patch", "delete"]}],
        edit=True)
    yield api
    api.close()


def test_only_the_controller_writes_gpupack_annotations_on_a_claim(
    tenant: Any, admin_client: Any, namespace: str, sa_client: Callable[[str], Any]
) -> None:
    claims = client.CustomObjectsApi(tenant)
    forged = claim("forged", every_gpu("a100-a"))

    answers: list[str] = []

    def refused() -> bool:
        try:
            claims.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, forged, dry_run="All")
        except ApiException as exc:
            answers[:] = [f"{exc.status}: {exc.body}"]
            return exc.status in (403, 422) and REFUSED in str(exc.body)
        answers[:] = ["created"]
        return False

    # The policy is enforced once the API server's policy cache has it (asynchronous).
    try:
        wait_for("the gpupack-claim-marks ValidatingAdmissionPolicy to be enforced", refused, 60.0, interval_s=0.25)
    except pytest.fail.Exception:
        pytest.fail(f"the tenant's forged claim was not refused by the policy; the API server answered {answers}")
    with pytest.raises(ApiException) as caught:
        claims.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, forged)
    assert caught.value.status in (403, 422) and ANNOTATION in str(caught.value.body)
    # The tenant's own claims are the tenant's: created, relabelled, annotated with its own keys...
    claims.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, claim("mine"))
    claims.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "mine",
                                          {"metadata": {"labels": {"team": "vision"},
                                                        "annotations": {"example.com/note": "x"}}})
    # ...but no gpupack.io/* annotation is added to one later, on any class.
    for key, value in ((ANNOTATION, every_gpu("a100-a").to_annotation()), (DRA_REQUEUES_ANNOTATION, "9"),
                       ("gpupack.io/anything", "x")):
        with pytest.raises(ApiException) as caught:
            claims.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "mine",
                                                  {"metadata": {"annotations": {key: value}}})
        assert caught.value.status in (403, 422) and REFUSED in str(caught.value.body), key
    assert "gpupack.io/anything" not in (client.CustomObjectsApi(admin_client).get_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "mine")["metadata"].get("annotations") or {})
    # gpupack's controller writes its pin (on gpupack's class), and an administrator may repair by hand.
    client.CustomObjectsApi(sa_client("gpupack-controller")).create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, claim("controllers", every_gpu("a100-a"), names.GPU_CLASS))
    client.CustomObjectsApi(admin_client).create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, claim("admins", every_gpu("a100-a")))


def test_forged_pins_on_every_gpu_do_not_stop_placement(pool: Pool) -> None:
    """No policy on this plane (gpupack's RBAC is not installed): the controller's own rule holds."""
    for node in pool.nodes:
        pool.dra.claims.create(namespace=pool.namespace, body=claim(f"forged-{node}", every_gpu(node)))
    pool.pod("p", 300)
    report = pool.controller.cycle()
    assert report.errors == [] and report.released == [f"{pool.namespace}/p"], report
    node, device, milli = pool.allocated("p")
    assert node in pool.nodes and device.endswith("-shared") and milli == 300


def test_a_gated_dra_pod_carries_the_placement_reason(pool: Pool) -> None:
    """A whole-GPU pod on a pool that shares every GPU by MPS: nothing places it, and it says so."""
    allocation = dra_allocation("whole", pod_claim_name(str(uuid.uuid4())), milli=(1000,))
    pool.core.create_namespaced_pod(pool.namespace, dra_pod("whole", pool.namespace, allocation))
    report = pool.controller.cycle()
    assert report.errors == [] and report.released == [], report
    conditions = [c for c in pool.read("whole").status.conditions or [] if c.type == PLACEMENT_CONDITION]
    assert [(c.status, bool(c.message)) for c in conditions] == [("False", True)], conditions
    assert conditions[0].reason in ("NoCapacity", "WaitingForCapacity")
    assert pool.gated("whole")
