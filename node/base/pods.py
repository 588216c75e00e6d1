"""Which pod uses which GPU device, and which instances count as busy.

Sources, best first:

1. The kubelet PodResources API (``node.podresources``): the devices the device
   plugin gave each admitted pod (merged in by the agent).
2. NVML processes mapped to pods through ``/proc/<pid>/cgroup`` (the pod UID is
   in the cgroup path under both cgroup v1 and v2 with the systemd or cgroupfs
   driver); needs ``hostPID`` in the DaemonSet.
3. Pods bound to this node that request ``nvidia.com/*`` resources but that
   neither source resolves: the device plugin has handed them *some* device of
   that resource (or will), and we cannot tell which, so every instance of that
   profile counts as busy (conservative: it may delay a reshape, it never
   destroys a pod's device).

In simulation the device-plugin emulator assigns pods to devices itself
(``assign_pods``) and starts a simulated process in the device, so source 1
resolves every pod exactly.
"""

from __future__ import annotations

import re
import zlib
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mig.model import PlacedInstance
from node.base.snapshot import GpuSnapshot, NodeSnapshot
from sharing.api.keys import NVIDIA_PREFIX, SHARED_RESOURCE, WHOLE_RESOURCE, mig_profile_of

SIM_PID_BASE = 4_000_000  # simulated pod processes live above this pid
_POD_UID = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")


Env = tuple[tuple[str, str], ...]
"""A container's environment variables, ``(name, value)`` in the order the spec lists them."""


@dataclass(frozen=True)
class PodUse:
    """A pod on this node holding (or about to hold) ``count`` devices of ``resource``."""

    key: str
    """``namespace/name``"""
    uid: str
    resource: str
    count: int
    containers: tuple[str, ...] = ()
    """Names of the pod's containers (init containers too) that ask for ``resource``."""
    envs: tuple[Env, ...] = ()
    """Per device the pod holds of ``resource``, in ordinal order: the environment its container sets with
    literal values (the webhook's MPS limits among them; ``valueFrom`` entries are not resolved here).
    Empty when no container that asks for ``resource`` sets any."""


def pod_uses(pods: Iterable[Mapping[str, Any]], node_name: str) -> list[PodUse]:
    """GPU resource uses of the non-terminated pods bound to ``node_name``."""
    uses: list[PodUse] = []
    for pod in pods:
        spec, meta = pod.get("spec") or {}, pod.get("metadata") or {}
        if spec.get("nodeName") != node_name:
            continue
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        wanted: Counter[str] = Counter()
        askers: dict[str, list[str]] = {}
        envs: dict[str, list[Env]] = {}
        for container in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]:
            limits = ((container.get("resources") or {}).get("limits")) or {}
            for name, value in limits.items():
                if name.startswith(NVIDIA_PREFIX):
                    try:
                        count = int(str(value))
                    except ValueError:
                        continue
                    wanted[name] += count
                    envs.setdefault(name, []).extend([_literal_env(container)] * max(0, count))
                    if container.get("name"):
                        askers.setdefault(name, []).append(str(container["name"]))
        key = f"{meta.get('namespace', 'default')}/{meta.get('name', '')}"
        uses.extend(PodUse(key, str(meta.get("uid", "")), r, c, tuple(askers.get(r, ())),
                           tuple(envs[r]) if any(envs.get(r, ())) else ())
                    for r, c in sorted(wanted.items()) if c > 0)
    return uses


def _literal_env(container: Mapping[str, Any]) -> Env:
    """The variables ``container`` sets to a literal value (``value``, possibly empty)."""
    return tuple((str(e["name"]), str(e.get("value") or "")) for e in container.get("env") or []
                 if isinstance(e, Mapping) and e.get("name") and "valueFrom" not in e)


def sim_pid(uid: str, ordinal: int = 0) -> int:
    """Stable simulated pid of a pod's ``ordinal``-th device (so restarts find their own)."""
    return SIM_PID_BASE + (zlib.crc32(f"{uid}/{ordinal}".encode()) % 1_000_000) * 8 + ordinal % 8


def pod_uid_of_pid(pid: int, proc_root: Path = Path("/proc")) -> str | None:
    """The pod UID in ``/proc/<pid>/cgroup``, normalised to dashes; None if not a pod's."""
    try:
        text = (proc_root / str(pid) / "cgroup").read_text()
    except OSError:
        return None
    match = _POD_UID.search(text)
    return match.group(1).replace("_", "-") if match else None


