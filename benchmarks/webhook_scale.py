"""The webhook's inventory at fleet size: what a GPUNode heartbeat costs, and admissions during the churn
(a script, not a test; benchmarks/webhook_scale.md).

At fleet size every node's agent rewrites its GPUNode's status about once a
minute (a heartbeat): 1,250 nodes make ~21 GPUNode MODIFIED events/s, 2,500
make ~42/s, while fractional pods arrive at 20/s. Two parts, per fleet size:

1. **per event, in process**: the fleet (N nodes x 8 GPUs: MIG H100s, MPS and
   time-sliced A100s, realistic statuses with managedFields, conditions, pods
   on instances) listed into ``webhook.inventory_watch.KubernetesWatch``
   through the real informers; then one heartbeat, decoded from its JSON line as
   the watch reads it, applied through the informer (``after``), against what
   the webhook did per event before (``before``: ``build_inventory`` over every
   object, then a new snapshot). Also a change that matters (one node's shared
   replicas handed out: read, new snapshot, new memo) and the first admission
   against a new snapshot (memo empty) next to a remembered one.
2. **live churn, three processes**: a fake API server (this script with
   ``--fake-api``: lists, and chunked watch streams at the heartbeat rate N/60 per
   second, plus ``--changes`` real changes/s) on loopback HTTP; the webhook as
   ``gpupack webhook serve --kubeconfig`` against it (the real client, informers
   and uvicorn over TLS); and this script's client. Phases of ``--duration`` s:
   heartbeats only, then heartbeats + real changes + fractional pods at
   ``--rate``/s (open loop over HTTPS, latency from each request's scheduled
   time). The webhook's CPU seconds come from ``/proc/<pid>/stat``, its peak RSS
   from ``VmHWM``.

Run::

    python benchmarks/webhook_scale.py --nodes 1250,2500 --duration 60 --json benchmarks/webhook_scale.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from webhook_pods import bodies as make_bodies  # noqa: E402

HOST = "127.0.0.1"
GPUS = 8
H100, A100 = "NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB"
# Four instances per MIG GPU (a 3g, a 2g, two 1g), as a mixed layout holds them.
LAYOUT = [("2g.20gb", 0, 2), ("1g.10gb", 2, 1), ("1g.10gb", 3, 1), ("3g.40gb", 4, 4)]


# ---------------------------------------------------------------------- the fleet
def _time(second: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(1_764_547_200 + second))


def gpunode(i: int, rng: random.Random) -> dict[str, Any]:
    """GPUNode ``gpu-<i>`` as the API server returns it (status as ``node.base.snapshot`` writes it)."""
    name = f"gpu-{i:05d}"
    kind = ("mig", "mig", "mps", "time-slicing")[i % 4]
    product = H100 if kind == "mig" else A100
    gpus = []
    for g in range(GPUS):
        gpu: dict[str, Any] = {
            "index": g, "uuid": f"GPU-{i:05d}-{g}-0000-0000-000000000000", "product": product,
            "memoryMiB": 81559 if kind == "mig" else 81920, "migEnabled": kind == "mig", "instances": [],
            "utilization": {"gpuPercent": rng.randint(0, 100), "memoryUsedMiB": rng.randint(0, 80000)},
        }
        if kind == "mig":
            for gi, (profile, start, size) in enumerate(LAYOUT):
                used = rng.random() < 0.5
                gpu["instances"].append({
                    "profile": profile, "start": start, "size": size, "uuid": f"MIG-{i:05d}-{g}-{gi}",
                    "inUse": used, "pods": [f"team-{i % 7}/inference-{i}-{g}-{gi}"] if used else [], "giId": gi + 1})
        gpus.append(gpu)
    status: dict[str, Any] = {
        "observedGeneration": 3, "product": product, "gpus": gpus,
        "summary": {"gpus": GPUS, "migInstances": sum(len(g["instances"]) for g in gpus),
                    "instancesInUse": sum(x["inUse"] for g in gpus for x in g["instances"]),
                    "unhealthyGpus": 0, "unhealthyInstances": 0, "degraded": False},
        "conditions": [
            {"type": t, "status": "True", "observedGeneration": 3, "lastTransitionTime": _time(0),
             "reason": "AsExpected", "message": f"{t}: the agent's last pass found nothing to do on {name}"}
            for t in ("Ready", "LayoutApplied", "DevicePluginReady")],
        "heartbeatTime": _time(0),
    }
    if kind != "mig":
        status["sharing"] = {"mode": kind, "replicas": 4, "inUse": rng.randint(0, GPUS * 4)}
    return {
        "apiVersion": "gpupack.io/v1alpha1", "kind": "GPUNode",
        "metadata": {
            "name": name, "uid": f"00000000-0000-0000-0000-{i:012d}", "resourceVersion": str(1000 + i),
            "generation": 3, "creationTimestamp": _time(0),
            "labels": {"nvidia.com/gpu.product": product, "gpupack.io/managed": "true"},
            "managedFields": [
                {"manager": "gpupack-agent", "operation": "Update", "apiVersion": "gpupack.io/v1alpha1",
                 "time": _time(0), "fieldsType": "FieldsV1", "subresource": "status",
                 "fieldsV1": {"f:status": {".": {}, "f:gpus": {}, "f:conditions": {}, "f:heartbeatTime": {},
                                           "f:summary": {}, "f:product": {}, "f:observedGeneration": {}}}},
                {"manager": "gpupack-controller", "operation": "Update", "apiVersion": "gpupack.io/v1alpha1",
                 "time": _time(0), "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {".": {}, "f:gpus": {}}}}],
        },
        "spec": {"gpus": [{"index": g, "migLayout": "balanced" if kind == "mig" else None} for g in range(GPUS)],
                 **({"sharing": {"mode": kind, "replicas": 4}} if kind != "mig" else {})},
        "status": status,
    }


def heartbeat(obj: dict[str, Any], version: int, rng: random.Random) -> dict[str, Any]:
    """The agent's status patch of a quiet minute: the time and the utilisation samples move."""
    status = dict(obj["status"], heartbeatTime=_time(version % 86400))
    status["gpus"] = [dict(g, utilization={"gpuPercent": rng.randint(0, 100), "memoryUsedMiB": rng.randint(0, 80000)})
                      for g in status["gpus"]]
    return dict(obj, metadata=dict(obj["metadata"], resourceVersion=str(version)), status=status)


