"""Catalog lookup, smallest covering profile, quantities and reshaping plans."""

from __future__ import annotations

import pytest

from mig.catalog import all_models, find_model, get_model, model_for_pci_device_id
from mig.errors import MigError, RequestError, UnknownModelError
from mig.fit import compute_slices_needed, smallest_covering_across, smallest_covering_profile
from mig.model import PlacedInstance, Placement
from mig.reach import plan_reconfiguration, reachable_layouts
from mig.units import parse_memory

GiB = 2**30


@pytest.mark.parametrize(
    ("name", "product"),
    [
        ("NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-80GB-HBM3"),
        ("NVIDIA H100 80GB HBM3", "NVIDIA-H100-80GB-HBM3"),
        ("h100", "NVIDIA-H100-80GB-HBM3"),
        ("A100-80GB", "NVIDIA-A100-SXM4-80GB"),
        ("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", "NVIDIA-A100-SXM4-40GB"),
        ("NVIDIA-H200-SHARED", "NVIDIA-H200"),
        ("H200-NVL", "NVIDIA-H200-NVL"),
        ("GH200", "NVIDIA-GH200-480GB"),
        ("B200", "NVIDIA-B200"),
        ("A30", "NVIDIA-A30"),
    ],
)
def test_models_resolve_by_gfd_name_nvml_name_and_alias(name: str, product: str) -> None:
    assert get_model(name).product == product


def test_unknown_model_lists_the_valid_names() -> None:
    with pytest.raises(UnknownModelError, match="valid models: .*H100"):
        get_model("H900")
    assert find_model("H900") is None


@pytest.mark.parametrize(("pci", "product"), [("0x20B010DE", "NVIDIA-A100-SXM4-40GB"), ("0x2335", "NVIDIA-H200"), (0x20B7, "NVIDIA-A30")])
def test_pci_device_ids(pci: str | int, product: str) -> None:
    model = model_for_pci_device_id(pci)
    assert model is not None and model.product == product


def test_catalog_is_consistent() -> None:
    seen_pci: set[str] = set()
    for model in all_models():
        for profile in model.profiles:
            assert profile.memory_mib <= model.memory_mib
            for placement in profile.placements:
                assert placement.size == profile.memory_slices
                assert placement.end <= model.memory_slices
        full = max(model.profiles, key=lambda p: p.memory_slices)
        assert full.compute_slices == model.compute_slices and full.memory_slices == model.memory_slices
        assert not (set(model.pci_device_ids) & seen_pci)
        seen_pci |= set(model.pci_device_ids)


@pytest.mark.parametrize(
    ("model", "milli", "memory", "expected"),
    [
        ("A100-80GB", 100, 5 * GiB, "1g.10gb"),
        ("A100-80GB", 100, 10 * GiB, "1g.20gb"),  # 1g.10gb holds only 9.5 GiB
        ("A100-80GB", 200, 5 * GiB, "2g.20gb"),  # 200 milli needs 2 of 7 slices
        ("A100-80GB", 500, 0, "4g.40gb"),
        ("A100-80GB", 1000, 0, "7g.80gb"),
        ("A100-40GB", 142, 1 * GiB, "1g.5gb"),
        ("A100-40GB", 143, 1 * GiB, "2g.10gb"),
        ("A30", 250, 1 * GiB, "1g.6gb"),
        ("A30", 251, 1 * GiB, "2g.12gb"),
        ("H200", 400, 60 * GiB, "3g.71gb"),
    ],
)
def test_smallest_covering_profile(model: str, milli: int, memory: int, expected: str) -> None:
    profile = smallest_covering_profile(get_model(model), milli, memory)
    assert profile is not None and profile.name == expected
    gpu = get_model(model)
    assert profile.compute_slices >= compute_slices_needed(gpu, milli)
    assert profile.memory_bytes >= memory


def test_nothing_covers_more_memory_than_the_gpu() -> None:
    assert smallest_covering_profile(get_model("A100-40GB"), 100, 45 * GiB) is None


