"""Table tests of the controller's planning core: releases, reshapes, policy bounds, batching."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from controller.planning.migplan import minimal_change
from controller.planning.planner import Plan, plan
from controller.state.snapshot import Gpu, Node, Pod, Snapshot
from mig.catalog import get_model
from mig.geometry import validate_layout
from mig.model import PlacedInstance, Placement
from sharing.rules.node_policy import NodePolicy, PolicyWindows
from sharing.rules.windows import Window

H100 = get_model("H100-80GB")
A100 = get_model("A100-80GB")
NOW = datetime(2026, 11, 30, 2, 0, tzinfo=timezone.utc)  # a Monday
LONG_AGO = NOW - timedelta(hours=2)
POLICY = NodePolicy(names=("p",), max_concurrent=2, idle_seconds=600)


def inst(profile: str, start: int, size: int) -> PlacedInstance:
    return PlacedInstance(profile, Placement(start, size))


FULL_7G = (inst("7g.80gb", 0, 8),)


def gpu(index: int, instances: tuple[PlacedInstance, ...] = (), in_use: tuple[PlacedInstance, ...] = (),
        idle: datetime | None = LONG_AGO, mig: bool = True, reshaping: bool = False) -> Gpu:
    return Gpu(index, H100.memory_mib, mig, instances, in_use, idle if not in_use else None, reshaping=reshaping)


def node(name: str, *gpus: Gpu, model=H100, sharing="none", replicas=1) -> Node:  # type: ignore[no-untyped-def]
    return Node(name, model.product, model, (("pool", "a"),), sharing, replicas, gpus, spec_sharing=sharing, spec_replicas=replicas)


def mig_pod(name: str, profile: str = "1g.10gb", *, minutes: int = 0, gated: bool = True, on: str | None = None,
            products: tuple[str, ...] = ()) -> Pod:
    return Pod("team", name, "mig", NOW - timedelta(minutes=60 - minutes), profiles=(profile,), milli=(100,),
               memory_bytes=(None,), gated=gated, node=on, bound=on is not None, products=products)


def shared_pod(name: str, mode: str = "mps", milli: int = 200, *, gated: bool = True, on: str | None = None) -> Pod:
    return Pod("team", name, mode, NOW - timedelta(minutes=30), milli=(milli,), memory_bytes=(None,),  # type: ignore[arg-type]
               gated=gated, node=on, bound=on is not None)


def run(nodes: list[Node], pods: list[Pod], policy: NodePolicy | None = POLICY, now: datetime = NOW,
        mig_mode_changes: bool = False) -> Plan:
    policies = {n.name: policy for n in nodes} if policy is not None else {}
    return plan(Snapshot(tuple(nodes), tuple(pods), policies), now, mig_mode_changes=mig_mode_changes)


def test_free_instance_releases_the_pod_to_its_node() -> None:
    one_g = inst("1g.10gb", 6, 1)
    result = run([node("a", gpu(0, FULL_7G)), node("b", gpu(0, (one_g,)))], [mig_pod("p")])
    assert [(r.pod, r.node) for r in result.releases] == [("team/p", "b")]
    assert result.layouts == ()


def test_claimed_instance_is_not_given_twice() -> None:
    one_g = inst("1g.10gb", 6, 1)
    # The first pod was released earlier (pinned, not yet reported in use by the agent).
    pods = [mig_pod("old", gated=False, on="b"), mig_pod("new")]
    result = run([node("b", gpu(0, (one_g,)))], pods)
    assert result.releases == ()
    assert [w.pod for w in result.waiting] == ["team/new"]


def test_missing_profile_extends_a_partly_used_gpu_without_destroying() -> None:
    busy = inst("3g.40gb", 4, 4)
    result = run([node("a", gpu(0, (busy,), in_use=(busy,)))], [mig_pod("p", "2g.20gb")])
    (change,) = result.layouts
    assert change.kind == "extend" and change.destroy == ()
    assert busy in change.layout and Counter(i.profile for i in change.create) == {"2g.20gb": 1}
    assert validate_layout(H100, change.layout) is None
    assert result.releases == ()  # the gate is lifted only once the agent reports the instance


def test_idle_gpu_is_reshaped_and_busy_instances_survive() -> None:
    busy = inst("7g.80gb", 0, 8)
    idle_full = gpu(1, FULL_7G)
    result = run([node("a", gpu(0, (busy,), in_use=(busy,)), idle_full)], [mig_pod("p", "3g.40gb")])
    (change,) = result.layouts
    assert (change.index, change.kind) == (1, "reshape")
    assert change.destroy == FULL_7G


def test_busy_gpu_is_never_touched_even_when_it_is_the_only_one() -> None:
    busy = inst("7g.80gb", 0, 8)
    result = run([node("a", gpu(0, (busy,), in_use=(busy,)))], [mig_pod("p", "1g.10gb")])
    assert result.layouts == ()
    assert "no GPU may be reshaped" in result.waiting[0].reason


def test_gpu_idle_for_less_than_idle_seconds_keeps_its_instances() -> None:
    recently = gpu(0, FULL_7G, idle=NOW - timedelta(seconds=30))
    result = run([node("a", recently)], [mig_pod("p")])
    assert result.layouts == ()


@pytest.mark.parametrize(
    ("policy", "expected_changes"),
    [
        pytest.param(None, 0, id="no-policy-selects-the-node"),
        pytest.param(NodePolicy(names=("p",), max_concurrent=0, idle_seconds=0), 0, id="maxConcurrent-0-freezes"),
        pytest.param(NodePolicy(names=("p",), max_concurrent=1, idle_seconds=0), 1, id="maxConcurrent-1"),
        pytest.param(NodePolicy(names=("p",), max_concurrent=3, idle_seconds=0), 2, id="maxConcurrent-3-two-needed"),
        pytest.param(NodePolicy(names=("p",), max_concurrent=5, idle_seconds=0, windows=(PolicyWindows("p", (Window(22 * 60, 4 * 60),)),)), 2,
                     id="inside-a-window-crossing-midnight"),
        pytest.param(NodePolicy(names=("p",), max_concurrent=5, idle_seconds=0, windows=(PolicyWindows("p", (Window(8 * 60, 18 * 60),)),)), 0,
                     id="outside-the-window"),
        pytest.param(NodePolicy(names=("p",), max_concurrent=5, idle_seconds=0, allowed_profiles=frozenset({"1g.10gb"})), 0,
                     id="profile-not-allowed"),
    ],
)
def test_policy_bounds(policy: NodePolicy | None, expected_changes: int) -> None:
    # Two 7g pods need two whole GPUs reshaped from 3g+3g.
    halves = (inst("3g.40gb", 0, 4), inst("3g.40gb", 4, 4))
    nodes = [node("a", gpu(0, halves), gpu(1, halves))]
    result = run(nodes, [mig_pod("x", "7g.80gb"), mig_pod("y", "7g.80gb", minutes=1)], policy)
    assert len(result.layouts) == expected_changes


def test_reshapes_in_flight_count_against_max_concurrent() -> None:
    halves = (inst("3g.40gb", 0, 4), inst("3g.40gb", 4, 4))
    nodes = [node("a", gpu(0, halves, reshaping=True), gpu(1, halves), gpu(2, halves))]
    result = run(nodes, [mig_pod("x", "7g.80gb"), mig_pod("y", "7g.80gb", minutes=1)])
    assert len(result.layouts) == 1  # maxConcurrent 2, one already in flight


def test_a_burst_of_small_pods_is_batched_onto_one_gpu() -> None:
    nodes = [node("a", gpu(0, FULL_7G), gpu(1, FULL_7G), gpu(2, FULL_7G))]
    pods = [mig_pod(f"p{i}", "1g.10gb", minutes=i) for i in range(7)]
    result = run(nodes, pods)
    (change,) = result.layouts
    assert Counter(i.profile for i in change.layout) == {"1g.10gb": 7}
    assert len(result.waiting) == 7


def test_extension_is_preferred_over_destroying_and_over_enabling_mig() -> None:
    partly = inst("4g.40gb", 0, 4)
    nodes = [
        node("a", gpu(0, FULL_7G)),
        node("b", gpu(0, (partly,), in_use=(partly,))),
        node("c", gpu(0, (), mig=False)),
    ]
    (change,) = run(nodes, [mig_pod("p", "2g.20gb")], mig_mode_changes=True).layouts
    assert (change.node, change.kind) == ("b", "extend")


@pytest.mark.parametrize("allowed", [True, False])
def test_mig_is_turned_on_only_when_mode_changes_are_allowed(allowed: bool) -> None:
    result = run([node("c", gpu(0, (), mig=False))], [mig_pod("p", "2g.20gb")], mig_mode_changes=allowed)
    assert [c.kind for c in result.layouts] == (["enable"] if allowed else [])


def test_product_affinity_is_respected() -> None:
    nodes = [node("h", gpu(0, FULL_7G)), node("a", gpu(0, (inst("7g.80gb", 0, 8),)), model=A100)]
    (change,) = run(nodes, [mig_pod("p", "3g.40gb", products=(A100.product,))]).layouts
    assert change.node == "a"


def test_oldest_pod_is_served_first() -> None:
    one_g = inst("1g.10gb", 6, 1)
    pods = [mig_pod("young", minutes=10), mig_pod("old", minutes=0)]
    result = run([node("b", gpu(0, (one_g,)))], pods, policy=None)
    assert [r.pod for r in result.releases] == ["team/old"]


def test_minimal_change_never_destroys_in_use_instances() -> None:
    a, b, c = inst("1g.10gb", 0, 1), inst("2g.20gb", 2, 2), inst("3g.40gb", 4, 4)
    assert minimal_change(H100, (a, b, c), (c,), ["7g.80gb"], may_destroy=True) is None
    found = minimal_change(H100, (a, b, c), (c,), ["4g.40gb"], may_destroy=True)
    assert found is not None and set(found[1]) == {a, b} and c in found[0]  # slices 0-3 freed, c kept
    assert minimal_change(H100, (a, b, c), (c,), ["4g.40gb"], may_destroy=False) is None
    found = minimal_change(H100, (a, b, c), (a,), ["3g.40gb"], may_destroy=True)
    assert found is not None
    target, destroyed = found
    assert a in target and a not in destroyed and validate_layout(H100, target) is None


def test_shared_pod_goes_to_a_node_with_a_free_replica() -> None:
    full = node("m", gpu(0, mig=False), gpu(1, mig=False), sharing="mps", replicas=4)
    taken = [shared_pod(f"r{i}", gated=False, on="m") for i in range(8)]  # every replica taken
    roomy = node("n", gpu(0, mig=False), sharing="mps", replicas=4)
    result = run([full, roomy], [*taken, shared_pod("p", milli=250)])
    assert [(r.pod, r.node) for r in result.releases] == [("team/p", "n")]
    # A 200-milli pod fits 5 replicas: gpupack re-splits the idle node into 5 rather than
    # hand it a quarter of a GPU (node_sharing rule 2)...
    (change,) = run([full, roomy], [*taken, shared_pod("p", milli=200)]).sharing
    assert (change.node, change.replicas) == ("n", 5)
    # ...and takes the quarter when the node may not be split (no policy).
    no_split = run([full, roomy], [*taken, shared_pod("p", milli=200)], policy=None)
    assert [(r.pod, r.node) for r in no_split.releases] == [("team/p", "n")] and no_split.sharing == ()


def test_shared_pod_switches_an_idle_node_when_no_replica_fits() -> None:
    plain = node("plain", gpu(0, mig=False), gpu(1, mig=False))
    result = run([plain], [shared_pod("p", "time-slicing", milli=300), shared_pod("q", "time-slicing", milli=300)],
                 NodePolicy(names=("p",), max_concurrent=1, idle_seconds=0, max_replicas=8))
    (change,) = result.sharing
    assert (change.node, change.mode, change.replicas) == ("plain", "time-slicing", 3)
    assert len(result.waiting) == 2 and result.releases == ()


def test_no_policy_no_sharing_change() -> None:
    plain = node("plain", gpu(0, mig=False))
    result = run([plain], [shared_pod("p")], policy=None)
    assert result.sharing == () and result.waiting


def test_unschedulable_ungated_pod_gets_capacity_but_is_not_released() -> None:
    pod = Pod("team", "late", "mig", NOW, profiles=("3g.40gb",), milli=(300,), memory_bytes=(None,), unschedulable=True)
    result = run([node("a", gpu(0, FULL_7G))], [pod])
    (change,) = result.layouts
    assert change.kind == "reshape" and result.releases == ()
    one_free = run([node("a", gpu(0, (inst("3g.40gb", 0, 4),)))], [pod])
    assert one_free.releases == () and one_free.layouts == () and "kube-scheduler" in one_free.waiting[0].reason


def test_pod_node_affinity_and_selector_are_respected() -> None:
    one_g = inst("1g.10gb", 6, 1)
    a = Node("a", H100.product, H100, (("zone", "x"),), "none", 1, (gpu(0, (one_g,)),))
    b = Node("b", H100.product, H100, (("zone", "y"),), "none", 1, (gpu(0, (one_g,)),))
    wants_y = Pod("team", "p", "mig", NOW, profiles=("1g.10gb",), milli=(100,), memory_bytes=(None,), gated=True,
                  terms=((("zone", "In", ("y",)),),))
    assert [r.node for r in run([a, b], [wants_y]).releases] == ["b"]
    selector = Pod("team", "q", "mig", NOW, profiles=("1g.10gb",), milli=(100,), memory_bytes=(None,), gated=True,
                   node_selector=(("zone", "z"),))
    assert run([a, b], [selector]).releases == ()


def test_idle_gpu_reshapes_follow_the_simulators_layout_engine() -> None:
    from sharing.packing.mig_layouts import GpupackStrategy

    pods = [mig_pod("a", "2g.20gb", minutes=1), mig_pod("b", "1g.10gb", minutes=2)]
    (change,) = run([node("a", gpu(0, FULL_7G))], pods).layouts
    demand = {"2g.20gb": 1, "1g.10gb": 1}
    recent = {"2g.20gb": 0.99, "1g.10gb": 1.0}
    (expected,) = GpupackStrategy().plan(H100, [(0, ("7g.80gb",))], demand, recent)
    assert sorted(i.profile for i in change.layout) == sorted(expected.layout)
    assert validate_layout(H100, change.layout) is None


def test_an_instance_being_destroyed_is_not_given_to_a_later_pod() -> None:
    pods = [mig_pod("first", "3g.40gb", minutes=0), mig_pod("second", "7g.80gb", minutes=1)]
    result = run([node("a", gpu(0, FULL_7G))], pods)
    assert result.releases == ()  # the 7g goes away for the 3g; "second" must wait
    assert {w.pod for w in result.waiting} == {"team/first", "team/second"}


def test_masked_nodes_leave_the_engines_state_cache_true() -> None:
    """A pod pinned to one node used to hide the others by writing CPU -1 into the
    engine's state, which the policy's cache recorded; later pods of the same cycle
    were then scored against nodes with no CPU. Every cached state must stay the
    node's true one, and a later pod must be placed as a fresh cycle would place it."""
    from controller.planning.sharedplan import SharedPlacer

    nodes = [node(name, gpu(0, mig=False), gpu(1, mig=False), sharing="mps", replicas=4) for name in ("a", "b", "c")]
    nodes = [replace(n, cpu_milli=64_000, memory_mib=256_000) for n in nodes]
    free = {"a": 8, "b": 8, "c": 8}
    pinned = shared_pod("pinned", milli=200, on="a")
    later = shared_pod("later", milli=200)
    placer = SharedPlacer(nodes, free, [pinned, later])
    assert placer.place(pinned, free) == "a"
    assert placer.cluster is not None and placer.policy is not None
    cache = placer.policy.cache(placer.cluster)  # type: ignore[attr-defined]
    cached_cpu = [int(cache.cpu[cache.node_state[i]]) for i in range(len(nodes))]
    assert cached_cpu == [int(c) for c in placer.cluster.cpu_free]
    free_after = {"a": 7, "b": 8, "c": 8}
    fresh = SharedPlacer(nodes, free_after, [pinned, later])
    assert placer.place(later, free_after) == fresh.place(later, free_after)


