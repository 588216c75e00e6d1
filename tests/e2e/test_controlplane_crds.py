"""gpupack's CRDs on a real kube-apiserver: strict schemas, status subresource, printer columns."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from sharing.api import crd
from tests.e2e.tables import table_row
from tests.unit.test_crd_cases import CASES, SPEC_MODELS, Case

PLURALS = {"GPUNode": "gpunodes", "SharingPolicy": "sharingpolicies"}


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


Create = Callable[[dict[str, Any]], dict[str, Any]]


@pytest.fixture
def create(admin_client: Any, gpupack_installed: list[dict[str, Any]]) -> Iterator[Create]:
    """Create custom objects; delete them after the test, so the shared control
    plane's inventory (which other components' tests read) is left as found."""
    objects = client.CustomObjectsApi(admin_client)
    made: list[tuple[str, str]] = []

    def make(body: dict[str, Any]) -> dict[str, Any]:
        # Strict: unknown fields are rejected, as `kubectl apply` does by default.
        created: dict[str, Any] = objects.create_cluster_custom_object(
            crd.GROUP, crd.VERSION, PLURALS[body["kind"]], body, field_validation="Strict")
        made.append((PLURALS[body["kind"]], body["metadata"]["name"]))
        return created

    yield make
    for plural, name in made:
        objects.delete_cluster_custom_object(crd.GROUP, crd.VERSION, plural, name)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_api_server_agrees_with_models(create: Create, case: Case) -> None:
    body = case.body(_name(case.id[:40]))
    if case.valid:
        stored = create(body)
        # What the server stored (with its defaults) is a valid model again.
        model = SPEC_MODELS[case.kind].model_validate(stored["spec"])
        assert model == SPEC_MODELS[case.kind].model_validate(case.spec)
    else:
        with pytest.raises(ApiException) as info:
            create(body)
        # 422 Invalid for schema/CEL violations, 400 for strict decoding (unknown fields).
        assert info.value.status in (400, 422), info.value.body
        message = json.loads(info.value.body)["message"]
        assert case.server_says in message, message


def _condition(type_: str, status: str) -> crd.Condition:
    return crd.Condition(type=type_, status=status, reason="Observed", message="from the test",
                         last_transition_time=datetime.now(timezone.utc).replace(microsecond=0))


def _status(product: str, mig_instances: int, in_use: int) -> crd.GPUNodeStatus:
    instances = [crd.MigInstanceStatus(profile="1g.10gb", start=i, size=1, in_use=i < in_use,
                                       pods=[f"team-a/pod-{i}"] if i < in_use else [])
                 for i in range(mig_instances)]
    return crd.GPUNodeStatus(
        observed_generation=1,
        product=product,
        gpus=[crd.GPUStatus(index=0, uuid="GPU-1234", product=product, memory_mib=81920,
                            mig_enabled=True, instances=instances,
                            utilization=crd.GPUUtilization(gpu_percent=37, memory_used_mib=1024))],
        sharing=crd.SharingStatus(),
        summary=crd.NodeSummary(gpus=1, mig_instances=mig_instances, instances_in_use=in_use),
        conditions=[_condition("Ready", "True")],
        reconfiguration=crd.ReconfigurationStatus.model_validate(
            {"phase": "Applying", "step": 2, "plan": [{"op": "create", "instance": "1g.10gb@0:1"}]}),
    )


def test_status_is_a_subresource_and_round_trips(admin_client: Any, create: Create) -> None:
    objects = client.CustomObjectsApi(admin_client)
    name = _name("status")
    status = _status("NVIDIA-A100-SXM4-80GB", mig_instances=3, in_use=1)
    body = crd.to_wire(crd.GPUNode(metadata=crd.ObjectMeta(name=name), status=status))
    created = create(body)
    assert "status" not in created, "status must be ignored on create (status subresource)"

    objects.patch_cluster_custom_object_status(
        crd.GROUP, crd.VERSION, "gpunodes", name, {"status": crd.to_wire(status)})
    stored = objects.get_cluster_custom_object(crd.GROUP, crd.VERSION, "gpunodes", name)
    assert crd.GPUNodeStatus.model_validate(stored["status"]) == status
    # No field keeps unknown fields (issue 33, item 2): an extension the agent adds is pruned.
    objects.patch_cluster_custom_object_status(
        crd.GROUP, crd.VERSION, "gpunodes", name, {"status": {"reconfiguration": {"agentNote": {"a": [1]}}}})
    stored = objects.get_cluster_custom_object(crd.GROUP, crd.VERSION, "gpunodes", name)
    assert "agentNote" not in stored["status"]["reconfiguration"]
    assert crd.GPUNodeStatus.model_validate(stored["status"]) == status
    assert stored["metadata"]["generation"] == created["metadata"]["generation"]

    objects.patch_cluster_custom_object(
        crd.GROUP, crd.VERSION, "gpunodes", name,
        {"spec": {"sharing": {"mode": "time-slicing", "replicas": 4}}})
    after = objects.get_cluster_custom_object(crd.GROUP, crd.VERSION, "gpunodes", name)
    assert after["metadata"]["generation"] == created["metadata"]["generation"] + 1
    assert after["status"] == stored["status"]


def test_invalid_status_is_rejected(admin_client: Any, create: Create) -> None:
    name = _name("badstatus")
    create(crd.to_wire(crd.GPUNode(metadata=crd.ObjectMeta(name=name))))
    bad = {"status": {"gpus": [{"index": 0, "uuid": "GPU-1", "product": "x", "memoryMiB": -5}]}}
    with pytest.raises(ApiException) as info:
        client.CustomObjectsApi(admin_client).patch_cluster_custom_object_status(
            crd.GROUP, crd.VERSION, "gpunodes", name, bad)
    assert info.value.status == 422
    assert "status.gpus[0].memoryMiB" in json.loads(info.value.body)["message"]


def test_printer_columns_show_status(admin_client: Any, create: Create) -> None:
    objects = client.CustomObjectsApi(admin_client)
    name = _name("table")
    status = _status("NVIDIA-H100-80GB-HBM3", mig_instances=4, in_use=2)
    spec = crd.GPUNodeSpec(sharing=crd.SharingConfig(mode="mps", replicas=8))
    create(crd.to_wire(crd.GPUNode(metadata=crd.ObjectMeta(name=name), spec=spec)))
    objects.patch_cluster_custom_object_status(
        crd.GROUP, crd.VERSION, "gpunodes", name, {"status": crd.to_wire(status)})

    # What `kubectl get gpunodes` asks for: the server renders the printer columns.
    row = table_row(admin_client, f"/apis/{crd.GROUP}/{crd.VERSION}/gpunodes/{name}")
    assert row["Name"] == name
    assert row["Product"] == status.product
    assert (row["GPUs"], row["MIG"], row["In-Use"]) == (1, 4, 2)
    assert (row["Sharing"], row["Replicas"]) == ("mps", 8)
    assert row["Ready"] == "True"
    assert row["Reconfig"] == "Applying"
