"""Request parsing and validation: quantities, ranges, mixed resources, containers."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sharing.api.request import (
    AdmissionRefusal,
    Reason,
    parse_milli,
    parse_pod,
    parse_quantity,
)
from gpupack.testing.admission_reviews import gpu_container, make_pod


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("250", Decimal(250)),
        ("250m", Decimal("0.25")),
        ("1e3", Decimal(1000)),
        ("1E3", Decimal(1000)),
        ("0.5", Decimal("0.5")),
        ("20Gi", Decimal(20 * 2**30)),
        ("1.5Gi", Decimal(3 * 2**29)),
        ("40G", Decimal(40 * 10**9)),
        ("1k", Decimal(1000)),
        ("512Mi", Decimal(512 * 2**20)),
        (".5", Decimal("0.5")),
        (7, Decimal(7)),
        (2.5, Decimal("2.5")),
        # Exa: "E" alone and "Ei" are suffixes, not exponents (both used to raise ValueError, a 500).
        ("1E", Decimal(10**18)),
        ("1Ei", Decimal(2**60)),
        ("1.5Ei", Decimal(3 * 2**59)),
        ("2E3", Decimal(2000)),
        ("1E-2", Decimal("0.01")),
    ],
    ids=str,
)
def test_quantities(text: object, expected: Decimal) -> None:
    assert parse_quantity(text, what="x") == expected


@pytest.mark.parametrize(
    "text", ["", "abc", "20GB", "1..2", "--1", "1e", "Gi", "1 Gi", "1e999", True, None, [1], "9" * 70, float("nan")], ids=repr
)
def test_bad_quantities_name_the_value(text: object) -> None:
    with pytest.raises(AdmissionRefusal) as info:
        parse_quantity(text, what="container 'c': gpupack.io/gpu-memory")
    assert info.value.reason == Reason.INVALID_QUANTITY
    assert "gpupack.io/gpu-memory" in info.value.message


@given(st.integers(min_value=0, max_value=10**6), st.sampled_from(["", "k", "M", "G", "Ki", "Mi", "Gi"]))
@settings(max_examples=100)
def test_integer_quantities_round_trip(number: int, suffix: str) -> None:
    scale = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}[suffix]
    assert parse_quantity(f"{number}{suffix}", what="x") == number * scale


@pytest.mark.parametrize(("value", "milli"), [("1", 1), ("1000", 1000), ("1e3", 1000), ("1k", 1000), (250, 250), ("250000m", 250)])
def test_milli_in_range(value: object, milli: int) -> None:
    assert parse_milli(value, container="c") == milli


@pytest.mark.parametrize("value", ["0", "1001", "-5", "0.5", "250m", "2k", "1500", "1E", "1Ei", "1P"])
def test_milli_out_of_range_or_fractional(value: str) -> None:
    with pytest.raises(AdmissionRefusal) as info:
        parse_milli(value, container="worker")
    assert info.value.reason == Reason.MILLI_OUT_OF_RANGE
    assert "'worker'" in info.value.message and "1..1000" in info.value.message


def refusal(pod: dict) -> AdmissionRefusal:
    with pytest.raises(AdmissionRefusal) as info:
        parse_pod(pod)
    return info.value


def test_pod_without_gpupack_resources_is_none() -> None:
    pod = make_pod({"name": "web", "image": "nginx", "resources": {"limits": {"cpu": "1", "nvidia.com/gpu": "1"}}})
    assert parse_pod(pod) is None


def test_parses_containers_and_init_containers_in_order() -> None:
    pod = make_pod(
        {"name": "sidecar", "image": "x"},
        gpu_container("main", "300", "10Gi"),
        init=[gpu_container("warmup", "100")],
        mode="mps",
    )
    request = parse_pod(pod)
    assert request is not None
    assert request.mode == "mps"
    assert [(c.kind, c.index, c.name, c.milli, c.memory_bytes) for c in request.containers] == [
        ("initContainers", 0, "warmup", 100, None),
        ("containers", 1, "main", 300, 10 * 2**30),
    ]


def test_mixed_gpupack_and_nvidia_resources_refused() -> None:
    container = gpu_container("c", "250")
    container["resources"]["limits"]["nvidia.com/gpu"] = "1"
    error = refusal(make_pod(container))
    assert error.reason == Reason.MIXED_RESOURCES
    assert "nvidia.com/gpu" in error.message


def test_mixing_across_containers_is_fine() -> None:
    other = {"name": "whole", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
    request = parse_pod(make_pod(gpu_container("part", "250"), other))
    assert request is not None and [c.name for c in request.containers] == ["part"]


def test_requests_must_equal_limits() -> None:
    container = gpu_container("c", "250")
    container["resources"]["requests"] = {"gpupack.io/gpu-milli": "200"}
    error = refusal(make_pod(container))
    assert error.reason == Reason.REQUESTS_LIMITS_MISMATCH
    assert "200" in error.message and "250" in error.message


def test_equal_requests_in_another_spelling_are_fine() -> None:
    container = gpu_container("c", "1k", "20Gi")
    container["resources"]["requests"] = {"gpupack.io/gpu-milli": "1000", "gpupack.io/gpu-memory": "20480Mi"}
    request = parse_pod(make_pod(container))
    assert request is not None and request.containers[0].milli == 1000


def test_requests_without_limits_refused() -> None:
    pod = make_pod({"name": "c", "image": "x", "resources": {"requests": {"gpupack.io/gpu-milli": "250"}}})
    assert refusal(pod).reason == Reason.REQUESTS_LIMITS_MISMATCH


def test_unknown_gpupack_resource_names_valid_ones() -> None:
    pod = make_pod({"name": "c", "image": "x", "resources": {"limits": {"gpupack.io/gpu-mili": "250"}}})
    error = refusal(pod)
    assert error.reason == Reason.UNKNOWN_RESOURCE
    assert "gpupack.io/gpu-milli" in error.message


def test_memory_without_milli_refused() -> None:
    pod = make_pod({"name": "c", "image": "x", "resources": {"limits": {"gpupack.io/gpu-memory": "10Gi"}}})
    assert refusal(pod).reason == Reason.MISSING_MILLI


def test_zero_or_fractional_memory_refused() -> None:
    assert refusal(make_pod(gpu_container("c", "250", "0"))).reason == Reason.INVALID_QUANTITY
    assert refusal(make_pod(gpu_container("c", "250", "0.5"))).reason == Reason.INVALID_QUANTITY


def test_ephemeral_container_with_gpu_request_refused() -> None:
    pod = make_pod(gpu_container("main", "250"))
    pod["spec"]["ephemeralContainers"] = [gpu_container("debug", "100")]
    error = refusal(pod)
    assert error.reason == Reason.EPHEMERAL_CONTAINER and "'debug'" in error.message


def test_unknown_mode_lists_valid_modes() -> None:
    error = refusal(make_pod(gpu_container(), mode="vgpu"))
    assert error.reason == Reason.UNKNOWN_MODE
    assert "auto, mig, mps, time-slicing" in error.message


@pytest.mark.parametrize(
    "spec",
    [{"containers": "nope"}, {"containers": ["nope"]}, {"containers": [{"name": "c", "resources": []}]}],
    ids=["containers-not-list", "container-not-map", "resources-not-map"],
)
def test_malformed_specs_refused(spec: dict) -> None:
    pod = {"metadata": {"name": "p"}, "spec": spec}
    pod["spec"].setdefault("initContainers", [gpu_container()])
    assert refusal(pod).reason == Reason.MALFORMED_POD
