"""A live replay: the plan's pods submitted one at a time to the real stack, each until it is placed or not.

**Order and waiting.** The pods are those of ``sharing.simulator.arrivals.plan_run``
for the node list, pod list, seed, inflation and node sample, in its order, so
the replay submits exactly what ``gpupack simulate`` replays. Every pod's
outcome could depend on the one before it (they share the cluster), so they go
strictly one at a time: a pod is created only after the previous one is

* **bound** (``spec.nodeName`` set, seen by the replay's watch), or
* **never placed**: refused at admission (the webhook's answer), declared
  unplaceable by the component that places it (``gpupack.replay.outcome``:
  kube-scheduler's ``Unschedulable``, the controller's ``NoCapacity``), or
  still undecided after ``pod_timeout_s`` (counted apart, ``pods_timed_out``).

**Stopping early.** ``submit_budget_s`` (``gpupack replay --stop-after MINUTES``)
stops the submissions at the first pod boundary after that long, and an
interrupt (Ctrl-C, or SIGTERM, which ``gpupack replay`` turns into one) stops
them where they are, the pod in flight uncounted; either way the run ends as
one that ran to the end does (costs measured, stack stopped) and says why it
stopped (``LiveRun.stopped``), so hours of a whole-cluster run are never lost.

A pod never placed is **deleted** at once, as the protocol drops it: left
pending it could be placed later, when capacity created for a later pod
happens to fit it, which the protocol never does, and it would stay in every
controller cycle's list of waiting pods.

**Latency** (``bound_seconds``): from just before the replay's create call to
the moment its watch saw ``spec.nodeName`` (monotonic clock, so sub-second,
unlike ``creationTimestamp``); it includes admission, the controller's cycle,
any node switch and kube-scheduler's binding.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, Literal

from kubernetes import client

from gpupack.replay.costs import ComponentCost, component_cost, delta, requests_by_verb, sample_all
from gpupack.replay.figures import live_alloc_at
from gpupack.replay.mapping import REPLAY_LABEL, kube_node_name, replay_pod
from gpupack.replay.outcome import Decider, bound_node, classify, deleting, released_unschedulable
from gpupack.replay.priority import Preempted, preempted_by
from gpupack.replay.progress import ProgressBar, format_duration
from gpupack.replay.stack import NAMESPACE, ReplayStack
from kube.informer import Informer
from sharing.packing.specs import GPU_MILLI, PodSpec
from sharing.api.placement_status import read_placement
from sharing.simulator.arrivals import RunPlan

Result = Literal["bound", "unplaceable", "timeout"]
Stopped = Literal["budget", "interrupted"]


@dataclass(frozen=True)
class PodResult:
    name: str
    pod: PodSpec
    result: Result
    decider: Decider | None = None
    node: str | None = None
    bound_seconds: float | None = None
    message: str = ""
    decided_seconds: float = 0.0
    """From the create call to the verdict (bound, or declared never placed)."""


@dataclass
class LiveRun:
    """What a live replay measured."""

    plan: RunPlan
    results: list[PodResult] = field(default_factory=list)
    components: dict[str, ComponentCost] = field(default_factory=dict)
    api_requests: dict[str, int] = field(default_factory=dict)
    replay_requests: dict[str, int] = field(default_factory=dict)
    """The replay's own requests (creates, deletes, its watches' lists), included in ``api_requests``."""
    agents: str = ""
    setup_seconds: float = 0.0
    submit_seconds: float = 0.0
    stopped: Stopped | None = None
    """Why the submissions ended before the plan's last pod (None: every pod was submitted)."""
    preempted: list[Preempted] = field(default_factory=list)
    """Bound pods the live system preempted (``gpupack.replay.priority``), in the order seen."""

    @property
    def complete(self) -> bool:
        return self.stopped is None

    @property
    def bound(self) -> list[bool]:
        return [r.result == "bound" for r in self.results]


def submission_order(plan: RunPlan) -> list[str]:
    """The names of the pods the replay creates, in the order it creates them."""
    return [kube_node_name(p.name) for p in plan.workload.pods]


class _Requests:
    """Counts the replay's own API requests by verb."""

    def __init__(self) -> None:
        self.by_verb: dict[str, int] = {}

    def add(self, verb: str, n: int = 1) -> None:
        self.by_verb[verb] = self.by_verb.get(verb, 0) + n


def _apiserver_requests(admin: Any) -> dict[str, float]:
    method, url, headers, _, _ = admin.param_serialize("GET", "/metrics", header_params={"Accept": "text/plain"})
    response = admin.call_api(method, url, header_params=headers)
    response.read()
    return requests_by_verb(response.data.decode("utf-8"))


