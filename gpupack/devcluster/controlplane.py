"""The local control plane on loopback: etcd, kube-apiserver, kube-scheduler; optionally kube-controller-manager, kwok.

    with ControlPlane(ensure_binaries()) as cp:
        api = cp.admin_client()
        ...

``start()`` picks free loopback ports, generates a CA, serving and client
certificates and a ServiceAccount signing key, starts etcd (temporary data
dir), then kube-apiserver (client-certificate and ServiceAccount-token
authentication, RBAC authorization, admission webhooks enabled), then
kube-scheduler (with gpupack's shipped packing configuration,
``manifests/scheduler/kube-scheduler-config.yaml``), then, only with
``ControlPlaneConfig(controller_manager=True)``, kube-controller-manager (its
own client certificate, user ``system:kube-controller-manager``; the controllers
in ``controllers``), then, only with ``ControlPlaneConfig(kwok=True)``, kwok (user
``kwok-controller`` with the rights of ``tools/kwok/rbac.yaml``, the stages of
``tools/kwok/stages``: see :mod:`gpupack.devcluster.kwok`), then, only with
``ControlPlaneConfig(kueue=<binary>)``, Kueue's manager with its CRDs and webhooks
(:mod:`gpupack.devcluster.kueue`), waits for each to be ready, and writes an admin kubeconfig.
``stop()`` stops them in reverse order and removes the work dir; it is
idempotent and also runs at interpreter exit.

By default no kube-controller-manager runs (start-up stays a few seconds):
nothing creates ``default`` ServiceAccounts, so the ServiceAccount admission
plugin is disabled (pods are admitted without token injection); no
node-lifecycle controller would remove the ``node.kubernetes.io/not-ready``
taint, so TaintNodesByCondition is disabled too (a Node created through the API
is schedulable at once, as a Node whose kubelet reported Ready); and namespaces
are never finalized after deletion, so tests use fresh namespaces instead of
deleting them. With the controller-manager, ReplicaSets get pods, PDBs get a
status, owned objects are garbage-collected and deleted namespaces go away;
the API server's flags stay the same, and node-lifecycle never runs (the Nodes
have no kubelet: it would taint and evict). With kwok, the Nodes annotated
``kwok.x-k8s.io/node=fake`` behave as if they had one (Ready, a renewed Lease, pods
that run and finish); other Nodes stay as they are written.
"""

from __future__ import annotations

import atexit
import base64
import os
import shutil
import ssl
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from gpupack.devcluster import clients, components, kubeconfig, kueue, kwok, pki
from gpupack.devcluster.apply import apply_objects
from gpupack.devcluster.binaries import CONTROLLER_MANAGER, KWOK, Binaries
from gpupack.devcluster.errors import DevClusterError, PortInUse, StartFailed
from gpupack.devcluster.kueue import SHIPPED_QPS as KUEUE_SHIPPED_QPS
from gpupack.devcluster.state import Component, DevClusterRecord
from gpupack.devcluster.process import ManagedProcess, check_port_free, free_port, wait_until
from sharing.api.keys import KUEUE_ADMISSION_GATE
from sharing.rules.kueue_quota import resource_transformations

ADMIN_USER = "gpupack-admin"
PORT_ATTEMPTS = 3  # starts tried when a port is taken under a component
CONTROLLER_MANAGER_USER = "system:kube-controller-manager"


def _default_timeout() -> float:
    return float(os.environ.get("GPUPACK_START_TIMEOUT", "90"))


