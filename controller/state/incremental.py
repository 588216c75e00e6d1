"""The cycle's snapshot, re-reading only the objects that changed since the previous cycle.

:func:`controller.state.build.build_snapshot` reads every GPUNode, Node and pod
afresh; at a thousand nodes that reading is most of a cycle, although between
two cycles a few objects change. :class:`SnapshotCache` keeps each object's
reading (``parse_node``, ``parse_pod``: functions of the objects alone) under
the object's ``resourceVersion`` and reads again only what the API server
changed; :func:`controller.state.build.assemble`, shared with the from-scratch
build, then puts the cycle together, so both give the same snapshot
(``tests/unit/test_controller_snapshot_cache.py`` checks it after random changes).

Keys:

* a GPUNode's reading: its ``resourceVersion``, its idle record (which the
  controller itself changes in a copy before the API server answers, see
  ``controller.reconcile``) and its Node's ``resourceVersion``;
* a pod's: its ``uid`` and ``resourceVersion``;
* the merged policies: every policy's ``resourceVersion`` and every node's name,
  labels and model.

An object without a ``resourceVersion`` (hand-made, in tests) is read every time.
Readings of objects that are gone are dropped at the next build.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from controller.state.build import NodeParse, PodParse, PolicyMerge, SnapshotReader, merge_policies, parse_node, parse_pod
from controller.state.build import object_meta as _meta
from controller.state.snapshot import Node
from sharing.api.keys import IDLE_SINCE_ANNOTATION
from sharing.api.fields import as_map as _map
from sharing.rules.node_policy import NodePolicy

NodeKey = tuple[str, str, str]
PolicyKey = tuple[tuple[str, str], ...]


class SnapshotCache(SnapshotReader):
    """Builds snapshots like ``build_snapshot``, keeping the readings of unchanged objects."""

    def __init__(self) -> None:
        self._nodes: dict[str, tuple[NodeKey, NodeParse | None]] = {}
        self._pods: dict[str, tuple[tuple[str, str], PodParse]] = {}
        self._policy_key: tuple[PolicyKey, tuple[tuple[object, ...], ...]] | None = None
        self._policies: dict[str, NodePolicy] = {}
        self.parsed_nodes = 0
        """GPUNodes read by the last build (the rest came from the cache)."""
        self.parsed_pods = 0
        """Pods read by the last build."""

    def read_policies(self, policies: list[Mapping[str, Any]]) -> PolicyMerge:
        # Merged again only when a policy or a node's labels or model changed (``_merged``).
        return lambda built: self._merged(policies, built)

    def read_nodes(self, gpunodes: Iterable[Mapping[str, Any]],
                   node_objs: Mapping[str, Mapping[str, Any]]) -> list[NodeParse | None]:
        kept: dict[str, tuple[NodeKey, NodeParse | None]] = {}
        out: list[NodeParse | None] = []
        self.parsed_nodes = 0
        for gpunode in gpunodes:
            meta = _meta(gpunode)
            name = str(meta.get("name"))
            node = node_objs.get(name)
            version = str(meta.get("resourceVersion") or "")
            node_version = str(_meta(node).get("resourceVersion") or "") if node is not None else "-"
            idle = _map(meta.get("annotations")).get(IDLE_SINCE_ANNOTATION)
            key: NodeKey = (version, str(idle), node_version)
            cached = self._nodes.get(name)
            if cached is not None and cached[0] == key and version and node_version:
                parse = cached[1]
            else:
                parse = parse_node(gpunode, node)
                self.parsed_nodes += 1
            if version and node_version and name not in kept:
                kept[name] = (key, parse)
            out.append(parse)
        self._nodes = kept
        return out

    def read_pods(self, pods: Iterable[Mapping[str, Any]]) -> list[PodParse]:
        kept: dict[str, tuple[tuple[str, str], PodParse]] = {}
        out: list[PodParse] = []
        self.parsed_pods = 0
        for obj in pods:
            meta = _meta(obj)
            name = f"{meta.get('namespace')}/{meta.get('name')}"
            version = str(meta.get("resourceVersion") or "")
            key = (str(meta.get("uid") or ""), version)
            cached = self._pods.get(name)
            if cached is not None and cached[0] == key and version:
                parse = cached[1]
            else:
                parse = parse_pod(obj)
                self.parsed_pods += 1
            if version and name not in kept:
                kept[name] = (key, parse)
            out.append(parse)
        self._pods = kept
        return out

    def _merged(self, policies: list[Mapping[str, Any]], nodes: tuple[Node, ...]) -> dict[str, NodePolicy]:
        versions = tuple((str(_meta(p).get("name")), str(_meta(p).get("resourceVersion") or "")) for p in policies)
        shape = tuple((n.name, n.labels, n.model) for n in nodes)
        key = (versions, shape)
        if all(v for _, v in versions) and key == self._policy_key:
            return dict(self._policies)
        merged = merge_policies(policies)(nodes)
        self._policy_key, self._policies = key, merged
        return dict(merged)


__all__ = ["SnapshotCache"]