@dataclass
class Replayer:
    stack: ReplayStack
    plan: RunPlan
    pod_timeout_s: float = 120.0
    released_unschedulable_s: float = 3.0
    """How long a pod the controller released may stay Unschedulable before it counts as never placed."""
    preemption_grace_s: float = 3.0
    """With priorities, how long a whole-GPU pod kube-scheduler left Unschedulable (its own preemption
    found nothing) is given for gpupack's controller to preempt for it (its ``gpupack.io/preempting``
    record then says it waits) before it counts as never placed, as the product model lets it."""
    submit_budget_s: float | None = None
    """Submit no pod after this long (the module docstring, "Stopping early"); None: no limit."""
    progress: ProgressBar | None = None
    say: Callable[[str], None] = lambda _: None
    run_id: str = "run"
    priority_classes: Mapping[str, str] | None = None
    """Per plan pod name, the PriorityClass its pod names (``--priority qos``); None: none."""
    _bound_at: dict[str, float] = field(default_factory=dict)
    _attempt: int = -1
    _preempted: dict[str, Preempted] = field(default_factory=dict)

    def run(self) -> LiveRun:
        admin = self.stack.admin
        core = client.CoreV1Api(admin)
        mine = _Requests()
        pods = Informer("pods", partial(core.list_namespaced_pod, NAMESPACE, label_selector=f"{REPLAY_LABEL}={self.run_id}"))
        pods.listeners.append(self._watched)
        pods.start()
        if not pods.wait_synced(60):
            raise RuntimeError("the replay's pods watch did not sync in 60 s")
        live = LiveRun(plan=self.plan, agents=self.stack.agents, setup_seconds=self.stack.setup_seconds)
        procs = self.stack.processes()
        before = {name: sample_all(pids) for name, pids in procs.items()}
        requests_before = _apiserver_requests(admin)
        lists_before = pods.lists
        began = time.monotonic()
        try:
            for attempt, pod in enumerate(self.plan.workload.pods):
                self._attempt = attempt
                started = time.monotonic()
                if self.submit_budget_s is not None and started - began >= self.submit_budget_s:
                    live.stopped = "budget"
                    self.say(f"stopped after {len(live.results)} of {len(self.plan.workload.pods)} pods: "
                             f"--stop-after's {format_duration(self.submit_budget_s)} are spent")
                    break
                result = self._one(core, pods, pod, mine)
                live.results.append(replace(result, decided_seconds=time.monotonic() - started))
                self._show(live)
        except KeyboardInterrupt:
            live.stopped = "interrupted"
            self.say(f"interrupted after {len(live.results)} of {len(self.plan.workload.pods)} pods: "
                     "reporting what was measured")
        finally:
            live.submit_seconds = time.monotonic() - began
            live.preempted = list(self._preempted.values())
            requests_after = _apiserver_requests(admin)
            after = {name: sample_all(self.stack.processes()[name]) for name in procs}
            live.components = {name: component_cost(before[name], after[name]) for name in procs}
            mine.add("LIST", pods.lists - lists_before)
            pods.stop()
            live.api_requests = delta(requests_before, requests_after)
            live.replay_requests = {k: v for k, v in sorted(mine.by_verb.items()) if v}
            if self.progress is not None:
                self.progress.close()
        return live

    def _watched(self, kind: str, obj: Any) -> None:
        name = str((obj.get("metadata") or {}).get("name") or "")
        if kind != "DELETED" and bound_node(obj) and name not in self._bound_at:
            self._bound_at[name] = time.monotonic()
        # The replay deletes only pods never bound: a bound pod going is one the live system preempted.
        if name in self._bound_at and name not in self._preempted and (kind == "DELETED" or deleting(obj)):
            self._preempted[name] = Preempted(name, self._attempt, preempted_by(obj))

    def _show(self, live: LiveRun) -> None:
        if self.progress is None:
            return
        done = len(live.results)
        bound = sum(1 for r in live.results if r.result == "bound")
        milli = sum(r.pod.gpu_total_milli for r in live.results if r.result == "bound")
        self.progress.update(done, bound, done - bound, 100.0 * milli / (self.plan.gpus * GPU_MILLI))

    def _one(self, core: Any, pods: Informer, pod: PodSpec, mine: _Requests) -> PodResult:
        name = kube_node_name(pod.name)
        key = f"{NAMESPACE}/{name}"
        started = time.monotonic()
        mine.add("POST")
        try:
            priority_class = None if self.priority_classes is None else self.priority_classes[pod.name]
            core.create_namespaced_pod(NAMESPACE, replay_pod(pod, NAMESPACE, self.run_id, priority_class))
        except client.ApiException as exc:
            if exc.status is not None and 400 <= exc.status < 500 and exc.status != 409:
                return PodResult(name, pod, "unplaceable", "admission", message=_api_message(exc))
            raise
        unschedulable_since: float | None = None
        refused_since: float | None = None
        seen = pods.version
        deadline = started + self.pod_timeout_s
        while True:
            obj = pods.get(key)
            if obj is not None:
                outcome, decider = classify(obj)
                if outcome == "bound":
                    at = self._bound_at.get(name, time.monotonic())
                    return PodResult(name, pod, "bound", node=bound_node(obj), bound_seconds=max(0.0, at - started))
                if outcome == "unplaceable" and decider == "scheduler" and self._controller_may_preempt(pod):
                    refused_since = time.monotonic() if refused_since is None else refused_since
                    if time.monotonic() - refused_since < self.preemption_grace_s:
                        outcome = "waiting"
                if outcome == "unplaceable":
                    self._delete(core, name, mine)
                    status = read_placement(obj)
                    return PodResult(name, pod, "unplaceable", decider, message=status.message if status else "")
                if not released_unschedulable(obj):
                    unschedulable_since = None
                elif unschedulable_since is None:
                    unschedulable_since = time.monotonic()
                elif time.monotonic() - unschedulable_since >= self.released_unschedulable_s:
                    self._delete(core, name, mine)
                    return PodResult(name, pod, "unplaceable", "released-unschedulable",
                                     message=_scheduler_message(obj))
            now = time.monotonic()
            if now >= deadline:
                self._delete(core, name, mine)
                self.say(f"{name}: neither bound nor declared unplaceable after {self.pod_timeout_s:.0f}s")
                return PodResult(name, pod, "timeout", "timeout")
            seen = pods.wait_changed(seen, min(0.25, max(0.0, deadline - now)))

    def _controller_may_preempt(self, pod: PodSpec) -> bool:
        """gpupack's controller preempts for a whole-GPU pod kube-scheduler could not make room for."""
        return self.priority_classes is not None and pod.gpu_count > 0 and not pod.is_shared

    def _delete(self, core: Any, name: str, mine: _Requests) -> None:
        mine.add("DELETE")
        try:
            core.delete_namespaced_pod(name, NAMESPACE, grace_period_seconds=0)
        except client.ApiException as exc:
            if exc.status != 404:
                raise


