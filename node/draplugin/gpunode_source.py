"""Where the plugin reads its node's GPUNode (the agent's report of faults): the API server, or a file.

``KubeGpuNodeSource`` needs ``get`` on ``gpunodes.gpupack.io``, which the
DaemonSet's ServiceAccount already has for the agent. ``FileGpuNodeSource`` is
for nodes without an API server (simulation, tests): the file holds the GPUNode
object as the API returns it, JSON or YAML, read again at every look, so a test
can write a fault while the plugin runs (atomically: the plugin may read at any
moment). A missing file reads as "no GPUNode".

Either raises :class:`GpuNodeUnreadable` when the object cannot be read; the
health stream then reports every device ``Unknown`` with that reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

import yaml

from kube.client import KubeClient
from kube.errors import KubeError
from kube.inputfile import read_text
from node.draplugin.health import NodeHealthView, node_view, unreadable
from node.base.kube import get_gpunode


class GpuNodeUnreadable(Exception):
    """The GPUNode could not be read (the message says why)."""


class GpuNodeSource(Protocol):
    def read(self, node: str) -> Mapping[str, Any] | None:
        """The GPUNode ``node``; None when there is none. Raises :class:`GpuNodeUnreadable`."""
        ...


class KubeGpuNodeSource(KubeClient):
    component = "gpupack-dra-plugin"

    def read(self, node: str) -> Mapping[str, Any] | None:
        try:
            return get_gpunode(self._custom, node)
        except KubeError as exc:
            raise GpuNodeUnreadable(str(exc)) from None


class FileGpuNodeSource:
    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self, node: str) -> Mapping[str, Any] | None:
        try:
            doc = yaml.safe_load(read_text(self.path, syntax="yaml"))
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            raise GpuNodeUnreadable(f"cannot read {self.path}: {exc}") from None
        if doc is None:
            return None
        if not isinstance(doc, Mapping):
            raise GpuNodeUnreadable(f"{self.path} does not hold an object (a GPUNode)")
        name = doc.get("metadata", {}).get("name") if isinstance(doc.get("metadata"), Mapping) else None
        if name != node:
            raise GpuNodeUnreadable(f"{self.path} holds GPUNode {name!r}, not {node!r}")
        return doc


def look(source: GpuNodeSource, node: str, now: datetime, stale_after_s: float) -> NodeHealthView:
    """The node's health view now: the GPUNode read through ``source``, or why it could not be."""
    try:
        obj = source.read(node)
    except GpuNodeUnreadable as exc:
        return unreadable(node, str(exc))
    return node_view(obj, node, now, stale_after_s)