# --- whole GPUs for requests above half a GPU ----------------------------------


def whole_pod(name: str, *, gated: bool = True, on: str | None = None, gpus: int = 1) -> Pod:
    return Pod("team", name, "whole", NOW - timedelta(minutes=20), milli=(600,) * gpus, memory_bytes=(None,) * gpus,
               gated=gated, node=on, bound=on is not None)


def plain(name: str, gpus: int, **kw) -> Node:  # type: ignore[no-untyped-def]
    return node(name, *(gpu(i, mig=False) for i in range(gpus)), **kw)


def test_whole_pod_is_released_to_a_node_with_a_free_whole_gpu() -> None:
    busy = replace(plain("busy", 2), whole_taken=2)
    roomy = plain("roomy", 2)
    shared = plain("shared", 2, sharing="mps", replicas=4)
    result = run([busy, roomy, shared], [whole_pod("w")])
    assert [(r.pod, r.node) for r in result.releases] == [("team/w", "roomy")]
    # A pinned but not yet bound whole pod holds its GPU: the second pod of two finds none left.
    held = replace(whole_pod("held", gated=False, on="roomy"), bound=False)
    two = run([busy, replace(roomy, whole_taken=1)], [held, whole_pod("w")])
    assert two.releases == () and "no node has 1 free whole GPU" in two.waiting[0].reason


