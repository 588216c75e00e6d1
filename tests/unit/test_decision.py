"""Mode choice and per-container decisions against small, readable inventories."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from mig.catalog import get_model
from mig.fit import smallest_covering_profile
from sharing.admission.decision import MPS_MEMORY_ENV, MPS_THREADS_ENV, decide
from sharing.api.allocation import Allocation
from sharing.admission.inventory import Inventory, build_inventory
from sharing.api.keys import CAPACITY_GATE, SHARED_RESOURCE, STRATEGY_LABEL
from sharing.api.request import AdmissionRefusal, Reason, parse_pod
from gpupack.testing.admission_reviews import gpu_container, make_pod

ROOT = Path(__file__).resolve().parents[2]
H100 = "NVIDIA-H100-80GB-HBM3"
A100 = "NVIDIA-A100-SXM4-80GB"


def mig_node(name: str, product: str, instances: list[tuple[str, int, bool]], gpus: int = 1) -> dict[str, Any]:
    model = get_model(product)
    return {
        "kind": "GPUNode",
        "metadata": {"name": name},
        "status": {
            "product": product,
            "gpus": [
                {
                    "index": i,
                    "uuid": f"GPU-{i}",
                    "product": product,
                    "memoryMiB": model.memory_mib,
                    "migEnabled": True,
                    "instances": [
                        {"profile": p, "start": s, "size": model.profile(p).memory_slices, "inUse": used}
                        for p, s, used in instances
                    ],
                }
                for i in range(gpus)
            ],
        },
    }


def shared_node(name: str, mode: str, replicas: int, product: str = A100, gpus: int = 4) -> dict[str, Any]:
    return {
        "kind": "GPUNode",
        "metadata": {"name": name},
        "status": {
            "product": product,
            "gpus": [{"index": i, "uuid": f"GPU-{i}", "product": product, "memoryMiB": 81920} for i in range(gpus)],
            "sharing": {"mode": mode, "replicas": replicas},
        },
    }


def policy(name: str, rules: list[dict[str, Any]] | None = None, **spec: Any) -> dict[str, Any]:
    return {"kind": "SharingPolicy", "metadata": {"name": name}, "spec": {"namespaces": rules or [], **spec}}


@pytest.fixture(scope="module")
def example() -> Inventory:
    return build_inventory(yaml.safe_load((ROOT / "examples" / "inventory.yaml").read_text()))


def run(pod: dict[str, Any], inventory: Inventory, namespace: str = "default"):  # type: ignore[no-untyped-def]
    request = parse_pod(pod, namespace)
    assert request is not None
    return decide(request, inventory.policy_for(request.namespace), inventory)


def refused(pod: dict[str, Any], inventory: Inventory) -> AdmissionRefusal:
    with pytest.raises(AdmissionRefusal) as info:
        run(pod, inventory)
    return info.value


BALANCED = [("2g.20gb", 0, False), ("1g.10gb", 2, False), ("1g.10gb", 3, False), ("3g.40gb", 4, False)]


@pytest.mark.parametrize(
    ("milli", "memory", "profile"),
    [
        ("100", None, "1g.10gb"),  # 1/7 covers 100 milli
        ("150", None, "2g.20gb"),  # needs 2 of 7 compute slices
        ("140", "9Gi", "1g.10gb"),
        ("140", "10Gi", "1g.20gb"),  # 1g.10gb holds only 9.75 GiB: 1 slice, 2 memory slices
        ("250", "10Gi", "2g.20gb"),
        ("300", "20Gi", "3g.40gb"),  # 2g.20gb holds 19.6 GiB, not 20 GiB
        ("500", None, "4g.40gb"),
        ("1000", None, "7g.80gb"),
    ],
)
def test_explicit_mig_picks_least_waste_covering_profile(milli: str, memory: str | None, profile: str) -> None:
    inventory = build_inventory([mig_node("n", H100, BALANCED)])
    decision = run(make_pod(gpu_container("c", milli, memory), mode="mig"), inventory)
    assert decision.mode == "mig"
    assert decision.containers[0].profile == profile
    assert decision.containers[0].resource == f"nvidia.com/mig-{profile}"
    assert decision.gpu_model == H100


def test_free_instance_means_no_gate_and_product_affinity() -> None:
    inventory = build_inventory([mig_node("n", H100, BALANCED)])
    decision = run(make_pod(gpu_container("c", "100"), mode="mig"), inventory)
    assert not decision.gated
    assert [[e.to_dict() for e in t] for t in decision.terms] == [
        [{"key": "nvidia.com/gpu.product", "operator": "In", "values": [H100]}, {"key": "gpupack.io/gpu-degraded", "operator": "DoesNotExist"}]
    ]


def test_no_free_instance_of_the_profile_gates() -> None:
    busy = [(p, s, True) for p, s, _ in BALANCED]
    inventory = build_inventory([mig_node("n", H100, busy)])
    decision = run(make_pod(gpu_container("c", "100"), mode="mig"), inventory)
    assert decision.gated and decision.containers[0].profile == "1g.10gb"
    assert CAPACITY_GATE in decision.reason


def test_mig_prefers_model_with_capacity_over_less_waste() -> None:
    # H100 has no free 1g.10gb; the A100 (also 1g.10gb for this ask) has one.
    nodes = [
        mig_node("h", H100, [("1g.10gb", 0, True)]),
        mig_node("a", A100, [("1g.10gb", 0, False)]),
    ]
    decision = run(make_pod(gpu_container("c", "100"), mode="mig"), build_inventory(nodes))
    assert not decision.gated and decision.gpu_model == A100
    # Both products offer 1g.10gb, so either may host it.
    assert decision.terms[0][0].values == (A100, H100)


def test_multi_container_pod_needs_capacity_on_one_node() -> None:
    one_free = [("1g.10gb", 0, False), ("1g.10gb", 1, True)]
    inventory = build_inventory([mig_node("n1", H100, one_free), mig_node("n2", H100, one_free)])
    pod = make_pod(gpu_container("a", "100"), gpu_container("b", "100"), mode="mig")
    decision = run(pod, inventory)
    assert decision.gated  # two free 1g.10gb exist, but on different nodes
    assert [c.profile for c in decision.containers] == ["1g.10gb", "1g.10gb"]


def test_mps_decision_sets_limits_env_and_affinity(example: Inventory) -> None:
    decision = run(make_pod(gpu_container("c", "250", "16Gi"), mode="mps"), example)
    assert decision.mode == "mps" and not decision.gated and decision.replicas == 4
    container = decision.containers[0]
    assert container.resource == SHARED_RESOURCE
    assert dict(container.env) == {MPS_THREADS_ENV: "25", MPS_MEMORY_ENV: "0=16384M"}
    keys = {e.key: e.values for e in decision.terms[0]}
    assert keys == {
        "nvidia.com/gpu.sharing-strategy": ("mps",),
        "nvidia.com/gpu.replicas": ("4",),
        "nvidia.com/gpu.product": (A100,),
        "gpupack.io/gpu-degraded": (),  # nodes with a GPU fault the device plugin keeps advertising
    }


def test_mps_replicas_too_coarse_for_the_ask_gates(example: Inventory) -> None:
    # 4 replicas give 250 milli each; 300 milli needs a node with at most 3.
    decision = run(make_pod(gpu_container("c", "300"), mode="mps"), example)
    assert decision.gated and decision.mode == "mps"
    assert [e.to_dict() for e in decision.terms[0]] == [
        {"key": "nvidia.com/gpu.sharing-strategy", "operator": "In", "values": ["mps"]}, {"key": "gpupack.io/gpu-degraded", "operator": "DoesNotExist"}
    ]


def test_time_slicing_has_no_mps_env(example: Inventory) -> None:
    decision = run(make_pod(gpu_container("c", "200"), mode="time-slicing"), example)
    assert decision.mode == "time-slicing" and decision.containers[0].env == ()
    assert decision.containers[0].resource == SHARED_RESOURCE


def test_auto_picks_least_waste(example: Inventory) -> None:
    # 250 milli + 20 GB: an MPS quarter of an 80 GB A100 fits exactly; MIG would need 3g.40gb.
    assert run(make_pod(gpu_container("c", "250", "20G")), example).mode == "mps"
    # 100 milli: 1g.10gb (1/7) wastes less than a quarter GPU.
    assert run(make_pod(gpu_container("c", "100")), example).mode == "mig"


def test_auto_ties_go_to_stronger_isolation() -> None:
    nodes = [shared_node("m", "mps", 4), shared_node("t", "time-slicing", 4)]
    assert run(make_pod(gpu_container("c", "250")), build_inventory(nodes)).mode == "mps"


def test_policy_forbids_explicit_mode() -> None:
    inventory = build_inventory(
        [mig_node("n", H100, BALANCED), policy("strict", [{"names": ["default"], "allowedModes": ["mig"]}])]
    )
    error = refused(make_pod(gpu_container(), mode="mps"), inventory)
    assert error.reason == Reason.MODE_FORBIDDEN
    assert "'strict'" in error.message and "allowed modes: mig" in error.message


def test_policy_limits_auto_choice(example: Inventory) -> None:
    objects = yaml.safe_load((ROOT / "examples" / "inventory.yaml").read_text())
    inventory = build_inventory(objects + [policy("p", [{"names": ["default"], "allowedModes": ["time-slicing"]}])])
    assert run(make_pod(gpu_container("c", "250", "20G")), inventory).mode == "time-slicing"


def test_namespace_outside_every_rule_gets_no_mode() -> None:
    inventory = build_inventory([mig_node("n", H100, BALANCED), policy("p", [{"names": ["team-a"], "allowedModes": ["mig"]}])])
    error = refused(make_pod(gpu_container()), inventory)
    assert error.reason == Reason.MODE_FORBIDDEN
    assert "every sharing mode is forbidden in namespace 'default'" in error.message


def test_namespace_selector_rules_use_namespace_labels() -> None:
    objects = [
        mig_node("n", H100, BALANCED),
        policy("p", [{"selector": {"matchLabels": {"gpu": "yes"}}, "allowedModes": ["mig"]}]),
        {"kind": "Namespace", "metadata": {"name": "default", "labels": {"gpu": "yes"}}},
    ]
    assert run(make_pod(gpu_container()), build_inventory(objects)).mode == "mig"
    objects[2] = {"kind": "Namespace", "metadata": {"name": "default", "labels": {"gpu": "no"}}}
    assert refused(make_pod(gpu_container()), build_inventory(objects)).reason == Reason.MODE_FORBIDDEN


def test_allowed_profiles_and_default_memory_apply() -> None:
    objects = [mig_node("n", H100, BALANCED), policy("p", allowedProfiles=["3g.40gb"], defaultGpuMemory="10Gi")]
    decision = run(make_pod(gpu_container("c", "100"), mode="mig"), build_inventory(objects))
    assert decision.containers[0].profile == "3g.40gb"
    assert decision.containers[0].memory_bytes == 10 * 2**30


def test_memory_larger_than_any_gpu_refused(example: Inventory) -> None:
    error = refused(make_pod(gpu_container("c", "500", "100Gi")), example)
    assert error.reason == Reason.MEMORY_TOO_LARGE
    assert "100Gi" in error.message and "80Gi" in error.message


def test_mig_request_no_model_can_satisfy() -> None:
    inventory = build_inventory([shared_node("m", "mps", 2)])
    inventory_no_mig = build_inventory([shared_node("m", "mps", 2, product="NVIDIA-L4")])
    error = refused(make_pod(gpu_container(), mode="mig"), inventory_no_mig)
    assert error.reason == Reason.NO_MIG_MODEL and "no MIG-capable GPUs" in error.message
    # A100 80GB is MIG-capable, but nothing covers 1000 milli with 80 GiB (7g.80gb holds 78.75 GiB).
    error = refused(make_pod(gpu_container("c", "1000", "80Gi"), mode="mig"), inventory)
    assert error.reason == Reason.NO_MIG_MODEL and A100 in error.message


def test_auto_with_nothing_that_fits_refused() -> None:
    inventory = build_inventory([shared_node("m", "mps", 4, product="NVIDIA-L4")])
    error = refused(make_pod(gpu_container("c", "600")), inventory)
    assert error.reason == Reason.NO_COMPATIBLE_NODES


def test_decisions_are_memoised_per_snapshot(example: Inventory) -> None:
    first = run(make_pod(gpu_container("c", "100"), name="a"), example)
    second = run(make_pod(gpu_container("other", "100"), name="b"), example)
    assert first.containers[0].resource == second.containers[0].resource
    assert second.containers[0].name == "other"  # names come from the pod, not the cache


@given(
    milli=st.integers(min_value=1, max_value=1000),
    memory_gib=st.one_of(st.none(), st.integers(min_value=1, max_value=78)),
)
@settings(max_examples=150, deadline=None)
def test_chosen_mig_profile_always_covers_the_ask(milli: int, memory_gib: int | None) -> None:
    inventory = build_inventory([mig_node("n", H100, BALANCED)])
    memory = None if memory_gib is None else f"{memory_gib}Gi"
    decision = run(make_pod(gpu_container("c", str(milli), memory), mode="mig"), inventory)
    model = get_model(H100)
    profile = model.profile(decision.containers[0].profile or "")
    assert profile.compute_slices * 1000 >= milli * model.compute_slices
    if memory_gib is not None:
        assert profile.memory_mib * 2**20 >= memory_gib * 2**30
    # and no smaller (fewer memory slices) profile would have covered it
    for other in model.profiles:
        if other.memory_slices < profile.memory_slices and not other.media_extensions:
            covers = other.compute_slices * 1000 >= milli * model.compute_slices and (
                memory_gib is None or other.memory_mib * 2**20 >= memory_gib * 2**30
            )
            assert not covers, (other.name, profile.name)


@given(
    product=st.sampled_from([H100, A100, "NVIDIA-A30", "NVIDIA-H200", "NVIDIA-B200"]),
    milli=st.integers(min_value=1, max_value=1000),
    memory_mib=st.one_of(st.none(), st.integers(min_value=1, max_value=180_000)),
)
@settings(max_examples=200, deadline=None)
def test_profile_choice_agrees_with_mig_fit(product: str, milli: int, memory_mib: int | None) -> None:
    """Without a policy filter, the least-waste profile is the mig package's smallest covering one."""
    from sharing.admission.decision import covering_profile
    from sharing.admission.inventory import DEFAULT_POLICY

    model = get_model(product)
    memory = None if memory_mib is None else memory_mib * 2**20
    ours = covering_profile(model, milli, memory, DEFAULT_POLICY)
    theirs = smallest_covering_profile(model, milli, memory or 0)
    if theirs is not None and theirs.media_extensions:
        theirs = None  # gpupack never hands out +me instances (see covering_profile)
    assert (ours.name if ours else None) == (theirs.name if theirs else None)


