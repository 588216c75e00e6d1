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

    python benchmarks/webhook_bench.py --duration 10 --rate 500
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


def run_target(target: str, args: argparse.Namespace, certs: Path, bodies: list[bytes]) -> dict[str, Any]:
    port = args.port + (0 if target == "gpupack" else 1)
    proc = start_server(target, port, certs)
    try:
        client = Client(port, certs / "ca.crt", bodies)
        run(client.closed_loop(args.connections, 2.0))  # warm up
        thr = summary(*run(client.closed_loop(args.connections, args.duration)))
        lat = summary(*run(client.open_loop(args.connections, args.rate, args.duration)))
        return {"target": target, "closed_loop": thr, "open_loop": {"rate": args.rate, **lat}, "errors": client.errors}
    finally:
        proc.terminate()
        proc.wait(10)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per phase (default 10)")
    parser.add_argument("--rate", type=float, default=500.0, help="open-loop rate, requests/s (default 500)")
    parser.add_argument("--connections", type=int, default=8, help="keep-alive connections (default 8)")
    parser.add_argument("--targets", default="gpupack,echo", help="comma list of gpupack, echo")
    parser.add_argument("--port", type=int, default=19443)
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    bodies = make_bodies(64)
    results: list[dict[str, Any]] = []
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        certs = Path(tmp)
        ca, cert, key = make_self_signed(["localhost", HOST])
        (certs / "ca.crt").write_bytes(ca)
        (certs / "tls.crt").write_bytes(cert)
        (certs / "tls.key").write_bytes(key)
        for target in args.targets.split(","):
            result = run_target(target, args, certs, bodies)
            results.append(result)
            print(json.dumps(result), flush=True)
    env = {
        "loop": fastest("uvloop", "asyncio"),
        "http": fastest("httptools", "h11"),
        "cpus": os.cpu_count(),
        "body_bytes": sum(map(len, bodies)) // len(bodies),
        # Other work on the machine shows in the tails: say how busy it was.
        "loadavg_1min_before_after": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }
    print(json.dumps({"environment": env}))
    if len(results) == 2:
        g, e = results
        print(
            f"throughput gpupack/echo = {g['closed_loop']['throughput_per_s'] / e['closed_loop']['throughput_per_s']:.2f}; "
            f"p99@{args.rate:g}/s gpupack/echo = {g['open_loop']['p99_ms'] / e['open_loop']['p99_ms']:.2f}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"results": results, "environment": env}, indent=2))
    return 1 if any(r["errors"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
