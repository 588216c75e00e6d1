"""The shared-pod placement sequence (``sharing.packing.shared_sequence``), and the replica count
a split gets (``sharing.rules.replicas.replicas_for_demand``).

The sequence is checked twice: step by step with recording steps (every branch, both orders),
and as one suite of cluster states run against both of its drivers, the live planner and the
simulator's product model (STYLE.md #10), which must reach the same outcome in each.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

import numpy as np
import pytest

from controller.planning.planner import plan
from controller.planning.sharedplan import typical_pods
from controller.state.snapshot import Gpu, Node, Pod, Snapshot
from sharing.api.crd import ReplicaPolicy
from sharing.packing.cluster import ClusterState
from sharing.packing.kube_scoring import MostAllocatedWeights
from sharing.packing.registry import make_policy
from sharing.packing.shared_sequence import ReplicaStep, place_shared
from sharing.packing.specs import NodeSpec, PodSpec
from sharing.rules.node_policy import NodePolicy
from sharing.rules.replicas import MAX_REPLICAS, largest_replicas, most_replicas, replicas_for_demand
from sharing.simulator.product import ProductReplay

GiB = 2**30


# --- the sequence, step by step -----------------------------------------------------------------


class SplitsFirst:
    splits_before_wasting = True


class WastesFirst:
    splits_before_wasting = False


@dataclass
class Recorder:
    """Steps that find what ``found`` names (``"replica:exact"``, ``"coming"``, ``"idle:small"``,
    ...) and record the order they were asked in."""

    found: set[str]
    asked: list[str] = field(default_factory=list)

    def replica(self, step: ReplicaStep) -> str | None:
        return self._ask(f"replica:{step}")

    def coming(self) -> str | None:
        return self._ask("coming")

    def idle_split(self, small_only: bool) -> str | None:
        return self._ask("idle:small" if small_only else "idle:any")

    def split(self, choice: str) -> str:
        self.asked.append(f"split {choice}")
        return f"split {choice}"

    def _ask(self, what: str) -> str | None:
        self.asked.append(what)
        return what if what in self.found else None


@pytest.mark.parametrize(
    ("policy", "found", "asked", "outcome"),
    [
        pytest.param(SplitsFirst(), {"replica:exact", "idle:small"}, ["replica:exact"], "replica:exact", id="exact"),
        pytest.param(SplitsFirst(), {"coming", "idle:small"}, ["replica:exact", "coming"], "coming", id="coming"),
        pytest.param(SplitsFirst(), {"idle:small", "replica:larger"},
                     ["replica:exact", "coming", "idle:small", "split idle:small"], "split idle:small", id="small-split"),
        pytest.param(SplitsFirst(), {"replica:larger", "idle:any"},
                     ["replica:exact", "coming", "idle:small", "replica:larger"], "replica:larger", id="larger-replica"),
        pytest.param(SplitsFirst(), {"idle:any"},
                     ["replica:exact", "coming", "idle:small", "replica:larger", "idle:any", "split idle:any"],
                     "split idle:any", id="any-split"),
        pytest.param(SplitsFirst(), set(), ["replica:exact", "coming", "idle:small", "replica:larger", "idle:any"],
                     None, id="nothing"),
        pytest.param(WastesFirst(), {"replica:least-waste"}, ["replica:least-waste"], "replica:least-waste",
                     id="wastes-first:least-waste"),
        pytest.param(WastesFirst(), {"coming", "idle:any"}, ["replica:least-waste", "coming"], "coming",
                     id="wastes-first:coming"),
        pytest.param(WastesFirst(), {"idle:any", "replica:larger"},
                     ["replica:least-waste", "coming", "idle:any", "split idle:any"], "split idle:any",
                     id="wastes-first:any-split"),
        pytest.param(WastesFirst(), set(), ["replica:least-waste", "coming", "idle:any"], None,
                     id="wastes-first:nothing"),
    ],
)
def test_the_sequence_takes_the_first_step_that_finds_room(
    policy: object, found: set[str], asked: list[str], outcome: str | None
) -> None:
    steps = Recorder(found)
    assert place_shared(steps, policy) == outcome
    assert steps.asked == asked


# --- one suite, both drivers --------------------------------------------------------------------

NOW = datetime(2026, 11, 30, 2, 0, tzinfo=timezone.utc)
MEMORY = 512_000


@dataclass(frozen=True)
class Shared:
    """A node of a scenario: ``replicas`` 0 is an idle (fresh) node, else shared by MPS into
    ``replicas`` with ``busy`` of them taken (on its first GPU) by pods like the one placed."""

    name: str
    gpus: int
    replicas: int = 0
    busy: int = 0
    cpu: int = 64_000


@dataclass(frozen=True)
class Scenario:
    policy: str
    nodes: tuple[Shared, ...]
    expected: tuple[str, ...] | None
    """``("replica", node)``, ``("split", node, replicas)``, or None: the pod waits (is dropped)."""
    milli: int = 200
    cpu: int = 2000
    """The CPU milli of the pod placed and of the busy ones: what gpupack's idle-node choice feeds."""

    def pods(self) -> list[Pod]:
        """The busy pods, then the gated one to place (the live planner's pods, the typical pods of both)."""
        busy = [Pod("team", f"busy-{n.name}-{i}", "mps", NOW - timedelta(hours=2), milli=(self.milli,),
                    memory_bytes=(None,), node=n.name, bound=True, cpu_milli=self.cpu)
                for n in self.nodes for i in range(n.busy)]
        return [*busy, Pod("team", "p", "mps", NOW - timedelta(minutes=5), milli=(self.milli,), memory_bytes=(None,),
                           gated=True, cpu_milli=self.cpu)]