@pytest.mark.parametrize(
    ("roles", "peak"),
    [
        (("app", "app"), 2),
        (("init", "app"), 1),  # the init container's device is handed on
        (("init", "init", "app"), 1),
        (("sidecar", "app"), 2),  # a sidecar keeps its device
        (("sidecar", "init"), 2),  # the init container runs beside the sidecar
        (("init",), 1),
    ],
)
def test_peak_devices(roles: tuple[str, ...], peak: int) -> None:
    from sharing.admission.decision import peak_devices

    assert peak_devices(["r"] * len(roles), roles) == {"r": peak}  # type: ignore[arg-type]


def test_init_container_reuses_the_app_containers_instance() -> None:
    one_free = [("1g.10gb", 0, False)]
    inventory = build_inventory([mig_node("n", H100, one_free)])
    plain = make_pod(gpu_container("app", "100"), init=[gpu_container("warm", "100")], mode="mig")
    assert not run(plain, inventory).gated
    sidecar = make_pod(gpu_container("app", "100"), init=[gpu_container("side", "100", restartPolicy="Always")], mode="mig")
    assert run(sidecar, inventory).gated  # two instances at once, one free


# --- whole GPUs for requests above half a GPU, and the engine's gate -------------


def test_a_600_milli_shared_request_gets_a_plain_whole_gpu() -> None:
    inventory = build_inventory([shared_node("m", "mps", 4), shared_node("w", "none", 1)])
    decision = run(make_pod(gpu_container("c", "600"), mode="mps"), inventory)
    assert decision.mode == "whole" and decision.capacity_exists
    (container,) = decision.containers
    assert container.resource == "nvidia.com/gpu" and container.env == ()
    ((expression, healthy),) = decision.terms
    assert (expression.key, expression.operator, expression.values) == (STRATEGY_LABEL, "NotIn", ("mps", "time-slicing"))
    assert (healthy.key, healthy.operator) == ("gpupack.io/gpu-degraded", "DoesNotExist")
    record = Allocation.from_annotation(decision.allocation().to_annotation())  # as the controller reads it
    assert record.mode == "whole" and record.containers[0].milli == 600


