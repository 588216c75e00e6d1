"""An :class:`~sharing.admission.inventory.Inventory` kept object by object, for a view kept by watches.

``build_inventory`` reads every object it is given. A watch hands over one object
at a time, and at fleet size (thousands of GPUNodes, each patched by its agent
about once a minute) reading them all again per event costs the whole cluster
per event. :class:`InventoryParts` keeps what each object contributes, read
once when the object changes:

* a GPUNode's view (``sharing.admission.inventory.node_view``), by name, with the
  ``resourceVersion`` it was read at: an object at a version already read costs
  a dict lookup; a new version is read (that object only) and compared with the
  view it replaces;
* a Node's pool (of its labels only ``gpupack.io/backend`` matters), a
  Namespace's labels, a SharingPolicy's reading (``sharing.api.crd.read_policies``).

:meth:`InventoryParts.put` and :meth:`InventoryParts.delete` say whether the
change reached anything an Inventory holds. A heartbeat (the agent rewrites its
status: ``heartbeatTime`` and the utilisation samples move, nothing else) does
not, so the caller publishes no new snapshot and what was decided against the
current one (``sharing.admission.decision.DecisionMemo``) stays valid.

:meth:`InventoryParts.snapshot` assembles an Inventory equal to
``build_inventory`` over the same objects (``tests/unit/test_inventory_parts.py``
checks it on random sequences of changes). Assembling passes over views already
read (a tuple of references, cached until a node changes), never reads an object.

Not thread-safe: its owner serialises calls (``webhook.inventory_source``).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from sharing.api.backend import DEFAULT_BACKEND, Backend, node_backend
from sharing.api.crd import PolicyEntry, SharingPolicySpec, read_policies
from sharing.api.gpunode import read_gpunode
from sharing.admission.inventory import Inventory, NodeView, name_and_labels, node_view, policy_fields

KINDS = ("GPUNode", "SharingPolicy", "Namespace", "Node")
"""The kinds an Inventory is built from (an object without ``kind`` is a GPUNode, as for ``build_inventory``)."""


@dataclass(frozen=True)
class _Read:
    """One GPUNode as read: the version it was read at, its view (the default pool's) and what was left out."""

    version: str
    view: NodeView
    skipped: tuple[str, ...]


def _kind(obj: Mapping[str, Any]) -> str:
    kind = obj.get("kind", "GPUNode")
    return kind if isinstance(kind, str) else ""


def _version(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    version = meta.get("resourceVersion") if isinstance(meta, Mapping) else None
    return version if isinstance(version, str) else ""


def _name(obj: Mapping[str, Any]) -> str | None:
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    return name if isinstance(name, str) else None


class InventoryParts:
    """What each watched object contributes to the inventory, updated one object at a time."""

    def __init__(self) -> None:
        self._read: dict[str, _Read] = {}
        self._names: list[str] = []
        """GPUNode names, sorted: the order of :attr:`Inventory.nodes`."""
        self._views: dict[str, NodeView] = {}
        """Each GPUNode's view in its pool."""
        self._with_skipped: set[str] = set()
        self._pools: dict[str, Backend] = {}
        """Each watched Node's pool, by name."""
        self._namespaces: dict[str, Mapping[str, str]] = {}
        self._policies: dict[str, tuple[str, PolicyEntry]] = {}
        """Each SharingPolicy's reading, by name, with the version it was read at."""
        # Parts of the last snapshot, reused until their inputs change.
        self._nodes: tuple[NodeView, ...] | None = None
        self._skipped_entries: tuple[str, ...] | None = None
        self._namespace_labels: dict[str, Mapping[str, str]] | None = None
        self._policy_fields: tuple[tuple[tuple[str, SharingPolicySpec], ...], tuple[str, ...]] | None = None
        self.reads = 0
        """GPUNode objects read so far (a put at a version already read reads nothing)."""

    # ------------------------------------------------------------------ changes
    def put(self, obj: Mapping[str, Any]) -> bool:
        """An object added or modified; True when an Inventory built now differs."""
        kind = _kind(obj)
        if kind == "GPUNode":
            return self._put_gpunode(obj)
        if kind == "Node":
            name, labels = name_and_labels(obj)
            return name is not None and self._set_pool(name, node_backend(labels), present=True)
        if kind == "Namespace":
            name, labels = name_and_labels(obj)
            if name is None or self._namespaces.get(name) == labels and name in self._namespaces:
                return False
            self._namespaces[name] = labels
            self._namespace_labels = None
            return True
        if kind == "SharingPolicy":
            return self._put_policy(obj)
        return False

    def delete(self, obj: Mapping[str, Any]) -> bool:
        """An object deleted (only its kind and name are read); True when an Inventory built now differs."""
        kind, name = _kind(obj), _name(obj)
        if name is None:
            return False
        if kind == "GPUNode":
            if self._read.pop(name, None) is None:
                return False
            del self._views[name]
            del self._names[bisect.bisect_left(self._names, name)]
            self._with_skipped.discard(name)
            self._nodes_changed()
            return True
        if kind == "Node":
            return self._set_pool(name, DEFAULT_BACKEND, present=False)
        if kind == "Namespace":
            if self._namespaces.pop(name, None) is None:
                return False
            self._namespace_labels = None
            return True
        if kind == "SharingPolicy":
            if self._policies.pop(name, None) is None:
                return False
            self._policy_fields = None
            return True
        return False

    def reset(self, kind: str, objects: Iterable[Mapping[str, Any]]) -> bool:
        """Every object of ``kind`` is now ``objects`` (a fresh list): put each, delete the others."""
        present: set[str] = set()
        changed = False
        for obj in objects:
            name = _name(obj)
            if name is not None and _kind(obj) == kind:
                present.add(name)
                changed = self.put(obj) or changed
        for name in [n for n in self._names_of(kind) if n not in present]:
            changed = self.delete({"kind": kind, "metadata": {"name": name}}) or changed
        return changed

    # ------------------------------------------------------------------ reading
    def snapshot(self, *, synced: bool, version: int) -> Inventory:
        """The Inventory of what is held now (equal to ``build_inventory`` over the same objects)."""
        if self._nodes is None:
            self._nodes = tuple(self._views[n] for n in self._names)
        if self._skipped_entries is None:
            self._skipped_entries = tuple(line for n in sorted(self._with_skipped) for line in self._read[n].skipped)
        if self._namespace_labels is None:
            self._namespace_labels = dict(self._namespaces)
        if self._policy_fields is None:
            self._policy_fields = policy_fields(entry for _, (_, entry) in sorted(self._policies.items()))
        policies, skipped_policies = self._policy_fields
        return Inventory(
            nodes=self._nodes,
            policies=policies,
            namespace_labels=self._namespace_labels,
            synced=synced,
            version=version,
            skipped_policies=skipped_policies,
            skipped_entries=self._skipped_entries,
        )

    def __len__(self) -> int:
        """GPUNodes held."""
        return len(self._read)

    # ------------------------------------------------------------------ inside
    def _names_of(self, kind: str) -> list[str]:
        if kind == "GPUNode":
            return list(self._names)
        if kind == "Node":
            return list(self._pools)
        if kind == "Namespace":
            return list(self._namespaces)
        if kind == "SharingPolicy":
            return list(self._policies)
        return []

    def _nodes_changed(self) -> None:
        self._nodes = None
        self._skipped_entries = None

    def _put_gpunode(self, obj: Mapping[str, Any]) -> bool:
        version = _version(obj)
        name = _name(obj)
        before = self._read.get(name) if name is not None else None
        if before is not None and version and version == before.version:
            return False  # already read (a re-list hands every unchanged object over again)
        reading = read_gpunode(obj)
        if reading is None:  # no name: build_inventory leaves it out too
            return False
        self.reads += 1
        view = node_view(reading)
        self._read[reading.name] = _Read(version, view, reading.skipped)
        if before is not None and before.view == view and before.skipped == reading.skipped:
            return False  # a heartbeat: nothing an Inventory holds moved
        if before is None:
            bisect.insort(self._names, reading.name)
        if reading.skipped:
            self._with_skipped.add(reading.name)
        else:
            self._with_skipped.discard(reading.name)
        pool = self._pools.get(reading.name, DEFAULT_BACKEND)
        self._views[reading.name] = view if pool == DEFAULT_BACKEND else replace(view, backend=pool)
        self._nodes_changed()
        return True

    def _set_pool(self, name: str, pool: Backend, *, present: bool) -> bool:
        before = self._pools.get(name, DEFAULT_BACKEND)
        if present:
            self._pools[name] = pool
        else:
            self._pools.pop(name, None)
        read = self._read.get(name)
        if pool == before or read is None:
            return False
        self._views[name] = replace(read.view, backend=pool)
        self._nodes_changed()
        return True

    def _put_policy(self, obj: Mapping[str, Any]) -> bool:
        name, version = _name(obj), _version(obj)
        if name is None:
            return False
        before = self._policies.get(name)
        if before is not None and version and version == before[0]:
            return False
        entries = read_policies([obj])
        entry = entries[0]
        self._policies[name] = (version, entry)
        if before is not None and (before[1].spec, before[1].problem) == (entry.spec, entry.problem):
            return False  # only what an Inventory holds counts (not the generation)
        self._policy_fields = None
        return True
