"""Reading a ResourceClaim's allocation (node.draplugin.claims, file_claims): the API's JSON as typed
values, and a clear per-claim error for every way it can be wrong."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from node.draplugin.claims import ClaimError, ClaimRef, allocation_from_claim
from sharing.dra.results import AllocatedDevice
from node.draplugin.file_claims import FileClaimSource

REF = ClaimRef("uid-1", "ml", "train")


def claim(*results: dict[str, Any], uid: str = "uid-1", name: str = "train") -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "ml", "uid": uid},
            "status": {"allocation": {"devices": {"results": list(results)}}}}


MIG = {"request": "gpu", "driver": "gpu.gpupack.io", "pool": "node-a", "device": "gpu-0-mig-1g-10gb-6"}
SHARE = {"request": "s", "driver": "gpu.gpupack.io", "pool": "node-a", "device": "gpu-1-shared", "shareID": "abc",
         "consumedCapacity": {"gpu.gpupack.io/milli": "300", "gpu.gpupack.io/memory": "20Gi"}}


def test_results_become_typed_devices_with_quantities_as_integers() -> None:
    other = {"request": "nic", "driver": "net.example.com", "pool": "p", "device": "eth1", "adminAccess": True}
    assert allocation_from_claim(claim(MIG, SHARE, other), REF) == (
        AllocatedDevice("gpu", "gpu.gpupack.io", "node-a", "gpu-0-mig-1g-10gb-6"),
        AllocatedDevice("s", "gpu.gpupack.io", "node-a", "gpu-1-shared", "abc",
                        {"gpu.gpupack.io/milli": 300, "gpu.gpupack.io/memory": 20 * 2**30}),
        AllocatedDevice("nic", "net.example.com", "p", "eth1", admin_access=True),
    )


def test_the_api_servers_canonical_quantities_read_the_same() -> None:
    share = {**SHARE, "consumedCapacity": {"gpu.gpupack.io/milli": "1k", "gpu.gpupack.io/memory": "21474836480"}}
    (device,) = allocation_from_claim(claim(share), REF)
    assert device.consumed == {"gpu.gpupack.io/milli": 1000, "gpu.gpupack.io/memory": 20 * 2**30}


DELETE = object()


def with_result(**changes: Any) -> dict[str, Any]:
    """A claim whose one result is SHARE with ``changes`` (DELETE removes a field)."""
    result = copy.deepcopy(SHARE)
    for key, value in changes.items():
        if value is DELETE:
            del result[key]
        else:
            result[key] = value
    return claim(result)


def with_milli(text: str) -> dict[str, Any]:
    return with_result(consumedCapacity={"gpu.gpupack.io/milli": text, "gpu.gpupack.io/memory": "1Gi"})


def with_status(status: Any) -> dict[str, Any]:
    return {**claim(), "status": status}


@pytest.mark.parametrize(("obj", "message"), [
    (claim(MIG, uid="uid-2"), "has UID 'uid-2'; it was deleted and recreated"),
    ({"metadata": {"uid": "uid-1"}}, "is not allocated"),
    (with_status({"allocation": None}), "is not allocated"),
    (with_status({"allocation": {}}), "results is missing or not a list"),
    (with_status({"allocation": {"devices": {"results": {"a": 1}}}}), "results is missing or not a list"),
    (with_status({"allocation": {"devices": {"results": ["gpu-0"]}}}), r"results\[0\] is not an object"),
    (with_result(device=DELETE), r"results\[0\]\.device is missing"),
    (with_result(driver=7), r"results\[0\]\.driver is missing or not a string"),
    (with_result(pool=""), r"results\[0\]\.pool is missing or not a string"),
    (with_result(shareID=5), "shareID is not a string"),
    (with_result(consumedCapacity=["300"]), "consumedCapacity is not an object"),
    (with_milli("lots"), r"consumedCapacity\[gpu.gpupack.io/milli\]: 'lots' is not"),
    (with_milli("250m"), "is not a whole, non-negative amount"),
    (with_milli("-1"), "is not a whole, non-negative amount"),
    ("a string", "not a ResourceClaim object"),
], ids=["recreated", "no-status", "no-allocation", "no-devices", "results-not-list", "result-not-object",
        "no-device", "driver-not-string", "empty-pool", "share-id-not-string", "capacity-not-object",
        "capacity-not-quantity", "capacity-fraction", "capacity-negative", "not-an-object"])
def test_every_broken_claim_gets_a_clear_error(obj: Any, message: str) -> None:
    with pytest.raises(ClaimError, match=message):
        allocation_from_claim(obj, REF)


def test_a_file_source_reads_lists_kind_list_and_single_objects(tmp_path: Path) -> None:
    path = tmp_path / "claims.yaml"
    source = FileClaimSource(path)
    path.write_text(yaml.safe_dump([claim(MIG, name="other", uid="uid-9"), claim(MIG)]))
    assert source.get(REF)[0].device == "gpu-0-mig-1g-10gb-6"
    path.write_text(json.dumps({"kind": "List", "items": [claim(SHARE)]}))
    assert source.get(REF)[0].share_id == "abc"
    path.write_text(json.dumps(claim(MIG)))
    assert len(source.get(REF)) == 1
    with pytest.raises(ClaimError, match="does not exist"):
        source.get(ClaimRef("uid-1", "ml", "missing"))
    path.write_text(":\n  - [")
    with pytest.raises(ClaimError, match="cannot read the claims file"):
        source.get(REF)
    path.unlink()
    with pytest.raises(ClaimError, match="cannot read the claims file"):
        source.get(REF)
