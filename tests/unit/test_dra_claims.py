"""Claims from pod requests (sharing.admission.dra_claims): the template spec, the pod patch data, and the
checks of users' own claims."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest

from mig import units
from sharing.admission.decision import ContainerDecision
from sharing.dra import names
from sharing.admission.dra_claims import (
    POD_CLAIM,
    ClaimBounds,
    ClaimReason,
    PodClaims,
    check_claim,
    pod_claims,
)
from sharing.dra.model import DraModelError
from sharing.dra.share_policy import GiB, SharePolicy
from sharing.admission.inventory import AdmissionPolicy
from sharing.api.modes import AllocationMode
from sharing.api.request import Reason

H100 = 81559 * 2**20


@dataclass(frozen=True)
class Ask:
    milli: int
    memory_bytes: int | None = None
    profile: str | None = None
    kind: Literal["containers", "initContainers"] = "containers"
    index: int = 0


def requests_of(claims: PodClaims) -> list[dict[str, Any]]:
    return list(claims.template_spec["spec"]["devices"]["requests"])  # type: ignore[arg-type]


# ------------------------------------------------------------------ the API's shape, without a server
# Field names of k8s.io/api@v0.37.2 resource/v1 and core/v1 (json tags); checked against types.go
# itself where the Go module cache has it (test_field_names_match_types_go).
FIELDS: dict[str, set[str]] = {
    "ResourceClaimTemplate": {"apiVersion", "kind", "metadata", "spec"},
    "ResourceClaimTemplateSpec": {"metadata", "spec"},
    "ResourceClaimSpec": {"devices"},
    "DeviceClaim": {"requests", "constraints", "config"},
    "DeviceRequest": {"name", "exactly", "firstAvailable"},
    "ExactDeviceRequest": {"deviceClassName", "selectors", "allocationMode", "count", "adminAccess",
                           "tolerations", "capacity", "derivedAttributes"},
    "CapacityRequirements": {"requests"},
    "DeviceSelector": {"cel"},
    "CELDeviceSelector": {"expression"},
    "PodResourceClaim": {"name", "resourceClaimName", "resourceClaimTemplateName"},
    "ResourceClaim": {"name", "request"},  # core/v1: a container's resources.claims[] entry
}
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def _keys(obj: dict[str, Any], typ: str) -> None:
    assert set(obj) <= FIELDS[typ], f"{typ}: unknown fields {sorted(set(obj) - FIELDS[typ])}"


def check_api_shape(claims: PodClaims, namespace: str = "ml") -> None:
    """What kube-apiserver's validation of these objects checks that a unit test can."""
    template = claims.template(namespace)
    _keys(template, "ResourceClaimTemplate")
    assert template["apiVersion"] == "resource.k8s.io/v1" and template["kind"] == "ResourceClaimTemplate"
    assert DNS_LABEL.match(template["metadata"]["name"]) and len(template["metadata"]["name"]) <= 63
    spec = template["spec"]
    _keys(spec, "ResourceClaimTemplateSpec")
    assert set(spec["metadata"]) <= {"labels", "annotations"}  # the only metadata a template spec may carry
    _keys(spec["spec"], "ResourceClaimSpec")
    _keys(spec["spec"]["devices"], "DeviceClaim")
    requests = spec["spec"]["devices"]["requests"]
    assert 1 <= len(requests) <= 32
    assert len({r["name"] for r in requests}) == len(requests)
    for request in requests:
        _keys(request, "DeviceRequest")
        assert DNS_LABEL.match(request["name"]) and len(request["name"]) <= 63
        exact = request["exactly"]
        _keys(exact, "ExactDeviceRequest")
        assert exact["deviceClassName"] in {names.MIG_CLASS, names.GPU_CLASS, names.SHARED_CLASS}
        assert isinstance(exact["count"], int) and exact["count"] > 0
        assert len(exact.get("selectors", [])) <= 32
        for selector in exact.get("selectors", []):
            _keys(selector, "DeviceSelector")
            _keys(selector["cel"], "CELDeviceSelector")
            assert 0 < len(selector["cel"]["expression"]) <= 10 * 1024
        if "capacity" in exact:
            _keys(exact["capacity"], "CapacityRequirements")
            for key, value in exact["capacity"]["requests"].items():
                assert key.startswith(names.DRIVER + "/"), key  # a qualified name, matched exactly
                assert units.parse_quantity(value) > 0
    for entry in claims.pod_claims:
        _keys(dict(entry), "PodResourceClaim")
        assert DNS_LABEL.match(entry["name"]) and entry["resourceClaimTemplateName"] == claims.template_name
    for container in claims.containers:
        for ref in container.claims:
            _keys(dict(ref), "ResourceClaim")
            assert ref["name"] in {e["name"] for e in claims.pod_claims}
            assert ref["request"] in {r["name"] for r in requests}


