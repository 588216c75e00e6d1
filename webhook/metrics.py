"""Prometheus metrics of the webhook, in a registry of its own (so tests and
several apps in one process do not collide)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

# Sub-millisecond buckets: the webhook's budget is a few ms; the API server's
# own timeout (timeoutSeconds) is the last bucket that matters.
LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
PRIORITIZE_OUTCOMES = ("scored", "malformed", "too_large", "not_synced", "error")
SLOW_CLIENTS_HELP = "Connections closed because a request was not received within request_read_seconds."


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "gpupack_webhook_requests",
            "Admission and authorization requests answered, by endpoint and outcome (allowed, denied, error; "
            "for authorize, denied means no opinion).",
            ["endpoint", "outcome"],
            registry=self.registry,
        )
        self.decisions = Counter(
            "gpupack_webhook_decisions",
            "Pods mutated, by chosen sharing mode and whether they were gated.",
            ["mode", "gated"],
            registry=self.registry,
        )
        self.denials = Counter(
            "gpupack_webhook_denials",
            "Admission requests denied, by reason code.",
            ["reason"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "gpupack_webhook_request_duration_seconds",
            "Time to answer a request inside the app (parse, decide, encode), by endpoint (prioritize: the "
            "scheduler extender).",
            ["endpoint"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.inventory_nodes = Gauge(
            "gpupack_webhook_inventory_nodes", "GPU nodes in the current inventory view.", registry=self.registry
        )
        self.inventory_skipped_policies = Gauge(
            "gpupack_webhook_inventory_skipped_policies",
            "SharingPolicies left out of the inventory view because their spec does not validate.",
            registry=self.registry,
        )
        self.inventory_skipped_entries = Gauge(
            "gpupack_webhook_inventory_skipped_entries",
            "GPUNode status entries (GPUs, MIG instances) left out of the inventory view as unreadable.",
            registry=self.registry,
        )
        self.inventory_synced = Gauge(
            "gpupack_webhook_inventory_synced", "1 once the inventory view is synced.", registry=self.registry
        )
        self.right_sized = Counter(
            "gpupack_webhook_right_sized_pods",
            "Pods whose gpupack request was sized from their workload's GPURecommendation (right-sizing "
            "Initial or Recreate) before the decision.",
            registry=self.registry,
        )
        self.prioritize_calls = Counter(
            "gpupack_webhook_scheduler_prioritize_calls",
            "kube-scheduler prioritize extender calls (POST /scheduler/prioritize), by outcome: scored (200), "
            "malformed (400), too_large (413), not_synced (503: the pod watch has not listed yet), error (503, an internal error, logged). "
            "kube-scheduler ignores every answer but 200 for that pod.",
            ["outcome"],
            registry=self.registry,
        )
        self.tls_reloads = Counter(
            "gpupack_webhook_tls_reloads", "Serving certificate reloads after rotation.", registry=self.registry
        )
        self.slow_clients = Counter("gpupack_webhook_slow_clients_dropped", SLOW_CLIENTS_HELP, registry=self.registry)
        self.connections_refused = Counter(
            "gpupack_webhook_connections_refused",
            "Connections closed before any request: per_source_limit (the source already held "
            "max_connections_per_source), tls_handshake (TLS not completed within tls_handshake_seconds: "
            "timed out, failed or abandoned).",
            ["reason"],
            registry=self.registry,
        )
        self.refused_per_source = self.connections_refused.labels("per_source_limit")
        self.handshakes_unfinished = self.connections_refused.labels("tls_handshake")
        # Pre-create the hot-path children: labels() costs a dict lookup and a lock.
        self._outcome = {
            (e, o): self.requests.labels(e, o) for e in ("mutate", "validate", "authorize") for o in ("allowed", "denied", "error")
        }
        self._latency = {e: self.latency.labels(e) for e in ("mutate", "validate", "authorize", "prioritize")}
        self._prioritize = {o: self.prioritize_calls.labels(o) for o in PRIORITIZE_OUTCOMES}

    def observe(self, endpoint: str, outcome: str, seconds: float) -> None:
        self._outcome[(endpoint, outcome)].inc()
        self._latency[endpoint].observe(seconds)

    def observe_prioritize(self, outcome: str, seconds: float) -> None:
        """One prioritize extender call (``outcome``: one of :data:`PRIORITIZE_OUTCOMES`)."""
        self._prioritize[outcome].inc()
        self._latency["prioritize"].observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