def devices_of(snapshot: NodeSnapshot, resource: str, replicas: int) -> list[str]:
    """Device ids the device plugin would advertise for ``resource``, each repeated per share."""
    profile = mig_profile_of(resource)
    if profile is not None:
        return [i.uuid for g in snapshot.gpus if g.info.mig_enabled for i in g.instances if i.profile == profile]
    full = [g.info.uuid for g in snapshot.gpus if not g.info.mig_enabled and g.error is None]
    if resource == SHARED_RESOURCE:
        return [u for u in full for _ in range(replicas)]
    if resource == WHOLE_RESOURCE:
        return full
    return []


def assign_pods(
    snapshot: NodeSnapshot, uses: Sequence[PodUse], existing: Mapping[str, str], replicas: int,
    withheld: frozenset[str] = frozenset(), lost: frozenset[str] = frozenset(),
) -> dict[str, str]:
    """SIMULATION: the device plugin's Allocate. ``existing``/result: ``uid/ordinal`` -> device UUID.

    Keeps every existing assignment whose device still exists; gives new pods the
    first free devices (lowest GPU, lowest placement), as the plugin's default does.
    Pods that find no device stay unassigned (the real kubelet would reject them).
    Devices the plugin reports unhealthy (``withheld``) go to no new pod; pods that hold
    one keep it (a running container keeps its device), as do pods on a ``lost`` GPU's devices.
    """
    result: dict[str, str] = {}
    free: dict[str, list[str]] = {}
    for use in uses:
        if use.resource not in free:
            free[use.resource] = devices_of(snapshot, use.resource, replicas)
    for use in uses:
        for ordinal in range(use.count):
            slot = f"{use.uid}/{ordinal}"
            device = existing.get(slot)
            if device is not None and device in free[use.resource]:
                free[use.resource].remove(device)
                result[slot] = device
            elif device is not None and device in lost:
                result[slot] = device
    for use in uses:
        for ordinal in range(use.count):
            slot = f"{use.uid}/{ordinal}"
            healthy = [d for d in free[use.resource] if d not in withheld]
            if slot not in result and healthy:
                free[use.resource].remove(healthy[0])
                result[slot] = healthy[0]
    return result


def pods_by_device(
    snapshot: NodeSnapshot, uses: Sequence[PodUse], uid_of_pid: Mapping[int, str]
) -> tuple[dict[str, list[str]], list[PodUse]]:
    """(device UUID -> pods, pod uses that no process resolves)."""
    key_of_uid = {u.uid: u.key for u in uses}
    by_device: dict[str, list[str]] = {}
    resolved: set[str] = set()
    for gpu in snapshot.gpus:
        gi_uuid = {i.gi_id: i.uuid for i in gpu.instances}
        for proc in gpu.processes:
            uid = uid_of_pid.get(proc.pid)
            if uid is None or uid not in key_of_uid:
                continue
            device = gi_uuid.get(proc.gi_id, gpu.info.uuid) if proc.gi_id is not None else gpu.info.uuid
            pods = by_device.setdefault(device, [])
            if key_of_uid[uid] not in pods:
                pods.append(key_of_uid[uid])
            resolved.add(uid)
    unresolved = [u for u in uses if u.uid not in resolved]
    return by_device, unresolved


def pods_by_pid(uses: Sequence[PodUse], uid_of_pid: Mapping[int, str]) -> dict[int, str]:
    """GPU process id -> ``namespace/name`` of the pod it runs in, for the pods of ``uses``."""
    key_of_uid = {u.uid: u.key for u in uses}
    return {pid: key_of_uid[uid] for pid, uid in uid_of_pid.items() if uid in key_of_uid}


def busy_instances(
    gpu: GpuSnapshot, by_device: Mapping[str, Sequence[str]], unresolved: Sequence[PodUse]
) -> frozenset[PlacedInstance]:
    """Instances of ``gpu`` with a process, a known pod, or possibly an unresolved pod."""
    with_process = gpu.busy_gi_ids()
    unknown_profiles = {p for u in unresolved
                        if (p := mig_profile_of(u.resource)) is not None}
    return frozenset(
        i.placed for i in gpu.instances
        if i.gi_id in with_process or by_device.get(i.uuid) or i.profile in unknown_profiles
    )