TYPES_GO = Path.home() / "go/pkg/mod/k8s.io/api@v0.37.2"


def _json_tags(path: Path, typ: str) -> set[str]:
    text = path.read_text(encoding="utf-8")
    body = re.search(r"^type " + typ + r" struct \{(.*?)^\}", text, re.S | re.M)
    assert body, typ
    code = "\n".join(line for line in body.group(1).splitlines() if not line.strip().startswith("//"))
    tags = set(re.findall(r'json:"([A-Za-z]*)[,"]', code))
    if "metav1.TypeMeta" in code:
        tags |= {"apiVersion", "kind"}
    return tags - {""}


@pytest.mark.skipif(not TYPES_GO.exists(), reason="k8s.io/api v0.37.2 is not in the Go module cache")
@pytest.mark.parametrize("typ", sorted(FIELDS))
def test_field_names_match_types_go(typ: str) -> None:
    group = "core" if typ in {"PodResourceClaim", "ResourceClaim"} else "resource"
    assert _json_tags(TYPES_GO / group / "v1" / "types.go", typ) == FIELDS[typ]


# ------------------------------------------------------------------ building
def test_wire_form_of_a_shared_request_field_by_field() -> None:
    claims = pod_claims("mps", [Ask(300, 20 * GiB)])
    template = claims.template("ml")
    assert template["apiVersion"] == "resource.k8s.io/v1"
    assert template["kind"] == "ResourceClaimTemplate"
    assert template["metadata"] == {"name": claims.template_name, "namespace": "ml",
                                    "labels": {"app.kubernetes.io/managed-by": "gpupack"}}
    assert re.fullmatch(r"gpupack-[0-9a-f]{10}", claims.template_name)
    assert template["spec"]["metadata"] == {"labels": {"app.kubernetes.io/managed-by": "gpupack"}}
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    assert request["name"] == "gpu-0"
    exact = request["exactly"]
    assert exact["deviceClassName"] == "gpupack-shared"
    assert exact["count"] == 1
    assert exact["selectors"] == [{"cel": {"expression": 'device.attributes["gpu.gpupack.io"].sharing == "mps"'}}]
    assert exact["capacity"] == {"requests": {"gpu.gpupack.io/milli": "300", "gpu.gpupack.io/memory": "20Gi"}}
    assert set(exact) == {"deviceClassName", "count", "selectors", "capacity"}
    assert claims.pod_claims == ({"name": "gpupack", "resourceClaimTemplateName": claims.template_name},)
    assert [(c.kind, c.index, c.claims) for c in claims.containers] == [
        ("containers", 0, ({"name": "gpupack", "request": "gpu-0"},))]


CASES: list[tuple[str, AllocationMode, Ask, dict[str, Any]]] = [
    ("mps", "mps", Ask(250, 10 * GiB),
     {"deviceClassName": "gpupack-shared", "count": 1,
      "selectors": [{"cel": {"expression": 'device.attributes["gpu.gpupack.io"].sharing == "mps"'}}],
      "capacity": {"requests": {"gpu.gpupack.io/milli": "250", "gpu.gpupack.io/memory": "10Gi"}}}),
    ("time-slicing", "time-slicing", Ask(500, None),
     {"deviceClassName": "gpupack-shared", "count": 1,
      "selectors": [{"cel": {"expression": 'device.attributes["gpu.gpupack.io"].sharing == "time-slicing"'}}],
      "capacity": {"requests": {"gpu.gpupack.io/milli": "500", "gpu.gpupack.io/memory": "1Gi"}}}),
    ("mig", "mig", Ask(400, None, "3g.40gb"),
     {"deviceClassName": "gpupack-mig", "count": 1,
      "selectors": [{"cel": {"expression": 'device.attributes["gpu.gpupack.io"].profile == "3g.40gb"'}}]}),
    ("mig-media", "mig", Ask(100, None, "1g.10gb+me"),
     {"deviceClassName": "gpupack-mig", "count": 1,
      "selectors": [{"cel": {"expression": 'device.attributes["gpu.gpupack.io"].profile == "1g.10gb+me"'}}]}),
    ("whole", "whole", Ask(1000, None), {"deviceClassName": "gpupack-gpu", "count": 1}),
    ("whole-with-memory", "whole", Ask(1000, 40 * GiB),
     {"deviceClassName": "gpupack-gpu", "count": 1,
      "selectors": [{"cel": {"expression":
                             'device.capacity["gpu.gpupack.io"].memory.compareTo(quantity("40Gi")) >= 0'}}]}),
]


