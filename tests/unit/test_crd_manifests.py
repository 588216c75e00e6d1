"""The CRD manifests agree with the pydantic models they are generated from."""

from __future__ import annotations

from functools import cache
from typing import Any

import jsonschema
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupack.devcluster import crdgen
from sharing.api import crd
from tests.unit.test_crd_cases import CASES, SPEC_MODELS


@cache
def _validator(kind: str) -> jsonschema.Draft7Validator:
    return jsonschema.Draft7Validator(_crd_schema(kind))


def _crd_schema(kind: str) -> dict[str, Any]:
    desc = next(d for d in crdgen.CRDS if d.kind == kind)
    crd = yaml.safe_load((crdgen.CRD_DIR / desc.filename).read_text(encoding="utf-8"))
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


@pytest.mark.parametrize("desc", crdgen.CRDS, ids=lambda d: d.kind)
def test_committed_manifest_matches_models(desc: crdgen.CrdDescriptor) -> None:
    expected = crdgen.render(desc)
    for directory in (crdgen.CRD_DIR, *(d for d in crdgen.CRD_COPIES if d.is_dir())):
        committed = (directory / desc.filename).read_text(encoding="utf-8")
        assert committed == expected, (
            f"{directory / desc.filename} drifted from sharing/api/crd.py; "
            "run: python -m gpupack.devcluster.crdgen --write"
        )


def _walk(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    """Every schema node with its path."""
    found: list[tuple[str, dict[str, Any]]] = []
    if isinstance(node, dict):
        found.append((path, node))
        for key, sub in node.get("properties", {}).items():
            found += _walk(sub, f"{path}.{key}")
        if "items" in node:
            found += _walk(node["items"], f"{path}[]")
        if isinstance(node.get("additionalProperties"), dict):
            found += _walk(node["additionalProperties"], f"{path}{{}}")
    return found


@pytest.mark.parametrize("kind", SPEC_MODELS)
def test_schema_is_structural(kind: str) -> None:
    for path, node in _walk(_crd_schema(kind)):
        preserve = node.get("x-kubernetes-preserve-unknown-fields") is True
        assert "type" in node or preserve, f"{path} has no type"
        assert not ("properties" in node and "additionalProperties" in node), path
        assert "$ref" not in node and "anyOf" not in node and "nullable" not in node, path
        if preserve:
            # No part of gpupack's API keeps unknown fields (issue 33, item 2): metadata only.
            assert path == ".metadata", path
        if node.get("type") == "array" and path.startswith(".spec"):
            assert "maxItems" in node, f"{path}: CEL cost estimation needs a bound"


def test_no_model_keeps_unknown_fields() -> None:
    models = [
        obj for obj in vars(crd).values()
        if isinstance(obj, type) and issubclass(obj, crd.BaseModel) and obj.__module__ == crd.__name__
    ]
    extensible = {m.__name__ for m in models if m.model_config.get("extra") != "forbid"}
    assert extensible == {"ObjectMeta"}


@pytest.mark.parametrize("case", [c for c in CASES if c.valid], ids=lambda c: c.id)
def test_valid_cases_satisfy_crd_schema(case: Any) -> None:
    _validator(case.kind).validate(case.body("x"))


# Invalid cases a plain JSON Schema validator can see (the rest are CEL rules,
# unknown fields or list-map uniqueness, which only the API server checks; see e2e).
SCHEMA_VISIBLE = {"gpunode-bad-mode", "gpunode-replicas-too-many", "gpunode-replicas-string",
                  "gpunode-bad-profile", "gpunode-index-negative", "gpunode-missing-index",
                  "gpunode-too-many-instances", "policy-bad-window", "policy-bad-day",
                  "policy-namespace-no-modes", "policy-bad-mode", "policy-bad-memory",
                  "policy-negative-idle"}


@pytest.mark.parametrize("case", [c for c in CASES if c.id in SCHEMA_VISIBLE], ids=lambda c: c.id)
def test_invalid_cases_violate_crd_schema(case: Any) -> None:
    with pytest.raises(jsonschema.ValidationError):
        _validator(case.kind).validate(case.body("x"))


profiles = st.sampled_from(["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb",
                           "7g.80gb", "1g.24gb+gfx"])
instances = st.builds(crd.MigInstanceSpec, profile=profiles,
                      start=st.none() | st.integers(0, 7))
gpu_specs = st.integers(0, 15).flatmap(
    lambda i: st.one_of(
        st.builds(crd.GPUSpec, index=st.just(i), mig_enabled=st.booleans()),
        st.builds(crd.GPUSpec, index=st.just(i), mig_enabled=st.just(True),
                  layout=st.lists(instances, max_size=7)),
        st.builds(crd.GPUSpec, index=st.just(i), mig_enabled=st.just(True),
                  mig_config=st.sampled_from(["all-balanced", "all-1g.10gb", "custom-a"])),
    )
)
sharing_configs = st.one_of(
    st.just(crd.SharingConfig()),
    st.builds(crd.SharingConfig, mode=st.sampled_from(["mps", "time-slicing"]),
              replicas=st.integers(1, 64)),
)
node_specs = st.builds(
    crd.GPUNodeSpec, sharing=sharing_configs,
    gpus=st.lists(gpu_specs, max_size=8, unique_by=lambda g: g.index),
)


@settings(max_examples=60, deadline=None)
@given(node_specs)
def test_generated_specs_round_trip_and_satisfy_schema(spec: crd.GPUNodeSpec) -> None:
    wire = crd.to_wire(spec)
    assert crd.GPUNodeSpec.model_validate(wire) == spec
    body = {"apiVersion": crd.API_VERSION, "kind": "GPUNode", "metadata": {"name": "n"},
            "spec": wire}
    _validator("GPUNode").validate(body)


def test_generator_refuses_unions_it_cannot_express() -> None:
    """A structural schema has no anyOf of types: only ``X | None`` may appear in the models."""
    union = {"anyOf": [{"type": "integer"}, {"type": "string"}, {"type": "null"}]}
    with pytest.raises(ValueError, match="only `X | None` unions"):
        crdgen.structural(union, {})
    optional = {"anyOf": [{"type": "integer", "minimum": 0}, {"type": "null"}], "default": None}
    assert crdgen.structural(optional, {}) == {"type": "integer", "minimum": 0}
