"""The plugin's write-ahead journal: one file per claim, written before every NVML change.

``<state dir>/claims/<claim UID>.json`` holds the claim, its phase and, per
device, what was planned and what was done. The plugin writes it (atomically,
fsynced: ``node.draplugin.files``) *before* the NVML call it announces and again
after, so a plugin killed at any instant leaves a record saying what may have
happened. Like the agent's reconfiguration journal (``node.base.journal``) it records
intent and facts, not a step counter: a restart re-reads NVML and decides from
both.

Phases::

    (none) ─▶ Preparing ──(instances, CDI spec written)──▶ Prepared ─▶ Unpreparing ─▶ (removed)
                  │ (an error, or a restart finds it here)                  ▲ (a restart finishes it)
                  ▼                                                         │
              RollingBack ─(everything it created destroyed, spec removed)─▶ (removed)

Per MIG device, ``creating`` is set (and fsynced) before ``create_gpu_instance``
is called and replaced by the instance's id and UUID once it returns. A record
found with ``creating`` set therefore means: the create may or may not have
happened. It is written only after the plugin saw no instance at that placement,
so an instance of that profile at exactly that placement that no other claim
holds is the one the interrupted call made (:func:`instance_to_undo`).

What a restart does with each record (:func:`recovery`): ``Prepared`` is kept
(the kubelet may ask again and gets the same answer); ``Preparing`` and
``RollingBack`` are rolled back (the kubelet never got an answer and will retry
the prepare from the start); ``Unpreparing`` is finished.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal, cast

from mig.model import PlacedInstance, Placement
from node.draplugin import files
from node.draplugin.claims import ClaimRef
from node.draplugin.mps import MpsLimits
from node.nvml.protocol import GpuInstance
from sharing.dra.names import KINDS, DeviceKind

log = logging.getLogger("gpupack.dra-plugin")

JOURNAL_VERSION = 1
Phase = Literal["Preparing", "Prepared", "Unpreparing", "RollingBack"]
PHASES: tuple[Phase, ...] = ("Preparing", "Prepared", "Unpreparing", "RollingBack")
Recovery = Literal["keep", "roll-back", "finish-unprepare"]
MAX_STEPS = 40
_UID_FILE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]*\.json$")


@dataclass(frozen=True)
class DeviceRecord:
    """One allocated device of a claim: the plan, and what was done for it."""

    request: str
    pool: str
    device: str
    kind: DeviceKind
    gpu: int
    gpu_uuid: str
    share_id: str | None = None
    profile: str | None = None
    """MIG: NVIDIA's profile name (``1g.10gb+me``)."""
    profile_id: int | None = None
    placement: Placement | None = None
    creating: bool = False
    """MIG: ``create_gpu_instance`` was about to be called; its result is not recorded."""
    gi_id: int | None = None
    uuid: str | None = None
    """MIG: the MIG device's UUID, once the instance exists."""
    created: bool = False
    """MIG: gpupack created the instance for this claim (and destroys it on unprepare); False: it
    was there already, identical and idle, and is left in place."""
    mps: MpsLimits | None = None
    """Shared GPU under MPS: the claim's limits."""

    @property
    def instance_backed(self) -> bool:
        """A MIG instance serves the device: a MIG device, or a whole GPU in MIG mode (its full-size
        instance, ``node.draplugin.plan``). Its profile and placement are planned."""
        return self.placement is not None

    @property
    def visible_uuid(self) -> str:
        """What the container is given: the MIG device's UUID, or the GPU's."""
        return self.uuid if self.instance_backed and self.uuid else self.gpu_uuid

    @property
    def placed(self) -> PlacedInstance | None:
        if self.profile is None or self.placement is None:
            return None
        return PlacedInstance(self.profile, self.placement)

    def holds(self, instance: GpuInstance) -> bool:
        return self.instance_backed and self.gi_id == instance.gi_id and self.uuid == instance.uuid

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"request": self.request, "pool": self.pool, "device": self.device, "kind": self.kind,
                               "gpu": self.gpu, "gpuUUID": self.gpu_uuid}
        if self.share_id is not None:
            out["shareID"] = self.share_id
        if self.placement is not None:
            out.update(profile=self.profile, profileID=self.profile_id,
                       placement={"start": self.placement.start, "size": self.placement.size},
                       creating=self.creating, giID=self.gi_id, uuid=self.uuid, created=self.created)
        if self.mps is not None:
            out["mps"] = {"threadPercentage": self.mps.thread_percentage,
                          "pinnedMemoryMiB": self.mps.pinned_memory_mib}
        return out

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> DeviceRecord:
        kind = raw["kind"]
        if kind not in KINDS:
            raise ValueError(f"unknown device kind {kind!r}")
        placement = raw.get("placement")
        mps = raw.get("mps")
        gi_id = raw.get("giID")
        return cls(
            request=str(raw["request"]), pool=str(raw["pool"]), device=str(raw["device"]), kind=cast(DeviceKind, kind),
            gpu=int(raw["gpu"]), gpu_uuid=str(raw["gpuUUID"]),
            share_id=None if raw.get("shareID") is None else str(raw["shareID"]),
            profile=None if raw.get("profile") is None else str(raw["profile"]),
            profile_id=None if raw.get("profileID") is None else int(raw["profileID"]),
            placement=None if placement is None else Placement(int(placement["start"]), int(placement["size"])),
            creating=raw.get("creating") is True, gi_id=None if gi_id is None else int(gi_id),
            uuid=None if raw.get("uuid") is None else str(raw["uuid"]), created=raw.get("created") is True,
            mps=None if mps is None else MpsLimits(int(mps["threadPercentage"]), int(mps["pinnedMemoryMiB"])),
        )


