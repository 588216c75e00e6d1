"""One node's GPUs as the ResourceSlices of its pool (``sharing.dra.slices``)."""

from __future__ import annotations

import pytest

from mig.catalog import all_models, get_model
from mig.model import GpuModel, PlacedInstance, Placement
from sharing.dra import limits, names, validate
from sharing.dra.gpu_devices import shared_gpu, whole_gpu
from sharing.dra.mig_devices import mig_gpu
from sharing.dra.model import DraModelError, GpuOffer, ResourceSlice
from sharing.dra.slices import node_slices, pack_devices

H100 = get_model("H100-80GB")
MiB = 2**20


def uuid(i: int) -> str:
    return f"GPU-00000000-0000-0000-0000-{i:012d}"


def mig_node(model: GpuModel, gpus: int) -> list[GpuOffer]:
    return [mig_gpu(model, i, uuid(i)) for i in range(gpus)]


def devices_of(slices: tuple[ResourceSlice, ...]) -> list[str]:
    return [d.name for s in slices for d in s.devices]


def test_a_node_of_eight_h100s_needs_several_slices() -> None:
    slices = node_slices("gpu-node-1", mig_node(H100, 8))
    counters = [s for s in slices if s.shared_counters]
    devices = [s for s in slices if s.devices]
    assert len(counters) == 1 and len(counters[0].shared_counters) == 8
    assert len(devices) == 4  # 8 x 26 devices, 64 at most per slice: two GPUs per slice
    assert [len(s.devices) for s in devices] == [52, 52, 52, 52]
    assert len(devices_of(slices)) == 8 * 26
    assert validate.problems(slices) == []


def test_every_slice_carries_the_pool_node_generation_and_count() -> None:
    slices = node_slices("gpu-node-1", mig_node(H100, 3), generation=7, owner_uid="3f1c-uid")
    assert {(s.pool, s.node_name, s.generation, s.slice_count, s.driver, s.owner_uid) for s in slices} == {
        ("gpu-node-1", "gpu-node-1", 7, len(slices), "gpu.gpupack.io", "3f1c-uid")}


def test_counter_sets_and_devices_never_share_a_slice() -> None:
    for item in node_slices("n", mig_node(H100, 5)):
        assert not (item.devices and item.shared_counters), item.name


@pytest.mark.parametrize("gpus", [0, 1, 2, 3, 8, 9, 16, 17])
@pytest.mark.parametrize("model", [H100, get_model("A30")], ids=["H100", "A30"])
def test_limits_hold_for_any_node_size(model: GpuModel, gpus: int) -> None:
    slices = node_slices("n", mig_node(model, gpus))
    assert validate.problems(slices) == []
    for item in slices:
        assert len(item.shared_counters) <= limits.MAX_COUNTER_SETS
        assert len(item.devices) <= limits.MAX_DEVICES_ADVANCED
    assert len(devices_of(slices)) == gpus * len(mig_gpu(model, 0, "u").devices)
    assert sum(len(s.shared_counters) for s in slices) == gpus


def test_a_gpu_stays_in_one_slice_when_it_fits_one() -> None:
    for item in node_slices("n", mig_node(H100, 8)):
        indices = [d.attributes[names.INDEX] for d in item.devices]
        assert indices == sorted(indices)
    placement_of = {d.name: s.name for s in node_slices("n", mig_node(H100, 8)) for d in s.devices}
    for i in range(8):
        assert len({slice_name for device, slice_name in placement_of.items()
                    if device.startswith(f"gpu-{i}-") or device == f"gpu-{i}"}) == 1


def test_a_change_to_one_gpu_rewrites_one_slice() -> None:
    before = node_slices("n", mig_node(H100, 8))
    gpus = mig_node(H100, 8)
    gpus[5] = mig_gpu(H100, 5, uuid(5), in_use=[PlacedInstance("3g.40gb", Placement(4, 4))])
    after = node_slices("n", gpus)
    changed = [a.name for a, b in zip(after, before) if a.devices != b.devices or a.shared_counters != b.shared_counters]
    assert changed == ["n-gpu.gpupack.io-devices-002"]


def test_a_gpu_larger_than_a_slice_is_split() -> None:
    big = GpuOffer(0, mig_gpu(H100, 0, "u").devices * 3)  # 78 devices consuming counters (names repeat: packing only)
    packed = pack_devices([big])
    assert [len(group) for group in packed] == [64, 14]


def test_devices_without_counters_fill_128() -> None:
    gpus = [shared_gpu(i, uuid(i), "NVIDIA-L4", 23034 * MiB, "mps") for i in range(130)]
    assert [len(group) for group in pack_devices(gpus)] == [128, 2]


def test_a_mixed_node_keeps_the_advanced_limit_where_counters_are_consumed() -> None:
    gpus = [*mig_node(H100, 2), shared_gpu(2, uuid(2), H100.product, 81559 * MiB, "mps"),
            whole_gpu(3, uuid(3), "NVIDIA-L40S", 46068 * MiB)]
    slices = node_slices("mixed", gpus)
    assert validate.problems(slices) == []
    assert [len(s.devices) for s in slices if s.devices] == [54]  # 26 + 26 + 1 + 1
    assert devices_of(slices)[-2:] == ["gpu-2-shared", "gpu-3"]


def test_the_same_inputs_give_the_same_slices() -> None:
    assert node_slices("n", mig_node(H100, 8), generation=3) == node_slices("n", list(reversed(mig_node(H100, 8))),
                                                                            generation=3)


def test_slice_names_sort_in_gpu_order() -> None:
    slices = node_slices("node-a", mig_node(get_model("A30"), 80))  # 80 x 14 devices: 20 device slices, 10 counter slices
    device_slices = [s.name for s in slices if s.devices]
    assert device_slices == sorted(device_slices)
    assert device_slices[0] == "node-a-gpu.gpupack.io-devices-000"
    assert [s.name for s in slices if s.shared_counters][-1] == "node-a-gpu.gpupack.io-counters-009"


def test_a_node_without_gpus_publishes_an_empty_pool() -> None:
    (only,) = node_slices("cpu-node", [])
    assert only.devices == () and only.shared_counters == () and only.slice_count == 1
    assert validate.problems([only]) == []


def test_a_long_node_name_gives_short_distinct_slice_names() -> None:
    long_a, long_b = "a" * 240 + ".example", "a" * 240 + ".example2"
    name_a = node_slices(long_a, mig_node(H100, 1))[0].name
    name_b = node_slices(long_b, mig_node(H100, 1))[0].name
    assert name_a != name_b and len(name_a) <= 253 and names.is_dns_subdomain(name_a)


@pytest.mark.parametrize(("gpus", "message"), [
    ([mig_gpu(H100, 0, "u"), mig_gpu(H100, 0, "v")], "indices repeat"),
    ([mig_gpu(H100, 0, "u"), GpuOffer(1, mig_gpu(H100, 0, "u").devices[:1])], "two devices are called"),
])
def test_inconsistent_gpus_are_refused(gpus: list[GpuOffer], message: str) -> None:
    with pytest.raises(DraModelError, match=message):
        node_slices("n", gpus)


def test_a_negative_generation_is_refused() -> None:
    with pytest.raises(DraModelError, match="generation"):
        node_slices("n", [], generation=-1)


@pytest.mark.parametrize("model", all_models(), ids=lambda m: m.product)
def test_every_catalog_model_publishes_valid_slices(model: GpuModel) -> None:
    assert validate.problems(node_slices("n", mig_node(model, 8))) == []