@dataclass(frozen=True)
class ControlPlaneConfig:
    """How to run the control plane. Ports of ``None`` are picked free on loopback."""

    workdir: Path | None = None  # None: a fresh temp dir, removed by stop()
    keep_workdir: bool = False  # keep a given workdir's data after stop()
    apiserver_port: int | None = None
    etcd_port: int | None = None
    scheduler: bool = True
    controller_manager: bool = False
    """Also run kube-controller-manager (off by default: start-up time, and most tests need no controllers)."""
    controllers: tuple[str, ...] = components.DEFAULT_CONTROLLERS
    """kube-controller-manager's ``--controllers`` (only with ``controller_manager``); never node-lifecycle."""
    kwok: bool = False
    """Also run kwok: the kubelet of KWOK Nodes (:mod:`gpupack.devcluster.kwok`); off by default. It
    needs no kube-controller-manager; ``gpupack dev cluster up --kwok`` runs both."""
    kueue: Path | None = None
    """Also run Kueue's manager from this binary (``binaries.ensure_kueue``; :mod:`gpupack.devcluster.kueue`),
    after the other components; None: no Kueue."""
    kueue_replicas: int = 4
    """The replica count Kueue counts one ``nvidia.com/gpu.shared`` replica by (``sharing.rules.kueue_quota``)."""
    kueue_qps: int = KUEUE_SHIPPED_QPS
    """Kueue's API request rate (its ``clientConnection.qps``; burst twice that)."""
    authorization_config: Path | None = None
    """kube-apiserver's ``--authorization-config`` (default: ``--authorization-mode=RBAC``)."""
    start_timeout_s: float = field(default_factory=_default_timeout)  # GPUPACK_START_TIMEOUT
    # Kill the components when the starting process dies (tests); False for
    # `gpupack dev cluster up`, whose components outlive the command.
    tie_to_parent: bool = True

    def __post_init__(self) -> None:
        if self.controller_manager:
            components.check_controllers(self.controllers)


