"""Fixtures for end-to-end tests: one real control plane (etcd, kube-apiserver,
kube-scheduler) per test session, gpupack's manifests applied, and clients that
act as the admin or as gpupack's own ServiceAccounts.

Every test under tests/e2e gets the ``e2e`` marker. The binaries are built on
demand (tools/k8s/build.sh, progress streamed) right after collection, outside
any test's timeout. If they cannot be built, the e2e tests FAIL with the cause
and the fix; only ``GPUPACK_SKIP_E2E=1`` skips them, deliberately.

Fixture API (see docs/controlplane.md):

* ``helm``, ``kustomize`` -> paths of the pinned binaries (``tools/<tool>/build.sh``)
* ``prometheus_binary`` -> the pinned Prometheus server (``tools/prometheus/build.sh``), built on demand
* ``private_control_plane`` -> a module's own control plane (no kube-scheduler)
* ``controller_manager_plane`` -> a module's own control plane with kube-controller-manager
  (its default controllers; no kube-scheduler), built on demand like the others
* ``controller_manager_scheduler_plane`` -> the same with kube-scheduler too (pods that
  ReplicaSets create get bound)
* ``kwok_plane`` -> a module's own control plane with kube-scheduler, kube-controller-manager and
  kwok (``gpupack dev cluster up --kwok``); kwok is built on demand (docs/kwok.md)
* ``control_plane`` -> :class:`gpupack.devcluster.controlplane.ControlPlane`
  (``.kubeconfig``, ``.server``, ``.ca`` to issue webhook serving certs,
  ``.admin_client()``, ``.serviceaccount_kubeconfig(name)``, ...)
* ``admin_client`` -> ``kubernetes.client.ApiClient`` as the cluster admin
* ``gpupack_installed`` -> objects applied from manifests/{namespace,crds,rbac}, and the node agent's
  admission policies (node isolation on: an agent needs ``agent_kubeconfig(node)``)
* ``apply_manifests(*paths_or_dicts, field_manager=...)`` -> server-side apply
* ``sa_client(name)`` / ``sa_kubeconfig(name)`` -> ServiceAccount ``gpupack-system/<name>``
* ``agent_kubeconfig(node)`` -> ``gpupack-node-agent`` with a token bound to a pod on ``node``
* ``namespace`` -> a fresh namespace for one test
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from gpupack.devcluster.apply import apply_objects, gpupack_manifests, load_manifests, node_isolation_manifests
from gpupack.devcluster.binaries import Binaries, ensure_binaries, ensure_helm, ensure_kustomize, ensure_prometheus
from gpupack.devcluster.controlplane import ControlPlane, ControlPlaneConfig
from gpupack.devcluster.errors import DevClusterError
from gpupack.devcluster.state import Component, alive
from tests.e2e.planes import own_plane

SKIP_ENV = "GPUPACK_SKIP_E2E"
E2E_DIR = Path(__file__).resolve().parent
_binaries: Binaries | None = None
_build_error: str | None = None
_controller_manager_error: str | None = None
_tools: dict[str, Path] = {}
_tool_errors: dict[str, str] = {}


def _skip_requested() -> bool:
    return os.environ.get(SKIP_ENV, "") not in ("", "0")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark e2e tests; build the binaries once if any e2e test will run."""
    global _binaries, _build_error, _controller_manager_error
    e2e = [item for item in items if E2E_DIR in Path(str(item.path)).parents]
    # kube-controller-manager is optional: built only if a collected test needs it.
    with_controller_manager = any(name in getattr(item, "fixturenames", ())
                                  for item in e2e for name in CONTROLLER_MANAGER_FIXTURES)
    for item in e2e:
        item.add_marker(pytest.mark.e2e)
    if not e2e or _skip_requested() or _binaries is not None or _build_error is not None:
        return
    capture = config.pluginmanager.getplugin("capturemanager")
    try:
        # Stream the (first-time, many-minute) build to the terminal.
        with capture.global_and_fixture_disabled():
            _binaries = ensure_binaries(progress=sys.stderr)
    except DevClusterError as exc:
        _build_error = str(exc)
    except Exception as exc:  # noqa: BLE001 - report any build breakage as the tests' failure
        _build_error = f"building the control plane failed unexpectedly: {exc!r}"
    if with_controller_manager and _binaries is not None:
        try:
            with capture.global_and_fixture_disabled():
                ensure_binaries(progress=sys.stderr, controller_manager=True)
        except DevClusterError as exc:
            _controller_manager_error = str(exc)
        except Exception as exc:  # noqa: BLE001
            _controller_manager_error = f"building kube-controller-manager failed unexpectedly: {exc!r}"
    for name, ensure in (("helm", ensure_helm), ("kustomize", ensure_kustomize)):
        try:
            with capture.global_and_fixture_disabled():
                _tools[name] = ensure(progress=sys.stderr)
        except DevClusterError as exc:
            _tool_errors[name] = str(exc)
        except Exception as exc:  # noqa: BLE001
            _tool_errors[name] = f"building {name} failed unexpectedly: {exc!r}"


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    if _skip_requested():
        pytest.skip(f"{SKIP_ENV}=1 is set: e2e tests against a real control plane skipped")
    if _build_error is not None or _binaries is None:
        pytest.fail(
            "cannot run e2e tests: the control-plane binaries are unavailable.\n"
            f"{_build_error or 'they were not built (collection hook did not run)'}\n"
            f"(set {SKIP_ENV}=1 only to skip these tests on purpose)",
            pytrace=False,
        )
    try:
        plane = ControlPlane(_binaries).start()
    except DevClusterError as exc:
        pytest.fail(f"the local control plane did not start:\n{exc}", pytrace=False)
    components = [Component(p.name, p.pid or 0, str(p.argv[0]), str(p.log_path))
                  for p in plane.processes]
    yield plane
    plane.stop()
    stray = [c.name for c in components if alive(c)]
    assert not stray, f"still running after stop(): {stray}"


