"""Which faults NVIDIA's device plugin acts on by itself, and which devices it then withdraws.

Read from its source (k8s-device-plugin, ``internal/rm/health.go``, ``checkHealth``),
facts only:

* it listens for ``nvmlEventTypeXidCriticalError`` only: ECC events, retired pages
  and row remapping never make it withdraw a device;
* it ignores the application XIDs 13, 31, 43, 45, 68 and 109;
* an event NVML ties to a MIG instance (GPU- and compute-instance ids) marks the
  MIG devices with those ids; an event on the whole GPU marks every device of that
  GPU (every MIG device, every shared replica) -- as of PR #1930 (merged 2026),
  which fixed it keeping one device per physical GPU (before it, an XID marked at
  most one replica of a shared GPU and could miss a MIG instance altogether);
* when waiting for events fails (a lost GPU), it marks every device unhealthy;
* a device it marked unhealthy stays so until the plugin restarts.

gpupack does not rely on the fix for shared GPUs: on an MPS or time-sliced GPU the
kubelet, not gpupack, picks which replica a pod gets, and a plugin release from
before the fix keeps the other replicas advertised, so a fault there counts as
*not* withdrawn and gpupack keeps new pods off the node itself (``degraded``).
"""

from __future__ import annotations

from collections.abc import Iterable

from node.base.snapshot import NodeSnapshot

PLUGIN_IGNORED_XIDS: frozenset[int] = frozenset({13, 31, 43, 45, 68, 109})


def withdraws(xid: int, *, on_instance: bool, mig: bool, shared: bool) -> bool:
    """Whether the device plugin withdraws the faulted device(s) by itself for a critical ``xid``."""
    if xid in PLUGIN_IGNORED_XIDS:
        return False
    if on_instance or mig:
        return True
    return not shared


def withdrawn_devices(snapshot: NodeSnapshot, faults: Iterable[tuple[tuple[int, int | None], bool]]) -> frozenset[str]:
    """Device UUIDs the plugin withholds for ``faults`` (``((gpu index, GPU-instance id), withdrawn)``):
    a MIG instance's UUID, or every device of a GPU (the GPU's own UUID and its instances')."""
    out: set[str] = set()
    for (index, gi), withdrawn in faults:
        gpu = snapshot.gpu(index)
        if not withdrawn or gpu is None:
            continue
        if gi is None:
            out.add(gpu.info.uuid)
            out.update(i.uuid for i in gpu.instances)
        else:
            out.update(i.uuid for i in gpu.instances if i.gi_id == gi)
    return frozenset(u for u in out if u)
