"""The part of a Kubernetes client that every gpupack component shares.

Each component keeps a small subclass of :class:`KubeClient` with the calls it
makes (``controller/kube.py``, ``node/base/kube.py``); what they have in common lives
here once:

- **credentials**: :func:`api_client` loads in-cluster credentials inside a pod,
  else a kubeconfig file, and turns every failure into :class:`KubeConfigError`
  naming where it looked;
- **errors**: :meth:`KubeClient.call` turns the client library's exceptions into
  :class:`~kube.errors.KubeError` (an unreachable API server included, as status 0),
  so callers catch one class;
- **retries**: a call marked ``idempotent`` is tried again after a short back-off
  when the failure is transient (the server overloaded or restarting, or the
  connection dropped). Non-idempotent calls (creates, guarded JSON patches) are
  never retried here: a lost answer to a request that did land would turn into a
  false conflict, and their callers already re-read and re-plan;
- **events**: :meth:`KubeClient.event` writes one ``core/v1`` Event the same way
  for every component;
- **ConfigMaps**: read, and written guarded by ``resourceVersion`` (the agent writes
  the device plugin's, the controller mig-manager's).
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, cast

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError as TransportError

from kube.errors import KubeError, from_api_exception
from kube.inputfile import InputFileError, read_text

log = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
EVENT_NAMESPACE = "default"
"""Events about cluster-scoped objects (GPUNodes) need a namespace; they go here."""

UNREACHABLE = 0
"""The :attr:`KubeError.status` of a request that got no HTTP answer at all."""

TRANSIENT_STATUSES = frozenset({UNREACHABLE, 429, 500, 502, 503, 504})
"""Failures that say nothing about the request itself: trying again may succeed."""

RETRY_DELAYS_S = (0.2, 1.0)
"""Back-off before the second and third attempt of an idempotent call. Kept short:
every caller runs in a loop that tries again on its next pass anyway."""

EVENT_MESSAGE_LIMIT = 1024

T = TypeVar("T")
C = TypeVar("C", bound="KubeClient")


class KubeConfigError(Exception):
    """No usable kubeconfig or in-cluster credentials."""


def api_client(kubeconfig: str | None = None) -> client.ApiClient:
    """In-cluster credentials inside a pod (unless ``kubeconfig`` is given), else ``kubeconfig`` or ``$KUBECONFIG``."""
    # urllib3 warns on each of its own connection retries (three per call): while the API server is
    # down that is most of a component's log. The components log an outage once (kube.backoff).
    logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)
    try:
        if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            cfg = client.Configuration()
            config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
            return client.ApiClient(cfg)
        _check_kubeconfig_files(kubeconfig)
        return config.new_client_from_config(config_file=kubeconfig)  # type: ignore[no-untyped-call,no-any-return]
    except InputFileError as exc:
        raise KubeConfigError(f"cannot load Kubernetes credentials: {exc}") from None
    except (config.ConfigException, OSError, ValueError, TypeError) as exc:
        where = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
        raise KubeConfigError(f"cannot load Kubernetes credentials from {where}: {exc}") from None


def _check_kubeconfig_files(kubeconfig: str | None) -> None:
    """Each kubeconfig the client library would read, read once through kube.inputfile first: the
    library reads a FIFO or /dev/zero without end and recurses on a deeply nested document.
    Missing files are left to the library (it skips missing $KUBECONFIG entries)."""
    paths = [kubeconfig] if kubeconfig else os.environ.get("KUBECONFIG", "~/.kube/config").split(os.pathsep)
    for path in (os.path.expanduser(p) for p in paths if p):
        if os.path.lexists(path):
            read_text(path, syntax="yaml")


def is_transient(error: KubeError) -> bool:
    return error.status in TRANSIENT_STATUSES


def as_kube_error(exc: ApiException | TransportError) -> KubeError:
    if isinstance(exc, ApiException):
        return from_api_exception(exc)
    return KubeError(UNREACHABLE, f"API server unreachable: {exc}")


def call(fn: Callable[..., T], *args: Any, idempotent: bool = False,
         sleep: Callable[[float], None] = time.sleep, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` with the client's failures as :class:`KubeError`, retried when safe and useful."""
    attempts = 1 + (len(RETRY_DELAYS_S) if idempotent else 0)
    for attempt in range(attempts):
        try:
            return fn(*args, **kwargs)
        except (ApiException, TransportError) as exc:
            error = as_kube_error(exc)
            if attempt + 1 == attempts or not is_transient(error):
                raise error from None
            delay = RETRY_DELAYS_S[attempt]
            # Debug only: during an outage every call fails; the caller's loop logs the outage once.
            log.debug("transient Kubernetes API failure (%s); retrying in %.1fs", error, delay)
            sleep(delay)
    raise AssertionError("unreachable: the last attempt returns or raises")


