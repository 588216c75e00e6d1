"""The DRA throughput benchmark's core (``benchmarks/dra_claims.py``) at a tiny size on the real control plane.

kube-apiserver, kube-scheduler (shipped configuration) and kube-controller-manager
(its resourceclaim controller makes each pod's claim from its template); 3
kubelet-less nodes whose pools the benchmark publishes as the agent would, and 6
pods. The benchmark is run at size by hand (benchmarks/dra_claims.md); this
proves in CI that what it measures is what it claims:

* every pod's claim (made from its template by kube-controller-manager, or
  created by the benchmark) is allocated, to a device of the slices published for the
  node the pod is bound to, of the kind and size the pod asked (a share of the
  asked milli, or an instance of the asked MIG profile), and no GPU gives more
  ``milli`` than it has or more counters than it has (read back from the API
  server here, not taken from the benchmark's own result);
* the device-plugin path on the same kind of nodes binds every pod.

No timing is asserted: only that the figures exist.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from gpupack.devcluster.apply import MANIFESTS, apply_objects, load_manifests
from gpupack.devcluster.controlplane import ControlPlane
from mig.units import parse_quantity
from sharing.dra import names

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import dra_claims as bench  # noqa: E402

NODES, PODS = 3, 6


@pytest.fixture(scope="module")
def api(controller_manager_scheduler_plane: ControlPlane) -> Iterator[Any]:
    with controller_manager_scheduler_plane.admin_client() as admin:
        apply_objects(admin, load_manifests(MANIFESTS / "dra" / "deviceclasses.yaml"), field_manager="gpupack-e2e")
        yield admin


def listed(call: Any, namespace: str) -> list[dict[str, Any]]:
    return list(json.loads(call(namespace, _preload_content=False).data)["items"])


@pytest.mark.parametrize("variant", bench.VARIANTS)
@pytest.mark.parametrize("path", ["dra", "dra-direct"])
def test_every_claim_is_allocated_to_a_published_device_without_overcommit(
        api: Any, variant: bench.Variant, path: bench.Path_) -> None:
    cluster, (result,) = bench.run_variant(api, variant, NODES, PODS, (path,), keep_pods=True,
                                           timeout_s=180, settle_s=10)
    assert result["bound"] == result["claims_allocated"] == PODS, result
    assert result["unschedulable"] == 0 and result["check"]["problems"] == [], result
    for figure in ("claims_per_second", "pods_per_second", "bound_latency_p50_s", "bound_latency_p95_s"):
        assert result[figure] is not None, figure

    namespace = result["namespace"]
    pods = listed(client.CoreV1Api(api).list_namespaced_pod, namespace)
    claims = listed(client.ResourceV1Api(api).list_namespaced_resource_claim, namespace)
    bound = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in pods}
    assert len(claims) == PODS and all(bound.values()), bound
    check = bench.check_allocations(claims, cluster.pools, bound)
    assert check.allocated == PODS and check.problems == (), check
    # Some GPU holds two claims (MostAllocated packs a node, first fit takes its GPU 0), so the
    # over-commit sums above added up more than one claim.
    assert check.gpus < check.allocated, check

    devices = {(pool, d.name): d for pool, slices in cluster.pools.items() for s in slices for d in s.devices}
    for claim in claims:
        pod = bench.owner_pod(claim)
        assert pod is not None
        if path == "dra":  # made from the pod's template by kube-controller-manager
            assert claim["metadata"]["annotations"]["resource.kubernetes.io/pod-claim-name"] == "gpupack"
        asked = bench.container(variant, int(pod.removeprefix("p")))
        (allocated,) = bench.allocation_results(claim)
        device = devices[(allocated["pool"], allocated["device"])]
        assert allocated["pool"] == bound[pod]
        if variant == "shared":
            assert device.kind == "shared"
            assert parse_quantity(allocated["consumedCapacity"][names.MILLI]) == asked.milli, allocated
        else:
            assert device.kind == "mig" and device.attributes[names.PROFILE] == asked.profile, allocated


@pytest.mark.parametrize("variant", bench.VARIANTS)
def test_the_device_plugin_path_binds_the_same_workload(api: Any, variant: bench.Variant) -> None:
    _, (result,) = bench.run_variant(api, variant, NODES, PODS, ("device-plugin",), timeout_s=180, settle_s=10)
    assert result["bound"] == PODS and result["unschedulable"] == 0, result
    assert result["pods_per_second"] is not None and result["bound_latency_p95_s"] is not None, result
