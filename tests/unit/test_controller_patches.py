"""Pinning and ungating patches: tighten only, keep other gates, refuse ungated pods."""

from __future__ import annotations

from typing import Any

import pytest

from controller.planning.migplan import LayoutChange
from controller.writes.patches import gpus_spec, pin_ops, release_ops, ungate_ops
from mig.model import PlacedInstance, Placement
from sharing.admission.patch import apply_patch

GATE = {"name": "gpupack.io/capacity"}


def pod(affinity: dict[str, Any] | None, gates: list[dict[str, str]] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c"}], "schedulingGates": gates if gates is not None else [GATE]}
    if affinity is not None:
        spec["affinity"] = affinity
    return {"metadata": {"name": "p"}, "spec": spec}


def terms(obj: dict[str, Any]) -> list[dict[str, Any]]:
    return obj["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]  # type: ignore[no-any-return]


HOST = {"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1"]}


@pytest.mark.parametrize(
    "affinity",
    [
        pytest.param(None, id="no-affinity"),
        pytest.param({"podAntiAffinity": {}}, id="other-affinity-only"),
        pytest.param({"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}, id="preferred-only"),
    ],
)
def test_pin_adds_a_required_term_when_there_is_none(affinity: dict[str, Any] | None) -> None:
    out = apply_patch(pod(affinity), [o for o in pin_ops(pod(affinity), "n1") if o["op"] != "test"])
    assert terms(out) == [{"matchExpressions": [HOST]}]
    if affinity:
        for key in affinity:
            assert key in out["spec"]["affinity"]


def test_pin_ands_the_hostname_into_every_existing_term() -> None:
    existing = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": ["A"]}]},
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]},
    ]}}}
    ops = pin_ops(pod(existing), "n1")
    assert ops[0] == {"op": "test", "path": "/spec/schedulingGates", "value": [GATE]}
    out = apply_patch(pod(existing), [o for o in ops if o["op"] != "test"])
    got = terms(out)
    assert len(got) == 2  # no term added: tightening only
    assert got[0]["matchExpressions"][-1] == HOST and got[0]["matchExpressions"][0]["key"] == "nvidia.com/gpu.product"
    assert got[1]["matchExpressions"] == [HOST] and got[1]["matchFields"]


def test_pin_refuses_an_ungated_pod() -> None:
    with pytest.raises(ValueError, match="not gated"):
        pin_ops(pod(None, gates=[]), "n1")


def test_ungate_keeps_other_controllers_gates() -> None:
    other = {"name": "example.com/quota"}
    ops = ungate_ops(pod(None, gates=[other, GATE]))
    assert apply_patch(pod(None, gates=[other, GATE]), [o for o in ops if o["op"] != "test"])["spec"]["schedulingGates"] == [other]
    alone = apply_patch(pod(None), [o for o in ungate_ops(pod(None)) if o["op"] != "test"])
    assert "schedulingGates" not in alone["spec"]
    assert ungate_ops(pod(None, gates=[other])) == []


def test_a_release_is_one_guarded_patch_that_pins_and_ungates() -> None:
    other = {"name": "example.com/quota"}
    before = pod(None, gates=[other, GATE])
    ops = release_ops(before, "n1", pinned=False)
    assert [o["op"] for o in ops].count("test") == 1 and ops[0]["path"] == "/spec/schedulingGates"
    out = apply_patch(before, [o for o in ops if o["op"] != "test"])
    assert terms(out) == [{"matchExpressions": [HOST]}]
    assert out["spec"]["schedulingGates"] == [other]


def test_a_pod_already_pinned_there_is_only_ungated_and_an_ungated_one_needs_nothing() -> None:
    assert release_ops(pod(None), "n1", pinned=True) == ungate_ops(pod(None))
    with pytest.raises(ValueError, match="not gated"):
        release_ops(pod(None, gates=[]), "n1", pinned=False)
    assert release_ops(pod(None, gates=[]), "n1", pinned=True) == []


def test_gpus_spec_replaces_only_changed_gpus() -> None:
    node = {"spec": {"gpus": [{"index": 0, "migEnabled": True, "layout": [{"profile": "7g.80gb"}]},
                              {"index": 1, "migEnabled": False}]}}
    change = LayoutChange("n", 0, "reshape", (PlacedInstance("3g.40gb", Placement(4, 4)),), (), ())
    out = gpus_spec(node, [change])
    assert out == [{"index": 0, "migEnabled": True, "layout": [{"profile": "3g.40gb"}]}, {"index": 1, "migEnabled": False}]