@pytest.mark.parametrize(("mode", "ask", "exact"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_template_spec_per_mode(mode: AllocationMode, ask: Ask, exact: dict[str, Any]) -> None:
    claims = pod_claims(mode, [ask])
    assert requests_of(claims) == [{"name": "gpu-0", "exactly": exact}]
    check_api_shape(claims)
    assert check_claim(claims.template("ml"), largest_gpu_memory_bytes=H100) == ()


@pytest.mark.parametrize(("policy", "ask", "milli", "memory"), [
    (SharePolicy(), Ask(120, 3 * GiB + 1), "150", "4Gi"),
    (SharePolicy(), Ask(1, 1), "50", "1Gi"),
    (SharePolicy(), Ask(999, None), "1000", "1Gi"),
    (SharePolicy(milli_step=100, memory_step_bytes=2 * GiB), Ask(120, 3 * GiB), "200", "4Gi"),
    (SharePolicy(milli_step=1), Ask(123, 5 * GiB), "123", "5Gi"),
], ids=["default-120", "smallest", "rounds-to-whole", "step-100", "step-1"])
def test_shares_round_as_the_share_policy_does(policy: SharePolicy, ask: Ask, milli: str, memory: str) -> None:
    (request,) = requests_of(pod_claims("mps", [ask], policy))
    assert request["exactly"]["capacity"]["requests"] == {names.MILLI: milli, names.MEMORY: memory}


def test_identical_shapes_share_a_template() -> None:
    one = pod_claims("mps", [Ask(120, 20 * GiB)])
    # 150 consumes the same as 120, and container names and positions are not part of the shape
    two = pod_claims("mps", [ContainerDecision("containers", 3, "trainer", 150, 20 * GiB, "x")])
    assert one.template_name == two.template_name and one.template_spec == two.template_spec


@pytest.mark.parametrize(("mode", "asks"), [
    ("mps", [Ask(300, 20 * GiB)]),
    ("time-slicing", [Ask(200, 20 * GiB)]),
    ("mps", [Ask(200, 21 * GiB)]),
    ("mps", [Ask(200, 20 * GiB), Ask(200, 20 * GiB)]),
    ("mig", [Ask(200, None, "2g.20gb")]),
    ("whole", [Ask(1000)]),
], ids=["milli", "mode", "memory", "two-containers", "mig", "whole"])
def test_different_shapes_get_different_templates(mode: AllocationMode, asks: list[Ask]) -> None:
    base = pod_claims("mps", [Ask(200, 20 * GiB)]).template_name
    assert pod_claims(mode, asks).template_name != base


def test_two_containers_get_two_requests_and_their_own_claims() -> None:
    asks = [Ask(100, 2 * GiB, kind="initContainers", index=0), Ask(300, 8 * GiB, index=1)]
    claims = pod_claims("mps", asks)
    assert [r["name"] for r in requests_of(claims)] == ["gpu-0", "gpu-1"]
    assert [r["exactly"]["capacity"]["requests"][names.MILLI] for r in requests_of(claims)] == ["100", "300"]
    assert [(c.kind, c.index, c.claims) for c in claims.containers] == [
        ("initContainers", 0, ({"name": POD_CLAIM, "request": "gpu-0"},)),
        ("containers", 1, ({"name": POD_CLAIM, "request": "gpu-1"},)),
    ]
    assert len(claims.pod_claims) == 1
    check_api_shape(claims)


@pytest.mark.parametrize(("mode", "asks"), [
    ("mig", [Ask(100, None, None)]),
    ("mig", [Ask(100, None, "9g.900gb")]),
    ("mps", []),
], ids=["mig-without-profile", "mig-unknown-profile", "no-containers"])
def test_building_refuses_what_a_decision_never_makes(mode: AllocationMode, asks: list[Ask]) -> None:
    with pytest.raises(DraModelError):
        pod_claims(mode, asks)


# ------------------------------------------------------------------ checking users' claims
def claim(*exacts: dict[str, Any], first_available: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    requests: list[dict[str, Any]] = [{"name": f"r{n}", "exactly": e} for n, e in enumerate(exacts)]
    if first_available is not None:
        requests.append({"name": "alt", "firstAvailable": first_available})
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "mine"},
            "spec": {"devices": {"requests": requests}}}


def shared(**requests: str) -> dict[str, Any]:
    return {"deviceClassName": "gpupack-shared",
            "capacity": {"requests": {names.qualified(k): v for k, v in requests.items()}}}


REFUSALS: list[tuple[str, dict[str, Any], Reason | ClaimReason, str]] = [
    ("milli-above", claim(shared(milli="1500")), Reason.MILLI_OUT_OF_RANGE,
     "request 'r0': gpu.gpupack.io/milli='1500' is outside 1..1000 (1000 = one whole GPU; "
     "for more than one GPU ask for gpupack-gpu with a count instead)"),
    ("milli-zero", claim(shared(milli="0")), Reason.MILLI_OUT_OF_RANGE,
     "request 'r0': gpu.gpupack.io/milli='0' is outside 1..1000 (1000 = one whole GPU; "
     "for more than one GPU ask for gpupack-gpu with a count instead)"),
    ("milli-fraction", claim(shared(milli="250m")), Reason.MILLI_OUT_OF_RANGE,
     "request 'r0': gpu.gpupack.io/milli='250m' is not a whole number; it counts thousandths of a GPU, "
     "so ask for an integer in 1..1000 (e.g. 250 for a quarter GPU)"),
    ("milli-garbage", claim(shared(milli="lots")), Reason.INVALID_QUANTITY,
     "request 'r0': gpu.gpupack.io/milli: "),
    ("memory-fraction", claim(shared(memory="0.5")), Reason.INVALID_QUANTITY,
     "request 'r0': gpu.gpupack.io/memory='0.5' must be a positive whole number of bytes such as '20Gi'"),
    ("memory-too-large", claim(shared(milli="100", memory="100Gi")), Reason.MEMORY_TOO_LARGE,
     "request 'r0': gpu.gpupack.io/memory asks for 100Gi of GPU memory; the largest GPU in the cluster has 79.65Gi"),
    ("memory-too-large-whole", claim({"deviceClassName": "gpupack-gpu",
                                      "capacity": {"requests": {names.MEMORY: "90Gi"}}}), Reason.MEMORY_TOO_LARGE,
     "request 'r0': gpu.gpupack.io/memory asks for 90Gi of GPU memory; the largest GPU in the cluster has 79.65Gi"),
    ("memory-off-step", claim(shared(memory="79.5Gi")), ClaimReason.CAPACITY_OFF_STEP,
     "request 'r0': gpu.gpupack.io/memory='79.5Gi' rounds up to 80Gi in units of 1Gi, more than the largest "
     "shared GPU serves (79Gi, whole units of its 79.65Gi)"),
    ("short-capacity-name", claim({"deviceClassName": "gpupack-shared", "capacity": {"requests": {"milli": "300"}}}),
     Reason.UNKNOWN_RESOURCE,
     "request 'r0': unknown capacity 'milli' for device class gpupack-shared; valid capacities: "
     "gpu.gpupack.io/milli, gpu.gpupack.io/memory"),
    ("milli-on-mig", claim({"deviceClassName": "gpupack-mig", "capacity": {"requests": {names.MILLI: "300"}}}),
     Reason.UNKNOWN_RESOURCE,
     "request 'r0': unknown capacity 'gpu.gpupack.io/milli' for device class gpupack-mig; valid capacities: "
     "gpu.gpupack.io/memory"),
    ("shared-count", claim({**shared(milli="300"), "count": 2}), ClaimReason.SHARED_COUNT,
     "request 'r0': a request of gpupack-shared takes a share of one GPU, so its count must be 1 (got count 2); "
     "for several GPUs use one request per share, or gpupack-gpu with a count"),
    ("shared-all", claim({**shared(milli="300"), "allocationMode": "All"}), ClaimReason.SHARED_COUNT,
     "request 'r0': a request of gpupack-shared takes a share of one GPU, so its count must be 1 "
     "(got allocationMode All); for several GPUs use one request per share, or gpupack-gpu with a count"),
    ("unknown-profile", claim({"deviceClassName": "gpupack-mig", "selectors": [
        {"cel": {"expression": "device.attributes['gpu.gpupack.io'].profile == '3g.50gb'"}}]}),
     ClaimReason.UNKNOWN_PROFILE, "request 'r0': unknown MIG profile '3g.50gb'; valid profiles: 1g.10gb, "),
    ("profile-on-shared", claim({"deviceClassName": "gpupack-shared", "selectors": [
        {"cel": {"expression": 'device.attributes["gpu.gpupack.io"]["profile"] == "1g.10gb"'}}]}),
     ClaimReason.PROFILE_NOT_MIG,
     "request 'r0': selects MIG profile '1g.10gb' in device class gpupack-shared; only gpupack-mig devices "
     "have a gpu.gpupack.io/profile attribute"),
    ("first-available", claim(first_available=[{"name": "big", **shared(milli="2000")}]), Reason.MILLI_OUT_OF_RANGE,
     "request 'alt/big': gpu.gpupack.io/milli='2000' is outside 1..1000"),
]


@pytest.mark.parametrize(("obj", "reason", "message"), [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS])
def test_refusals_name_the_request_and_the_rule(obj: dict[str, Any], reason: Reason | ClaimReason, message: str) -> None:
    (problem,) = check_claim(obj, largest_gpu_memory_bytes=H100)
    assert problem.reason == reason
    assert str(problem).startswith(message)


def test_the_same_words_as_the_pod_webhook() -> None:
    from sharing.api.request import AdmissionRefusal, parse_milli, parse_memory

    for value, check in (("1500", parse_milli), ("250m", parse_milli), ("0.5", parse_memory)):
        with pytest.raises(AdmissionRefusal) as pod:
            check(value, container="c")
        key = names.MILLI if check is parse_milli else names.MEMORY
        (problem,) = check_claim(claim({"deviceClassName": "gpupack-shared", "capacity": {"requests": {key: value}}}))
        assert problem.reason == pod.value.reason
        pod_words = pod.value.message.split("=", 1)[1]
        if check is parse_milli and value == "1500":  # the advice differs: nvidia.com/gpu vs gpupack-gpu
            pod_words = pod_words.split(";")[0]
        assert pod_words in problem.message


def test_a_template_is_checked_like_a_claim_and_every_problem_is_reported() -> None:
    template = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "spec": {"spec": claim(shared(milli="1500"), {**shared(memory="0"), "count": 3})["spec"]}}
    problems = check_claim(template)
    assert [p.reason for p in problems] == [Reason.MILLI_OUT_OF_RANGE, Reason.INVALID_QUANTITY, ClaimReason.SHARED_COUNT]


