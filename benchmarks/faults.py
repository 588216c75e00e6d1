"""Measure gpupack under faults (a script, not a test; results in benchmarks/faults.md).

Three experiments, each on this machine's own processes:

* **webhook under stalled clients**: ``gpupack webhook serve`` (example inventory) gets
  ``--stalled`` TLS connections that send part of their headers and stop, plus
  ``--partial-bodies`` that announce a 2 MB body and send 1 MB of it. While they hang,
  a keep-alive client sends admissions one after another; the script reports their
  latency, the webhook's resident memory (idle, peak during the stall, after), and how
  many stalled connections the webhook closed (``request_read_seconds``, 10 s).
* **API server outage**: a real kube-apiserver, etcd and kube-scheduler (built by
  ``tools/k8s/build.sh``), one simulated node agent and the controller. kube-apiserver
  is stopped for ``--outage`` seconds; the script reports the log bytes and CPU seconds
  each component spent during the outage, then how long after the restart the agent
  reports again, the controller releases a new gated pod, and kube-scheduler binds it. Then a
  standby controller starts, the leader is killed (SIGKILL), and a new gated pod is created at
  once: the script reports when the standby released it and when it was bound. Then both
  controllers are killed, a gated pod is created, and a replacement starts 5 s later (as a
  Deployment would restart one): when it released and bound the pod. Last, etcd is stopped
  for ``--etcd-outage`` seconds (kube-apiserver stays up): log bytes and CPU per component
  during it, and how long after etcd's restart a new gated pod is released and bound. Then a
  stale agent: the controller (``--agent-stale-seconds 10``) plans a reshape for two waiting
  pods on a node whose agent is then killed; a spare node joins, and the script reports how
  long after the kill the pods are bound there; then the killed agent restarts, two more pods
  wait for the reshape only its node can make, and the script reports when they are bound.
* **webhook killed**: the demo stack (``gpupack demo``'s control plane, agents, webhook and
  controller); the webhook is SIGKILLed, a GPU pod is tried (the registration's
  ``failurePolicy: Fail`` refuses it: no pod slips past gpupack), and the webhook restarts on
  the same port: how long until a GPU pod is admitted again and bound.

    python benchmarks/faults.py                   # all three, about 5 minutes on 2 cores
    python benchmarks/faults.py --only webhook --stalled 1000 --partial-bodies 100
    python benchmarks/faults.py --only outage --outage 60
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from gpupack.devcluster.process import free_port  # noqa: E402
from webhook.certs import write_self_signed  # noqa: E402
from gpupack.testing.admission_reviews import gpu_container, make_pod, make_review  # noqa: E402

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
LEASE_SECONDS = 4  # the controller's leader lease in the outage experiment (15 s in the manifests)
BOTH_DOWN_SECONDS = 5  # how long no controller runs before a replacement starts
STALE_SECONDS = 10  # the controller's --agent-stale-seconds in the stale-agent part (180 s shipped)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def cpu_seconds(pid: int) -> float:
    """User plus system CPU of ``pid`` and its threads so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def wait_for(what: str, check: Callable[[], Any], timeout_s: float = 120.0) -> float:
    began = time.monotonic()
    while time.monotonic() - began < timeout_s:
        try:
            if check():
                return time.monotonic() - began
        except Exception:  # noqa: BLE001 - not there yet
            pass
        time.sleep(0.1)
    raise SystemExit(f"timed out after {timeout_s:.0f}s waiting for {what}")


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# ----------------------------------------------------------------------------- webhook


FLOOD_PER_SOURCE = 400  # under the webhook's default max_connections_per_source (500)
ONE_SOURCE_TRIES = 600  # over it


def sources_for(connections: int) -> int:
    return -(-connections // FLOOD_PER_SOURCE)


def one_source_over_its_cap(port: int, context: ssl.SSLContext, tries: int) -> dict[str, int]:
    """Open ``tries`` stalled connections from one fresh source; how many the webhook kept open.

    Past ``max_connections_per_source`` the webhook closes a source's new connections at once,
    so they never count toward the global cap that every other source shares."""
    opened: list[ssl.SSLSocket] = []
    refused = 0
    for _ in range(tries):
        try:
            raw = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=("127.0.2.1", 0))
            tls = context.wrap_socket(raw, server_hostname="127.0.0.1")
            tls.sendall(b"POST /mutate HTTP/1.1\r\nHost: localhost\r\n")
            opened.append(tls)
        except (ssl.SSLError, ConnectionError, OSError):
            refused += 1
    time.sleep(1)
    held = 0
    for tls in opened:
        tls.settimeout(0.01)
        try:
            if tls.recv(1) == b"":
                refused += 1
            else:
                held += 1
        except (TimeoutError, socket.timeout):
            held += 1  # nothing to read and not closed: the webhook still holds it
        except (ssl.SSLError, ConnectionError, OSError):
            refused += 1
        tls.close()
    return {"opened": tries, "held_open": held, "closed_by_webhook": refused}


