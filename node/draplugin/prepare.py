"""Preparing and unpreparing claims: MIG instances, MPS limits and CDI specs, journaled.

``ClaimPreparer.prepare(claim)``:

1. A claim already ``Prepared`` gets the answer it got before, from its journal,
   once NVML confirms its MIG instances are still there (after a reboot or a GPU
   reset they are created again). A claim whose last prepare or unprepare did not
   finish is first rolled back (or its unprepare finished).
2. Otherwise its allocation is read (``ClaimSource``) and planned
   (``node.draplugin.plan``); the plan goes to the journal (``Preparing``).
3. Each MIG device (and a whole GPU in MIG mode: its full-size instance, planned
   by ``node.draplugin.plan``): an instance of that profile at exactly that placement that
   no other claim holds and no process uses is adopted (and left in place at
   unprepare); else, when nothing overlaps the placement, it is created, with
   the intent journaled first. Anything overlapping (another claim's instance,
   one in use, or an idle one no claim holds) refuses the claim: the plugin
   never destroys an instance it did not create for the claim at hand.
4. The CDI spec is written and the journal says ``Prepared``.

A failure at 2-4 rolls back what this claim created and answers the error.
``unprepare(claim)`` destroys the instances gpupack created for the claim
(never one a process uses: that is an error, and the kubelet retries), removes
the spec, then the journal. An unknown claim is already unprepared.
``recover()``, at start, rolls back or finishes every journal a killed plugin
left (``node.draplugin.journal.recovery``).

Calls are serialized (one lock): NVML's MIG calls are not meant to race, and the
kubelet's own helper for Go drivers serializes them too. With a ``change_lock``
(``node.draplugin.nvml_lock``, as served) each also holds the node's MIG-change
lock, so the agent never destroys an idle instance while a claim is adopting it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from node.draplugin import cdi, files
from node.draplugin.claims import ClaimError, ClaimRef, ClaimSource
from node.draplugin.journal import ClaimJournal, ClaimRecord, DeviceRecord, Phase, instance_to_undo, recovery
from node.draplugin.nvml_lock import NvmlChangeLock
from node.draplugin.plan import nvml_call, plan_claim
from node.draplugin.settings import ShareMode
from node.nvml import errors
from node.nvml.errors import NvmlError
from node.nvml.protocol import GpuInstance, NvmlBackend
from sharing.api.mps_env import PIPE_DIRECTORY_ENV

log = logging.getLogger("gpupack.dra-plugin")


@dataclass(frozen=True)
class PreparedDevice:
    """One device of the answer to the kubelet (``dra.v1.Device``)."""

    request: str
    pool: str
    device: str
    cdi_ids: tuple[str, ...]
    share_id: str | None = None


def answer(record: ClaimRecord) -> tuple[PreparedDevice, ...]:
    """The kubelet's answer for a prepared claim: the same for the same journal, every time."""
    return tuple(
        PreparedDevice(d.request.split("/", 1)[0], d.pool, d.device, (cdi.device_id(record.claim.uid, n),), d.share_id)
        for n, d in enumerate(record.devices))


def cdi_device(device: DeviceRecord, mps_pipe_directory: str = "") -> cdi.CdiDevice:
    """The container edits of one prepared device."""
    env = [f"{cdi.VISIBLE_DEVICES_ENV}={device.visible_uuid}"]
    mounts: tuple[cdi.Mount, ...] = ()
    if device.mps is not None:
        env.extend(device.mps.env())
        if mps_pipe_directory:
            env.append(f"{PIPE_DIRECTORY_ENV}={mps_pipe_directory}")
            mounts = (cdi.Mount(mps_pipe_directory),)
    return cdi.CdiDevice(tuple(env), mounts)


def check_claim(claim: ClaimRef) -> None:
    """Raise :class:`ClaimError` for a claim reference the kubelet should never send."""
    missing = [name for name in ("uid", "namespace", "name") if not getattr(claim, name)]
    if missing:
        raise ClaimError(f"the claim reference has no {', '.join(missing)} (namespace={claim.namespace!r}, "
                         f"name={claim.name!r}, uid={claim.uid!r})")
    try:
        cdi.check_uid(claim.uid)
    except ValueError as exc:
        raise ClaimError(str(exc)) from None


