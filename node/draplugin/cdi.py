"""The CDI spec of a prepared claim: what the container runtime adds to a container given its devices.

The kubelet passes the CDI device ids the plugin answers with to the container
runtime, which looks them up in the spec files of its CDI directory
(``/var/run/cdi`` by default, the runtime's transient location) and applies
their ``containerEdits``. gpupack writes one spec file per claim,
``gpu.gpupack.io-claim_<claim UID>.json``, kind ``gpu.gpupack.io/claim``, with
one CDI device per allocated device, named ``<claim UID>-<n>`` (``n``: the
device's position among the claim's gpupack devices). Its id is
``gpu.gpupack.io/claim=<claim UID>-<n>``.

Each device's edits are environment variables for the NVIDIA container toolkit
and CUDA: ``NVIDIA_VISIBLE_DEVICES`` with the UUID of the MIG device or GPU, and
for an MPS share its limits (``node.draplugin.mps``). A device per allocated
device (not one per claim) keeps a container that names one request of a claim
to that request's devices. Environment edits of one name override each other,
so a container handed several gpupack devices sees the last one's variables:
one gpupack device per container is what this spec supports.

``cdiVersion`` is ``0.5.0``: environment variables and bind mounts are all the
spec uses, and they are in every CDI version; the oldest version that has them
and that current runtimes still accept keeps older containerd and CRI-O working.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from node.draplugin import files
from sharing.dra.names import DRIVER

CDI_VERSION: Final = "0.5.0"
CDI_CLASS: Final = "claim"
CDI_KIND: Final = f"{DRIVER}/{CDI_CLASS}"
SPEC_PREFIX: Final = f"{DRIVER}-{CDI_CLASS}_"
VISIBLE_DEVICES_ENV: Final = "NVIDIA_VISIBLE_DEVICES"

_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$")
MAX_UID = 128


@dataclass(frozen=True)
class Mount:
    """A bind mount into the container (host path and container path the same)."""

    path: str

    def to_json(self) -> dict[str, Any]:
        return {"hostPath": self.path, "containerPath": self.path, "options": ["rw", "bind"]}


@dataclass(frozen=True)
class CdiDevice:
    env: tuple[str, ...]
    mounts: tuple[Mount, ...] = ()


def check_uid(uid: str) -> None:
    """Raise ``ValueError`` unless ``uid`` can name a CDI device and a file (Kubernetes UIDs always can)."""
    if not isinstance(uid, str) or not uid or len(uid) > MAX_UID or not _NAME.match(uid):
        raise ValueError(f"claim UID {str(uid)[:MAX_UID]!r} cannot name a CDI device (expected letters, digits, "
                         "'-', '_', '.', ':' as Kubernetes UIDs have, at most 128 characters)")


def device_name(uid: str, n: int) -> str:
    return f"{uid}-{n}"


def device_id(uid: str, n: int) -> str:
    """The fully qualified CDI device id the kubelet passes to the runtime."""
    return f"{CDI_KIND}={device_name(uid, n)}"


def spec_path(cdi_dir: Path, uid: str) -> Path:
    return cdi_dir / f"{SPEC_PREFIX}{uid}.json"


def uid_of_spec(path: Path) -> str | None:
    """The claim UID of a spec file gpupack wrote, or None for anybody else's file."""
    name = path.name
    if name.startswith(SPEC_PREFIX) and name.endswith(".json"):
        return name[len(SPEC_PREFIX):-len(".json")] or None
    return None


def claim_spec(uid: str, devices: Sequence[CdiDevice]) -> dict[str, Any]:
    """The spec of claim ``uid``: device ``n`` of ``devices`` is ``<uid>-<n>``."""
    check_uid(uid)
    entries = []
    for n, device in enumerate(devices):
        edits: dict[str, Any] = {"env": list(device.env)}
        if device.mounts:
            edits["mounts"] = [m.to_json() for m in device.mounts]
        entries.append({"name": device_name(uid, n), "containerEdits": edits})
    return {"cdiVersion": CDI_VERSION, "kind": CDI_KIND, "devices": entries}


def write_spec(cdi_dir: Path, uid: str, spec: dict[str, Any]) -> Path:
    """Write the spec atomically (a runtime reading the directory never sees half a file)."""
    path = spec_path(cdi_dir, uid)
    files.write_atomic(path, (json.dumps(spec, indent=2, sort_keys=True) + "\n").encode())
    return path


def remove_spec(cdi_dir: Path, uid: str) -> bool:
    return files.remove(spec_path(cdi_dir, uid))
