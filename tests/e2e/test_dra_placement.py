"""gpupack's engine chooses every DRA pod's device; kube-scheduler allocates exactly that device.

On a control plane of the module's own with kube-scheduler and kube-controller-manager
(``controller_manager_scheduler_plane``): two kubelet-less Nodes labelled
``gpupack.io/backend=dra``, each with two H100s shared by MPS, published as
ResourceSlices with ``sharing.dra``'s builders (as ``test_dra_slices.py`` does)
and described by GPUNodes whose status the test writes (as an agent would);
``manifests/dra`` applied. Pods are created exactly as the webhook admits them
to the DRA pool (gated, the allocation record, a reference to a claim that does
not exist yet, each container naming its request, affinity to the pool: built
with ``sharing.api.allocation.Allocation``). Then the controller's cycle runs.

Checked:

* each released pod's ResourceClaim is allocated by kube-scheduler to exactly
  the device (pool, name, consumed milli) the engine pinned it to, and the pod
  is bound to that node;
* a burst of pods created concurrently never over-commits a GPU's milli, in
  what the engine promised and in what kube-scheduler allocated; pods that fit
  nowhere stay at the gate;
* a pod kube-scheduler sets aside while the share it is pinned to has room (it
  counts a claim being bound twice for a moment; ``controller.planning.draplan``,
  "Stalled promises") is bound all the same: a later cycle re-creates its claim;
* a deleted pod's claim is garbage-collected by kube-controller-manager, and its
  capacity is offered again: a waiting pod gets that very device.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.dynamic import DynamicClient

from controller.kube import Kube
from controller.reconcile import Controller
from controller.settings import ControllerSettings
from gpupack.devcluster.apply import apply_objects, load_manifests
from gpupack.devcluster.controlplane import ControlPlane
from mig.catalog import get_model
from mig.units import parse_quantity
from sharing.api.backend import pod_claim_name
from sharing.dra import names
from sharing.dra.gpu_devices import shared_gpu
from sharing.dra.pinned import ANNOTATION, Pinned
from sharing.api.keys import BACKEND_LABEL
from tests.e2e.test_dra_slices import TIMEOUT_S, Dra, gpu_uuid
from tests.e2e.waiting import repeating, wait_for
from tests.unit.test_controller_dra import dra_allocation, dra_pod, gpunode

ROOT = Path(__file__).resolve().parents[2]
H100 = get_model("H100-80GB")
MiB = 2**20
GPUS = 2


@pytest.fixture(scope="module")
def plane(controller_manager_scheduler_plane: ControlPlane) -> ControlPlane:
    return controller_manager_scheduler_plane


@pytest.fixture(scope="module")
def admin(plane: ControlPlane) -> Iterator[Any]:
    with plane.admin_client() as api:
        apply_objects(api, load_manifests(ROOT / "manifests" / "crds", ROOT / "manifests" / "dra"),
                      field_manager="gpupack-e2e")
        yield api


class Pool:
    """Two DRA nodes, their GPUNodes, a namespace, and the controller that places its pods."""

    def __init__(self, admin: Any, logs: Path) -> None:
        self.logs = logs
        dyn = DynamicClient(admin)  # type: ignore[no-untyped-call]
        self.core = client.CoreV1Api(admin)
        self.custom = client.CustomObjectsApi(admin)
        self.namespace = f"dra-place-{uuid.uuid4().hex[:6]}"
        self.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=self.namespace)))
        self.dra = Dra(core=self.core, slices=dyn.resources.get(api_version=names.API_VERSION, kind="ResourceSlice"),
                       claims=dyn.resources.get(api_version=names.API_VERSION, kind="ResourceClaim"),
                       run=f"drap-{uuid.uuid4().hex[:6]}", namespace=self.namespace, published={})
        self.nodes = [self._node(s) for s in ("a", "b")]
        self.controller = Controller(Kube(admin), ControllerSettings(namespaces=self.namespace))

    def _node(self, suffix: str) -> str:
        name, _ = self.dra.node(suffix, lambda node: [
            shared_gpu(i, gpu_uuid(node, i), H100.product, H100.memory_mib * MiB, "mps") for i in range(GPUS)])
        self.core.patch_node(name, {"metadata": {"labels": {BACKEND_LABEL: "dra"}}})
        body = gpunode(name, GPUS)
        status = body.pop("status")
        self.custom.create_cluster_custom_object("gpupack.io", "v1alpha1", "gpunodes", body)
        self.custom.patch_cluster_custom_object_status("gpupack.io", "v1alpha1", "gpunodes", name, {"status": status})
        return name

    def pod(self, name: str, milli: int) -> None:
        """A pod as the webhook admits it: its claim named at admission, not created."""
        allocation = dra_allocation("mps", pod_claim_name(str(uuid.uuid4())), milli=(milli,))
        body: Any = dra_pod(name, self.namespace, allocation)
        self.core.create_namespaced_pod(self.namespace, body)

    @contextmanager
    def cycling(self, every_s: float = 1.0) -> Iterator[None]:
        """The controller's cycle running on its own, as its resync loop runs it in a cluster, while
        the test waits for kube-scheduler (a stalled promise is re-created only by a later cycle)."""
        errors: list[str] = []
        with repeating(lambda: errors.extend(self.controller.cycle().errors), every_s):
            yield
        assert errors == [], errors

    def read(self, pod: str) -> Any:
        """The pod, as Any: the client's models make every field Optional."""
        return self.core.read_namespaced_pod(pod, self.namespace)

    def claim_of(self, pod: str) -> str:
        return str(self.read(pod).spec.resource_claims[0].resource_claim_name)

    def pinned(self, pod: str) -> Pinned:
        claim = self.dra.claims.get(name=self.claim_of(pod), namespace=self.namespace).to_dict()
        return Pinned.from_annotation(claim["metadata"]["annotations"][ANNOTATION])

    def gated(self, pod: str) -> bool:
        return bool(self.read(pod).spec.scheduling_gates)

    def allocated(self, pod: str) -> tuple[str, str, int]:
        """(pool, device, consumed milli) kube-scheduler allocated the pod's claim, once bound."""
        try:
            node = self.dra.bound(pod)
        except pytest.fail.Exception:
            conditions = [(c.type, c.reason, c.message) for c in self.read(pod).status.conditions or []]
            log = (self.logs / "kube-scheduler.log").read_text(errors="replace").splitlines()
            claim = self.claim_of(pod)
            mentions = [line for line in log if pod in line or claim in line][-15:]
            pytest.fail(f"pod {pod} never bound; conditions {conditions}; the namespace's claims:\n{self.claims_table()}\n"
                        "kube-scheduler said:\n" + "\n".join(mentions))
        (result,) = wait_for(f"claim of {pod} allocated", lambda: self.dra.results(self.claim_of(pod)), TIMEOUT_S)
        assert result["pool"] == node and result["driver"] == names.DRIVER, result
        return node, str(result["device"]), int(parse_quantity(result["consumedCapacity"][names.MILLI]))

    def claims_table(self) -> str:
        """Every claim of the namespace: its pin and what kube-scheduler allocated (why a pod waits)."""
        rows = []
        for claim in self.dra.claims.get(namespace=self.namespace).to_dict()["items"]:
            meta, status = claim["metadata"], claim.get("status") or {}
            pin = (meta.get("annotations") or {}).get(ANNOTATION, "-")
            results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
            got = [(r["pool"], r["device"], (r.get("consumedCapacity") or {}).get(names.MILLI)) for r in results]
            rows.append(f"  {meta['name']} v{meta.get('resourceVersion')}: pinned {pin}; allocated {got or '-'}; "
                        f"reserved for {[r.get('name') for r in status.get('reservedFor') or []]}")
        return "\n".join(rows)

    def close(self) -> None:
        self.core.delete_collection_namespaced_pod(self.namespace, grace_period_seconds=0)
        for node in self.nodes:
            self.custom.delete_cluster_custom_object("gpupack.io", "v1alpha1", "gpunodes", node)
        for node, slices in self.dra.published.items():
            for item in slices:
                self.dra.slices.delete(name=item.name)
            self.core.delete_node(node)


