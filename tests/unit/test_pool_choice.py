"""Which node pool a pod goes to (sharing.admission.pool_choice), and the inventory's pools it reads."""

from __future__ import annotations

from typing import Any

import pytest

from sharing.admission.inventory import Inventory, build_inventory
from sharing.admission.pool_choice import UnknownBackend, choose_pool
from webhook.inventory_source import load_objects
from webhook.inventory_watch import DRA_NODES_SELECTOR, kept

A100 = "NVIDIA-A100-SXM4-80GB"


def gpunode(name: str) -> dict[str, Any]:
    return {"kind": "GPUNode", "metadata": {"name": name},
            "status": {"product": A100, "gpus": [{"index": 0, "uuid": "GPU-0", "product": A100, "memoryMiB": 81920}],
                       "sharing": {"mode": "mps", "replicas": 4}}}


def node(name: str, backend: str | None) -> dict[str, Any]:
    labels = {"gpupack.io/backend": backend} if backend is not None else {"other": "x"}
    return {"kind": "Node", "metadata": {"name": name, "labels": labels}}


def namespace(name: str, backend: str | None) -> dict[str, Any]:
    return {"kind": "Namespace", "metadata": {"name": name, "labels": {"gpupack.io/backend": backend} if backend else {}}}


def cluster(*pools: str | None, extra: list[dict[str, Any]] | None = None) -> Inventory:
    """One GPU node per entry, its Node labelled with that backend (None: no label)."""
    objects: list[dict[str, Any]] = []
    for i, backend in enumerate(pools):
        objects += [gpunode(f"n{i}"), node(f"n{i}", backend)]
    return build_inventory(objects + (extra or []))


# ------------------------------------------------------------------ the inventory's pools
def test_a_gpunode_takes_the_backend_of_its_node() -> None:
    inventory = cluster("dra", "device-plugin", None)
    assert {n.name: n.backend for n in inventory.nodes} == {"n0": "dra", "n1": "device-plugin", "n2": "device-plugin"}
    assert [n.name for n in inventory.pool("dra").nodes] == ["n0"]
    assert [n.name for n in inventory.pool("device-plugin").nodes] == ["n1", "n2"]


def test_a_gpunode_without_node_or_with_a_bad_label_is_in_the_default_pool() -> None:
    inventory = build_inventory([gpunode("lonely"), gpunode("typo"), node("typo", "dra2")])
    assert {n.backend for n in inventory.nodes} == {"device-plugin"}
    assert inventory.pool("device-plugin") is inventory  # nothing to filter: the same snapshot
    assert inventory.pool("dra").nodes == ()


def test_pools_keep_policies_namespaces_and_sync_state() -> None:
    inventory = build_inventory([gpunode("a"), node("a", "dra"), gpunode("b"), namespace("ml", "dra")], synced=False)
    pool = inventory.pool("dra")
    assert pool.namespace_labels == inventory.namespace_labels and pool.synced is False
    assert inventory.pool("dra") is pool  # remembered per snapshot


def test_inventory_file_may_hold_nodes(tmp_path: Any) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text("- {kind: Node, metadata: {name: n0, labels: {gpupack.io/backend: dra}}}\n"
                    "- {kind: GPUNode, metadata: {name: n0}}\n")
    assert build_inventory(load_objects(path)).nodes[0].backend == "dra"


def test_the_watch_keeps_only_a_nodes_name_and_labels() -> None:
    watched = {"metadata": {"name": "n0", "labels": {"gpupack.io/backend": "dra"}, "uid": "u", "resourceVersion": "7"},
               "status": {"images": [{"names": ["x"] * 50}]}}
    node = kept("Node", watched)
    assert node == {"kind": "Node", "metadata": {"name": "n0", "labels": {"gpupack.io/backend": "dra"},
                                                 "resourceVersion": "7"}}
    assert build_inventory([node, gpunode("n0")]).nodes[0].backend == "dra"
    assert kept("GPUNode", {"metadata": {"name": "n0", "managedFields": [{}]}, "status": {"x": 1}}) == {
        "kind": "GPUNode", "metadata": {"name": "n0"}, "status": {"x": 1}}
    assert DRA_NODES_SELECTOR == "gpupack.io/backend=dra"


# ------------------------------------------------------------------ the choice
CASES = [
    # (pod label, namespace label, pools of the cluster's GPU nodes, expected backend, expected source)
    ("dra", None, ("device-plugin",), "dra", "pod label"),
    ("device-plugin", "dra", ("dra",), "device-plugin", "pod label"),
    (None, "dra", ("device-plugin",), "dra", "namespace 'ml' label"),
    (None, "device-plugin", ("dra",), "device-plugin", "namespace 'ml' label"),
    (None, None, ("dra", "dra"), "dra", "every GPU node"),
    (None, None, ("dra", None), "device-plugin", "default"),
    (None, None, ("device-plugin",), "device-plugin", "default"),
    (None, None, (), "device-plugin", "default"),
]


@pytest.mark.parametrize(("pod", "ns", "pools", "backend", "source"), CASES,
                         ids=["pod-label", "pod-label-beats-namespace", "namespace-label", "namespace-device-plugin",
                              "auto-all-dra", "auto-mixed", "auto-device-plugin", "auto-empty"])
def test_pool_choice(pod: str | None, ns: str | None, pools: tuple[str | None, ...], backend: str, source: str) -> None:
    inventory = cluster(*pools, extra=[namespace("ml", ns)])
    choice = choose_pool({"gpupack.io/backend": pod} if pod else {"app": "x"}, "ml", inventory)
    assert choice.backend == backend and source in choice.why


@pytest.mark.parametrize(("pod", "ns", "where"), [("DRA", None, "pod"), (None, "gpu", "namespace 'ml'")])
def test_a_label_that_names_no_backend_is_refused(pod: str | None, ns: str | None, where: str) -> None:
    inventory = cluster("dra", extra=[namespace("ml", ns)])
    with pytest.raises(UnknownBackend) as info:
        choose_pool({"gpupack.io/backend": pod} if pod else None, "ml", inventory)
    message = info.value.message
    assert message.startswith(f"{where} label gpupack.io/backend=")
    assert "valid values: device-plugin, dra" in message and info.value.reason == "UnknownBackend"


def test_a_namespace_the_inventory_does_not_know_falls_through_to_automatic() -> None:
    assert choose_pool(None, "unknown", cluster("dra")).backend == "dra"