def event_body(involved: Mapping[str, Any], type_: str, reason: str, message: str, component: str,
               now: dt.datetime, host: str | None = None) -> dict[str, Any]:
    """A ``core/v1`` Event about ``involved`` (apiVersion, kind, name, namespace, uid); ``host``: the node
    it is reported from (``source.host``), which the node agent's Events about pods must name (its own)."""
    namespace = str(involved.get("namespace") or EVENT_NAMESPACE)
    stamp = now.astimezone(dt.timezone.utc).isoformat()
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"generateName": f"{involved.get('name') or 'gpupack'}.", "namespace": namespace},
        "involvedObject": {k: v for k, v in involved.items()
                           if k in ("apiVersion", "kind", "name", "namespace", "uid") and v},
        "type": type_, "reason": reason, "message": message[:EVENT_MESSAGE_LIMIT],
        "source": {"component": component, **({"host": host} if host else {})},
        "reportingComponent": component, "reportingInstance": component,
        "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
    }


class KubeClient:
    """One API connection and the calls every component makes the same way."""

    component = "gpupack"
    """Who the Events this client writes come from (``source.component``)."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self._core = client.CoreV1Api(api)
        self._custom = client.CustomObjectsApi(api)

    @classmethod
    def connect(cls: type[C], kubeconfig: str | None = None) -> C:
        return cls(api_client(kubeconfig))

    def close(self) -> None:
        self.api.close()  # type: ignore[no-untyped-call]

    def to_dict(self, obj: Any) -> dict[str, Any]:
        """The wire form of a client model object."""
        data = self.api.sanitize_for_serialization(obj)  # type: ignore[no-untyped-call]
        return data if isinstance(data, dict) else {}

    def event(self, involved: Mapping[str, Any], type_: str, reason: str, message: str, host: str | None = None) -> None:
        """Record a ``core/v1`` Event (``type_`` is ``Normal`` or ``Warning``), reported from node ``host`` if given;
        callers decide whether a failure matters."""
        body = event_body(involved, type_, reason, message, self.component, dt.datetime.now(dt.timezone.utc), host)
        call(self._core.create_namespaced_event, body["metadata"]["namespace"], cast(Any, body))

    def get_configmap(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self.to_dict(call(self._core.read_namespaced_config_map, name, namespace, idempotent=True))
        except KubeError as exc:
            if exc.not_found:
                return None
            raise

    def write_configmap(self, namespace: str, name: str, data: Mapping[str, str], resource_version: str | None) -> None:
        """Create (``resource_version`` None) or replace guarded by ``resource_version`` (409 on a race)."""
        meta: dict[str, Any] = {"name": name, "namespace": namespace}
        if resource_version is not None:
            meta["resourceVersion"] = resource_version
        body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": dict(data)}
        if resource_version is None:
            call(self._core.create_namespaced_config_map, namespace, cast(Any, body))
        else:
            call(self._core.replace_namespaced_config_map, name, namespace, cast(Any, body))

