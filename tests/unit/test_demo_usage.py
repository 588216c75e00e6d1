"""What ``gpupack demo --usage-trace`` shows of the pods' use: the agents' per-pod series, read over real HTTP
(loopback) from the agent's own metrics registry."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prometheus_client import start_http_server

from gpupack.demo.usage import PodUse, pod_series, scrape
from gpupack.devcluster.process import free_port
from node.metrics import AgentMetrics
from node.usage.attribution import PodGpuUse


@pytest.fixture
def agent_url() -> Iterator[str]:
    metrics = AgentMetrics()
    metrics.observe_pod_usage([
        PodGpuUse("ml/a", "c", 0, "GPU-0", None, "processes", 30.0, 2048),
        PodGpuUse("ml/a", "c", 1, "GPU-1", None, "processes", 10.0, 1024),  # a pod on two GPUs
        PodGpuUse("ml/b", "c", 0, "GPU-0", None, "processes", 50.0, 4096),
        PodGpuUse("ml/m", "c", 2, "GPU-2", 3, "instance", None, 8192, "no activity for MIG instance 3"),
    ])
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=metrics.registry)
    yield f"http://127.0.0.1:{port}/metrics"
    server.shutdown()
    thread.join(timeout=5)


def test_each_pods_series_summed_over_its_devices(agent_url: str) -> None:
    series = pod_series(agent_url)
    assert series[("ml", "a")] == {"DCGM_FI_DEV_GPU_UTIL": 40.0, "DCGM_FI_DEV_FB_USED": 3072.0,
                                   "gpupack_pod_gpu_use_attributed": 1.0}
    assert series[("ml", "m")] == {"DCGM_FI_DEV_FB_USED": 8192.0, "gpupack_pod_gpu_use_attributed": 0.0}


def test_the_demo_line_counts_measured_pods_and_skips_an_agent_that_does_not_answer(agent_url: str) -> None:
    silent = f"http://127.0.0.1:{free_port()}/metrics"
    use = scrape([agent_url, silent])
    assert use == PodUse(pods=3, measured=2, mean_util_percent=45.0, memory_gib=15.0)
    assert use.line() == "use: 3 pods, 2 measured, mean GPU util 45.0%, GPU memory 15.0 GiB"
