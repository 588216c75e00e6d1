"""What the node agent's parts may use of the agent: a protocol, so no part imports the agent.

The agent (``node.agent.Agent``) is the loop; its parts act on the node through
this much of it and nothing more:

- how a MIG layout is applied (``node.layouts``: NVML directly, or the GPU
  Operator's mig-manager);
- how the node's GPUs are advertised to the kubelet (``node.advertising``: the
  stock NVIDIA device plugin, or its emulator on simulated nodes).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from prometheus_client import Counter, Histogram

from mig.model import PlacedInstance
from node.base import conditions as C
from node.base.snapshot import NodeSnapshot
from node.base.journal import Journal
from node.base.kube import Kube
from node.nvml.protocol import GpuInstance, NvmlBackend
from node.base.idle_tracking import IdleTracker
from node.base.reshape_rules import ReshapeRules
from node.base.pods import PodUse
from node.base.settings import AgentSettings
from sharing.api.crd import GPUNodeSpec


class ReshapeMetrics(Protocol):
    """The agent's metrics (``node.metrics.AgentMetrics``) a part records: finished reshapes and how
    long they took. Only these, so the parts sit below the agent's metrics, which read ``node.health``."""

    @property
    def reconfigurations(self) -> Counter: ...

    @property
    def reconfigure_seconds(self) -> Histogram: ...


class JournalStore(Protocol):
    """Where a reshape's journal is written ahead of each NVML step."""

    def save(self, journal: Journal) -> None: ...


class Advertiser(Protocol):
    """How the node's GPUs and sharing reach the kubelet (``node.advertising``)."""

    def allocate(self, ctx: AgentContext, snapshot: NodeSnapshot, uses: list[PodUse], labels: Mapping[str, str],
                 replicas: int) -> bool:
        """Before a tick reconciles: give bound pods their devices if this advertiser does that
        itself (the emulator); whether NVML changed."""
        ...

    def wait_paused(self, ctx: AgentContext) -> None:
        """The device plugin was told to stop for a reshape: return once it has."""
        ...

    def restart(self, ctx: AgentContext, journal: Journal, store: JournalStore) -> Journal:
        """After a reshape the plugin was not paused for: make it read the GPUs again."""
        ...

    def readvertise(self, ctx: AgentContext, snapshot: NodeSnapshot, node: Mapping[str, Any]) -> bool:
        """After a reshape, before the Node's allocatable is compared with NVML; whether it
        changed the Node (then it is read again)."""
        ...

    def publish(self, ctx: AgentContext, snapshot: NodeSnapshot, node: Mapping[str, Any], spec: GPUNodeSpec | None,
                labels: Mapping[str, str]) -> list[C.Cond]:
        """Advertise the spec's sharing; the conditions to report about it."""
        ...

    def health(self, ctx: AgentContext, withheld: frozenset[str], restart: bool) -> None:
        """The devices the plugin reports unhealthy by its own rules (``node.health.plugin``); ``restart``:
        faults it acted on have ended and none is left, so restart it (it never re-advertises a device
        by itself)."""
        ...


class AgentContext(Protocol):
    """The agent as its parts see it."""

    s: AgentSettings
    kube: Kube
    backend: NvmlBackend | None
    clock: Callable[[], float]
    sleep: Callable[[float], None]
    idle: IdleTracker
    rules: ReshapeRules
    busy_ctx: tuple[dict[str, list[str]], list[PodUse]]
    """This tick's pods per device (GPU or MIG UUID), and pod uses no device was found for."""
    advertiser: Advertiser

    @property
    def metrics(self) -> ReshapeMetrics:
        """What the parts record of the agent's metrics."""
        ...

    def remember(self, obj: Mapping[str, Any]) -> None:
        """Note the resourceVersion and generation of an object the agent just wrote."""
        ...

    def event(self, type_: str, reason: str, message: str) -> None:
        """Record a Kubernetes event on this node's GPUNode (repeats suppressed)."""
        ...

    def withheld(self, snapshot: NodeSnapshot) -> frozenset[str]:
        """Device UUIDs the device plugin withholds for faults in force (not allocatable)."""
        ...

    def faulted(self) -> frozenset[tuple[int, int | None]]:
        """Every fault in force (``node.health``) as ``(GPU index, None)`` for a GPU and ``(GPU index,
        GPU-instance id)`` for one MIG instance, whether or not the device plugin would withdraw it:
        what an advertiser that withdraws devices itself (DRA) must not offer."""
        ...

    def snapshot(self) -> NodeSnapshot:
        """NVML as it is now."""
        ...

    def busy(self, index: int, instances: tuple[GpuInstance, ...]) -> frozenset[PlacedInstance]:
        """Instances of GPU ``index`` in use now (processes, plus the tick's pod map)."""
        ...