@pytest.fixture
def pool(admin: Any, plane: ControlPlane) -> Iterator[Pool]:
    made = Pool(admin, plane.log_dir)
    try:
        yield made
    finally:
        made.close()


def test_a_burst_gets_exactly_the_engines_devices_and_never_over_commits(pool: Pool) -> None:
    asks = [300, 450, 200, 600, 150, 350, 500, 250, 700, 100, 800, 400]  # 4800 milli for 4000
    names_ = [f"p{i:02d}" for i in range(len(asks))]
    with ThreadPoolExecutor(max_workers=6) as creating:
        list(creating.map(pool.pod, names_, asks))
    for _ in range(3):  # later cycles see the earlier ones' claims, promised or allocated
        report = pool.controller.cycle()
        assert report.errors == [], report.errors
    released = [n for n in names_ if not pool.gated(n)]
    waiting = [n for n in names_ if n not in released]
    assert released and waiting  # the burst asks more than the pool has
    per_gpu: dict[tuple[str, str], int] = defaultdict(int)
    with pool.cycling():
        for name in released:
            allocated = pool.allocated(name)
            pinned = pool.pinned(name)
            (device,) = pinned.devices
            assert allocated == (pinned.node, device.device, device.milli), name
            per_gpu[pinned.node, device.device] += device.milli
    assert max(per_gpu.values()) <= 1000, per_gpu
    free = [1000 - per_gpu[node, names.shared_device_name(i)] for node in pool.nodes for i in range(GPUS)]
    for name in waiting:  # every ask is a whole number of 50-milli units: what is left fits none of them
        assert asks[names_.index(name)] > max(free), (name, free)
        assert pool.read(name).spec.node_name is None