def webhook_under_stalled_clients(stalled: int, partial_bodies: int, requests: int) -> dict[str, Any]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 4 * (stalled + partial_bodies) + 256)), hard))
    with tempfile.TemporaryDirectory() as tmp:
        ca, cert, key = write_self_signed(Path(tmp), "gpupack-webhook", "gpupack-system", ["localhost", "127.0.0.1"])
        port = free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpupack", "webhook", "serve", "--tls-cert", str(cert), "--tls-key", str(key),
             "--host", "127.0.0.1", "--port", str(port), "--inventory", str(ROOT / "examples" / "inventory.yaml"),
             "--log-level", "warning"],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            url = f"https://127.0.0.1:{port}"
            context = ssl.create_default_context(cafile=str(ca))
            client = httpx.Client(base_url=url, verify=context, timeout=30)
            wait_for("the webhook", lambda: client.get("/readyz").status_code == 200)
            body = make_review(make_pod(gpu_container("main", "250")))

            refused: dict[str, int] = {}

            def admissions(phase: str = "warm-up") -> list[float]:
                out = []
                for _ in range(requests):
                    began = time.perf_counter()
                    status = client.post("/mutate", json=body).status_code
                    out.append(1000 * (time.perf_counter() - began))
                    if status != 200:
                        refused[phase] = refused.get(phase, 0) + 1
                return out

            admissions()  # warm up
            idle_rss = rss_mib(proc.pid)
            baseline = admissions("before")
            sockets: list[ssl.SSLSocket] = []
            opened = time.monotonic()
            # The flood comes from many sources, each under the per-source cap (as a botnet, or
            # many tenants' pods, would), so it meets the global limits; one source over its cap
            # is measured below. Linux routes all of 127.0.0.0/8 to loopback.
            for i in range(stalled + partial_bodies):
                source = f"127.0.1.{1 + i // FLOOD_PER_SOURCE}"
                raw = socket.create_connection(("127.0.0.1", port), timeout=60, source_address=(source, 0))
                tls = context.wrap_socket(raw, server_hostname="127.0.0.1")
                if i < stalled:
                    tls.sendall(b"POST /mutate HTTP/1.1\r\nHost: localhost\r\n")
                else:
                    tls.sendall(b"POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Length: 2000000\r\n\r\n"
                                + b"x" * 1_000_000)
                sockets.append(tls)
            open_seconds = time.monotonic() - opened
            peak = [rss_mib(proc.pid)]
            sampling = threading.Event()

            def sample() -> None:
                while not sampling.wait(0.2):
                    peak.append(rss_mib(proc.pid))

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            during = admissions("during_stall")
            time.sleep(12)  # past request_read_seconds (10 s)
            sampling.set()
            sampler.join()
            closed = 0
            for tls in sockets:
                tls.settimeout(0.01)
                try:
                    closed += tls.recv(1) == b""
                except (ConnectionResetError, ssl.SSLError, OSError):
                    closed += 1
                tls.close()
            time.sleep(2)
            after_rss = rss_mib(proc.pid)
            after = admissions("after")
            one_source = one_source_over_its_cap(port, context, ONE_SOURCE_TRIES)
            client.close()
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
    return {
        "stalled_connections": stalled, "partial_bodies": partial_bodies, "flood_sources": sources_for(stalled + partial_bodies),
        "one_source_over_its_cap": one_source, "seconds_to_open_them": round(open_seconds, 1),
        "closed_by_webhook_within_12s": closed, "admissions_not_200": refused,
        "rss_mib": {"idle": round(idle_rss, 1), "peak_during_stall": round(max(peak), 1), "after": round(after_rss, 1)},
        "admission_ms": {
            "before": {"p50": round(quantile(baseline, 0.5), 2), "p99": round(quantile(baseline, 0.99), 2)},
            "during_stall": {"p50": round(quantile(during, 0.5), 2), "p99": round(quantile(during, 0.99), 2)},
            "after": {"p50": round(quantile(after, 0.5), 2), "p99": round(quantile(after, 0.99), 2)},
        },
    }


