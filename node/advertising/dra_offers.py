"""What each GPU of the node offers on the ``dra`` backend: NVML snapshot, faults and policy in, ``GpuOffer``s out (pure).

The device model is ``sharing.dra``'s; this module decides which of its
builders each GPU gets, and with what bounds:

* a GPU with **MIG on** is partitionable (``sharing.dra.mig_devices.mig_gpu``):
  its existing instances are offered as themselves (a claim holds them, or they
  were made before the node moved to DRA: either way nothing overlapping may be
  created) and, where reshaping is allowed, every placement of the SharingPolicy's
  allowed profiles that overlaps none of them. A GPU a claim holds **whole**
  (``DRA_WHOLE_GPU``: the plugin serves it with the full-size instance) offers
  its whole-GPU device only, so the allocation keeps naming a published device
  and its instance is never offered as itself to another claim;
* a GPU with **MIG off** is shared or whole, by the GPUNode spec's sharing mode
  (the one node-wide setting both backends read): ``mps`` and ``time-slicing``
  give one shared device with consumable capacity (``gpu_devices.shared_gpu``;
  the spec's ``replicas`` mean nothing here, every claim takes its own share),
  ``none`` one whole-GPU device for one claim (``gpu_devices.whole_gpu``).

**Reshaping allowed** means what it means on the device-plugin backend
(``sharing.rules.node_policy``): a SharingPolicy selects the node, does not pin a
static layout, has not frozen it (``maxConcurrent: 0``) and, if it lists
windows, one is open now. Otherwise only the existing instances are offered: a
claim for a new placement creates a MIG instance, which is a reshape.

**Use outside DRA withdraws** too, when the kubelet plugin's journal is
readable here (``node.draplugin.journal.read_claimed_devices``): a MIG instance
running a process while no claim holds its placement is withdrawn (and nothing
overlapping it is offered), and a MIG-off GPU running a process while no claim
holds it offers nothing; a claim given either would share it with a workload
gpupack does not know. Without the journal nothing counts as used outside.

**Faults withdraw** (invariant 5): every fault in force counts, whether or not
NVIDIA's device plugin would act on it, since here gpupack is the one that
advertises. A faulted or lost GPU offers nothing (not even its counter set); a
faulted MIG instance blocks its memory slices, so nothing that overlaps it is
offered; a GPU whose NVML reads fail, or whose MIG mode change waits for a
reset, is left out with a problem saying why.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from node.draplugin.journal import ClaimedDevices
from node.base.snapshot import GpuSnapshot, NodeSnapshot
from sharing.dra.gpu_devices import shared_gpu, whole_gpu
from sharing.dra.mig_devices import mig_gpu
from sharing.dra.model import DraModelError, GpuOffer
from sharing.dra.share_policy import SHARES, SharePolicy
from sharing.api.modes import NodeSharingMode

MiB = 2**20
DeviceKey = tuple[int, int | None]
"""``(GPU index, None)`` for a GPU, ``(GPU index, GPU-instance id)`` for a MIG instance."""


@dataclass(frozen=True)
class OfferRules:
    """How the node offers its GPUs: the settings and this tick's policy reading."""

    sharing: NodeSharingMode = "none"
    """The GPUNode spec's sharing mode, for GPUs with MIG off."""
    allowed_profiles: Collection[str] | None = None
    """The SharingPolicies' allowed profiles (None: all)."""
    reshape_blocked: str | None = None
    """Why no new MIG placement may be offered now; None: they may."""
    whole_gpu: bool = False
    """Also offer a MIG-enabled GPU whole (MIG off when prepared); only while reshaping is allowed."""
    share: SharePolicy = SHARES


@dataclass(frozen=True)
class NodeOffer:
    gpus: tuple[GpuOffer, ...]
    withdrawn: tuple[str, ...] = ()
    """What faults took off the offer, for people (``GPU 1 (fault)``, ``MIG instance 2 of GPU 0 ...``)."""
    problems: tuple[str, ...] = ()
    """GPUs left out for another reason, each saying why."""

    @property
    def device_count(self) -> int:
        return sum(len(g.devices) for g in self.gpus)


