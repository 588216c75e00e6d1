"""MIG reconciler: drives one GPU from its previous layout to a target, journaled.

Two halves, as the style guide asks:

* ``decide(journal, observed, busy)`` is pure: given the journal's intent, the
  instances NVML reports now and the instances that are busy (a process or a
  pod), it returns the next action. Because it looks at the *observed* layout,
  every step is idempotent and a crash between any two lines is harmless: after
  a restart the same function, fed the same journal and what NVML reports, picks
  up where the dead agent stopped (or rolls back).
* ``MigReconciler`` executes actions against an ``MigPartitioner``/``NvmlReader``
  and saves the journal through a ``JournalStore`` before and after each step.

Safety rules (invariant 1 of ARCHITECTURE.md):

* an instance is destroyed only after ``busy`` was re-read for that very step
  and does not contain it; NVML itself also refuses (``IN_USE``) while a process
  runs, which is a second fence;
* an instance that turns busy mid-way makes the reconciler roll back; the
  rollback never destroys a busy instance either: if it would have to, the
  journal ends ``Failed`` with the reason (visible as a condition and an Event),
  the GPU is left as it is and nothing else is touched.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from mig.model import PlacedInstance
from node.base.journal import Journal, Phase, format_instance
from node.nvml import errors as nvml_errors
from node.nvml.errors import NvmlError
from node.nvml.protocol import GpuInstance, NvmlReader, MigPartitioner


@dataclass(frozen=True)
class Destroy:
    instance: PlacedInstance


@dataclass(frozen=True)
class Create:
    instance: PlacedInstance


@dataclass(frozen=True)
class Transition:
    phase: Phase
    reason: str = ""


Action = Destroy | Create | Transition


def decide(journal: Journal, observed: frozenset[PlacedInstance], busy: frozenset[PlacedInstance]) -> Action:
    """The next action for an active NVML phase (``Applying`` or ``RollingBack``)."""
    previous, target = frozenset(journal.previous), frozenset(journal.target)
    strangers = observed - previous - target
    if journal.phase == "Applying":
        if observed == target:
            return Transition("Advertising", "target layout reached")
        kept = previous & target
        if strangers or not kept <= observed:
            return Transition("Aborted", _external(strangers, kept - observed))
        for instance in journal.destroy:
            if instance in observed:
                if instance in busy:
                    return Transition("RollingBack", f"{format_instance(instance)} became busy before it was destroyed")
                return Destroy(instance)
        for instance in journal.create:
            if instance not in observed:
                return Create(instance)
        return Transition("Aborted", "no step left but target not reached")  # unreachable if plan is consistent
    if journal.phase == "RollingBack":
        if observed == previous:
            return Transition("Advertising", "previous layout restored")
        if strangers:
            return Transition("Failed", _external(strangers, frozenset()))
        for instance in reversed(journal.create):
            if instance in observed and instance not in previous:
                if instance in busy:
                    return Transition(
                        "Failed", f"cannot roll back: new instance {format_instance(instance)} is already in use"
                    )
                return Destroy(instance)
        for instance in journal.previous:
            if instance not in observed:
                return Create(instance)
        return Transition("Failed", "rollback found nothing to do but the layout differs")  # unreachable
    raise ValueError(f"decide() called in phase {journal.phase}; only Applying and RollingBack change NVML")


def _external(strangers: frozenset[PlacedInstance], missing: frozenset[PlacedInstance]) -> str:
    parts = []
    if strangers:
        parts.append("unexpected " + ", ".join(sorted(map(format_instance, strangers))))
    if missing:
        parts.append("missing " + ", ".join(sorted(map(format_instance, missing))))
    return "GPU changed outside gpupack: " + "; ".join(parts)


class JournalStore(Protocol):
    """Where journals live (``GPUNode.status.reconfiguration`` in the agent; a dict in tests)."""

    def save(self, journal: Journal) -> None: ...


class Backend(NvmlReader, MigPartitioner, Protocol):
    pass


BusyFn = Callable[[int, tuple[GpuInstance, ...]], frozenset[PlacedInstance]]
"""``busy(gpu_index, instances)``: which of the instances have a process or a pod now."""
EventFn = Callable[[str, str, str], None]
"""``event(type, reason, message)`` with type ``Normal`` or ``Warning``."""


class MigReconciler:
    """Executes journals. Construct one per agent process; it holds no state of its own."""

    def __init__(
        self,
        backend: Backend,
        store: JournalStore,
        busy: BusyFn,
        clock: Callable[[], float],
        *,
        max_errors: int = 5,
        event: EventFn | None = None,
    ) -> None:
        self._backend = backend
        self._store = store
        self._busy = busy
        self._clock = clock
        self._max_errors = max_errors
        self._event = event or (lambda _type, _reason, _message: None)

    def begin(
        self, gpu_index: int, gpu_uuid: str, generation: int,
        previous: tuple[PlacedInstance, ...], destroy: tuple[PlacedInstance, ...], create: tuple[PlacedInstance, ...],
    ) -> Journal:
        """Write the journal of a new reconfiguration (before touching NVML) and return it."""
        overlap = set(destroy) & set(create)
        destroy = tuple(i for i in destroy if i not in overlap)  # destroy+recreate in place is a no-op
        create = tuple(i for i in create if i not in overlap)
        target = tuple(sorted((set(previous) - set(destroy)) | set(create)))
        now = self._clock()
        journal = Journal(
            gpu_uuid, gpu_index, generation, tuple(sorted(previous)), target, destroy, create,
            "Applying", now, now, steps=("Applying",),
        )
        self._store.save(journal)
        self._event("Normal", "MigReconfigurationStarted",
                    f"GPU {gpu_index}: {_layout(journal.previous)} -> {_layout(journal.target)}")
        return journal

    def run(self, journal: Journal, max_steps: int = 64) -> Journal:
        """Drive NVML until the journal leaves the NVML phases (or ``max_steps`` actions)."""
        for _ in range(max_steps):
            if journal.phase not in ("Applying", "RollingBack"):
                break
            journal = self.step(journal)
        return journal

    def step(self, journal: Journal) -> Journal:
        """Observe, decide, act once, and save the journal."""
        index = journal.gpu_index
        try:
            instances = self._backend.gpu_instances(index)
            observed = frozenset(i.placed for i in instances)
            action = decide(journal, observed, self._busy(index, instances))
            if isinstance(action, Transition):
                return self._transition(journal, action)
            if isinstance(action, Destroy):
                gi_id = next(i.gi_id for i in instances if i.placed == action.instance)
                self._backend.destroy_gpu_instance(index, gi_id)
                journal = journal.logged(f"destroyed {format_instance(action.instance)}", self._clock())
            else:
                model_profile_id = self._profile_id(index, action.instance.profile)
                self._backend.create_gpu_instance(index, model_profile_id, action.instance.placement)
                journal = journal.logged(f"created {format_instance(action.instance)}", self._clock())
        except NvmlError as exc:
            journal = self._nvml_failed(journal, exc)
        self._store.save(journal)
        return journal

    def _transition(self, journal: Journal, action: Transition) -> Journal:
        now = self._clock()
        if action.phase == "Advertising":
            outcome: Phase = "Succeeded" if journal.phase == "Applying" else "RolledBack"
            journal = journal.moved("Advertising", now, action.reason, outcome=outcome)
        elif action.phase == "RollingBack":
            journal = journal.moved("RollingBack", now, action.reason)
            self._event("Warning", "MigReconfigurationRollingBack", f"GPU {journal.gpu_index}: {action.reason}")
        else:  # Failed or Aborted: NVML is left as it is; the device plugin still gets resumed
            journal = journal.moved("Advertising", now, action.reason, outcome=action.phase)
            self._event("Warning", f"MigReconfiguration{action.phase}", f"GPU {journal.gpu_index}: {action.reason}")
        self._store.save(journal)
        return journal

    def _nvml_failed(self, journal: Journal, exc: NvmlError) -> Journal:
        now = self._clock()
        errors = journal.errors + 1
        if journal.phase == "Applying":
            self._event("Warning", "MigReconfigurationRollingBack", f"GPU {journal.gpu_index}: {exc}")
            return journal.moved("RollingBack", now, f"NVML: {exc}", errors=errors)
        if errors >= self._max_errors or exc.permanent:
            reason = f"rollback gave up after {errors} NVML error(s); last: {exc}"
            self._event("Warning", "MigReconfigurationFailed", f"GPU {journal.gpu_index}: {reason}")
            return journal.moved("Advertising", now, reason, outcome="Failed", errors=errors)
        return journal.logged(f"NVML error (will retry): {exc}", now, errors=errors)

    def _profile_id(self, index: int, profile: str) -> int:
        for p in self._backend.instance_profiles(index):
            if p.name == profile:
                return p.profile_id
        raise NvmlError(nvml_errors.INVALID_ARGUMENT, f"GPU {index} offers no profile {profile!r}")


def finish(journal: Journal, now: float) -> Journal:
    """Advertising done: enter the recorded outcome."""
    outcome = journal.outcome or "Succeeded"
    return journal.moved(outcome, now, journal.reason, device_plugin_paused=False)


def _layout(instances: tuple[PlacedInstance, ...]) -> str:
    return "[" + ", ".join(map(format_instance, instances)) + "]" if instances else "[empty]"


