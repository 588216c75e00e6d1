"""A MIG-capable GPU in dynamic mode as partitionable devices (``sharing.dra.mig_devices``)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

import pytest

from mig.catalog import all_models, get_model
from mig.geometry import validate_layout
from mig.model import GpuModel, PlacedInstance, Placement
from sharing.dra import names
from sharing.dra.mig_devices import counter_set, mig_gpu
from sharing.dra.model import Device, DraModelError, GpuOffer

H100 = get_model("H100-80GB")
A30 = get_model("A30")
UUID = "GPU-5c5f1d7e-0000-4c1e-9a57-000000000001"


def instance_of(device: Device) -> PlacedInstance:
    a = device.attributes
    start, size = a[names.PLACEMENT_START], a[names.PLACEMENT_SIZE]
    assert isinstance(start, int) and isinstance(size, int)
    return PlacedInstance(str(a[names.PROFILE]), Placement(start, size))


def mig_devices(offer: GpuOffer) -> list[Device]:
    return [d for d in offer.devices if d.kind == "mig"]


def fits_counters(devices: Sequence[Device], counters: Mapping[str, int]) -> bool:
    used: Counter[str] = Counter()
    for device in devices:
        for consumption in device.consumes_counters:
            used.update(consumption.counters)
    return all(used[name] <= counters.get(name, 0) for name in used)


# ------------------------------------------------------------------ the table facts
@pytest.mark.parametrize("model", all_models(), ids=lambda m: m.product)
def test_one_device_per_placement_of_every_profile_and_the_whole_gpu(model: GpuModel) -> None:
    offer = mig_gpu(model, 0, UUID)
    assert len(offer.devices) == sum(len(p.placements) for p in model.profiles) + 1
    assert {instance_of(d) for d in mig_devices(offer)} == {
        PlacedInstance(p.name, placement) for p in model.profiles for placement in p.placements}
    assert [d.kind for d in offer.devices].count("gpu") == 1


@pytest.mark.parametrize(("model", "devices"), [(H100, 26), (A30, 14)], ids=["H100", "A30"])
def test_device_counts_of_two_geometries(model: GpuModel, devices: int) -> None:
    # H100: 7 x 1g.10gb, 7 x 1g.10gb+me, 4 x 1g.20gb, 3 x 2g, 2 x 3g, 4g, 7g; + whole GPU.
    # A30: 4 x 1g.6gb, 4 x 1g.6gb+me, 2 x 2g.12gb, 2 x 2g.12gb+me, 4g; + whole GPU.
    assert len(mig_gpu(model, 0, UUID).devices) == devices


def test_the_counter_set_holds_memory_slices_compute_and_media() -> None:
    counters = counter_set(H100, 3)
    assert counters.name == "gpu-3"
    assert dict(counters.counters) == {
        **{f"memory-slice-{k}": 1 for k in range(8)}, "compute-slices": 7, "media-extensions": 1}
    assert dict(counter_set(A30, 0).counters)["compute-slices"] == 4


# ------------------------------------------------------------------ counters are the geometry
def one_model_per_geometry() -> list[GpuModel]:
    """Models differ in names and sizes; the walk below depends only on the geometry."""
    seen: dict[object, GpuModel] = {}
    for model in all_models():
        key = (model.compute_slices, model.memory_slices, tuple(
            (p.compute_slices, p.memory_slices, p.max_count, p.placements, p.media_extensions) for p in model.profiles))
        seen.setdefault(key, model)
    return list(seen.values())


@pytest.mark.parametrize("model", one_model_per_geometry(), ids=lambda m: m.product)
def test_a_set_of_placements_fits_the_counters_exactly_when_it_is_a_valid_layout(model: GpuModel) -> None:
    """Every set of MIG devices, walked exhaustively: the counters admit it iff ``mig.geometry`` does.

    Both predicates are monotone (a superset of a refused set is refused), so a walk that
    extends only admitted sets sees every admitted set and every minimal refused one.
    """
    offer = mig_gpu(model, 0, UUID)
    assert offer.counter_set is not None
    counters = offer.counter_set.counters
    devices = mig_devices(offer)
    admitted = 0

    def walk(start: int, chosen: list[Device]) -> None:
        nonlocal admitted
        for i in range(start, len(devices)):
            trial = [*chosen, devices[i]]
            by_counters = fits_counters(trial, counters)
            by_geometry = validate_layout(model, [instance_of(d) for d in trial])
            assert by_counters == (by_geometry is None), (
                f"{[d.name for d in trial]}: counters say {by_counters}, geometry says {by_geometry}")
            if by_counters:
                admitted += 1
                walk(i + 1, trial)

    walk(0, [])
    assert admitted > len(devices)  # the walk went deeper than single devices


def test_overlapping_placements_share_a_memory_slice_counter_and_others_do_not() -> None:
    by_name = {d.name: d for d in mig_gpu(H100, 0, UUID).devices}

    def slices_of(name: str) -> set[str]:
        return {c for c in by_name[name].consumes_counters[0].counters if c.startswith("memory-slice-")}

    assert slices_of("gpu-0-mig-3g-40gb-4") & slices_of("gpu-0-mig-1g-10gb-5") == {"memory-slice-5"}
    assert slices_of("gpu-0-mig-3g-40gb-4") & slices_of("gpu-0-mig-3g-40gb-0") == set()
    assert slices_of("gpu-0-mig-4g-40gb-0") & slices_of("gpu-0-mig-2g-20gb-4") == set()
    assert slices_of("gpu-0-mig-1g-20gb-6") == {"memory-slice-6", "memory-slice-7"}


def test_the_media_counter_keeps_a_second_me_instance_off() -> None:
    offer = mig_gpu(H100, 0, UUID)
    assert offer.counter_set is not None
    by_name = {d.name: d for d in offer.devices}
    two = [by_name["gpu-0-mig-1g-10gb-me-0"], by_name["gpu-0-mig-1g-10gb-me-1"]]
    assert not fits_counters(two, offer.counter_set.counters)
    used: Counter[str] = Counter()
    for device in two:
        used.update(device.consumes_counters[0].counters)
    assert used["media-extensions"] == 2  # memory and compute alone would let both in:
    assert all(used[k] <= v for k, v in offer.counter_set.counters.items() if k != "media-extensions")


def test_the_whole_gpu_consumes_every_counter_and_excludes_any_placement() -> None:
    offer = mig_gpu(H100, 0, UUID)
    assert offer.counter_set is not None
    whole = offer.devices[-1]
    assert whole.name == "gpu-0" and whole.kind == "gpu"
    assert dict(whole.consumes_counters[0].counters) == dict(offer.counter_set.counters)
    for device in mig_devices(offer):
        assert not fits_counters([whole, device], offer.counter_set.counters), device.name


@pytest.mark.parametrize("model", all_models(), ids=lambda m: m.product)
def test_no_device_consumes_more_than_its_counter_set(model: GpuModel) -> None:
    offer = mig_gpu(model, 2, UUID)
    assert offer.counter_set is not None
    for device in offer.devices:
        assert [c.counter_set for c in device.consumes_counters] == ["gpu-2"]
        assert fits_counters([device], offer.counter_set.counters), device.name


# ------------------------------------------------------------------ attributes and names
def test_a_mig_device_says_what_it_is() -> None:
    device = next(d for d in mig_gpu(H100, 1, UUID).devices if d.name == "gpu-1-mig-1g-10gb-me-3")
    assert dict(device.attributes) == {
        names.KIND: "mig", names.PRODUCT: "NVIDIA-H100-80GB-HBM3", names.UUID: UUID, names.INDEX: 1,
        names.PROFILE: "1g.10gb+me", names.PLACEMENT_START: 3, names.PLACEMENT_SIZE: 1,
        names.COMPUTE_SLICES: 1, names.MEDIA_EXTENSIONS: True,
    }
    assert device.capacity[names.MEMORY].value == H100.profile("1g.10gb+me").memory_bytes
    assert device.capacity[names.MEMORY].request_policy is None
    assert dict(device.consumes_counters[0].counters) == {"memory-slice-3": 1, "compute-slices": 1, "media-extensions": 1}


@pytest.mark.parametrize("model", all_models(), ids=lambda m: m.product)
def test_names_are_distinct_dns_labels(model: GpuModel) -> None:
    offer = mig_gpu(model, 15, UUID)
    device_names = [d.name for d in offer.devices]
    assert len(set(device_names)) == len(device_names)
    assert all(names.is_dns_label(n) for n in device_names), device_names
    assert offer.counter_set is not None
    assert all(names.is_dns_label(n) for n in [offer.counter_set.name, *offer.counter_set.counters])


@pytest.mark.parametrize(("profile", "start", "name"), [
    ("1g.10gb", 0, "gpu-0-mig-1g-10gb-0"),
    ("1g.10gb+me", 6, "gpu-0-mig-1g-10gb-me-6"),
    ("3g.40gb", 4, "gpu-0-mig-3g-40gb-4"),
    ("7g.80gb", 0, "gpu-0-mig-7g-80gb-0"),
])
def test_profile_names_become_label_safe(profile: str, start: int, name: str) -> None:
    assert names.mig_device_name(0, profile, start) == name


# ------------------------------------------------------------------ the order first-fit tries
def test_small_profiles_first_high_starts_first_whole_gpu_last() -> None:
    order = [d.name for d in mig_gpu(H100, 0, UUID).devices]
    assert order[:2] == ["gpu-0-mig-1g-10gb-6", "gpu-0-mig-1g-10gb-5"]
    assert order.index("gpu-0-mig-3g-40gb-4") < order.index("gpu-0-mig-3g-40gb-0")
    assert order.index("gpu-0-mig-1g-10gb-0") < order.index("gpu-0-mig-1g-10gb-me-6")  # +me after its plain twin
    assert order[-2:] == ["gpu-0-mig-7g-80gb-0", "gpu-0"]


def test_the_same_inputs_give_equal_offers() -> None:
    def build() -> GpuOffer:
        return mig_gpu(H100, 0, UUID, allowed_profiles={"1g.10gb", "3g.40gb"},
                       in_use=[PlacedInstance("3g.40gb", Placement(4, 4))])

    assert build() == build()


# ------------------------------------------------------------------ policy and state
def test_only_allowed_profiles_are_offered() -> None:
    offer = mig_gpu(H100, 0, UUID, allowed_profiles={"3g.40gb", "1g.10gb", "3g.20gb"})  # 3g.20gb: an A100-40GB name
    assert Counter(str(d.attributes.get(names.PROFILE, "whole")) for d in offer.devices) == {
        "1g.10gb": 7, "3g.40gb": 2, "whole": 1}
    assert len(mig_gpu(H100, 0, UUID, allowed_profiles=set()).devices) == 1
    assert len(mig_gpu(H100, 0, UUID, whole_gpu=False).devices) == 25


def test_an_instance_in_use_is_offered_as_itself_only() -> None:
    held = PlacedInstance("3g.40gb", Placement(4, 4))
    offer = mig_gpu(H100, 0, UUID, allowed_profiles={"1g.10gb"}, in_use=[held])
    offered = [instance_of(d) for d in mig_devices(offer)]
    assert held in offered  # published though the policy no longer allows 3g.40gb
    others = [i for i in offered if i != held]
    assert others and all(i.profile == "1g.10gb" and i.placement.end <= 4 for i in others)
    assert all(d.kind == "mig" for d in offer.devices)  # no whole GPU while an instance is in use


def test_blocked_slices_are_offered_to_nobody() -> None:
    offer = mig_gpu(H100, 0, UUID, blocked=[Placement(0, 1)])
    offered = [instance_of(d) for d in mig_devices(offer)]
    assert offered and all(i.placement.start >= 1 for i in offered)
    assert "gpu-0" not in {d.name for d in offer.devices}


@pytest.mark.parametrize(("in_use", "blocked", "message"), [
    ([PlacedInstance("3g.40gb", Placement(4, 4)), PlacedInstance("4g.40gb", Placement(0, 4)),
      PlacedInstance("1g.10gb", Placement(3, 1))], [], "overlaps"),
    ([PlacedInstance("3g.40gb", Placement(2, 4))], [], "cannot be placed at 2:4"),
    ([PlacedInstance("3g.20gb", Placement(0, 4))], [], "unknown MIG profile"),
    ([PlacedInstance("1g.10gb", Placement(0, 1))], [Placement(0, 2)], "overlaps a blocked placement"),
])
def test_impossible_state_is_refused_with_the_rule(
        in_use: list[PlacedInstance], blocked: list[Placement], message: str) -> None:
    with pytest.raises(DraModelError, match=message):
        mig_gpu(H100, 0, UUID, in_use=in_use, blocked=blocked)


def test_a_negative_index_is_refused() -> None:
    with pytest.raises(DraModelError, match="index"):
        mig_gpu(H100, -1, UUID)
