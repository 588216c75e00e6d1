"""Prometheus metrics of the node agent (own registry, served on ``metrics_port``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from node.snapshot import NodeSnapshot


class AgentMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.backend = Gauge("gpupack_agent_backend_info", "NVML backend in use (1).", ["kind"], registry=r)
        self.nvml_up = Gauge("gpupack_agent_nvml_up", "1 if NVML answered the last read.", registry=r)
        self.gpus = Gauge("gpupack_agent_gpus", "GPUs NVML reports on this node.", registry=r)
        self.instances = Gauge("gpupack_agent_mig_instances", "MIG instances by GPU and profile.",
                               ["gpu", "profile"], registry=r)
        self.in_use = Gauge("gpupack_agent_mig_instances_in_use", "MIG instances with a process or pod.",
                            ["gpu", "profile"], registry=r)
        self.util = Gauge("gpupack_agent_gpu_utilization_percent",
                          "GPU utilisation (absent on MIG-enabled GPUs: NVML does not report it).",
                          ["gpu"], registry=r)
        self.memory = Gauge("gpupack_agent_gpu_memory_used_mib", "GPU memory used by processes, MiB.",
                            ["gpu"], registry=r)
        self.reconfigurations = Counter("gpupack_agent_reconfigurations", "Finished MIG reconfigurations.",
                                        ["outcome"], registry=r)
        self.reconfigure_seconds = Histogram(
            "gpupack_agent_reconfiguration_seconds", "Journal start to Node allocatable updated.",
            buckets=(1, 2, 5, 10, 20, 30, 60, 120, 300, 600), registry=r)
        self.nvml_errors = Counter("gpupack_agent_nvml_errors", "NVML errors by code name.", ["code"], registry=r)
        self.patches = Counter("gpupack_agent_status_patches", "GPUNode status patches sent.", registry=r)
        self.api_errors = Counter("gpupack_agent_api_errors", "Kubernetes API errors.", ["status"], registry=r)
        self.consecutive_failures = Gauge(
            "gpupack_agent_consecutive_failures", "Agent ticks failed in a row (API server or NVML down).", registry=r)
        self.backoff_seconds = Gauge(
            "gpupack_agent_backoff_seconds", "Pause before the next attempt after a failure; 0 while healthy.", registry=r)

    def serve(self, port: int) -> None:
        if port:
            start_http_server(port, registry=self.registry)

    def observe(self, snapshot: NodeSnapshot, busy_gi: dict[int, frozenset[int]]) -> None:
        self.backend.labels(snapshot.backend).set(1)
        self.nvml_up.set(0 if snapshot.error else 1)
        self.gpus.set(len(snapshot.gpus))
        self.instances.clear()
        self.in_use.clear()
        for gpu in snapshot.gpus:
            index = str(gpu.info.index)
            for inst in gpu.instances:
                self.instances.labels(index, inst.profile).inc()
                if inst.gi_id in busy_gi.get(gpu.info.index, frozenset()):
                    self.in_use.labels(index, inst.profile).inc()
            if gpu.utilization is not None:
                self.memory.labels(index).set(gpu.utilization.memory_used_mib)
                if gpu.utilization.gpu_percent is not None:
                    self.util.labels(index).set(gpu.utilization.gpu_percent)