def live_outcome(scenario: Scenario) -> tuple[str, ...] | None:
    """The live planner's outcome for the scenario's pod."""
    nodes = tuple(
        Node(n.name, "gpu", None, (), "mps" if n.replicas else "none", n.replicas or 1,
             tuple(Gpu(g, 80 * 1024, False, idle_since=NOW - timedelta(hours=1)) for g in range(n.gpus)),
             cpu_milli=n.cpu, memory_mib=MEMORY, spec_sharing="mps" if n.replicas else "none",
             spec_replicas=n.replicas or 1, cpu_used_milli=n.busy * scenario.cpu)
        for n in scenario.nodes)
    policy = NodePolicy(names=("p",), max_concurrent=4, idle_seconds=0)
    snapshot = Snapshot(nodes, tuple(scenario.pods()), {n.name: policy for n in nodes})
    result = plan(snapshot, NOW, policy_name=scenario.policy)
    if result.releases:
        (release,) = result.releases
        return ("replica", release.node)
    if result.sharing:
        (change,) = result.sharing
        return ("split", change.node, str(change.replicas))
    return None


def model_outcome(scenario: Scenario) -> tuple[str, ...] | None:
    """The product model's outcome for the same pod, from the same state."""
    nodes = scenario.nodes
    policy = make_policy(scenario.policy, rng=np.random.default_rng(0), typical=typical_pods(scenario.pods()))
    cluster = ClusterState([NodeSpec(n.name, n.cpu, MEMORY, n.gpus, "gpu") for n in nodes])
    model = ProductReplay(cluster, policy, MostAllocatedWeights(1, 1, 10, 10), "engine")
    for index, n in enumerate(nodes):
        model.modes[index] = n.replicas
        for i in range(n.busy):
            model._take_replica(PodSpec(f"busy-{n.name}-{i}", scenario.cpu, 0, 1, scenario.milli), index, 0)
    before = model.modes.copy()
    if model.place(PodSpec("p", scenario.cpu, 0, 1, scenario.milli)) is None:
        return None
    assert model.last_node is not None
    name = nodes[model.last_node].name
    if before[model.last_node] != model.modes[model.last_node]:
        return ("split", name, str(model.modes[model.last_node]))
    return ("replica", name)


DRIVERS = {"planner": live_outcome, "product-model": model_outcome}

