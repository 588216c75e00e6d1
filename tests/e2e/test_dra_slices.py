"""gpupack's DRA device model on the real control plane: kube-apiserver stores the slices,
kube-scheduler allocates the claims.

There is no kubelet and no gpupack agent here: the test publishes, as the admin,
the ResourceSlices ``sharing.dra`` builds for a Node it creates (status patched
Ready, as ``gpupack.demo.stack`` does), applies ``manifests/dra``, and creates
ResourceClaims and pods that use them. kube-scheduler's DRA plugin allocates a
claim before it binds the pod, so a bound pod and ``status.allocation`` on its
claim are the end of the road (the pod stays Pending: no kubelet runs it).

What is checked:

* the API server keeps every field gpupack sends: the two beta features the
  model needs (``DRAPartitionableDevices``: ``sharedCounters``/``consumesCounters``;
  ``DRAConsumableCapacity``: ``allowMultipleAllocations``/``requestPolicy``) are on
  by default in v1.37; had one been off, the fields would have been dropped
  without an error;
* it refuses what ``sharing.dra.validate`` refuses, for the same rule;
* MIG claims get non-overlapping placements, and the counters send a full
  profile to the other GPU once two 3g instances sit on the first;
* shared claims consume exactly the capacity they ask, rounded up to the share
  unit, and no more than the GPU has;
* a burst of concurrent claims never overcommits a GPU's counters and leaves
  pending only claims that fit nowhere.

Each test labels its Nodes with a run id and pins its pods to that label, so
tests sharing the control plane never see each other's devices.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient

from mig.catalog import get_model
from mig.geometry import can_add, validate_layout
from mig.model import PlacedInstance, Placement
from mig.units import parse_quantity
from sharing.dra import names, validate, wire
from sharing.dra.gpu_devices import shared_gpu
from sharing.dra.mig_devices import mig_gpu
from sharing.dra.model import Capacity, CounterSet, Device, GpuOffer, RequestPolicy, ResourceSlice, ValidRange
from sharing.dra.slices import node_slices
from tests.e2e.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
H100 = get_model("H100-80GB")
MiB, GiB = 2**20, 2**30
TIMEOUT_S = 60.0


def gpu_uuid(node: str, index: int) -> str:
    return f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{node}/{index}')}"


@dataclass
class Dra:
    """The admin's handles on the cluster, and what a test published."""

    core: Any
    slices: Any
    claims: Any
    run: str
    namespace: str
    published: dict[str, tuple[ResourceSlice, ...]]

    def node(self, suffix: str, build: Callable[[str], Sequence[GpuOffer]]) -> tuple[str, tuple[ResourceSlice, ...]]:
        """A kubelet-less Node labelled with the run id, and its pool published as ``build(node)`` says."""
        name = f"{self.run}-{suffix}"
        self.core.create_node(client.V1Node(metadata=client.V1ObjectMeta(
            name=name, labels={"e2e-run": self.run, "kubernetes.io/hostname": name})))
        resources = {"cpu": "64", "memory": "512Gi", "pods": "110"}
        self.core.patch_node_status(name, {"status": {
            "capacity": resources, "allocatable": resources,
            "conditions": [{"type": "Ready", "status": "True", "reason": "E2E",
                            "message": "no kubelet: status written by the test"}]}})
        slices = node_slices(name, build(name))
        validate.check(slices)
        for item in slices:
            self.slices.create(body=wire.slice_json(item))
        self.published[name] = slices
        return name, slices

    def claim(self, name: str, device_class: str, *selectors: str, capacity: dict[str, str] | None = None) -> None:
        exactly: dict[str, Any] = {"deviceClassName": device_class}
        if selectors:
            exactly["selectors"] = [{"cel": {"expression": s}} for s in selectors]
        if capacity:
            exactly["capacity"] = {"requests": capacity}
        self.claims.create(namespace=self.namespace, body={
            "apiVersion": names.API_VERSION, "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}})

    def pod(self, name: str, claim: str) -> None:
        self.core.create_namespaced_pod(self.namespace, {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {
                "nodeSelector": {"e2e-run": self.run},
                "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
                "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                                "resources": {"claims": [{"name": "gpu"}]}}]}})

    def claim_and_pod(self, name: str, device_class: str, *selectors: str,
                      capacity: dict[str, str] | None = None) -> None:
        self.claim(name, device_class, *selectors, capacity=capacity)
        self.pod(name, name)

    def bound(self, pod: str) -> str:
        return str(wait_for(f"pod {self.namespace}/{pod} to be bound",
                            lambda: self.core.read_namespaced_pod(pod, self.namespace).spec.node_name,
                            TIMEOUT_S, interval_s=0.2))

    def unschedulable(self, pod: str) -> str:
        def probe() -> str | None:
            found = self.core.read_namespaced_pod(pod, self.namespace)
            condition = next((c for c in found.status.conditions or [] if c.type == "PodScheduled"), None)
            if condition is not None and condition.status == "False" and condition.reason == "Unschedulable":
                assert found.spec.node_name is None
                return str(condition.message)
            return None

        return str(wait_for(f"pod {self.namespace}/{pod} to be unschedulable", probe, TIMEOUT_S, interval_s=0.2))

    def results(self, claim: str) -> list[dict[str, Any]]:
        """``status.allocation.devices.results`` of ``claim`` (empty: not allocated)."""
        status = self.claims.get(name=claim, namespace=self.namespace).to_dict().get("status") or {}
        return list(((status.get("allocation") or {}).get("devices") or {}).get("results") or [])

    def device(self, claim: str) -> str:
        (result,) = self.results(claim)
        assert result["driver"] == names.DRIVER and result["pool"] in self.published, result
        return str(result["device"])


@pytest.fixture(scope="module")
def device_classes(apply_manifests: Callable[..., list[dict[str, Any]]]) -> list[dict[str, Any]]:
    return apply_manifests(ROOT / "manifests" / "dra")


@pytest.fixture
def dra(admin_client: Any, namespace: str, device_classes: list[dict[str, Any]]) -> Iterator[Dra]:
    dyn = DynamicClient(admin_client)  # type: ignore[no-untyped-call]
    handles = Dra(
        core=client.CoreV1Api(admin_client),
        slices=dyn.resources.get(api_version=names.API_VERSION, kind="ResourceSlice"),
        claims=dyn.resources.get(api_version=names.API_VERSION, kind="ResourceClaim"),
        run=f"dra-{uuid.uuid4().hex[:6]}", namespace=namespace, published={},
    )
    yield handles
    handles.core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
    for node, slices in handles.published.items():
        for item in slices:
            handles.slices.delete(name=item.name)
        handles.core.delete_node(node)


def mig_node(gpus: int) -> Callable[[str], list[GpuOffer]]:
    return lambda node: [mig_gpu(H100, i, gpu_uuid(node, i)) for i in range(gpus)]


def profile_is(profile: str) -> str:
    return f'device.attributes["{names.DRIVER}"].profile == "{profile}"'


def quantity_of(text: object) -> Decimal:
    return parse_quantity(text)


# ------------------------------------------------------------------ (a) the API server takes them
QUANTITY_KEYS = {"value", "default", "min", "max", "step"}


def kept(sent: Any, stored: Any, path: str = "spec") -> list[str]:
    """Where ``stored`` lost or changed something of ``sent`` (quantities compared by value)."""
    if isinstance(sent, dict):
        if not isinstance(stored, dict):
            return [f"{path}: became {stored!r}"]
        lost: list[str] = []
        for key, value in sent.items():
            if key not in stored:
                lost.append(f"{path}.{key}: dropped")
            elif key in QUANTITY_KEYS and isinstance(value, str):
                if quantity_of(value) != quantity_of(stored[key]):
                    lost.append(f"{path}.{key}: {value} became {stored[key]}")
            else:
                lost += kept(value, stored[key], f"{path}.{key}")
        return lost
    if isinstance(sent, list):
        if not isinstance(stored, list) or len(sent) != len(stored):
            return [f"{path}: {len(sent)} items became {stored!r:.80}"]
        return [miss for i, (a, b) in enumerate(zip(sent, stored)) for miss in kept(a, b, f"{path}[{i}]")]
    return [] if sent == stored else [f"{path}: {sent!r} became {stored!r}"]


def test_the_api_server_keeps_every_field_gpupack_publishes(dra: Dra) -> None:
    mig_node_name, mig_slices = dra.node("mig", mig_node(2))
    _, shared_slices = dra.node("shared", lambda node: [shared_gpu(0, gpu_uuid(node, 0), H100.product,
                                                                   H100.memory_mib * MiB, "mps")])
    assert len(mig_slices) == 2 and mig_slices[0].shared_counters and len(mig_slices[1].devices) == 52
    for item in (*mig_slices, *shared_slices):
        stored = dra.slices.get(name=item.name).to_dict()
        assert kept(wire.slice_json(item)["spec"], stored["spec"]) == [], item.name
    listed = dra.slices.get(field_selector=f"spec.nodeName={mig_node_name}").to_dict()["items"]
    assert sorted(i["metadata"]["name"] for i in listed) == sorted(s.name for s in mig_slices)


# ------------------------------------------------------------------ ... and refuses what the validator refuses
_POOL = node_slices("refused", [mig_gpu(H100, i, f"GPU-{i}") for i in range(9)])
_COUNTERS, _DEVICES = _POOL[0], _POOL[2]
_SHARED = node_slices("refused", [shared_gpu(0, "GPU-s", H100.product, H100.memory_mib * MiB, "mps")])[0]


def _one_device(item: ResourceSlice, device: Device) -> ResourceSlice:
    return replace(item, devices=(device,))


def _milli(default: int, low: int, high: int, step: int) -> dict[str, Capacity]:
    return {names.MILLI: Capacity(1000, RequestPolicy(default, ValidRange(low, high, step)))}


REFUSED: list[tuple[str, Callable[[], ResourceSlice], str, str]] = [
    # (case, the slice, what the validator says, what kube-apiserver says)
    ("devices-and-counters", lambda: replace(_DEVICES, shared_counters=_COUNTERS.shared_counters[:1]),
     "only one of sharedCounters or devices", "only one of `sharedCounters` or `devices` is allowed"),
    ("65-devices-consuming-counters", lambda: replace(_DEVICES, devices=tuple(d for s in _POOL for d in s.devices)[:65]),
     "65 devices; at most 64", "spec.devices: Too many: 65: must have at most 64 items"),
    ("9-counter-sets", lambda: replace(_COUNTERS, shared_counters=_COUNTERS.shared_counters
                                       + (replace(_COUNTERS.shared_counters[0], name="gpu-99"),)),
     "9 counter sets; at most 8", "spec.sharedCounters: Too many: 9: must have at most 8 items"),
    ("33-counters", lambda: replace(_COUNTERS, shared_counters=(CounterSet("gpu-0", {f"c{i}": 1 for i in range(33)}),)),
     "33 counters; at most 32", "Too many: 33: must have at most 32 items"),
    ("dotted-device-name", lambda: _one_device(_DEVICES, replace(_DEVICES.devices[0], name="gpu-0-mig-1g.10gb-6")),
     "must be a DNS label", "must not contain dots"),
    ("policy-without-multiple-allocations",
     lambda: _one_device(_DEVICES, replace(_DEVICES.devices[0], capacity=_milli(50, 50, 1000, 50))),
     "needs allowMultipleAllocations", "Forbidden: allowMultipleAllocations must be true"),
    ("default-off-the-step", lambda: _one_device(_SHARED, replace(_SHARED.devices[0], capacity=_milli(75, 50, 1000, 50))),
     "default 75 is not min 50 plus a multiple of step 50", "value is not a multiple of a given step (50) from (50)"),
    ("step-past-the-capacity",
     lambda: _one_device(_SHARED, replace(_SHARED.devices[0], capacity=_milli(600, 600, 1000, 600))),
     "min + step (1200) is larger than the capacity 1000", "one step 1200 is larger than capacity value: 1k"),
    ("long-string-attribute", lambda: _one_device(_DEVICES, replace(_DEVICES.devices[0], attributes={
        **_DEVICES.devices[0].attributes, names.PRODUCT: "x" * 65})),
     "65 characters long; at most 64", "Too long: may not be more than 64 bytes"),
    ("33-attributes-and-capacities", lambda: _one_device(_DEVICES, replace(_DEVICES.devices[0], attributes={
        **_DEVICES.devices[0].attributes, **{names.qualified(f"a{i}"): i for i in range(23)}})),
     "33 attributes and capacities", "the total number of attributes and capacities must not exceed 32"),
    ("zero-slice-count", lambda: replace(_DEVICES, slice_count=0),
     "resourceSliceCount must be greater than zero", "spec.pool.resourceSliceCount: Invalid value: 0"),
]


@pytest.mark.parametrize(("case", "build", "ours", "theirs"), REFUSED, ids=[c[0] for c in REFUSED])
def test_the_api_server_refuses_what_the_validator_refuses(
        dra: Dra, case: str, build: Callable[[], ResourceSlice], ours: str, theirs: str) -> None:
    item = replace(build(), name=f"{dra.run}-{case}")
    found = [str(p) for p in validate.slice_problems(item)]
    assert any(ours in p for p in found), found
    with pytest.raises(ApiException) as info:
        dra.slices.create(body=wire.slice_json(item))
    message = json.loads(info.value.body or "{}").get("message", "")
    assert info.value.status == 422 and theirs in message, message


# ------------------------------------------------------------------ (b) MIG claims
def test_mig_claims_get_placements_that_never_overlap(dra: Dra) -> None:
    node, _ = dra.node("mig", mig_node(2))
    on_gpu_0 = f'device.attributes["{names.DRIVER}"].index == 0'
    for claim in ("three-a", "three-b"):
        dra.claim_and_pod(claim, names.MIG_CLASS, profile_is("3g.40gb"), on_gpu_0)
        assert dra.bound(claim) == node
    # First fit in gpupack's order: the high start first, then the low one; never overlapping.
    assert [dra.device("three-a"), dra.device("three-b")] == ["gpu-0-mig-3g-40gb-4", "gpu-0-mig-3g-40gb-0"]
    status = dra.claims.get(name="three-a", namespace=dra.namespace).to_dict()["status"]
    assert [r["name"] for r in status["reservedFor"]] == ["three-a"]  # the pod that uses it
    assert status["allocation"]["nodeSelector"]["nodeSelectorTerms"] == [{"matchFields": [
        {"key": "metadata.name", "operator": "In", "values": [node]}]}]

    # GPU 0's memory slices are all taken: the full profile goes to GPU 1, by counters alone.
    dra.claim_and_pod("seven", names.MIG_CLASS, profile_is("7g.80gb"))
    assert dra.bound("seven") == node
    assert dra.device("seven") == "gpu-1-mig-7g-80gb-0"

    # Nothing else fits: a third 3g on GPU 0, a 1g anywhere, a whole GPU.
    messages = []
    for claim, device_class, selectors in (("three-c", names.MIG_CLASS, (profile_is("3g.40gb"), on_gpu_0)),
                                           ("one", names.MIG_CLASS, (profile_is("1g.10gb"),)),
                                           ("whole", names.GPU_CLASS, ())):
        dra.claim_and_pod(claim, device_class, *selectors)
        messages.append(dra.unschedulable(claim))
        assert dra.results(claim) == []
    assert all("cannot allocate all claims" in m for m in messages), messages
    print("kube-scheduler on the claims that fit nowhere:", *messages, sep="\n  ")  # shown with -rP


# ------------------------------------------------------------------ (c) shared claims
def test_shared_claims_consume_what_they_ask_rounded_to_the_share_unit(dra: Dra) -> None:
    node, _ = dra.node("mps", lambda node: [shared_gpu(0, gpu_uuid(node, 0), H100.product, H100.memory_mib * MiB, "mps")])
    asks = {
        "a": ({names.MILLI: "300", names.MEMORY: "20Gi"}, (300, 20 * GiB)),
        "b": ({names.MILLI: "120"}, (150, GiB)),  # rounded up to 50 milli; memory: the default, one unit
        "c": ({names.MILLI: "500", names.MEMORY: "40Gi"}, (500, 40 * GiB)),
    }
    share_ids = set()
    for claim, (capacity, (milli, memory)) in asks.items():
        dra.claim_and_pod(claim, names.SHARED_CLASS, capacity=capacity)
        assert dra.bound(claim) == node
        (result,) = dra.results(claim)
        assert result["device"] == "gpu-0-shared"
        consumed = {k: quantity_of(v) for k, v in result["consumedCapacity"].items()}
        assert consumed == {names.MILLI: milli, names.MEMORY: memory}, result
        share_ids.add(result["shareID"])
    assert len(share_ids) == 3

    # 950 milli and 61 GiB are taken: 100 more milli, or 30 GiB more memory, fit no GPU.
    dra.claim_and_pod("too-much-compute", names.SHARED_CLASS, capacity={names.MILLI: "100"})
    dra.claim_and_pod("too-much-memory", names.SHARED_CLASS, capacity={names.MILLI: "50", names.MEMORY: "30Gi"})
    for claim in ("too-much-compute", "too-much-memory"):
        dra.unschedulable(claim)
        assert dra.results(claim) == []
    # A share that the policy cannot serve at all (1001 milli rounds to 1050).
    dra.claim_and_pod("beyond-a-gpu", names.SHARED_CLASS, capacity={names.MILLI: "1001"})
    dra.unschedulable("beyond-a-gpu")


# ------------------------------------------------------------------ (d) a burst
BURST = ["1g.10gb", "2g.20gb", "3g.40gb", "1g.20gb", "4g.40gb", "1g.10gb+me"] * 4


def test_a_burst_of_claims_never_overcommits_the_counters(dra: Dra) -> None:
    node, slices = dra.node("burst", mig_node(2))
    placed = {d.name: (int(d.attributes[names.INDEX]), d) for s in slices for d in s.devices}
    claims = [f"burst-{i:02d}" for i in range(len(BURST))]
    for claim, profile in zip(claims, BURST):
        dra.claim(claim, names.MIG_CLASS, profile_is(profile))
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda claim: dra.pod(claim, claim), claims))

    def instance(device: str) -> tuple[int, PlacedInstance]:
        gpu, found = placed[device]
        a = found.attributes
        return gpu, PlacedInstance(str(a[names.PROFILE]), Placement(int(a[names.PLACEMENT_START]),
                                                                    int(a[names.PLACEMENT_SIZE])))

    def settled() -> dict[str, str] | None:
        """Claim -> device once every pod is bound or unschedulable and nothing pending fits."""
        allocated = {c: dra.device(c) for c in claims if dra.results(c)}
        layouts: dict[int, list[PlacedInstance]] = {0: [], 1: []}
        for device in allocated.values():
            gpu, held = instance(device)
            layouts[gpu].append(held)
        for claim, profile in zip(claims, BURST):
            pod = dra.core.read_namespaced_pod(claim, dra.namespace)
            if pod.spec.node_name:
                continue
            conditions = {c.type: c for c in pod.status.conditions or []}
            if "PodScheduled" not in conditions or conditions["PodScheduled"].reason != "Unschedulable":
                return None
            if any(can_add(H100, layouts[g], PlacedInstance(profile, p)) is None
                   for g in layouts for p in H100.profile(profile).placements):
                return None  # it would fit: the scheduler has not retried it yet
        return allocated

    allocated: dict[str, str] = wait_for("the burst to settle", settled, 2 * TIMEOUT_S, interval_s=0.5)
    assert len(set(allocated.values())) == len(allocated), "a device was allocated twice"
    for claim, device in allocated.items():
        assert dra.core.read_namespaced_pod(claim, dra.namespace).spec.node_name == node
        assert placed[device][1].attributes[names.PROFILE] == BURST[claims.index(claim)]
    for gpu in (0, 1):
        held = [instance(d)[1] for d in allocated.values() if placed[d][0] == gpu]
        assert validate_layout(H100, held) is None, held
        used: dict[str, int] = {}
        for device in allocated.values():
            if placed[device][0] == gpu:
                for name, value in placed[device][1].consumes_counters[0].counters.items():
                    used[name] = used.get(name, 0) + value
        total = mig_gpu(H100, gpu, "u").counter_set
        assert total is not None and all(v <= total.counters[k] for k, v in used.items()), used
    assert 0 < len(allocated) < len(claims)
    for gpu in (0, 1):  # shown with -rP
        print(f"GPU {gpu}:", sorted(str(instance(d)[1]) for d in allocated.values() if placed[d][0] == gpu))
    print(f"{len(allocated)} of {len(claims)} claims allocated; pending: "
          f"{sorted(BURST[claims.index(c)] for c in claims if c not in allocated)}")