@dataclass(frozen=True)
class ClaimRecord:
    """A claim's journal: phase, devices, and a short human-readable log of steps."""

    claim: ClaimRef
    phase: Phase
    devices: tuple[DeviceRecord, ...]
    started_at: float
    updated_at: float
    reason: str = ""
    """Why the last undo could not finish (an instance in use, an NVML error); empty otherwise."""
    steps: tuple[str, ...] = ()

    def moved(self, phase: Phase, now: float, step: str, reason: str = "") -> ClaimRecord:
        return replace(self, phase=phase, updated_at=now, reason=reason, steps=(self.steps + (step,))[-MAX_STEPS:])

    def with_device(self, index: int, device: DeviceRecord, now: float, step: str) -> ClaimRecord:
        devices = self.devices[:index] + (device,) + self.devices[index + 1:]
        return replace(self, devices=devices, updated_at=now, steps=(self.steps + (step,))[-MAX_STEPS:])

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": JOURNAL_VERSION,
            "claim": {"uid": self.claim.uid, "namespace": self.claim.namespace, "name": self.claim.name},
            "phase": self.phase, "reason": self.reason,
            "devices": [d.to_dict() for d in self.devices],
            "startedAt": self.started_at, "updatedAt": self.updated_at, "steps": list(self.steps),
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> ClaimRecord:
        try:
            if raw.get("version") != JOURNAL_VERSION:
                raise ValueError(f"journal version {raw.get('version')!r}, expected {JOURNAL_VERSION}")
            phase = raw["phase"]
            if phase not in PHASES:
                raise ValueError(f"unknown phase {phase!r}; valid: {', '.join(PHASES)}")
            claim = raw["claim"]
            return cls(
                claim=ClaimRef(str(claim["uid"]), str(claim["namespace"]), str(claim["name"])),
                phase=cast(Phase, phase), devices=tuple(DeviceRecord.from_dict(d) for d in raw["devices"]),
                started_at=float(raw["startedAt"]), updated_at=float(raw["updatedAt"]),
                reason=str(raw.get("reason", "")), steps=tuple(str(s) for s in raw.get("steps", ())),
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"malformed claim journal: missing or bad field {exc}") from None


def recovery(record: ClaimRecord) -> Recovery:
    """What a restarted plugin does with ``record`` (see the module docstring)."""
    if record.phase == "Prepared":
        return "keep"
    if record.phase == "Unpreparing":
        return "finish-unprepare"
    return "roll-back"


