"""Kueue (``sigs.k8s.io/kueue``, built by ``tools/kueue/build.sh``) beside the local control plane.

``ControlPlaneConfig(kueue=<binary>)`` (``gpupack dev cluster up --kueue``) runs Kueue's manager out of
cluster, against the local kube-apiserver, as the cluster admin:

* its CRDs come from the module it was built from (``config/components/crd/bases``, which
  ``tools/kueue/build.sh`` copies beside the binary), applied without the conversion-webhook
  patches (gpupack speaks ``kueue.x-k8s.io/v1beta2`` only, so nothing converts);
* its configuration (:func:`configuration`) enables only the ``pod`` integration (plain pods
  labelled ``kueue.x-k8s.io/queue-name``), turns internal certificate management, leader election
  and the visibility server off, and carries gpupack's resource transformations
  (:mod:`sharing.rules.kueue_quota`);
* its webhook serves on loopback with a certificate from the dev cluster's CA, and gpupack registers
  Kueue's webhooks (:func:`webhook_configurations`, read from the module's
  ``config/components/webhook/manifests.yaml``) pointing at it.

Kueue v0.17 reads its metrics server's certificate from the fixed path
:data:`METRICS_CERT_DIR` whenever internal certificate management is off (``cmd/kueue/main.go``),
even with the metrics server disabled, as here; a pair from the dev CA is written there when none
exists (the only file gpupack writes outside its work directory; nothing is served with it).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml

from gpupack.devcluster.apply import Manifest, load_manifests
from gpupack.devcluster.errors import BuildFailed, StartFailed
from sharing.api.keys import KUEUE_QUEUE_LABEL

NAME: Final = "kueue"
"""The component's name (process, log file, ``stop_component``)."""
NAMESPACE: Final = "kueue-system"
"""Kueue's own namespace (its configuration's ``namespace``), left out of its pod webhooks."""
INTEGRATIONS: Final = ("pod",)
"""Kueue's job integrations that run: plain pods only (the others' CRDs are not installed)."""
METRICS_CERT_DIR: Final = Path("/etc/kueue/metrics/certs")
"""Where Kueue v0.17 reads its metrics certificate when internal certificate management is off."""
MUTATING_NAME: Final = "gpupack-kueue-mutating"
VALIDATING_NAME: Final = "gpupack-kueue-validating"
_KEPT_GROUPS: Final = frozenset({"", "kueue.x-k8s.io"})
"""Webhooks kept: Kueue's own API and core pods (the ``pod`` integration); the others serve
integrations that do not run here (Jobs, Deployments, StatefulSets, Ray, Kubeflow...)."""
_SKIPPED_NAMESPACES: Final = ("kube-system", NAMESPACE)


@dataclass(frozen=True)
class KueueFiles:
    """A built Kueue: the manager binary and, beside it (``tools/kueue/build.sh``), the module's manifests."""

    binary: Path

    @property
    def crd_dir(self) -> Path:
        return self.binary.parent / "config" / "crd"

    @property
    def webhook_manifest(self) -> Path:
        return self.binary.parent / "config" / "webhook" / "manifests.yaml"

    def check(self) -> KueueFiles:
        """This, or :class:`BuildFailed` naming what is missing and how to get it."""
        for path in (self.binary, self.crd_dir, self.webhook_manifest):
            if not path.exists():
                raise BuildFailed(f"Kueue is not built: {path} is missing",
                                  "run tools/kueue/build.sh (needs Go >= 1.26; about 8 minutes on 2 cores "
                                  "the first time), or point GPUPACK_KUEUE at a built kueue binary with "
                                  "its config/ folder beside it")
        return self


def crds(files: KueueFiles) -> list[Manifest]:
    """Kueue's CustomResourceDefinitions, as its module ships them."""
    docs = load_manifests(files.crd_dir)
    if not docs or any(d.get("kind") != "CustomResourceDefinition" for d in docs):
        raise BuildFailed(f"{files.crd_dir} holds no Kueue CRDs, or something else",
                          "re-run tools/kueue/build.sh after removing that folder")
    return docs


SHIPPED_QPS: Final = 50
"""Kueue's shipped manager config's API request rate (``clientConnection.qps``; burst twice that)."""


