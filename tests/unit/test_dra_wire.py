"""gpupack's DRA objects as the API's JSON (``sharing.dra.wire``) and the shipped DeviceClasses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from mig.catalog import get_model
from sharing.dra import names, wire
from sharing.dra.gpu_devices import shared_gpu
from sharing.dra.mig_devices import mig_gpu
from sharing.dra.slices import node_slices

ROOT = Path(__file__).resolve().parents[2]
H100 = get_model("H100-80GB")
MiB = 2**20


@pytest.mark.parametrize(("value", "text"), [
    (0, "0"), (1, "1"), (7, "7"), (1000, "1000"), (2**30, "1Gi"), (79 * 2**30, "79Gi"), (81559 * MiB, "81559Mi"),
    (9984 * MiB, "9984Mi"), (3072, "3Ki"), (1536, "1536"), (2**40, "1Ti"),
])
def test_quantities(value: int, text: str) -> None:
    assert wire.quantity(value) == text


def test_the_shipped_device_classes_are_the_ones_the_code_names() -> None:
    shipped = list(yaml.safe_load_all((ROOT / "manifests" / "dra" / "deviceclasses.yaml").read_text()))
    assert shipped == wire.device_classes()
    assert [c["metadata"]["name"] for c in shipped] == ["gpupack-mig", "gpupack-gpu", "gpupack-shared"]
    kustomization = yaml.safe_load((ROOT / "manifests" / "dra" / "kustomization.yaml").read_text())
    assert kustomization["resources"] == ["deviceclasses.yaml"]


def test_class_selectors_check_the_driver_before_the_kind() -> None:
    assert names.class_selector("mig") == (
        'device.driver == "gpu.gpupack.io" && device.attributes["gpu.gpupack.io"].kind == "mig"')


def test_a_counter_slice_as_json() -> None:
    counters = node_slices("node-a", [mig_gpu(H100, 0, "GPU-0")], generation=4, owner_uid="uid-1")[0]
    body = wire.slice_json(counters)
    assert body["apiVersion"] == "resource.k8s.io/v1" and body["kind"] == "ResourceSlice"
    assert body["metadata"] == {"name": "node-a-gpu.gpupack.io-counters-000", "ownerReferences": [
        {"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": "uid-1", "controller": True}]}
    spec = body["spec"]
    assert spec["pool"] == {"name": "node-a", "generation": 4, "resourceSliceCount": 2}
    assert spec["driver"] == "gpu.gpupack.io" and spec["nodeName"] == "node-a" and "devices" not in spec
    (counter_set,) = spec["sharedCounters"]
    assert counter_set["name"] == "gpu-0"
    assert counter_set["counters"]["compute-slices"] == {"value": "7"}
    assert counter_set["counters"]["memory-slice-7"] == {"value": "1"}


def test_a_mig_device_as_json() -> None:
    devices = node_slices("node-a", [mig_gpu(H100, 0, "GPU-0")])[1]
    body = wire.slice_json(devices)
    assert "ownerReferences" not in body["metadata"] and "sharedCounters" not in body["spec"]
    device = next(d for d in body["spec"]["devices"] if d["name"] == "gpu-0-mig-3g-40gb-4")
    assert device["attributes"]["gpu.gpupack.io/profile"] == {"string": "3g.40gb"}
    assert device["attributes"]["gpu.gpupack.io/placementStart"] == {"int": 4}
    assert device["attributes"]["gpu.gpupack.io/mediaExtensions"] == {"bool": False}
    assert device["capacity"] == {"gpu.gpupack.io/memory": {"value": f"{H100.profile('3g.40gb').memory_mib}Mi"}}
    assert device.get("consumesCounters") == [{"counterSet": "gpu-0", "counters": {
        "memory-slice-4": {"value": "1"}, "memory-slice-5": {"value": "1"}, "memory-slice-6": {"value": "1"},
        "memory-slice-7": {"value": "1"}, "compute-slices": {"value": "3"}}}]
    assert "allowMultipleAllocations" not in device


def test_a_shared_device_as_json() -> None:
    (item,) = node_slices("node-b", [shared_gpu(0, "GPU-s", H100.product, 81559 * MiB, "mps")])
    (device,) = wire.slice_json(item)["spec"]["devices"]
    assert device.get("allowMultipleAllocations") is True and "consumesCounters" not in device
    assert device["capacity"] == {
        "gpu.gpupack.io/milli": {"value": "1000", "requestPolicy": {
            "default": "50", "validRange": {"min": "50", "max": "1000", "step": "50"}}},
        "gpu.gpupack.io/memory": {"value": "81559Mi", "requestPolicy": {
            "default": "1Gi", "validRange": {"min": "1Gi", "max": "79Gi", "step": "1Gi"}}},
    }


def test_the_same_inputs_give_the_same_json() -> None:
    def render() -> str:
        slices = node_slices("n", [mig_gpu(H100, i, f"GPU-{i}") for i in range(8)], generation=2)
        return json.dumps([wire.slice_json(s) for s in slices])

    assert render() == render()