@pytest.mark.parametrize("obj", [
    claim({"deviceClassName": "nvidia-gpu", "count": 9, "capacity": {"requests": {"milli": "5000"}}}),
    claim(shared(milli="300", memory="20Gi")),
    claim({"deviceClassName": "gpupack-shared"}),
    claim({"deviceClassName": "gpupack-gpu", "count": 3}),
    claim({"deviceClassName": "gpupack-mig", "count": 1, "selectors": [
        {"cel": {"expression": 'device.attributes["gpu.gpupack.io"].profile == "7g.80gb"'}}]}),
    {"kind": "ResourceClaim", "spec": "nonsense"},
    {},
], ids=["other-class", "good-share", "defaults", "three-gpus", "one-mig", "malformed-spec", "empty"])
def test_what_is_admitted(obj: dict[str, Any]) -> None:
    assert check_claim(obj, largest_gpu_memory_bytes=H100) == ()


@pytest.mark.parametrize(("exact", "why"), [
    ({"deviceClassName": "gpupack-mig", "count": 4}, "takes one MIG placement, so its count must be 1 (got count 4)"),
    ({"deviceClassName": "gpupack-mig", "count": 20}, "(got count 20)"),
    ({"deviceClassName": "gpupack-mig", "allocationMode": "All"}, "(got allocationMode All)"),
    ({"deviceClassName": "gpupack-gpu", "allocationMode": "All"}, "counts whole GPUs, 1..8"),
    ({"deviceClassName": "gpupack-gpu", "count": 9}, "1..8 (the most one node of the DRA pool has); got count 9"),
    ({"deviceClassName": "gpupack-gpu", "count": 0}, "got count 0"),
])
def test_counts_are_bounded_on_every_class(exact: dict[str, Any], why: str) -> None:
    """Issue 33, item 3: only gpupack-shared's count was bounded; one pod got 4 (or 20) MIG placements."""
    (problem,) = check_claim(claim(exact), bounds=ClaimBounds(most_gpus=8))
    assert problem.reason == ClaimReason.DEVICE_COUNT and why in problem.message


