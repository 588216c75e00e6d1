"""Which pods to evict from failed GPUs, when the admin opts in (``--evict-on-gpu-fault``).

A pod on a failed GPU or MIG instance (the ``pods`` the node agent recorded on the
fault, ``GPUStatus.health`` / ``MigInstanceStatus.health``, as the cycle's snapshot read them:
``Snapshot.failed_devices``) is evicted through the
Eviction API, which honours PodDisruptionBudgets, only when something will
recreate it elsewhere: a controller owns it (a ReplicaSet, StatefulSet, Job, ...),
and that controller is not a DaemonSet (its pod would come back to the same node).
The replacement is an ordinary new pod: the webhook admits it away from the
failed device (the capacity view leaves it out) and the planner places it.

Pure: the controller's cycle fetches the objects and makes the calls. Every eviction the
controller posts (these, and the ``Recreate`` updater's, ``controller.planning.right_size_evictions``)
goes through one writer, whose answers :func:`eviction_outcome` reads.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from controller.state.snapshot import FailedDevice
from sharing.api.fields import as_list as _list
from sharing.api.fields import as_map as _map


@dataclass(frozen=True)
class Eviction:
    namespace: str
    name: str
    node: str
    why: str

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


Outcome = Literal["evicted", "blocked", "gone", "failed"]
"""What an eviction came to: done; refused by a PodDisruptionBudget (429: the pod stays, the next
cycle tries again); the pod already gone (404); or another error."""


def eviction_outcome(status: int | None) -> Outcome:
    """The outcome of an eviction the API answered with HTTP ``status`` (None: it succeeded)."""
    if status is None:
        return "evicted"
    if status == 429:
        return "blocked"
    return "gone" if status == 404 else "failed"


def recreated_elsewhere(pod: Mapping[str, Any]) -> bool:
    """A controller other than a DaemonSet owns the pod, so it is recreated after an eviction."""
    owners = [_map(o) for o in _list(_map(pod.get("metadata")).get("ownerReferences"))]
    return any(o.get("controller") is True and o.get("kind") != "DaemonSet" for o in owners)


def evictions(failed: Iterable[FailedDevice], pods: Mapping[str, Mapping[str, Any]]) -> list[Eviction]:
    """Pods (``namespace/name`` -> pod object) to evict: on a failed device of their node, running
    or pending there, not being deleted, and recreated elsewhere by their controller."""
    out: dict[str, Eviction] = {}
    for device in failed:
        for key in device.pods:
            pod = pods.get(key)
            if pod is None or key in out:
                continue
            meta, spec = _map(pod.get("metadata")), _map(pod.get("spec"))
            if spec.get("nodeName") != device.node or meta.get("deletionTimestamp"):
                continue
            if _map(pod.get("status")).get("phase") in ("Succeeded", "Failed"):
                continue
            if not recreated_elsewhere(pod):
                continue
            namespace, _, name = key.partition("/")
            out[key] = Eviction(namespace, name, device.node,
                                f"{device.where} of {device.node} failed ({device.reason}: {device.message})")
    return [out[k] for k in sorted(out)]