def test_idle_shared_node_returns_to_whole_gpus_when_a_whole_pod_waits() -> None:
    busy_shared = plain("busy", 2, sharing="mps", replicas=4)
    idle_shared = plain("idle", 4, sharing="mps", replicas=4)
    result = run([busy_shared, idle_shared], [shared_pod("r", on="busy", gated=False), whole_pod("w", gpus=2)])
    (change,) = result.sharing
    assert (change.node, change.mode, change.replicas) == ("idle", "none", 1)
    assert "returning to whole GPUs" in result.waiting[-1].reason


def test_plain_whole_gpu_pods_waiting_bring_an_idle_shared_node_back() -> None:
    idle_shared = plain("idle", 4, sharing="time-slicing", replicas=2)
    snapshot = Snapshot((idle_shared,), (), {"idle": POLICY}, whole_waiting=3)
    (change,) = plan(snapshot, NOW).sharing
    assert (change.node, change.mode) == ("idle", "none")
    assert plan(replace(snapshot, whole_waiting=0), NOW).sharing == ()
    roomy = plain("roomy", 4)
    covered = Snapshot((idle_shared, roomy), (), {"idle": POLICY, "roomy": POLICY}, whole_waiting=3)
    assert plan(covered, NOW).sharing == ()  # free whole GPUs elsewhere cover the demand


