"""The demo's right-sizing scenario (``gpupack demo --right-sizing off|initial|recreate``).

A few Deployments of one replica each ask a whole GPU through gpupack (``gpupack.io/gpu-milli:
1000``) while the simulated GPU processes play a usage trace that uses a fraction of it. The
demo's namespace is labelled ``gpupack.io/right-sizing=<Mode>``, the controller's recommender
needs an hour of *trace* time (``3600 / time scale`` seconds of the clock) and the agents publish
each 5 trace minutes, so the recommendations come within the demo's minutes
(:func:`timings`). Then, by mode (docs/right-sizing.md):

* ``off``: the ``GPURecommendation``\\ s are written and shown; nothing acts on them;
* ``initial``: once a workload's recommendation is provided the demo restarts its pod (deletes it,
  as a crash or a drain would) and the ReplicaSet's new pod is sized at admission;
* ``recreate``: the controller moves the pod itself, by a rollout that brings the sized pod up first
  (``RolledOutToRightSize``; the optional grant ``manifests/right-sizing-recreate`` is installed).

There is no kubelet: the demo plays it for these pods only (a bound pod is marked Running and
Ready, a terminating one is removed), since a rollout waits for the new pod to be Ready and a
deleted pod would otherwise stay Terminating. What it reports is read from the API server: the
recommendations, the pods' ``gpupack.io/right-sized-from`` records, the controller's Events,
and what the workloads' pods hold (their allocation records' milli).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from sharing.api.allocation import Allocation, AllocationError
from sharing.api.keys import (
    ALLOCATION_ANNOTATION, MEMORY_RESOURCE, MILLI_RESOURCE, RIGHT_SIZED_ANNOTATION, RIGHT_SIZING_LABEL,
    SHARING_ANNOTATION,
)
from sharing.api.recommendation import RecommendationError, read_recommendation
from sharing.api.right_sized import RightSizedError, RightSizedFrom
from sharing.usage.trace import DUTY_FILE, MEMORY_FILE
from sharing.usage.trace_text import trace_texts

GIB = 2**30

MODES = ("off", "initial", "recreate")
"""``--right-sizing`` choices; the namespace label's value is the capitalised one (``Initial``)."""
APP_LABEL = "demo-workload"
"""Marks the scenario's Deployments and their pods (the demo plays the kubelet for these only); outside
the ``gpupack.io/`` prefix, which the pod-marks policy refuses on a new pod."""
ASKED_MEMORY = "64Gi"
"""The GPU memory the Deployments ask beside their whole GPU's compute: a figure the controller's
updater can compare with the recommendation (a ``whole`` pod's record holds no memory of its own)."""
MOVE_REASONS = ("RolledOutToRightSize", "EvictedToRightSize")
"""The controller's Events for a Recreate move (controller/reconcile.py)."""
RECOMMENDATION_PLURAL = "gpurecommendations"
TRACE_STEPS = 24 * 60
"""The built-in trace's length: a day of one-minute steps (24 minutes of clock at the default scale)."""
BUILTIN_TRACE_PODS: tuple[tuple[str, float, float], ...] = (
    # (trace pod, mean duty cycle %, memory GiB): inference services that keep a whole GPU mostly idle
    ("svc-chat", 14.0, 11.0),
    ("svc-embed", 8.0, 6.0),
    ("svc-rerank", 11.0, 9.0),
    ("svc-vision", 18.0, 14.0),
)


def label_value(mode: str) -> str:
    """The namespace label's value for ``--right-sizing`` ``mode`` (``initial`` -> ``Initial``)."""
    if mode not in MODES:
        raise ValueError(f"right-sizing mode must be one of {', '.join(MODES)}, got {mode!r}")
    return mode.capitalize()


