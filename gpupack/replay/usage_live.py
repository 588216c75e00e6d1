"""A live usage replay: a GPU usage trace's pods as Deployments on the real stack, measured as the simulator is.

**Workloads.** Each trace pod (``sharing.usage.trace``) is a Deployment of one replica,
:func:`deployment_name`, in the replay's namespace (opted in to the mode asked, by its
``gpupack.io/right-sizing`` label), created at the wall time of its first sample, scaled, and
deleted at that of its end. Its pod asks gpupack for one whole GPU (``gpupack.io/gpu-milli:
1000`` and the GPU's memory as ``gpupack.io/gpu-memory``, ``gpupack.io/sharing: mps``) and
rolls out make-before-break (``maxSurge`` 1, ``maxUnavailable`` 0), so the controller may move
it by a rollout (``Recreate``). The agents play the trace pod in every pod the Deployment makes
(``--usage-trace-pods`` by workload), so a moved pod plays on where its workload is.

**Where each pod sat.** At the middle of every trace step (wall time ``start + (k + 1/2) x
step / scale``) the replay reads the namespace's pods from its watch: a trace pod sits on the
node (one GPU each: ``gpupack.replay.usage_stack``) of the **oldest** bound, not terminating
pod of its Deployment (the one serving until a rollout's replacement is Ready and it is deleted,
as a make-before-break move is in the simulator), with the memory limit of its allocation record
(``gpupack.io/allocation``; a pod admitted ``whole``, or not gpupack's: the GPU's memory, as the
simulator seats it, ``sharing.usage.sizing.replica_share_of``). A trace pod alive whose Deployment
has no bound pod yet is **pending**: it counts as sitting where its first pod is then bound, the
whole GPU it asked for (:func:`backfill_pending`; a pod never bound holds a GPU of its own), and
the steps are counted apart (``pending_pod_steps``): they are the real-time latencies of
admission, the controller's cycle and kube-scheduler, which a time-scaled run turns into trace
minutes (``time_scale`` trace seconds per wall second).

**Figures.** Those seatings are read by the simulator's own measure
(``sharing.simulator.usage_figures.measure``) into the keys of ``gpupack simulate usage``; the
simulator's run of the same pods, GPU and mode (``sharing.simulator.usage.run_usage``), modelling
what this live path does (:func:`simulator_policy`: the device plugin's equal replicas, the
agents' publication lag, no consolidation), stands beside them with each key's difference (live minus simulator).

Beside it, ``simulator_draws``: the simulator's run with the observation noise a live run has
(``sharing.simulator.usage_replay``, "Observation noise": each agent's publication phase, and the
samples missed, estimated from the agents' samples per trace step as read from their
publications), :data:`DRAWS` times, with each figure's mean, least and most. On few pods the
simulator's saving is a distribution (one pod holding or freeing a GPU for hours moves it by
points), so ``live_within_range`` and ``live_minus_mean`` say where the live run falls in it.

**Verdict.** The run agrees when its ``gpu_hours_saved_pct`` is within :data:`AGREEMENT_POINTS` of
the draws' mean (issue 35, item 6): the simulator's prediction for a live run, whose agents publish
at phases nobody chose, as the openb replay compares with the mean of the model's draws over
kube-scheduler's ties. ``agreement_gap`` is that difference; ``difference`` keeps each figure's
difference from the run without noise.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from kubernetes import client

from gpupack.replay.usage_stack import NAMESPACE, PUBLISH_S, UsageStack, required_nodes
from kube.informer import Informer
from sharing.api.allocation import Allocation, AllocationError
from sharing.api.crd import GROUP, VERSION
from sharing.api.keys import (
    ALLOCATION_ANNOTATION, MEMORY_RESOURCE, MILLI_RESOURCE, REPLAY_LABEL, RIGHT_SIZED_ANNOTATION, SHARING_ANNOTATION,
)
from sharing.simulator.usage import gpu_memory_bytes, run_usage, run_usage_draws
from sharing.simulator.usage_figures import Seat, Seating, UsageFigures, measure
from sharing.simulator.usage_replay import MODES, RightSizing
from sharing.usage.trace import UsageTrace

AGREEMENT_POINTS = 2.0
"""The issue's bound on ``gpu_hours_saved_pct``, live against the simulator."""
DRAWS, DRAWS_SEED, MAX_MISSED = 20, 42, 0.5
"""The simulator's runs with observation noise reported beside a live run (``simulator_draws``), the
first one's seed, and the most samples the draws miss (the estimate from the agents' sample rate)."""
FIGURE_KEYS = tuple(f.name for f in dataclasses.fields(UsageFigures))
IMAGE = "registry.invalid/usage-replay:never-pulled"
CONTAINER = "main"
APP_LABEL = "app"
PENDING_GPU = 1_000_000
"""Seats of pending pods are GPUs numbered from here (one each, never shared)."""
CHECK_EVERY_STEPS = 10
"""How often (trace steps) the replay reads the GPUNodes' published use and the recommendations."""