def test_a_node_holding_whole_gpu_pods_is_never_split_into_replicas() -> None:
    holding = replace(plain("holding", 2), whole_taken=1)
    result = run([holding], [shared_pod("p", milli=300)], NodePolicy(names=("p",), max_concurrent=1, idle_seconds=0))
    assert result.sharing == () and result.releases == ()


def test_controller_and_product_model_place_whole_gpu_pods_alike() -> None:
    """gpupack's rule for whole-GPU pods, in the live placer and the product model: a whole-GPU
    node in use first; when none fits, the idle node whose CPU could feed the fewest replicas."""

    from controller.planning.sharedplan import SharedPlacer
    from sharing.packing.cluster import ClusterState
    from sharing.packing.gpupack_policy import GpupackPolicy
    from sharing.packing.kube_scoring import MostAllocatedWeights
    from sharing.packing.specs import NodeSpec, PodSpec
    from sharing.packing.node_sharing import WHOLE
    from sharing.packing.typical import TypicalPods
    from sharing.simulator.product import ProductReplay

    specs = [("in-use", 2, 64_000), ("rich-idle", 4, 96_000), ("poor-idle", 4, 6_000)]
    live_nodes = [replace(plain(name, gpus), cpu_milli=cpu, memory_mib=512_000) for name, gpus, cpu in specs]
    shapes = [replace(shared_pod(f"t{i}", milli=300), cpu_milli=4000) for i in range(3)] + [whole_pod("tw")]
    placer = SharedPlacer(live_nodes, {}, shapes)
    free = {"in-use": 1, "rich-idle": 4, "poor-idle": 4}
    cluster = ClusterState([NodeSpec(name, cpu, 512_000, gpus, "gpu") for name, gpus, cpu in specs])
    typical = TypicalPods.from_pods([PodSpec(f"t{i}", 4000, 0, 1, 300) for i in range(3)] + [PodSpec("tw", 0, 0, 1, 1000)])
    model = ProductReplay(cluster, GpupackPolicy(typical), MostAllocatedWeights(1, 1, 10, 10), "engine")
    model.cluster.place(PodSpec("held", 0, 0, 1, 1000), 0, (0,))
    model.modes[0] = WHOLE
    # 1. One GPU: the whole-GPU node in use, not an idle one, in both.
    assert placer.place_whole(whole_pod("one"), live_nodes, free) == "in-use"
    model.place(PodSpec("one", 0, 0, 1, 600))  # above half a GPU: the model's whole-GPU pod
    assert model.cluster.gpu_free[0].sum() == 0 and model.modes.tolist() == [WHOLE, 0, 0]
    # 2. No node in use has a GPU left: the idle node sharing would use worst (its CPU feeds
    #    few 300-milli replicas), so the CPU-rich one stays idle for shared pods, in both.
    free["in-use"] = 0
    assert placer.place_whole(whole_pod("two"), live_nodes, free) == "poor-idle"
    model.place(PodSpec("two", 0, 0, 1, 600))
    assert model.modes.tolist() == [WHOLE, 0, WHOLE]


