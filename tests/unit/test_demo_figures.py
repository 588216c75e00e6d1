"""The demo's two ratios: what bound pods asked for (allocation) and what their devices reserve (occupied)."""

from __future__ import annotations

from typing import Any

import pytest

from gpupack.demo.progress import figures
from sharing.api.allocation import Allocation, ContainerAllocation
from sharing.api.keys import ALLOCATION_ANNOTATION
from sharing.api.modes import AllocationMode

PRODUCT = "NVIDIA-H100-80GB-HBM3"


def _pod(name: str, mode: AllocationMode, milli: int, *, node: str | None = None, gated: bool = False,
         profile: str | None = None) -> dict[str, Any]:
    resource = f"nvidia.com/mig-{profile}" if profile else "nvidia.com/gpu.shared"
    allocation = Allocation(  # the webhook's own writer
        mode=mode, gated=gated, capacity_existed=not gated, policy="p", reason="r",
        containers=(ContainerAllocation("c", "containers", milli, None, resource, profile),),
    )
    # As the webhook leaves it: the container requests what the record says.
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {"limits": {resource: "1"}}}]}
    if node:
        spec["nodeName"] = node
    if gated:
        spec["schedulingGates"] = [{"name": "gpupack.io/capacity"}]
    return {"metadata": {"name": name, "namespace": "demo", "creationTimestamp": "2026-11-30T01:00:00Z",
                         "annotations": {ALLOCATION_ANNOTATION: allocation.to_annotation()}},
            "spec": spec, "status": {"phase": "Pending"}}


def _mig_node(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "generation": 1}, "spec": {"sharing": {"mode": "none", "replicas": 1}},
            "status": {"observedGeneration": 1, "product": PRODUCT, "gpus": [
                {"index": 0, "product": PRODUCT, "memoryMiB": 81559, "migEnabled": True,
                 "instances": [{"profile": "1g.10gb", "start": 0, "size": 1},
                               {"profile": "3g.40gb", "start": 4, "size": 4}]},
                {"index": 1, "product": PRODUCT, "memoryMiB": 81559, "migEnabled": False}]}}


def _mps_node(name: str) -> dict[str, Any]:
    sharing = {"mode": "mps", "replicas": 4}
    return {"metadata": {"name": name, "generation": 1}, "spec": {"sharing": sharing},
            "status": {"observedGeneration": 1, "product": PRODUCT, "sharing": sharing, "gpus": [
                {"index": 0, "product": PRODUCT, "memoryMiB": 81559, "migEnabled": False}]}}


def test_allocation_counts_asked_milli_and_occupied_counts_reserved_devices() -> None:
    pods = [
        _pod("small", "mig", 100, node="mig-a", profile="1g.10gb"),  # holds a 1g instance: 1/7 of a GPU
        _pod("shared", "mps", 200, node="mps-a"),  # holds one of 4 replicas: 1/4 of a GPU
        _pod("waiting", "mig", 450, gated=True, profile="4g.40gb"),  # not placed: counts in neither
    ]
    out = figures([_mig_node("mig-a"), _mps_node("mps-a")], [], pods)
    gpus = 3
    assert out.allocation_ratio == pytest.approx((100 + 200) / (gpus * 1000))
    assert out.occupied_ratio == pytest.approx((1 / 7 + 1 / 4) / gpus)
    assert out.occupied_ratio >= out.allocation_ratio > 0


def test_no_gpus_means_zero_ratios() -> None:
    out = figures([], [], [_pod("lonely", "mps", 200, node="nowhere")])
    assert (out.allocation_ratio, out.occupied_ratio) == (0.0, 0.0)
