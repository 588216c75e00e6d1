"""The gpupack.io/allocation annotation: one writer and one reader (sharing.allocation)."""

from __future__ import annotations

import json

import pytest

from sharing.allocation import Allocation, AllocationError, ContainerAllocation
from sharing.keys import ALLOCATION_ANNOTATION

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
