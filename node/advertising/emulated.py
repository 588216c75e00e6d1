"""SIMULATION: the device plugin's emulator advertises the node's GPUs (``--emulate-device-plugin``).

On a simulated node (no kubelet device plugin, no real processes)
:class:`EmulatedDevicePlugin` plays the plugin: ``allocate`` hands bound pods a
device and a simulated process inside it (Allocate, and the workload), and
``publish`` patches the Node with what ``node.base.device_plugin_emulator`` computes
from NVML and the spec's sharing, and tells the simulated NVML which GPUs it serves through
MPS (their clients' SM samples then go to an MPS server, as on hardware). Nothing has to be
paused or restarted.

**MPS memory limits.** The simulated NVML holds an MPS client to the limit a real deployment gives it
(``node.nvml.simulated``), and the emulator passes what the real stack passes, both parts of it:

* the NVIDIA device plugin's: its MPS control daemon sets every GPU's default pinned memory limit to the
  GPU's memory divided by the replicas, in whole MiB (``set_default_device_pinned_mem_limit``;
  NVIDIA/k8s-device-plugin, ``cmd/mps-control-daemon/mps/daemon.go``,
  ``perDevicePinnedDeviceMemoryLimits``); its Allocate sets no memory variable. ``publish`` tells
  the simulated NVML that default with ``set_mps``;
* gpupack's own per-pod limit: the webhook writes ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` into the
  container's env (``sharing.admission.decision``; a right-sized pod's is its recommended memory), and
  the kubelet hands the container's env to the process, so ``allocate`` starts each pod's process with
  its container's env (``PodUse.envs``).

A client's variable only narrows the daemon's default (NVIDIA's MPS documentation), so the limit in force
is the smaller: for a gpupack pod the webhook's (a share fits a replica only when ``replicas x memory``
is at most the GPU's, ``sharing.rules.replicas.fits_replicas``), for a pod the webhook did not size
the replica's. A pod whose container sets a malformed value gets no process (a real client fails to
start), with a warning naming the pod and the value, once.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from node.base import conditions as C
from node.base.context import AgentContext, JournalStore
from node.base.device_plugin_emulator import advertise, node_patches
from node.base.snapshot import NodeSnapshot
from node.base.journal import Journal
from node.nvml.simulated import SimulatedNvml
from node.base.pods import SIM_PID_BASE, PodUse, assign_pods, sim_pid
from sharing.api.crd import GPUNodeSpec
from sharing.api.keys import DEPLOY_DEVICE_PLUGIN_LABEL
from sharing.api.mps_env import MpsEnvError

log = logging.getLogger("gpupack.agent")


class EmulatedDevicePlugin:
    """The device plugin's part, played by the agent on a simulated node."""

    def __init__(self) -> None:
        self.withheld: frozenset[str] = frozenset()
        """Devices the plugin reports unhealthy; as the real plugin, it forgets them only on a restart."""
        self.refused: set[int] = set()
        """Simulated pids whose start was refused (a malformed MPS limit): warned about once."""

    def health(self, ctx: AgentContext, withheld: frozenset[str], restart: bool) -> None:
        self.withheld = withheld if restart else self.withheld | withheld

    def allocate(self, ctx: AgentContext, snapshot: NodeSnapshot, uses: list[PodUse], labels: Mapping[str, str],
                 replicas: int) -> bool:
        if not isinstance(ctx.backend, SimulatedNvml) or snapshot.error is not None:
            return False
        emulate_allocation(ctx.backend, snapshot, uses, labels, replicas, self.withheld, self.refused)
        return True

    def wait_paused(self, ctx: AgentContext) -> None:
        return None  # nothing runs that could hold a device

    def restart(self, ctx: AgentContext, journal: Journal, store: JournalStore) -> Journal:
        return journal

    def readvertise(self, ctx: AgentContext, snapshot: NodeSnapshot, node: Mapping[str, Any]) -> bool:
        emulate_advertisement(ctx, snapshot, node, None, self.withheld)
        return True

    def publish(self, ctx: AgentContext, snapshot: NodeSnapshot, node: Mapping[str, Any], spec: GPUNodeSpec | None,
                labels: Mapping[str, str]) -> list[C.Cond]:
        if snapshot.error is not None:
            return []
        if isinstance(ctx.backend, SimulatedNvml):
            # The real plugin starts an MPS control daemon for the GPUs it shares through MPS: the
            # simulated NVML then samples their clients' SM load to the MPS server, as NVML does.
            serves_mps = spec is not None and spec.sharing.mode == "mps"
            replicas = spec.sharing.replicas if spec is not None else 1
            for gpu in snapshot.gpus:
                # The daemon's default client limit: the GPU's memory over the replicas (module docstring).
                ctx.backend.set_mps(gpu.info.index, serves_mps and not gpu.info.mig_enabled,
                                    default_limit_mib=max(1, gpu.info.memory_total_mib // max(1, replicas)))
        return [emulate_advertisement(ctx, snapshot, node, spec, self.withheld)]


def emulate_allocation(sim: SimulatedNvml, snapshot: NodeSnapshot, uses: list[PodUse], labels: Mapping[str, str],
                       replicas: int, withheld: frozenset[str] = frozenset(), refused: set[int] | None = None) -> None:
    """Hand devices to pods as the device plugin would, with a process in each, started with its container's
    env. ``refused``: pids whose start was refused and warned about (a malformed MPS limit, module docstring);
    kept by the caller so each is warned about once."""
    refused = set() if refused is None else refused
    device_at: dict[int, tuple[int, int | None, str]] = {}
    for gpu in snapshot.gpus:
        uuid_of = {i.gi_id: i.uuid for i in gpu.instances}
        for proc in gpu.processes:
            device = uuid_of.get(proc.gi_id, "") if proc.gi_id is not None else gpu.info.uuid
            device_at[proc.pid] = (gpu.info.index, proc.gi_id, device)
    existing = {f"{u.uid}/{o}": device_at[sim_pid(u.uid, o)][2]
                for u in uses for o in range(u.count) if sim_pid(u.uid, o) in device_at}
    paused = labels.get(DEPLOY_DEVICE_PLUGIN_LABEL, "true") != "true"
    lost = frozenset({g.info.uuid for g in snapshot.gpus if g.lost} | {i.uuid for g in snapshot.gpus if g.lost for i in g.instances})
    wanted = existing if paused else assign_pods(snapshot, uses, existing, replicas, withheld, lost)
    where: dict[str, tuple[int, int | None]] = {}
    for gpu in snapshot.gpus:
        where[gpu.info.uuid] = (gpu.info.index, None)
        for inst in gpu.instances:
            where[inst.uuid] = (gpu.info.index, inst.gi_id)
    keep: set[int] = set()
    key_of = {u.uid: u.key for u in uses}  # the process knows its pod, as a real one's cgroup does
    env_of = {f"{u.uid}/{o}": dict(env) for u in uses for o, env in enumerate(u.envs)}
    for slot, device in wanted.items():
        uid, ordinal = slot.rsplit("/", 1)
        pid = sim_pid(uid, int(ordinal))
        keep.add(pid)
        if pid not in device_at and device in where and device not in lost:
            index, gi_id = where[device]
            try:
                sim.start_process(index, pid, 1024, gi_id, owner=key_of.get(uid, ""), env=env_of.get(slot, {}))
            except MpsEnvError as exc:
                if pid not in refused:
                    refused.add(pid)
                    log.warning("SIMULATED device plugin: the process of pod %s does not start: %s",
                                key_of.get(uid, uid), exc)
    for pid, (index, _gi, _dev) in device_at.items():
        if pid >= SIM_PID_BASE and pid not in keep:
            sim.stop_process(index, pid)


def emulate_advertisement(ctx: AgentContext, snapshot: NodeSnapshot, node: Mapping[str, Any],
                          spec: GPUNodeSpec | None, withheld: frozenset[str] = frozenset()) -> C.Cond:
    mode = spec.sharing.mode if spec else "none"
    replicas = spec.sharing.replicas if spec else 1
    adv = advertise(snapshot, mode, replicas, withheld)
    status_patch, meta_patch = node_patches(adv, node)
    if meta_patch:
        ctx.kube.patch_node(ctx.s.node_name, meta_patch)
    if status_patch:
        ctx.kube.patch_node_status(ctx.s.node_name, status_patch)
    summary = ", ".join(f"{k}={v}" for k, v in sorted(adv.resources.items())) or "nothing"
    if adv.unhealthy:
        summary += " (unhealthy, not allocatable: " + ", ".join(f"{k}={v}" for k, v in sorted(adv.unhealthy.items())) + ")"
    return C.Cond(C.DEVICE_PLUGIN_READY, "True", "Emulated", f"SIMULATED device plugin advertises {summary}")