class ClaimPreparer:
    """The plugin's engine (see the module docstring). ``journal`` is loaded once, here."""

    def __init__(self, backend: NvmlBackend, claims: ClaimSource, journal: ClaimJournal, *, node: str,
                 cdi_dir: Path, share_mode: ShareMode = "mps", mps_pipe_directory: str = "",
                 clock: Callable[[], float] = time.time, change_lock: NvmlChangeLock | None = None) -> None:
        self._backend = backend
        self._claims = claims
        self._journal = journal
        self._node = node
        self._cdi_dir = cdi_dir
        self._share_mode: ShareMode = share_mode
        self._mps_pipe_directory = mps_pipe_directory
        self._clock = clock
        self._lock = threading.Lock()
        self._change_lock = change_lock
        cdi_dir.mkdir(parents=True, exist_ok=True)
        self._records, problems = journal.load()
        for problem in problems:
            log.error("%s", problem)

    @property
    def records(self) -> Mapping[str, ClaimRecord]:
        """The journal as the plugin knows it, by claim UID (a copy)."""
        with self._lock:
            return dict(self._records)

    @contextlib.contextmanager
    def _changing(self) -> Iterator[None]:
        """This process's lock, then the node's MIG-change lock (shared with the agent)."""
        with self._lock, (self._change_lock if self._change_lock is not None else contextlib.nullcontext()):
            yield

    # ------------------------------------------------------------------ the three operations
    def recover(self) -> list[str]:
        """Roll back or finish what a previous run left; one line per claim it could not (retried later)."""
        problems: list[str] = []
        with self._changing():
            files.remove_stale_temporaries(self._cdi_dir, cdi.SPEC_PREFIX)
            for record in sorted(self._records.values(), key=lambda r: r.claim.uid):
                action = recovery(record)
                if action == "keep":
                    log.info("%s: prepared before the restart; kept", record.claim)
                    continue
                log.warning("%s: found %s after a restart; %s", record.claim, record.phase,
                            "rolling it back" if action == "roll-back" else "finishing the unprepare")
                try:
                    self._undo(record, "RollingBack" if action == "roll-back" else "Unpreparing")
                except ClaimError as exc:
                    problems.append(f"{record.claim}: {exc}")
            for path in sorted(self._cdi_dir.glob(f"{cdi.SPEC_PREFIX}*.json")):
                owner = cdi.uid_of_spec(path)
                if owner is not None and owner not in self._records:
                    log.warning("CDI spec %s belongs to no claim this plugin tracks; left in place", path)
        for problem in problems:
            log.error("%s", problem)
        return problems

    def prepare(self, claim: ClaimRef) -> tuple[PreparedDevice, ...]:
        """Prepare ``claim`` (idempotent); raises :class:`ClaimError` with the kubelet's message."""
        check_claim(claim)
        with self._changing():
            record = self._records.get(claim.uid)
            if record is not None and record.phase != "Prepared":
                log.info("%s: an earlier call left it %s; undoing that first", claim, record.phase)
                self._undo(record, "Unpreparing" if record.phase == "Unpreparing" else "RollingBack")
                record = None
            if record is not None:
                missing = self._missing(record)
                if not missing:
                    return answer(record)
                log.warning("%s: prepared before, but %s; preparing it again", claim, "; ".join(missing))
                record = record.moved("Preparing", self._clock(), f"Preparing again: {'; '.join(missing)}")
            else:
                planned = plan_claim(self._claims.get(claim), self._backend, node=self._node,
                                     share_mode=self._share_mode)
                now = self._clock()
                record = ClaimRecord(claim, "Preparing", planned, now, now,
                                     steps=(f"Preparing: {', '.join(d.device for d in planned)}",))
            self._write(record)
            try:
                done = self._carry_out(record)
            except Exception as exc:
                problem = exc if isinstance(exc, ClaimError) else ClaimError(f"internal error: {type(exc).__name__}: {exc}")
                if not isinstance(exc, ClaimError):
                    log.exception("%s: prepare failed", claim)
                try:
                    self._undo(self._records[claim.uid], "RollingBack")
                except ClaimError as undo:
                    raise ClaimError(f"{problem}; rolling back: {undo}") from None
                raise problem from None
            log.info("%s: prepared %s", claim, ", ".join(f"{d.device}={d.visible_uuid}" for d in done.devices))
            return answer(done)

    def unprepare(self, claim: ClaimRef) -> None:
        """Undo ``claim``'s prepare (idempotent: an unknown claim is done); raises :class:`ClaimError`."""
        check_claim(claim)
        with self._changing():
            record = self._records.get(claim.uid)
            if record is None:
                log.info("%s: not prepared here (or already unprepared); nothing to do", claim)
                return
            self._undo(record, "RollingBack" if record.phase in ("Preparing", "RollingBack") else "Unpreparing")
            log.info("%s: unprepared", claim)

    # ------------------------------------------------------------------ steps
    def _carry_out(self, record: ClaimRecord) -> ClaimRecord:
        for index, device in enumerate(record.devices):
            if device.instance_backed:
                record = self._prepare_mig(record, index)
        spec = cdi.claim_spec(record.claim.uid, [cdi_device(d, self._mps_pipe_directory) for d in record.devices])
        try:
            path = cdi.write_spec(self._cdi_dir, record.claim.uid, spec)
        except OSError as exc:
            raise ClaimError(f"cannot write the CDI spec into {self._cdi_dir}: {exc}") from None
        record = record.moved("Prepared", self._clock(), f"Prepared: CDI spec {path.name}")
        self._write(record)
        return record

    def _prepare_mig(self, record: ClaimRecord, index: int) -> ClaimRecord:
        device = record.devices[index]
        gpu, placed = device.gpu, device.placed
        assert placed is not None and device.profile_id is not None
        instances = nvml_call(f"listing the MIG instances of GPU {gpu}", self._backend.gpu_instances, gpu)
        if device.gi_id is not None:
            if any(device.holds(i) for i in instances):
                return record
            device = replace(device, gi_id=None, uuid=None, created=False)  # gone (reboot, reset): create again
        held = self._held(gpu, instances, record.claim.uid)
        users = self._users(gpu)
        for instance in instances:
            if instance.placement == placed.placement and instance.profile == placed.profile:
                if instance.gi_id in held or users.get(instance.gi_id):
                    raise ClaimError(f"device {device.device}: the MIG instance {placed} on GPU {gpu} (GI "
                                     f"{instance.gi_id}) is {self._whose(instance, held, users)}; one instance "
                                     "is never handed to two users")
                device = replace(device, creating=False, gi_id=instance.gi_id, uuid=instance.uuid, created=False)
                record = record.with_device(index, device, self._clock(),
                                            f"adopted the idle instance {placed} (GI {instance.gi_id}) on GPU {gpu}")
                self._write(record)
                return record
        overlapping = [i for i in instances if i.placement.mask & placed.placement.mask]
        if overlapping:
            described = "; ".join(f"{i.placed} (GI {i.gi_id}, {self._whose(i, held, users)})" for i in overlapping)
            raise ClaimError(f"device {device.device}: placement {placed.placement} of GPU {gpu} overlaps {described}; "
                             "gpupack never destroys or shares an instance that is not this claim's, so the claim "
                             "can be prepared once the overlapping instance is gone")
        device = replace(device, creating=True)
        record = record.with_device(index, device, self._clock(), f"creating {placed} on GPU {gpu}")
        self._write(record)  # write-ahead: a kill from here on is rolled back (journal.instance_to_undo)
        made = nvml_call(f"creating MIG instance {placed} on GPU {gpu}", self._backend.create_gpu_instance,
                         gpu, device.profile_id, placed.placement)
        device = replace(device, creating=False, gi_id=made.gi_id, uuid=made.uuid, created=True)
        record = record.with_device(index, device, self._clock(),
                                    f"created {placed} on GPU {gpu}: GI {made.gi_id}, {made.uuid}")
        self._write(record)
        return record

    def _undo(self, record: ClaimRecord, phase: Phase) -> None:
        """Destroy what gpupack created for the claim, remove its spec, then its journal.

        Raises :class:`ClaimError` when something stays (an instance in use, an NVML
        error); the journal then stays in ``phase`` and the next call tries again.
        """
        what = "unprepare" if phase == "Unpreparing" else "roll back"
        record = record.moved(phase, self._clock(), phase)
        self._write(record)
        problems: list[str] = []
        for index in reversed(range(len(record.devices))):
            device = record.devices[index]
            if not device.instance_backed or not (device.created or device.creating):
                continue
            try:
                record = self._undo_mig(record, index)
            except ClaimError as exc:
                problems.append(str(exc))
        try:
            cdi.remove_spec(self._cdi_dir, record.claim.uid)
        except OSError as exc:
            problems.append(f"cannot remove the CDI spec: {exc}")
        if problems:
            reason = "; ".join(problems)
            self._write(record.moved(phase, self._clock(), f"{what} unfinished: {reason}", reason=reason))
            raise ClaimError(f"{what} could not finish ({reason}); it is tried again on the next call")
        self._journal.delete(record.claim.uid)
        del self._records[record.claim.uid]

    def _undo_mig(self, record: ClaimRecord, index: int) -> ClaimRecord:
        device = record.devices[index]
        gpu = device.gpu
        instances = nvml_call(f"listing the MIG instances of GPU {gpu}", self._backend.gpu_instances, gpu)
        target = instance_to_undo(device, instances, self._held(gpu, instances, record.claim.uid).keys())
        if target is not None:
            users = self._users(gpu).get(target.gi_id)
            if users:
                raise ClaimError(f"MIG instance {target.placed} on GPU {gpu} (GI {target.gi_id}) is in use by "
                                 f"process(es) {', '.join(map(str, users))}; not destroyed")
            try:
                self._backend.destroy_gpu_instance(gpu, target.gi_id)
            except NvmlError as exc:
                if exc.code != errors.NOT_FOUND:
                    raise ClaimError(f"NVML failed destroying MIG instance {target.placed} on GPU {gpu}: {exc}") from None
            step = f"destroyed {target.placed} on GPU {gpu} (GI {target.gi_id})"
        else:
            step = f"{device.placed} on GPU {gpu}: nothing of ours there"
        cleared = replace(device, creating=False, created=False, gi_id=None, uuid=None)
        record = record.with_device(index, cleared, self._clock(), step)
        self._write(record)
        return record

    # ------------------------------------------------------------------ reading
    def _missing(self, record: ClaimRecord) -> list[str]:
        missing: list[str] = []
        listed: dict[int, tuple[GpuInstance, ...]] = {}
        for device in record.devices:
            if not device.instance_backed:
                continue
            if device.gpu not in listed:
                listed[device.gpu] = nvml_call(f"listing the MIG instances of GPU {device.gpu}",
                                               self._backend.gpu_instances, device.gpu)
            if not any(device.holds(i) for i in listed[device.gpu]):
                missing.append(f"its MIG instance {device.placed} (GI {device.gi_id}) on GPU {device.gpu} is gone")
        if not cdi.spec_path(self._cdi_dir, record.claim.uid).exists():
            missing.append("its CDI spec is gone")
        return missing

    def _held(self, gpu: int, instances: Sequence[GpuInstance], except_uid: str) -> dict[int, ClaimRef]:
        """GPU-instance id -> the other claim that holds it (or may have made it: ``creating``)."""
        held: dict[int, ClaimRef] = {}
        for uid, record in self._records.items():
            if uid == except_uid:
                continue
            for device in record.devices:
                if not device.instance_backed or device.gpu != gpu:
                    continue
                for instance in instances:
                    if device.holds(instance) or (device.creating and instance_to_undo(device, [instance], ())):
                        held[instance.gi_id] = record.claim
        return held

    def _users(self, gpu: int) -> dict[int, list[int]]:
        """GPU-instance id -> pids of the processes running in it."""
        users: dict[int, list[int]] = {}
        for process in nvml_call(f"listing the processes on GPU {gpu}", self._backend.processes, gpu):
            if process.gi_id is not None:
                users.setdefault(process.gi_id, []).append(process.pid)
        return users

    @staticmethod
    def _whose(instance: GpuInstance, held: Mapping[int, ClaimRef], users: Mapping[int, list[int]]) -> str:
        if instance.gi_id in held:
            return f"prepared for {held[instance.gi_id]}"
        if users.get(instance.gi_id):
            return f"in use by process(es) {', '.join(map(str, users[instance.gi_id]))} outside any claim"
        return "idle and prepared for no claim"

    def _write(self, record: ClaimRecord) -> None:
        try:
            self._journal.write(record)
        except OSError as exc:
            raise ClaimError(f"cannot write the claim journal in {self._journal.directory}: {exc}") from None
        self._records[record.claim.uid] = record