def test_memory_beyond_half_a_gpu_also_means_a_whole_gpu() -> None:
    inventory = build_inventory([shared_node("m", "mps", 2), shared_node("w", "none", 1)])
    assert run(make_pod(gpu_container("c", "300", memory="50Gi"), mode="mps"), inventory).mode == "whole"
    assert run(make_pod(gpu_container("c", "300", memory="30Gi"), mode="mps"), inventory).mode == "mps"


def test_whole_request_without_whole_nodes_waits_when_explicit_and_is_refused_in_auto() -> None:
    inventory = build_inventory([shared_node("m", "mps", 4, product="NVIDIA-L4")])
    explicit = run(make_pod(gpu_container("c", "700"), mode="mps"), inventory)
    assert explicit.mode == "whole" and explicit.gated and not explicit.capacity_exists
    error = refused(make_pod(gpu_container("c", "700")), inventory)
    assert "no node hands out whole GPUs" in error.message


@pytest.mark.parametrize("engine_places", [True, False])
def test_engine_placement_gates_pods_whose_capacity_exists(engine_places: bool) -> None:
    inventory = build_inventory([shared_node("m", "mps", 4)])
    request = parse_pod(make_pod(gpu_container("c", "200"), mode="mps"), "default")
    assert request is not None
    decision = decide(request, inventory.policy_for("default"), inventory, engine_places=engine_places)
    assert decision.capacity_exists and decision.gated is engine_places
    record = Allocation.from_annotation(decision.allocation().to_annotation())
    assert record.capacity_existed is True and record.gated is engine_places
    assert ("packing engine chooses its node" in decision.reason) is engine_places


