"""The node's GPU faults: raised from NVML's signals, ended only by the recovery each one needs.

:class:`HealthTracker` keeps one fault per device (a GPU, or one MIG instance,
keyed ``(gpu index, GPU-instance id or None)``). Each agent tick feeds it the
tick's :class:`Signals`; it answers with the faults now in force, the ones that
began and the ones that ended (for Events), never touching the API itself.

Raising:

* a critical XID: classified by the XID table (``node.health.xids``); an
  application error leaves the device healthy; an XID NVML ties to a MIG instance
  faults that instance, any other the whole GPU;
* XID events that cannot be read (NVML's event wait failed): every GPU, as NVIDIA's
  device plugin then marks every device unhealthy;
* uncorrected ECC errors (the volatile counter grew, or the lifetime one where
  the volatile one is not supported), pages waiting for retirement, rows waiting
  for remapping (all until a reset), a failed row remapping (until an admin
  acknowledges it: the GPU needs replacing);
* a GPU that answers ``GPU_IS_LOST`` (until the node reboots).

Memory signals raise when they come up (a counter grows, a flag turns on), not
while they stay up, so a fault that an admin acknowledged is not raised again by
the same, unchanged signal; a reset clears what a reset clears (volatile counters,
pending retirements and remappings), so one of those still up after a reset is new.
The last look (``MemorySignalsSeen``) is published in the GPUNode status with the
faults, so a restarted agent goes on from there.

Ending, never on a timer: a reset the backend reports (``reset_marker``) ends
``ResetGpu`` faults, a reboot (``boot_id``) ends every fault but ``Acknowledge``
ones, an admin's acknowledgement (``node.health.ack``) ends any fault that began
before it. A MIG instance that no longer exists takes its fault with it.

Faults survive an agent restart: they live in the GPUNode status, and
:meth:`HealthTracker.restore` reads them back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

from pydantic import ValidationError

from node.health.ack import Acknowledgements
from node.health.plugin import withdraws
from node.health.xids import BUILTIN, XidRule, classify
from node.nvml.protocol import MemoryHealth, XidEvent
from node.base.snapshot import NodeSnapshot
from sharing.api.crd import DeviceHealth, HealthRecovery, MemorySignal, MemorySignalsSeen

DeviceKey = tuple[int, int | None]
"""(GPU index, GPU-instance id), the id None for the whole GPU."""

_STRENGTH: Mapping[HealthRecovery, int] = {"ResetGpu": 1, "RebootNode": 2, "Acknowledge": 3}


@dataclass(frozen=True)
class Fault:
    reason: str
    message: str
    since: datetime
    recovery: HealthRecovery
    withdrawn: bool
    boot_id: str
    reset_marker: str
    xid: int | None = None
    pods: tuple[str, ...] = ()

    def status(self) -> DeviceHealth:
        return DeviceHealth(reason=self.reason, message=self.message[:1024], xid=self.xid, since=self.since,
                            recovery=self.recovery, withdrawn=self.withdrawn, pods=list(self.pods[:64]),
                            boot_id=self.boot_id[:64] or None, reset_marker=self.reset_marker[:64] or None)


@dataclass(frozen=True)
class Signals:
    """One tick's fault signals, read from the backend by ``node.health.signals.read_signals``."""

    xids: tuple[XidEvent, ...] = ()
    xid_error: str | None = None
    """Reading XID events failed (the text of NVML's error)."""
    memory: Mapping[int, MemoryHealth] = field(default_factory=dict)
    lost: frozenset[int] = frozenset()
    """GPUs that answer ``GPU_IS_LOST``."""
    boot_id: str = ""
    reset_markers: Mapping[int, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Ended:
    key: DeviceKey
    fault: Fault
    why: str


@dataclass(frozen=True)
class HealthReport:
    faults: Mapping[DeviceKey, Fault]
    began: tuple[tuple[DeviceKey, Fault], ...] = ()
    ended: tuple[Ended, ...] = ()
    application_xids: tuple[XidEvent, ...] = ()
    """XIDs that were the application's fault (the device stays healthy)."""
    unknown_xids: tuple[XidEvent, ...] = ()

    def gpu(self, index: int) -> Fault | None:
        return self.faults.get((index, None))

    def instance(self, index: int, gi_id: int) -> Fault | None:
        return self.faults.get((index, gi_id))

    @property
    def degraded(self) -> bool:
        """A fault the device plugin keeps advertising: gpupack keeps new pods off the node."""
        return any(not f.withdrawn for f in self.faults.values())

    def all_gpus_unhealthy(self, gpu_count: int) -> bool:
        return gpu_count > 0 and all((i, None) in self.faults for i in range(gpu_count))


class HealthTracker:
    """See the module docstring. ``table``: the XID table in force (built-in plus overrides)."""

    def __init__(self, table: Mapping[int, XidRule] = BUILTIN) -> None:
        self.table: Mapping[int, XidRule] = table
        self.faults: dict[DeviceKey, Fault] = {}
        self.memory_seen: dict[int, MemorySignalsSeen] = {}
        """GPU -> its memory signals at the last look: signals raise when they come up."""
        self.restored = False

    # ------------------------------------------------------------------ restart
    def restore(self, status: Mapping[str, Any]) -> list[str]:
        """Read back the faults a previous agent wrote into ``status`` (GPUNode status); returns problems."""
        self.restored = True
        problems: list[str] = []
        for gpu in _list(status.get("gpus")):
            index = gpu.get("index")
            if not isinstance(index, int):
                continue
            self._restore_one((index, None), gpu.get("health"), problems)
            try:
                if gpu.get("memorySignals") is not None:
                    self.memory_seen[index] = MemorySignalsSeen.model_validate(gpu["memorySignals"])
            except ValidationError:
                problems.append(f"GPU {index}: previous memory signals unreadable; looked at afresh")
            for inst in _list(gpu.get("instances")):
                gi = inst.get("giId")
                if isinstance(gi, int):
                    self._restore_one((index, gi), inst.get("health"), problems)
        return problems

    def _restore_one(self, key: DeviceKey, raw: Any, problems: list[str]) -> None:
        if raw is None:
            return
        try:
            h = DeviceHealth.model_validate(raw)
        except ValidationError as exc:
            problems.append(f"GPU {key[0]}{'' if key[1] is None else f' instance {key[1]}'}: previous health entry "
                            f"unreadable ({exc.errors()[0]['msg']}); kept as a fault until acknowledged")
            self.faults[key] = Fault("Unreadable", "a previous agent's health entry could not be read",
                                     datetime.now(timezone.utc), "Acknowledge", False, "", "")
            return
        self.faults[key] = Fault(h.reason, h.message, h.since, h.recovery, h.withdrawn, h.boot_id or "",
                                 h.reset_marker or "", h.xid, tuple(h.pods))

    # --------------------------------------------------------------------- tick
    def observe(
        self,
        signals: Signals,
        snapshot: NodeSnapshot,
        pods_by_device: Mapping[str, Sequence[str]],
        acks: Acknowledgements,
        now: datetime,
        *,
        shared: bool,
    ) -> HealthReport:
        """End what has recovered, raise what the signals show; ``shared``: the node's full GPUs
        are shared (MPS or time-slicing) by the device plugin."""
        # To the second, as the API writes times: an acknowledgement written at the same second covers it.
        now = now.replace(microsecond=0)
        ended = self._end_recovered(signals, snapshot, acks)
        began: list[tuple[DeviceKey, Fault]] = []
        app: list[XidEvent] = []
        unknown: list[XidEvent] = []
        mig_gpus = {g.info.index for g in snapshot.gpus if g.info.mig_enabled}
        instances = {(g.info.index, i.gi_id) for g in snapshot.gpus for i in g.instances}

        def raise_fault(key: DeviceKey, reason: str, message: str, recovery: HealthRecovery, xid: int | None,
                        withdrawn: bool) -> None:
            index = key[0]
            pods = pods_on(snapshot, key, pods_by_device)
            fault = Fault(reason, message, now, recovery, withdrawn, signals.boot_id,
                          signals.reset_markers.get(index, ""), xid, pods)
            current = self.faults.get(key)
            if current is None:
                self.faults[key] = fault
                began.append((key, fault))
            elif (_STRENGTH[recovery] > _STRENGTH[current.recovery] or (withdrawn and not current.withdrawn)
                  or reason not in current.message):
                # One fault per device: keep when it began, ask for the stronger recovery, say what else happened.
                self.faults[key] = replace(current, recovery=max(recovery, current.recovery, key=_STRENGTH.__getitem__),
                                           withdrawn=current.withdrawn or withdrawn,
                                           message=f"{current.message}; then {reason}: {message}"[:1024])

        for event in signals.xids:
            rule = classify(event.xid, self.table)
            if rule.healthy:
                app.append(event)
                continue
            if not rule.known:
                unknown.append(event)
            on_instance = event.gi_id is not None and (event.gpu_index, event.gi_id) in instances
            key: DeviceKey = (event.gpu_index, event.gi_id if on_instance else None)
            where = f"MIG instance {event.gi_id} of GPU {event.gpu_index}" if on_instance else f"GPU {event.gpu_index}"
            raise_fault(key, f"Xid{event.xid}" if rule.known else "UnknownXid",
                        f"XID {event.xid} on {where}: {rule.description}", rule.recovery, event.xid,
                        withdraws(event.xid, on_instance=on_instance, mig=event.gpu_index in mig_gpus,
                                  shared=shared))
        if signals.xid_error is not None:
            for gpu in snapshot.gpus:
                raise_fault((gpu.info.index, None), "XidEventsUnreadable",
                            f"NVML's XID events cannot be read ({signals.xid_error}); NVIDIA's device plugin "
                            "then marks every device unhealthy", "ResetGpu", None, True)
        for index in sorted(signals.lost):
            raise_fault((index, None), "GpuLost", f"GPU {index} does not answer NVML (GPU_IS_LOST)",
                        "RebootNode", None, True)
        for index, memory in sorted(signals.memory.items()):
            raised, self.memory_seen[index] = _memory_faults(memory, self.memory_seen.get(index),
                                                             signals.reset_markers.get(index, ""))
            for reason, message, recovery in raised:
                raise_fault((index, None), reason, f"GPU {index}: {message}", recovery, None, False)
        return HealthReport(dict(self.faults), tuple(began), tuple(ended), tuple(app), tuple(unknown))

    def _end_recovered(self, signals: Signals, snapshot: NodeSnapshot, acks: Acknowledgements) -> list[Ended]:
        present = {(g.info.index, i.gi_id) for g in snapshot.gpus for i in g.instances}
        known_gpus = {g.info.index for g in snapshot.gpus if not g.lost}
        ended: list[Ended] = []
        for key, fault in list(self.faults.items()):
            index, gi = key
            why = None
            if acks.covers(index, fault.since):
                why = "acknowledged by an admin"
            elif fault.recovery != "Acknowledge" and signals.boot_id and fault.boot_id and signals.boot_id != fault.boot_id:
                why = "the node rebooted"
            elif (fault.recovery == "ResetGpu" and fault.reset_marker and index in signals.reset_markers
                  and signals.reset_markers[index] != fault.reset_marker):
                why = "the GPU was reset"
            elif gi is not None and index in known_gpus and key not in present:
                why = "the MIG instance no longer exists"
            if why is not None:
                del self.faults[key]
                ended.append(Ended(key, fault, why))
        return ended


_CLEARED_BY_RESET: frozenset[MemorySignal] = frozenset({"RetiredPagesPending", "RowRemapPending"})
_FLAGS: tuple[tuple[MemorySignal, str, HealthRecovery], ...] = (
    ("RetiredPagesPending", "memory pages wait for retirement at the next GPU reset", "ResetGpu"),
    ("RowRemapPending", "memory rows wait for remapping at the next GPU reset", "ResetGpu"),
    ("RowRemapFailure", "a memory row remapping failed; the GPU needs to be replaced", "Acknowledge"),
)


def _memory_faults(now: MemoryHealth, seen: MemorySignalsSeen | None,
                   marker: str) -> tuple[list[tuple[str, str, HealthRecovery]], MemorySignalsSeen]:
    """Faults the memory signals raise against the last look ``seen`` (None: never looked), and the new look."""
    out: list[tuple[str, str, HealthRecovery]] = []
    reset = seen is not None and seen.reset_marker != marker
    if seen is not None:  # never looked: the counters are a baseline (errors from before are history)
        if now.volatile_uncorrected is not None:
            # A reset clears the volatile counter: count from zero after one.
            grew = _grew(now.volatile_uncorrected, 0 if reset else seen.volatile_uncorrected)
        else:
            grew = _grew(now.aggregate_uncorrected, seen.aggregate_uncorrected)
        if grew:
            out.append(("EccUncorrectable", f"{grew} new uncorrected ECC error(s)", "ResetGpu"))
    flags: dict[MemorySignal, bool | None] = {
        "RetiredPagesPending": now.retired_pages_pending,
        "RowRemapPending": now.remapped_rows_pending,
        "RowRemapFailure": now.remapped_rows_failed,
    }
    before = set(seen.up) if seen is not None else set()
    if reset:
        before -= _CLEARED_BY_RESET  # still up after a reset: the reset did not cure it
    for reason, message, recovery in _FLAGS:
        if flags[reason] is True and reason not in before:
            out.append((reason, message, recovery))
    look = MemorySignalsSeen(reset_marker=marker[:64], volatile_uncorrected=now.volatile_uncorrected,
                             aggregate_uncorrected=now.aggregate_uncorrected,
                             up=[reason for reason, _, _ in _FLAGS if flags[reason] is True])
    return out, look


def _grew(now: int | None, before: int | None) -> int:
    if now is None or before is None:
        return 0
    return max(0, now - before)


def pods_on(snapshot: NodeSnapshot, key: DeviceKey, pods_by_device: Mapping[str, Sequence[str]]) -> tuple[str, ...]:
    """The pods using a device: a MIG instance (``key`` names its GPU-instance id), or a GPU with its instances."""
    index, gi = key
    gpu = snapshot.gpu(index)
    if gpu is None:
        return ()
    devices = [gpu.info.uuid] + [i.uuid for i in gpu.instances if gi is None or i.gi_id == gi]
    if gi is not None:
        devices = devices[1:]
    return tuple(sorted({p for d in devices for p in pods_by_device.get(d, ())}))


def _list(value: Any) -> list[Mapping[str, Any]]:
    return [v for v in value if isinstance(v, Mapping)] if isinstance(value, list) else []
