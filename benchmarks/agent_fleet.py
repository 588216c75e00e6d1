"""What ``gpupack agent fleet`` costs: N simulated nodes' agents in one process, at rest.

    python benchmarks/agent_fleet.py --nodes 100 500 --out benchmarks/agent_fleet.json
    python benchmarks/agent_fleet.py --nodes --baseline-agents 5 --out benchmarks/agent_fleet.json
    python benchmarks/agent_fleet.py --nodes 10 --window 30 --json          # a smoke run

What runs, per N: the local control plane with KWOK (``gpupack.devcluster``: etcd,
kube-apiserver, kwok; gpupack's CRDs applied), N KWOK nodes annotated
``gpupack.io/simulated-gpus=MODEL:8`` (``--model``, default A100-40GB), and one
``gpupack agent fleet`` process serving them, with its defaults (30 s poll, 60 s
heartbeat, 4 workers) unless ``--fleet-arg`` says otherwise. Nothing changes
while it is measured: no pods, no specs, no policies.

Measured:

* **start**: seconds from the fleet's start until every node's GPUNode is published;
* **at rest**, over ``--window`` seconds after ``--settle`` seconds: the fleet's CPU
  seconds per second (``/proc/PID/stat``), its peak and final RSS (``VmHWM``,
  ``VmRSS``); its API requests by verb and resource (its own counters, from its
  Prometheus endpoint: the agents' steps and the caches' lists and watches apart),
  writes per node per minute, steps per second; and the API server's own count
  (``apiserver_request_total`` from its ``/metrics``, read as the admin) by verb
  and resource over the same window, which includes kwok's Lease renewals and
  node heartbeats, reported apart from gpupack's resources.

``--baseline-agents K`` measures the other way for comparison, on a control plane of its
own: K nodes each served by its own ``gpupack agent run --simulate ... --emulate-device-plugin``
process (the DaemonSet's way, 5 s poll), at rest over the same window: CPU and RSS per
process, and the API server's requests per node per minute by verb and resource.

The control plane's processes run on the same machine (``os.cpu_count()`` is
recorded), so the fleet's CPU and the API server's share it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from gpupack.devcluster import kwok  # noqa: E402
from gpupack.devcluster.apply import apply_objects, gpupack_manifests  # noqa: E402
from gpupack.devcluster.binaries import ensure_binaries  # noqa: E402
from gpupack.devcluster.controlplane import ControlPlane, ControlPlaneConfig  # noqa: E402
from gpupack.devcluster.process import free_port  # noqa: E402

SELECTOR = ("gpupack-bench", "fleet")
TICKS = os.sysconf("SC_CLK_TCK")
GPUPACK_RESOURCES = ("gpunodes", "gpunodes/status", "nodes", "nodes/status", "events", "pods", "sharingpolicies",
                     "configmaps")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def memory_mib(pid: int) -> dict[str, float]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmHWM", "VmRSS"):
            out[key] = int(value.split()[0]) / 1024
    return out


def fleet_metrics(port: int) -> dict[str, Any]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    requests: Counter[str] = Counter()
    out: dict[str, Any] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "gpupack_fleet_api_requests_total":
                labels = sample.labels
                requests[f"{labels['by']} {labels['verb']} {labels['resource']}"] += int(sample.value)
            elif sample.name in ("gpupack_fleet_steps_total", "gpupack_fleet_nodes", "gpupack_fleet_cache_lists_total",
                                 "gpupack_fleet_step_lag_seconds_total"):
                out[sample.name] = sample.value
    out["requests"] = requests
    return out


def apiserver_requests(api: Any) -> Counter[str]:
    """``apiserver_request_total`` summed by verb and resource (with subresource)."""
    response = api.call_api("GET", api.configuration.host + "/metrics")
    response.read()
    counts: Counter[str] = Counter()
    for family in text_string_to_metric_families(response.data.decode()):
        for sample in family.samples:
            if sample.name == "apiserver_request_total":
                labels = sample.labels
                resource = labels.get("resource", "") + ("/" + labels["subresource"] if labels.get("subresource") else "")
                counts[f"{labels.get('verb', '')} {resource}"] += int(sample.value)
    return counts


def published(api: Any, names: set[str], gpus: int) -> int:
    from kubernetes import client

    listing: Any = client.CustomObjectsApi(api).list_cluster_custom_object("gpupack.io", "v1alpha1", "gpunodes")
    return sum(1 for i in listing["items"]
               if i["metadata"]["name"] in names and len((i.get("status") or {}).get("gpus") or []) == gpus)


def run_one(n: int, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    binaries = ensure_binaries(controller_manager=True, kwok=True, progress=sys.stderr)
    model, count = args.model, args.gpus
    with ControlPlane(binaries, ControlPlaneConfig(kwok=True)) as plane, plane.admin_client() as api:
        apply_objects(api, gpupack_manifests(), field_manager="gpupack-bench")
        t0 = time.monotonic()
        names = kwok.create_nodes(api, n, prefix="fleet-", labels={SELECTOR[0]: SELECTOR[1]},
                                  annotations=kwok.simulated_gpus(model, count))
        kwok.wait_ready(api, names, timeout_s=600)
        print(f"[N={n}] {n} KWOK nodes Ready in {time.monotonic() - t0:.1f}s", file=sys.stderr)
        port = free_port()
        argv = [sys.executable, "-m", "gpupack", "agent", "fleet", "--kubeconfig", str(plane.kubeconfig),
                "--selector", "=".join(SELECTOR), "--metrics-port", str(port), "--report-every", "30",
                *args.fleet_arg]
        log = (workdir / f"fleet-{n}.log").open("w")
        fleet = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        try:
            start = time.monotonic()
            wanted, done = set(names), 0
            while done < n:
                if fleet.poll() is not None:
                    raise SystemExit(f"the fleet exited ({fleet.returncode}); see {log.name}")
                if time.monotonic() - start > args.start_timeout:
                    raise SystemExit(f"only {done}/{n} GPUNodes published after {args.start_timeout}s")
                time.sleep(1.0)
                done = published(api, wanted, count)
            start_s = time.monotonic() - start
            cpu_at_start = cpu_seconds(fleet.pid)
            print(f"[N={n}] all GPUNodes published {start_s:.1f}s after the fleet started "
                  f"({cpu_at_start:.1f} CPU s)", file=sys.stderr)
            time.sleep(args.settle)
            others = {p.name: p.pid for p in plane.processes if p.pid}
            before = (time.monotonic(), cpu_seconds(fleet.pid), fleet_metrics(port), apiserver_requests(api),
                      {k: cpu_seconds(pid) for k, pid in others.items()})
            time.sleep(args.window)
            after = (time.monotonic(), cpu_seconds(fleet.pid), fleet_metrics(port), apiserver_requests(api),
                     {k: cpu_seconds(pid) for k, pid in others.items()})
            mem = memory_mib(fleet.pid)
        finally:
            fleet.terminate()
            try:
                fleet.wait(30)
            except subprocess.TimeoutExpired:
                fleet.kill()
            log.close()
    seconds = after[0] - before[0]
    fleet_requests = after[2]["requests"] - before[2]["requests"]
    agent_writes = sum(v for k, v in fleet_requests.items()
                       if k.startswith("agents ") and k.split()[1] in ("create", "update", "patch", "delete"))
    agent_reads = sum(v for k, v in fleet_requests.items() if k.startswith("agents ") and k.split()[1] in ("get", "list"))
    server = after[3] - before[3]
    ours = {k: v for k, v in server.items() if k.split(" ", 1)[1] in GPUPACK_RESOURCES}
    steps = after[2].get("gpupack_fleet_steps_total", 0) - before[2].get("gpupack_fleet_steps_total", 0)
    return {
        "nodes": n, "model": f"{model}:{count}", "fleet_args": args.fleet_arg,
        "start_seconds": round(start_s, 1), "start_cpu_seconds": round(cpu_at_start, 1),
        "window_seconds": round(seconds, 1),
        "fleet_cpu_seconds_per_second": round((after[1] - before[1]) / seconds, 3),
        "fleet_peak_rss_mib": round(mem.get("VmHWM", 0.0), 1), "fleet_rss_mib": round(mem.get("VmRSS", 0.0), 1),
        "steps_per_second": round(steps / seconds, 2),
        "mean_step_lag_seconds": round((after[2].get("gpupack_fleet_step_lag_seconds_total", 0)
                                        - before[2].get("gpupack_fleet_step_lag_seconds_total", 0)) / steps, 3)
        if steps else 0.0,
        "writes_per_node_per_minute": round(agent_writes / n / (seconds / 60), 3),
        "agent_reads": agent_reads,
        "fleet_requests": dict(sorted(fleet_requests.items())),
        "apiserver_requests_gpupack_resources": dict(sorted(ours.items())),
        "apiserver_requests_other": dict(sorted((k, v) for k, v in server.items() if k not in ours)),
        "control_plane_cpu_seconds_per_second": {k: round((after[4][k] - before[4].get(k, 0.0)) / seconds, 3)
                                                 for k in after[4]},
        "load_average_1min_at_end": round(os.getloadavg()[0], 2),
    }


def run_baseline(k: int, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """The same at rest with ``k`` nodes each served by its own ``gpupack agent run`` process (the DaemonSet's
    way): what one node costs without the fleet."""
    binaries = ensure_binaries(controller_manager=True, kwok=True, progress=sys.stderr)
    model, count = args.model, args.gpus
    with ControlPlane(binaries, ControlPlaneConfig(kwok=True)) as plane, plane.admin_client() as api:
        apply_objects(api, gpupack_manifests(), field_manager="gpupack-bench")
        names = kwok.create_nodes(api, k, prefix="alone-", annotations=kwok.simulated_gpus(model, count))
        kwok.wait_ready(api, names, timeout_s=600)
        logs = [(workdir / f"agent-{name}.log").open("w") for name in names]
        agents = [subprocess.Popen([sys.executable, "-m", "gpupack", "agent", "run", "--kubeconfig", str(plane.kubeconfig),
                                    "--node", name, "--simulate", f"{model}:{count}", "--emulate-device-plugin",
                                    "--metrics-port", "0"], stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
                  for name, log in zip(names, logs)]
        try:
            deadline = time.monotonic() + args.start_timeout
            while published(api, set(names), count) < k:
                if time.monotonic() > deadline or any(a.poll() is not None for a in agents):
                    raise SystemExit("the agents did not publish; see " + logs[0].name)
                time.sleep(1.0)
            time.sleep(args.settle)
            before = (time.monotonic(), sum(cpu_seconds(a.pid) for a in agents), apiserver_requests(api))
            time.sleep(args.window)
            after = (time.monotonic(), sum(cpu_seconds(a.pid) for a in agents), apiserver_requests(api))
            rss = [memory_mib(a.pid).get("VmRSS", 0.0) for a in agents]
        finally:
            for agent in agents:
                agent.terminate()
            for agent in agents:
                try:
                    agent.wait(30)
                except subprocess.TimeoutExpired:
                    agent.kill()
            for log in logs:
                log.close()
    seconds = after[0] - before[0]
    server = after[2] - before[2]
    ours = {key: v for key, v in server.items() if key.split(" ", 1)[1] in GPUPACK_RESOURCES}
    per_minute = {key: round(v / k / (seconds / 60), 2) for key, v in sorted(ours.items())}
    return {"agent_processes": k, "model": f"{model}:{count}", "window_seconds": round(seconds, 1),
            "load_average_1min_at_end": round(os.getloadavg()[0], 2),
            "cpu_seconds_per_second_per_agent": round((after[1] - before[1]) / seconds / k, 4),
            "rss_mib_per_agent": round(sum(rss) / k, 1),
            "apiserver_requests_per_node_per_minute": per_minute,
            "writes_per_node_per_minute": round(sum(v for key, v in per_minute.items()
                                                    if key.split()[0] in ("POST", "PUT", "PATCH", "DELETE")), 2),
            "reads_per_node_per_minute": round(sum(v for key, v in per_minute.items()
                                                   if key.split()[0] in ("GET", "LIST", "WATCH")), 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, nargs="*", default=[100, 500],
                        help="fleet sizes to measure (default 100 500; none: only the baseline)")
    parser.add_argument("--model", default="A100-40GB")
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--window", type=float, default=120.0, help="seconds measured at rest (default 120)")
    parser.add_argument("--settle", type=float, default=20.0, help="seconds after the last publish before it")
    parser.add_argument("--start-timeout", type=float, default=600.0)
    parser.add_argument("--fleet-arg", action="append", default=[], help="extra argument for the fleet (repeat)")
    parser.add_argument("--baseline-agents", type=int, default=0, metavar="K",
                        help="also measure K nodes each served by its own 'gpupack agent run' process (default 0: not)")
    parser.add_argument("--out", type=Path, default=None, help="JSON file to write (merged by N)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args()
    workdir = Path(os.environ.get("TMPDIR", "/tmp")) / "gpupack-agent-fleet-bench"
    workdir.mkdir(parents=True, exist_ok=True)
    results = []
    for n in args.nodes:
        result = run_one(n, args, workdir)
        results.append(result)
        print(f"[N={n}] {result['fleet_cpu_seconds_per_second']} CPU s/s, peak RSS {result['fleet_peak_rss_mib']} MiB, "
              f"{result['writes_per_node_per_minute']} writes/node/min, {result['steps_per_second']} steps/s, "
              f"{result['agent_reads']} agent reads", file=sys.stderr)
    baseline = run_baseline(args.baseline_agents, args, workdir) if args.baseline_agents else None
    if baseline is not None:
        print(f"[baseline] one agent process per node: {baseline}", file=sys.stderr)
    doc: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                       "platform": platform.platform()},
                           "command": "python benchmarks/agent_fleet.py " + " ".join(sys.argv[1:]),
                           "results": results}
    if args.out is not None:
        if args.out.exists():
            old = json.loads(args.out.read_text())
            new = {(r["nodes"], tuple(r["fleet_args"])) for r in results}
            keep = [r for r in old.get("results", []) if (r["nodes"], tuple(r["fleet_args"])) not in new]
            doc["results"] = sorted(keep + results, key=lambda r: (r["nodes"], r["fleet_args"]))
            doc["command"] = old.get("command", "") + (" && " if old.get("command") else "") + doc["command"]
            if baseline is None and "baseline" in old:
                doc["baseline"] = old["baseline"]
    if baseline is not None:
        doc["baseline"] = baseline
    if args.out is not None:
        args.out.write_text(json.dumps(doc, indent=2) + "\n")
    if args.json or args.out is None:
        print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
