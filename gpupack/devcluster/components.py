"""Command lines of the components, and how to tell each one is ready.

Pure functions of the binaries, the work dir and the ports, so the flags can be
read in one place (and the reasons for each unusual one with them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpupack.devcluster import kwok
from gpupack.devcluster.apply import MANIFESTS
from gpupack.devcluster.binaries import Binaries

HOST = "127.0.0.1"
SERVICE_CIDR = "10.96.0.0/24"
APISERVER_HOSTS = (HOST, "localhost", "kubernetes", "kubernetes.default",
                   "kubernetes.default.svc", "10.96.0.1")
# The packing configuration gpupack ships for kube-scheduler: the dev cluster runs
# it (not kube-scheduler's defaults) so that demos and e2e tests schedule the way
# a gpupack cluster does.
SHIPPED_SCHEDULER_CONFIG = MANIFESTS / "scheduler" / "kube-scheduler-config.yaml"


def etcd_argv(binaries: Binaries, workdir: Path, ports: dict[str, int]) -> list[str]:
    client_url, peer_url = etcd_url(ports), f"http://{HOST}:{ports['etcd-peer']}"
    return [
        str(binaries.etcd),
        "--name=gpupack-dev",
        f"--data-dir={workdir / 'etcd-data'}",
        f"--listen-client-urls={client_url}",
        f"--advertise-client-urls={client_url}",
        f"--listen-peer-urls={peer_url}",
        f"--initial-advertise-peer-urls={peer_url}",
        f"--initial-cluster=gpupack-dev={peer_url}",
        # Throw-away data: skip fsync, which dominates etcd latency on slow disks.
        "--unsafe-no-fsync=true",
        "--log-level=warn",
    ]


def etcd_url(ports: dict[str, int]) -> str:
    return f"http://{HOST}:{ports['etcd']}"


def apiserver_argv(
    binaries: Binaries, workdir: Path, ports: dict[str, int], authorization_config: Path | None = None
) -> list[str]:
    """``authorization_config``: an ``AuthorizationConfiguration`` file instead of plain RBAC
    (``manifests/hardened``: gpupack's authorizer for node agents' pod reads)."""
    pki = workdir / "pki"
    server = apiserver_url(ports)
    return [
        str(binaries.kube_apiserver),
        f"--etcd-servers={etcd_url(ports)}",
        f"--bind-address={HOST}",
        f"--advertise-address={HOST}",
        # Loopback cannot back the `kubernetes` Service endpoints; nothing here needs them.
        "--endpoint-reconciler-type=none",
        f"--secure-port={ports['apiserver']}",
        f"--tls-cert-file={pki / 'apiserver.crt'}",
        f"--tls-private-key-file={pki / 'apiserver.key'}",
        f"--client-ca-file={pki / 'ca.crt'}",
        f"--authorization-config={authorization_config}" if authorization_config else "--authorization-mode=RBAC",
        "--anonymous-auth=false",
        f"--service-account-issuer={server}",
        f"--service-account-key-file={pki / 'sa.pub'}",
        f"--service-account-signing-key-file={pki / 'sa.key'}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        # No controller-manager by default: nothing creates `default`
        # ServiceAccounts, and nothing would lift the not-ready taint
        # TaintNodesByCondition puts on new Nodes (see controlplane's module
        # doc). The same flags hold with the optional controller-manager, so a
        # test behaves the same with or without it. The admission webhooks
        # stay enabled: gpupack's webhook is called over TLS on loopback.
        "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition",
        "--allow-privileged=true",
        "--profiling=false",
        f"--cert-dir={workdir / 'apiserver-certs'}",
        "--v=1",
    ]


def apiserver_url(ports: dict[str, int]) -> str:
    return f"https://{HOST}:{ports['apiserver']}"


@dataclass(frozen=True)
class SchedulerExtender:
    """Where the local kube-scheduler calls gpupack's prioritize extender: the local webhook's
    ``https://127.0.0.1:<port>/scheduler`` and the CA its serving certificate chains to."""

    url_prefix: str
    ca_file: Path