class ControlPlane:
    """A running (or runnable) local control plane."""

    def __init__(self, binaries: Binaries, config: ControlPlaneConfig | None = None) -> None:
        self.binaries = binaries
        self.config = config or ControlPlaneConfig()
        self.workdir = self.config.workdir or Path(tempfile.mkdtemp(prefix="gpupack-cp-"))
        self._owns_workdir = self.config.workdir is None
        self._extender: components.SchedulerExtender | None = None
        self.ca = pki.CertificateAuthority()
        self.processes: list[ManagedProcess] = []
        self.ports: dict[str, int] = {}
        self.startup_seconds: float | None = None
        self._admin_pair: pki.KeyPair | None = None

    # ------------------------------------------------------------ properties

    @property
    def server(self) -> str:
        return components.apiserver_url(self.ports)

    @property
    def kubeconfig(self) -> Path:
        """The admin's kubeconfig (group system:masters)."""
        return self.workdir / "admin.kubeconfig"

    @property
    def ca_file(self) -> Path:
        return self.workdir / "pki" / "ca.crt"

    @property
    def log_dir(self) -> Path:
        return self.workdir / "logs"

    # ------------------------------------------------------------ lifecycle

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> ControlPlane:
        began = time.monotonic()
        atexit.register(self.stop)
        try:
            # Before anything starts: a missing binary is a fix to name, not a half-started cluster.
            if self.config.controller_manager:
                self.binaries.require(CONTROLLER_MANAGER)
            if self.config.kwok:
                self.binaries.require(KWOK)
            if self.config.kueue is not None:
                kueue.KueueFiles(self.config.kueue).check()
            for attempt in range(1, PORT_ATTEMPTS + 1):
                try:
                    self._start_components()
                    break
                except PortInUse:
                    # A port was taken between picking (or checking) it and its component binding it:
                    # stop what started and pick afresh; etcd keeps its data dir, as on a restart.
                    if attempt == PORT_ATTEMPTS:
                        raise
                    self._stop_processes()
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - began
        return self

    def _start_components(self) -> None:
        self._pick_ports()
        self._write_pki()
        self._start_etcd()
        self._start_apiserver()
        if self.config.scheduler:
            self._start_scheduler()
        if self.config.controller_manager:
            self._start_controller_manager()
        if self.config.kwok:
            self._start_kwok()
        if self.config.kueue is not None:
            self._start_kueue()

    def _stop_processes(self) -> None:
        for proc in reversed(self.processes):
            proc.stop()
        self.processes.clear()

    def stop(self) -> None:
        self._stop_processes()
        if self._owns_workdir or not self.config.keep_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
        atexit.unregister(self.stop)

    def stop_component(self, name: str) -> None:
        """Stop one component alone (an outage, for fault benchmarks): ``etcd`` (its data stays),
        ``kube-apiserver``, ``kube-scheduler``, ``kube-controller-manager`` or ``kwok``; the others keep
        running."""
        proc = next((p for p in self.processes if p.name == name), None)
        if proc is None:
            raise RuntimeError(f"{name} is not running")
        proc.stop()
        self.processes.remove(proc)

    def start_component(self, name: str) -> None:
        """Start a stopped component again on the same ports, PKI and data, and wait until it is ready."""
        starters = {"etcd": self._start_etcd, "kube-apiserver": self._start_apiserver,
                    "kube-scheduler": self._start_scheduler,
                    CONTROLLER_MANAGER: self._start_controller_manager, KWOK: self._start_kwok,
                    kueue.NAME: self._start_kueue}
        if name not in starters:
            raise ValueError(f"unknown component {name!r}; one of {', '.join(starters)}")
        if any(p.name == name for p in self.processes):
            raise RuntimeError(f"{name} is already running")
        starters[name]()

    def running(self) -> bool:
        return bool(self.processes) and all(p.running() for p in self.processes)

    def detach(self) -> DevClusterRecord:
        """Leave the components running past this process; returns their record.

        For ``gpupack dev cluster up`` (started with ``tie_to_parent=False``):
        after this, ``stop()`` and interpreter exit no longer touch them.
        """
        record = DevClusterRecord(
            workdir=str(self.workdir),
            kubeconfig=str(self.kubeconfig),
            server=self.server,
            ports=dict(self.ports),
            components=tuple(
                Component(p.name, p.pid or 0, str(p.argv[0]), str(p.log_path))
                for p in self.processes
            ),
            started_at=time.time(),
            startup_seconds=self.startup_seconds or 0.0,
        )
        self.processes.clear()
        atexit.unregister(self.stop)
        return record

    # ------------------------------------------------------------ clients

    def admin_client(self) -> Any:
        """A ``kubernetes.client.ApiClient`` acting as the cluster admin."""
        return clients.api_client(self.kubeconfig)

    def serviceaccount_kubeconfig(
        self, name: str, namespace: str = "gpupack-system", seconds: int = clients.TOKEN_SECONDS
    ) -> Path:
        """A kubeconfig acting as ServiceAccount ``namespace/name`` (which must exist)."""
        with self.admin_client() as admin:
            token = clients.request_token(admin, namespace, name, seconds)
        config = kubeconfig.kubeconfig_dict(
            self.server, self.ca.cert_pem, f"system:serviceaccount:{namespace}:{name}",
            token=token, namespace=namespace,
        )
        return kubeconfig.write_kubeconfig(
            self.workdir / "serviceaccounts" / f"{namespace}.{name}.kubeconfig", config
        )

    def node_agent_kubeconfig(
        self, node: str, name: str = "gpupack-node-agent", namespace: str = "gpupack-system",
        seconds: int = clients.TOKEN_SECONDS,
    ) -> Path:
        """A kubeconfig acting as ServiceAccount ``namespace/name`` from a pod on ``node``, as a DaemonSet's
        pod there would: its token is bound to a stand-in Pod of that ServiceAccount bound to ``node``
        (:func:`clients.node_pod`), so the API server puts the node's name in it and the node agent's
        admission policies (manifests/agent/node-restriction-policy.yaml) confine it to that node. The
        token is read once by the client and never renewed: ``seconds`` must outlive the run."""
        with self.admin_client() as admin:
            pod = clients.node_pod(admin, namespace, name, node)
            token = clients.request_token(admin, namespace, name, seconds, pod=pod)
        config = kubeconfig.kubeconfig_dict(
            self.server, self.ca.cert_pem, f"system:serviceaccount:{namespace}:{name}@{node}",
            token=token, namespace=namespace,
        )
        return kubeconfig.write_kubeconfig(
            self.workdir / "serviceaccounts" / f"{namespace}.{name}.{node}.kubeconfig", config
        )

    def serviceaccount_client(self, name: str, namespace: str = "gpupack-system") -> Any:
        """A ``kubernetes.client.ApiClient`` acting as ServiceAccount ``namespace/name``."""
        return clients.api_client(self.serviceaccount_kubeconfig(name, namespace))

    # ------------------------------------------------------------ steps

    def _pick_ports(self) -> None:
        cfg = self.config
        for what, port in (("kube-apiserver", cfg.apiserver_port), ("etcd", cfg.etcd_port)):
            if port is not None:
                check_port_free(port, what)
        self.ports = {
            "apiserver": cfg.apiserver_port or free_port(),
            "etcd": cfg.etcd_port or free_port(),
            "etcd-peer": free_port(),
            "scheduler": free_port(),
        }
        if cfg.controller_manager:
            self.ports["controller-manager"] = free_port()
        if cfg.kwok:
            self.ports["kwok"] = free_port()
        if cfg.kueue is not None:
            self.ports["kueue-webhook"] = free_port()
            self.ports["kueue-health"] = free_port()

    def _write_pki(self) -> None:
        d = self.workdir / "pki"
        self.ca.pair.write(d, "ca")
        self.ca.issue(
            "kube-apiserver", hosts=list(components.APISERVER_HOSTS), server=True,
        ).write(d, "apiserver")
        self._admin_pair = self.ca.issue(ADMIN_USER, organizations=["system:masters"], client=True)
        self._admin_pair.write(d, "admin")
        sched = self.ca.issue("system:kube-scheduler", client=True)
        sa_key, sa_pub = pki.service_account_signing_key()
        (d / "sa.key").touch(mode=0o600)
        (d / "sa.key").write_bytes(sa_key)
        (d / "sa.pub").write_bytes(sa_pub)
        # Written before the API server is up: the URL is all they need.
        kubeconfig.write_kubeconfig(self.kubeconfig, kubeconfig.kubeconfig_dict(
            self.server, self.ca.cert_pem, ADMIN_USER,
            client_cert_pem=self._admin_pair.cert_pem, client_key_pem=self._admin_pair.key_pem,
        ))
        kubeconfig.write_kubeconfig(self.workdir / "scheduler.kubeconfig", kubeconfig.kubeconfig_dict(
            self.server, self.ca.cert_pem, "system:kube-scheduler",
            client_cert_pem=sched.cert_pem, client_key_pem=sched.key_pem,
        ))
        if self.config.controller_manager:
            # The user the bootstrap RBAC policy binds to ClusterRole system:kube-controller-manager.
            kcm = self.ca.issue(CONTROLLER_MANAGER_USER, client=True)
            kubeconfig.write_kubeconfig(
                self.workdir / "controller-manager.kubeconfig", kubeconfig.kubeconfig_dict(
                    self.server, self.ca.cert_pem, CONTROLLER_MANAGER_USER,
                    client_cert_pem=kcm.cert_pem, client_key_pem=kcm.key_pem,
                ))
        if self.config.kwok:
            pair = self.ca.issue(kwok.USER, client=True)
            kubeconfig.write_kubeconfig(self.workdir / "kwok.kubeconfig", kubeconfig.kubeconfig_dict(
                self.server, self.ca.cert_pem, kwok.USER, client_cert_pem=pair.cert_pem, client_key_pem=pair.key_pem,
            ))

    def _write_kueue_pki(self) -> None:
        """Kueue's webhook serving pair from the dev CA (``tls.crt``/``tls.key`` in its cert dir), and a
        metrics pair where Kueue insists on reading one (``kueue.METRICS_CERT_DIR``) if none is there."""
        serving = self.ca.issue("kueue-webhook", hosts=["127.0.0.1", "localhost"], server=True)
        serving.write(self.workdir / "kueue" / "certs", "tls")
        metrics = kueue.METRICS_CERT_DIR
        if not (metrics / "tls.crt").is_file() or not (metrics / "tls.key").is_file():
            try:
                self.ca.issue("kueue-metrics", hosts=["127.0.0.1"], server=True).write(metrics, "tls")
            except OSError as exc:
                raise StartFailed(
                    f"Kueue v0.17 reads a metrics certificate from {metrics} and it cannot be written there: {exc}",
                    f"create {metrics} writable by this user (any tls.crt/tls.key pair will do: nothing is served "
                    "with it), or run without --kueue") from exc

    def _launch(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> ManagedProcess:
        proc = ManagedProcess(name, argv, self.log_dir / f"{name}.log",
                              tie_to_parent=self.config.tie_to_parent, env=env)
        proc.start()
        self.processes.append(proc)
        return proc

    def _wait_answering(self, proc: ManagedProcess, url: str, expect: str = "ok",
                        verify: ssl.SSLContext | bool = True, what: str | None = None) -> None:
        """Wait, up to the start timeout, until ``url`` answers ``expect`` (``what``, by default the
        process and the URL, names the wait in the error); fail fast if ``proc`` exits."""
        wait_until(lambda: _http_ok(url, expect, verify), what or f"{proc.name} {url}", self.config.start_timeout_s, proc)

    def _start_etcd(self) -> None:
        proc = self._launch("etcd", components.etcd_argv(self.binaries, self.workdir, self.ports))
        url = components.etcd_url(self.ports)
        self._wait_answering(proc, f"{url}/health", '"health":"true"', what=f"etcd health at {url}/health")

    def _start_apiserver(self) -> None:
        argv = components.apiserver_argv(self.binaries, self.workdir, self.ports, self.config.authorization_config)
        proc = self._launch("kube-apiserver", argv)
        d = self.workdir / "pki"
        ssl_ctx = ssl.create_default_context(cafile=str(self.ca_file))
        ssl_ctx.load_cert_chain(d / "admin.crt", d / "admin.key")
        self._wait_answering(proc, f"{self.server}/readyz", verify=ssl_ctx)

    def use_scheduler_extender(self, extender: components.SchedulerExtender) -> None:
        """Have kube-scheduler call gpupack's prioritize extender at ``extender`` (the local webhook,
        which serves only once the API server does): its configuration is rewritten and it is
        restarted, as an admin changing ``--config`` restarts it."""
        self._extender = extender
        if any(p.name == "kube-scheduler" for p in self.processes):
            self.stop_component("kube-scheduler")
            self.start_component("kube-scheduler")

    def _start_scheduler(self) -> None:
        components.write_scheduler_config(self.workdir, self._extender)
        argv = components.scheduler_argv(self.binaries, self.workdir, self.ports)
        proc = self._launch("kube-scheduler", argv)
        # Its serving cert is self-signed in --cert-dir; /readyz is open to all.
        self._wait_answering(proc, f"{components.scheduler_url(self.ports)}/readyz", verify=_self_signed_context())

    def _start_controller_manager(self) -> None:
        if not self.config.controller_manager:  # no port, certificate or kubeconfig was made for it
            raise RuntimeError("kube-controller-manager is not part of this control plane: start it "
                               "with ControlPlaneConfig(controller_manager=True)")
        argv = components.controller_manager_argv(self.binaries, self.workdir, self.ports, self.config.controllers)
        proc = self._launch(CONTROLLER_MANAGER, argv)
        # Self-signed serving cert in --cert-dir, like kube-scheduler; /healthz is open to all.
        self._wait_answering(proc, f"{components.controller_manager_url(self.ports)}/healthz",
                             verify=_self_signed_context())

    def _start_kwok(self) -> None:
        if not self.config.kwok:  # no port, certificate or kubeconfig was made for it
            raise RuntimeError("kwok is not part of this control plane: start it with ControlPlaneConfig(kwok=True)")
        # Its rights first: kwok gives up if it cannot list what it manages.
        with self.admin_client() as admin:
            apply_objects(admin, kwok.rbac())
        kwok.write_config(components.kwok_config_path(self.workdir))
        argv = components.kwok_argv(self.binaries, self.workdir, self.ports)
        proc = self._launch(KWOK, argv, components.kwok_env(self.workdir))
        # Plain HTTP on loopback; /healthz answers once its controllers have started.
        self._wait_answering(proc, f"{components.kwok_url(self.ports)}/healthz")


    def _start_kueue(self) -> None:
        files = self.config.kueue
        if files is None:
            raise RuntimeError("Kueue is not part of this control plane: start it with ControlPlaneConfig(kueue=<binary>)")
        built = kueue.KueueFiles(files).check()
        self._write_kueue_pki()
        with self.admin_client() as admin:
            apply_objects(admin, [kueue.namespace(), *kueue.crds(built)])
        config = kueue.write_configuration(self.workdir / "kueue" / "config.yaml", kueue.configuration(
            webhook_port=self.ports["kueue-webhook"], health_port=self.ports["kueue-health"],
            cert_dir=self.workdir / "kueue" / "certs",
            transformations=resource_transformations(self.config.kueue_replicas), qps=self.config.kueue_qps))
        proc = self._launch(kueue.NAME, kueue.argv(built, config, self.kubeconfig))
        # /readyz answers once the webhook server listens with its certificate (Kueue's own check).
        self._wait_answering(proc, f"http://127.0.0.1:{self.ports['kueue-health']}/readyz",
                             what=f"Kueue's readiness at 127.0.0.1:{self.ports['kueue-health']}/readyz")
        url = f"https://127.0.0.1:{self.ports['kueue-webhook']}"
        bundle = base64.b64encode(self.ca.cert_pem).decode()
        with self.admin_client() as admin:
            apply_objects(admin, kueue.webhook_configurations(built.webhook_manifest, url, bundle))
            # The API server picks registrations up asynchronously: dry-run a queued pod until Kueue gates it.
            wait_until(lambda: _kueue_gates(admin), "the API server calling Kueue's pod webhook",
                       self.config.start_timeout_s, proc)


def _kueue_gates(admin: Any) -> bool:
    from kubernetes import client

    probe: Any = kueue.probe_pod()  # a dict body is sent as it is
    try:
        pod: Any = client.CoreV1Api(admin).create_namespaced_pod("default", probe, dry_run="All")
    except client.ApiException:
        return False
    return KUEUE_ADMISSION_GATE in {g.name for g in pod.spec.scheduling_gates or []}


def apiserver_ready(server: str, workdir: str | Path) -> bool:
    """Whether the API server at ``server`` answers /readyz to the admin of ``workdir``."""
    d = Path(workdir) / "pki"
    try:
        ctx = ssl.create_default_context(cafile=str(d / "ca.crt"))
        ctx.load_cert_chain(d / "admin.crt", d / "admin.key")
    except (OSError, ssl.SSLError):
        return False
    return _http_ok(f"{server}/readyz", "ok", ctx)


def _self_signed_context() -> ssl.SSLContext:
    """For the health endpoints of components that serve a self-signed certificate of their own."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def _http_ok(url: str, expect: str, verify: ssl.SSLContext | bool = True) -> bool:
    try:
        response = httpx.get(url, verify=verify, timeout=2.0)
    except (httpx.HTTPError, OSError):
        return False
    return response.status_code == 200 and expect in response.text


__all__ = ["ControlPlane", "ControlPlaneConfig", "DevClusterError"]
