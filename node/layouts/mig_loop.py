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
from node.base.journal import NVML_PHASES, Journal
from node.base.idle_tracking import IdleTracker
from node.layouts.reshape_start import StartDecision, decide_start, decide_start_pinned
from node.layouts.reconciler import BusyFn, MigReconciler
from node.nvml.protocol import NvmlReader


@dataclass(frozen=True)
class GpuPass:
    """What one pass did: the journal now (None: none ever) and the start decision, if one was made."""

    journal: Journal | None
    decision: StartDecision | None


@dataclass(frozen=True)
class GpuTarget:
    """What the spec asks of one GPU."""

    model: GpuModel
    index: int
    uuid: str
    generation: int
    desired: Sequence[str] | None
    """The profile multiset; None: this GPU is not reshaped (its idle clock still runs)."""
    pinned: Sequence[PlacedInstance] | None = None
    """The exact target when the spec pins every placement."""


@dataclass(frozen=True)
class StartRules:
    """When a new reconfiguration may start (active ones always finish)."""

    idle_seconds: float
    retry_seconds: float = 60.0
    """Wait after a rollback before trying the same spec again."""
    blocked: str = ""
    """Why policy forbids starting a reshape now; empty: allowed."""


@dataclass(frozen=True)
class GpuDriver:
    """What a pass works with: NVML, the journaled reconciler, who is busy, the idle clocks, and
    ``before_nvml`` (run after the journal is written and before the first NVML change)."""

    reconciler: MigReconciler
    inventory: NvmlReader
    busy: BusyFn
    idle: IdleTracker
    before_nvml: Callable[[Journal], Journal] | None = None

    def drive(self, target: GpuTarget, journal: Journal | None, rules: StartRules, now: float) -> GpuPass:
        """Resume ``journal`` if it is in an NVML phase, else maybe start one for ``target``."""
        if journal is not None and journal.phase in NVML_PHASES:
            return GpuPass(self.reconciler.run(self._prepared(journal)), None)
        if journal is not None and journal.active:
            return GpuPass(journal, None)  # Advertising: the agent finishes it
        instances = self.inventory.gpu_instances(target.index)
        current = tuple(sorted(i.placed for i in instances))
        busy_now = self.busy(target.index, instances)
        self.idle.observe(target.uuid, current, busy_now, now)
        if target.desired is None:
            return GpuPass(journal, None)
        if journal is not None and journal.generation == target.generation:
            if journal.outcome == "Failed":
                # A failed reconfiguration is not retried for the same spec: a human or a new spec decides.
                return GpuPass(journal, StartDecision("refuse", f"previous attempt failed: {journal.reason}"))
            if journal.outcome == "RolledBack" and now - journal.updated_at < rules.retry_seconds:
                return GpuPass(journal, StartDecision(
                    "wait", f"rolled back ({journal.reason}); retrying after {rules.retry_seconds:g}s"))
        recently = self.idle.not_idle_long_enough(target.uuid, current, now, rules.idle_seconds) | busy_now
        if target.pinned is not None:
            decision = decide_start_pinned(target.model, current, busy_now, recently, target.pinned, rules.idle_seconds)
        else:
            decision = decide_start(target.model, current, busy_now, recently, target.desired, rules.idle_seconds)
        if decision.kind in ("start", "wait") and rules.blocked:  # policy first: idleness would not be enough anyway
            return GpuPass(journal, StartDecision("blocked", rules.blocked))
        if decision.kind != "start" or decision.plan is None:
            return GpuPass(journal, decision)
        new = self.reconciler.begin(target.index, target.uuid, target.generation, current,
                                    decision.plan.destroy, decision.plan.create)
        return GpuPass(self.reconciler.run(self._prepared(new)), decision)

    def _prepared(self, journal: Journal) -> Journal:
        return self.before_nvml(journal) if self.before_nvml is not None else journal
