"""One reconcile pass for one GPU: resume a journal, or decide whether to start one.

Shared by the agent and the crash tests, so the tests exercise exactly the code
path a restarted agent takes: an active journal in an NVML phase is always
finished (or rolled back) first; a new reconfiguration starts only from a
settled GPU. ``before_nvml`` runs after the journal is written and before the
first NVML change (the agent pauses the device plugin there, as mig-manager does,
so no new pod can be handed an instance that is about to go away).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from mig.model import GpuModel, PlacedInstance
from node.journal import NVML_PHASES, Journal
from node.planning import IdleTracker, StartDecision, decide_start, decide_start_pinned
from node.reconciler import BusyFn, MigReconciler
from node.nvml.protocol import GpuInventory


@dataclass(frozen=True)
class GpuPass:
    """What one pass did: the journal now (None: none ever) and the start decision, if one was made."""

    journal: Journal | None
    decision: StartDecision | None


def drive_gpu(
    reconciler: MigReconciler,
    inventory: GpuInventory,
    model: GpuModel,
    index: int,
    gpu_uuid: str,
    journal: Journal | None,
    desired: Sequence[str] | None,
    generation: int,
    busy: BusyFn,
    idle: IdleTracker,
    now: float,
    idle_seconds: float,
    before_nvml: Callable[[Journal], Journal] | None = None,
    retry_seconds: float = 60.0,
    pinned: Sequence[PlacedInstance] | None = None,
    blocked: str = "",
) -> GpuPass:
    """``desired``: profile multiset; ``pinned``: the exact target when the spec pins every placement;
    ``blocked``: why policy forbids starting a reshape now (empty: allowed). Active journals always finish."""
    if journal is not None and journal.phase in NVML_PHASES:
        if before_nvml is not None:
            journal = before_nvml(journal)
        return GpuPass(reconciler.run(journal), None)
    if journal is not None and journal.active:
        return GpuPass(journal, None)  # Advertising: the agent finishes it
    instances = inventory.gpu_instances(index)
    current = tuple(sorted(i.placed for i in instances))
    busy_now = busy(index, instances)
    idle.observe(gpu_uuid, current, busy_now, now)
    if desired is None:
        return GpuPass(journal, None)
    if journal is not None and journal.generation == generation:
        if journal.outcome == "Failed":
            # A failed reconfiguration is not retried for the same spec: a human or a new spec decides.
            return GpuPass(journal, StartDecision("refuse", f"previous attempt failed: {journal.reason}"))
        if journal.outcome == "RolledBack" and now - journal.updated_at < retry_seconds:
            return GpuPass(journal, StartDecision("wait", f"rolled back ({journal.reason}); retrying after {retry_seconds:g}s"))
    recently: frozenset[PlacedInstance] = idle.not_idle_long_enough(gpu_uuid, current, now, idle_seconds) | busy_now
    if pinned is not None:
        decision = decide_start_pinned(model, current, busy_now, recently, pinned, idle_seconds)
    else:
        decision = decide_start(model, current, busy_now, recently, desired, idle_seconds)
    if decision.kind in ("start", "wait") and blocked:  # policy first: idleness would not be enough anyway
        return GpuPass(journal, StartDecision("blocked", blocked))
    if decision.kind != "start" or decision.plan is None:
        return GpuPass(journal, decision)
    new = reconciler.begin(index, gpu_uuid, generation, current, decision.plan.destroy, decision.plan.create)
    if before_nvml is not None:
        new = before_nvml(new)
    return GpuPass(reconciler.run(new), decision)