@dataclass(frozen=True)
class Timings:
    """The right-sizer's periods for a demo playing the trace ``time_scale`` times faster."""

    min_observed_s: float
    """The controller's ``--recommend-min-observed-seconds``: an hour of trace time."""
    publish_s: float
    """The agents' ``--usage-publish-seconds``: five trace minutes, at least a second."""
    recommend_s: float = 1.0
    """The controller's ``--recommend-seconds``."""

    def controller_args(self) -> tuple[str, ...]:
        return ("--recommend-seconds", f"{self.recommend_s:g}",
                "--recommend-min-observed-seconds", f"{self.min_observed_s:g}")

    def agent_args(self) -> tuple[str, ...]:
        return ("--usage-publish-seconds", f"{self.publish_s:g}")


def timings(time_scale: float) -> Timings:
    """The right-sizer's product defaults (an hour of history, publication every 5 minutes), in trace
    time: divided by ``time_scale``."""
    if time_scale <= 0:
        raise ValueError(f"time scale must be positive, got {time_scale}")
    return Timings(round(3600.0 / time_scale, 2), round(max(1.0, 300.0 / time_scale), 2))


def write_builtin_trace(folder: Path, steps: int = TRACE_STEPS) -> Path:
    """Write the built-in GenTD26-format trace into ``folder`` (``--right-sizing`` without
    ``--usage-trace``): a few services whose duty cycle wobbles by a few points around its mean and
    whose memory holds steady. Returns ``folder``."""
    pods: dict[str, list[tuple[float, int]]] = {}
    for name, duty, memory_gib in BUILTIN_TRACE_PODS:
        wobble = (-3.0, 0.0, 2.0, 4.0, 1.0, -2.0)  # deterministic, so every demo plays the same trace
        pods[name] = [(max(0.0, duty + wobble[i % len(wobble)]), int(memory_gib * GIB)) for i in range(steps)]
    folder.mkdir(parents=True, exist_ok=True)
    duty_text, memory_text = trace_texts(pods)
    (folder / DUTY_FILE).write_text(duty_text, encoding="utf-8")
    (folder / MEMORY_FILE).write_text(memory_text, encoding="utf-8")
    return folder


def deployment(name: str, namespace: str) -> dict[str, Any]:
    """A Deployment of one replica asking a whole GPU through gpupack, by time-slicing, rolling out
    make-before-break (maxSurge 1, maxUnavailable 0), so Recreate may move its only pod by a rollout."""
    labels = {APP_LABEL: name}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "replicas": 1, "selector": {"matchLabels": labels},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            # time-slicing: the whole GPU asked for is a whole GPU (mode ``whole``) and a right-sized
            # share is a time slice, where its compute stays measured (rightsizing_live.NODES).
            "template": {"metadata": {"labels": labels, "annotations": {SHARING_ANNOTATION: "time-slicing"}},
                         "spec": {
                "terminationGracePeriodSeconds": 0,
                "containers": [{"name": "main", "image": "registry.example/inference:1",
                                "resources": {"limits": {MILLI_RESOURCE: "1000", MEMORY_RESOURCE: ASKED_MEMORY}}}]}},
        },
    }