def _tool(name: str) -> Path:
    if _skip_requested():
        pytest.skip(f"{SKIP_ENV}=1 is set: e2e tests skipped")
    if name not in _tools:
        pytest.fail(f"cannot run this test: {name} is unavailable.\n{_tool_errors.get(name, 'not built')}",
                    pytrace=False)
    return _tools[name]


@pytest.fixture(scope="session")
def helm() -> Path:
    """The pinned helm binary (tools/helm/build.sh, or $GPUPACK_HELM): the chart tests fail without it."""
    return _tool("helm")


@pytest.fixture(scope="session")
def kustomize() -> Path:
    """The pinned kustomize binary (tools/kustomize/build.sh, or $GPUPACK_KUSTOMIZE)."""
    return _tool("kustomize")


@pytest.fixture(scope="session")
def prometheus_binary(request: pytest.FixtureRequest) -> Path:
    """The pinned Prometheus server (tools/prometheus/build.sh, or $GPUPACK_PROMETHEUS), built here if it is
    not cached yet (minutes, streamed; CI builds it before the tests); fails with the cause and fix when it
    cannot be built."""
    if _skip_requested():
        pytest.skip(f"{SKIP_ENV}=1 is set: e2e tests skipped")
    capture = request.config.pluginmanager.getplugin("capturemanager")
    try:
        with capture.global_and_fixture_disabled():
            return ensure_prometheus(progress=sys.stderr)
    except DevClusterError as exc:
        pytest.fail(f"cannot run this test: Prometheus is unavailable.\n{exc}\n"
                    f"(set {SKIP_ENV}=1 only to skip the e2e tests on purpose)", pytrace=False)


@pytest.fixture(scope="module")
def private_control_plane(control_plane: ControlPlane) -> Iterator[ControlPlane]:
    """A control plane of the module's own, without kube-scheduler, for tests that stop its parts or
    install what the shared one already holds (``control_plane`` for its binaries only)."""
    own = ControlPlane(control_plane.binaries, ControlPlaneConfig(scheduler=False)).start()
    try:
        yield own
    finally:
        own.stop()


CONTROLLER_MANAGER_FIXTURE = "controller_manager_plane"
CONTROLLER_MANAGER_FIXTURES = (CONTROLLER_MANAGER_FIXTURE, "controller_manager_scheduler_plane")
"""Fixtures that need kube-controller-manager: built after collection only if a test uses one."""


def _plane_with_controller_manager(control_plane: ControlPlane, *, scheduler: bool) -> Iterator[ControlPlane]:
    if _controller_manager_error is not None:
        pytest.fail(f"cannot run this test: kube-controller-manager is unavailable.\n{_controller_manager_error}\n"
                    f"(set {SKIP_ENV}=1 only to skip the e2e tests on purpose)", pytrace=False)
    yield from own_plane(control_plane.binaries, ControlPlaneConfig(scheduler=scheduler, controller_manager=True),
                         "kube-controller-manager")


@pytest.fixture(scope="module")
def controller_manager_plane(control_plane: ControlPlane) -> Iterator[ControlPlane]:
    """A control plane of the module's own with kube-controller-manager (default controllers,
    no kube-scheduler); fails with the cause and fix when kube-controller-manager cannot be built."""
    yield from _plane_with_controller_manager(control_plane, scheduler=False)


