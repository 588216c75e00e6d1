"""Device names of gpupack's DRA driver read back (node.draplugin.devices): every name the device
model writes parses to what it was written from, and nothing else parses."""

from __future__ import annotations

import pytest

from mig.catalog import all_models
from sharing.dra.names import DeviceName, DeviceNameError, parse_device_name, resolve_profile
from sharing.dra.names import gpu_device_name, mig_device_name, shared_device_name


def test_every_published_mig_name_parses_back_to_its_gpu_profile_and_start() -> None:
    checked = 0
    for model in all_models():
        for profile in model.profiles:
            for placement in profile.placements:
                for gpu in (0, 7, 15):
                    name = mig_device_name(gpu, profile.name, placement.start)
                    parsed = parse_device_name(name)
                    assert parsed.kind == "mig" and parsed.gpu == gpu and parsed.start == placement.start, name
                    assert parsed.profile_label is not None
                    assert resolve_profile(parsed.profile_label, model.profile_names) == profile.name, name
                    assert str(parsed) == name
                    checked += 1
    assert checked > 500


@pytest.mark.parametrize("gpu", [0, 1, 9, 10, 123])
def test_whole_and_shared_gpu_names(gpu: int) -> None:
    assert parse_device_name(gpu_device_name(gpu)) == DeviceName("gpu", gpu)
    assert parse_device_name(shared_device_name(gpu)) == DeviceName("shared", gpu)
    assert str(DeviceName("shared", gpu)) == shared_device_name(gpu)


@pytest.mark.parametrize("name", [
    "", "gpu", "gpu-", "gpu-x", "gpu--1", "gpu-01", "gpu-0-", "gpu-0-shared-1", "gpu-0-mig", "gpu-0-mig-3",
    "gpu-0-mig-1g.10gb-6", "gpu-0-mig-1g-10gb", "gpu-0-mig-1g-10gb-06", "gpu-0-mig--6", "gpu-0-mig-1g-10gb--6",
    "GPU-0", "gpu-99999", "nvidia-gpu-0", "gpu-0-mig-1g-10gb-6 ", "gpu-0-whole", "x" * 500,
], ids=lambda n: repr(n[:40]))
def test_names_gpupack_never_publishes_are_refused_clearly(name: str) -> None:
    with pytest.raises(DeviceNameError, match="not one of gpupack's"):
        parse_device_name(name)


def test_a_label_of_no_profile_resolves_to_nothing() -> None:
    assert resolve_profile("9g-99gb", ["1g.10gb", "7g.80gb"]) is None
    assert resolve_profile("1g-10gb-me", ["1g.10gb", "1g.10gb+me"]) == "1g.10gb+me"