@pytest.mark.parametrize("milli", [0, -5, 1001])
def test_milli_out_of_range(milli: int) -> None:
    with pytest.raises(RequestError, match="1..1000"):
        smallest_covering_profile(get_model("H100"), milli, 0)


def test_across_models_prefers_least_unused_memory() -> None:
    best = smallest_covering_across([get_model("H200"), get_model("A100-40GB"), get_model("H100")], 100, 4 * GiB)
    assert (best.model.product, best.profile.name) == ("NVIDIA-A100-SXM4-40GB", "1g.5gb")
    with pytest.raises(RequestError, match="largest is 7g.141gb"):
        smallest_covering_across([get_model("H200")], 100, 200 * GiB)


@pytest.mark.parametrize(("text", "value"), [("20Gi", 20 * GiB), ("10G", 10**10), ("512Mi", 2**29), ("1e3", 1000), ("0.5Gi", GiB // 2), ("250m", 1), (1024, 1024)])
def test_quantities(text: str | int, value: int) -> None:
    assert parse_memory(text) == value


@pytest.mark.parametrize("text", ["", "Gi", "20GB", "-1Gi", "1.2.3", "ten", "1e", "20 Gi Gi", "2Ei", "8E"])
def test_bad_quantities(text: str) -> None:
    with pytest.raises(RequestError):
        parse_memory(text)


def test_exa_quantities_are_bytes_not_exponents() -> None:
    assert parse_memory("1Ei") == 2**60 and parse_memory("1E") == 10**18


H100 = get_model("H100")
BALANCED = [
    PlacedInstance("1g.10gb", Placement(0, 1)),
    PlacedInstance("1g.10gb", Placement(1, 1)),
    PlacedInstance("2g.20gb", Placement(2, 2)),
    PlacedInstance("3g.40gb", Placement(4, 4)),
]


def test_plan_keeps_in_use_and_is_minimal() -> None:
    plan = plan_reconfiguration(H100, BALANCED, [BALANCED[3]], ["3g.40gb", "3g.40gb"])
    assert plan is not None
    assert plan.keep == (BALANCED[3],)
    assert plan.create == (PlacedInstance("3g.40gb", Placement(0, 4)),)
    assert set(plan.destroy) == set(BALANCED[:3])


def test_plan_reuses_idle_instances_that_the_target_contains() -> None:
    plan = plan_reconfiguration(H100, BALANCED, [], ["1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "3g.40gb"])
    assert plan is not None and plan.steps == 3  # destroy the 2g, create two 1g
    assert BALANCED[0] in plan.keep and BALANCED[3] in plan.keep


def test_unreachable_when_an_in_use_instance_is_in_the_way() -> None:
    assert plan_reconfiguration(H100, BALANCED, [BALANCED[0]], ["7g.80gb"]) is None
    assert plan_reconfiguration(H100, BALANCED, [BALANCED[2]], ["4g.40gb", "3g.40gb"]) is None


def test_reachable_layouts_are_sorted_by_cost() -> None:
    options = reachable_layouts(H100, BALANCED, [BALANCED[3]])
    assert options[0][1].is_noop() is False or options[0][0] == tuple(sorted(i.profile for i in BALANCED))
    steps = [plan.steps for _, plan in options]
    assert steps == sorted(steps)
    assert all(BALANCED[3] in plan.keep for _, plan in options)


def test_invalid_current_layout_is_refused() -> None:
    overlapping = [PlacedInstance("4g.40gb", Placement(0, 4)), PlacedInstance("1g.10gb", Placement(0, 1))]
    with pytest.raises(MigError, match="overlaps"):
        plan_reconfiguration(H100, overlapping, [], ["7g.80gb"])
    with pytest.raises(MigError, match="in-use instances not in the current layout"):
        plan_reconfiguration(H100, BALANCED, [PlacedInstance("7g.80gb", Placement(0, 8))], ["7g.80gb"])