def node_offer(snapshot: NodeSnapshot, faulted: Collection[DeviceKey], rules: OfferRules,
               claimed: ClaimedDevices | None = None) -> NodeOffer:
    """Each GPU's offer (GPUs that offer nothing are left out), in index order. ``claimed``: what the
    kubelet plugin's journal says the node's claims hold (None: unknown, nothing counts as used
    outside DRA)."""
    gpus: list[GpuOffer] = []
    withdrawn: list[str] = []
    problems: list[str] = []
    faults = frozenset(faulted)
    for gpu in sorted(snapshot.gpus, key=lambda g: g.info.index):
        index = gpu.info.index
        if gpu.lost or (index, None) in faults:
            withdrawn.append(f"GPU {index} ({'lost' if gpu.lost else 'faulted'})")
            continue
        if claimed is not None and not gpu.info.mig_enabled and gpu.processes and index not in claimed.gpus:
            pids = ", ".join(str(p.pid) for p in gpu.processes[:3])
            withdrawn.append(f"GPU {index} (used outside DRA: pid {pids}, and no claim holds it)")
            continue
        if gpu.error is not None:
            problems.append(f"GPU {index} left out: NVML error: {gpu.error}")
            continue
        if gpu.info.mig_enabled != gpu.info.mig_pending:
            problems.append(f"GPU {index} left out: its MIG mode change waits for a GPU reset")
            continue
        try:
            offer = (_mig(gpu, faults, rules, withdrawn, claimed) if gpu.info.mig_enabled
                     else _unpartitioned(gpu, rules))
        except DraModelError as exc:
            problems.append(f"GPU {index} left out: {exc}")
            continue
        if offer is None:
            problems.append(f"GPU {index} left out: {gpu.info.name} has MIG on but no profile table")
        elif offer.devices:
            gpus.append(offer)
    return NodeOffer(tuple(gpus), tuple(withdrawn), tuple(problems))


def _mig(gpu: GpuSnapshot, faults: frozenset[DeviceKey], rules: OfferRules, withdrawn: list[str],
         claimed: ClaimedDevices | None) -> GpuOffer | None:
    if gpu.model is None:
        return None
    index = gpu.info.index
    if claimed is not None and index in claimed.gpus:  # held whole: its instance is the claim's (module docstring)
        return mig_gpu(gpu.model, index, gpu.info.uuid, allowed_profiles=frozenset(), whole_gpu=True)
    bad = [i for i in gpu.instances if (index, i.gi_id) in faults]
    withdrawn += [f"MIG instance {i.gi_id} of GPU {index} ({i.profile} at {i.placement.start}, faulted)" for i in bad]
    if claimed is not None:
        # A workload no claim put there: a claim given this instance would share it with a stranger.
        busy = gpu.busy_gi_ids()
        foreign = [i for i in gpu.instances if i not in bad and i.gi_id in busy
                   and (index, i.placement.start) not in claimed.instances]
        withdrawn += [f"MIG instance {i.gi_id} of GPU {index} ({i.profile} at {i.placement.start}, used outside "
                      "DRA)" for i in foreign]
        bad += foreign
    reshape = rules.reshape_blocked is None
    return mig_gpu(
        gpu.model, index, gpu.info.uuid,
        allowed_profiles=rules.allowed_profiles if reshape else frozenset(),
        in_use=[i.placed for i in gpu.instances if i not in bad],
        blocked=[i.placement for i in bad],
        whole_gpu=rules.whole_gpu and reshape,
    )


def _unpartitioned(gpu: GpuSnapshot, rules: OfferRules) -> GpuOffer:
    info = gpu.info
    memory = info.memory_total_mib * MiB
    if rules.sharing in ("mps", "time-slicing"):
        return shared_gpu(info.index, info.uuid, gpu.product, memory, rules.sharing, rules.share)
    return whole_gpu(info.index, info.uuid, gpu.product, memory)