# ----------------------------------------------------------------------------- outage


def apiserver_outage(outage_s: float, etcd_outage_s: float) -> dict[str, Any]:
    from kubernetes import client

    from gpupack.devcluster.apply import apply_objects, gpupack_manifests, node_isolation_manifests
    from gpupack.devcluster.binaries import ensure_binaries
    from gpupack.devcluster.controlplane import ControlPlane
    from kube.times import parse_time
    from sharing.api.allocation import Allocation, ContainerAllocation
    from sharing.api.keys import ALLOCATION_ANNOTATION

    h100 = "NVIDIA-H100-80GB-HBM3"
    plane = ControlPlane(ensure_binaries(progress=sys.stderr)).start()
    procs: dict[str, subprocess.Popen[bytes]] = {}
    tmp = Path(tempfile.mkdtemp(prefix="gpupack-faults-"))
    try:
        admin = plane.admin_client()
        # Node isolation on, as installed: each agent's token is bound to a pod on its node.
        apply_objects(admin, gpupack_manifests() + node_isolation_manifests(), field_manager="faults-bench")
        core, custom = client.CoreV1Api(admin), client.CustomObjectsApi(admin)

        def gpu_node(name: str, layout: list[str]) -> None:
            """A Node (no kubelet: Ready by hand) and its GPUNode asking for ``layout`` on its one H100."""
            core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=name, labels={
                "kubernetes.io/hostname": name, "bench": "faults", "nvidia.com/gpu.deploy.device-plugin": "true"})))
            res = {"cpu": "32", "memory": "256Gi", "pods": "110"}
            core.patch_node_status(name, {"status": {"capacity": res, "allocatable": res, "conditions": [
                {"type": "Ready", "status": "True", "reason": "Bench", "message": "no kubelet"}]}})
            custom.create_cluster_custom_object("gpupack.io", "v1alpha1", "gpunodes", {
                "apiVersion": "gpupack.io/v1alpha1", "kind": "GPUNode", "metadata": {"name": name},
                "spec": {"sharing": {"mode": "none", "replicas": 1},
                         "gpus": [{"index": 0, "migEnabled": True, "layout": [{"profile": p} for p in layout]}]}})

        node = "faults-h100"
        gpu_node(node, ["1g.10gb"] * 7)
        custom.create_cluster_custom_object("gpupack.io", "v1alpha1", "sharingpolicies", {
            "apiVersion": "gpupack.io/v1alpha1", "kind": "SharingPolicy", "metadata": {"name": "faults"},
            "spec": {"nodeSelector": {"matchLabels": {"bench": "faults"}}, "reshaping": {"idleSeconds": 0}}})
        logs: dict[str, Path] = {}

        def start(name: str, argv: list[str]) -> None:
            logs[name] = tmp / f"{name}.log"
            procs[name] = subprocess.Popen([sys.executable, "-m", "gpupack", *argv], cwd=ROOT,
                                           stdout=logs[name].open("wb"), stderr=subprocess.STDOUT)

        def start_agent(name: str, *extra: str, process: str | None = None) -> None:
            start(process or f"agent-{name}", [
                "agent", "run", "--node", name, "--simulate", "H100-80GB:1", "--state-file", str(tmp / f"{name}.json"),
                "--emulate-device-plugin", "--poll-seconds", "1", "--metrics-port", "0",
                "--kubeconfig", str(plane.node_agent_kubeconfig(name)), *extra])

        start_agent(node, process="agent")
        def start_controller(name: str, *extra: str) -> None:
            start(name, ["controller", "run", "--kubeconfig", str(plane.serviceaccount_kubeconfig("gpupack-controller")),
                         "--metrics-port", "0", "--identity", name, "--lease-seconds", str(LEASE_SECONDS),
                         "--resync-seconds", "1", *extra])

        start_controller("controller")

        def gpunode() -> dict[str, Any]:
            return dict(custom.get_cluster_custom_object("gpupack.io", "v1alpha1", "gpunodes", node))

        wait_for("the node's seven 1g instances", lambda: len(gpunode()["status"]["gpus"][0]["instances"]) == 7)

        def pod(name: str, profile: str = "1g.10gb") -> None:
            resource = f"nvidia.com/mig-{profile}"
            allocation = Allocation(mode="mig", gated=True, capacity_existed=True, policy="b", reason="b",
                                    gpu_model=h100, containers=(ContainerAllocation(
                                        "main", "containers", 100, None, resource, profile),))
            core.create_namespaced_pod("default", {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "annotations": {ALLOCATION_ANNOTATION: allocation.to_annotation()}},
                "spec": {"schedulingGates": [{"name": "gpupack.io/capacity"}], "containers": [{
                    "name": "main", "image": "x", "resources": {"limits": {resource: "1"}}}]}})

        pod("before")
        wait_for("a pod bound before the outage", lambda: core.read_namespaced_pod("before", "default").spec.node_name)
        time.sleep(3)  # settle
        before = {n: (logs[n].stat().st_size, cpu_seconds(p.pid)) for n, p in procs.items()}
        plane.stop_component("kube-apiserver")
        time.sleep(outage_s)
        during = {n: (logs[n].stat().st_size - before[n][0], cpu_seconds(p.pid) - before[n][1])
                  for n, p in procs.items()}
        restarted, wall_restart = time.monotonic(), time.time()
        plane.start_component("kube-apiserver")
        apiserver_ready = time.monotonic() - restarted
        admin = plane.admin_client()
        core, custom = client.CoreV1Api(admin), client.CustomObjectsApi(admin)
        agent_back = wait_for("the agent's heartbeat after the restart", lambda: (
            (beat := parse_time(gpunode()["status"].get("heartbeatTime"))) is not None
            and beat.timestamp() >= wall_restart - 1)) + apiserver_ready
        pod("after")
        began = time.monotonic()
        released_after = wait_for("the controller to release a pod created after the restart",
                                  lambda: not core.read_namespaced_pod("after", "default").spec.scheduling_gates)
        bound_after = wait_for("kube-scheduler to bind it",
                               lambda: core.read_namespaced_pod("after", "default").spec.node_name)
        bound_after = time.monotonic() - began

        # The leader dies (SIGKILL: no lease release) while a standby runs.
        start_controller("standby")
        time.sleep(2 * LEASE_SECONDS)
        coordination = client.CoordinationV1Api(admin)
        leader = coordination.read_namespaced_lease("gpupack-controller", "gpupack-system").spec.holder_identity
        procs[leader].kill()
        procs[leader].wait(10)
        killed = time.monotonic()
        pod("after-leader-kill")
        released_leader = wait_for("the standby to release a pod", lambda: not core.read_namespaced_pod(
            "after-leader-kill", "default").spec.scheduling_gates)
        bound_leader = wait_for("it bound", lambda: core.read_namespaced_pod(
            "after-leader-kill", "default").spec.node_name)
        _ = bound_leader
        bound_leader = time.monotonic() - killed

        # Both controllers die (SIGKILL). A gated pod created meanwhile waits (nothing else
        # lifts the gate); a new controller starts after a pause, as its Deployment would.
        for proc in procs.values():
            if proc.poll() is None and proc is not procs["agent"]:
                proc.kill()
                proc.wait(10)
        pod("while-no-controller")
        time.sleep(BOTH_DOWN_SECONDS)
        gated_meanwhile = bool(core.read_namespaced_pod("while-no-controller", "default").spec.scheduling_gates)
        new_controller = time.monotonic()
        start_controller("replacement")
        released_both = wait_for("the replacement to release the waiting pod", lambda: not core.read_namespaced_pod(
            "while-no-controller", "default").spec.scheduling_gates)
        wait_for("it bound", lambda: core.read_namespaced_pod("while-no-controller", "default").spec.node_name)
        bound_both = time.monotonic() - new_controller

        # etcd outage: kube-apiserver stays up but can neither read nor write.
        live = {n: p for n, p in procs.items() if p.poll() is None}
        time.sleep(3)
        before_etcd = {n: (logs[n].stat().st_size, cpu_seconds(p.pid)) for n, p in live.items()}
        plane.stop_component("etcd")
        time.sleep(etcd_outage_s)
        during_etcd = {n: (logs[n].stat().st_size - before_etcd[n][0], cpu_seconds(p.pid) - before_etcd[n][1])
                       for n, p in live.items()}
        etcd_restarted = time.monotonic()
        plane.start_component("etcd")
        etcd_ready = time.monotonic() - etcd_restarted

        def created_after_etcd() -> bool:
            try:
                pod("after-etcd")
            except client.ApiException as exc:
                if exc.status != 409:
                    raise
            return True

        wait_for("the API server to take a pod again", created_after_etcd)
        wait_for("the controller to release it", lambda: not core.read_namespaced_pod(
            "after-etcd", "default").spec.scheduling_gates)
        released_etcd = time.monotonic() - etcd_restarted
        wait_for("it bound", lambda: core.read_namespaced_pod("after-etcd", "default").spec.node_name)
        bound_etcd = time.monotonic() - etcd_restarted

        # A stale agent: the controller plans a reshape on a node whose agent then dies; the
        # pods waiting for that capacity are planned elsewhere once the node is stale.
        procs["replacement"].kill()
        procs["replacement"].wait(10)
        start_controller("stale-watch", "--agent-stale-seconds", str(STALE_SECONDS))
        # Heartbeats every 2 s against the 10 s timeout; instances idle after 1 s.
        fast = ("--heartbeat-seconds", "2", "--idle-seconds", "1")
        gpu_node("faults-doomed", ["7g.80gb"])
        start_agent("faults-doomed", *fast)
        wait_for("the doomed node's 7g instance", lambda: len(custom.get_cluster_custom_object(
            "gpupack.io", "v1alpha1", "gpunodes", "faults-doomed")["status"]["gpus"][0]["instances"]) == 1)
        for i in range(2):
            pod(f"stale-{i}", "2g.20gb")  # faults-h100's GPU is all 1g and busy: only faults-doomed can hold them

        def in_flight() -> bool:
            spec = custom.get_cluster_custom_object("gpupack.io", "v1alpha1", "gpunodes", "faults-doomed")["spec"]
            return any(item.get("profile") == "2g.20gb" for gpu in spec.get("gpus", []) for item in gpu.get("layout", []))

        wait_for("a reshape planned on the doomed node", in_flight)
        procs["agent-faults-doomed"].kill()
        procs["agent-faults-doomed"].wait(10)
        agent_killed = time.monotonic()
        gpu_node("faults-spare", ["7g.80gb"])
        start_agent("faults-spare", *fast)
        wait_for("both pods bound to the spare node", lambda: all(core.read_namespaced_pod(
            f"stale-{i}", "default").spec.node_name == "faults-spare" for i in range(2)), timeout_s=180)
        stale_bound = time.monotonic() - agent_killed

        # The killed agent restarts (its DaemonSet would): two more such pods wait for the
        # capacity only its node can now make; how long until they are bound there.
        for i in range(2):
            pod(f"restart-{i}", "2g.20gb")
        time.sleep(3)
        agent_restarted = time.monotonic()
        start_agent("faults-doomed", *fast)
        wait_for("both pods bound to the restarted agent's node", lambda: all(core.read_namespaced_pod(
            f"restart-{i}", "default").spec.node_name == "faults-doomed" for i in range(2)), timeout_s=180)
        restart_bound = time.monotonic() - agent_restarted
    finally:
        for proc in procs.values():
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        plane.stop()
    return {
        "outage_s": outage_s,
        "during_outage": {n: {"log_bytes": b, "cpu_s": round(c, 2)} for n, (b, c) in during.items()},
        "apiserver_ready_after_restart_s": round(apiserver_ready, 1),
        "agent_reports_again_after_restart_s": round(agent_back, 1),
        "new_gated_pod_released_by_controller_s": round(released_after, 1),
        "new_gated_pod_bound_by_kube_scheduler_s": round(bound_after, 1),
        "leader_killed": {"lease_seconds": LEASE_SECONDS, "pod_created_at_kill_released_s": round(released_leader, 1),
                          "pod_bound_s": round(bound_leader, 1)},
        "both_controllers_killed": {
            "down_s": BOTH_DOWN_SECONDS, "pod_still_gated_while_down": gated_meanwhile,
            "released_after_replacement_started_s": round(released_both, 1),
            "bound_after_replacement_started_s": round(bound_both, 1)},
        "etcd_outage": {
            "outage_s": etcd_outage_s,
            "during_outage": {n: {"log_bytes": b, "cpu_s": round(c, 2)} for n, (b, c) in during_etcd.items()},
            "etcd_healthy_after_restart_s": round(etcd_ready, 1),
            "new_gated_pod_released_after_restart_s": round(released_etcd, 1),
            "new_gated_pod_bound_after_restart_s": round(bound_etcd, 1)},
        "stale_agent": {
            "agent_stale_seconds": STALE_SECONDS, "agent_heartbeat_seconds": 2,
            "pods_bound_elsewhere_after_agent_killed_s": round(stale_bound, 1),
            "killed_agent_restarted_pods_bound_on_its_node_s": round(restart_bound, 1)},
    }