@pytest.fixture(scope="module")
def controller_manager_scheduler_plane(control_plane: ControlPlane) -> Iterator[ControlPlane]:
    """A control plane of the module's own with kube-controller-manager (default controllers) and
    kube-scheduler (the shipped packing configuration): a ReplicaSet's pods are created and bound."""
    yield from _plane_with_controller_manager(control_plane, scheduler=True)


@pytest.fixture(scope="module")
def kwok_plane(control_plane: ControlPlane, request: pytest.FixtureRequest) -> Iterator[ControlPlane]:
    """A control plane of the module's own with kube-scheduler, kube-controller-manager and kwok, as
    ``gpupack dev cluster up --kwok`` runs them. kwok is built here if it is not cached yet
    (``tools/k8s/build.sh kwok``, minutes, streamed; CI builds it before the tests); fails with the
    cause and fix when it cannot be built."""

    capture = request.config.pluginmanager.getplugin("capturemanager")
    try:
        with capture.global_and_fixture_disabled():
            binaries = ensure_binaries(progress=sys.stderr, controller_manager=True, kwok=True)
    except DevClusterError as exc:
        pytest.fail(f"cannot run this test: kwok is unavailable.\n{exc}\n"
                    f"(set {SKIP_ENV}=1 only to skip the e2e tests on purpose)", pytrace=False)
    yield from own_plane(binaries, ControlPlaneConfig(scheduler=True, controller_manager=True, kwok=True), "kwok")


@pytest.fixture(scope="session")
def admin_client(control_plane: ControlPlane) -> Iterator[Any]:
    with control_plane.admin_client() as api:
        yield api


@pytest.fixture(scope="session")
def gpupack_installed(admin_client: Any) -> list[dict[str, Any]]:
    """gpupack's namespace, CRDs (Established) and RBAC, server-side applied once, with node isolation on
    (the node agent's admission policies: an agent runs with ``agent_kubeconfig(node)``)."""
    return apply_objects(admin_client, gpupack_manifests() + node_isolation_manifests(), field_manager="gpupack-e2e")


@pytest.fixture(scope="session")
def apply_manifests(admin_client: Any) -> Callable[..., list[dict[str, Any]]]:
    """``apply_manifests(path_or_dict, ..., field_manager="gpupack-e2e")`` as the admin."""

    def apply(*items: Path | str | dict[str, Any],
              field_manager: str = "gpupack-e2e") -> list[dict[str, Any]]:
        objects: list[dict[str, Any]] = []
        for item in items:
            objects += [item] if isinstance(item, dict) else load_manifests(item)
        return apply_objects(admin_client, objects, field_manager=field_manager)

    return apply


@pytest.fixture(scope="session")
def sa_kubeconfig(
    control_plane: ControlPlane, gpupack_installed: list[dict[str, Any]]
) -> Callable[[str], Path]:
    """``sa_kubeconfig("gpupack-webhook")`` -> kubeconfig of that ServiceAccount."""
    cache: dict[str, Path] = {}

    def get(name: str, namespace: str = "gpupack-system") -> Path:
        key = f"{namespace}/{name}"
        if key not in cache:
            cache[key] = control_plane.serviceaccount_kubeconfig(name, namespace)
        return cache[key]

    return get


@pytest.fixture(scope="session")
def agent_kubeconfig(
    control_plane: ControlPlane, gpupack_installed: list[dict[str, Any]]
) -> Callable[[str], Path]:
    """``agent_kubeconfig(node)`` -> kubeconfig of ``gpupack-node-agent`` as its pod on ``node`` (which must
    exist) would have it: a token bound to a stand-in pod there, confined to that node by the policies."""
    return control_plane.node_agent_kubeconfig


@pytest.fixture(scope="session")
def sa_client(
    control_plane: ControlPlane, sa_kubeconfig: Callable[[str], Path]
) -> Iterator[Callable[[str], Any]]:
    """``sa_client("gpupack-controller")`` -> ApiClient acting as that ServiceAccount."""
    from gpupack.devcluster.clients import api_client

    clients: dict[str, Any] = {}

    def get(name: str) -> Any:
        if name not in clients:
            clients[name] = api_client(sa_kubeconfig(name))
        return clients[name]

    yield get
    for api in clients.values():
        api.close()


@pytest.fixture
def namespace(admin_client: Any) -> str:
    """A fresh namespace. Not deleted: no controller-manager finalizes namespaces here."""
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    client.CoreV1Api(admin_client).create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(name=name))
    )
    return name