def test_under_engine_placement_a_shared_pods_affinity_names_only_its_mode(example: Inventory) -> None:
    """The engine chooses the node and with it the split, so the webhook's terms must not hold the
    pod to the splits and products that share now (a gated pod's affinity can never be widened)."""
    request = parse_pod(make_pod(gpu_container("c", "250", "16Gi"), mode="mps"), "default")
    assert request is not None
    by_scheduler = decide(request, example.policy_for("default"), example, engine_places=False)
    assert "nvidia.com/gpu.replicas" in {e.key for e in by_scheduler.terms[0]} and by_scheduler.replicas == 4
    by_engine = decide(request, example.policy_for("default"), example, engine_places=True)
    assert [[e.to_dict() for e in term] for term in by_engine.terms] == [[
        {"key": "nvidia.com/gpu.sharing-strategy", "operator": "In", "values": ["mps"]},
        {"key": "gpupack.io/gpu-degraded", "operator": "DoesNotExist"}]]
    assert by_engine.replicas is None and by_engine.gated and by_engine.capacity_exists
    assert Allocation.from_annotation(by_engine.allocation().to_annotation()).replicas is None
    assert "packing engine chooses the node and its split" in by_engine.reason


# --- pods that no node could ever hold are refused, not gated forever ------------------------------


