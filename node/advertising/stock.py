"""The stock NVIDIA device plugin advertises the node's GPUs (every real node).

gpupack never talks to the plugin directly: it writes the plugin's per-node
sharing config into the GPU Operator's ConfigMap and selects it with the Node
label ``nvidia.com/device-plugin.config``; for a reshape it stops the plugin
with ``nvidia.com/gpu.deploy.device-plugin`` (as mig-manager does) and starts
it again, or restarts its pod, so it reads the new MIG devices.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from node.base import conditions as C
from node.base.context import AgentContext, JournalStore
from node.base.snapshot import NodeSnapshot
from node.base.journal import Journal
from node.base.operator_mode import device_plugin_config
from node.base.pods import PodUse
from sharing.api.crd import GPUNodeSpec
from sharing.api.keys import DEVICE_PLUGIN_CONFIG_LABEL, per_node_name

log = logging.getLogger("gpupack.agent")
RESTARTED = "device plugin restarted"
"""Journal step: the plugin's pod was deleted after a reshape (done once per journal)."""


class StockDevicePlugin:
    """The GPU Operator's device plugin, configured and restarted through the API server."""

    def __init__(self, gone_timeout_s: float = 120.0) -> None:
        self.gone_timeout_s = gone_timeout_s
        self._written = ""
        """The sharing config last written (or found) for this node: unchanged, no API calls."""

    def allocate(self, ctx: AgentContext, snapshot: NodeSnapshot, uses: list[PodUse], labels: Mapping[str, str],
                 replicas: int) -> bool:
        return False  # the kubelet and the plugin hand out devices

    def wait_paused(self, ctx: AgentContext) -> None:
        s = ctx.s
        deadline = ctx.clock() + self.gone_timeout_s
        while ctx.clock() < deadline:
            pods = [p for p in ctx.kube.list_node_pods(s.node_name)
                    if p.get("metadata", {}).get("namespace") == s.device_plugin_namespace
                    and selects(s.device_plugin_selector, p.get("metadata", {}).get("labels") or {})]
            if not pods:
                return
            ctx.sleep(1.0)
        log.warning("device plugin still running on %s after %.0fs; relying on busy checks", s.node_name,
                    self.gone_timeout_s)

    def restart(self, ctx: AgentContext, journal: Journal, store: JournalStore) -> Journal:
        if RESTARTED in journal.steps:
            return journal
        ctx.kube.delete_node_pods(ctx.s.device_plugin_namespace, ctx.s.device_plugin_selector, ctx.s.node_name)
        journal = journal.logged(RESTARTED, ctx.clock())
        store.save(journal)
        return journal

    def readvertise(self, ctx: AgentContext, snapshot: NodeSnapshot, node: Mapping[str, Any]) -> bool:
        return False  # the restarted plugin does it

    def health(self, ctx: AgentContext, withheld: frozenset[str], restart: bool) -> None:
        # The plugin finds faulty devices itself; it only needs a restart to advertise recovered ones.
        if restart:
            log.info("restarting the device plugin on %s: devices it withdrew have recovered", ctx.s.node_name)
            ctx.kube.delete_node_pods(ctx.s.device_plugin_namespace, ctx.s.device_plugin_selector, ctx.s.node_name)

    def publish(self, ctx: AgentContext, snapshot: NodeSnapshot, node: Mapping[str, Any], spec: GPUNodeSpec | None,
                labels: Mapping[str, str]) -> list[C.Cond]:
        if spec is not None:
            self._write_sharing_config(ctx, spec, labels)
        return []

    def _write_sharing_config(self, ctx: AgentContext, spec: GPUNodeSpec, labels: Mapping[str, str]) -> None:
        s = ctx.s
        key = per_node_name(s.node_name)
        text = device_plugin_config(spec.sharing.mode, spec.sharing.replicas)
        if text == self._written and labels.get(DEVICE_PLUGIN_CONFIG_LABEL) == key:
            return
        ns, cm_name = s.device_plugin_namespace, s.device_plugin_configmap
        cm = ctx.kube.get_configmap(ns, cm_name)
        data = dict((cm or {}).get("data") or {})
        if data.get(key) != text:
            data[key] = text
            ctx.kube.write_configmap(ns, cm_name, data, (cm or {}).get("metadata", {}).get("resourceVersion"))
            if labels.get(DEVICE_PLUGIN_CONFIG_LABEL) == key:
                # Same key, new content: the plugin only re-reads its config when it starts.
                ctx.kube.delete_node_pods(ns, s.device_plugin_selector, s.node_name)
        if labels.get(DEVICE_PLUGIN_CONFIG_LABEL) != key:
            ctx.kube.patch_node(s.node_name, {"metadata": {"labels": {DEVICE_PLUGIN_CONFIG_LABEL: key}}})
        self._written = text


def selects(selector: str, labels: Mapping[str, str]) -> bool:
    """Equality-based label selector ``a=b,c=d``."""
    for term in filter(None, (t.strip() for t in selector.split(","))):
        key, _, value = term.partition("=")
        if labels.get(key.strip()) != value.strip():
            return False
    return True
