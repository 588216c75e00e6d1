"""Operator mode: the GPU Operator's mig-manager applies MIG layouts; the agent asks it to.

Per tick: if a mig-parted config the agent asked for is being applied, wait until
the controller has published it into mig-manager's ConfigMap, select it with
``nvidia.com/mig.config`` and follow the handshake (``nvidia.com/mig.config.state``);
else, when GPUs' specs differ and they are idle, ask for a per-node config in the
GPUNode's status (``reconfiguration.migConfigEntries``). The agent only reads the
ConfigMap: the controller is its writer (``controller.writes.mig_configs``), so no agent
can change another node's config. The pure parts (per-device entries, handshake
states) are in ``node.base.operator_mode``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kube.times import format_time, parse_time
from node.base import conditions as C
from node.base.context import AgentContext
from node.layouts.desired import desired_layouts
from node.base.snapshot import NodeSnapshot
from mig.migparted import MigConfigError, entries_to_data, parse_config
from node.base.operator_mode import handshake_state, plan_node_config
from node.base.pods import busy_instances
from sharing.api.crd import GPUNodeSpec, LayoutRefusal
from sharing.api.keys import MIG_CONFIG_LABEL, MIG_CONFIG_STATE_LABEL, MIG_PARTED_CONFIG_KEY


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
        config = str(active.get("migConfig"))
        if labels.get(MIG_CONFIG_LABEL) != config and elapsed < ctx.s.mig_config_timeout_seconds:
            if not _published(ctx, config, active.get("migConfigEntries")):
                return C.LayoutReport(C.Cond(C.LAYOUT_APPLIED, "False", "Reconfiguring",
                                             f"waiting for the controller to publish {config} into "
                                             f"{ctx.s.device_plugin_namespace}/{ctx.s.mig_parted_configmap}"),
                                      active=True)
            # The state label goes to pending in the same patch: a "success" left from the last
            # config must not read as this one's answer before mig-manager has seen the change.
            ctx.kube.patch_node(name, {"metadata": {"labels": {MIG_CONFIG_LABEL: config,
                                                               MIG_CONFIG_STATE_LABEL: "pending"}}})
            ctx.event("Normal", "MigReconfigurationStarted", f"set {MIG_CONFIG_LABEL}={config}: {active.get('message')}")
            return C.LayoutReport(C.Cond(C.LAYOUT_APPLIED, "False", "Reconfiguring", f"mig-manager applying {config}"),
                                  active=True)
        state = handshake_state(labels, config, elapsed, ctx.s.mig_config_timeout_seconds)
        if state == "pending":
            return C.LayoutReport(C.Cond(C.LAYOUT_APPLIED, "False", "Reconfiguring",
                                         f"waiting for mig-manager to apply {config}"), active=True)
        phase = {"success": "Succeeded", "failed": "Failed", "timeout": "Failed"}[state]
        message = {"success": "mig-manager applied the config",
                   "failed": "mig-manager reported nvidia.com/mig.config.state=failed",
                   "timeout": f"no result from mig-manager within {ctx.s.mig_config_timeout_seconds:g}s"
                   if labels.get(MIG_CONFIG_LABEL) == config else
                   f"the controller did not publish {config} into {ctx.s.device_plugin_namespace}/"
                   f"{ctx.s.mig_parted_configmap} within {ctx.s.mig_config_timeout_seconds:g}s"}[state]
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
    entry = {"phase": "Applying", "mode": "operator", "migConfig": plan.name, "targetGeneration": generation,
             "startedAt": format_time(now), "message": f"GPUs {list(plan.changed)} via mig-manager",
             "migConfigEntries": entries_to_data(plan.entries),
             "step": 0, "plan": [{"op": "mig-config", "gpus": list(plan.changed)}]}
    ctx.remember(ctx.kube.patch_gpunode_status(name, {"reconfiguration": entry}))
    ctx.event("Normal", "MigReconfigurationRequested", f"asked for {plan.name} (GPUs {list(plan.changed)})")
    return C.LayoutReport(C.Cond(C.LAYOUT_APPLIED, "False", "Reconfiguring",
                                 f"waiting for the controller to publish {plan.name}"),
                          active=True, refusals=refusals)


def _published(ctx: AgentContext, config: str, asked: Any) -> bool:
    """Whether mig-manager's ConfigMap holds ``config`` with the entries this agent asked for."""
    cm = ctx.kube.get_configmap(ctx.s.device_plugin_namespace, ctx.s.mig_parted_configmap)
    text = ((cm or {}).get("data") or {}).get(MIG_PARTED_CONFIG_KEY)
    if not text:
        return False
    try:
        entries = parse_config(text).mig_configs.get(config)
    except MigConfigError:
        return False
    return entries is not None and entries_to_data(entries) == asked


class MigManagerLayouts:
    """Layouts applied by the GPU Operator's mig-manager (``--mode operator``)."""

    def reconcile(self, ctx: AgentContext, spec: GPUNodeSpec, generation: int, snapshot: NodeSnapshot,
                  reconf: Mapping[str, Any] | None, labels: Mapping[str, str]) -> C.LayoutReport:
        return reconcile_operator(ctx, spec, generation, snapshot, reconf, labels)
