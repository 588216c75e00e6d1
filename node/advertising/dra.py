"""The ``dra`` backend: the agent publishes its node's ResourceSlices (driver ``gpu.gpupack.io``).

On a node pool run with Dynamic Resource Allocation (``--backend dra``) no
device plugin hands out GPUs: kube-scheduler allocates ResourceClaims against
the ResourceSlices the agent publishes, and gpupack's kubelet plugin prepares
them. :class:`DraPublisher` is the agent's advertiser there
(``node.base.context.Advertiser``). Each tick, ``publish``:

0. destroys the MIG instances no claim holds that have been idle for the
   SharingPolicy's idle time, where reshaping is allowed
   (``node.advertising.dra_reclaim``), so their slices are offered again;
1. decides what each GPU offers (``node.advertising.dra_offers``: MIG GPUs as
   partitionable devices, others shared or whole by the spec's sharing mode;
   faults withdrawn, and devices busy with a workload no claim in the kubelet
   plugin's journal holds (``dra_claims_dir``); new placements only where a
   SharingPolicy allows reshaping);
2. builds the pool with ``sharing.dra`` (pool = node name, ``nodeName`` = node,
   owned by the Node so the slices go with it) and checks it with the
   validator, so nothing the API server would refuse is sent;
3. compares it with what is published (``node.advertising.dra_pool``) and, only
   if anything differs, writes it at the next pool generation.

What is published is read from the API server when the agent starts, after a
failed write and every ``dra_resync_seconds``; between those reads it is what
the agent last wrote, so a steady node makes no API call at all for its slices.
The outcome is the GPUNode condition ``ResourceSlicesPublished`` (slices,
generation, devices by kind, what is withdrawn and why).

No device plugin runs, so there is nothing to pause or restart around a
reshape, no Node allocatable to re-advertise and no plugin health to forward:
those hooks do nothing. The device-plugin label and sharing config are never
written (``AgentSettings`` turns ``pause_device_plugin`` off on this backend).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kube.errors import KubeError
from node.base import conditions as C
from node.advertising.dra_offers import NodeOffer, OfferRules, node_offer
from node.advertising.dra_pool import Plan, Published, plan
from node.advertising.dra_reclaim import reclaim_idle
from node.base.context import AgentContext, JournalStore
from node.draplugin.journal import read_claimed_devices
from node.base.journal import Journal
from node.base.pods import PodUse
from node.base.reshape_rules import ReshapeRules
from node.base.settings import AgentSettings
from node.base.snapshot import NodeSnapshot
from sharing.api.crd import GPUNodeSpec
from sharing.dra import names, validate
from sharing.dra.model import ResourceSlice
from sharing.dra.share_policy import SHARES
from sharing.dra.slices import node_slices

log = logging.getLogger("gpupack.agent")
SLICES_PUBLISHED = "ResourceSlicesPublished"
"""The GPUNode condition of the ``dra`` backend (the device-plugin backend's is ``DevicePluginReady``)."""


def reshape_blocked(rules: ReshapeRules, now: float) -> str | None:
    """Why no new MIG placement may be offered at ``now`` (epoch seconds); None when they may. A new
    placement is a layout gpupack chooses, so the gate (``sharing.rules.reshape_gate``) needs a policy
    selecting the node, pinning no static layout, not frozen, its window open."""
    answer = rules.gate(now, needs_policy=True, dynamic_layout=True)
    if answer.allowed:
        return None
    if answer.reason == "no-policy" and rules.problems:
        return f"{answer.message} ({'; '.join(rules.problems)})"
    return answer.message


class DraPublisher:
    """The node's ResourceSlices, written only when what they say changes (see the module doc)."""

    def __init__(self, settings: AgentSettings) -> None:
        self.share = SHARES
        self.whole_gpu = settings.dra_whole_gpu
        if self.whole_gpu:
            log.info("DRA_WHOLE_GPU is on: MIG-enabled GPUs with no instance are also offered whole; the kubelet "
                     "plugin serves such a claim with the GPU's full-size MIG instance (MIG mode is not changed)")
        self.resync_seconds = settings.dra_resync_seconds
        self.claims_dir = Path(settings.dra_claims_dir)
        self._published: dict[str, Published] | None = None
        """The pool as the API server holds it, by slice name; None: read it before the next diff."""
        self._read_at = -1e18
        self.writes = 0
        """API writes made to ResourceSlices (creates, replaces, patches, deletes), for tests and logs."""
        self.last_plan: Plan | None = None

    # ------------------------------------------------------------------ hooks without a device plugin
    def allocate(self, ctx: AgentContext, snapshot: NodeSnapshot, uses: list[PodUse], labels: Mapping[str, str],
                 replicas: int) -> bool:
        return False  # kube-scheduler allocates claims; the kubelet plugin prepares them

    def wait_paused(self, ctx: AgentContext) -> None:
        return None

    def restart(self, ctx: AgentContext, journal: Journal, store: JournalStore) -> Journal:
        return journal

    def readvertise(self, ctx: AgentContext, snapshot: NodeSnapshot, node: Mapping[str, Any]) -> bool:
        return False  # the tick's publish writes the slices; the Node itself shows nothing of them

    def health(self, ctx: AgentContext, withheld: frozenset[str], restart: bool) -> None:
        return None  # publish reads every fault in force itself (ctx.faulted)

    # ------------------------------------------------------------------ publish
    def publish(self, ctx: AgentContext, snapshot: NodeSnapshot, node: Mapping[str, Any], spec: GPUNodeSpec | None,
                labels: Mapping[str, str]) -> list[C.Cond]:
        if snapshot.error is not None:
            return [C.Cond(SLICES_PUBLISHED, "False", "NvmlUnavailable",
                           f"{snapshot.error}; the node's ResourceSlices are left as published")]
        if spec is None:
            return [C.Cond(SLICES_PUBLISHED, "False", "SpecInvalid",
                           "the GPUNode spec is invalid, so the sharing mode is unknown; "
                           "the node's ResourceSlices are left as published")]
        blocked = reshape_blocked(ctx.rules, ctx.clock())
        claimed = read_claimed_devices(self.claims_dir)
        for problem in claimed.unreadable if claimed is not None else ():
            log.warning("DRA claim journal: %s; its claim's devices are not known", problem)
        reclaimed = reclaim_idle(ctx, snapshot, self.claims_dir, claimed, blocked)
        if reclaimed:
            snapshot = ctx.snapshot()  # their slices are free now: offer them in this very tick
        rules = OfferRules(sharing=spec.sharing.mode,
                           allowed_profiles=ctx.rules.policy.allowed_profiles if ctx.rules.policy else None,
                           reshape_blocked=blocked, whole_gpu=self.whole_gpu, share=self.share)
        offer = node_offer(snapshot, ctx.faulted(), rules, claimed)
        uid = str((node.get("metadata") or {}).get("uid") or "") or None
        wanted = node_slices(ctx.s.node_name, offer.gpus, generation=0, owner_uid=uid)
        try:
            validate.check(wanted)
        except validate.InvalidSlices as exc:
            log.error("ResourceSlices of %s not published: %s", ctx.s.node_name, exc)
            return [C.Cond(SLICES_PUBLISHED, "False", "InvalidSlices", f"{exc}; nothing written")]
        try:
            generation = self._sync(ctx, wanted)
        except KubeError as exc:
            self._published = None  # the pool may be half-written: read it again before the next diff
            log.warning("ResourceSlices of %s not published: %s", ctx.s.node_name, exc)
            return [C.Cond(SLICES_PUBLISHED, "False", "PublishFailed", f"writing ResourceSlices failed: {exc}")]
        shown = blocked if any(g.info.mig_enabled for g in snapshot.gpus) else None
        message = describe(ctx.s.node_name, wanted, generation, offer, shown)
        if reclaimed:
            message += "; destroyed, idle and held by no claim: " + ", ".join(r.describe() for r in reclaimed)
        return [C.Cond(SLICES_PUBLISHED, "True", "Published", message)]

    def _sync(self, ctx: AgentContext, wanted: tuple[ResourceSlice, ...]) -> int:
        """Make the API server hold ``wanted``; the pool generation it is published at."""
        now = ctx.clock()
        if self._published is None or now - self._read_at >= self.resync_seconds:
            listed = ctx.kube.list_resource_slices(ctx.s.node_name, names.DRIVER)
            self._published = {p.name: p for p in map(Published.of, listed)}
            self._read_at = now
        todo = plan(wanted, self._published)
        if todo is None:
            return max((p.generation for p in self._published.values()), default=0)
        self.last_plan = todo
        published = dict(self._published)
        self._published = None  # until every write below has landed
        kube = ctx.kube
        for body in todo.create:
            published[body["metadata"]["name"]] = Published.of(kube.create_resource_slice(body))
            self.writes += 1
        for body in todo.replace:
            published[body["metadata"]["name"]] = Published.of(kube.replace_resource_slice(body["metadata"]["name"], body))
            self.writes += 1
        for name, patch in todo.repool:
            published[name] = Published.of(kube.patch_resource_slice(name, patch))
            self.writes += 1
        for name in todo.delete:
            kube.delete_resource_slice(name)
            published.pop(name, None)
            self.writes += 1
        self._published = published
        log.info("ResourceSlices of %s at pool generation %d: %d created, %d rewritten, %d re-stamped, %d deleted",
                 ctx.s.node_name, todo.generation, len(todo.create), len(todo.replace), len(todo.repool),
                 len(todo.delete))
        return todo.generation


def describe(node: str, slices: tuple[ResourceSlice, ...], generation: int, offer: NodeOffer,
             reshape_blocked: str | None = None) -> str:
    """The condition's message: what is published, what is not, and why (``reshape_blocked``: why MIG
    GPUs offer no new placements)."""
    kinds = Counter(d.kind for s in slices for d in s.devices)
    by_kind = ", ".join(f"{kinds[k]} {k}" for k in names.KINDS if kinds[k]) or "none"
    parts = [f"{len(slices)} ResourceSlice(s) of pool {node} at generation {generation}: "
             f"{offer.device_count} device(s) on {len(offer.gpus)} GPU(s) ({by_kind})"]
    if reshape_blocked is not None:
        parts.append(f"new MIG placements not offered: {reshape_blocked}")
    if offer.withdrawn:
        parts.append("withdrawn: " + ", ".join(offer.withdrawn))
    parts.extend(offer.problems)
    return "; ".join(parts)