# ------------------------------------------------------------ what the API server says (pure)
def recommendation_rows(objs: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per GPURecommendation container: ``workload`` (Kind/name), ``container``, ``gpu_milli``,
    ``gpu_memory`` (the quantity as written), ``provided``. An object that does not validate is left
    out, as the webhook leaves it out."""
    rows = []
    for obj in objs:
        try:
            reading = read_recommendation(obj)
        except RecommendationError:
            continue
        containers = ((obj.get("status") or {}).get("containers")) or []
        written = {c.get("containerName"): c.get("gpuMemory") for c in containers if isinstance(c, Mapping)}
        for size in reading.sizes:
            rows.append({"workload": f"{reading.target.kind}/{reading.target.name}", "container": size.container,
                         "gpu_milli": size.milli, "gpu_memory": written.get(size.container),
                         "provided": reading.provided})
    return sorted(rows, key=lambda r: (r["workload"], r["container"]))


def right_sized(pod: Mapping[str, Any]) -> RightSizedFrom | None:
    """The pod's ``gpupack.io/right-sized-from`` record; None without one (or an unreadable one)."""
    text = ((pod.get("metadata") or {}).get("annotations") or {}).get(RIGHT_SIZED_ANNOTATION)
    if text is None:
        return None
    try:
        return RightSizedFrom.from_annotation(text)
    except RightSizedError:
        return None


def sized_row(pod: Mapping[str, Any], record: RightSizedFrom) -> dict[str, Any]:
    """What the summary shows of a right-sized pod: its name, recommendation, and per container what
    it asked and what it got."""
    return {"pod": (pod.get("metadata") or {}).get("name", ""), "recommendation": record.recommendation,
            "containers": [{"name": c.name, "asked_milli": c.asked_milli, "milli": c.milli,
                            "accounted_milli": c.accounted, "memory_gib": round(c.memory_bytes / GIB, 1)}
                           for c in record.containers]}


def held_milli(pods: Iterable[Mapping[str, Any]]) -> int:
    """GPU milli the bound pods hold by their allocation records (what placement counts; a pod not yet
    bound holds nothing, a terminating one still does)."""
    total = 0
    for pod in pods:
        if not (pod.get("spec") or {}).get("nodeName"):
            continue
        try:
            allocation = Allocation.from_annotation(
                ((pod.get("metadata") or {}).get("annotations") or {}).get(ALLOCATION_ANNOTATION))
        except AllocationError:
            continue
        total += sum(c.milli for c in allocation.containers)
    return total


def move_rows(events: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The controller's Recreate moves among ``events``: ``reason``, ``object`` (Kind/name) and
    ``message``, oldest first (by the Event's first timestamp; one row per Event object)."""
    rows = []
    for event in events:
        if event.get("reason") not in MOVE_REASONS:
            continue
        involved = event.get("involvedObject") or {}
        at = event.get("firstTimestamp") or event.get("eventTime") or (event.get("metadata") or {}).get(
            "creationTimestamp") or ""
        rows.append({"reason": event["reason"], "object": f"{involved.get('kind')}/{involved.get('name')}",
                     "message": str(event.get("message") or ""), "at": str(at)})
    return [{k: v for k, v in r.items() if k != "at"} for r in sorted(rows, key=lambda r: r["at"])]


def workload_of_pod(pod: Mapping[str, Any]) -> str | None:
    """The scenario Deployment a pod belongs to (its :data:`APP_LABEL`), None for other pods."""
    value = ((pod.get("metadata") or {}).get("labels") or {}).get(APP_LABEL)
    return str(value) if value else None


# ------------------------------------------------------------ the scenario's state over the run
@dataclass
class Scenario:
    """What the demo saw of right-sizing over the run, and whether its story is told (``done``)."""

    mode: str
    workloads: tuple[str, ...]
    recommendations: list[dict[str, Any]] = field(default_factory=list)
    sized: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Right-sized pods by name, accumulated (a pod may be gone by the end)."""
    moves: list[dict[str, Any]] = field(default_factory=list)
    milli_before: int | None = None
    """What the workloads' pods held once every workload first had a bound pod."""
    milli_now: int = 0
    restarted: set[str] = field(default_factory=set)
    """Initial: workloads whose pod the demo restarted."""

    def observe(self, recommendations: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]],
                events: Iterable[Mapping[str, Any]]) -> None:
        own = [p for p in pods if workload_of_pod(p) is not None]
        self.recommendations = recommendation_rows(recommendations)
        for pod in own:
            record = right_sized(pod)
            if record is not None:
                self.sized[(pod.get("metadata") or {}).get("name", "")] = sized_row(pod, record)
        self.moves = move_rows(events)
        self.milli_now = held_milli(own)
        bound = {workload_of_pod(p) for p in own if (p.get("spec") or {}).get("nodeName")}
        if self.milli_before is None and bound >= set(self.workloads):
            self.milli_before = self.milli_now

    def provided(self) -> set[str]:
        """Scenario workloads with a provided recommendation."""
        return {r["workload"].split("/", 1)[1] for r in self.recommendations
                if r["provided"] and r["workload"].startswith("Deployment/")} & set(self.workloads)

    def sized_workloads(self) -> set[str]:
        return {w for w in self.workloads for name in self.sized if name.startswith(f"{w}-")}

    def done(self) -> bool:
        """Every workload has a provided recommendation and, unless ``off``, a right-sized pod (with
        ``recreate``, after a move)."""
        if self.provided() != set(self.workloads):
            return False
        if self.mode == "off":
            return True
        if self.sized_workloads() != set(self.workloads):
            return False
        return self.mode != "recreate" or len(self.moves) >= len(self.workloads)

    def line(self) -> str:
        """The progress line."""
        provided = self.provided()
        parts = [f"right-sizing {label_value(self.mode)}: {len(provided)}/{len(self.workloads)} provided"]
        shown = [r for r in self.recommendations if r["provided"]]
        if shown:
            parts.append(", ".join(f"{r['workload']} {r['gpu_milli']}m {r['gpu_memory']}" for r in shown))
        parts.append(f"{len(self.sized)} pods right-sized")
        if self.mode == "recreate":
            parts.append(f"{len(self.moves)} moves")
        parts.append(f"held {self.milli_now / 1000:.2f} GPUs")
        return "  ".join(parts)

    def summary(self) -> dict[str, Any]:
        """The summary's keys (``--json`` too)."""
        before = None if self.milli_before is None else round(self.milli_before / 1000, 3)
        return {
            "right_sizing": label_value(self.mode),
            "recommendations": self.recommendations,
            "recommendations_provided": sum(1 for r in self.recommendations if r["provided"]),
            "pods_right_sized": [self.sized[name] for name in sorted(self.sized)],
            "right_size_moves": self.moves,
            "right_sizing_gpus_before": before,
            "right_sizing_gpus_after": round(self.milli_now / 1000, 3),
        }


LIST_KEYS = ("recommendations", "pods_right_sized", "right_size_moves")
"""Summary keys whose values are lists: the text summary shows them as :func:`text_lines`."""


def text_lines(summary: Mapping[str, Any]) -> list[str]:
    """The list keys of a :meth:`Scenario.summary` as the text summary's lines."""
    lines = [f"  recommendation: {r['workload']} {r['container']}: {r['gpu_milli']} milli, {r['gpu_memory']}"
             f"{'' if r['provided'] else ' (not provided yet)'}" for r in summary.get("recommendations", [])]
    for pod in summary.get("pods_right_sized", []):
        sizes = ", ".join(f"{c['name']} {c['asked_milli']} -> {c['milli']} milli, {c['memory_gib']} GiB"
                          for c in pod["containers"])
        lines.append(f"  right-sized: {pod['pod']} from {pod['recommendation']}: {sizes}")
    lines += [f"  moved: {m['object']} ({m['reason']}): {m['message']}" for m in summary.get("right_size_moves", [])]
    return lines


def playing_kubelet(pod: Mapping[str, Any]) -> str | None:
    """What the demo, standing in for the kubelet, does to a scenario pod: ``"ready"`` (bound, not yet
    Ready), ``"remove"`` (terminating: its containers would stop at once) or None."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    if workload_of_pod(pod) is None:
        return None
    if meta.get("deletionTimestamp"):
        return "remove"
    conditions = (pod.get("status") or {}).get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    if spec.get("nodeName") and not ready:
        return "ready"
    return None


def ready_status(now: datetime | None = None) -> dict[str, Any]:
    """The status patch that makes a bound pod Running and Ready."""
    at = (now or datetime.now(timezone.utc)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"status": {"phase": "Running", "conditions": [
        {"type": "Ready", "status": "True", "lastTransitionTime": at},
        {"type": "ContainersReady", "status": "True", "lastTransitionTime": at}]}}


def label_patch(mode: str) -> dict[str, Any]:
    """The namespace patch that sets its right-sizing mode."""
    return {"metadata": {"labels": {RIGHT_SIZING_LABEL: label_value(mode)}}}