def configuration(*, webhook_port: int, health_port: int, cert_dir: Path,
                  transformations: Iterable[Mapping[str, Any]] = (), qps: int = SHIPPED_QPS) -> dict[str, Any]:
    """Kueue's ``config.kueue.x-k8s.io/v1beta2`` Configuration for a manager run out of cluster on loopback;
    ``qps``: its API request rate (burst twice that)."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        # "0" turns controller-runtime's metrics server off: nothing scrapes a dev cluster's Kueue.
        "metrics": {"bindAddress": "0"},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(cert_dir)},
        # One manager, no Lease to wait for at start; certificates are the dev CA's.
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        # The visibility API would need an APIService and a Service to be reached through.
        "featureGates": {"VisibilityOnDemand": False},
        # As Kueue's shipped manager config (config/components/manager): 5 workers for pods and
        # Workloads, 50 requests/s to the API server. The library defaults (1 worker, 20/s) made a
        # flood's Workloads queue far ahead of every other tenant's (benchmarks/kueue_flood.md).
        "controller": {"groupKindConcurrency": {"Pod": 5, "Workload.kueue.x-k8s.io": 5}},
        "clientConnection": {"qps": qps, "burst": 2 * qps},
        "integrations": {"frameworks": list(INTEGRATIONS)},
        "resources": {"transformations": [dict(t) for t in transformations]},
    }


def write_configuration(path: Path, config: Mapping[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(dict(config), sort_keys=False), encoding="utf-8")
    return path


def webhook_configurations(manifest: Path, url: str, ca_bundle: str) -> list[Manifest]:
    """Kueue's Mutating- and ValidatingWebhookConfiguration for a manager served at ``url`` (its CA
    ``ca_bundle``, base64): the webhooks of :data:`_KEPT_GROUPS` only, each calling ``url`` plus its
    path. Pod webhooks match only pods labelled :data:`~sharing.api.keys.KUEUE_QUEUE_LABEL` (a pod no
    queue holds never waits on Kueue, so it is created and placed while Kueue is down) outside
    ``kube-system`` and Kueue's namespace."""
    out: list[Manifest] = []
    for doc in load_manifests(manifest):
        kind = doc.get("kind")
        if kind not in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
            continue
        hooks = [_local_hook(h, url, ca_bundle) for h in doc.get("webhooks") or [] if _kept(h)]
        if not hooks:
            continue
        name = MUTATING_NAME if kind == "MutatingWebhookConfiguration" else VALIDATING_NAME
        out.append({"apiVersion": doc["apiVersion"], "kind": kind, "metadata": {"name": name}, "webhooks": hooks})
    if len(out) != 2:
        raise StartFailed(f"{manifest} lacks Kueue's mutating or validating webhooks for pods and its own API",
                          "re-run tools/kueue/build.sh after removing the config/ folder beside the kueue binary")
    return out


def _kept(hook: Mapping[str, Any]) -> bool:
    rules = hook.get("rules") or []
    return bool(rules) and all(set(r.get("apiGroups") or [""]) <= _KEPT_GROUPS for r in rules)


def _local_hook(hook: Mapping[str, Any], url: str, ca_bundle: str) -> dict[str, Any]:
    out = copy.deepcopy(dict(hook))
    path = (hook.get("clientConfig") or {}).get("service", {}).get("path", "")
    out["clientConfig"] = {"url": url + path, "caBundle": ca_bundle}
    if any("pods" in (r.get("resources") or []) for r in hook.get("rules") or []):
        out["objectSelector"] = {"matchExpressions": [{"key": KUEUE_QUEUE_LABEL, "operator": "Exists"}]}
        out["namespaceSelector"] = {"matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": list(_SKIPPED_NAMESPACES)}]}
    return out


def namespace() -> Manifest:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}


def argv(files: KueueFiles, config: Path, kubeconfig: Path) -> list[str]:
    return [str(files.binary), f"--config={config}", f"--kubeconfig={kubeconfig}", "--zap-log-level=info"]


def probe_pod(queue: str = "gpupack-probe") -> dict[str, Any]:
    """A pod Kueue's mutating webhook gates (created dry-run, to see the API server calls it)."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "kueue-probe", "labels": {KUEUE_QUEUE_LABEL: queue}},
            "spec": {"containers": [{"name": "c", "image": "example.com/probe:1"}]}}


__all__ = ["INTEGRATIONS", "METRICS_CERT_DIR", "NAME", "NAMESPACE", "KueueFiles", "argv", "configuration", "crds",
           "namespace", "probe_pod", "webhook_configurations", "write_configuration"]
