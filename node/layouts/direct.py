"""Direct mode: the agent reshapes MIG itself through NVML, journaled in ``GPUNode`` status.

Per tick: resume an active journal (always first), else for each GPU whose spec
differs, decide (start, wait, refuse) and start at most one reshape per node. The
device plugin is paused (``nvidia.com/gpu.deploy.device-plugin``) before the first
NVML change, as mig-manager does, and resumed afterwards; the journal closes once
the Node's allocatable shows exactly the new MIG resources.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from kube.times import format_time
from node.base import conditions as C
from node.layouts.desired import desired_layouts, pinned_layouts
from node.base.context import AgentContext
from node.base.device_plugin_emulator import advertise
from node.base.snapshot import NodeSnapshot
from node.base.journal import NVML_PHASES, Journal, format_instance
from node.base.kube import Kube
from node.layouts.mig_loop import GpuDriver, GpuTarget, StartRules
from node.layouts.reshape_start import StartDecision
from node.layouts.reconciler import MigReconciler, finish
from sharing.api.crd import GPUNodeSpec, LayoutRefusal, LayoutRefusalPhase
from sharing.api.keys import DEPLOY_DEVICE_PLUGIN_LABEL, MIG_CONFIG_STATE_LABEL, mig_profile_of

log = logging.getLogger("gpupack.agent")
PAUSED_VALUE = "paused-for-mig-change"  # the value mig-manager uses; the plugin DaemonSet selects "true"




def journal_wire(journal: Journal) -> dict[str, Any]:
    """``GPUNode.status.reconfiguration``: the typed fields the controller reads, plus the journal."""
    done = sum(1 for s in journal.steps if s.startswith(("destroyed ", "created ")))
    plan = [{"op": "destroy", "instance": format_instance(i)} for i in journal.destroy]
    plan += [{"op": "create", "instance": format_instance(i)} for i in journal.create]
    return {"phase": journal.phase, "step": done, "plan": plan, "targetGeneration": journal.generation,
            "startedAt": format_time(journal.started_at), "message": journal.reason[:4096] or None,
            "mode": "direct", "gpuIndex": journal.gpu_index, "journal": journal.to_dict()}


def journal_from_status(raw: Mapping[str, Any] | None) -> Journal | None:
    if not raw or raw.get("mode") != "direct" or "journal" not in raw:
        return None
    return Journal.from_dict(raw["journal"])


class KubeJournalStore:
    """Journals go to the API server synchronously; a failed write stops the step."""

    def __init__(self, kube: Kube, node: str, on_write: Callable[[dict[str, Any]], None]) -> None:
        self._kube, self._node, self._on_write = kube, node, on_write

    def save(self, journal: Journal) -> None:
        obj = self._kube.patch_gpunode_status(self._node, {"reconfiguration": journal_wire(journal)})
        self._on_write(obj)


def reconcile_direct(ctx: AgentContext, spec: GPUNodeSpec, generation: int, snapshot: NodeSnapshot,
                     reconf: Mapping[str, Any] | None, labels: Mapping[str, str]) -> C.LayoutReport:
    assert ctx.backend is not None
    try:
        journal = journal_from_status(reconf)
    except ValueError as exc:
        ctx.event("Warning", "JournalUnreadable", str(exc))
        journal = None
    store = KubeJournalStore(ctx.kube, ctx.s.node_name, ctx.remember)
    reconciler = MigReconciler(ctx.backend, store, ctx.busy, ctx.clock,
                               max_errors=ctx.s.max_nvml_errors, event=ctx.event)
    driver = GpuDriver(reconciler, ctx.backend, ctx.busy, ctx.idle, pause_hook(ctx, store))
    rules = StartRules(ctx.rules.idle_seconds, ctx.s.retry_seconds)
    desired, problems = desired_layouts(spec, snapshot)
    pinned = pinned_layouts(spec, snapshot)
    now = ctx.clock()
    decisions: dict[int, StartDecision] = {}
    if journal is not None and journal.phase in NVML_PHASES:
        gpu = snapshot.gpu(journal.gpu_index)
        if gpu is None or gpu.info.uuid != journal.gpu_uuid:
            journal = journal.moved("Advertising", now, "journal names a GPU this node no longer has", outcome="Aborted")
            store.save(journal)
        else:
            assert gpu.model is not None
            target = GpuTarget(gpu.model, gpu.info.index, gpu.info.uuid, generation, desired.get(gpu.info.index))
            journal = driver.drive(target, journal, rules, now).journal
    manager_state = labels.get(MIG_CONFIG_STATE_LABEL, "")
    if (journal is None or not journal.active) and manager_state in ("pending", "rebooting"):
        # mig-manager is reconfiguring this node: two writers on NVML would fight.
        return C.LayoutReport(C.Cond(C.LAYOUT_APPLIED, "False", "MigManagerBusy",
                                     f"{MIG_CONFIG_STATE_LABEL}={manager_state}; waiting for mig-manager to finish"))
    blocked_rules = replace(rules, blocked=ctx.rules.may_start(now)[1])
    left_for_later = False
    if journal is None or not journal.active:
        for gpu in snapshot.gpus:
            index = gpu.info.index
            if index not in desired:
                continue
            want = desired[index]
            if gpu.error is not None:
                problems[index] = f"NVML error, not reshaped: {gpu.error}"
                continue
            if gpu.info.mig_enabled != gpu.info.mig_pending:
                problems[index] = "a MIG-mode change is pending until the GPU is reset; not reshaped"
                continue
            if (want is None) != (not gpu.info.mig_enabled):
                problems[index] = ("changing MIG mode needs a GPU reset; use operator mode (mig-manager) "
                                   "or switch it on the node")
                continue
            if want is None or gpu.model is None:
                continue
            own = journal if journal is not None and journal.gpu_index == index else None
            target = GpuTarget(gpu.model, index, gpu.info.uuid, generation, want, pinned.get(index))
            result = driver.drive(target, own, blocked_rules, now)
            if result.decision is not None:
                decisions[index] = result.decision
            if result.journal is not None and result.journal is not own:
                journal = result.journal
                # One GPU at a time per node (the policy's max_concurrent is the controller's); the GPUs
                # after it are not even looked at this tick, so the node's layout is not yet known to be done.
                left_for_later = True
                break
    if journal is not None and journal.phase == "Advertising":
        journal = advertise_after_reshape(ctx, journal, store, snapshot)
    return layout_report(journal, decisions, problems, generation, left_for_later=left_for_later)


def pause_hook(ctx: AgentContext, store: KubeJournalStore) -> Callable[[Journal], Journal]:
    def pause(journal: Journal) -> Journal:
        if not ctx.s.pause_device_plugin or journal.device_plugin_paused:
            return journal
        labels = (ctx.kube.get_node(ctx.s.node_name).get("metadata") or {}).get("labels") or {}
        before = labels.get(DEPLOY_DEVICE_PLUGIN_LABEL)
        journal = replace(journal, device_plugin_paused=True,
                          device_plugin_label="true" if before == PAUSED_VALUE else before)
        store.save(journal)  # write-ahead: a restart knows to un-pause, and to what
        ctx.kube.patch_node(ctx.s.node_name, {"metadata": {"labels": {DEPLOY_DEVICE_PLUGIN_LABEL: PAUSED_VALUE}}})
        ctx.advertiser.wait_paused(ctx)
        return journal
    return pause


def advertise_after_reshape(ctx: AgentContext, journal: Journal, store: KubeJournalStore, snapshot: NodeSnapshot) -> Journal:
    name = ctx.s.node_name
    if journal.device_plugin_paused:
        ctx.kube.patch_node(name, {"metadata": {"labels": {DEPLOY_DEVICE_PLUGIN_LABEL: journal.device_plugin_label}}})
        journal = journal.logged("device plugin resumed", ctx.clock(), device_plugin_paused=False)
        store.save(journal)
    else:
        journal = ctx.advertiser.restart(ctx, journal, store)
    snapshot = ctx.snapshot()
    node = ctx.kube.get_node(name)
    if ctx.advertiser.readvertise(ctx, snapshot, node):
        node = ctx.kube.get_node(name)
    # What the plugin offers: every MIG device NVML shows, less those it withholds as unhealthy.
    adv = advertise(snapshot, "none", 1, ctx.withheld(snapshot))
    expected = {k: v - adv.unhealthy.get(k, 0) for k, v in adv.resources.items()
                if mig_profile_of(k) is not None and v > adv.unhealthy.get(k, 0)}
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    shown = {k: int(v) for k, v in allocatable.items() if mig_profile_of(k) is not None and str(v) != "0"}
    now = ctx.clock()
    if shown == expected or now - journal.updated_at > ctx.s.advertise_timeout_seconds:
        reason = journal.reason if shown == expected else (
            f"{journal.reason}; device plugin did not re-advertise within {ctx.s.advertise_timeout_seconds:g}s")
        journal = replace(finish(journal, now), reason=reason)
        store.save(journal)
        outcome = journal.phase
        ctx.metrics.reconfigurations.labels(outcome).inc()
        ctx.metrics.reconfigure_seconds.observe(now - journal.started_at)
        ctx.event("Normal" if outcome == "Succeeded" else "Warning", f"MigReconfiguration{outcome}",
                    f"GPU {journal.gpu_index}: {outcome.lower()} in {now - journal.started_at:.1f}s; "
                    f"layout {', '.join(map(format_instance, journal.target if outcome == 'Succeeded' else journal.previous))}"
                    + (f" ({journal.reason})" if journal.reason else ""))
    return journal


def layout_report(journal: Journal | None, decisions: Mapping[int, StartDecision],
                  problems: Mapping[int, str], generation: int, *, left_for_later: bool = False) -> C.LayoutReport:
    """The LayoutApplied condition, and each GPU given up on for ``generation`` (typed)."""
    refused = {i: d.reason for i, d in decisions.items() if d.kind == "refuse"} | dict(problems)
    refusals = {i: LayoutRefusal(phase="Refused", reason=r[:1024], generation=generation) for i, r in refused.items()}
    gave_up = journal is not None and journal.generation == generation and journal.phase in ("Failed", "Aborted")
    if gave_up and journal is not None and journal.gpu_index not in refusals:
        phase: LayoutRefusalPhase = "Failed" if journal.phase == "Failed" else "Aborted"
        refusals[journal.gpu_index] = LayoutRefusal(phase=phase, reason=(journal.reason or phase)[:1024],
                                                    generation=generation)
    active = bool(journal and journal.active) or left_for_later  # more to do: tick again soon
    return C.LayoutReport(layout_condition(journal, decisions, problems, generation, left_for_later), active, refusals)


def layout_condition(journal: Journal | None, decisions: Mapping[int, StartDecision],
                     problems: Mapping[int, str], generation: int, left_for_later: bool = False) -> C.Cond:
    if journal is not None and journal.active:
        return C.Cond(C.LAYOUT_APPLIED, "False", "Reconfiguring",
                      f"GPU {journal.gpu_index}: {journal.phase}" + (f" ({journal.reason})" if journal.reason else ""))
    refused = {i: d.reason for i, d in decisions.items() if d.kind == "refuse"} | dict(problems)
    if refused:
        return C.Cond(C.LAYOUT_APPLIED, "False", "LayoutRefused",
                      "; ".join(f"GPU {i}: {r}" for i, r in sorted(refused.items())))
    held = {i: d.reason for i, d in decisions.items() if d.kind == "blocked"}
    if held:
        return C.Cond(C.LAYOUT_APPLIED, "False", "ReshapingNotAllowed",
                      "; ".join(f"GPU {i}: {r}" for i, r in sorted(held.items())))
    waiting = {i: d.reason for i, d in decisions.items() if d.kind == "wait"}
    if waiting:
        return C.Cond(C.LAYOUT_APPLIED, "False", "WaitingForIdle",
                      "; ".join(f"GPU {i}: {r}" for i, r in sorted(waiting.items())))
    if journal is not None and journal.generation == generation and journal.phase in ("Failed", "Aborted"):
        return C.Cond(C.LAYOUT_APPLIED, "False", f"Reconfiguration{journal.phase}",
                      f"GPU {journal.gpu_index}: {journal.reason}")
    if left_for_later:
        # A reshape finished within this tick and the GPUs after it were not looked at: "every GPU
        # has its layout" would be premature (and would stand while the next GPU is reshaped).
        done = f"GPU {journal.gpu_index} done; " if journal is not None else ""
        return C.Cond(C.LAYOUT_APPLIED, "False", "Reconfiguring", f"{done}the spec's other GPUs follow")
    return C.Cond(C.LAYOUT_APPLIED, "True", "AsRequested", "every GPU has the requested layout")


class DirectLayouts:
    """Layouts applied by the agent itself through NVML (``--mode direct``)."""

    def reconcile(self, ctx: AgentContext, spec: GPUNodeSpec, generation: int, snapshot: NodeSnapshot,
                  reconf: Mapping[str, Any] | None, labels: Mapping[str, str]) -> C.LayoutReport:
        return reconcile_direct(ctx, spec, generation, snapshot, reconf, labels)
