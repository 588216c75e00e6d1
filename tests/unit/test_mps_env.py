"""An MPS client's memory limit as its environment carries it: written in gpupack's one form, read
back in every documented form, and refused, naming the value, in any other."""

from __future__ import annotations

import pytest

from sharing.api.mps_env import PINNED_MEMORY_ENV, MpsEnvError, parse_pinned_memory, pinned_memory_mib, pinned_memory_value


def test_gpupacks_form_reads_back() -> None:
    assert pinned_memory_value(16384) == "0=16384M"
    assert parse_pinned_memory(pinned_memory_value(12288, ordinal=1)) == {"1": 12288}


@pytest.mark.parametrize(("value", "expected"), [
    pytest.param("0=1G,1=512MB", {"0": 1024, "1": 512}, id="nvidia-docs-example"),
    pytest.param("0=2GB", {"0": 2048}, id="gigabytes"),
    pytest.param(" 00=64M ", {"0": 64}, id="spaces-and-leading-zeros"),
    pytest.param("GPU-8932f937-d72c=4G", {"GPU-8932f937-d72c": 4096}, id="uuid"),
])
def test_documented_forms(value: str, expected: dict[str, int]) -> None:
    assert parse_pinned_memory(value) == expected


@pytest.mark.parametrize(("value", "says"), [
    pytest.param("", "empty", id="empty"),
    pytest.param("16384M", "is not <device>=<limit>", id="no-device"),
    pytest.param("0=16384", "unit ''", id="no-unit"),
    pytest.param("0=16k", "unit 'k'", id="unknown-unit"),
    pytest.param("0=-1M", "is not <device>=<limit>", id="negative"),
    pytest.param("0=0M", "allows no memory", id="zero"),
    pytest.param("0=1G,0=2G", "named twice", id="twice"),
    pytest.param("0=1.5G", "is not <device>=<limit>", id="fraction"),
])
def test_malformed_values_are_refused_naming_the_value(value: str, says: str) -> None:
    with pytest.raises(MpsEnvError) as caught:
        parse_pinned_memory(value)
    assert f"{PINNED_MEMORY_ENV}={value!r}" in str(caught.value) and says in str(caught.value)


def test_the_limit_of_one_device() -> None:
    env = {PINNED_MEMORY_ENV: "0=8G,1=1G,GPU-abc=4G"}
    assert pinned_memory_mib(env) == 8192
    assert pinned_memory_mib(env, 1) == 1024
    assert pinned_memory_mib(env, 0, "GPU-abc") == 4096  # both name the device: the narrower holds
    assert pinned_memory_mib(env, 2) is None
    assert pinned_memory_mib({}) is None
    with pytest.raises(MpsEnvError, match="0=lots"):
        pinned_memory_mib({PINNED_MEMORY_ENV: "0=lots"})


def test_a_limit_below_a_mib_cannot_be_written() -> None:
    with pytest.raises(MpsEnvError, match="at least 1 MiB"):
        pinned_memory_value(0)