def test_more_mig_slices_than_any_node_has_is_refused(example: Inventory) -> None:
    """57 containers each needing a 1g slice, when no node holds more than 8 GPUs x 7."""
    fits = make_pod(*(gpu_container(f"c{i}", "100") for i in range(56)), mode="mig")
    assert run(fits, example).mode == "mig"  # 56 is what the H100 node can hold: admitted
    too_many = make_pod(*(gpu_container(f"c{i}", "100") for i in range(57)), mode="mig")
    refusal = refused(too_many, example)
    assert refusal.reason == Reason.POD_NEVER_FITS
    assert "57 x 1g.10gb at once" in refusal.message and "8 such GPUs" in refusal.message


def test_more_replicas_than_any_node_could_offer_is_refused() -> None:
    inventory = build_inventory([shared_node("a", "mps", 4, gpus=4), shared_node("b", "mps", 2, gpus=2)])
    # 100 milli fits an 8-way split: 4 GPUs x 8 = 32 replicas at most, on the largest node.
    assert run(make_pod(*(gpu_container(f"c{i}", "100") for i in range(32)), mode="mps"), inventory).mode == "mps"
    refusal = refused(make_pod(*(gpu_container(f"c{i}", "100") for i in range(40)), mode="mps"), inventory)
    assert refusal.reason == Reason.POD_NEVER_FITS and "40 replicas at once" in refusal.message
    # Larger asks split less finely: 300 milli fits at most 3 per GPU, so 13 can never fit on 4 GPUs.
    refusal = refused(make_pod(*(gpu_container(f"c{i}", "300") for i in range(13)), mode="mps"), inventory)
    assert refusal.reason == Reason.POD_NEVER_FITS and "more than 12" in refusal.message


def test_more_whole_gpus_than_any_node_has_is_refused() -> None:
    inventory = build_inventory([shared_node("a", "none", 1, gpus=4)])
    refusal = refused(make_pod(*(gpu_container(f"c{i}", "600") for i in range(5))), inventory)
    assert refusal.reason == Reason.POD_NEVER_FITS and "5 whole GPUs at once; the largest node has 4" in refusal.message
