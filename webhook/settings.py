"""Settings of the admission webhook: one documented group, passed in explicitly.

Every field can also be set from an environment variable ``GPUPACK_WEBHOOK_<FIELD>``
(upper case), which is how the Deployment in ``manifests/webhook`` configures
it; command-line flags win over the environment.
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Mapping
from typing import Any

from kube.settings import settings_from_env

ENV_PREFIX = "GPUPACK_WEBHOOK_"


PLACEMENTS = ("engine", "scheduler")


@dataclass(frozen=True)
class WebhookSettings:
    host: str = "0.0.0.0"
    """Address to listen on. All interfaces: the API server reaches the pod through its Service."""
    port: int = 8443
    """TCP port for HTTPS. 8443: unprivileged, and the port the Service targets."""
    tls_cert: str = ""
    """PEM certificate chain file (``tls.crt`` of the cert-manager Secret)."""
    tls_key: str = ""
    """PEM private key file (``tls.key``)."""
    tls_reload_seconds: float = 10.0
    """How often (s) to check the certificate files for rotation. cert-manager renews
    a certificate well before expiry (default: at 2/3 of its lifetime) and the kubelet
    updates the mounted Secret within about a minute, so 10 s adds little delay at
    negligible cost (two ``stat`` calls)."""
    inventory_file: str = ""
    """Serve the inventory from this YAML/JSON file instead of watching GPUNode objects."""
    max_body_bytes: int = 3 * 1024 * 1024
    """Largest AdmissionReview accepted (bytes). The API server stores objects of up to
    1.5 MiB (etcd's default request limit); a review of a pod that large, JSON-encoded
    with its envelope, stays under 3 MiB. Larger bodies are answered with a denial
    (fail closed) without being parsed."""
    request_read_seconds: float = 10.0
    """A client must send each whole request (headers and body) within this many seconds of
    its first byte, and begin its first one this soon after connecting; slower clients are
    disconnected (``webhook.slow_clients``). The API server needs well under a second."""
    max_connections: int = 2000
    """Open connections (and requests in flight) beyond which new requests are answered 503
    at once (uvicorn's ``limit_concurrency``): bounds memory and file descriptors under a flood.
    The API server keeps a few pooled connections per replica; a stalled connection costs
    about 0.1 MiB and lives at most ``request_read_seconds``, so 2000 stay well inside the
    manifest's 512Mi (benchmarks/faults.md)."""
    max_connections_per_source: int = 500
    """Open connections one source address may hold; more from it are closed as soon as they
    are made (``webhook.source_limits``), so one client cannot take the whole ``max_connections``
    and leave the API server's calls 503. A quarter of the global cap: the API server needs a
    few pooled connections per replica (more only in a burst, each call taking about a ms), and
    each of its replicas is a source of its own. It does not stop many sources at once: the
    NetworkPolicy (``apiServerCIDR``) admits only the API server's addresses."""
    tls_handshake_seconds: float = 10.0
    """A client must complete its TLS handshake this soon after connecting, or the connection is
    closed (counted in ``gpupack_webhook_connections_refused_total{reason="tls_handshake"}``);
    the event loop's own default is 60 s. The API server needs a few ms."""
    node_agent_user: str = "system:serviceaccount:gpupack-system:gpupack-node-agent"
    """Whose pod lists ``POST /authorize`` decides (``webhook.authorization``): the node
    agents' ServiceAccount, as kube-apiserver names it."""
    log_level: str = "info"
    """uvicorn/gpupack log level: critical, error, warning, info, debug."""
    access_log: bool = False
    """Log every request line. Off by default: the webhook sees every pod create, and
    the metrics carry the same information at a fraction of the cost."""
    resync_seconds: float = 300.0
    """How long (s) one watch request of the inventory's informers lasts (``kube.informer``);
    the next one resumes from the last version seen, with no list. A watch resumed from its
    version misses no event; renewing it bounds how long a connection that died silently
    goes unnoticed. A list is made only at start, after ``410 Gone`` and after a failure (at
    fleet size a list of every GPUNode is the costly request)."""
    inventory_coalesce_seconds: float = 0.2
    """Least time (s) between two inventory snapshots the watches publish
    (``webhook.inventory_watch.COALESCE_SECONDS`` says why 0.2). A change after a quiet moment
    is published at once; 0 publishes every change that matters (heartbeats never publish)."""
    placement: str = "engine"
    """Who chooses a gpupack pod's node. ``engine``: every gpupack pod waits at the
    ``gpupack.io/capacity`` gate and the cluster controller's packing engine pins it to
    the node it chooses (the density the product model measures: docs/controller.md,
    "Every fractional pod placed by the engine"); if the controller is down, pods wait
    at the gate and none is placed wrongly. ``scheduler``: pods whose capacity exists
    are left ungated for kube-scheduler's own scoring (less dense; no controller
    round trip before binding)."""

    scheduler_extender: bool = True
    """Serve kube-scheduler's prioritize extender (``POST /scheduler/prioritize``, docs/priority.md,
    "kube-scheduler's pods"): it keeps a watch of every pod of the cluster (needs ``list`` and
    ``watch`` on pods) and scores nodes by the placement preference by priority. Off: no pod
    watch, and the route is not served. Only where the webhook watches the API (not with
    ``inventory_file``)."""

    def validate(self) -> None:
        if not 0 < self.port < 65536:
            raise ValueError(f"port {self.port} is not a TCP port (1..65535)")
        if self.max_body_bytes < 1024:
            raise ValueError(f"max_body_bytes {self.max_body_bytes} is too small for any AdmissionReview "
                             "(at least 1024; default 3 MiB)")
        if (self.tls_reload_seconds <= 0 or self.resync_seconds <= 0 or self.request_read_seconds <= 0
                or self.tls_handshake_seconds <= 0):
            raise ValueError("tls_reload_seconds, resync_seconds, request_read_seconds and tls_handshake_seconds "
                             "must be greater than 0")
        if self.inventory_coalesce_seconds < 0:
            raise ValueError(f"inventory_coalesce_seconds must be 0 or more, got {self.inventory_coalesce_seconds}")
        if self.max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, got {self.max_connections}")
        if self.max_connections_per_source < 1:
            raise ValueError(f"max_connections_per_source must be at least 1, got {self.max_connections_per_source}")
        if self.placement not in PLACEMENTS:
            raise ValueError(f"placement {self.placement!r} is not one of {', '.join(PLACEMENTS)}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> WebhookSettings:
        """Defaults, then ``GPUPACK_WEBHOOK_*`` variables, then non-None ``overrides`` (``kube.settings``)."""
        return settings_from_env(cls, ENV_PREFIX, environ, overrides)
