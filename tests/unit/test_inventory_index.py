"""sharing.admission.inventory_index: each grouped answer equals asking the nodes one by one (random snapshots)."""

from __future__ import annotations

import itertools
import random

import pytest

from sharing.admission.inventory import Inventory, NodeView, build_inventory
from tests.unit.test_inventory_parts import gpunode

PROFILES = ("1g.10gb", "3g.40gb", "2g.20gb")


def snapshot(seed: int, nodes: int = 40) -> Inventory:
    rng = random.Random(seed)
    return build_inventory([gpunode(rng, f"n{i:02d}", i + 1) for i in range(nodes)])


def shared(inventory: Inventory, mode: str) -> list[NodeView]:
    return [n for n in inventory.nodes if n.sharing == mode and n.replicas >= 1]


@pytest.mark.parametrize("seed", range(12))
def test_grouped_answers_equal_node_by_node_answers(seed: int) -> None:
    inventory = snapshot(seed)
    index = inventory.index
    nodes = inventory.nodes
    assert index.full_gpu_shapes == tuple(sorted({(n.full_gpus, n.gpu_memory_mib) for n in nodes}))
    assert index.most_full_gpus == max((n.full_gpus for n in nodes), default=0)
    assert index.has_whole_gpu_nodes == any(n.sharing == "none" and n.full_gpus > 0 for n in nodes)
    for model in inventory.mig_models:
        of_model = [n for n in nodes if n.model is model]
        assert index.mig_host_gpus(model.product) == tuple(sorted({len(n.gpus) for n in of_model}))
        assert index.mig_room(model.product) == any(n.mig_room for n in of_model)
        for counts in itertools.product(range(3), repeat=len(PROFILES)):
            need = {p: c for p, c in zip(PROFILES, counts) if c}
            expected = any(all(n.free_instances(p) >= c for p, c in need.items()) for n in of_model)
            assert index.mig_free(model.product, need) == expected, need
    for mode in ("mps", "time-slicing"):
        groups = index.shared_groups(mode)
        members = [n for g in groups for n in g.nodes]
        assert sorted(n.name for n in members) == sorted(n.name for n in shared(inventory, mode))
        for g in groups:
            assert all((n.replicas, n.gpu_memory_mib, n.product) == (g.replicas, g.gpu_memory_mib, g.product)
                       for n in g.nodes)
            assert g.most_free == max(n.shared_free for n in g.nodes)
            for free in range(0, 6):
                with_room = sorted(n.name for n in g.nodes if n.shared_free >= free)
                assert g.first_name(free) == (with_room[0] if with_room else "")


def test_a_pool_has_its_own_index() -> None:
    objects = [gpunode(random.Random(3), "a", 1), gpunode(random.Random(4), "b", 2),
               {"kind": "Node", "metadata": {"name": "b", "labels": {"gpupack.io/backend": "dra"}}}]
    inventory = build_inventory(objects).prepare()
    dra = inventory.pool("dra")
    assert [n.name for n in dra.nodes] == ["b"]
    assert dra.index is not inventory.index and "index" in dra.__dict__  # prepared: worked out already