def instance_to_undo(device: DeviceRecord, instances: Sequence[GpuInstance],
                     held_elsewhere: Collection[int]) -> GpuInstance | None:
    """The instance undoing ``device`` must destroy, or None (nothing of ours is there).

    ``instances`` are the GPU's instances now; ``held_elsewhere`` the GPU-instance ids
    other claims hold. An instance gpupack did not create (``created`` False, not
    ``creating``) is never returned.
    """
    if not device.instance_backed:
        return None
    if device.created and device.gi_id is not None:
        return next((i for i in instances if device.holds(i)), None)
    if device.creating:
        return next((i for i in instances if i.placement == device.placement and i.profile == device.profile
                     and i.gi_id not in held_elsewhere), None)
    return None


class ClaimJournal:
    """The journal files in one directory (created if missing)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)

    def path(self, uid: str) -> Path:
        return self.directory / f"{uid}.json"

    def load(self) -> tuple[dict[str, ClaimRecord], list[str]]:
        """Every record, by claim UID, and one line per file that could not be read (renamed
        ``*.unreadable`` so a human can look; its claim is then unknown to the plugin)."""
        files.remove_stale_temporaries(self.directory, "")
        records: dict[str, ClaimRecord] = {}
        problems: list[str] = []
        for path in sorted(self.directory.glob("*.json")):
            if not _UID_FILE.match(path.name):
                continue
            try:
                record = ClaimRecord.from_dict(json.loads(path.read_text(encoding="utf-8")))
                if record.claim.uid != path.stem:
                    raise ValueError(f"it is the journal of claim UID {record.claim.uid!r}")
            except (OSError, ValueError, UnicodeDecodeError) as exc:
                problems.append(f"claim journal {path} is unreadable ({exc}); moved to {path.name}.unreadable, "
                                "its claim is no longer tracked")
                path.replace(path.with_name(path.name + ".unreadable"))
                continue
            records[record.claim.uid] = record
        return records, problems

    def write(self, record: ClaimRecord) -> None:
        files.write_atomic(self.path(record.claim.uid),
                           (json.dumps(record.to_dict(), indent=1, sort_keys=True) + "\n").encode(), mode=0o600)

    def delete(self, uid: str) -> None:
        files.remove(self.path(uid))


@dataclass(frozen=True)
class ClaimedDevices:
    """What the node's claims hold, as the plugin's journal says: read by the agent, which offers a
    device busy with a workload no claim holds as used outside DRA (withdrawn)."""

    gpus: frozenset[int]
    """GPUs a claim holds whole or a share of (any phase but rolled back); a GPU in MIG mode here is
    held whole through its full-size instance (in ``instances`` too)."""
    instances: frozenset[tuple[int, int]]
    """``(GPU, first memory slice)`` of each MIG placement a claim holds or is creating."""
    unreadable: tuple[str, ...] = ()
    """Journal files that could not be read (their claims' devices are not known)."""


def read_claimed_devices(directory: Path) -> ClaimedDevices | None:
    """The devices the claims journalled in ``directory`` hold, reading only (the plugin owns the
    files: nothing is renamed or created); None when the directory does not exist (no plugin has
    run on this node, or it is not mounted here), so nothing is known."""
    if not directory.is_dir():
        return None
    gpus: set[int] = set()
    instances: set[tuple[int, int]] = set()
    unreadable: list[str] = []
    for path in sorted(directory.glob("*.json")):
        if not _UID_FILE.match(path.name):
            continue
        try:
            record = ClaimRecord.from_dict(json.loads(path.read_text(encoding="utf-8")))
        except FileNotFoundError:
            continue  # unprepared and removed while we listed
        except (OSError, ValueError, UnicodeDecodeError) as exc:
            unreadable.append(f"{path.name}: {exc}")
            continue
        for device in record.devices:
            if device.placement is not None:
                instances.add((device.gpu, device.placement.start))
            if device.kind != "mig":  # a whole or shared GPU (a whole one in MIG mode: its instance too)
                gpus.add(device.gpu)
    return ClaimedDevices(frozenset(gpus), frozenset(instances), tuple(unreadable))