def deployment_name(trace_pod: str) -> str:
    """The Deployment of a trace pod: ``u-`` and its name, lower case, other characters than ``a-z``,
    ``0-9`` and ``-`` as ``-``, at most 40 characters (its pods' names add a hash and a suffix)."""
    return ("u-" + re.sub(r"[^a-z0-9-]", "-", trace_pod.lower()))[:40].rstrip("-")


def first_pods(trace: UsageTrace, count: int | None) -> UsageTrace:
    """The trace with its first ``count`` pods (by first sample, then name; None: all), its grid cut
    after the last one's end. ValueError for a count below 1, or two pods whose Deployments would
    share a name."""
    ordered = sorted(trace.pods, key=lambda p: (p.first_step, p.pod))
    if count is not None:
        if count < 1:
            raise ValueError(f"--pods must be at least 1, got {count}")
        ordered = ordered[:count]
    names: dict[str, str] = {}
    for pod in ordered:
        clash = names.setdefault(deployment_name(pod.pod), pod.pod)
        if clash != pod.pod:
            raise ValueError(f"trace pods {clash} and {pod.pod} would both be Deployment {deployment_name(pod.pod)}")
    steps = max((p.end_step for p in ordered), default=0)
    return dataclasses.replace(trace, pods=tuple(ordered), steps=steps)


def mapping_csv(trace: UsageTrace) -> str:
    """The agents' ``--usage-trace-pods``: each Deployment (``namespace/NAME``) plays its trace pod."""
    return "pod,container_ip\n" + "".join(f"{NAMESPACE}/{deployment_name(p.pod)},{p.pod}\n" for p in trace.pods)


def deployment(trace_pod: str, gpu_memory_mib: int, run_id: str) -> dict[str, Any]:
    """The Deployment of one trace pod (module docstring)."""
    name = deployment_name(trace_pod)
    labels = {APP_LABEL: name, REPLAY_LABEL: run_id}
    container = {"name": CONTAINER, "image": IMAGE, "resources": {"limits": {
        MILLI_RESOURCE: "1000", MEMORY_RESOURCE: f"{gpu_memory_mib}Mi"}}}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels},
            "spec": {"replicas": 1, "selector": {"matchLabels": {APP_LABEL: name}},
                     "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
                     "template": {"metadata": {"labels": labels, "annotations": {SHARING_ANNOTATION: "mps"}},
                                  "spec": {"containers": [container], "terminationGracePeriodSeconds": 0}}}}


def seat_of(pods: Sequence[Mapping[str, Any]], nodes: Sequence[str], gpu_memory: int) -> Seat | None:
    """Where a Deployment's trace pod sits (module docstring), from its pods; None when none is bound."""
    serving = [p for p in pods if (p.get("spec") or {}).get("nodeName") in nodes
               and not (p.get("metadata") or {}).get("deletionTimestamp")]
    if not serving:
        return None
    oldest = min(serving, key=lambda p: (str(p["metadata"].get("creationTimestamp") or ""), p["metadata"]["name"]))
    try:
        record = Allocation.from_annotation((oldest["metadata"].get("annotations") or {}).get(ALLOCATION_ANNOTATION))
    except AllocationError:
        record = None  # not gpupack's pod: held whole
    # A pod admitted whole holds the GPU whatever memory its record was sized to: no MPS limit binds it.
    limits = [c.memory_bytes for c in record.containers if c.memory_bytes] if record is not None \
        and record.mode != "whole" else []
    return Seat(nodes.index(oldest["spec"]["nodeName"]), min(limits[0], gpu_memory) if limits else gpu_memory)