# A 200-milli pod's own size is 5 replicas, a 300-milli one's 3. gpupack splits before it wastes
# (a small split only: at most 16 replicas on the node), FGD wastes first.
R2, R4 = Shared("r2", 1, 2, 1), Shared("r4", 1, 4, 1)
R2_FULL, R4_FULL = Shared("r2", 1, 2, 2), Shared("r4", 1, 4, 4)
BIG_FED, SMALL_STARVED = Shared("big-idle", 8, cpu=96_000), Shared("small-idle", 2, cpu=4_000)
SCENARIOS = {
    "exact": Scenario("gpupack", (Shared("r5", 1, 5, 1), R4, Shared("idle", 2)), ("replica", "r5")),
    "small-split": Scenario("gpupack", (R4, Shared("idle", 2)), ("split", "idle", "5")),
    "larger-replica": Scenario("gpupack", (R4, Shared("big-idle", 8)), ("replica", "r4")),
    # The idle node whose CPU feeds its replicas is the 8-GPU one, whose split (40) is not small:
    # the least-waste replica (r = 4, not r = 2) rather than split it or the starved small node.
    "larger-replica:the-fed-node-is-not-small": Scenario("gpupack", (R2, R4, BIG_FED, SMALL_STARVED), ("replica", "r4")),
    "larger-replica:no-idle-node": Scenario("gpupack", (R2, R4), ("replica", "r4")),
    "any-split": Scenario("gpupack", (R4_FULL, Shared("big-idle", 8)), ("split", "big-idle", "5")),
    # gpupack's idle node is the one whose CPU feeds its replicas, not the one with the fewest GPUs.
    "any-split:the-fed-node": Scenario("gpupack", (R2_FULL, R4_FULL, BIG_FED, SMALL_STARVED),
                                       ("split", "big-idle", "3"), milli=300),
    "nothing": Scenario("gpupack", (R4_FULL,), None),
    "wastes-first:least-waste": Scenario("FGD", (R2, R4, Shared("idle", 2)), ("replica", "r4")),
    "wastes-first:any-split": Scenario("FGD", (R2_FULL, Shared("idle", 2)), ("split", "idle", "5")),
}


@pytest.mark.parametrize("driver", sorted(DRIVERS))
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_both_drivers_take_each_branch_alike(driver: str, scenario: str) -> None:
    assert DRIVERS[driver](SCENARIOS[scenario]) == SCENARIOS[scenario].expected


# --- how many replicas a split gets -------------------------------------------------------------


def test_the_own_size_is_the_most_replicas_every_container_fits_within_the_bounds() -> None:
    assert most_replicas(((200, None),), 0) == 5
    assert most_replicas(((200, None), (300, None)), 0) == 3
    assert most_replicas(((200, 20 * GiB),), 80 * GiB) == 4  # memory binds: 4 x 20 GiB
    assert most_replicas(((200, None),), 0, minimum=1, maximum=4) == 4
    assert most_replicas(((400, None),), 0, minimum=3) == 0  # fits 2 at most, below the policy's minimum
    assert most_replicas(((200, None),), 0, admits=lambda r: r % 2 == 0) == 4
    assert [largest_replicas(m) for m in (125, 126, 500, 501, 1000)] == [8, 7, 2, 1, 1]


def test_a_split_is_sized_for_the_demand_and_for_a_lone_pod_is_its_own_size() -> None:
    one = ((100, None),)
    three = ((300, None),)
    # Alone, a 100-milli pod gets its own size: 8 replicas (the product model's case).
    assert replicas_for_demand([one], gpus=1, gpu_memory_bytes=0) == 8
    # A burst of 300-milli pods behind it: 3 replicas serve it best (8 would serve the first pod only).
    assert replicas_for_demand([one, three, three], gpus=1, gpu_memory_bytes=0) == 3
    # Ties go to the larger count: two 100-milli pods fit any count from 2 up.
    assert replicas_for_demand([one, one], gpus=1, gpu_memory_bytes=0) == MAX_REPLICAS
    # The policy's bounds and ``admits`` limit the counts; a first pod fitting none gets 0.
    assert replicas_for_demand([one, three, three], gpus=1, gpu_memory_bytes=0, minimum=4) == 8
    assert replicas_for_demand([one, three, three], gpus=1, gpu_memory_bytes=0,
                               admits=lambda index, r: index == 0 or r != 3) == 2
    assert replicas_for_demand([((600, None),)], gpus=1, gpu_memory_bytes=0, minimum=2) == 0


def test_the_crd_and_a_policyless_node_bound_replicas_alike() -> None:
    """The SharingPolicy's default bounds are the rule's (``sharing.api`` cannot import ``sharing.rules``)."""
    default = ReplicaPolicy()
    assert (default.min, default.max) == (1, MAX_REPLICAS)
    assert (NodePolicy(names=("p",)).min_replicas, NodePolicy(names=("p",)).max_replicas) == (1, MAX_REPLICAS)