def scheduler_config(workdir: Path, extender: SchedulerExtender | None = None) -> dict[str, Any]:
    """The shipped scheduler configuration, changed only where the dev cluster must differ.

    Profiles and plugin weights are taken as shipped: the manifests file is the
    one source of truth, so a change there changes what the dev cluster runs.
    gpupack's extender keeps its verb, weight and every other setting; only its address and CA
    are the local webhook's (``extender``). Without a local webhook (``None``: a bare control
    plane, or before the webhook serves) the extender is left out: a call to an address nobody
    serves would be one failed connection per pod scheduled.
    """
    config: dict[str, Any] = yaml.safe_load(SHIPPED_SCHEDULER_CONFIG.read_text(encoding="utf-8"))
    extenders = config.pop("extenders", None) or []
    if extender is not None:
        config["extenders"] = [
            {**e, "urlPrefix": extender.url_prefix, "tlsConfig": {"caFile": str(extender.ca_file)}}
            for e in extenders
        ]
    # The shipped path (/etc/kubernetes/scheduler.conf) is kubeadm's; ours is in the work dir.
    # It must be set here: kube-scheduler ignores --kubeconfig when --config is given.
    config.setdefault("clientConnection", {})["kubeconfig"] = str(workdir / "scheduler.kubeconfig")
    # One scheduler: skip the lease wait. Kept in the file with the rest of its settings.
    config["leaderElection"] = {"leaderElect": False}
    return config


def scheduler_config_path(workdir: Path) -> Path:
    return workdir / "scheduler-config.yaml"


def write_scheduler_config(workdir: Path, extender: SchedulerExtender | None = None) -> Path:
    path = scheduler_config_path(workdir)
    path.write_text(yaml.safe_dump(scheduler_config(workdir, extender), sort_keys=False), encoding="utf-8")
    return path


def scheduler_argv(binaries: Binaries, workdir: Path, ports: dict[str, int]) -> list[str]:
    return [
        str(binaries.kube_scheduler),
        # Written by write_scheduler_config(); kubeconfig and leader election are in it.
        f"--config={scheduler_config_path(workdir)}",
        f"--bind-address={HOST}",
        f"--secure-port={ports['scheduler']}",
        # Its serving certificate is self-signed here; /readyz is open to all.
        f"--cert-dir={workdir / 'scheduler-certs'}",
        "--v=1",
    ]


def scheduler_url(ports: dict[str, int]) -> str:
    return f"https://{HOST}:{ports['scheduler']}"


# kube-controller-manager's controllers the dev cluster runs unless told otherwise:
# pods of ReplicaSets/Deployments, PodDisruptionBudget status, owner-reference
# garbage collection, namespace deletion, `default` ServiceAccounts and their
# token Secrets, and ResourceClaims for pods' claim templates (DRA). Never
# node-lifecycle: the dev cluster's Nodes have no kubelet, so it would mark them
# NotReady, taint them and evict their pods (see NODE_LIFECYCLE). The names are
# the ones v1.37's `kube-controller-manager --help` lists under --controllers; it
# also accepts the older short aliases (replicaset, garbagecollector, ...).
# Not with kwok either: kwok renews its Nodes' Leases, so node-lifecycle would
# leave those alone, but the Nodes that tests, benchmarks and agents write by hand
# share the cluster, and it would taint them and evict their pods.
DEFAULT_CONTROLLERS = (
    "replicaset-controller", "deployment-controller", "disruption-controller",
    "garbage-collector-controller", "serviceaccount-token-controller", "serviceaccount-controller",
    "namespace-controller", "resourceclaim-controller",
)
# The names (current and old alias) kube-controller-manager accepts for the node-lifecycle controller.
NODE_LIFECYCLE = ("node-lifecycle-controller", "nodelifecycle")


