"""MIG pods on the DRA pool preempt too (issue 36, item 1; controller.planning.dra_mig_preemption through
controller.planning.draplan): the victims' claims lifted, the engine's own MIG choice as the trial."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from controller.planning.draplan import DraPlan, plan_dra
from controller.planning.mig_preemption import REASON_MIG_RESHAPE
from controller.planning.preemption import REASON_MIG
from controller.state.dra_usage import read_usage
from controller.state.snapshot import Gpu, Node, Pod, Snapshot
from mig.catalog import get_model
from mig.model import PlacedInstance, Placement
from sharing.api.keys import BACKEND_LABEL
from sharing.api.priority import NEVER, PREEMPT_LOWER_PRIORITY, PodPriority
from sharing.dra import names
from sharing.dra.share_policy import GiB
from sharing.rules.node_policy import NodePolicy

H100 = get_model("H100-80GB")
NOW = datetime(2026, 11, 30, 2, 0, tzinfo=timezone.utc)
OPEN = NodePolicy(names=("p",), max_concurrent=2)
DRA = ((BACKEND_LABEL, "dra"),)


def inst(profile: str, start: int) -> PlacedInstance:
    size = next(p.size for p in H100.profile(profile).placements if p.start == start)
    return PlacedInstance(profile, Placement(start, size))


def mig_node(name: str, *instances: PlacedInstance, gpus: int = 1) -> Node:
    """A DRA node of MIG GPUs; GPU 0 reports ``instances`` (the agent's view), the others none."""
    listed = tuple(Gpu(i, H100.memory_mib, True, tuple(instances) if i == 0 else ()) for i in range(gpus))
    return Node(name, H100.product, H100, DRA, "none", 1, listed, spec_sharing="none")


def mps_node(name: str) -> Node:
    return Node(name, H100.product, H100, DRA, "mps", 1, (Gpu(0, H100.memory_mib, False),), spec_sharing="mps")


def pod(name: str, priority: int, profile: str = "3g.40gb", *, on: str | None = None, milli: int = 300,
        policy: str = PREEMPT_LOWER_PRIORITY, victims: tuple[str, ...] = (), queue_held: bool = False) -> Pod:
    """A DRA MIG pod: gated (waiting) or, ``on`` a node, running with its claim."""
    return Pod("team", name, "mig", NOW - timedelta(minutes=10), profiles=(profile,), milli=(milli,),
               memory_bytes=(None,), gated=on is None, node=on, bound=on is not None, uid=f"uid-{name}",
               backend="dra", claim=f"claim-{name}", requests=("gpu-0",), terms=(((BACKEND_LABEL, "In", ("dra",)),),),
               priority=PodPriority(priority, policy), victims=victims, queue_held=queue_held)


def claim(name: str, node_name: str, device: str, *, namespace: str = "team",
          capacity: dict[str, str] | None = None) -> dict[str, Any]:
    """A claim kube-scheduler allocated ``device`` of ``node_name``."""
    result: dict[str, Any] = {"request": "gpu-0", "driver": names.DRIVER, "pool": node_name, "device": device}
    if capacity:
        result["consumedCapacity"] = capacity
    return {"metadata": {"namespace": namespace, "name": f"claim-{name}"},
            "status": {"allocation": {"devices": {"results": [result]}}}}


def mig_claim(name: str, node_name: str, instance: PlacedInstance, gpu: int = 0) -> dict[str, Any]:
    return claim(name, node_name, names.mig_device_name(gpu, instance.profile, instance.placement.start))


def run(nodes: Sequence[Node], pods: Sequence[Pod], claims: Sequence[dict[str, Any]],
        policies: dict[str, NodePolicy] | None = None, present: frozenset[str] | None = None,
        protected: frozenset[str] = frozenset()) -> DraPlan:
    uids = frozenset(p.uid for p in pods) if present is None else present
    snapshot = Snapshot(tuple(nodes), tuple(pods), policies or {}, present=uids)
    return plan_dra(snapshot, read_usage(claims, nodes), NOW, protected=protected)


ONES = [inst("1g.10gb", s) for s in range(7)]
"""A GPU full of 1g instances, one per low pod: a 3g needs 3 of them gone (start 4) or 4 (start 0)."""


def ones(priorities: Sequence[int], node_name: str = "a") -> tuple[list[Pod], list[dict[str, Any]]]:
    """Pods ``l0``…``l6`` on the 1g instances at starts 0…6, of ``priorities``, with their claims."""
    pods = [pod(f"l{s}", p, "1g.10gb", on=node_name, milli=100) for s, p in enumerate(priorities)]
    return pods, [mig_claim(f"l{s}", node_name, ONES[s]) for s in range(len(priorities))]


def test_a_3g_pod_preempts_the_fewest_1g_holders_whose_slices_take_a_3g_placement() -> None:
    low, claims = ones([0, 0, 0, 0, 10, 5, 0])
    result = run([mig_node("a", *ONES)], [*low, pod("high", 100)], claims, {"a": OPEN})
    assert result.placements == ()
    (preemption,) = result.preemptions
    # 3g@4 covers slices 4-7 (three pods); 3g@0 covers 0-3 (four): the fewest win, whatever their priority.
    assert sorted(v.key for v in preemption.victims) == ["team/l4", "team/l5", "team/l6"]
    assert (preemption.preemptor, preemption.node, preemption.gpu) == ("team/high", "a", 0)
    assert preemption.kind == REASON_MIG_RESHAPE and "re-lay out GPU 0" in preemption.reason
    (wait,) = result.waiting
    assert wait.preempting and wait.pod == "team/high"


def test_the_placement_is_real_once_the_victims_are_gone() -> None:
    """The plan's next cycle: the victims' claims and instances gone, the preemptor pinned, is placed on 3g@4."""
    low, claims = ones([0, 0, 0, 0])
    high = replace(pod("high", 100, victims=("uid-l4", "uid-l5", "uid-l6")), node="a")
    result = run([mig_node("a", *ONES[:4])], [*low, high], claims, {"a": OPEN})
    assert result.preemptions == ()
    (placement,) = result.placements
    assert [d.device for d in placement.pinned.devices] == [names.mig_device_name(0, "3g.40gb", 4)]


@pytest.mark.parametrize(("priority", "policy"), [(0, PREEMPT_LOWER_PRIORITY), (100, NEVER)], ids=["equal", "never"])
def test_no_preemption_of_equal_priority_or_for_never(priority: int, policy: str) -> None:
    low, claims = ones([0] * 7)
    result = run([mig_node("a", *ONES)], [*low, pod("p", priority, policy=policy)], claims, {"a": OPEN})
    assert result.preemptions == () and result.placements == ()
    (wait,) = result.waiting
    assert not wait.preempting and "3g.40gb" in wait.reason


def test_a_pod_kueue_holds_never_preempts() -> None:
    low, claims = ones([0] * 7)
    result = run([mig_node("a", *ONES)], [*low, pod("high", 100, queue_held=True)], claims, {"a": OPEN})
    assert result.preemptions == () and result.placements == ()
    (wait,) = result.waiting
    assert not wait.preempting


def test_an_instance_a_non_victim_holds_is_never_counted_as_freed() -> None:
    """The pod at start 4 is of the preemptor's priority, so 3g@4 is out: the four pods on 0-3 go."""
    low, claims = ones([0, 0, 0, 0, 100, 0, 0])
    result = run([mig_node("a", *ONES)], [*low, pod("high", 100)], claims, {"a": OPEN})
    (preemption,) = result.preemptions
    assert sorted(v.key for v in preemption.victims) == ["team/l0", "team/l1", "team/l2", "team/l3"]


def test_an_instance_a_claim_of_no_pod_holds_is_never_counted_as_freed() -> None:
    """A user's claim on 1g@0 (no gpupack pod to preempt) and a higher pod on 1g@4: no 3g place can be freed."""
    low, claims = ones([0, 0, 0, 0, 100, 0, 0])
    users = [mig_claim("user", "a", ONES[0]), *claims[1:]]
    result = run([mig_node("a", *ONES)], [*low[1:], pod("high", 100)], users, {"a": OPEN})
    assert result.preemptions == ()


def test_without_a_policy_that_lets_the_agent_create_the_profile_no_reshape_is_planned() -> None:
    low, claims = ones([0] * 7)
    for policies in ({}, {"a": NodePolicy(names=("p",), allowed_profiles=frozenset({"1g.10gb"}))}):
        assert run([mig_node("a", *ONES)], [*low, pod("high", 100)], claims, policies).preemptions == ()


def test_a_freed_instance_of_the_profile_is_taken_as_itself_where_nothing_may_be_created() -> None:
    """No policy selects the node (no new placement): the victim's 3g instance, left to the pod, will do."""
    threes = [inst("3g.40gb", 0), inst("3g.40gb", 4)]
    low = [pod("x", 10, on="a"), pod("y", 0, on="a")]
    claims = [mig_claim("x", "a", threes[0]), mig_claim("y", "a", threes[1])]
    (preemption,) = run([mig_node("a", *threes)], [*low, pod("high", 100)], claims).preemptions
    assert [v.key for v in preemption.victims] == ["team/y"]
    assert preemption.kind == REASON_MIG and "free GPU 0's instances" in preemption.reason


def test_a_pod_holding_a_mig_gpu_whole_may_be_preempted_for_a_reshape() -> None:
    """DRA_WHOLE_GPU: the plugin gave the claim the full-size instance, destroyed at unprepare."""
    whole = pod("w", 0, on="a")
    result = run([mig_node("a", inst("7g.80gb", 0))], [whole, pod("high", 100)], [claim("w", "a", "gpu-0")],
                 {"a": OPEN})
    (preemption,) = result.preemptions
    assert [v.key for v in preemption.victims] == ["team/w"] and preemption.kind == REASON_MIG_RESHAPE


def test_the_gpu_needing_fewer_victims_wins_across_nodes() -> None:
    low_a, claims_a = ones([0] * 7, "a")
    twos = [inst("2g.20gb", 0), inst("2g.20gb", 2), inst("3g.40gb", 4)]
    low_b = [pod("b0", 0, "2g.20gb", on="b"), pod("b1", 0, "2g.20gb", on="b"), pod("b2", 50, on="b")]
    claims_b = [mig_claim("b0", "b", twos[0]), mig_claim("b1", "b", twos[1]), mig_claim("b2", "b", twos[2])]
    result = run([mig_node("a", *ONES), mig_node("b", *twos)], [*low_a, *low_b, pod("high", 100)],
                 [*claims_a, *claims_b], {"a": OPEN, "b": OPEN})
    (preemption,) = result.preemptions
    assert [v.key for v in preemption.victims] == ["team/b2"] and preemption.node == "b"


def test_a_budget_protected_victim_is_spared_where_others_make_room() -> None:
    low, claims = ones([0] * 7)
    protected = frozenset({"team/l4"})
    (preemption,) = run([mig_node("a", *ONES)], [*low, pod("high", 100)], claims, {"a": OPEN},
                        protected=protected).preemptions
    assert sorted(v.key for v in preemption.victims) == ["team/l0", "team/l1", "team/l2", "team/l3"]


def test_two_preemptors_in_one_cycle_never_share_a_victim() -> None:
    low, claims = ones([0] * 7)
    result = run([mig_node("a", *ONES)], [*low, pod("h1", 100), replace(pod("h2", 100), name="h2")], claims,
                 {"a": OPEN})
    first, second = result.preemptions
    assert not {v.key for v in first.victims} & {v.key for v in second.victims}
    assert len(first.victims) == 3 and len(second.victims) == 4


def test_a_share_whose_mig_fallback_fails_too_preempts_on_the_mig_gpus() -> None:
    low, claims = ones([0] * 7)
    full = claim("busy", "s", "gpu-0-shared", namespace="other", capacity={names.MILLI: "1000", names.MEMORY: str(GiB)})
    share = Pod("team", "share", "mps", NOW, milli=(300,), memory_bytes=(None,), gated=True, uid="uid-share",
                backend="dra", claim="claim-share", requests=("gpu-0",), terms=(((BACKEND_LABEL, "In", ("dra",)),),),
                priority=PodPriority(100, PREEMPT_LOWER_PRIORITY), mig_fallback=("3g.40gb",))
    result = run([mps_node("s"), mig_node("a", *ONES)], [*low, share], [full, *claims], {"a": OPEN})
    (preemption,) = result.preemptions
    assert preemption.node == "a" and len(preemption.victims) == 3 and preemption.kind == REASON_MIG_RESHAPE


def test_while_its_victims_terminate_or_their_instances_linger_the_node_is_held_for_the_preemptor() -> None:
    """Victims gone but the agent still reports their 1g instances (not destroyed yet): the preemptor
    cannot be placed, and a lower pod after it never takes a lingering instance on its node."""
    low, claims = ones([0, 0, 0, 0])
    high = replace(pod("high", 100, victims=("uid-l4", "uid-l5", "uid-l6")), node="a")
    small = pod("small", 0, "1g.10gb")
    result = run([mig_node("a", *ONES)], [*low, high, small], claims, {"a": OPEN})
    assert result.placements == () and result.preemptions == ()
    assert {w.pod for w in result.waiting} == {"team/high", "team/small"}
    (held,) = [w for w in result.waiting if w.pod == "team/high"]
    assert held.preempting and "held for it" in held.reason
    # Without the preemptor, the lingering instance is the small pod's.
    (placement,) = run([mig_node("a", *ONES)], [*low, small], claims, {"a": OPEN}).placements
    assert placement.pod == "team/small"


def test_a_faulted_instance_of_a_victim_is_never_counted_as_freed() -> None:
    low, claims = ones([0] * 7)
    node = mig_node("a", *ONES)
    faulted = replace(node, gpus=(replace(node.gpus[0], unhealthy_instances=(ONES[4],)),))
    (preemption,) = run([faulted], [*low, pod("high", 100)], claims, {"a": OPEN}).preemptions
    assert sorted(v.key for v in preemption.victims) == ["team/l0", "team/l1", "team/l2", "team/l3"]


def test_slices_promised_earlier_in_the_cycle_are_never_counted_as_freed() -> None:
    """``first`` (higher) takes the free 3g@4 this cycle; ``high`` must free 0-3, not lift one claim and
    count 4-7 free."""
    low, claims = ones([0, 0, 0, 0])
    result = run([mig_node("a", *ONES[:4])], [*low, pod("first", 200), pod("high", 100)], claims, {"a": OPEN})
    (placement,) = result.placements
    assert placement.pod == "team/first"
    (preemption,) = result.preemptions
    assert sorted(v.key for v in preemption.victims) == ["team/l0", "team/l1", "team/l2", "team/l3"]


def test_a_pod_of_two_profiles_counts_the_free_room_of_the_nodes_other_gpus() -> None:
    """Two ``3g.40gb`` containers: GPU 1 has one 3g place free (its other half a higher pod's), GPU 0 is
    full of low 1g pods: three of them give the second place."""
    low, claims = ones([0] * 7)
    node = mig_node("a", *ONES, gpus=2)
    node = replace(node, gpus=(node.gpus[0], replace(node.gpus[1], instances=(inst("3g.40gb", 0),))))
    keep = replace(pod("keep", 100, on="a"), requests=("gpu-0",))
    two = replace(pod("two", 100), profiles=("3g.40gb", "3g.40gb"), milli=(300, 300), memory_bytes=(None, None),
                  requests=("gpu-0", "gpu-1"))
    result = run([node], [*low, keep, two], [*claims, mig_claim("keep", "a", inst("3g.40gb", 0), gpu=1)], {"a": OPEN})
    (preemption,) = result.preemptions
    assert sorted(v.key for v in preemption.victims) == ["team/l4", "team/l5", "team/l6"]
    assert preemption.gpu == 0