def _mig(profile: str) -> dict[str, Any]:
    return {"deviceClassName": "gpupack-mig", "selectors": [
        {"cel": {"expression": f'device.attributes["gpu.gpupack.io"].profile == "{profile}"'}}]}


def _share(mode: str) -> dict[str, Any]:
    return {"deviceClassName": "gpupack-shared", "selectors": [
        {"cel": {"expression": f'device.attributes["gpu.gpupack.io"].sharing == "{mode}"'}}]}


@pytest.mark.parametrize(("exact", "policy", "reason", "why"), [
    (_mig("2g.20gb"), AdmissionPolicy("p", allowed_modes=("mps",)), Reason.MODE_FORBIDDEN,
     "device class gpupack-mig gives mig, which SharingPolicy 'p' does not allow in this namespace (allowed modes: mps)"),
    (_mig("7g.80gb"), AdmissionPolicy("p", allowed_profiles=("1g.10gb",)), ClaimReason.PROFILE_FORBIDDEN,
     "MIG profile '7g.80gb' is not allowed in this namespace"),
    (_share("time-slicing"), AdmissionPolicy("p", allowed_modes=("mps",)), Reason.MODE_FORBIDDEN,
     "gives time-slicing"),
    ({"deviceClassName": "gpupack-shared"}, AdmissionPolicy("p", allowed_modes=("mig",)), Reason.MODE_FORBIDDEN,
     "gives mps or time-slicing"),
    ({"deviceClassName": "gpupack-gpu"}, AdmissionPolicy("p", allowed_modes=("mig",)), Reason.MODE_FORBIDDEN,
     "device class gpupack-gpu gives mps or time-slicing"),
])
def test_the_namespaces_policy_bounds_its_claims(exact: dict[str, Any], policy: AdmissionPolicy,
                                                 reason: object, why: str) -> None:
    (problem,) = check_claim(claim(exact), bounds=ClaimBounds(policy))
    assert problem.reason == reason and why in problem.message


