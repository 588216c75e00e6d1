"""A MIG pod of higher priority gets a GPU re-laid out for it (issue 36): the fewest lower-priority pods
holding instances on one MIG GPU are preempted so that its profile fits there, the node is held for
it, and the GPU is reshaped once they are gone; an instance in use by anybody else is never destroyed."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta, timezone

import pytest

from controller.planning.planner import Plan, plan
from controller.state.snapshot import Gpu, Node, Pod, Snapshot
from mig.catalog import get_model
from mig.model import PlacedInstance, Placement
from sharing.api.priority import NEVER, PREEMPT_LOWER_PRIORITY, PodPriority
from sharing.rules.node_policy import NodePolicy

H100 = get_model("H100-80GB")
NOW = datetime(2026, 11, 30, 2, 0, tzinfo=timezone.utc)
POLICY = NodePolicy(names=("p",), max_concurrent=2, idle_seconds=600)
ONES = tuple(PlacedInstance("1g.10gb", Placement(i, 1)) for i in range(7))


def mig_node(users: Mapping[int, str | None], name: str = "m", layout: tuple[PlacedInstance, ...] = ONES) -> Node:
    """A node of one H100 laid out ``layout`` (7x1g.10gb), busy (never idle long enough to reshape on its
    own); ``users``: the 1g instances in use by start, each with the pod the agent names on it (None: in
    use by a process no pod is named for)."""
    in_use = tuple(ONES[i] for i in sorted(users))
    named = tuple((ONES[i], (f"team/{who}",)) for i, who in sorted(users.items()) if who is not None)
    gpu = Gpu(0, H100.memory_mib, True, layout, in_use, users=named)
    return Node(name, H100.product, H100, (("pool", "a"),), "none", 1, (gpu,))


def mig_pod(name: str, priority: int, profile: str = "1g.10gb", *, on: str | None = None,
            policy: str = PREEMPT_LOWER_PRIORITY, victims: tuple[str, ...] = ()) -> Pod:
    return Pod("team", name, "mig", NOW - timedelta(minutes=5), profiles=(profile,), milli=(400,),
               memory_bytes=(None,), gated=on is None or bool(victims), node=on, bound=on is not None and not victims,
               uid=f"uid-{name}", priority=PodPriority(priority, policy), victims=victims)


def run(nodes: list[Node], pods: Iterable[Pod], policy: NodePolicy = POLICY,
        present: frozenset[str] = frozenset()) -> Plan:
    """One cycle; ``present``: uids of pods that exist beyond ``pods`` (terminating ones)."""
    listed = tuple(pods)
    return plan(Snapshot(tuple(nodes), listed, {n.name: policy for n in nodes},
                         present=present | {p.uid for p in listed}), NOW)


LOWS = {0: "a", 1: "b", 4: "c"}
"""Three low pods on instances 0, 1 and 4: a 3g.40gb fits at 4 (slices 4-7) once ``c`` goes, at 0
(slices 0-3) once ``a`` and ``b`` go."""


def test_the_fewest_victims_that_free_a_valid_placement_are_preempted() -> None:
    """``c`` alone frees slices 4-7 for a 3g.40gb, though its priority is above ``a``'s and ``b``'s
    (fewest victims first, the engine's order); the GPU is to be re-laid out, nothing yet."""
    pods = [mig_pod("a", 0, on="m"), mig_pod("b", 0, on="m"), mig_pod("c", 10, on="m"), mig_pod("high", 100, "3g.40gb")]
    result = run([mig_node(LOWS)], pods)
    (preemption,) = result.preemptions
    assert (preemption.node, preemption.gpu, preemption.kind) == ("m", 0, "mig-reshape")
    assert [v.key for v in preemption.victims] == ["team/c"]
    assert result.layouts == ()


def test_among_equally_many_victims_the_lowest_priority_goes() -> None:
    """A 4g.40gb fits only at slices 0-3: ``a`` and ``b`` go; ``c`` (on 4) is never touched."""
    pods = [mig_pod("a", 0, on="m"), mig_pod("b", 5, on="m"), mig_pod("c", 0, on="m"), mig_pod("high", 100, "4g.40gb")]
    (preemption,) = run([mig_node(LOWS)], pods).preemptions
    assert sorted(v.key for v in preemption.victims) == ["team/a", "team/b"]


def test_the_gpu_needing_the_fewest_victims_wins_across_nodes() -> None:
    """Node ``m`` needs two victims for a 4g.40gb (slices 0-3), node ``n`` one: ``n``'s goes."""
    pods = [mig_pod("a", 0, on="m"), mig_pod("b", 0, on="m"), mig_pod("x", 0, on="n"), mig_pod("high", 100, "4g.40gb")]
    (preemption,) = run([mig_node({0: "a", 1: "b"}), mig_node({2: "x", 5: None}, name="n")], pods).preemptions
    assert (preemption.node, [v.key for v in preemption.victims]) == ("n", ["team/x"])


@pytest.mark.parametrize(("victims", "policy"), [(100, PREEMPT_LOWER_PRIORITY), (0, NEVER)], ids=["equal", "never"])
def test_no_reshape_for_equal_priority_or_a_never_preemptor(victims: int, policy: str) -> None:
    pods = [mig_pod("a", victims, on="m"), mig_pod("b", victims, on="m"), mig_pod("c", victims, on="m"),
            mig_pod("high", 100, "3g.40gb", policy=policy)]
    assert run([mig_node(LOWS)], pods).preemptions == ()


@pytest.mark.parametrize("policy", [NodePolicy(names=("p",), max_concurrent=0, frozen_by=("p",)),
                                    NodePolicy(names=("p",), max_concurrent=2, static_layout=("1g.10gb",) * 7),
                                    NodePolicy(names=("p",), max_concurrent=2,
                                               allowed_profiles=frozenset({"1g.10gb"}))],
                         ids=["frozen", "static-layout", "profile-not-allowed"])
def test_no_reshape_where_the_gate_is_shut(policy: NodePolicy) -> None:
    pods = [mig_pod("a", 0, on="m"), mig_pod("b", 0, on="m"), mig_pod("c", 0, on="m"), mig_pod("high", 100, "3g.40gb")]
    assert run([mig_node(LOWS)], pods, policy).preemptions == ()


def test_no_reshape_while_max_concurrent_is_taken() -> None:
    """A second node's GPU being reshaped takes the one slot of the policy group."""
    busy = Node("n", H100.product, H100, (("pool", "a"),), "none", 1, (Gpu(0, H100.memory_mib, True, ONES, (),
                                                                           reshaping=True),))
    pods = [mig_pod("a", 0, on="m"), mig_pod("b", 0, on="m"), mig_pod("c", 0, on="m"), mig_pod("high", 100, "3g.40gb")]
    one = NodePolicy(names=("p",), max_concurrent=1)
    assert run([mig_node(LOWS), busy], pods, one).preemptions == ()
    assert run([mig_node(LOWS), busy], pods, POLICY).preemptions != ()


def test_an_instance_used_by_a_non_victim_is_never_freed() -> None:
    """``h`` (priority above the preemptor) holds 4, and an unnamed process holds 2: neither 3g placement
    can be freed, so nothing is preempted."""
    pods = [mig_pod("a", 0, on="m"), mig_pod("h", 500, on="m"), mig_pod("high", 100, "3g.40gb")]
    assert run([mig_node({0: "a", 2: None, 4: "h"})], pods).preemptions == ()


def test_an_instance_of_the_profile_is_preempted_before_a_gpu_is_reshaped() -> None:
    """A pod holding a 3g.40gb of lower priority is the victim (``mig-instance``), not the 1g pods."""
    three = PlacedInstance("3g.40gb", Placement(4, 4))
    layout = (*ONES[:4], three)
    gpu = Gpu(0, H100.memory_mib, True, layout, (ONES[0], three), users=((ONES[0], ("team/a",)), (three, ("team/t",))))
    node = Node("m", H100.product, H100, (("pool", "a"),), "none", 1, (gpu,))
    pods = [mig_pod("a", 0, on="m"), mig_pod("t", 0, "3g.40gb", on="m"), mig_pod("high", 100, "3g.40gb")]
    (preemption,) = run([node], pods).preemptions
    assert (preemption.kind, [v.key for v in preemption.victims], preemption.gpu) == ("mig-instance", ["team/t"], None)


# ------------------------------------------------------------------ after the preemption
def held_preemptor() -> Pod:
    return mig_pod("high", 100, "3g.40gb", on="m", victims=("uid-c",))


def test_once_the_victims_are_gone_and_reported_unused_the_gpu_is_re_laid_out_for_the_preemptor() -> None:
    """``c`` is gone and its instance unused: the GPU is reshaped, destroying only unused 1g instances
    (4, 5, 6) for a 3g.40gb at 4; ``a``'s and ``b``'s instances stay. A low 1g pod waiting is not
    released to the node's free instances meanwhile: they are held for the preemptor."""
    pods = [mig_pod("a", 0, on="m"), mig_pod("b", 0, on="m"), held_preemptor(), mig_pod("late", 0)]
    result = run([mig_node({0: "a", 1: "b"})], pods)
    (change,) = result.layouts
    assert (change.node, change.index, change.kind) == ("m", 0, "reshape")
    assert {i.placement.start for i in change.destroy} == {4, 5, 6}
    assert [(i.profile, i.placement.start) for i in change.create] == [("3g.40gb", 4)]
    assert not {ONES[0], ONES[1]} & set(change.destroy)
    assert result.releases == () and result.preemptions == ()
    waits = {w.pod: w for w in result.waiting}
    assert waits["team/high"].coming and waits["team/high"].preempting
    assert "team/late" in waits


def test_while_the_victim_runs_or_terminates_nothing_is_reshaped() -> None:
    """Still running (the controller stopped before deleting it): it is deleted again; terminating:
    the preemptor waits. Neither time is a layout planned or the GPU's free instances released."""
    pods = [mig_pod("a", 0, on="m"), mig_pod("b", 0, on="m"), held_preemptor(), mig_pod("late", 0)]
    running = run([mig_node(LOWS)], [*pods, mig_pod("c", 0, on="m")])
    (again,) = running.preemptions
    assert again.resumed and [v.key for v in again.victims] == ["team/c"]
    terminating = run([mig_node(LOWS)], pods, present=frozenset({"uid-c"}))
    for result in (running, terminating):
        assert result.layouts == () and result.releases == ()
        assert next(w for w in result.waiting if w.pod == "team/high").preempting
    assert terminating.preemptions == ()


def test_a_victims_instance_still_reported_in_use_is_not_destroyed() -> None:
    """``c`` is gone but the agent still names it on instance 4 (its process outlives the pod object):
    the only 3g placement left crosses that instance, so the preemptor waits and nothing is planned."""
    result = run([mig_node(LOWS)], [mig_pod("a", 0, on="m"), mig_pod("b", 0, on="m"), held_preemptor()])
    assert result.layouts == () and result.preemptions == () and result.releases == ()


def test_the_preemptor_is_released_to_the_instance_created_for_it() -> None:
    three = PlacedInstance("3g.40gb", Placement(4, 4))
    gpu = Gpu(0, H100.memory_mib, True, (*ONES[:4], three), (ONES[0], ONES[1]),
              users=((ONES[0], ("team/a",)), (ONES[1], ("team/b",))))
    node = Node("m", H100.product, H100, (("pool", "a"),), "none", 1, (gpu,))
    pods = [mig_pod("other", 100, "3g.40gb"), mig_pod("a", 0, on="m"), mig_pod("b", 0, on="m"), held_preemptor()]
    result = run([node], pods)
    assert [(r.pod, r.node) for r in result.releases] == [("team/high", "m")]


def test_nobody_else_preempts_on_a_node_held_for_a_preemptor() -> None:
    """A second high pod asking 1g.10gb finds no free instance (the node's are held): it preempts nobody
    there, though ``a`` and ``b`` are below it."""
    pods = [mig_pod("a", 0, on="m"), mig_pod("b", 0, on="m"), held_preemptor(), mig_pod("second", 100)]
    result = run([mig_node({0: "a", 1: "b", 4: "c"})], pods, present=frozenset({"uid-c"}))
    assert result.preemptions == () and result.releases == ()
