"""``/validate`` on ResourceClaims and ResourceClaimTemplates naming gpupack's DeviceClasses:
checked against the DRA pool's GPUs, every problem listed with its reason code."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from starlette.testclient import TestClient

from sharing.admission.inventory import Inventory, build_inventory
from webhook.admission import validate
from webhook.app import build_app
from webhook.inventory_source import InventoryHolder
from webhook.settings import WebhookSettings
from gpupack.testing.admission_reviews import make_review

SETTINGS = WebhookSettings()
A30, H100 = "NVIDIA-A30", "NVIDIA-H100-80GB-HBM3"


def gpunode(name: str, product: str, memory_mib: int) -> dict[str, Any]:
    return {"kind": "GPUNode", "metadata": {"name": name},
            "status": {"product": product, "gpus": [{"index": 0, "uuid": "GPU-0", "product": product,
                                                      "memoryMiB": memory_mib, "migEnabled": True}]}}


# The DRA pool holds A30s (24 GiB; 1g.6gb...4g.24gb); the device plugin's pool an H100.
CLUSTER = build_inventory([gpunode("dra-a30", A30, 24576), gpunode("dp-h100", H100, 81559),
                           {"kind": "Node", "metadata": {"name": "dra-a30", "labels": {"gpupack.io/backend": "dra"}}}])


def request(name: str = "gpu", cls: str = "gpupack-shared", **exact: Any) -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": cls, **exact}}


def claim(*requests: dict[str, Any], kind: str = "ResourceClaim") -> dict[str, Any]:
    spec = {"devices": {"requests": list(requests)}}
    return {"apiVersion": "resource.k8s.io/v1", "kind": kind, "metadata": {"name": "c1", "namespace": "ml"},
            "spec": {"spec": spec} if kind == "ResourceClaimTemplate" else spec}


def shares(milli: str, memory: str | None = None) -> dict[str, Any]:
    asks = {"gpu.gpupack.io/milli": milli, **({"gpu.gpupack.io/memory": memory} if memory else {})}
    return {"capacity": {"requests": asks}}


def review(obj: Any, operation: str = "CREATE", old: Any = None, kind: str = "ResourceClaim") -> dict[str, Any]:
    out = make_review(obj, kind=kind, group="resource.k8s.io", version="v1", namespace="ml", operation=operation)
    out["request"]["oldObject"] = old
    return out


def answer(obj: Any, inventory: Inventory = CLUSTER, **kw: Any) -> dict[str, Any]:
    kind = obj.get("kind", "ResourceClaim") if isinstance(obj, dict) else "ResourceClaim"
    return dict(validate(review(obj, kind=kind, **kw), inventory, SETTINGS)["response"])


def reasons(out: dict[str, Any]) -> list[str]:
    assert not out["allowed"]
    return [c["reason"] for c in out["status"]["details"]["causes"]]


@pytest.mark.parametrize("kind", ["ResourceClaim", "ResourceClaimTemplate"])
def test_a_share_above_a_whole_gpu_is_denied_with_its_reason(kind: str) -> None:
    out = answer(claim(request(**shares("2000")), kind=kind))
    assert reasons(out) == ["MilliOutOfRange"]
    message = out["status"]["message"]
    assert message.startswith(f"{kind} 'ml/c1' cannot be served by gpupack's devices: [MilliOutOfRange]")
    assert "gpu.gpupack.io/milli='2000' is outside 1..1000" in message


def test_every_problem_is_listed_with_its_reason() -> None:
    bad = claim(request("a", **shares("0.5")), request("b", count=2, **shares("100")),
                request("c", cls="gpupack-mig", selectors=[{"cel": {"expression":
                    'device.attributes["gpu.gpupack.io"].profile == "1g.10gb"'}}]))
    out = answer(bad)
    assert reasons(out) == ["MilliOutOfRange", "SharedCount", "UnknownProfile"]
    for fragment in ("[MilliOutOfRange] request 'a'", "[SharedCount] request 'b'", "[UnknownProfile] request 'c'"):
        assert fragment in out["status"]["message"]


def test_bounds_are_the_dra_pools_gpus() -> None:
    # 40 GiB fits the device plugin's H100, not the DRA pool's A30: denied; 1g.6gb is an A30 profile.
    assert reasons(answer(claim(request(**shares("100", "40Gi"))))) == ["MemoryTooLarge"]
    ok = claim(request(cls="gpupack-mig", selectors=[{"cel": {"expression":
               'device.attributes["gpu.gpupack.io"].profile == "1g.6gb"'}}]))
    assert answer(ok)["allowed"]


def test_without_dra_nodes_memory_is_unbounded_and_any_catalog_profile_is_known() -> None:
    no_pool = build_inventory([gpunode("dp-h100", H100, 81559)])
    assert answer(claim(request(**shares("100", "200Gi"))), no_pool)["allowed"]
    h100_profile = claim(request(cls="gpupack-mig", selectors=[{"cel": {"expression":
                         'device.attributes["gpu.gpupack.io"].profile == "1g.10gb"'}}]))
    assert answer(h100_profile, no_pool)["allowed"]
    assert reasons(answer(claim(request(**shares("1001"))), no_pool)) == ["MilliOutOfRange"]


def test_claims_naming_no_gpupack_class_pass_untouched() -> None:
    other = claim(request(cls="gpu.nvidia.com", **shares("5000")))
    out = answer(other)
    assert out["allowed"] and "names no gpupack DeviceClass" in out["status"]["message"]
    assert answer(other, Inventory(synced=False))["allowed"]  # not ours: not even the sync matters


def test_a_valid_claim_is_allowed() -> None:
    assert answer(claim(request(**shares("300", "20Gi"))))["allowed"]


def test_an_update_that_keeps_the_spec_is_allowed_even_if_the_pool_changed() -> None:
    stored = claim(request(**shares("100", "20Gi")))  # valid when the pool had larger GPUs
    updated = copy.deepcopy(stored)
    updated["metadata"]["finalizers"] = ["resource.kubernetes.io/delete-protection"]
    assert answer(updated, operation="UPDATE", old=stored)["allowed"]
    changed = copy.deepcopy(stored)
    changed["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"]["gpu.gpupack.io/memory"] = "40Gi"
    assert reasons(answer(changed, operation="UPDATE", old=stored)) == ["MemoryTooLarge"]


def test_a_status_write_and_a_delete_are_not_checked() -> None:
    bad = claim(request(**shares("2000")))
    status = review(bad, operation="UPDATE", old=bad)
    status["request"]["subResource"] = "status"
    assert validate(status, CLUSTER, SETTINGS)["response"]["allowed"]
    assert answer(bad, operation="DELETE")["allowed"]


def test_an_unsynced_inventory_denies_gpupack_claims() -> None:
    out = answer(claim(request(**shares("300"))), Inventory(synced=False))
    assert reasons(out) == ["InventoryNotSynced"]


@pytest.mark.parametrize("obj", [
    None, [1, 2], "claim",
], ids=["null", "list", "string"])
def test_an_object_that_is_no_claim_is_denied_clearly(obj: Any) -> None:
    out = validate(review(obj), CLUSTER, SETTINGS)["response"]
    assert not out["allowed"] and out["status"]["code"] == 400
    assert out["status"]["message"] == "request.object is not a ResourceClaim object"


@pytest.mark.parametrize("spec", [
    {"devices": {"requests": {"a": 1}}},
    {"devices": {"requests": [{"name": ["x"], "exactly": {"deviceClassName": ["gpupack-shared"]}}]}},
    {"devices": {"requests": [{"name": "x", "firstAvailable": 7}]}},
    {"devices": {"requests": [{"name": "x", "firstAvailable": [{"name": "y", "deviceClassName": "gpupack-shared",
                                                                 "capacity": {"requests": {"gpu.gpupack.io/milli": []}}}]}]}},
    {"devices": {"requests": [request(selectors="x", capacity={"requests": {5: "1"}})]}},
    {"devices": {"requests": [request(selectors=[{"cel": {"expression": 5}}], count="two")]}},
], ids=["requests-map", "class-list", "alternatives-int", "milli-list", "odd-selectors-and-keys", "odd-cel-count"])
def test_malformed_specs_get_an_answer_never_an_error(spec: Any) -> None:
    obj = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "x"}, "spec": spec}
    out = validate(review(obj), CLUSTER, SETTINGS)["response"]
    assert out["status"].get("reason") != "InternalError" and "internal error" not in out["status"]["message"]


def test_the_odd_values_that_are_gpupack_requests_are_denied_with_reasons() -> None:
    milli_list = {"devices": {"requests": [{"name": "x", "firstAvailable": [
        {"name": "y", "deviceClassName": "gpupack-shared", "capacity": {"requests": {"gpu.gpupack.io/milli": []}}}]}]}}
    obj = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "x"}, "spec": milli_list}
    assert reasons(answer(obj)) == ["InvalidQuantity"]


def test_policies_still_go_through_validate() -> None:
    policy = {"apiVersion": "gpupack.io/v1alpha1", "kind": "SharingPolicy", "metadata": {"name": "p"},
              "spec": {"allowedProfiles": ["5g.99gb"]}}
    out = validate(make_review(policy, kind="SharingPolicy", group="gpupack.io", version="v1alpha1"), CLUSTER, SETTINGS)
    assert not out["response"]["allowed"] and "5g.99gb" in out["response"]["status"]["message"]


def test_the_app_validates_claims_against_the_holders_current_inventory() -> None:
    holder = InventoryHolder(CLUSTER)
    app = build_app(holder, SETTINGS)
    with TestClient(app) as http:
        out = http.post("/validate", json=review(claim(request(**shares("100", "40Gi"))))).json()["response"]
        assert not out["allowed"] and "[MemoryTooLarge]" in out["status"]["message"]
        holder.replace([gpunode("dra-h100", H100, 81559),
                        {"kind": "Node", "metadata": {"name": "dra-h100", "labels": {"gpupack.io/backend": "dra"}}}],
                       synced=True)
        out = http.post("/validate", json=review(claim(request(**shares("100", "40Gi"))))).json()["response"]
        assert out["allowed"]
