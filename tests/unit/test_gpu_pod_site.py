"""sharing.api.gpu_pod_site: the GPU pods the placement preference counts, as the controller counts them.

The scheduler extender's pod watch and the controller's planner must count the same pods, so
over a table of pod objects the reader is compared with what the controller's state build
records (``controller.state.build.parse_pod``: a gpupack pod's node and mode, a plain pod's
node), and with the site each row is written to have.
"""

from __future__ import annotations

from typing import Any

import pytest

from controller.state.build import parse_pod
from sharing.api.allocation import Allocation, ContainerAllocation
from sharing.api.gpu_pod_site import UNCOUNTED_MODES, GpuPodSite, gpu_pod_site, pinned_node, whole_gpus_requested

GATE = [{"name": "gpupack.io/capacity"}]
RESOURCES = {"mps": "nvidia.com/gpu.shared", "time-slicing": "nvidia.com/gpu.shared", "whole": "nvidia.com/gpu",
             "mig": "nvidia.com/mig-1g.10gb"}


def _pin(node: str) -> dict[str, Any]:
    term = {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}


def pod(name: str, *, mode: str | None = None, gpus: int = 0, node: str | None = None, pinned: str | None = None,
        gated: bool = False, priority: Any = None, phase: str = "Running", deleting: bool = False,
        record: str | None = None, init_gpus: int = 0) -> dict[str, Any]:
    """A pod object: gpupack's (``mode``: the record the webhook's own writer makes), or a plain
    one asking ``gpus`` of ``nvidia.com/gpu`` (0: CPU only)."""
    limits: dict[str, str] = {}
    annotations: dict[str, str] = {}
    if mode is not None:
        resource = RESOURCES[mode]
        limits[resource] = "1"
        annotations["gpupack.io/allocation"] = record or Allocation(
            mode=mode, gated=gated, capacity_existed=True, policy="p", reason="r",  # type: ignore[arg-type]
            replicas=4 if mode in ("mps", "time-slicing") else None,
            containers=(ContainerAllocation("c", "containers", 250 if mode != "whole" else 1000, None, resource,
                                            "1g.10gb" if mode == "mig" else None),),
        ).to_annotation()
    elif gpus:
        limits["nvidia.com/gpu"] = str(gpus)
    if record is not None and mode is None:
        annotations["gpupack.io/allocation"] = record
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {"limits": limits}}]}
    if init_gpus:
        spec["initContainers"] = [{"name": "i", "resources": {"limits": {"nvidia.com/gpu": str(init_gpus)}}}]
    if node:
        spec["nodeName"] = node
    if pinned:
        spec["affinity"] = _pin(pinned)
    if gated:
        spec["schedulingGates"] = GATE
    if priority is not None:
        spec["priority"] = priority
    meta: dict[str, Any] = {"name": name, "namespace": "team", "uid": f"uid-{name}",
                            "creationTimestamp": "2026-11-30T01:00:00Z", "annotations": annotations}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-30T02:00:00Z"
    return {"metadata": meta, "spec": spec, "status": {"phase": phase}}


FORGED = Allocation(mode="mps", gated=False, capacity_existed=True, policy="p", reason="r", replicas=4,
                    containers=(ContainerAllocation("c", "containers", 250, None, "nvidia.com/gpu.shared"),)
                    ).to_annotation()

CPU_RECORD = Allocation(mode="cpu", gated=False, capacity_existed=True, policy="p", reason="r", backend="dra",
                        containers=()).to_annotation()

TABLE: list[tuple[dict[str, Any], GpuPodSite | None]] = [
    (pod("mps-bound", mode="mps", node="n1", priority=100), GpuPodSite("n1", 100)),
    (pod("ts-bound", mode="time-slicing", node="n2"), GpuPodSite("n2", 0)),
    (pod("whole-bound", mode="whole", node="n3", priority=-5), GpuPodSite("n3", -5)),
    (pod("mig-bound", mode="mig", node="n4", priority=100), None),
    (pod("mps-pinned-gated", mode="mps", pinned="n5", gated=True, priority=7), GpuPodSite("n5", 7)),
    (pod("mps-gated", mode="mps", gated=True, priority=7), None),
    (pod("mig-pinned-gated", mode="mig", pinned="n5", gated=True), None),
    (pod("plain-bound", gpus=2, node="n6", priority=1000), GpuPodSite("n6", 1000)),
    (pod("plain-init-bound", init_gpus=1, node="n6"), GpuPodSite("n6", 0)),
    (pod("plain-pending", gpus=1, phase="Pending"), None),
    (pod("plain-pinned-unbound", gpus=1, pinned="n6", phase="Pending"), None),
    (pod("plain-finished", gpus=1, node="n6", phase="Succeeded"), None),
    (pod("mps-failed", mode="mps", node="n1", phase="Failed"), None),
    (pod("plain-deleting", gpus=1, node="n6", deleting=True), None),
    (pod("mps-deleting", mode="mps", node="n1", deleting=True), None),
    # the record says MPS, the pod asks a whole GPU: not trusted, and not a plain pod either
    (pod("forged", gpus=1, node="n7", record=FORGED), None),
    (pod("garbage-record", gpus=1, node="n7", record="{not json"), None),
    (pod("cpu-only", node="n8", priority=100), None),
    # a DRA pool pod that asks for no GPU, placed by the engine: not a GPU pod either
    (pod("dra-cpu", node="n8", priority=100, record=CPU_RECORD), None),
    # priority fields the reader refuses: counted at 0, as the controller plans it
    (pod("odd-priority", gpus=1, node="n9", priority="high"), GpuPodSite("n9", 0)),
    (pod("too-high", mode="mps", node="n9", priority=2_000_000_000), GpuPodSite("n9", 0)),
]


def _controller_site(obj: dict[str, Any]) -> GpuPodSite | None:
    """What the controller's planner counts of ``obj`` (``SharedPlacer.__init__``'s two loops)."""
    parsed = parse_pod(obj)
    if parsed.pod is not None and parsed.pod.node is not None and parsed.pod.mode not in UNCOUNTED_MODES:
        return GpuPodSite(parsed.pod.node, parsed.pod.priority.value)
    if parsed.plain is not None and parsed.plain.node is not None:
        return GpuPodSite(parsed.plain.node, parsed.plain.priority)
    return None


@pytest.mark.parametrize(("obj", "site"), TABLE, ids=[o["metadata"]["name"] for o, _ in TABLE])
def test_the_reader_counts_what_the_controller_counts(obj: dict[str, Any], site: GpuPodSite | None) -> None:
    assert gpu_pod_site(obj) == site
    assert _controller_site(obj) == site


def test_the_table_covers_both_kinds_and_both_answers() -> None:
    counted = [o["metadata"]["name"] for o, s in TABLE if s is not None]
    assert {"mps-bound", "mps-pinned-gated", "plain-bound"} <= set(counted)
    assert len(counted) < len(TABLE)


def test_pinned_node_needs_one_host_in_every_term() -> None:
    assert pinned_node({"affinity": _pin("a")}) == "a"
    two = _pin("a")
    terms = two["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    terms.append(_pin("b")["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0])
    assert pinned_node({"affinity": two}) is None
    assert pinned_node({}) is None


def test_whole_gpus_requested_takes_the_peak_of_app_and_init_containers() -> None:
    obj = pod("p", gpus=2, init_gpus=3, node="n")
    assert whole_gpus_requested(obj) == 3
    assert whole_gpus_requested(pod("q", gpus=2, node="n", deleting=True)) == 0