def _scheduler_message(obj: Any) -> str:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "PodScheduled":
            return str(cond.get("message") or "")
    return ""


def _api_message(exc: client.ApiException) -> str:
    import json

    try:
        body = json.loads(exc.body or "{}")
    except ValueError:
        return str(exc.reason or exc)
    return str(body.get("message") or exc.reason or exc)


def run_live(workdir: Path, plan: RunPlan, *, policy: str = "gpupack", pod_timeout_s: float = 120.0,
             keep_logs: bool = False, progress: bool = True,
             say: Callable[[str], None] = lambda _: None, run_id: str = "run",
             submit_budget_s: float | None = None, priority_classes: Mapping[str, str] | None = None) -> LiveRun:
    """Start the stack on the plan's nodes, replay the plan's pods, stop the stack; what was measured.
    ``priority_classes``: per plan pod name, its PriorityClass (the stack creates openb's classes)."""
    stack = ReplayStack(workdir, plan.nodes, policy=policy, keep_logs=keep_logs,
                        priority_classes=priority_classes is not None)
    try:
        stack.start(say)
        bar = ProgressBar(len(plan.workload.pods)) if progress else None
        return Replayer(stack, plan, pod_timeout_s=pod_timeout_s, progress=bar, say=say, run_id=run_id,
                        submit_budget_s=submit_budget_s, priority_classes=priority_classes).run()
    finally:
        stack.stop()


def live_levels(live: LiveRun) -> dict[int, float | None]:
    return live_alloc_at([r.pod for r in live.results], live.bound, live.plan.gpus, withdrawn_milli(live))


def withdrawn_milli(live: LiveRun) -> list[int]:
    """Per attempt, the GPU milli of the bound pods preempted during it."""
    out = [0] * len(live.results)
    milli = {r.name: r.pod.gpu_total_milli for r in live.results}
    for p in live.preempted:
        if 0 <= p.attempt < len(out):
            out[p.attempt] += milli.get(p.name, 0)
    return out


def pods_of(results: Sequence[PodResult], result: Result) -> int:
    return sum(1 for r in results if r.result == result)
