"""The gpupack.io/allocation annotation: one writer and one reader (sharing.api.allocation)."""

from __future__ import annotations

import base64
import json
from dataclasses import replace
from pathlib import Path

import pytest

from sharing.api.allocation import Allocation, AllocationError, ContainerAllocation, trusted_allocation
from sharing.api.keys import ALLOCATION_ANNOTATION
from sharing.admission.patch import apply_patch
from webhook.admission import review_pod
from webhook.inventory_source import InventoryHolder, load_file
from webhook.settings import WebhookSettings
from gpupack.testing.admission_reviews import gpu_container, make_pod, make_review

RECORD = Allocation(
    mode="mps", gated=True, capacity_existed=False, policy="p", reason="r", gpu_model="NVIDIA-L4", replicas=4,
    containers=(ContainerAllocation("a", "containers", 250, 8 * 2**30, "nvidia.com/gpu.shared"),
                ContainerAllocation("b", "initContainers", 100, None, "nvidia.com/gpu.shared")),
)


def test_a_record_reads_back_as_written_in_one_stable_text() -> None:
    text = RECORD.to_annotation()
    assert Allocation.from_annotation(text) == RECORD
    assert text == json.dumps(json.loads(text), separators=(",", ":"), sort_keys=True)  # stable: sorted, compact
    raw = json.loads(text)
    assert raw["version"] == "v1" and raw["capacityExisted"] is False and "memoryBytes" not in raw["containers"][1]
    bare = Allocation("mig", False, True, "p", "r", (ContainerAllocation("c", "containers", 100, None, "x", "1g.10gb"),))
    assert "gpuModel" not in bare.to_annotation() and Allocation.from_annotation(bare.to_annotation()) == bare


def test_a_record_from_before_capacity_existed_reads_gated_as_waiting_for_capacity() -> None:
    raw = json.loads(RECORD.to_annotation())
    del raw["capacityExisted"]
    assert Allocation.from_annotation(json.dumps(raw)).capacity_existed is False  # gated
    raw["gated"] = False
    assert Allocation.from_annotation(json.dumps(raw)).capacity_existed is True


def _with(**changes: object) -> str:
    raw = json.loads(RECORD.to_annotation())
    raw.update(changes)
    return json.dumps(raw)


def _container(**changes: object) -> str:
    raw = json.loads(RECORD.to_annotation())
    raw["containers"][0].update(changes)
    return json.dumps(raw)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (None, "is not a string"),
        ("{", "is not JSON"),
        ("[]", "is not a JSON object"),
        (_with(version="v2"), "version 'v2'"),
        (_with(mode="exclusive"), "mode 'exclusive'"),
        (_with(containers=[]), "has no containers"),
        (_with(containers="all"), "has no containers"),
        (_container(milli=0), "containers[0].milli 0"),
        (_container(milli="250"), "containers[0].milli '250'"),
        (_container(milli=True), "containers[0].milli True"),
        (_container(memoryBytes=-1), "containers[0].memoryBytes -1"),
        (_container(kind="container"), "containers[0].kind 'container'"),
    ],
)
def test_anything_else_is_refused_with_the_reason(text: object, says: str) -> None:
    with pytest.raises(AllocationError, match=f"^{ALLOCATION_ANNOTATION}") as caught:
        Allocation.from_annotation(text)
    assert says in str(caught.value)


# --- a record counts only when the pod really requests what it says ---------------------------

EXAMPLE_INVENTORY = Path(__file__).resolve().parents[2] / "examples" / "inventory.yaml"


def _admitted(mode: str, milli: str) -> dict[str, object]:
    """The pod as the webhook's own patch leaves it (producer), for the reader to check (consumer)."""
    holder = InventoryHolder()
    inventory = load_file(holder, EXAMPLE_INVENTORY)
    pod = make_pod(gpu_container("main", milli), gpu_container("side", "100"), mode=mode)
    answer = review_pod(make_review(pod), inventory, WebhookSettings.from_env({}))
    assert answer.decision is not None, answer.review
    ops = json.loads(base64.b64decode(answer.review["response"]["patch"]))
    patched: dict[str, object] = apply_patch(pod, ops)
    return patched


@pytest.mark.parametrize(("mode", "milli"), [("mig", "250"), ("mps", "250"), ("time-slicing", "250"), ("mps", "600")])
def test_what_the_webhook_writes_matches_what_the_pod_requests(mode: str, milli: str) -> None:
    admitted = _admitted(mode, milli)
    record = Allocation.from_annotation(admitted["metadata"]["annotations"][ALLOCATION_ANNOTATION])  # type: ignore[index]
    assert record.mismatch(admitted["spec"]) is None  # type: ignore[arg-type]


FORGED = Allocation(
    mode="mig", gated=True, capacity_existed=False, policy="p", reason="r",
    containers=tuple(ContainerAllocation(f"c{i}", "containers", 1000, None, "nvidia.com/mig-7g.80gb", "7g.80gb")
                     for i in range(3)),
)


def test_a_forged_record_on_a_pod_that_requests_no_gpu_does_not_count() -> None:
    spec = {"containers": [{"name": f"c{i}", "image": "x"} for i in range(3)]}
    assert "does not request nvidia.com/mig-7g.80gb: 1" in (FORGED.mismatch(spec) or "")


