"""Issue 33, item 4: devices of one node's pool allocated on another node are not charged to that pool.

A compromised agent on node ``b`` published a slice with ``nodeName: b`` and ``pool.name: a``
copying ``a``'s devices; kube-scheduler allocated them to pods running on ``b``, and the controller
charged ``a``'s real GPUs. The admission policy now refuses such a slice; the controller's reading
of allocations (``controller.state.dra_usage``) also refuses to count a result whose pool is not the node
the allocation is confined to, and names it.
"""

from __future__ import annotations

from typing import Any

import pytest

from controller.state.dra_usage import read_usage
from controller.state.build import node_from_objects
from sharing.dra import names
from sharing.dra.results import allocated_node
from tests.unit.test_controller_dra import gpunode, node_object


def _on(node: str) -> dict[str, Any]:
    """A ``status.allocation.nodeSelector`` as kube-scheduler writes it for a node's slice."""
    return {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}


def _claim(name: str, pool: str, on: str | None) -> dict[str, Any]:
    result = {"request": "gpu-0", "driver": names.DRIVER, "pool": pool, "device": "gpu-1-shared",
              "consumedCapacity": {names.MILLI: "500", names.MEMORY: "10Gi"}}
    allocation: dict[str, Any] = {"devices": {"results": [result]}}
    if on is not None:
        allocation["nodeSelector"] = _on(on)
    return {"metadata": {"namespace": "t", "name": name}, "status": {"allocation": allocation}}


def test_a_result_of_another_nodes_pool_is_not_counted_and_is_named() -> None:
    nodes = [n for n in (node_from_objects(gpunode(x, 2), node_object(x)) for x in ("a", "b")) if n is not None]
    usage = read_usage([_claim("forged", pool="a", on="b"), _claim("honest", pool="a", on="a"),
                        _claim("unconfined", pool="b", on=None)], nodes)
    assert [(h.claim, h.node) for h in usage.holds] == [("t/honest", "a"), ("t/unconfined", "b")]
    (problem,) = usage.problems
    assert "t/forged" in problem and "pool a" in problem and "on node b" in problem
    assert set(usage.claims) == {"t/forged", "t/honest", "t/unconfined"}  # its record is still read


@pytest.mark.parametrize("selector, node", [
    (_on("n1"), "n1"),
    (None, None),
    ({}, None),
    ({"nodeSelectorTerms": []}, None),
    ({"nodeSelectorTerms": [_on("n1")["nodeSelectorTerms"][0], _on("n2")["nodeSelectorTerms"][0]]}, None),
    ({"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1", "n2"]}]}]},
     None),
    ({"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["n1"]}]}]},
     None),
    ({"nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z"]}]}]}, None),
    ({"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [7]}]}]}, None),
    ("not a map", None),
])
def test_the_node_an_allocation_is_confined_to(selector: Any, node: str | None) -> None:
    assert allocated_node({"nodeSelector": selector} if selector is not None else {}) == node
    assert allocated_node(["not", "a", "map"]) is None