def webhook_killed() -> dict[str, Any]:
    """The demo stack; its webhook is SIGKILLed, a GPU pod is tried, the webhook restarts on the same port."""
    import signal

    from kubernetes import client

    from gpupack.demo.stack import DEMO_NAMESPACE, Stack
    from gpupack.devcluster.process import ManagedProcess
    from sharing.api.keys import MILLI_RESOURCE

    stack = Stack(workdir=Path(tempfile.mkdtemp(prefix="gpupack-faults-webhook-")))
    try:
        stack.start(lambda line: print(line, file=sys.stderr, flush=True))
        core = client.CoreV1Api(stack.admin)

        def pod(name: str) -> None:
            core.create_namespaced_pod(DEMO_NAMESPACE, {
                "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                "spec": {"containers": [{"name": "main", "image": "example.com/app:1",
                                         "resources": {"limits": {MILLI_RESOURCE: "300"}}}]}})

        def bound(name: str) -> bool:
            return bool(core.read_namespaced_pod(name, DEMO_NAMESPACE).spec.node_name)

        pod("before")
        wait_for("a pod bound before the webhook dies", lambda: bound("before"))
        hook = next(p for p in stack.processes if p.name == "webhook")
        assert hook.popen is not None
        os.kill(hook.popen.pid, signal.SIGKILL)
        hook.popen.wait(10)
        stack.processes.remove(hook)
        try:
            pod("while-down")
            refused, answer = False, ""
        except client.ApiException as exc:
            refused, answer = True, f"{exc.status}: {json.loads(exc.body or '{}').get('message', '')[:160]}"
        replacement = ManagedProcess("webhook-2", list(hook.argv), stack.workdir / "logs" / "webhook-2.log")
        restarted = time.monotonic()
        replacement.start()
        stack.processes.append(replacement)

        def admitted() -> bool:
            try:
                pod("after-restart")
            except client.ApiException as exc:
                if exc.status != 409:
                    return False
            return True

        admitted_s = wait_for("the API server to admit a GPU pod again", admitted)
        admitted_s = time.monotonic() - restarted
        wait_for("that pod bound", lambda: bound("after-restart"))
        bound_s = time.monotonic() - restarted
    finally:
        stack.stop()
    return {"pod_refused_while_down": refused, "answer_while_down": answer,
            "admitted_after_restart_s": round(admitted_s, 1), "bound_after_restart_s": round(bound_s, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=["webhook", "outage", "webhook-kill"], help="run one experiment")
    ap.add_argument("--stalled", type=int, default=1000, help="connections stalled in their headers (default 1000)")
    ap.add_argument("--partial-bodies", type=int, default=100, help="connections stalled in a body (default 100)")
    ap.add_argument("--requests", type=int, default=200, help="admissions measured per phase (default 200)")
    ap.add_argument("--outage", type=float, default=60.0, help="seconds kube-apiserver is down (default 60)")
    ap.add_argument("--etcd-outage", type=float, default=30.0, help="seconds etcd is down (default 30)")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args(argv)
    out: dict[str, Any] = {"machine": f"{os.cpu_count()} CPU(s), Python {platform.python_version()}, "
                                      f"{platform.system()}", "date": time.strftime("%Y-%m-%d %H:%M")}
    if args.only in (None, "webhook"):
        out["webhook"] = webhook_under_stalled_clients(args.stalled, args.partial_bodies, args.requests)
        print(json.dumps(out["webhook"], indent=1), flush=True)
    if args.only in (None, "outage"):
        out["outage"] = apiserver_outage(args.outage, args.etcd_outage)
        print(json.dumps(out["outage"], indent=1), flush=True)
    if args.only in (None, "webhook-kill"):
        out["webhook_killed"] = webhook_killed()
        print(json.dumps(out["webhook_killed"], indent=1), flush=True)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