@pytest.mark.parametrize(("spec", "why"), [
    ({"containers": [{"name": "other", "resources": {"limits": {"nvidia.com/mig-7g.80gb": "1"}}}]}, "no containers container 'c0'"),
    ({"containers": [{"name": f"c{i}", "resources": {"limits": {"nvidia.com/mig-1g.10gb": "1"}}} for i in range(3)]},
     "does not request nvidia.com/mig-7g.80gb"),
    ({"containers": [{"name": f"c{i}", "resources": {"limits": {"nvidia.com/mig-7g.80gb": "2"}}} for i in range(3)]},
     "does not request"),
    ({"containers": [{"name": f"c{i}", "resources": {"limits": {"nvidia.com/mig-7g.80gb": "lots"}}} for i in range(3)]},
     "does not request"),
    ({"containers": "not a list"}, "no containers container"),
])
def test_records_that_disagree_with_the_pod_say_why(spec: dict[str, object], why: str) -> None:
    assert why in (FORGED.mismatch(spec) or "")


def test_a_resource_that_does_not_fit_the_mode_is_refused() -> None:
    wrong = Allocation("mps", False, True, "p", "r", (ContainerAllocation("c", "containers", 250, None, "nvidia.com/gpu"),))
    spec = {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": 1}}}]}
    assert "is not what mode 'mps' is given" in (wrong.mismatch(spec) or "")
    matching = Allocation("whole", False, True, "p", "r", (ContainerAllocation("c", "containers", 600, None, "nvidia.com/gpu"),))
    assert matching.mismatch(spec) is None


# ------------------------------------------------------------------ the DRA backend's record

def _dra_record(claim: str | None = "gpupack-pod-0123456789abcdef") -> Allocation:
    return Allocation(
        mode="mps", gated=True, capacity_existed=True, policy="p", reason="r",
        containers=(ContainerAllocation("c", "containers", 300, None, "gpu-0"),), backend="dra", claim=claim,
    )


def _dra_spec(claim: str = "gpupack-pod-0123456789abcdef", request: str = "gpu-0") -> dict[str, object]:
    return {
        "resourceClaims": [{"name": "gpupack", "resourceClaimName": claim}],
        "containers": [{"name": "c", "resources": {"claims": [{"name": "gpupack", "request": request}]}}],
    }


def test_a_dra_record_round_trips_with_its_backend_and_claim() -> None:
    record = _dra_record()
    text = record.to_annotation()
    assert '"backend":"dra"' in text and '"claim":"gpupack-pod-0123456789abcdef"' in text
    assert Allocation.from_annotation(text) == record


def test_a_device_plugin_record_keeps_its_old_wire_form() -> None:
    record = Allocation(mode="mps", gated=True, capacity_existed=True, policy="p", reason="r",
                        containers=(ContainerAllocation("c", "containers", 300, None, "nvidia.com/gpu.shared"),))
    assert "backend" not in record.to_annotation() and "claim" not in record.to_annotation()


def test_a_dra_record_is_trusted_only_when_the_pod_references_its_claim_and_requests() -> None:
    text = _dra_record().to_annotation()
    assert trusted_allocation(text, _dra_spec())[1] is None
    assert "does not reference ResourceClaim" in str(trusted_allocation(text, _dra_spec(claim="other"))[1])
    assert "does not use request 'gpu-0'" in str(trusted_allocation(text, _dra_spec(request="gpu-1"))[1])
    assert "names no claim" in str(trusted_allocation(_dra_record(claim=None).to_annotation(), _dra_spec())[1])


def test_an_unknown_backend_is_refused_by_name() -> None:
    text = _dra_record().to_annotation().replace('"dra"', '"kubevirt"')
    with pytest.raises(AllocationError, match="backend 'kubevirt'"):
        Allocation.from_annotation(text)


# ------------------------------------------------------------------ a DRA share's MIG fallback
def test_a_mig_fallback_round_trips_and_is_absent_when_not_set() -> None:
    record = replace(_dra_record(), mig_fallback=("3g.40gb",))
    text = record.to_annotation()
    assert json.loads(text)["migFallback"] == ["3g.40gb"]
    assert Allocation.from_annotation(text) == record
    assert "migFallback" not in _dra_record().to_annotation()
    assert Allocation.from_annotation(_dra_record().to_annotation()).mig_fallback is None  # records written before it


def _fallback(value: object, **changes: object) -> str:
    raw = json.loads(_dra_record().to_annotation())
    raw.update(migFallback=value, **changes)
    return json.dumps(raw)


@pytest.mark.parametrize(("text", "says"), [
    (_fallback("3g.40gb"), "is not one MIG profile per container (1)"),
    (_fallback(["3g.40gb", "1g.10gb"]), "is not one MIG profile per container (1)"),
    (_fallback([""]), "is not one MIG profile per container"),
    (_fallback([7]), "is not one MIG profile per container"),
    (_fallback(["3g.40gb"], mode="mig"), "not to mode 'mig' on dra"),
    (_fallback(["3g.40gb"], mode="whole"), "not to mode 'whole' on dra"),
    (_fallback(["3g.40gb"], backend="device-plugin"), "not to mode 'mps' on device-plugin"),
], ids=["not-a-list", "one-too-many", "empty-name", "not-a-name", "on-mig", "on-whole", "on-device-plugin"])
def test_a_mig_fallback_is_one_profile_per_container_of_a_shared_dra_record(text: str, says: str) -> None:
    with pytest.raises(AllocationError, match="migFallback") as caught:
        Allocation.from_annotation(text)
    assert says in str(caught.value)
