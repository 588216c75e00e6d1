"""Shared and whole GPUs as DRA devices, and the request policy of shares (``sharing.dra.share_policy``)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from sharing.dra import names
from sharing.dra.gpu_devices import shared_gpu, whole_gpu
from sharing.dra.model import DraModelError, RequestPolicy, ValidRange
from sharing.dra.share_policy import GiB, SharePolicy

MiB = 2**20
H100_MEMORY = 81559 * MiB
UUID = "GPU-5c5f1d7e-0000-4c1e-9a57-000000000002"


def test_a_shared_gpu_is_one_device_for_many_claims() -> None:
    offer = shared_gpu(0, UUID, "NVIDIA-H100-80GB-HBM3", H100_MEMORY, "mps")
    assert offer.counter_set is None
    (device,) = offer.devices
    assert device.name == "gpu-0-shared" and device.allow_multiple_allocations
    assert not device.consumes_counters
    assert dict(device.attributes) == {names.KIND: "shared", names.PRODUCT: "NVIDIA-H100-80GB-HBM3",
                                       names.UUID: UUID, names.INDEX: 0, names.SHARING: "mps"}
    milli, memory = device.capacity[names.MILLI], device.capacity[names.MEMORY]
    assert milli.value == 1000
    assert milli.request_policy == RequestPolicy(50, ValidRange(min=50, max=1000, step=50))
    assert memory.value == H100_MEMORY
    assert memory.request_policy == RequestPolicy(GiB, ValidRange(min=GiB, max=79 * GiB, step=GiB))


def test_time_slicing_is_shared_too_and_says_so() -> None:
    (device,) = shared_gpu(3, UUID, "NVIDIA-L4", 23034 * MiB, "time-slicing").devices
    assert device.kind == "shared" and device.attributes[names.SHARING] == "time-slicing"
    assert device.name == "gpu-3-shared"


def test_a_whole_gpu_is_one_device_for_one_claim() -> None:
    (device,) = whole_gpu(1, UUID, "NVIDIA-L40S", 46068 * MiB).devices
    assert device.name == "gpu-1" and device.kind == "gpu" and not device.allow_multiple_allocations
    assert device.capacity[names.MEMORY].value == 46068 * MiB
    assert device.capacity[names.MEMORY].request_policy is None


@pytest.mark.parametrize(("requested", "consumed"), [
    (None, 50), (0, 50), (1, 50), (50, 50), (51, 100), (120, 150), (300, 300), (999, 1000), (1000, 1000), (1001, 1050),
])
def test_a_share_is_rounded_up_to_the_unit_as_the_allocator_does(requested: int | None, consumed: int) -> None:
    assert SharePolicy().consumed_milli(requested) == consumed


@pytest.mark.parametrize(("requested", "consumed"), [
    (None, GiB), (1, GiB), (GiB, GiB), (GiB + 1, 2 * GiB), (20 * GiB, 20 * GiB), (int(19.5 * GiB), 20 * GiB),
])
def test_memory_is_rounded_up_to_whole_units(requested: int | None, consumed: int) -> None:
    assert SharePolicy().consumed_memory(requested) == consumed


@pytest.mark.parametrize(("milli", "memory", "served"), [
    (300, 20 * GiB, True), (1000, None, True), (1001, None, False), (50, 79 * GiB, True), (50, 80 * GiB, False),
])
def test_what_one_claim_may_ask_of_an_h100(milli: int, memory: int | None, served: bool) -> None:
    assert SharePolicy().serves(H100_MEMORY, milli, memory) is served


def test_the_unit_is_a_parameter() -> None:
    fine = SharePolicy(milli_step=1, memory_step_bytes=256 * MiB)
    assert fine.shares_per_gpu == 1000 and fine.consumed_milli(333) == 333
    assert fine.milli_capacity().request_policy == RequestPolicy(1, ValidRange(min=1, max=1000, step=1))
    assert SharePolicy().shares_per_gpu == 20
    custom = SharePolicy(milli_step=100, default_milli=1000, default_memory_bytes=8 * GiB)
    assert custom.consumed_milli(None) == 1000 and custom.consumed_memory(None) == 8 * GiB


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"milli_step": 0}, "1..500"),
    ({"milli_step": 600}, "min \\+ step"),
    ({"milli_step": 1000}, "1..500"),
    ({"milli_step": 30}, "divide 1000"),
    ({"memory_step_bytes": 0}, "at least 1 byte"),
    ({"default_milli": 75}, "multiple of 50"),
    ({"default_milli": 1050}, "multiple of 50"),
    ({"default_memory_bytes": GiB + 1}, "multiple of the memory unit"),
])
def test_a_policy_the_api_would_refuse_is_refused_here(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(DraModelError, match=message):
        SharePolicy(**kwargs)


def test_a_gpu_too_small_for_the_policy_is_refused() -> None:
    with pytest.raises(DraModelError, match="fewer than two memory units"):
        shared_gpu(0, UUID, "tiny", GiB + 1, "mps")
    with pytest.raises(DraModelError, match="default memory"):
        shared_gpu(0, UUID, "small", 4 * GiB, "mps", SharePolicy(default_memory_bytes=8 * GiB))


@pytest.mark.parametrize("build", [
    lambda: shared_gpu(-1, UUID, "x", GiB * 8, "mps"),
    lambda: whole_gpu(0, UUID, "x", 0),
])
def test_bad_gpus_are_refused(build: Callable[[], object]) -> None:
    with pytest.raises(DraModelError):
        build()
