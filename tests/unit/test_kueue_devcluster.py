"""Kueue beside the dev cluster (``gpupack.devcluster.kueue``) and how gpupack's pods count in its quotas
(``sharing.rules.kueue_quota``): the configuration, the webhooks registered, the transformations."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpupack.devcluster import kueue
from gpupack.devcluster.errors import BuildFailed, StartFailed
from sharing.rules.kueue_quota import mig_outputs, replica_milli, resource_transformations

# The shape of Kueue's config/components/webhook/manifests.yaml (v0.17.0): service-based client configs.
MANIFEST: list[dict[str, Any]] = [
    {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
     "metadata": {"name": "mutating-webhook-configuration"}, "webhooks": [
         {"name": "mpod.kb.io", "admissionReviewVersions": ["v1"], "failurePolicy": "Fail", "sideEffects": "None",
          "clientConfig": {"service": {"name": "webhook-service", "namespace": "system", "path": "/mutate--v1-pod"}},
          "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}]},
         {"name": "mjob.kb.io", "admissionReviewVersions": ["v1"], "failurePolicy": "Fail", "sideEffects": "None",
          "clientConfig": {"service": {"name": "webhook-service", "namespace": "system", "path": "/mutate-batch-v1-job"}},
          "rules": [{"apiGroups": ["batch"], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["jobs"]}]},
         {"name": "mclusterqueue.kb.io", "admissionReviewVersions": ["v1"], "failurePolicy": "Fail",
          "sideEffects": "None", "clientConfig": {"service": {"name": "webhook-service", "namespace": "system",
                                                              "path": "/mutate-kueue-x-k8s-io-v1beta2-clusterqueue"}},
          "rules": [{"apiGroups": ["kueue.x-k8s.io"], "apiVersions": ["v1beta2"], "operations": ["CREATE"],
                     "resources": ["clusterqueues"]}]}]},
    {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
     "metadata": {"name": "validating-webhook-configuration"}, "webhooks": [
         {"name": "vpod.kb.io", "admissionReviewVersions": ["v1"], "failurePolicy": "Fail", "sideEffects": "None",
          "clientConfig": {"service": {"name": "webhook-service", "namespace": "system", "path": "/validate--v1-pod"}},
          "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
                     "resources": ["pods"]}]}]},
]


@pytest.fixture
def built(tmp_path: Path) -> kueue.KueueFiles:
    binary = tmp_path / "kueue"
    binary.write_text("#!/bin/sh\n")
    (tmp_path / "config" / "crd").mkdir(parents=True)
    (tmp_path / "config" / "webhook").mkdir(parents=True)
    (tmp_path / "config" / "webhook" / "manifests.yaml").write_text(yaml.safe_dump_all(MANIFEST))
    (tmp_path / "config" / "crd" / "q.yaml").write_text(yaml.safe_dump(
        {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition", "metadata": {"name": "q"}}))
    return kueue.KueueFiles(binary)


def test_webhooks_call_the_local_server_for_pods_and_kueues_api_only(built: kueue.KueueFiles) -> None:
    mutating, validating = kueue.webhook_configurations(built.webhook_manifest, "https://127.0.0.1:9443", "Q0E=")
    assert mutating["metadata"]["name"] == kueue.MUTATING_NAME and validating["metadata"]["name"] == kueue.VALIDATING_NAME
    assert [h["name"] for h in mutating["webhooks"]] == ["mpod.kb.io", "mclusterqueue.kb.io"]  # no Job hook
    pod_hook = mutating["webhooks"][0]
    assert pod_hook["clientConfig"] == {"url": "https://127.0.0.1:9443/mutate--v1-pod", "caBundle": "Q0E="}
    # Only queued pods wait on Kueue: an unlabelled pod is created (and placed) while Kueue is down.
    assert pod_hook["objectSelector"] == {"matchExpressions": [
        {"key": "kueue.x-k8s.io/queue-name", "operator": "Exists"}]}
    assert "objectSelector" not in mutating["webhooks"][1]
    assert validating["webhooks"][0]["objectSelector"] == pod_hook["objectSelector"]


def test_a_manifest_without_kueues_webhooks_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "manifests.yaml"
    path.write_text(yaml.safe_dump_all([MANIFEST[0] | {"webhooks": [MANIFEST[0]["webhooks"][1]]}]))
    with pytest.raises(StartFailed, match="lacks Kueue's mutating or validating webhooks"):
        kueue.webhook_configurations(path, "https://127.0.0.1:1", "")


def test_a_missing_build_names_the_fix(tmp_path: Path) -> None:
    with pytest.raises(BuildFailed, match="tools/kueue/build.sh"):
        kueue.KueueFiles(tmp_path / "kueue").check()


def test_the_configuration_runs_the_pod_integration_on_loopback_with_the_dev_ca(built: kueue.KueueFiles) -> None:
    config = kueue.configuration(webhook_port=1, health_port=2, cert_dir=Path("/c"),
                                 transformations=resource_transformations(4))
    assert config["integrations"] == {"frameworks": ["pod"]}
    assert config["internalCertManagement"] == {"enable": False}
    assert config["webhook"] == {"host": "127.0.0.1", "port": 1, "certDir": "/c"}
    assert config["health"]["healthProbeBindAddress"] == "127.0.0.1:2"
    # Kueue's shipped rate and workers: the library defaults let a flood's Workloads queue for minutes.
    assert config["clientConnection"] == {"qps": 50, "burst": 100}
    assert config["controller"]["groupKindConcurrency"]["Pod"] == 5
    assert config["resources"]["transformations"][1] == {
        "input": "nvidia.com/gpu.shared", "strategy": "Replace", "outputs": {"gpupack.io/gpu-milli": "250"}}
    assert len(kueue.crds(built)) == 1


def test_whole_gpus_replicas_and_mig_instances_count_as_the_milli_they_hold() -> None:
    by_input = {t["input"]: t for t in resource_transformations(2)}
    assert by_input["nvidia.com/gpu"]["outputs"] == {"gpupack.io/gpu-milli": "1000"}
    assert by_input["nvidia.com/gpu.shared"]["outputs"] == {"gpupack.io/gpu-milli": "500"}
    one_g = by_input["nvidia.com/mig-1g.10gb"]
    assert one_g["strategy"] == "Retain"  # a ClusterQueue may cap the profile too
    assert one_g["outputs"] == {"gpupack.io/gpu-milli": "142", "gpupack.io/gpu-memory": "10Gi"}
    assert mig_outputs()["nvidia.com/mig-7g.80gb"]["gpupack.io/gpu-milli"] == "1000"


@pytest.mark.parametrize("replicas", [0, 9, -1])
def test_a_replica_count_out_of_range_is_refused(replicas: int) -> None:
    with pytest.raises(ValueError, match="replicas must be in 1..8"):
        replica_milli(replicas)


def test_the_examples_transformations_are_the_ones_the_dev_cluster_runs() -> None:
    example = yaml.safe_load((Path(__file__).parents[2] / "examples" / "kueue" / "kueue-config.yaml").read_text())
    generated = {t["input"]: t for t in resource_transformations(4)}
    shown = example["resources"]["transformations"]
    assert shown and all(t == generated[t["input"]] for t in shown)
