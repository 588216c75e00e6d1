"""One reading of a SharingPolicy (sharing.api.crd.read_policies) for the webhook, the controller
and the node agent: the same objects are applied, or left out, by all three alike."""

from __future__ import annotations

from typing import Any

import pytest

from controller.state.build import build_snapshot
from node.base.reshape_rules import reshape_rules
from sharing.api.crd import NamespaceRule, SharingPolicySpec, read_policies
from sharing.admission.inventory import build_inventory


def policy(name: str | None, spec: Any, generation: int = 1) -> dict[str, Any]:
    meta: dict[str, Any] = {"generation": generation}
    if name is not None:
        meta["name"] = name
    return {"apiVersion": "gpupack.io/v1alpha1", "kind": "SharingPolicy", "metadata": meta, "spec": spec}


GOOD = policy("good", {"nodeSelector": {"matchLabels": {"pool": "a"}}, "reshaping": {"idleSeconds": 30},
                       "namespaces": [{"names": ["team-a"], "allowedModes": ["mig"]}]})
BAD = policy("bad", {"replicas": {"min": 4, "max": 2}})  # fails a cross-field rule
ODD = policy("odd", {"nodeSelector": {"matchLabels": {"pool": "a"}}, "surprise": True})  # unknown field
UNNAMED = policy(None, {})
NODE = {"metadata": {"name": "n1", "labels": {"pool": "a"}}}
GPUNODE = {"kind": "GPUNode", "metadata": {"name": "n1", "generation": 1}, "spec": {}, "status": {"gpus": [
    {"index": 0, "uuid": "GPU-0", "product": "NVIDIA-H100-80GB-HBM3", "memoryMiB": 81559, "migEnabled": False}]}}


def test_the_reader_keeps_valid_policies_and_says_why_it_leaves_the_others_out() -> None:
    entries = {p.name: p for p in read_policies([GOOD, BAD, ODD, UNNAMED])}
    assert set(entries) == {"good", "bad", "odd"}  # an object without a name is no policy
    assert entries["good"].spec is not None and entries["good"].problem is None
    assert entries["bad"].spec is None and "min must not exceed max" in str(entries["bad"].problem)
    assert entries["odd"].spec is None and "spec.surprise" in str(entries["odd"].problem)


@pytest.mark.parametrize("objects", [[GOOD], [GOOD, BAD], [GOOD, ODD, UNNAMED], [BAD, ODD]])
def test_webhook_controller_and_agent_apply_the_same_policies(objects: list[dict[str, Any]]) -> None:
    valid = {"good"} & {o["metadata"].get("name") for o in objects}
    inventory = build_inventory([*objects, GPUNODE])
    assert {name for name, _ in inventory.policies} == valid
    assert len(inventory.skipped_policies) == sum(o in (BAD, ODD) for o in objects)
    snapshot = build_snapshot([GPUNODE], [NODE], [], objects)
    assert (set(snapshot.policies["n1"].names) if "n1" in snapshot.policies else set()) == valid
    rules = reshape_rules({"pool": "a"}, objects, default_idle=600)
    assert set(rules.sources) == valid
    assert rules.idle_seconds == (30 if valid else 600)
    assert len(rules.problems) == sum(o in (BAD, ODD) for o in objects)


@pytest.mark.parametrize(
    ("rule", "namespace", "labels", "covered"),
    [
        ({"names": ["a", "b"], "allowedModes": ["mps"]}, "a", None, True),
        ({"names": ["a"], "allowedModes": ["mps"]}, "c", {"x": "1"}, False),
        ({"selector": {"matchLabels": {"x": "1"}}, "allowedModes": ["mps"]}, "c", {"x": "1"}, True),
        ({"selector": {"matchLabels": {"x": "1"}}, "allowedModes": ["mps"]}, "c", None, False),  # labels unknown
        ({"selector": {}, "allowedModes": ["mps"]}, "c", None, True),  # the empty selector covers every namespace
    ],
)
def test_namespace_rules(rule: dict[str, Any], namespace: str, labels: dict[str, str] | None, covered: bool) -> None:
    assert NamespaceRule.model_validate(rule).matches(namespace, labels) is covered


def test_modes_per_namespace_and_default_memory() -> None:
    spec = SharingPolicySpec.model_validate({
        "namespaces": [{"names": ["a"], "allowedModes": ["mig"]}, {"names": ["a", "b"], "allowedModes": ["mps"]}],
        "defaultGpuMemory": "10Gi",
    })
    assert spec.modes_for("a", None) == ("mig", "mps") and spec.modes_for("b", None) == ("mps",)
    assert spec.modes_for("z", None) == ()
    assert SharingPolicySpec().modes_for("z", None) == ("mig", "mps", "time-slicing")  # no rules: every mode
    assert spec.default_gpu_memory_bytes == 10 * 2**30 and SharingPolicySpec().default_gpu_memory_bytes is None
