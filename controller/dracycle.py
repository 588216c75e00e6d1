"""The DRA pool's part of a controller cycle: read the claims, plan, create each placed pod's claim.

``controller.reconcile`` calls :meth:`DraCycle.plan` after the device-plugin
planner and :meth:`DraCycle.prepare` for each placement before it pins and
ungates the pod with the same release code as every other pod. A cluster
without DRA nodes and DRA pods costs nothing here: no ResourceClaim is listed
(and no RBAC on them is needed).

Per placed pod, one API write before the release: the claim's create. If a
claim of that name exists already (a create whose answer was lost, or another
leader's), it is read back and adopted when it is the pod's; otherwise the pod
is not released, and an Event on it says why (once, when it first happens).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from controller.writes.dra_claims import ClaimBuildError, claim_body, existing_pin
from controller.planning.draplan import DraPlacement, DraPlan, dra_nodes, plan_dra
from controller.state.dra_usage import ClaimConflict, Hold, read_usage
from controller.kube import Kube
from controller.planning.planner import Release
from controller.state.snapshot import Pod, Snapshot
from kube.errors import KubeError
from sharing.api.allocation import trusted_allocation
from sharing.dra.share_policy import SHARES, SharePolicy
from sharing.api.keys import ALLOCATION_ANNOTATION
from sharing.api.fields import as_map as _map

log = logging.getLogger("gpupack.controller")
REFUSED_REASON = "ClaimNotOwned"


class DraCycle:
    """The DRA steps of the cycle, and what they logged already (so each problem is logged once)."""

    def __init__(self, kube: Kube, share: SharePolicy = SHARES) -> None:
        self.kube = kube
        self.share = share
        self._problems: frozenset[str] = frozenset()
        self.holds: tuple[Hold, ...] = ()
        """What the DRA pool's claims held when the last cycle planned (for the cluster figures)."""
        self._refused: frozenset[str] = frozenset()
        self._pods: tuple[Pod, ...] = ()
        """The last planned cycle's pods: whose claims' pins the controller trusts (``drausage``)."""
        # prepare() runs in the release's worker threads and may add to _refused.
        self._lock = threading.Lock()

    def plan(self, snapshot: Snapshot, now: datetime, policy_name: str,
             every_pod: Sequence[Pod] | None = None, protected: frozenset[str] = frozenset()) -> DraPlan:
        """The cycle's DRA placements (empty without a DRA pool or DRA pods); raises ``KubeError``
        when the claims cannot be listed (nothing is placed on the pool then). ``every_pod``: the
        cycle's pods of every namespace (default: the snapshot's), whose claims' pins are trusted
        (``drausage.pin_untrusted``): a controller placing only some namespaces still counts the
        promises made to the others' pods."""
        nodes = dra_nodes(snapshot)
        if not nodes and not any(p.backend == "dra" and p.gated for p in snapshot.pods):
            self.holds = ()
            return DraPlan()
        self._pods = tuple(snapshot.pods if every_pod is None else every_pod)
        usage = read_usage(self.kube.list_resource_claims(), nodes, self._pods)
        self.holds = usage.holds
        problems = frozenset(usage.problems)
        for problem in sorted(problems - self._problems):
            log.warning("DRA usage: %s; left out", problem)
        self._problems = problems
        result = plan_dra(snapshot, usage, now, policy_name=policy_name, share=self.share, protected=protected)
        self._note_refused({w.pod: w.reason for w in result.refused})
        return result

    def prepare(self, placement: DraPlacement, pod: Mapping[str, Any]) -> Release | str:
        """Create the pod's claim pinned to the engine's devices (or adopt the pod's own); the release
        to apply, or why the pod is not released."""
        if placement.adopted:
            return Release(placement.pod, placement.node, placement.reason)
        meta, spec = _map(pod.get("metadata")), _map(pod.get("spec"))
        allocation, distrust = trusted_allocation(_map(meta.get("annotations")).get(ALLOCATION_ANNOTATION), spec)
        if allocation is not None and allocation.mode == "cpu":
            return Release(placement.pod, placement.node, placement.reason)  # no GPU: nothing to claim
        if allocation is None or allocation.claim is None:
            return f"record not usable: {distrust or 'no claim named'}"
        namespace = str(meta.get("namespace") or "default")
        old = placement.replaces
        if old is not None:
            try:  # only the unallocated claim at the version the plan read: never one allocated since
                self.kube.delete_resource_claim(namespace, allocation.claim, old.uid, old.resource_version)
            except KubeError as exc:
                return f"ResourceClaim {old.key} not replaced (it changed since it was read: {exc}); next cycle"
            log.info("ResourceClaim %s replaced: %s", old.key, placement.reason)
        try:
            self.kube.create_resource_claim(namespace, claim_body(pod, allocation, placement.pinned, self.share,
                                                                  placement.requeues))
        except ClaimBuildError as exc:
            return f"no claim built: {exc}"
        except KubeError as exc:
            if not exc.conflict:
                return f"ResourceClaim {namespace}/{allocation.claim} not created: {exc}"
            return self._adopt(placement, namespace, allocation.claim, str(meta.get("uid") or ""))
        return Release(placement.pod, placement.node, placement.reason)

    def _adopt(self, placement: DraPlacement, namespace: str, claim: str, uid: str) -> Release | str:
        try:
            found = self.kube.get_resource_claim(namespace, claim)
        except KubeError as exc:
            return f"ResourceClaim {namespace}/{claim} exists and cannot be read: {exc}"
        if found is None:
            return f"ResourceClaim {namespace}/{claim} was deleted while being created; next cycle"
        pinned = existing_pin(found, uid, self._pods)
        if isinstance(pinned, ClaimConflict):
            if pinned.foreign:
                self._note_refused({placement.pod: pinned.why}, keep=True)
            return pinned.why
        return Release(placement.pod, pinned.node, f"adopted ResourceClaim {namespace}/{claim}")

    def _note_refused(self, refused: Mapping[str, str], keep: bool = False) -> None:
        """An Event on each pod newly refused for a claim that is not its own."""
        with self._lock:
            new = sorted(set(refused) - self._refused)
            self._refused = (self._refused | frozenset(refused)) if keep else frozenset(refused)
        for key in new:
            namespace, name = key.split("/", 1)
            log.warning("pod %s not released: %s", key, refused[key])
            try:
                self.kube.event({"apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": name},
                                "Warning", REFUSED_REASON, refused[key])
            except KubeError as exc:
                log.warning("event on %s not recorded: %s", key, exc)
