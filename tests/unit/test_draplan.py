"""The DRA pool's engine (controller.planning.draplan, controller.planning.dramig): tables, the simulator's choice, and
random bursts that must never over-commit a GPU or overlap MIG placements."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.planning.draplan import MAX_REQUEUES, REQUEUE_AFTER_S, DraPlan, plan_dra
from controller.state.dra_usage import read_usage
from controller.state.snapshot import Gpu, Node, Pod, Snapshot
from mig.catalog import get_model
from mig.geometry import validate_layout
from mig.model import GpuModel, PlacedInstance, Placement
from sharing.dra import names
from sharing.dra.pinned import ANNOTATION, Pinned, PinnedDevice
from sharing.dra.share_policy import GiB, SharePolicy
from sharing.api.keys import BACKEND_LABEL, DRA_REQUEUES_ANNOTATION
from sharing.api.modes import AllocationMode, NodeSharingMode
from sharing.rules.node_policy import NodePolicy
from sharing.packing.kube_scoring import MostAllocatedWeights
from sharing.packing.cluster import ClusterState
from sharing.packing.registry import make_policy
from sharing.packing.specs import NodeSpec, PodSpec
from sharing.packing.typical import TypicalPods
from sharing.simulator.dra import DraReplay, as_claimed

H100 = get_model("H100-80GB")
NOW = datetime(2026, 11, 30, 2, 0, tzinfo=timezone.utc)
DRA = ((BACKEND_LABEL, "dra"),)
MiB = 2**20
OPEN = NodePolicy(names=("p",), max_concurrent=2)


def inst(profile: str, start: int) -> PlacedInstance:
    size = next(p.size for p in H100.profile(profile).placements if p.start == start)
    return PlacedInstance(profile, Placement(start, size))


def gpu(index: int, *, mig: bool = False, instances: Sequence[PlacedInstance] = (), healthy: bool = True,
        unhealthy: Sequence[PlacedInstance] = ()) -> Gpu:
    return Gpu(index, H100.memory_mib, mig, tuple(instances), healthy=healthy, unhealthy_instances=tuple(unhealthy))


def node(name: str, gpus: int | Sequence[Gpu] = 2, sharing: NodeSharingMode = "mps",
         labels: tuple[tuple[str, str], ...] = DRA, model: GpuModel = H100) -> Node:
    listed = tuple(gpu(i) for i in range(gpus)) if isinstance(gpus, int) else tuple(gpus)
    return Node(name, model.product, model, labels, sharing, 1, listed, spec_sharing=sharing)


def pod(name: str, mode: AllocationMode = "mps", milli: Sequence[int] = (300,),
        memory: Sequence[int | None] | None = None, profiles: Sequence[str] = (), minutes: int = 0,
        products: tuple[str, ...] = (), fallback: Sequence[str] = ()) -> Pod:
    return Pod("team", name, mode, NOW - timedelta(minutes=60 - minutes), profiles=tuple(profiles),
               milli=tuple(milli), memory_bytes=tuple(memory or [None] * len(milli)), gated=True,
               uid=f"uid-{name}", backend="dra", claim=f"claim-{name}", products=products,
               requests=tuple(f"gpu-{k}" for k in range(len(milli))),
               terms=(((BACKEND_LABEL, "In", ("dra",)),),), mig_fallback=tuple(fallback))


def allocated(name: str, node_name: str, device: str, milli: int = 0, memory: int = 0) -> dict[str, Any]:
    result: dict[str, Any] = {"request": "gpu-0", "driver": names.DRIVER, "pool": node_name, "device": device}
    if milli:
        result["consumedCapacity"] = {names.MILLI: str(milli), names.MEMORY: str(memory)}
    return {"metadata": {"namespace": "other", "name": name},
            "status": {"allocation": {"devices": {"results": [result]}}}}


def promised(name: str, pinned: Pinned, owner: str = "") -> dict[str, Any]:
    meta: dict[str, Any] = {"namespace": "team", "name": name, "annotations": {ANNOTATION: pinned.to_annotation()}}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": "x", "uid": owner}]
    return {"metadata": meta}


def pinned_share(gpu_index: int, milli: int, memory: int = GiB) -> PinnedDevice:
    return PinnedDevice("gpu-0", "shared", gpu_index, milli, memory)


def pinned_mig(gpu_index: int, profile: str, start: int) -> PinnedDevice:
    return PinnedDevice("gpu-0", "mig", gpu_index, profile=profile, start=start)


def run(nodes: Sequence[Node], pods: Sequence[Pod], claims: Sequence[dict[str, Any]] = (),
        policies: dict[str, NodePolicy] | None = None, policy_name: str = "gpupack") -> DraPlan:
    snapshot = Snapshot(tuple(nodes), tuple(pods), policies or {})
    return plan_dra(snapshot, read_usage(claims, nodes), NOW, policy_name=policy_name)


def devices(result: DraPlan) -> dict[str, list[str]]:
    return {p.pod: [f"{p.node}/{d.device}" for d in p.pinned.devices] for p in result.placements}


# ------------------------------------------------------------------ shares
def test_a_share_is_rounded_by_the_share_policy_and_pinned_to_one_gpu() -> None:
    result = run([node("a")], [pod("p", milli=(120,))])
    (placement,) = result.placements
    (device,) = placement.pinned.devices
    assert (placement.node, device.kind, device.milli, device.memory_bytes) == ("a", "shared", 150, GiB)
    assert device.request == "gpu-0" and not placement.adopted


@pytest.mark.parametrize("kind", ["allocated", "promised"])
def test_milli_held_by_claims_is_never_given_again(kind: str) -> None:
    held = (allocated("c", "a", "gpu-0-shared", 900, GiB) if kind == "allocated"
            else promised("c", Pinned("a", (pinned_share(0, 900),))))
    result = run([node("a", 1), node("b", 1, labels=())], [pod("p", milli=(200,))], [held])
    assert result.placements == () and "200 free milli" in result.waiting[0].reason
    # Room for 100 is left: a 100-milli pod takes exactly that.
    assert devices(run([node("a", 1)], [pod("q", milli=(100,))], [held])) == {"team/q": ["a/gpu-0-shared"]}


def test_memory_held_counts_as_well_as_milli() -> None:
    held = allocated("c", "a", "gpu-0-shared", 100, 60 * GiB)
    result = run([node("a", 2)], [pod("p", milli=(100,), memory=(30 * GiB,))], [held])
    assert devices(result) == {"team/p": ["a/gpu-1-shared"]}


def test_a_share_goes_only_to_a_dra_node_sharing_by_its_mode() -> None:
    nodes = [node("plugin", 2, labels=()), node("ts", 2, sharing="time-slicing"), node("whole", 2, sharing="none")]
    result = run(nodes, [pod("p", "mps")])
    assert result.placements == () and "shares by mps" in result.waiting[0].reason
    assert [p.node for p in run(nodes, [pod("q", "time-slicing")]).placements] == ["ts"]


def test_a_burst_in_one_cycle_never_over_commits_a_gpu() -> None:
    pods = [pod(f"p{i}", milli=(400,), minutes=i) for i in range(6)]
    result = run([node("a", 2)], pods)
    per_gpu: dict[str, int] = defaultdict(int)
    for p in result.placements:
        for d in p.pinned.devices:
            per_gpu[d.device] += d.milli
    assert len(result.placements) == 4 and max(per_gpu.values()) <= 1000
    assert [w.pod for w in result.waiting] == ["team/p4", "team/p5"]  # oldest first get the room


def test_the_containers_of_a_pod_share_one_node() -> None:
    result = run([node("a", 2), node("b", 2)], [pod("p", milli=(700, 700))])
    (placement,) = result.placements
    assert sorted(d.device for d in placement.pinned.devices) == ["gpu-0-shared", "gpu-1-shared"]


def test_the_live_choice_is_the_simulators() -> None:
    """Pod by pod, the live engine picks the node and GPU ``sharing.simulator.dra`` replays."""
    nodes = [node(n, 4) for n in ("a", "b", "c")]
    rng = np.random.default_rng(7)
    pods = [pod(f"p{i:02d}", milli=(int(rng.integers(1, 1000)),), minutes=i) for i in range(30)]
    live = run(nodes, pods)
    key = f"mps/{H100.product}"
    sims = [PodSpec(p.key, 0, 0, 1, p.milli[0], (key,), key) for p in pods]
    cluster = ClusterState([NodeSpec(n.name, 10**9, 10**9, 4, key) for n in nodes])
    policy = make_policy("gpupack", rng=np.random.default_rng(0),
                         typical=TypicalPods.from_pods([as_claimed(s, 50) for s in sims]))
    replay = DraReplay(cluster, policy, MostAllocatedWeights(1, 1, 1, 1), 50, cpu_pods="engine")
    chosen = {p.pod: (p.node, p.pinned.devices[0].gpu) for p in live.placements}
    for spec in sims:
        before = cluster.gpu_free.copy()
        if replay.place(spec) is None:
            assert spec.name not in chosen
            continue
        (i, j), = np.argwhere(cluster.gpu_free != before)
        assert chosen[spec.name] == (nodes[i].name, j), spec.name


# ------------------------------------------------------------------ whole GPUs
def test_a_whole_gpu_pod_takes_a_gpu_of_an_unshared_node_no_claim_holds() -> None:
    nodes = [node("whole", 2, sharing="none"), node("mps", 2)]
    result = run(nodes, [pod("w", "whole", milli=(1000,))], [allocated("c", "whole", "gpu-0")])
    assert devices(result) == {"team/w": ["whole/gpu-1"]}
    full = run(nodes, [pod("w", "whole", milli=(1000, 1000))], [allocated("c", "whole", "gpu-0")])
    assert full.placements == () and "fully free" in full.waiting[0].reason


# ------------------------------------------------------------------ MIG
def mig_node(name: str, *gpus: Gpu) -> Node:
    return node(name, list(gpus), sharing="none")


def test_a_spare_instance_is_taken_before_a_new_placement() -> None:
    spare = inst("1g.10gb", 6)
    nodes = [mig_node("empty", gpu(0, mig=True)), mig_node("spare", gpu(0, mig=True, instances=[spare]))]
    result = run(nodes, [pod("m", "mig", profiles=("1g.10gb",))], policies={"empty": OPEN, "spare": OPEN})
    assert devices(result) == {"team/m": ["spare/gpu-0-mig-1g-10gb-6"]}


def test_new_placements_need_a_policy_that_allows_the_profile() -> None:
    nodes = [mig_node("a", gpu(0, mig=True))]
    m = pod("m", "mig", profiles=("3g.40gb",))
    assert run(nodes, [m]).placements == ()
    assert run(nodes, [m], policies={"a": NodePolicy(names=("p",), allowed_profiles=frozenset({"1g.10gb"}))}).placements == ()
    assert run(nodes, [m], policies={"a": NodePolicy(names=("p",), max_concurrent=0)}).placements == ()
    assert devices(run(nodes, [m], policies={"a": OPEN})) == {"team/m": ["a/gpu-0-mig-3g-40gb-4"]}


def test_a_mig_gpu_a_claim_holds_whole_takes_no_placement() -> None:
    # DRA_WHOLE_GPU: a user's claim was allocated GPU 0 whole (the plugin gives it the full-size instance).
    nodes = [mig_node("a", gpu(0, mig=True), gpu(1, mig=True))]
    m = pod("m", "mig", profiles=("1g.10gb",))
    result = run(nodes, [m], [allocated("c", "a", "gpu-0")], policies={"a": OPEN})
    assert [d.gpu for p in result.placements for d in p.pinned.devices] == [1]
    both = run(nodes, [m], [allocated("c", "a", "gpu-0"), allocated("d", "a", "gpu-1")], policies={"a": OPEN})
    assert both.placements == () and len(both.waiting) == 1


def test_held_promised_and_faulted_placements_are_never_overlapped() -> None:
    nodes = [mig_node("a", gpu(0, mig=True, unhealthy=[inst("1g.10gb", 6)], instances=[inst("1g.10gb", 6)]),
                      gpu(1, healthy=False, mig=True))]
    claims = [allocated("c", "a", "gpu-0-mig-3g-40gb-0"),
              promised("d", Pinned("a", (pinned_mig(0, "1g.10gb", 5),)))]
    result = run(nodes, [pod(f"m{i}", "mig", profiles=("1g.10gb",), minutes=i) for i in range(3)], claims,
                 policies={"a": OPEN})
    got = [d for p in result.placements for d in p.pinned.devices]
    assert [(d.gpu, d.start) for d in got] == [(0, 4)]  # 0-3 held, 5 promised, 6 faulted; GPU 1 faulted
    assert len(result.waiting) == 2


# ------------------------------------------------------------------ a share's MIG fallback
MPS_AND_MIG = [node("mps", 1), mig_node("mig", gpu(0, mig=True))]
FULL = allocated("c", "mps", "gpu-0-shared", 900, GiB)


def test_a_share_with_a_fallback_goes_to_mig_when_no_shared_gpu_has_room() -> None:
    result = run(MPS_AND_MIG, [pod("p", milli=(300,), fallback=("3g.40gb",))], [FULL], policies={"mig": OPEN})
    assert devices(result) == {"team/p": ["mig/gpu-0-mig-3g-40gb-4"]}
    (placement,) = result.placements
    assert placement.pinned.devices[0].kind == "mig" and not placement.adopted
    assert "MIG fallback: 1/1 nodes: no GPU with 300 free milli" in placement.reason  # why not a share


def test_a_share_with_a_fallback_takes_a_shared_gpu_that_has_room() -> None:
    result = run(MPS_AND_MIG, [pod("p", milli=(100,), fallback=("3g.40gb",))], [FULL], policies={"mig": OPEN})
    assert devices(result) == {"team/p": ["mps/gpu-0-shared"]}
    assert result.placements[0].pinned.devices[0].kind == "shared"


def test_a_share_without_a_fallback_waits() -> None:
    result = run(MPS_AND_MIG, [pod("p", milli=(300,))], [FULL], policies={"mig": OPEN})
    assert result.placements == () and "MIG" not in result.waiting[0].reason


def test_a_fallback_is_a_mig_pod_at_its_place_in_the_oldest_first_order() -> None:
    # One GPU's worth of MIG room (7g.80gb): the older of the two pods gets it, whatever its mode.
    pods = [pod("m", "mig", profiles=("7g.80gb",), minutes=1), pod("f", milli=(300,), fallback=("7g.80gb",), minutes=2)]
    result = run(MPS_AND_MIG, pods, [FULL], policies={"mig": OPEN})
    assert devices(result) == {"team/m": ["mig/gpu-0-mig-7g-80gb-0"]}
    (wait,) = result.waiting
    assert wait.pod == "team/f" and "MIG fallback: no DRA GPU offers 7g.80gb" in wait.reason
    older_share = [pod("f", milli=(300,), fallback=("7g.80gb",), minutes=1),
                   pod("m", "mig", profiles=("7g.80gb",), minutes=2)]
    result = run(MPS_AND_MIG, older_share, [FULL], policies={"mig": OPEN})
    assert devices(result) == {"team/f": ["mig/gpu-0-mig-7g-80gb-0"]}


def test_the_containers_of_a_fallen_back_pod_share_one_node() -> None:
    nodes = [node("mps", 1), mig_node("one", gpu(0, mig=True)), mig_node("two", gpu(0, mig=True), gpu(1, mig=True))]
    result = run(nodes, [pod("p", milli=(300, 300), fallback=("7g.80gb", "7g.80gb"))], [FULL],
                 policies={"one": OPEN, "two": OPEN})
    assert devices(result) == {"team/p": ["two/gpu-0-mig-7g-80gb-0", "two/gpu-1-mig-7g-80gb-0"]}


# ------------------------------------------------------------------ existing claims
def test_an_existing_claim_is_adopted_only_when_it_is_the_pods() -> None:
    pinned = Pinned("a", (pinned_share(1, 300),))
    own = run([node("a")], [pod("p")], [promised("claim-p", pinned, owner="uid-p")])
    assert [(p.pod, p.node, p.adopted) for p in own.placements] == [("team/p", "a", True)]
    foreign = run([node("a")], [pod("p")], [promised("claim-p", pinned, owner="uid-other")])
    assert foreign.placements == () and "not this pod's" in foreign.refused[0].reason
    unreadable = promised("claim-p", pinned, owner="uid-p")
    unreadable["metadata"]["annotations"][ANNOTATION] = "{"
    broken = run([node("a")], [pod("p")], [unreadable])
    assert broken.placements == () and broken.refused == () and "not JSON" in broken.waiting[0].reason


# ------------------------------------------------------------------ properties
BURST = st.lists(st.tuples(st.integers(1, 1000), st.sampled_from([None, 1, 10, 40, 79]), st.integers(1, 2)),
                 min_size=1, max_size=14)


@settings(max_examples=40, deadline=None)
@given(st.lists(BURST, min_size=1, max_size=3), st.sampled_from(["gpupack", "FGD", "BestFit"]))
def test_random_bursts_never_over_commit_milli_or_memory(cycles: list[list[tuple[int, int | None, int]]],
                                                          policy_name: str) -> None:
    nodes = [node("a", 2), node("b", 3)]
    claims: list[dict[str, Any]] = []
    for c, burst in enumerate(cycles):
        pods = [pod(f"c{c}p{i}", milli=(m,) * k, memory=((gib * GiB if gib else None),) * k, minutes=i)
                for i, (m, gib, k) in enumerate(burst)]
        result = run(nodes, pods, claims, policy_name=policy_name)
        claims += [promised(f"claim-{p.pod}", p.pinned) for p in result.placements]
    milli: dict[tuple[str, int], int] = defaultdict(int)
    memory: dict[tuple[str, int], int] = defaultdict(int)
    for hold in read_usage(claims, nodes).holds:
        milli[hold.node, hold.device.gpu] += hold.device.milli
        memory[hold.node, hold.device.gpu] += hold.device.memory_bytes
    assert all(v <= 1000 for v in milli.values()), milli
    assert all(v <= SharePolicy().max_memory(H100.memory_mib * MiB) for v in memory.values()), memory


PROFILES = [p.name for p in H100.profiles]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.tuples(st.lists(st.sampled_from(PROFILES), min_size=1, max_size=2), st.booleans()),
                         min_size=1, max_size=8),
                min_size=1, max_size=3),
       st.lists(st.sampled_from(range(7)), max_size=2))
def test_random_mig_bursts_never_overlap_placements(cycles: list[list[tuple[list[str], bool]]],
                                                    spare_starts: list[int]) -> None:
    """MIG pods and shares falling back to MIG (the pool has no shared GPU) alike."""
    spares = sorted({inst("1g.10gb", s) for s in spare_starts})
    nodes = [mig_node("a", gpu(0, mig=True, instances=spares), gpu(1, mig=True)), mig_node("b", gpu(0, mig=True))]
    claims: list[dict[str, Any]] = []
    for c, burst in enumerate(cycles):
        pods = [pod(f"c{c}p{i}", "mps", milli=(100,) * len(ps), fallback=ps, minutes=i) if share else
                pod(f"c{c}p{i}", "mig", milli=(100,) * len(ps), profiles=ps, minutes=i)
                for i, (ps, share) in enumerate(burst)]
        result = run(nodes, pods, claims, policies={"a": OPEN, "b": OPEN})
        claims += [promised(f"claim-{p.pod}", p.pinned) for p in result.placements]
    layouts: dict[tuple[str, int], list[PlacedInstance]] = defaultdict(list)
    for hold in read_usage(claims, nodes).holds:
        d = hold.device
        layouts[hold.node, d.gpu].append(inst(str(d.profile), int(d.start or 0)))
    for (node_name, index), held in layouts.items():
        existing = spares if (node_name, index) == ("a", 0) else []
        unheld_spares = [s for s in existing if s not in held]
        assert len(set(held)) == len(held), held
        assert validate_layout(H100, held + unheld_spares) is None, (node_name, index, held)


def test_cpu_and_memory_the_nodes_pods_request_are_not_given_again() -> None:
    """A node whose pods (gpupack's or not) request all but 2 cores cannot take a pod of 4 cores:
    pinned there, kube-scheduler would leave it unschedulable."""
    from dataclasses import replace

    busy = replace(node("busy", 2), cpu_milli=32_000, memory_mib=256_000, cpu_used_milli=30_000,
                   memory_used_mib=1_000)
    free = replace(node("free", 2), cpu_milli=32_000, memory_mib=256_000)
    asking = replace(pod("p", milli=(300,)), cpu_milli=4_000, memory_mib=1_000)
    assert devices(run([busy], [asking])) == {}
    assert "cpu" in run([busy], [asking]).waiting[0].reason.lower()
    assert [p.node for p in run([busy, free], [asking]).placements] == ["free"]
    # Memory alike, and a pod that fits what is left still goes to the busy node when it is the only one.
    full = replace(busy, cpu_used_milli=0, memory_used_mib=255_500)
    assert devices(run([full], [asking])) == {}
    small = replace(asking, cpu_milli=1_000)
    assert [p.node for p in run([busy], [small]).placements] == ["busy"]


def cpu_pod(name: str, cpu: int, minutes: int = 0) -> Pod:
    return Pod("team", name, "cpu", NOW - timedelta(minutes=60 - minutes), gated=True, uid=f"uid-{name}",
               backend="dra", cpu_milli=cpu, memory_mib=1_000, terms=(((BACKEND_LABEL, "In", ("dra",)),),))


def test_a_pod_asking_no_gpu_goes_where_the_engine_puts_it_and_needs_no_claim() -> None:
    """The engine's CPU-only choice is the simulator's (``DraReplay`` with ``cpu_pods="engine"``),
    and a pod whose CPU fits no node waits with the reason."""
    from dataclasses import replace

    nodes = [replace(node(n, 4), cpu_milli=64_000, memory_mib=512_000) for n in ("a", "b", "c")]
    rng = np.random.default_rng(11)
    pods: list[Pod] = []
    for i in range(24):
        if i % 3 == 2:
            pods.append(cpu_pod(f"p{i:02d}", int(rng.integers(1, 30)) * 1000, minutes=i))
        else:
            pods.append(replace(pod(f"p{i:02d}", milli=(int(rng.integers(1, 1000)),), minutes=i),
                                cpu_milli=int(rng.integers(1, 12)) * 1000, memory_mib=1_000))
    live = run(nodes, pods)
    assert all(p.pinned.devices == () for p in live.placements if p.pod.endswith(("02", "05")))
    key = f"mps/{H100.product}"
    sims = [PodSpec(p.key, p.cpu_milli, p.memory_mib, 1 if p.milli else 0, p.milli[0] if p.milli else 0,
                    (key,) if p.milli else (), key if p.milli else "") for p in pods]
    cluster = ClusterState([NodeSpec(n.name, 64_000, 512_000, 4, key) for n in nodes])
    policy = make_policy("gpupack", rng=np.random.default_rng(0),
                         typical=TypicalPods.from_pods([as_claimed(s, 50) for s in sims]))
    replay = DraReplay(cluster, policy, MostAllocatedWeights(1, 1, 1, 1), 50, cpu_pods="engine")
    chosen = {p.pod: p.node for p in live.placements}
    for spec in sims:
        before = cluster.cpu_free.copy()
        if replay.place(spec) is None:
            assert spec.name not in chosen
            continue
        (i,) = np.flatnonzero(cluster.cpu_free != before)
        assert chosen[spec.name] == nodes[i].name, spec.name
    assert any(not s.gpu_count for s in sims if s.name in chosen)
    too_big = run(nodes, [cpu_pod("huge", 100_000)])
    assert too_big.placements == () and too_big.waiting[0].pod == "team/huge"


def test_a_mig_pod_needs_the_nodes_cpu_and_takes_it_from_the_pods_after_it() -> None:
    from dataclasses import replace

    mixed = replace(node("mixed", [gpu(0, mig=True), gpu(1)]), cpu_milli=16_000, memory_mib=64_000)
    busy = replace(mig_node("busy", gpu(0, mig=True)), cpu_milli=16_000, memory_mib=64_000, cpu_used_milli=15_000)
    m = replace(pod("m", "mig", profiles=("1g.10gb",)), cpu_milli=10_000, memory_mib=1_000)
    s = replace(pod("s", milli=(300,), minutes=1), cpu_milli=10_000, memory_mib=1_000)
    policies = {"mixed": OPEN, "busy": OPEN}
    assert run([busy], [m], policies=policies).placements == ()  # 1 core left of 16
    result = run([busy, mixed], [m, s], policies=policies)
    assert [(p.pod, p.node) for p in result.placements] == [("team/m", "mixed")]
    # The MIG pod took 10 of the mixed node's 16 cores: the share's 10 no longer fit there.
    assert [w.pod for w in result.waiting] == ["team/s"]


def test_a_mig_pod_goes_to_the_node_whose_mig_slices_then_cpu_are_fullest() -> None:
    """``sharing.dra.mig_choice.place_pod``'s node rule, fed by the cycle's CPU account (``_Room``)."""
    from dataclasses import replace

    def sized(n: Node, used: int) -> Node:
        return replace(n, cpu_milli=16_000, memory_mib=64_000, cpu_used_milli=used)

    policies = {"a": OPEN, "b": OPEN}
    m = replace(pod("m", "mig", profiles=("1g.10gb",)), cpu_milli=1_000, memory_mib=1_000)
    # Untouched GPUs alike: b's CPU is fuller (a would win the name tie).
    nodes = [sized(mig_node("a", gpu(0, mig=True)), 2_000), sized(mig_node("b", gpu(0, mig=True)), 12_000)]
    assert [(p.pod, p.node) for p in run(nodes, [m], policies=policies).placements] == [("team/m", "b")]
    # A claim holds a 3g instance on a's GPU: its slices outweigh b's CPU.
    held = [allocated("c", "a", "gpu-0-mig-3g-40gb-4")]
    assert [(p.pod, p.node) for p in run(nodes, [m], held, policies=policies).placements] == [("team/m", "a")]
    # Within one cycle, the CPU a placement takes counts for the next pod: the second 1g goes where
    # the first did (b, fuller now), not back to a.
    two = [m, replace(pod("n", "mig", profiles=("1g.10gb",), minutes=1), cpu_milli=1_000, memory_mib=1_000)]
    assert [p.node for p in run(nodes, two, policies=policies).placements] == ["b", "b"]


# ------------------------------------------------------------------ promises broken by claims the engine did not plan
def released(p: Pod, node_name: str) -> Pod:
    """``p`` released to ``node_name``: ungated, pinned there, not bound yet."""
    from dataclasses import replace

    return replace(p, gated=False, node=node_name)


def own_promise(p: Pod, pinned: Pinned) -> dict[str, Any]:
    claim = promised(p.claim or "", pinned, owner=p.uid)
    claim["metadata"].update(uid=f"claim-uid-{p.name}", resourceVersion="7")
    return claim


def test_a_promise_a_users_claim_took_is_re_pinned_to_another_gpu_of_its_node() -> None:
    from controller.state.dra_usage import broken_promises

    p = released(pod("p", milli=(400,)), "a")
    mine = own_promise(p, Pinned("a", (pinned_share(0, 400),)))
    users = allocated("users", "a", "gpu-0-shared", 700, GiB)
    nodes = [node("a", 2), node("b", 2)]
    usage = read_usage([mine, users], nodes)
    assert "allocated to other/users" in broken_promises(usage, nodes)["team/claim-p"]
    result = run(nodes, [p], [mine, users])
    (placement,) = result.placements
    assert placement.node == "a" and [d.gpu for d in placement.pinned.devices] == [1]  # its node, the free GPU
    assert placement.replaces is not None and placement.replaces.resource_version == "7"
    assert "re-pinned" in placement.reason
    # Room left beside the user's claim: the promise stands, nothing is planned.
    small = allocated("users", "a", "gpu-0-shared", 600, GiB)
    assert broken_promises(read_usage([mine, small], nodes), nodes) == {}
    assert run(nodes, [p], [mine, small]).placements == ()


def test_a_broken_promise_with_no_room_left_on_its_node_waits_with_the_reason() -> None:
    p = released(pod("p", milli=(400,)), "a")
    mine = own_promise(p, Pinned("a", (pinned_share(0, 400),)))
    claims = [mine, allocated("u0", "a", "gpu-0-shared", 700, GiB), allocated("u1", "a", "gpu-1-shared", 700, GiB)]
    result = run([node("a", 2), node("b", 2)], [p], claims)
    assert result.placements == ()
    (wait,) = result.waiting
    assert "no other device on a has room" in wait.reason and "other/u0" in wait.reason


def test_whole_gpu_and_mig_promises_break_on_any_overlap_and_only_then() -> None:
    from controller.state.dra_usage import broken_promises

    nodes = [node("w", 1, sharing="none"), mig_node("m", gpu(0, mig=True))]
    whole = promised("cw", Pinned("w", (PinnedDevice("gpu-0", "gpu", 0),)))
    mig = promised("cm", Pinned("m", (pinned_mig(0, "3g.40gb", 4),)))
    overlapping = allocated("u1", "m", "gpu-0-mig-1g-10gb-5")
    beside = allocated("u2", "m", "gpu-0-mig-3g-40gb-0")
    on_whole = allocated("u3", "w", "gpu-0")
    broken = broken_promises(read_usage([whole, mig, overlapping, beside, on_whole], nodes), nodes)
    assert set(broken) == {"team/cw", "team/cm"}
    assert broken_promises(read_usage([whole, mig, beside], nodes), nodes) == {}


# ------------------------------------------------------------------ stalled promises (kube-scheduler set the pod aside)
def stalled_claim(p: Pod, pinned: Pinned, seconds_ago: float, requeues: int = 0) -> dict[str, Any]:
    claim = own_promise(p, pinned)
    created = NOW - timedelta(seconds=seconds_ago)
    claim["metadata"]["creationTimestamp"] = created.strftime("%Y-%m-%dT%H:%M:%SZ")
    if requeues:
        claim["metadata"]["annotations"][DRA_REQUEUES_ANNOTATION] = str(requeues)
    return claim


def test_a_pod_set_aside_while_its_pinned_share_has_room_gets_its_claim_re_created_with_the_same_pin() -> None:
    from dataclasses import replace

    p = replace(released(pod("p", milli=(100,)), "a"), unschedulable=True)
    pin = Pinned("a", (pinned_share(0, 100),))
    full_but_for_it = allocated("u", "a", "gpu-0-shared", 900, GiB)  # 900 + 100: exactly the GPU
    nodes = [node("a", 1)]
    result = run(nodes, [p], [stalled_claim(p, pin, 30), full_but_for_it])
    (placement,) = result.placements
    assert placement.pinned == pin and placement.node == "a" and placement.requeues == 1
    assert placement.replaces is not None and placement.replaces.resource_version == "7"
    assert "claim re-created, same pin" in placement.reason
    # The count read back from the claim is carried on; past MAX_REQUEUES the pod waits, saying why.
    assert run(nodes, [p], [stalled_claim(p, pin, 30, requeues=2), full_but_for_it]).placements[0].requeues == 3
    done = run(nodes, [p], [stalled_claim(p, pin, 30, requeues=MAX_REQUEUES), full_but_for_it])
    assert done.placements == () and "re-created 3 times" in done.waiting[0].reason


def test_a_young_claim_a_pod_not_set_aside_and_a_broken_promise_are_not_requeued() -> None:
    from dataclasses import replace

    p = replace(released(pod("p", milli=(100,)), "a"), unschedulable=True)
    pin = Pinned("a", (pinned_share(0, 100),))
    nodes = [node("a", 1)]
    assert run(nodes, [p], [stalled_claim(p, pin, REQUEUE_AFTER_S / 2)]).placements == ()
    assert run(nodes, [replace(p, unschedulable=False)], [stalled_claim(p, pin, 30)]).placements == ()
    # Another claim took the room: that is a broken promise, re-pinned (here: nowhere left), not re-created.
    took_it = allocated("u", "a", "gpu-0-shared", 950, GiB)
    broken = run(nodes, [p], [stalled_claim(p, pin, 30), took_it])
    assert broken.placements == () and "no other device on a has room" in broken.waiting[0].reason



def test_a_pod_kueue_holds_is_no_demand_on_the_dra_pool() -> None:
    held = replace(pod("flood", milli=(900,), minutes=-30), queue_held=True)  # older: first in line otherwise
    result = run([node("a", 1)], [held, pod("p", milli=(900,))])
    assert devices(result) == {"team/p": ["a/gpu-0-shared"]}
    (wait,) = result.waiting
    assert wait.pod == "team/flood" and wait.held and "held by Kueue" in wait.reason
    admitted = run([node("a", 1)], [replace(held, queue_held=False), pod("p", milli=(900,))])
    assert set(devices(admitted)) == {"team/flood"}