@pytest.mark.parametrize(("exact", "policy"), [
    (_mig("2g.20gb"), AdmissionPolicy("p", allowed_modes=("mig",), allowed_profiles=("2g.20gb",))),
    (_share("mps"), AdmissionPolicy("p", allowed_modes=("mps",))),
    ({"deviceClassName": "gpupack-gpu", "count": 2}, AdmissionPolicy("p", allowed_modes=("time-slicing",))),
])
def test_claims_the_namespaces_policy_allows_pass(exact: dict[str, Any], policy: AdmissionPolicy) -> None:
    assert check_claim(claim(exact), bounds=ClaimBounds(policy)) == ()


def test_profiles_can_be_narrowed_to_the_clusters_gpus() -> None:
    obj = claim({"deviceClassName": "gpupack-mig", "selectors": [
        {"cel": {"expression": 'device.attributes["gpu.gpupack.io"].profile == "1g.5gb"'}}]})
    assert check_claim(obj) == ()
    (problem,) = check_claim(obj, profiles={"1g.10gb", "3g.40gb"})
    assert problem.message == "request 'r0': unknown MIG profile '1g.5gb'; valid profiles: 1g.10gb, 3g.40gb"


def test_the_docs_example_is_what_the_code_builds() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs/dra.md").read_text(encoding="utf-8")
    section = text.split("## Claims from pod requests", 1)[1]
    claims = pod_claims("mps", [Ask(120, 20 * GiB)])
    assert f"name: {claims.template_name}, namespace: ml" in section
    assert 'gpu.gpupack.io/milli: "150", gpu.gpupack.io/memory: 20Gi' in section