def change(obj: dict[str, Any], version: int, rng: random.Random) -> dict[str, Any]:
    """A change that matters: a pod started or ended on one of the node's devices."""
    beat = heartbeat(obj, version, rng)
    status = beat["status"]
    if "sharing" in status:
        status["sharing"] = dict(status["sharing"], inUse=(status["sharing"]["inUse"] + 1) % (GPUS * 4 + 1))
    else:
        g = rng.randrange(GPUS)
        gpus = list(status["gpus"])
        instances = [dict(x) for x in gpus[g]["instances"]]
        x = instances[rng.randrange(len(instances))]
        x["inUse"] = not x["inUse"]
        x["pods"] = [f"team-0/pod-{version}"] if x["inUse"] else []
        gpus[g] = dict(gpus[g], instances=instances)
        status["gpus"] = gpus
    return beat


def node(i: int) -> dict[str, Any]:
    """The Node of a DRA-pool GPU node, as a list gives it (the webhook keeps name and labels)."""
    return {"metadata": {"name": f"gpu-{i:05d}", "resourceVersion": str(500 + i),
                         "labels": {"gpupack.io/backend": "dra", "kubernetes.io/hostname": f"gpu-{i:05d}"}},
            "status": {"images": [{"names": [f"registry.example/img-{k}:v1"], "sizeBytes": 10**8} for k in range(20)],
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def namespaces() -> list[dict[str, Any]]:
    return [{"metadata": {"name": n, "resourceVersion": "5", "labels": {"kubernetes.io/metadata.name": n}}}
            for n in ["default", "ml-serving", *(f"team-{k}" for k in range(7))]]


def policies() -> list[dict[str, Any]]:
    return [{"apiVersion": "gpupack.io/v1alpha1", "kind": "SharingPolicy",
             "metadata": {"name": "fleet", "resourceVersion": "7", "generation": 1},
             "spec": {"namespaces": [{"names": ["ml-serving"], "allowedModes": ["mig", "mps", "time-slicing"]}]}}]


# ---------------------------------------------------------------------- part 1: per event, in process
class _Listed:
    def __init__(self, data: bytes) -> None:
        self.data = data


def _lister(items: list[dict[str, Any]]) -> Any:
    body = json.dumps({"metadata": {"resourceVersion": "1"}, "items": items}).encode()
    return lambda **kw: _Listed(body)


def _median_s(fn: Any, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def per_event(n: int, events: int = 2000) -> dict[str, Any]:
    from sharing.admission.decision import DecisionMemo
    from sharing.admission.inventory import build_inventory
    from webhook.admission import review_pod
    from webhook.inventory_source import InventoryHolder
    from webhook.inventory_watch import KubernetesWatch, kept
    from webhook.settings import WebhookSettings

    rng = random.Random(n)
    fleet = [gpunode(i, rng) for i in range(n)]
    nodes = [node(i) for i in range(0, n, 20)]  # one GPU node in 20 in the DRA pool
    holder = InventoryHolder()
    watch = KubernetesWatch(holder, {"GPUNode": _lister(fleet), "SharingPolicy": _lister(policies()),
                                     "Namespace": _lister(namespaces()), "Node": _lister(nodes)})
    t0 = time.perf_counter()
    for informer in watch.informers.values():
        informer.relist()
    watch.publish_pending()
    first_sync_s = time.perf_counter() - t0
    assert holder.current.synced and len(holder.current.nodes) == n
    informer = watch.informers["GPUNode"]
    lines = [json.dumps({"type": "MODIFIED", "object": heartbeat(fleet[k % n], 10**6 + k, rng)})
             for k in range(events)]
    every = [kept(k, o) for k, objs in (("GPUNode", fleet), ("SharingPolicy", policies()),
                                        ("Namespace", namespaces()), ("Node", nodes)) for o in objs]

    def before() -> None:  # the previous watch: every object read again, a new snapshot and memo
        line = lines[0]
        json.loads(line)
        build_inventory(every, synced=True, version=1)
        DecisionMemo(holder.current)

    before_s = _median_s(before, 5)
    published = watch.published
    decode = after = 0.0
    for line in lines:
        t1 = time.perf_counter()
        event = json.loads(line)
        t2 = time.perf_counter()
        informer.apply(event)
        watch.publish_pending()
        t3 = time.perf_counter()
        decode, after = decode + (t2 - t1), after + (t3 - t1)
    assert watch.published == published, "a heartbeat published a snapshot"
    after_s = after / events

    changes = [json.dumps({"type": "MODIFIED", "object": change(fleet[k % n], 2 * 10**6 + k, rng)})
               for k in range(200)]
    change_times = []
    for line in changes:
        t1 = time.perf_counter()
        informer.apply(json.loads(line))
        assert watch.publish_pending() is not None
        change_times.append(time.perf_counter() - t1)

    settings = WebhookSettings()
    reviews = [json.loads(b) for b in make_bodies(64) if b"gpu-milli" in b]

    def admit_all() -> None:
        memo = holder.memo
        for review in reviews:
            review_pod(review, memo.inventory, settings, memo)

    admit_all()
    warm = _median_s(admit_all, 20) / len(reviews)
    cold_times = []
    for line in changes[:20]:
        informer.apply(json.loads(line))
        watch.publish_pending()
        memo = holder.memo
        t1 = time.perf_counter()
        review_pod(reviews[0], memo.inventory, settings, memo)
        cold_times.append(time.perf_counter() - t1)
    return {
        "nodes": n, "gpus": n * GPUS, "gpunode_json_bytes": len(json.dumps(fleet[0])),
        "first_list_and_snapshot_s": round(first_sync_s, 3),
        "heartbeat_before_ms": round(before_s * 1000, 3),
        "heartbeat_after_ms": round(after_s * 1000, 4),
        "heartbeat_after_decode_ms": round(decode / events * 1000, 4),
        "ratio_before_over_after": round(before_s / after_s),
        "heartbeats_per_min": n, "heartbeat_cpu_s_per_min_before": round(before_s * n, 2),
        "heartbeat_cpu_s_per_min_after": round(after_s * n, 3),
        "change_after_ms_p50": round(statistics.median(change_times) * 1000, 3),
        "admission_memoised_ms": round(warm * 1000, 4),
        "admission_first_on_new_snapshot_ms_p50": round(statistics.median(cold_times) * 1000, 3),
        "gpunode_reads": watch.parts.reads,
    }


# ---------------------------------------------------------------------- part 2: the fake API server
class FakeApi:
    """Lists and watch streams of the four kinds; heartbeats and changes at the rates set by ``/control``."""

    def __init__(self, n: int) -> None:
        self.rng = random.Random(n)
        self.lock = threading.Condition()
        self.version = 10**6
        self.objects = {"gpunodes": [gpunode(i, self.rng) for i in range(n)],
                        "sharingpolicies": policies(), "namespaces": namespaces(),
                        "nodes": [node(i) for i in range(0, n, 20)]}
        self.log: list[bytes] = []
        """GPUNode watch events (JSON lines), in order."""
        self.rates = {"heartbeats": 0.0, "changes": 0.0}
        self.sent = {"heartbeats": 0, "changes": 0}

    def run_generator(self) -> None:
        n, cursor, last = len(self.objects["gpunodes"]), 0, time.monotonic()
        budget = {"heartbeats": 0.0, "changes": 0.0}
        while True:
            time.sleep(0.005)
            now = time.monotonic()
            for what, make in (("heartbeats", heartbeat), ("changes", change)):
                budget[what] = budget[what] + self.rates[what] * (now - last) if self.rates[what] else 0.0
                while budget[what] >= 1:
                    budget[what] -= 1
                    with self.lock:
                        self.version += 1
                        k = cursor % n
                        cursor += 1
                        obj = make(self.objects["gpunodes"][k], self.version, self.rng)
                        self.objects["gpunodes"][k] = obj
                        self.log.append(json.dumps({"type": "MODIFIED", "object": obj}).encode() + b"\n")
                        self.lock.notify_all()
                    self.sent[what] += 1
            last = now

    def set_rates(self, heartbeats: float, changes: float) -> None:
        self.rates = {"heartbeats": heartbeats, "changes": changes}


def _handler(api: FakeApi) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def _send(self, body: bytes, code: int = 200) -> None:
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            url = urlparse(self.path)
            query = parse_qs(url.query)
            if url.path == "/control":
                api.set_rates(float(query["heartbeats"][0]), float(query["changes"][0]))
                self._send(json.dumps(api.sent).encode())
                return
            plural = url.path.rstrip("/").rsplit("/", 1)[-1]
            if plural not in api.objects:
                self._send(b'{"kind":"Status","code":404}', 404)
                return
            if query.get("watch", ["false"])[0] != "true":
                with api.lock:
                    body = json.dumps({"metadata": {"resourceVersion": str(api.version)},
                                       "items": api.objects[plural]}).encode()
                self._send(body)
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            deadline = time.monotonic() + int(query.get("timeoutSeconds", ["300"])[0])
            with api.lock:
                cursor = len(api.log)
            try:
                while time.monotonic() < deadline:
                    with api.lock:
                        api.lock.wait_for(lambda: len(api.log) > cursor, timeout=1.0)
                        lines = api.log[cursor:] if plural == "gpunodes" else []
                        cursor = len(api.log)
                    if lines:
                        chunk = b"".join(lines)
                        self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                        self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
            except OSError:
                pass

    return Handler


def serve_fake_api(n: int, port: int) -> int:
    api = FakeApi(n)
    threading.Thread(target=api.run_generator, daemon=True).start()
    server = ThreadingHTTPServer((HOST, port), _handler(api))
    server.daemon_threads = True
    print("ready", flush=True)
    server.serve_forever()
    return 0


# ---------------------------------------------------------------------- part 2: the run
def _proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _proc_hwm_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _get(url: str, ctx: ssl.SSLContext | None = None) -> bytes:
    with urllib.request.urlopen(url, context=ctx, timeout=10) as r:
        return r.read()  # type: ignore[no-any-return]


def _pods_phase(pid: int, client: Any, control: str, heartbeats: float, changes: float, rate: float,
                duration: float) -> dict[str, Any]:
    """Fractional pods at ``rate``/s for ``duration`` s while the fake API server sends ``heartbeats``
    and ``changes`` per second: admission latency and the webhook's CPU."""
    from webhook_bench import run, summary

    cpu0 = _proc_cpu_s(pid)
    sent0 = json.loads(_get(f"{control}?heartbeats={heartbeats}&changes={changes}"))
    latencies, elapsed = run(client.open_loop(4, rate, duration))
    sent1 = json.loads(_get(f"{control}?heartbeats=0&changes=0"))
    cpu1 = _proc_cpu_s(pid)
    ordered = sorted(latencies)
    stats = summary(latencies, elapsed)
    return {
        "heartbeats_per_s": round((sent1["heartbeats"] - sent0["heartbeats"]) / elapsed, 1),
        "changes_per_s": round((sent1["changes"] - sent0["changes"]) / elapsed, 1),
        "admissions_per_s": stats["throughput_per_s"], "admissions": stats["requests"],
        "p50_ms": stats["p50_ms"], "p95_ms": round(ordered[int(0.95 * len(ordered))] * 1000, 3),
        "p99_ms": stats["p99_ms"], "max_ms": stats["max_ms"], "errors": client.errors,
        "webhook_cpu_s_per_min": round((cpu1 - cpu0) / elapsed * 60, 2),
        "webhook_cores": round((cpu1 - cpu0) / elapsed, 3)}


def live(n: int, duration: float, rate: float, changes: float, port: int) -> dict[str, Any]:
    from webhook.certs import make_self_signed
    from webhook_bench import Client

    env = dict(os.environ, PYTHONPATH=str(ROOT))
    api_port, hook_port = port, port + 1
    fake = subprocess.Popen([sys.executable, __file__, "--fake-api", str(n), "--port", str(api_port)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE)
    hook: subprocess.Popen[bytes] | None = None
    try:
        assert fake.stdout is not None and fake.stdout.readline().strip() == b"ready"
        with tempfile.TemporaryDirectory() as tmp:
            certs = Path(tmp)
            ca, cert, key = make_self_signed(["localhost", HOST])
            (certs / "ca.crt").write_bytes(ca)
            (certs / "tls.crt").write_bytes(cert)
            (certs / "tls.key").write_bytes(key)
            kubeconfig = certs / "kubeconfig"
            kubeconfig.write_text(json.dumps({
                "apiVersion": "v1", "kind": "Config", "current-context": "fake",
                "clusters": [{"name": "fake", "cluster": {"server": f"http://{HOST}:{api_port}"}}],
                "users": [{"name": "fake", "user": {}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}]}))
            started = time.monotonic()
            hook = subprocess.Popen([
                sys.executable, "-m", "gpupack", "webhook", "serve", "--tls-cert", str(certs / "tls.crt"),
                "--tls-key", str(certs / "tls.key"), "--host", HOST, "--port", str(hook_port),
                "--kubeconfig", str(kubeconfig), "--log-level", "warning"], cwd=ROOT, env=env)
            ctx = ssl.create_default_context(cafile=str(certs / "ca.crt"))
            while True:
                try:
                    if _get(f"https://localhost:{hook_port}/readyz", ctx) == b"ready":
                        break
                except OSError:
                    pass
                if time.monotonic() - started > 120:
                    raise RuntimeError("the webhook did not become ready")
                time.sleep(0.1)
            ready_s = time.monotonic() - started
            out: dict[str, Any] = {"nodes": n, "ready_after_start_s": round(ready_s, 2),
                                   "cpu_s_to_ready": round(_proc_cpu_s(hook.pid), 2),
                                   "rss_peak_mib_at_ready": round(_proc_hwm_mib(hook.pid), 1)}
            control = f"http://{HOST}:{api_port}/control"
            time.sleep(2)

            bodies = [b for b in make_bodies(64) if b"gpu-milli" in b]
            client = Client(hook_port, certs / "ca.crt", bodies)
            out["pods_only"] = _pods_phase(hook.pid, client, control, 0, 0, rate, duration)
            # Phase 1: heartbeats only.
            cpu0 = _proc_cpu_s(hook.pid)
            sent0 = json.loads(_get(f"{control}?heartbeats={n / 60}&changes=0"))
            time.sleep(duration)
            sent1 = json.loads(_get(f"{control}?heartbeats=0&changes=0"))
            cpu1 = _proc_cpu_s(hook.pid)
            out["heartbeats"] = {
                "events_per_s": round((sent1["heartbeats"] - sent0["heartbeats"]) / duration, 1),
                "webhook_cpu_s_per_min": round((cpu1 - cpu0) / duration * 60, 2),
                "webhook_cores": round((cpu1 - cpu0) / duration, 3)}

            # Phase 2: heartbeats and fractional pods; then with changes that matter as well.
            out["heartbeats_and_pods"] = _pods_phase(hook.pid, client, control, n / 60, 0, rate, duration)
            out["heartbeats_changes_and_pods"] = _pods_phase(hook.pid, client, control, n / 60, changes, rate, duration)
            metrics = _get(f"https://localhost:{hook_port}/metrics", ctx).decode()
            out["webhook_inventory_nodes"] = next(
                float(line.split()[-1]) for line in metrics.splitlines()
                if line.startswith("gpupack_webhook_inventory_nodes "))
            out["webhook_rss_peak_mib"] = round(_proc_hwm_mib(hook.pid), 1)
            return out
    finally:
        for proc in (hook, fake):
            if proc is not None:
                proc.terminate()
                proc.wait(10)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="1250,2500", help="comma list of fleet sizes (nodes of 8 GPUs)")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds per live phase (default 60)")
    parser.add_argument("--rate", type=float, default=20.0, help="fractional pods per second (default 20)")
    parser.add_argument("--changes", type=float, default=20.0,
                        help="GPUNode changes that matter per second during the pod phase (default 20: one per pod)")
    parser.add_argument("--port", type=int, default=19600)
    parser.add_argument("--skip-live", action="store_true", help="only the in-process per-event part")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--fake-api", type=int, metavar="N", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.fake_api:
        return serve_fake_api(args.fake_api, args.port)
    results: dict[str, Any] = {"per_event": [], "live": []}
    load_before = os.getloadavg()[0]
    for n in (int(x) for x in args.nodes.split(",")):
        row = per_event(n)
        print(json.dumps({"per_event": row}), flush=True)
        results["per_event"].append(row)
    results["per_event_process_rss_peak_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    if not args.skip_live:
        for n in (int(x) for x in args.nodes.split(",")):
            row = live(n, args.duration, args.rate, args.changes, args.port)
            print(json.dumps({"live": row}), flush=True)
            results["live"].append(row)
    results["environment"] = {
        "cpus": os.cpu_count(), "python": sys.version.split()[0],
        "loadavg_1min_before_after": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "command": " ".join(["python", "benchmarks/webhook_scale.py", *(argv or sys.argv[1:])]),
    }
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    errors = sum(r[phase]["errors"] for r in results["live"] for phase in ("pods_only", "heartbeats_and_pods", "heartbeats_changes_and_pods"))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