def test_switch_candidates_are_judged_on_the_labels_they_will_have() -> None:
    """The webhook's terms name the sharing a pod needs (strategy In [mps]; strategy NotIn
    [mps, time-slicing] for a whole GPU); an idle node about to be switched does not carry
    those labels yet, so it is judged on the labels it will have."""
    labels = (("nvidia.com/gpu.sharing-strategy", "none"), ("nvidia.com/gpu.replicas", "1"))
    idle_plain = replace(plain("plain", 2), labels=labels)
    wants_mps = replace(shared_pod("p", milli=300), terms=((("nvidia.com/gpu.sharing-strategy", "In", ("mps",)),),))
    (change,) = run([idle_plain], [wants_mps], NodePolicy(names=("p",), max_concurrent=1, idle_seconds=0)).sharing
    assert (change.node, change.mode, change.replicas) == ("plain", "mps", 3)
    shared_labels = (("nvidia.com/gpu.sharing-strategy", "mps"), ("nvidia.com/gpu.replicas", "4"))
    idle_shared = replace(plain("shared", 2, sharing="mps", replicas=4), labels=shared_labels)
    wants_whole = replace(whole_pod("w"), terms=((("nvidia.com/gpu.sharing-strategy", "NotIn", ("mps", "time-slicing")),),))
    (back,) = run([idle_shared], [wants_whole]).sharing
    assert (back.node, back.mode) == ("shared", "none")