@dataclass
class Observed:
    """What the right-sizer did during the run, for the check that it observed, recommended, resized
    and packed."""

    observed: set[str] = field(default_factory=set)
    """Deployments whose pods' use an agent published (GPUNode ``status.usage``)."""
    recommended: set[str] = field(default_factory=set)
    """Deployments whose GPURecommendation was provided."""
    resized_pods: set[str] = field(default_factory=set)
    """Pods the webhook sized from a recommendation (``gpupack.io/right-sized-from``)."""
    pods_created: set[str] = field(default_factory=set)
    shared_gpu_steps: int = 0
    """Steps x GPUs holding two or more trace pods."""
    pending_pod_steps: int = 0
    bound_seconds: dict[str, float] = field(default_factory=dict)
    """Deployment -> wall seconds from its create call to its first pod's binding."""
    sampled: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Pod -> (samples its agent took, trace steps from its first sample to its last), from the
    latest publication of each pod whose compute the agent reads (it holds a GPU alone)."""

    def samples_per_step(self) -> float | None:
        """The agents' samples per trace step over those pods: below 1, some steps went unobserved
        (an agent's poll outlasted a scaled step); at or above 1 none need have, though a late poll
        beside an early one still misses a step."""
        steps = sum(s for _, s in self.sampled.values())
        return round(sum(n for n, _ in self.sampled.values()) / steps, 3) if steps else None

    def as_json(self, deployments: int) -> dict[str, Any]:
        waits = sorted(self.bound_seconds.values())
        return {
            "deployments": deployments, "observed_workloads": len(self.observed),
            "recommended_workloads": len(self.recommended), "pods_created": len(self.pods_created),
            "resized_pods": len(self.resized_pods), "moves": len(self.pods_created) - deployments,
            "shared_gpu_steps": self.shared_gpu_steps, "pending_pod_steps": self.pending_pod_steps,
            "bound_seconds_median": waits[len(waits) // 2] if waits else None,
            "bound_seconds_max": waits[-1] if waits else None,
            "agent_samples_per_trace_step": self.samples_per_step(),
        }


@dataclass
class UsageReplayer:
    stack: UsageStack
    trace: UsageTrace
    say: Callable[[str], None] = lambda _: None
    run_id: str = "usage"
    observed: Observed = field(default_factory=Observed)

    def run(self) -> list[Seating]:
        """Play the trace's pods; the seating of every step (module docstring)."""
        admin = self.stack.admin
        core, apps = client.CoreV1Api(admin), client.AppsV1Api(admin)
        pods = Informer("pods", partial(core.list_namespaced_pod, NAMESPACE, label_selector=f"{REPLAY_LABEL}={self.run_id}"))
        pods.start()
        if not pods.wait_synced(60):
            raise RuntimeError("the replay's pods watch did not sync in 60 s")
        _, gpu_memory = gpu_memory_bytes(self.stack.model)
        nodes = self.stack.node_names
        starts: dict[int, list[str]] = {}
        ends: dict[int, list[str]] = {}
        for pod in self.trace.pods:
            starts.setdefault(pod.first_step, []).append(pod.pod)
            ends.setdefault(pod.end_step, []).append(pod.pod)
        wall_step = self.trace.step_s / self.stack.time_scale
        created: dict[str, float] = {}
        live: set[str] = set()
        seatings: list[Seating] = []
        self.stack.wait_start()
        try:
            for step in range(self.trace.steps):
                self._until(self.stack.start_s + step * wall_step)
                for name in ends.get(step, []):
                    live.discard(name)
                    apps.delete_namespaced_deployment(deployment_name(name), NAMESPACE, propagation_policy="Background")
                for name in starts.get(step, []):
                    created[name] = time.monotonic()
                    body: Any = deployment(name, gpu_memory // 2**20, self.run_id)
                    apps.create_namespaced_deployment(NAMESPACE, body)
                    live.add(name)
                self._until(self.stack.start_s + (step + 0.5) * wall_step)
                seatings.append(self._seating(pods.items(), live, nodes, gpu_memory, created))
                if step % CHECK_EVERY_STEPS == 0 or step == self.trace.steps - 1:
                    self._check_right_sizer()
                if step % 60 == 0:
                    self.say(f"trace hour {step * self.trace.step_s / 3600:.1f}: {len(live)} pods live, "
                             f"{len(self.observed.recommended)} recommended, {len(self.observed.resized_pods)} "
                             f"pods resized")
        finally:
            pods.stop()
        return backfill_pending(seatings)

    @staticmethod
    def _until(wall_s: float) -> None:
        delay = wall_s - time.time()
        if delay > 0:
            time.sleep(delay)

    def _seating(self, objects: Sequence[dict[str, Any]], live: set[str], nodes: Sequence[str], gpu_memory: int,
                 created: Mapping[str, float]) -> Seating:
        by_deployment: dict[str, list[dict[str, Any]]] = {}
        for obj in objects:
            meta = obj.get("metadata") or {}
            app = str((meta.get("labels") or {}).get(APP_LABEL) or "")
            by_deployment.setdefault(app, []).append(obj)
            self.observed.pods_created.add(str(meta.get("name")))
            if RIGHT_SIZED_ANNOTATION in (meta.get("annotations") or {}):
                self.observed.resized_pods.add(str(meta.get("name")))
        seating: dict[str, Seat] = {}
        per_gpu: dict[int, int] = {}
        for number, name in enumerate(sorted(live)):
            app = deployment_name(name)
            seat = seat_of(by_deployment.get(app, []), nodes, gpu_memory)
            if seat is None:
                self.observed.pending_pod_steps += 1
                seat = Seat(PENDING_GPU + number, None)
            elif app not in self.observed.bound_seconds:
                self.observed.bound_seconds[app] = round(time.monotonic() - created[name], 2)
            seating[name] = seat
            per_gpu[seat.gpu] = per_gpu.get(seat.gpu, 0) + 1
        self.observed.shared_gpu_steps += sum(1 for n in per_gpu.values() if n > 1)
        return seating

    def _check_right_sizer(self) -> None:
        custom = client.CustomObjectsApi(self.stack.admin)
        gpunodes: Any = custom.list_cluster_custom_object(GROUP, VERSION, "gpunodes")
        for item in gpunodes.get("items", []):
            for record in ((item.get("status") or {}).get("usage") or {}).get("pods") or []:
                if record.get("samples") and not record.get("unattributed"):
                    pod = str(record.get("pod") or "").partition("/")[2]
                    self.observed.observed.add(pod.rsplit("-", 2)[0])
                    span = float(record.get("lastSeconds") or 0) - float(record.get("firstSeconds") or 0)
                    if record.get("samples", 0) >= 2 and not record.get("computeUnattributed") and span > 0:
                        self.observed.sampled[pod] = (int(record["samples"]), round(span / self.trace.step_s) + 1)
        recs: Any = custom.list_namespaced_custom_object(GROUP, VERSION, NAMESPACE, "gpurecommendations")
        for rec in recs.get("items", []):
            conditions = (rec.get("status") or {}).get("conditions") or []
            if any(c.get("type") == "RecommendationProvided" and c.get("status") == "True" for c in conditions):
                self.observed.recommended.add(str(((rec.get("spec") or {}).get("targetRef") or {}).get("name")))


def backfill_pending(seatings: Sequence[Seating]) -> list[Seating]:
    """A trace pod pending at the start of its life sits, in the figures, where its first pod was
    bound: the GPU it asked for and got, so the binding is not counted as a move (as a GPU of its own
    it would be, and every later move would count as one after the first)."""
    first: dict[str, Seat] = {}
    for seating in seatings:
        for pod, seat in seating.items():
            if seat.gpu < PENDING_GPU:
                first.setdefault(pod, seat)
    return [{pod: first.get(pod, seat) if seat.gpu >= PENDING_GPU else seat for pod, seat in seating.items()}
            for seating in seatings]


def compare(live: Mapping[str, Any], simulated: Mapping[str, Any],
            drawn_mean: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Each figure's difference, live minus simulator, and whether ``gpu_hours_saved_pct`` agrees: with
    ``drawn_mean`` (the simulator's draws with a live run's observation noise, ``simulator_draws``)
    against their mean, the simulator's prediction for a run whose agents publish at phases nobody
    chose; else against ``simulated``."""
    difference = {k: round(float(live[k]) - float(simulated[k]), 3) for k in FIGURE_KEYS}
    reference = simulated if drawn_mean is None else drawn_mean
    gap = round(float(live["gpu_hours_saved_pct"]) - float(reference["gpu_hours_saved_pct"]), 3)
    return {"difference": difference, "agrees": abs(gap) <= AGREEMENT_POINTS, "agreement_points": AGREEMENT_POINTS,
            "agreement_against": "simulator" if drawn_mean is None else "simulator_draws.mean",
            "agreement_gap": gap}


def simulator_policy(mode: str) -> RightSizing:
    """The simulator's run a live replay is compared with: the device plugin's replicas on GPUs of one
    node each, the agents' publication every 300 trace seconds (``sharing.simulator.usage_replay``),
    the right-sizer's defaults otherwise (``gpupack simulate usage --backend device-plugin
    --publish-seconds 300``)."""
    if mode not in MODES:
        raise ValueError(f"mode must be off, initial or recreate, got {mode!r}")
    return RightSizing(mode=mode, backend="device-plugin", publish_every_s=PUBLISH_S)


def run_usage_live(workdir: Path, trace_dir: Path, trace: UsageTrace, model: str, mode: str, time_scale: float,
                   say: Callable[[str], None] = lambda _: None, keep_logs: bool = False,
                   policy: str = "BestFit") -> dict[str, Any]:
    """Start the stack, replay ``trace``'s pods, stop the stack; the live figures beside the simulator's."""
    simulator_policy(mode)  # a bad mode is refused before anything starts
    mapping = workdir / "usage-trace-pods.csv"
    mapping.parent.mkdir(parents=True, exist_ok=True)
    mapping.write_text(mapping_csv(trace), encoding="utf-8")
    nodes = required_nodes([(p.first_step, p.end_step) for p in trace.pods])
    stack = UsageStack(workdir, model, nodes, trace_dir, mapping, time_scale, mode, keep_logs=keep_logs)
    stack.stack.controller_policy = policy
    began = time.monotonic()
    try:
        stack.start(say)
        replayer = UsageReplayer(stack, trace, say)
        seatings = replayer.run()
    finally:
        stack.stop()
    _, memory = gpu_memory_bytes(model)
    live = dataclasses.asdict(measure(trace, memory, seatings))
    simulated = run_usage(trace, model, simulator_policy(mode))
    rate = replayer.observed.samples_per_step()
    missed = 0.0 if rate is None else min(MAX_MISSED, max(0.0, 1.0 - rate))
    spread = run_usage_draws(trace, model, simulator_policy(mode), DRAWS, DRAWS_SEED, missed)
    return {
        "mode": mode, "gpu": simulated["gpu"], "time_scale": time_scale, "nodes": nodes, "policy": policy,
        "trace_hours": round(trace.steps * trace.step_s / 3600, 2),
        "live": live, "simulator": {k: simulated[k] for k in FIGURE_KEYS},
        "oracle_gpu_hours_saved_pct": simulated["oracle_gpu_hours_saved_pct"],
        **compare(live, simulated, spread["mean"]),
        "simulator_draws": {**spread, "live_within_range": spread["min"]["gpu_hours_saved_pct"]
                            <= live["gpu_hours_saved_pct"] <= spread["max"]["gpu_hours_saved_pct"],
                            "live_minus_mean": round(live["gpu_hours_saved_pct"]
                                                     - spread["mean"]["gpu_hours_saved_pct"], 3)},
        "right_sizer": replayer.observed.as_json(len(trace.pods)),
        "setup_seconds": round(stack.setup_seconds, 1), "wall_seconds": round(time.monotonic() - began, 1),
    }
