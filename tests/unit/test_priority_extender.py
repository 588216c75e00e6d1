"""sharing.admission.priority_extender: kube-scheduler's ExtenderArgs in, a score per node out."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sharing.admission.priority_extender import (
    MAX_EXTENDER_PRIORITY, host_priorities, parse_extender_args, score_nodes,
)


def args_pod(priority: Any = None, name: str = "web") -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c"}]}
    if priority is not None:
        spec["priority"] = priority
    return {"metadata": {"name": name, "namespace": "team"}, "spec": spec}


def test_a_node_scores_max_where_no_gpu_pod_has_a_lower_priority() -> None:
    # node -> the priorities of its GPU pods, as the pod watch's index answers (webhook.priority_watch)
    held = {"same": {100}, "mixed": {100, 0}, "other": {0}, "elsewhere": {5}}
    nodes = ["same", "mixed", "other", "empty"]
    top = MAX_EXTENDER_PRIORITY
    assert score_nodes(100, nodes, held) == [top, 0, 0, top]
    # a pod of priority 50 outranks the priority-0 pods only; the node of higher pods is no worse
    assert score_nodes(50, nodes, held) == [top, 0, 0, top]
    # a pod of the lowest priority outranks nobody: every node is preferred, MostAllocated decides
    assert score_nodes(0, nodes, held) == [top, top, top, top]


def test_without_gpu_pods_every_node_scores_the_same() -> None:
    assert score_nodes(7, ["a", "b"], {}) == [MAX_EXTENDER_PRIORITY] * 2
    assert score_nodes(7, [], {}) == []


def test_scores_are_within_kube_schedulers_range_and_rendered_as_a_host_priority_list() -> None:
    scores = score_nodes(1, ["a", "b"], {"a": {0}})
    assert all(0 <= s <= MAX_EXTENDER_PRIORITY == 10 for s in scores)
    assert host_priorities(["a", "b"], scores) == [{"Host": "a", "Score": 0}, {"Host": "b", "Score": 10}]
    with pytest.raises(ValueError, match="one score per node"):
        host_priorities(["a"], [])


def test_args_as_kube_scheduler_marshals_them() -> None:
    # Go's ExtenderArgs has no json tags: capitalized keys, Nodes null with nodeCacheCapable
    args = parse_extender_args({"Pod": args_pod(1000), "Nodes": None, "NodeNames": ["n1", "n2"]})
    assert (args.pod, args.priority, args.nodes) == ("team/web", 1000, ("n1", "n2"))


@pytest.mark.parametrize("keys", [("pod", "nodenames"), ("Pod", "nodeNames"), ("POD", "NODENAMES")])
def test_keys_match_ignoring_case_as_gos_decoder_does(keys: tuple[str, str]) -> None:
    args = parse_extender_args({keys[0]: args_pod(3), keys[1]: ["a"]})
    assert (args.priority, args.nodes) == (3, ("a",))


def test_without_node_names_the_names_of_the_node_list_are_scored() -> None:
    body = {"Pod": args_pod(), "Nodes": {"items": [{"metadata": {"name": "x"}}, {"metadata": {"name": "y"}}]},
            "NodeNames": None}
    assert parse_extender_args(body).nodes == ("x", "y")
    assert parse_extender_args(body).priority == 0  # no spec.priority: Kubernetes' default


@pytest.mark.parametrize(("body", "message"), [
    ([], "must be a JSON object, got list"),
    ({"NodeNames": ["a"]}, "has no Pod"),
    ({"Pod": "web", "NodeNames": ["a"]}, "Pod must be an object"),
    ({"Pod": {"metadata": {"name": "web"}}, "NodeNames": ["a"]}, "Pod default/web has no spec"),
    ({"Pod": args_pod()}, "neither NodeNames nor Nodes"),
    ({"Pod": args_pod(), "Nodes": None, "NodeNames": None}, "neither NodeNames nor Nodes"),
    ({"Pod": args_pod(), "NodeNames": "a"}, "NodeNames must be a list"),
    ({"Pod": args_pod(), "NodeNames": ["a", 3]}, r"NodeNames\[1\] must be a node name"),
    ({"Pod": args_pod(), "NodeNames": [""]}, r"NodeNames\[0\] must be a node name"),
    ({"Pod": args_pod(), "Nodes": {"items": "x"}}, "NodeList object with an items list"),
    ({"Pod": args_pod(), "Nodes": {"items": [{"metadata": {}}]}}, r"Nodes.items\[\*\].metadata.name\[0\]"),
    ({"Pod": args_pod("high"), "NodeNames": ["a"]}, "spec.priority must be an integer"),
    ({"Pod": args_pod(True), "NodeNames": ["a"]}, "spec.priority must be an integer"),
    ({"Pod": args_pod(2_000_000_000), "NodeNames": ["a"]}, "out of range"),
])
def test_a_body_that_is_not_an_extender_args_is_a_specific_error(body: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_extender_args(body)


_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                     max_leaves=12)
_KEYS = st.sampled_from(["Pod", "pod", "NodeNames", "Nodes", "nodenames", "spec", "metadata", "items", "name",
                         "priority", "priorityClassName", "preemptionPolicy"])
_SHAPED = st.recursive(_JSON, lambda inner: st.dictionaries(_KEYS, inner, max_size=4), max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(_SHAPED)
def test_any_json_is_an_extender_args_or_a_value_error(body: Any) -> None:
    try:
        args = parse_extender_args(body)
    except ValueError:
        return
    assert all(isinstance(n, str) and n for n in args.nodes)
    assert len(score_nodes(args.priority, args.nodes, {})) == len(args.nodes)