def test_cluster_figures_count_whole_gpus_held_by_pods() -> None:
    """A whole GPU held by a pod is occupied even while the GPU reports no utilisation
    (the demo's occupied_ratio must never fall below what its pods asked for)."""
    from controller.metrics import cluster_figures

    held = replace(plain("held", 4), whole_taken=1)
    pinned = replace(whole_pod("p", gated=False, on="held"), bound=False)
    ratio, _, gpus = cluster_figures(Snapshot((held,), (pinned,), {}))
    assert gpus == 4 and ratio == pytest.approx(2 / 4)
    assert cluster_figures(Snapshot((plain("idle", 4),), (), {}))[0] == 0.0


def test_a_switched_node_gets_the_replica_count_that_serves_the_waiting_burst() -> None:
    """One 100-milli pod first (it alone would get 8 replicas), then four of 300 milli (3 at
    most): 3 replicas serve all five on the node's 2 GPUs, 8 would serve one."""
    idle = plain("idle", 2)
    burst = [shared_pod("a-first", milli=100)] + [
        replace(shared_pod(f"b{i}", milli=300), created=NOW - timedelta(minutes=29)) for i in range(4)]
    (change,) = run([idle], burst, NodePolicy(names=("p",), max_concurrent=1, idle_seconds=0)).sharing
    assert (change.node, change.replicas) == ("idle", 3)
    alone = run([idle], burst[:1], NodePolicy(names=("p",), max_concurrent=1, idle_seconds=0)).sharing
    assert alone[0].replicas == 8  # a lone pod: the most replicas it fits (least waste)



def test_an_idle_split_the_waiting_burst_asks_for_is_not_split_again_for_another_size() -> None:
    """A node split into 3 for a burst of 300-milli pods, idle until they land: the 100-milli pod
    ahead of them in the queue used to split it into 8 (and the burst back into 3, cycle after
    cycle). It is kept for the burst; the small pod splits a fresh node, or takes a 333-milli
    replica when none may be split (the fresh node's count is the demand's: 3 serves all five)."""
    split = plain("split", 2, sharing="mps", replicas=3)
    burst = [shared_pod("a-first", milli=100)] + [
        replace(shared_pod(f"b{i}", milli=300), created=NOW - timedelta(minutes=29)) for i in range(4)]
    policy = NodePolicy(names=("p",), max_concurrent=2, idle_seconds=0)
    with_fresh = run([split, plain("fresh", 2)], burst, policy)
    assert [c.node for c in with_fresh.sharing] == ["fresh"]
    assert sorted(r.pod for r in with_fresh.releases if r.node == "split") == [f"team/b{i}" for i in range(4)]
    alone = run([split], burst, policy)
    assert alone.sharing == ()
    assert sorted(r.pod for r in alone.releases) == ["team/a-first", *(f"team/b{i}" for i in range(4))]
    # With no 300-milli pod waiting, the idle split is revisited for the pod's own size.
    (change,) = run([split], burst[:1], policy).sharing
    assert (change.node, change.replicas) == ("split", 8)


def test_a_switch_to_the_split_a_node_already_has_is_never_planned() -> None:
    """Demand that wants a node's current split (a 100-milli pod ahead of 300-milli ones, the node
    already split in 3 and no 300-milli pod said to want it) gives the pod a replica, not a
    switch that changes nothing and that it would wait on."""
    split = plain("split", 1, sharing="mps", replicas=3)
    burst = [shared_pod("a-first", milli=100)] + [
        replace(shared_pod(f"b{i}", milli=300), created=NOW - timedelta(minutes=29)) for i in range(2)]
    result = run([split], burst, NodePolicy(names=("p",), max_concurrent=1, idle_seconds=0))
    assert result.sharing == () and "team/a-first" in {r.pod for r in result.releases}