def check_controllers(controllers: Sequence[str]) -> None:
    """Refuse an empty list, and any that would run node-lifecycle (``*`` does, unless negated)."""
    if not controllers:
        raise ValueError("kube-controller-manager needs at least one controller to run")
    names = set(controllers)
    if names & set(NODE_LIFECYCLE) or ("*" in names and not {f"-{n}" for n in NODE_LIFECYCLE} & names):
        raise ValueError(
            "the dev cluster must not run kube-controller-manager's node-lifecycle controller: its "
            "Nodes have no kubelet, so it would taint them NotReady and evict their pods; "
            f"name the controllers to run (default: {','.join(DEFAULT_CONTROLLERS)}), "
            "or add -node-lifecycle-controller after '*'"
        )


def controller_manager_argv(
    binaries: Binaries, workdir: Path, ports: dict[str, int], controllers: Sequence[str] = DEFAULT_CONTROLLERS
) -> list[str]:
    check_controllers(controllers)
    pki = workdir / "pki"
    return [
        str(binaries.kube_controller_manager),
        # Its own client certificate, user system:kube-controller-manager, which the
        # API server's bootstrap RBAC policy binds to the role of that name.
        f"--kubeconfig={workdir / 'controller-manager.kubeconfig'}",
        # Each controller acts as its own ServiceAccount in kube-system (bound by the
        # bootstrap policy to system:controller:<name>), as in a real cluster, so
        # RBAC gaps show here as they would there.
        "--use-service-account-credentials=true",
        # The key that signs ServiceAccount tokens: the API server's
        # --service-account-signing-key-file; it checks them with sa.pub.
        f"--service-account-private-key-file={pki / 'sa.key'}",
        # The CA put into ServiceAccount token Secrets.
        f"--root-ca-file={pki / 'ca.crt'}",
        f"--controllers={','.join(controllers)}",
        # One instance: skip the lease wait.
        "--leader-elect=false",
        f"--bind-address={HOST}",
        f"--secure-port={ports['controller-manager']}",
        # Like kube-scheduler: a self-signed serving certificate here, and /healthz
        # open to all (no authentication/authorization kubeconfig is needed for it).
        f"--cert-dir={workdir / 'controller-manager-certs'}",
        "--profiling=false",
        "--v=1",
    ]


def controller_manager_url(ports: dict[str, int]) -> str:
    return f"https://{HOST}:{ports['controller-manager']}"


def kwok_argv(binaries: Binaries, workdir: Path, ports: dict[str, int]) -> list[str]:
    """kwok (``ControlPlaneConfig(kwok=True)``): the kubelet of the Nodes annotated
    ``kwok.x-k8s.io/node=fake`` and of their pods, following the stages in
    ``kwok-config.yaml`` (written by ``kwok.write_config``). Its environment sets
    ``KWOK_WORKDIR`` to the work dir (:func:`kwok_env`), so that a ``~/.kwok/kwok.yaml``
    of the user's, which kwok would load as well, is not read."""
    return [
        str(binaries.kwok),
        f"--kubeconfig={workdir / 'kwok.kubeconfig'}",
        f"--config={kwok_config_path(workdir)}",
        # Only the Nodes made for it: tests and benchmarks also write Nodes by hand.
        "--manage-all-nodes=false",
        f"--manage-nodes-with-annotation-selector={kwok.MANAGED_ANNOTATION}={kwok.MANAGED_VALUE}",
        f"--node-lease-duration-seconds={kwok.NODE_LEASE_SECONDS}",
        f"--cidr={kwok.POD_CIDR}",
        # Its HTTP server: /healthz answers once the controllers have started.
        f"--server-address={HOST}:{ports['kwok']}",
        # At INFO it logs every Lease renewal and status patch: 125 lines/s for 1,250 nodes.
        "--v=WARN",
    ]


def kwok_env(workdir: Path) -> dict[str, str]:
    return {"KWOK_WORKDIR": str(workdir / "kwok")}


def kwok_config_path(workdir: Path) -> Path:
    return workdir / "kwok-config.yaml"


def kwok_url(ports: dict[str, int]) -> str:
    return f"http://{HOST}:{ports['kwok']}"
