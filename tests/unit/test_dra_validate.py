"""The checks on what gpupack would publish (``sharing.dra.validate``).

Each case breaks one rule of a valid pool; the validator must name it. The
same kinds of cases go to the real API server in tests/e2e/test_dra_slices.py,
which checks that kube-apiserver refuses what the validator refuses.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from mig.catalog import get_model
from sharing.dra import validate
from sharing.dra.gpu_devices import shared_gpu
from sharing.dra.mig_devices import mig_gpu
from sharing.dra.model import Capacity, CounterSet, RequestPolicy, ResourceSlice, ValidRange
from sharing.dra.slices import node_slices

H100 = get_model("H100-80GB")
MiB = 2**20

MIG_POOL = node_slices("node-a", [mig_gpu(H100, i, f"GPU-{i}") for i in range(9)])
COUNTERS, DEVICES = MIG_POOL[0], MIG_POOL[2]
SHARED = node_slices("node-b", [shared_gpu(0, "GPU-s", H100.product, 81559 * MiB, "mps")])[0]
ALL_DEVICES = tuple(d for s in MIG_POOL for d in s.devices)
MIG_DEVICE, SHARED_DEVICE = DEVICES.devices[0], SHARED.devices[0]


def with_device(item: ResourceSlice, **changes: object) -> ResourceSlice:
    device = item.devices[0]
    return replace(item, devices=(replace(device, **changes),))  # type: ignore[arg-type]


def milli_policy(value: int, default: int, low: int, high: int | None, step: int | None) -> dict[str, Capacity]:
    return {"gpu.gpupack.io/milli": Capacity(value, RequestPolicy(default, ValidRange(low, high, step)))}


ONE_SLICE: list[tuple[str, Callable[[], ResourceSlice], str]] = [
    ("devices and counters", lambda: replace(DEVICES, shared_counters=COUNTERS.shared_counters[:1]),
     "only one of sharedCounters or devices"),
    ("65 devices consuming counters", lambda: replace(DEVICES, devices=ALL_DEVICES[:65]),
     "65 devices; at most 64 when devices consume counters"),
    ("129 devices", lambda: replace(SHARED, devices=tuple(replace(SHARED_DEVICE, name=f"gpu-{i}-shared")
                                                         for i in range(129))), "129 devices; at most 128"),
    ("9 counter sets", lambda: replace(COUNTERS, shared_counters=COUNTERS.shared_counters
                                       + (replace(COUNTERS.shared_counters[0], name="gpu-99"),)),
     "9 counter sets; at most 8"),
    ("33 counters", lambda: replace(COUNTERS, shared_counters=(CounterSet("gpu-0", {f"c{i}": 1 for i in range(33)}),)),
     "33 counters; at most 32"),
    ("dotted device name", lambda: with_device(DEVICES, name="gpu-0-mig-1g.10gb-6"), "must be a DNS label"),
    ("upper-case counter", lambda: replace(COUNTERS, shared_counters=(CounterSet("gpu-0", {"Memory": 1}),)),
     "counter 'Memory' must be a DNS label"),
    ("policy on a single-allocation device",
     lambda: with_device(DEVICES, capacity=milli_policy(1000, 50, 50, 1000, 50)), "needs allowMultipleAllocations"),
    ("default off the step", lambda: with_device(SHARED, capacity=milli_policy(1000, 75, 50, 1000, 50)),
     "default 75 is not min 50 plus a multiple of step 50"),
    ("max off the step", lambda: with_device(SHARED, capacity=milli_policy(1000, 60, 60, 1000, 60)),
     "validRange.max 1000 is not min 60 plus a multiple of step 60"),
    ("step past the capacity", lambda: with_device(SHARED, capacity=milli_policy(1000, 600, 600, None, 600)),
     "min + step (1200) is larger than the capacity 1000"),
    ("max past the capacity", lambda: with_device(SHARED, capacity=milli_policy(1000, 50, 50, 1050, 50)),
     "validRange.max 1050 must be between"),
    ("default below min", lambda: with_device(SHARED, capacity=milli_policy(1000, 0, 50, 1000, 50)),
     "default 0 is less than validRange.min 50"),
    ("zero step", lambda: with_device(SHARED, capacity=milli_policy(1000, 50, 50, 1000, 0)), "step must be positive"),
    ("long string attribute", lambda: with_device(DEVICES, attributes={
        **MIG_DEVICE.attributes, "gpu.gpupack.io/product": "x" * 65}), "65 characters long; at most 64"),
    ("33 attributes and capacities", lambda: with_device(DEVICES, attributes={
        **MIG_DEVICE.attributes, **{f"gpu.gpupack.io/a{i}": i for i in range(23)}}), "33 attributes and capacities"),
    ("long attribute id", lambda: with_device(DEVICES, attributes={
        **MIG_DEVICE.attributes, "gpu.gpupack.io/" + "a" * 33: 1}), "C identifier of at most 32"),
    ("attribute id not a C identifier", lambda: with_device(DEVICES, attributes={
        **MIG_DEVICE.attributes, "gpu.gpupack.io/placement-start": 1}), "must be a C identifier"),
    ("unknown kind", lambda: with_device(DEVICES, attributes={**MIG_DEVICE.attributes, "gpu.gpupack.io/kind": "vgpu"}),
     "must be one of mig, gpu, shared"),
    ("three consumptions", lambda: with_device(DEVICES, consumes_counters=MIG_DEVICE.consumes_counters * 3),
     "consumes from 3 counter sets; at most 2"),
    ("zero slice count", lambda: replace(DEVICES, slice_count=0), "resourceSliceCount must be greater than zero"),
    ("another driver", lambda: replace(DEVICES, driver="gpu.nvidia.com"), "driver must be gpu.gpupack.io"),
    ("bad node name", lambda: replace(DEVICES, node_name="Node_A"), "nodeName 'Node_A'"),
]


@pytest.mark.parametrize(("build", "expected"), [(b, e) for _, b, e in ONE_SLICE], ids=[c for c, _, _ in ONE_SLICE])
def test_a_slice_the_api_would_refuse_is_named_with_its_rule(build: Callable[[], ResourceSlice], expected: str) -> None:
    found = [str(p) for p in validate.slice_problems(build())]
    assert any(expected in p for p in found), found


def test_valid_slices_have_no_problems() -> None:
    assert validate.problems([*MIG_POOL, SHARED]) == []
    validate.check(MIG_POOL)


POOL: list[tuple[str, Callable[[], list[ResourceSlice]], str]] = [
    ("generations disagree", lambda: [replace(MIG_POOL[0], generation=2), *MIG_POOL[1:]], "disagree on generation"),
    ("a slice missing", lambda: list(MIG_POOL[:-1]), "kube-scheduler waits for the missing ones"),
    ("device names repeat", lambda: [*MIG_POOL, replace(MIG_POOL[2], name="node-a-gpu.gpupack.io-devices-099")],
     "device names repeat"),
    ("counter set missing", lambda: list(MIG_POOL[1:]), "which no slice of the pool defines"),
    ("counter missing", lambda: [replace(COUNTERS, shared_counters=tuple(
        CounterSet(c.name, {k: v for k, v in c.counters.items() if k != "media-extensions"})
        for c in COUNTERS.shared_counters)), *MIG_POOL[1:]], "does not define"),
    ("more than the set holds", lambda: [replace(COUNTERS, shared_counters=tuple(
        CounterSet(c.name, {**c.counters, "compute-slices": 2}) for c in COUNTERS.shared_counters)), *MIG_POOL[1:]],
     "so it could never be allocated"),
]


@pytest.mark.parametrize(("build", "expected"), [(b, e) for _, b, e in POOL], ids=[c for c, _, _ in POOL])
def test_a_pool_the_scheduler_would_mistrust_is_named_with_its_rule(
        build: Callable[[], list[ResourceSlice]], expected: str) -> None:
    found = [str(p) for p in validate.problems(build())]
    assert any(expected in p for p in found), found


def test_check_lists_every_problem() -> None:
    broken = [replace(DEVICES, slice_count=0, driver="x"), *MIG_POOL[:2]]
    with pytest.raises(validate.InvalidSlices) as info:
        validate.check(broken)
    message = str(info.value)
    assert "resourceSliceCount must be greater than zero" in message and "driver must be gpu.gpupack.io" in message
    assert message.startswith(f"{len(info.value.problems)} problem(s)")