# --- a node whose agent is silent takes no part in planning -----------------------------------------


def test_a_stale_nodes_free_capacity_is_not_used_and_a_live_node_is_reshaped() -> None:
    """With h100-b's agent dead, pods used to wait for capacity there while other GPUs were idle."""
    one_g = inst("1g.10gb", 6, 1)
    silent = replace(node("b", gpu(0, (one_g,))), silent_seconds=600.0, stale=True)
    live = node("a", gpu(0, FULL_7G))
    result = run([live, silent], [mig_pod("p")])
    assert result.releases == ()  # not released to the free 1g on the silent node
    (change,) = result.layouts
    assert change.node == "a"  # the live node's idle GPU is reshaped instead
    # The same node reporting again is used at once.
    again = run([live, replace(silent, stale=False)], [mig_pod("p")])
    assert [(r.pod, r.node) for r in again.releases] == [("team/p", "b")]


def test_reshapes_in_flight_on_a_stale_node_do_not_hold_the_policy_budget() -> None:
    reshaping = replace(node("b", gpu(0, FULL_7G, reshaping=True)), stale=True, silent_seconds=900.0)
    one_at_a_time = NodePolicy(names=("p",), max_concurrent=1, idle_seconds=600)
    result = run([node("a", gpu(0, FULL_7G)), reshaping], [mig_pod("p", "3g.40gb")], policy=one_at_a_time)
    assert [c.node for c in result.layouts] == ["a"]
    held = run([node("a", gpu(0, FULL_7G)), replace(reshaping, stale=False)], [mig_pod("p", "3g.40gb")],
               policy=one_at_a_time)
    assert held.layouts == ()  # a live agent's reshape in flight does hold it


# --- CPU and memory the node's pods already hold ---------------------------------


def with_cpu(n: Node, allocatable: int, used: int) -> Node:
    return replace(n, cpu_milli=allocatable, memory_mib=64 * 1024, cpu_used_milli=used, memory_used_mib=0)


def test_a_shared_pod_is_never_released_to_a_node_its_cpu_does_not_fit() -> None:
    """kube-scheduler would keep such a pod Unschedulable on the node it is pinned to: the
    engine counts the CPU every pod on the node asks, gpupack's or not."""
    crowded = with_cpu(plain("crowded", 2, sharing="mps", replicas=4), allocatable=8000, used=7800)
    roomy = with_cpu(plain("roomy", 2, sharing="mps", replicas=4), allocatable=8000, used=0)
    pod = replace(shared_pod("p", milli=250), cpu_milli=500)
    assert [(r.pod, r.node) for r in run([crowded, roomy], [pod], policy=None).releases] == [("team/p", "roomy")]
    assert run([crowded], [pod], policy=None).releases == ()
    small = replace(pod, cpu_milli=200)
    assert [r.node for r in run([crowded], [small], policy=None).releases] == ["crowded"]


def test_pods_released_in_one_cycle_use_up_the_nodes_cpu() -> None:
    node_ = with_cpu(plain("n", 1, sharing="mps", replicas=4), allocatable=1000, used=0)
    pods = [replace(shared_pod(f"p{i}", milli=250), cpu_milli=400) for i in range(3)]
    result = run([node_], pods, policy=None)
    assert [r.pod for r in result.releases] == ["team/p0", "team/p1"]


def test_whole_and_mig_pods_go_only_where_their_cpu_fits() -> None:
    full = with_cpu(plain("full", 2), allocatable=4000, used=4000)
    free = with_cpu(plain("free", 2), allocatable=4000, used=1000)
    wants = replace(whole_pod("w"), cpu_milli=1000)
    assert [r.node for r in run([full, free], [wants]).releases] == ["free"]
    one_g = inst("1g.10gb", 6, 1)
    mig_full = with_cpu(node("a", gpu(0, (one_g,))), allocatable=4000, used=4000)
    mig_free = with_cpu(node("b", gpu(0, (one_g,))), allocatable=4000, used=0)
    mig = replace(mig_pod("m"), cpu_milli=100)
    assert [r.node for r in run([mig_full, mig_free], [mig]).releases] == ["b"]
    assert run([mig_full], [mig], policy=None).releases == ()


