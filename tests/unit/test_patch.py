"""JSON Patch building: escaping, absent/present fields, AND-merged affinity, idempotence."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from sharing.admission.decision import Expression, decide
from sharing.admission.inventory import Inventory, build_inventory
from sharing.api.keys import ALLOCATION_ANNOTATION, CAPACITY_GATE
from sharing.admission.patch import apply_patch, build_patch, escape, merge_terms, unescape
from sharing.api.request import parse_pod
from gpupack.testing.admission_reviews import gpu_container, make_pod

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def inventory() -> Inventory:
    return build_inventory(yaml.safe_load((ROOT / "examples" / "inventory.yaml").read_text()))


def mutated(pod: dict[str, Any], inventory: Inventory) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    request = parse_pod(pod)
    assert request is not None
    ops = build_patch(pod, decide(request, inventory.policy_for("default"), inventory))
    return ops, apply_patch(pod, ops)


@pytest.mark.parametrize(("raw", "escaped"), [("gpupack.io/allocation", "gpupack.io~1allocation"), ("a~b/c", "a~0b~1c")])
def test_escape_round_trip(raw: str, escaped: str) -> None:
    assert escape(raw) == escaped and unescape(escaped) == raw


def test_annotation_added_with_escaped_key_when_annotations_exist(inventory: Inventory) -> None:
    pod = make_pod(gpu_container("c", "100"), annotations={"team": "vision"})
    ops, out = mutated(pod, inventory)
    paths = [op["path"] for op in ops]
    assert "/metadata/annotations/gpupack.io~1allocation" in paths
    assert out["metadata"]["annotations"]["team"] == "vision"
    record = json.loads(out["metadata"]["annotations"][ALLOCATION_ANNOTATION])
    assert record["mode"] == "mig" and record["containers"][0]["resource"] == "nvidia.com/mig-1g.10gb"


def test_annotations_map_created_when_absent(inventory: Inventory) -> None:
    ops, out = mutated(make_pod(gpu_container("c", "100")), inventory)
    assert {"op": "add", "path": "/metadata/annotations"} == {k: ops[-1][k] for k in ("op", "path")}
    assert ALLOCATION_ANNOTATION in out["metadata"]["annotations"]


def test_resources_rewritten_keeping_other_resources(inventory: Inventory) -> None:
    container = gpu_container("c", "100")
    container["resources"]["limits"]["cpu"] = "2"
    container["resources"]["requests"] = {"cpu": "1", "gpupack.io/gpu-milli": "100"}
    _, out = mutated(make_pod(container), inventory)
    resources = out["spec"]["containers"][0]["resources"]
    assert resources == {
        "limits": {"cpu": "2", "nvidia.com/mig-1g.10gb": "1"},
        "requests": {"cpu": "1", "nvidia.com/mig-1g.10gb": "1"},
    }


def test_mps_env_added_or_updated(inventory: Inventory) -> None:
    absent = make_pod(gpu_container("c", "250"), mode="mps")
    _, out = mutated(absent, inventory)
    assert out["spec"]["containers"][0]["env"] == [{"name": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "value": "25"}]
    present = make_pod(
        gpu_container("c", "250", env=[{"name": "A", "value": "1"}, {"name": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "value": "90"}]),
        mode="mps",
    )
    ops, out = mutated(present, inventory)
    assert out["spec"]["containers"][0]["env"] == [
        {"name": "A", "value": "1"},
        {"name": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "value": "25"},
    ]
    assert any(op["op"] == "replace" and op["path"].endswith("/env/1") for op in ops)


def test_affinity_anded_into_every_existing_term(inventory: Inventory) -> None:
    user_terms = [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]},
    ]
    pod = make_pod(
        gpu_container("c", "100"),
        affinity={
            "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []},
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": user_terms},
                "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "preference": {}}],
            },
        },
    )
    _, out = mutated(pod, inventory)
    affinity = out["spec"]["affinity"]
    assert affinity["podAntiAffinity"] == {"preferredDuringSchedulingIgnoredDuringExecution": []}
    assert affinity["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] == [{"weight": 1, "preference": {}}]
    terms = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert len(terms) == 2
    assert terms[0]["matchExpressions"][0] == {"key": "zone", "operator": "In", "values": ["a"]}
    assert terms[1]["matchFields"] == user_terms[1]["matchFields"]
    for term in terms:
        assert [e["key"] for e in term["matchExpressions"][-2:]] == ["nvidia.com/gpu.product", "gpupack.io/gpu-degraded"]


def test_merge_terms_is_a_cross_product() -> None:
    ours = ((Expression("k", "In", ("1",)),), (Expression("k", "In", ("2",)),))
    merged = merge_terms([{"matchExpressions": [{"key": "z", "operator": "Exists"}]}], ours)
    assert [[e["key"] for e in t["matchExpressions"]] for t in merged] == [["z", "k"], ["z", "k"]]
    assert [t["matchExpressions"][1]["values"] for t in merged] == [["1"], ["2"]]


def test_gate_added_or_appended() -> None:
    busy = yaml.safe_load((ROOT / "examples" / "inventory.yaml").read_text())
    for obj in busy:
        for gpu in obj["status"]["gpus"]:
            for inst in gpu.get("instances", []):
                inst["inUse"] = True
    inventory = build_inventory(busy)
    _, out = mutated(make_pod(gpu_container("c", "100"), mode="mig"), inventory)
    assert out["spec"]["schedulingGates"] == [{"name": CAPACITY_GATE}]
    _, out = mutated(make_pod(gpu_container("c", "100"), mode="mig", schedulingGates=[{"name": "other"}]), inventory)
    assert out["spec"]["schedulingGates"] == [{"name": "other"}, {"name": CAPACITY_GATE}]


def test_init_containers_patched_at_their_own_path(inventory: Inventory) -> None:
    pod = make_pod({"name": "app", "image": "x"}, init=[gpu_container("warm", "100")])
    ops, out = mutated(pod, inventory)
    assert any(op["path"].startswith("/spec/initContainers/0/resources") for op in ops)
    assert out["spec"]["initContainers"][0]["resources"]["limits"] == {"nvidia.com/mig-1g.10gb": "1"}
    assert out["spec"]["containers"] == pod["spec"]["containers"]


def test_mutated_pod_comes_back_unchanged(inventory: Inventory) -> None:
    pod = make_pod(gpu_container("c", "250", "16Gi"), mode="mps")
    _, once = mutated(pod, inventory)
    assert parse_pod(once) is None  # nothing left to decide: a reinvocation changes nothing


@given(
    extra=st.dictionaries(
        st.text(st.characters(min_codepoint=97, max_codepoint=122), min_size=1, max_size=8),
        st.one_of(st.integers(), st.text(max_size=10), st.lists(st.integers(), max_size=3)),
        max_size=5,
    ),
    milli=st.integers(min_value=1, max_value=1000),
    mode=st.sampled_from([None, "mig", "mps", "time-slicing"]),
)
@settings(max_examples=100, deadline=None)
def test_patch_never_loses_a_field(inventory: Inventory, extra: dict[str, Any], milli: int, mode: str | None) -> None:
    pod = make_pod(gpu_container("c", str(milli)), mode=mode, labels={"app": "x"})
    pod["spec"].update({f"x{k}": v for k, v in extra.items()})
    pod["metadata"]["labels"]["gpupack.io/x"] = "y"
    before = copy.deepcopy(pod)
    _, out = mutated(pod, inventory)
    assert pod == before  # building the patch does not touch the input
    for key, value in before["spec"].items():
        if key != "containers":
            assert out["spec"][key] == value
    assert out["metadata"]["labels"] == before["metadata"]["labels"]
    assert out["spec"]["containers"][0]["image"] == before["spec"]["containers"][0]["image"]
