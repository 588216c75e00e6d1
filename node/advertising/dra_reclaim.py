"""Idle MIG instances that no claim holds, destroyed on a DRA node so their slices are offered again.

On the ``dra`` backend an existing MIG instance is offered as itself and nothing
that overlaps it is (``node.advertising.dra_offers``). An instance no claim holds
(made before the node moved to DRA, by hand, or adopted by a claim that has
since gone) would so keep its memory slices from every other placement for good.
The SharingPolicy's idle rules say when such an instance may go, as they do on the
device-plugin backend, and invariant 1 holds (never touch an instance in use):

* reshaping is allowed now (``dra.reshape_blocked``: a SharingPolicy selects the
  node, pins no static layout, is not frozen, and a window is open if it has any);
* the kubelet plugin's journal is readable, every file of it, and no claim in it
  holds or is creating an instance at the instance's placement;
* no process uses it, and it has been idle (no process, no pod) for the
  policy's idle time (``node.base.idle_tracking.IdleTracker``, which the agent feeds each tick);
* it has no fault (a faulted instance waits for its recovery, ``node.health``).

The destroy itself happens holding the node's MIG-change lock
(``node.draplugin.nvml_lock``), which the plugin holds around every prepare, with
the journal and the instance's users read again inside it: so no claim can be
adopting the instance at that moment. A claim allocated the instance's device
afterwards loses nothing: the device name is the placement's, and prepare creates
an instance there when there is none.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

from mig.model import PlacedInstance
from node.base.context import AgentContext
from node.draplugin.journal import ClaimedDevices, read_claimed_devices
from node.draplugin.nvml_lock import lock_path, try_hold
from node.nvml.errors import NvmlError
from node.nvml.protocol import GpuInstance
from node.base.snapshot import NodeSnapshot

log = logging.getLogger("gpupack.agent")


@dataclass(frozen=True)
class Reclaim:
    gpu: int
    instance: GpuInstance

    def describe(self) -> str:
        return (f"MIG instance {self.instance.gi_id} of GPU {self.gpu} ({self.instance.profile} at memory slice "
                f"{self.instance.placement.start})")


def reclaimable(snapshot: NodeSnapshot, claimed: ClaimedDevices, faulted: Collection[tuple[int, int | None]],
                not_idle: Mapping[int, frozenset[PlacedInstance]]) -> list[Reclaim]:
    """The instances the rules above let go (pure): ``not_idle`` is, per GPU index, the instances
    busy or idle for less than the idle time; a GPU missing from it has none that may go."""
    if claimed.unreadable:
        return []  # a claim the journal cannot show might hold any of them
    out: list[Reclaim] = []
    for gpu in snapshot.gpus:
        index = gpu.info.index
        if gpu.lost or gpu.error or not gpu.info.mig_enabled or (index, None) in faulted or index not in not_idle:
            continue
        busy = gpu.busy_gi_ids()
        for instance in gpu.instances:
            if ((index, instance.placement.start) in claimed.instances or (index, instance.gi_id) in faulted
                    or instance.gi_id in busy or instance.placed in not_idle[index]):
                continue
            out.append(Reclaim(index, instance))
    return out


def reclaim_idle(ctx: AgentContext, snapshot: NodeSnapshot, claims_dir: Path, claimed: ClaimedDevices | None,
                 blocked: str | None) -> list[Reclaim]:
    """Destroy what :func:`reclaimable` allows (``claimed``: the tick's read of the journal in
    ``claims_dir``, read again under the lock before anything is destroyed; ``blocked``: why
    reshaping is not allowed now, or None); the instances destroyed. Nothing is done when the
    journal or the lock cannot be had."""
    if blocked is not None or ctx.backend is None or snapshot.error is not None:
        return []
    if claimed is None:
        return []  # no journal here: which instance a claim holds is not known
    now = ctx.clock()
    not_idle = {g.info.index: ctx.idle.not_idle_long_enough(g.info.uuid, [i.placed for i in g.instances], now,
                                                            ctx.rules.idle_seconds)
                for g in snapshot.gpus if g.info.mig_enabled}
    candidates = reclaimable(snapshot, claimed, ctx.faulted(), not_idle)
    if not candidates:
        return []
    done: list[Reclaim] = []
    with try_hold(lock_path(claims_dir)) as why_not:
        if why_not is not None:
            log.info("idle MIG instances not destroyed this tick: %s", why_not)
            return []
        again = read_claimed_devices(claims_dir)  # inside the lock: no prepare is running now
        if again is None or again.unreadable:
            return []
        for candidate in candidates:
            if (candidate.gpu, candidate.instance.placement.start) in again.instances:
                continue
            try:
                instances = ctx.backend.gpu_instances(candidate.gpu)
                if candidate.instance not in instances or candidate.instance.placed in ctx.busy(candidate.gpu,
                                                                                               instances):
                    continue
                ctx.backend.destroy_gpu_instance(candidate.gpu, candidate.instance.gi_id)
            except NvmlError as exc:  # IN_USE included: NVML is the second fence
                log.warning("%s not destroyed: %s", candidate.describe(), exc)
                continue
            done.append(candidate)
            message = (f"destroyed {candidate.describe()}: no claim held it and it was idle for "
                       f"{ctx.rules.idle_seconds:.0f} s; its memory slices are offered again")
            log.info("%s", message)
            ctx.event("Normal", "IdleInstanceDestroyed", message)
    return done