def test_an_idle_node_without_cpu_for_the_pod_is_not_split_for_it() -> None:
    idle_full = with_cpu(plain("a-full", 2), allocatable=4000, used=4000)
    idle_free = with_cpu(plain("b-free", 2), allocatable=4000, used=0)
    pod = replace(shared_pod("p", milli=300), cpu_milli=1000)
    policy = NodePolicy(names=("p",), max_concurrent=2, idle_seconds=0)
    (change,) = run([idle_full, idle_free], [pod], policy).sharing
    assert change.node == "b-free"
    assert run([idle_full], [pod], policy).sharing == ()


def test_a_node_switching_for_a_pod_counts_as_its_capacity_on_the_labels_it_will_have() -> None:
    """A pod whose terms ask for MPS waits for the split in flight; no further idle node is
    split for it on every cycle until the first one reports."""
    labels = (("nvidia.com/gpu.sharing-strategy", "none"), ("nvidia.com/gpu.replicas", "1"))
    switching = replace(plain("a-switching", 2), labels=labels, spec_sharing="mps", spec_replicas=4, generation=2,
                        observed_generation=1)
    idle = replace(plain("b-idle", 2), labels=labels)
    wants_mps = replace(shared_pod("p", milli=250), terms=((("nvidia.com/gpu.sharing-strategy", "In", ("mps",)),),))
    result = run([switching, idle], [wants_mps], NodePolicy(names=("p",), max_concurrent=4, idle_seconds=0))
    assert result.sharing == () and result.releases == ()
    assert "a-switching" in result.waiting[0].reason and "in flight" in result.waiting[0].reason


def test_the_engines_typical_pods_are_the_gpu_pods_that_exist() -> None:
    """The rule the product model replays (``present``): gpupack's shared and whole-GPU pods and the
    pods asking ``nvidia.com/gpu`` themselves, each as the engine sees it, keyed by product."""
    from controller.planning.sharedplan import typical_pods
    from controller.state.snapshot import PlainGpuPod

    pods = [replace(shared_pod("a", milli=200), cpu_milli=1000, products=("Tesla-T4",)),
            replace(whole_pod("w", gpus=2), cpu_milli=3000), mig_pod("m")]
    table = typical_pods(pods, [PlainGpuPod("ml/p", 4, 8000)])
    keys = set(zip(table.cpu_milli, table.gpu_milli, table.gpu_count, table.gpu_spec))
    assert keys == {(1000, 200, 1, "Tesla-T4"), (3000, 1000, 2, ""), (8000, 1000, 4, "")}  # no MIG pod
    assert set(zip(typical_pods([]).gpu_milli, typical_pods([]).gpu_count)) == {(500, 1)}  # none yet



# --- a backlog: a cycle's layout searches are bounded ---------------------------------


def test_a_backlog_searches_at_most_a_cycles_worth_of_layouts_oldest_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each layout search walks every changeable GPU; with thousands waiting, an unbounded cycle
    grew with the backlog. The pods past the bound wait for the next cycle, with no verdict."""
    import controller.planning.planner as planner
    from controller.writes.wait_status import quiet

    monkeypatch.setattr(planner, "MIG_SEARCHES_PER_CYCLE", 2)
    empty = tuple(gpu(i, ()) for i in range(4))  # MIG on, no instance: every pod needs a layout
    wide = NodePolicy(names=("p",), max_concurrent=8, idle_seconds=600)
    pods = [mig_pod(f"p{i}", "7g.80gb", minutes=i) for i in range(4)]
    result = run([node("a", *empty)], pods, wide)
    assert len(result.layouts) == 2 and {c.index for c in result.layouts} == {0, 1}
    deferred = [w.pod for w in result.waiting if w.deferred]
    assert deferred == ["team/p2", "team/p3"]  # the youngest two
    assert not quiet(replace(result, layouts=(), sharing=()), Snapshot((node("a", *empty),), tuple(pods)))


def test_pods_of_a_shape_no_gpu_can_take_cost_one_search_a_cycle(monkeypatch: pytest.MonkeyPatch) -> None:
    import controller.planning.planner as planner

    searches: list[int] = []
    real = planner._mig_candidates

    def counted(*args: Any, **kwargs: Any) -> Any:
        searches.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(planner, "_mig_candidates", counted)
    busy = inst("7g.80gb", 0, 8)
    full = node("a", gpu(0, (busy,), in_use=(busy,)))
    result = run([full], [mig_pod(f"p{i}", "1g.10gb", minutes=i) for i in range(5)])
    assert result.layouts == () and len(result.waiting) == 5 and not any(w.deferred for w in result.waiting)
    assert len({w.reason for w in result.waiting}) == 1 and "no free 1g.10gb" in result.waiting[0].reason
    assert len(searches) <= 3  # one search (extend, then everything) for the first pod; none for the rest
