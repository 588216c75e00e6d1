"""Benchmark the admission webhook over TLS on loopback (a script, not a test).

For each target (gpupack's webhook with ``examples/inventory.yaml``, and a
bare-bones FastAPI echo as the baseline) it starts the server in its own
process with the same uvicorn options, then drives it with a keep-alive HTTPS
client written on asyncio streams:

* **throughput**: closed loop, ``--connections`` connections each sending the
  next request as soon as the previous answer arrives, for ``--duration`` s;
* **latency at a fixed rate**: open loop at ``--rate`` requests/s, each
  request's latency measured from the moment it was *scheduled* (not sent), so
  a stall of the server shows in the tail instead of silently lowering the rate
  (no coordinated omission).

Bodies are realistic AdmissionReviews of ~4 KB (``webhook_pods.py``). Every
answer is checked: HTTP 200 and the request's uid in the response. Results go
to stdout (and ``--json FILE``). Typical run (see benchmarks/webhook.md)::

    python benchmarks/webhook_bench.py --rounds 3 --duration 5 --rate 500
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from webhook_pods import bodies as make_bodies  # noqa: E402

from webhook.certs import make_self_signed  # noqa: E402
from webhook.server import fastest  # noqa: E402

HOST = "127.0.0.1"

try:  # the client, too, runs on uvloop when installed: less client CPU on a 2-core box
    import uvloop

    run = uvloop.run
except ImportError:  # pragma: no cover
    run = asyncio.run


def start_server(target: str, port: int, certs: Path) -> subprocess.Popen[bytes]:
    cert, key = str(certs / "tls.crt"), str(certs / "tls.key")
    if target == "gpupack":
        cmd = [
            sys.executable, "-m", "gpupack", "webhook", "serve", "--tls-cert", cert, "--tls-key", key,
            "--host", HOST, "--port", str(port), "--inventory", str(ROOT / "examples" / "inventory.yaml"),
            "--log-level", "warning",
        ]
    else:
        cmd = [
            sys.executable, "-m", "uvicorn", "webhook_echo:app", "--app-dir", str(ROOT / "benchmarks"),
            "--host", HOST, "--port", str(port), "--ssl-certfile", cert, "--ssl-keyfile", key,
            "--log-level", "warning", "--no-access-log", "--loop", fastest("uvloop", "asyncio"),
            "--http", fastest("httptools", "h11"), "--timeout-keep-alive", "120",
        ]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env)
    ctx = ssl.create_default_context(cafile=str(certs / "ca.crt"))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"https://localhost:{port}/readyz", context=ctx, timeout=1) as r:
                if r.status == 200:
                    return proc
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"{target} server did not become ready")


class Client:
    def __init__(self, port: int, ca: Path, bodies: list[bytes]) -> None:
        self.port = port
        self.ctx = ssl.create_default_context(cafile=str(ca))
        self.requests = [
            (
                b"POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(b)}\r\n\r\n".encode()
                + b,
                json.loads(b)["request"]["uid"].encode(),
            )
            for b in bodies
        ]
        self.errors = 0

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, i: int) -> None:
        request, uid = self.requests[i % len(self.requests)]
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n"):
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        body = await reader.readexactly(length)
        if not head.startswith(b"HTTP/1.1 200") or uid not in body:
            self.errors += 1

    async def closed_loop(self, connections: int, duration: float) -> tuple[list[float], float]:
        latencies: list[float] = []
        end = time.perf_counter() + duration

        async def worker(w: int) -> None:
            reader, writer = await asyncio.open_connection(HOST, self.port, ssl=self.ctx, server_hostname="localhost")
            i = w
            while time.perf_counter() < end:
                t0 = time.perf_counter()
                await self._one(reader, writer, i)
                latencies.append(time.perf_counter() - t0)
                i += connections
            writer.close()

        started = time.perf_counter()
        await asyncio.gather(*(worker(w) for w in range(connections)))
        return latencies, time.perf_counter() - started

    async def open_loop(self, connections: int, rate: float, duration: float) -> tuple[list[float], float]:
        latencies: list[float] = []
        total = int(rate * duration)
        slot = 0
        conns = [
            await asyncio.open_connection(HOST, self.port, ssl=self.ctx, server_hostname="localhost")
            for _ in range(connections)
        ]
        start = time.perf_counter() + 0.05

        async def worker(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal slot
            while slot < total:
                k = slot
                slot += 1
                due = start + k / rate
                delay = due - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                await self._one(reader, writer, k)
                latencies.append(time.perf_counter() - due)
            writer.close()

        await asyncio.gather(*(worker(r, w) for r, w in conns))
        return latencies, time.perf_counter() - start


def summary(latencies: list[float], elapsed: float) -> dict[str, float]:
    ordered = sorted(latencies)
    n = len(ordered)

    def pct(p: float) -> float:
        return round(ordered[min(n - 1, int(p * n))] * 1000, 3) if n else float("nan")

    return {
        "requests": n,
        "throughput_per_s": round(n / elapsed, 1),
        "p50_ms": pct(0.50),
        "p99_ms": pct(0.99),
        "p999_ms": pct(0.999),
        "max_ms": round(ordered[-1] * 1000, 3) if n else float("nan"),
    }


def in_app_quantiles(port: int, ca: Path) -> dict[str, float]:
    """Upper bounds (ms) of the histogram buckets holding the p50/p99/p999 of the
    time gpupack itself spends per admission (parse, decide, patch, encode),
    from its own /metrics: what is left of the round trip is TLS, HTTP, the
    event loop and the machine."""
    ctx = ssl.create_default_context(cafile=str(ca))
    with urllib.request.urlopen(f"https://localhost:{port}/metrics", context=ctx, timeout=5) as r:
        text = r.read().decode()
    buckets: list[tuple[float, float]] = []
    for line in text.splitlines():
        if line.startswith('gpupack_webhook_request_duration_seconds_bucket{endpoint="mutate"'):
            le = line.split('le="')[1].split('"')[0]
            buckets.append((float(le), float(line.split()[-1])))
    total = buckets[-1][1] if buckets else 0.0
    out = {}
    for name, q in (("p50_ms", 0.5), ("p99_ms", 0.99), ("p999_ms", 0.999)):
        out[name] = next((le * 1000 for le, count in buckets if count >= q * total), float("nan"))
    out["count"] = total
    return out


def median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def run_rounds(args: argparse.Namespace, certs: Path, bodies: list[bytes]) -> dict[str, Any]:
    """Both servers up at once; phases interleaved (gpupack, echo, echo, gpupack, ...)
    so that a burst of other work on the machine hits both, and medians over rounds."""
    targets = args.targets.split(",")
    procs = {t: start_server(t, args.port + i, certs) for i, t in enumerate(targets)}
    clients = {t: Client(args.port + i, certs / "ca.crt", bodies) for i, t in enumerate(targets)}
    rounds: dict[str, list[dict[str, Any]]] = {t: [] for t in targets}
    try:
        for t in targets:
            run(clients[t].closed_loop(args.connections, 2.0))  # warm up
        for r in range(args.rounds):
            # Rotate who goes first, so neither always follows the other's load.
            for t in targets[r % len(targets):] + targets[: r % len(targets)]:
                thr = summary(*run(clients[t].closed_loop(args.connections, args.duration)))
                lat = summary(*run(clients[t].open_loop(args.connections, args.rate, args.duration)))
                rounds[t].append({"closed_loop": thr, "open_loop": lat})
                print(json.dumps({"round": r, "target": t, "closed_loop": thr, "open_loop": lat}), flush=True)
        in_app = in_app_quantiles(args.port + targets.index("gpupack"), certs / "ca.crt") if "gpupack" in targets else {}
    finally:
        for proc in procs.values():
            proc.terminate()
            proc.wait(10)
    out: dict[str, Any] = {}
    if in_app:
        out["gpupack_in_app"] = in_app
    for t in targets:
        out[t] = {
            "throughput_per_s": median([x["closed_loop"]["throughput_per_s"] for x in rounds[t]]),
            "closed_p50_ms": median([x["closed_loop"]["p50_ms"] for x in rounds[t]]),
            "closed_p99_ms": median([x["closed_loop"]["p99_ms"] for x in rounds[t]]),
            "open_rate": args.rate,
            "open_p50_ms": median([x["open_loop"]["p50_ms"] for x in rounds[t]]),
            "open_p99_ms": median([x["open_loop"]["p99_ms"] for x in rounds[t]]),
            "open_p999_ms": median([x["open_loop"]["p999_ms"] for x in rounds[t]]),
            "errors": clients[t].errors,
            "rounds": rounds[t],
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per phase (default 5)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians reported (default 3)")
    parser.add_argument("--rate", type=float, default=500.0, help="open-loop rate, requests/s (default 500)")
    parser.add_argument("--connections", type=int, default=8, help="keep-alive connections (default 8)")
    parser.add_argument("--targets", default="gpupack,echo", help="comma list of gpupack, echo")
    parser.add_argument("--port", type=int, default=19443)
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument(
        "--nice", type=int, default=0,
        help="nice increment for the client and both servers (negative needs root): on a machine shared "
        "with other work, -5 measures the webhook rather than its neighbours, for gpupack and echo alike",
    )
    args = parser.parse_args(argv)
    if args.nice:
        os.nice(args.nice)  # inherited by the server processes started below
    bodies = make_bodies(64)
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        certs = Path(tmp)
        ca, cert, key = make_self_signed(["localhost", HOST])
        (certs / "ca.crt").write_bytes(ca)
        (certs / "tls.crt").write_bytes(cert)
        (certs / "tls.key").write_bytes(key)
        results = run_rounds(args, certs, bodies)
    env = {
        "loop": fastest("uvloop", "asyncio"),
        "http": fastest("httptools", "h11"),
        "cpus": os.cpu_count(),
        "body_bytes": sum(map(len, bodies)) // len(bodies),
        # Other work on the machine shows in the tails: say how busy it was.
        "loadavg_1min_before_after": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "nice": os.nice(0),
    }
    print("median over rounds:")
    for target, r in results.items():
        if target == "gpupack_in_app":
            print(f"  gpupack in-app time per admission (bucket upper bounds): {r}")
            continue
        print(
            f"  {target:8s} throughput {r['throughput_per_s']:7.0f}/s (p50 {r['closed_p50_ms']} ms, p99 {r['closed_p99_ms']} ms)"
            f" | at {args.rate:g}/s: p50 {r['open_p50_ms']} ms  p99 {r['open_p99_ms']} ms  p999 {r['open_p999_ms']} ms"
            f" | errors {r['errors']}"
        )
    print(json.dumps({"environment": env}))
    if "gpupack" in results and "echo" in results:
        g, e = results["gpupack"], results["echo"]
        print(
            f"ratio gpupack/echo: throughput {g['throughput_per_s'] / e['throughput_per_s']:.2f}, "
            f"p99 at {args.rate:g}/s {g['open_p99_ms'] / e['open_p99_ms']:.2f}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"results": results, "environment": env}, indent=2))
    return 1 if any(r.get("errors") for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