def test_a_deleted_pods_claim_is_collected_and_its_device_offered_again(pool: Pool) -> None:
    for i in range(5):  # one 600-milli share per GPU: the fifth pod waits
        pool.pod(f"s{i}", 600)
    report = pool.controller.cycle()
    assert report.errors == [] and sorted(report.released) == [f"{pool.namespace}/s{i}" for i in range(4)]
    assert pool.gated("s4")
    devices = {f"s{i}": pool.allocated(f"s{i}") for i in range(4)}
    assert len(set(devices.values())) == 4  # four GPUs, one share each

    victim_claim = pool.claim_of("s1")
    pool.core.delete_namespaced_pod("s1", pool.namespace, grace_period_seconds=0)

    def collected() -> bool:
        found = pool.dra.claims.get(namespace=pool.namespace).to_dict()["items"]
        return victim_claim not in {c["metadata"]["name"] for c in found}

    wait_for(f"kube-controller-manager to delete ResourceClaim {victim_claim}", collected, TIMEOUT_S)
    report = pool.controller.cycle()
    assert report.errors == [] and report.released == [f"{pool.namespace}/s4"]
    assert pool.allocated("s4") == devices["s1"]


HOLD_GATE = "e2e.gpupack.io/hold"
"""A scheduling gate of the test's own: gpupack lifts only its gate, so with this one the pod stays
unscheduled after its release, its claim promised and not allocated, for as long as the test wants."""


def test_a_promise_a_users_claim_took_is_re_pinned_on_the_pods_node(pool: Pool) -> None:
    """A user's own claim on gpupack's shared class is allocated, by kube-scheduler, the device a
    released gpupack pod's claim was pinned to before that claim was allocated. The controller sees
    the broken promise, replaces the claim with one pinned to the node's other GPU, and the pod is
    bound there once it may be scheduled."""
    allocation = dra_allocation("mps", pod_claim_name(str(uuid.uuid4())), milli=(400,))
    body: Any = dra_pod("p", pool.namespace, allocation,
                        extra={"schedulingGates": [{"name": "gpupack.io/capacity"}, {"name": HOLD_GATE}]})
    pool.core.create_namespaced_pod(pool.namespace, body)
    report = pool.controller.cycle()
    assert report.errors == [] and report.released == [f"{pool.namespace}/p"]
    promise = pool.pinned("p")
    (device,) = promise.devices
    assert [g.name for g in pool.read("p").spec.scheduling_gates] == [HOLD_GATE]

    # The user's claim: 700 milli of exactly that GPU, for a pod of theirs on that node.
    pool.dra.claim("users", names.SHARED_CLASS, f'device.attributes["{names.DRIVER}"].index == {device.gpu}',
                   capacity={names.MILLI: "700"})
    pool.core.create_namespaced_pod(pool.namespace, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "users"},
        "spec": {"nodeSelector": {"kubernetes.io/hostname": promise.node},
                 "resourceClaims": [{"name": "gpu", "resourceClaimName": "users"}],
                 "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                                 "resources": {"claims": [{"name": "gpu"}]}}]}})
    (taken,) = wait_for("the user's claim allocated", lambda: pool.dra.results("users"), TIMEOUT_S)
    assert (taken["pool"], taken["device"]) == (promise.node, device.device)

    report = pool.controller.cycle()
    assert report.errors == [], report.errors
    again = pool.pinned("p")
    (moved,) = again.devices
    assert again.node == promise.node and moved.gpu != device.gpu and moved.milli == 400

    pool.core.patch_namespaced_pod("p", pool.namespace, {"spec": {"schedulingGates": None}})
    assert pool.allocated("p") == (promise.node, moved.device, 400)
