"""Valid and invalid gpupack custom resources, judged by the pydantic models.

The same table is sent to a real kube-apiserver by
``tests/e2e/test_controlplane_crds.py``: both must accept the valid objects and
reject the invalid ones, which is how we know the models and the CRD schemas
(including the CEL rules, which only the API server evaluates) agree.
Each invalid case names a fragment the API server's message must contain.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from sharing.api import crd


@dataclass(frozen=True)
class Case:
    id: str
    kind: str  # "GPUNode" | "SharingPolicy"
    spec: dict[str, Any]
    valid: bool
    server_says: str = ""  # fragment of the API server's rejection message

    def body(self, name: str) -> dict[str, Any]:
        return {
            "apiVersion": crd.API_VERSION,
            "kind": self.kind,
            "metadata": {"name": name},
            "spec": copy.deepcopy(self.spec),
        }


SPEC_MODELS: dict[str, type[BaseModel]] = {
    "GPUNode": crd.GPUNodeSpec,
    "SharingPolicy": crd.SharingPolicySpec,
}

MIG_GPU = {"index": 0, "migEnabled": True, "layout": [{"profile": "3g.40gb", "start": 4}]}

CASES: tuple[Case, ...] = (
    # ---- GPUNode: valid
    Case("gpunode-empty", "GPUNode", {}, True),
    Case("gpunode-mps", "GPUNode", {"sharing": {"mode": "mps", "replicas": 4}}, True),
    Case(
        "gpunode-mixed-gpus",
        "GPUNode",
        {"gpus": [MIG_GPU, {"index": 1, "migEnabled": True, "migConfig": "all-balanced"},
                  {"index": 2}]},
        True,
    ),
    Case("gpunode-profile-me", "GPUNode",
         {"gpus": [{"index": 0, "migEnabled": True, "layout": [{"profile": "1g.10gb+me"}]}]}, True),
    # ---- GPUNode: invalid
    Case("gpunode-bad-mode", "GPUNode", {"sharing": {"mode": "mig"}}, False, "Unsupported value"),
    Case("gpunode-replicas-too-many", "GPUNode", {"sharing": {"mode": "mps", "replicas": 65}},
         False, "less than or equal to 64"),
    Case("gpunode-replicas-without-mode", "GPUNode", {"sharing": {"replicas": 2}}, False,
         "replicas must be 1 when mode is none"),
    Case("gpunode-replicas-string", "GPUNode", {"sharing": {"mode": "mps", "replicas": "4"}},
         False, "must be of type integer"),
    Case("gpunode-layout-and-config", "GPUNode",
         {"gpus": [{**MIG_GPU, "migConfig": "all-1g.10gb"}]}, False,
         "set layout or migConfig, not both"),
    Case("gpunode-layout-without-mig", "GPUNode",
         {"gpus": [{**MIG_GPU, "migEnabled": False}]}, False,
         "layout and migConfig need migEnabled: true"),
    Case("gpunode-bad-profile", "GPUNode",
         {"gpus": [{"index": 0, "migEnabled": True, "layout": [{"profile": "half"}]}]}, False,
         "should match"),
    Case("gpunode-duplicate-index", "GPUNode", {"gpus": [{"index": 0}, {"index": 0}]}, False,
         "Duplicate value"),
    Case("gpunode-index-negative", "GPUNode", {"gpus": [{"index": -1}]}, False,
         "greater than or equal to 0"),
    Case("gpunode-missing-index", "GPUNode", {"gpus": [{"migEnabled": True}]}, False,
         "Required value"),
    Case("gpunode-too-many-instances", "GPUNode",
         {"gpus": [{"index": 0, "migEnabled": True, "layout": [{"profile": "1g.10gb"}] * 8}]},
         False, "must have at most 7 items"),
    Case("gpunode-unknown-field", "GPUNode",
         {"sharing": {"mode": "mps", "replicas": 2, "shareMode": "x"}}, False,
         'unknown field "spec.sharing.shareMode"'),
    # ---- SharingPolicy: valid
    Case("policy-empty", "SharingPolicy", {}, True),
    Case(
        "policy-full",
        "SharingPolicy",
        {
            "nodeSelector": {"matchLabels": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}},
            "namespaces": [
                {"names": ["team-a", "team-b"], "allowedModes": ["mig"]},
                {"selector": {"matchLabels": {"tier": "batch"}},
                 "allowedModes": ["mps", "time-slicing"]},
            ],
            "allowedProfiles": ["1g.10gb", "3g.40gb"],
            "defaultGpuMemory": "10Gi",
            "layout": {"mode": "static", "migConfig": "all-balanced"},
            "reshaping": {"windows": [{"start": "22:00", "end": "06:00", "days": ["Sat", "Sun"]}],
                          "maxConcurrent": 2, "idleSeconds": 600},
            "replicas": {"min": 2, "max": 8, "targetUtilization": 70},
        },
        True,
    ),
    Case("policy-static-instances", "SharingPolicy",
         {"layout": {"mode": "static", "instances": [{"profile": "7g.80gb"}]}}, True),
    # ---- SharingPolicy: invalid
    Case("policy-static-without-geometry", "SharingPolicy", {"layout": {"mode": "static"}}, False,
         "static needs exactly one of migConfig or instances"),
    Case("policy-dynamic-with-config", "SharingPolicy",
         {"layout": {"mode": "dynamic", "migConfig": "all-balanced"}}, False,
         "dynamic takes neither"),
    Case("policy-bad-window", "SharingPolicy",
         {"reshaping": {"windows": [{"start": "24:00", "end": "06:00"}]}}, False, "should match"),
    Case("policy-bad-day", "SharingPolicy",
         {"reshaping": {"windows": [{"start": "01:00", "end": "02:00", "days": ["Funday"]}]}},
         False, "Unsupported value"),
    Case("policy-min-above-max", "SharingPolicy", {"replicas": {"min": 9, "max": 4}}, False,
         "min must not exceed max"),
    Case("policy-namespace-names-and-selector", "SharingPolicy",
         {"namespaces": [{"names": ["a"], "selector": {"matchLabels": {"x": "y"}},
                          "allowedModes": ["mps"]}]}, False,
         "set exactly one of names or selector"),
    Case("policy-namespace-no-modes", "SharingPolicy",
         {"namespaces": [{"names": ["a"], "allowedModes": []}]}, False,
         "should have at least 1 items"),
    Case("policy-bad-mode", "SharingPolicy",
         {"namespaces": [{"names": ["a"], "allowedModes": ["auto"]}]}, False,
         "Unsupported value"),
    Case("policy-bad-memory", "SharingPolicy", {"defaultGpuMemory": "ten gigs"}, False,
         "should match"),
    Case("policy-negative-idle", "SharingPolicy", {"reshaping": {"idleSeconds": -1}}, False,
         "greater than or equal to 0"),
)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_models_judge_case(case: Case) -> None:
    model = SPEC_MODELS[case.kind]
    if case.valid:
        parsed = model.model_validate(case.spec)
        # Round trip: what we send is what we parsed.
        assert model.model_validate(crd.to_wire(parsed)) == parsed
    else:
        with pytest.raises(ValidationError):
            model.model_validate(case.spec)


def test_cases_cover_both_kinds_and_outcomes() -> None:
    seen = {(c.kind, c.valid) for c in CASES}
    assert seen == {(k, v) for k in SPEC_MODELS for v in (True, False)}
    assert all(c.server_says for c in CASES if not c.valid)
    assert len({c.id for c in CASES}) == len(CASES)
