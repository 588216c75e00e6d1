"""Operator mode: the GPU Operator's mig-manager applies MIG layouts; the agent asks it to.

Per tick: if a mig-parted config the agent wrote is being applied, follow the
handshake (``nvidia.com/mig.config.state``); else, when GPUs' specs differ and
they are idle, write a per-node config into mig-parted's ConfigMap and select it
with ``nvidia.com/mig.config``. The pure parts (config names, per-device
entries, merge, handshake states) are in ``node.operator_mode``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kube.errors import KubeError
from kube.times import format_time, parse_time
from node import conditions as C
from node.context import AgentContext
from node.desired import desired_layouts
from node.snapshot import NodeSnapshot
from node.operator_mode import MIG_PARTED_KEY, handshake_state, merge_mig_parted, plan_node_config
from node.pods import busy_instances
from sharing.crd import GPUNodeSpec, LayoutRefusal
from sharing.keys import MIG_CONFIG_LABEL


def reconcile_operator(ctx: AgentContext, spec: GPUNodeSpec, generation: int, snapshot: NodeSnapshot,
                       reconf: Mapping[str, Any] | None, labels: Mapping[str, str]) -> C.LayoutReport:
    name, now = ctx.s.node_name, ctx.clock()
    desired, problems = desired_layouts(spec, snapshot)
    by_device, unresolved = ctx.busy_ctx
    idle: set[int] = set()
    for gpu in snapshot.gpus:
        current = [i.placed for i in gpu.instances]
        if busy_instances(gpu, by_device, unresolved):
            continue
        if not gpu.processes and not ctx.idle.not_idle_long_enough(gpu.info.uuid, current, now, ctx.rules.idle_seconds):
            idle.add(gpu.info.index)
    active = dict(reconf) if reconf and reconf.get("mode") == "operator" and reconf.get("phase") == "Applying" else None
    if active is not None:
        started = parse_time(active.get("startedAt"))
        elapsed = now - started.timestamp() if started is not None else float("inf")  # unreadable: timed out
        state = handshake_state(labels, str(active["migConfig"]), elapsed,
                                ctx.s.mig_config_timeout_seconds)
        if state == "pending":
            return C.LayoutReport(C.Cond(C.LAYOUT_APPLIED, "False", "Reconfiguring",
                                         f"waiting for mig-manager to apply {active['migConfig']}"), active=True)
        phase = {"success": "Succeeded", "failed": "Failed", "timeout": "Failed"}[state]
        message = {"success": "mig-manager applied the config",
                   "failed": "mig-manager reported nvidia.com/mig.config.state=failed",
                   "timeout": f"no result from mig-manager within {ctx.s.mig_config_timeout_seconds:g}s"}[state]
        obj = ctx.kube.patch_gpunode_status(name, {"reconfiguration": {**active, "phase": phase, "message": message}})
        ctx.remember(obj)
        ctx.metrics.reconfigurations.labels(phase).inc()
        ctx.event("Normal" if phase == "Succeeded" else "Warning", f"MigReconfiguration{phase}", message)
        return C.LayoutReport(C.Cond(C.LAYOUT_APPLIED, "True" if phase == "Succeeded" else "False",
                                     "AsRequested" if phase == "Succeeded" else "ReconfigurationFailed", message))
    refusals = {i: LayoutRefusal(phase="Refused", reason=r[:1024], generation=generation) for i, r in problems.items()}
    plan = plan_node_config(name, generation, snapshot, desired, frozenset(idle))
    done = reconf if reconf and reconf.get("mode") == "operator" and reconf.get("targetGeneration") == generation else None
    if plan.changed and done is not None:
        # mig-manager already answered for this spec; asking again would loop. A new spec retries.
        message = (f"mig-manager {str(done.get('phase')).lower()} for generation {generation} "
                   f"({done.get('message')}) but GPUs {list(plan.changed)} still differ")
        for index in plan.changed:
            refusals.setdefault(index, LayoutRefusal(phase="Failed", reason=message[:1024], generation=generation))
        return C.LayoutReport(C.Cond(C.LAYOUT_APPLIED, "False", "ReconfigurationFailed" if done.get("phase") == "Failed"
                                     else "LayoutMismatch", message), refusals=refusals)
    if not plan.changed:
        if plan.held or problems:
            held = {**{i: r for i, r in plan.held.items()}, **problems}
            return C.LayoutReport(C.Cond(C.LAYOUT_APPLIED, "False", "WaitingForIdle" if plan.held else "LayoutRefused",
                                         "; ".join(f"GPU {i}: {r}" for i, r in sorted(held.items()))), refusals=refusals)
        return C.LayoutReport(C.Cond(C.LAYOUT_APPLIED, "True", "AsRequested", "every GPU has the requested layout"))
    allowed, blocked = ctx.rules.may_start(now)
    if not allowed:
        return C.LayoutReport(C.Cond(C.LAYOUT_APPLIED, "False", "ReshapingNotAllowed",
                                     f"GPUs {list(plan.changed)}: {blocked}"), refusals=refusals)
    for _ in range(3):  # read-modify-write of a shared ConfigMap, guarded by resourceVersion
        cm = ctx.kube.get_configmap(ctx.s.device_plugin_namespace, ctx.s.mig_parted_configmap)
        data = dict((cm or {}).get("data") or {})
        data[MIG_PARTED_KEY] = merge_mig_parted(data.get(MIG_PARTED_KEY), name, plan)
        try:
            ctx.kube.write_configmap(ctx.s.device_plugin_namespace, ctx.s.mig_parted_configmap, data,
                                      (cm or {}).get("metadata", {}).get("resourceVersion"))
            break
        except KubeError as exc:
            if not exc.conflict:
                raise
    else:
        raise KubeError(409, f"ConfigMap {ctx.s.mig_parted_configmap} kept changing under us")
    entry = {"phase": "Applying", "mode": "operator", "migConfig": plan.name, "targetGeneration": generation,
             "startedAt": format_time(now), "message": f"GPUs {list(plan.changed)} via mig-manager",
             "step": 0, "plan": [{"op": "mig-config", "gpus": list(plan.changed)}]}
    ctx.remember(ctx.kube.patch_gpunode_status(name, {"reconfiguration": entry}))
    ctx.kube.patch_node(name, {"metadata": {"labels": {MIG_CONFIG_LABEL: plan.name}}})
    ctx.event("Normal", "MigReconfigurationStarted", f"set {MIG_CONFIG_LABEL}={plan.name} for GPUs {list(plan.changed)}")
    return C.LayoutReport(C.Cond(C.LAYOUT_APPLIED, "False", "Reconfiguring", f"mig-manager applying {plan.name}"),
                          active=True, refusals=refusals)


class MigManagerLayouts:
    """Layouts applied by the GPU Operator's mig-manager (``--mode operator``)."""

    def reconcile(self, ctx: AgentContext, spec: GPUNodeSpec, generation: int, snapshot: NodeSnapshot,
                  reconf: Mapping[str, Any] | None, labels: Mapping[str, str]) -> C.LayoutReport:
        return reconcile_operator(ctx, spec, generation, snapshot, reconf, labels)
