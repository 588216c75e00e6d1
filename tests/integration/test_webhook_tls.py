"""The real server: ``gpupack webhook serve`` in its own process, HTTPS on loopback.

Checks what only the assembled server can show: TLS from the given files, a
certificate rotation picked up without a restart, admission answers over a
kept-alive connection, the body cap, health/readiness/metrics.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from gpupack.devcluster.process import free_port
from tests.processes import stop_process
from webhook.certs import make_self_signed
from webhook.testing import gpu_container, make_pod, make_review

ROOT = Path(__file__).resolve().parents[2]


def write_pair(directory: Path) -> tuple[Path, bytes]:
    ca, cert, key = make_self_signed(["localhost", "127.0.0.1"])
    ca_path = directory / f"ca-{time.monotonic_ns()}.crt"
    ca_path.write_bytes(ca)
    # Replace atomically, as the kubelet does for a mounted Secret.
    for name, data in (("tls.key.new", key), ("tls.crt.new", cert)):
        (directory / name).write_bytes(data)
    os.replace(directory / "tls.key.new", directory / "tls.key")
    os.replace(directory / "tls.crt.new", directory / "tls.crt")
    return ca_path, x509.load_pem_x509_certificate(cert).public_bytes(Encoding.DER)


class Server:
    def __init__(self, tmp: Path) -> None:
        self.dir = tmp
        self.ca, self.der = write_pair(tmp)
        self.port = free_port()
        env = dict(os.environ, PYTHONPATH=str(ROOT), GPUPACK_WEBHOOK_TLS_RELOAD_SECONDS="0.2",
                   GPUPACK_WEBHOOK_MAX_BODY_BYTES=str(256 * 1024), GPUPACK_WEBHOOK_REQUEST_READ_SECONDS="1")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpupack", "webhook", "serve", "--tls-cert", str(tmp / "tls.crt"),
             "--tls-key", str(tmp / "tls.key"), "--host", "127.0.0.1", "--port", str(self.port),
             "--inventory", str(ROOT / "examples" / "inventory.yaml"), "--log-level", "warning"],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )
        self.url = f"https://localhost:{self.port}"
        self.wait_ready()

    def metric_value(self, client: httpx.Client, name: str) -> float:
        text = client.get("/metrics").text
        return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " "))

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, verify=ssl.create_default_context(cafile=str(self.ca)), timeout=10)

    def wait_ready(self) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(self.proc.stdout.read().decode() if self.proc.stdout else "server exited")
            try:
                with self.client() as c:
                    if c.get("/readyz").status_code == 200:
                        return
            except httpx.HTTPError:
                time.sleep(0.2)
        raise RuntimeError("webhook did not become ready")

    def presented_certificate(self, ca: Path) -> bytes:
        ctx = ssl.create_default_context(cafile=str(ca))
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as raw:
            with ctx.wrap_socket(raw, server_hostname="localhost") as tls:
                der = tls.getpeercert(binary_form=True)
        assert der is not None
        return der

    def stop(self) -> None:
        stop_process(self.proc)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = Server(tmp_path_factory.mktemp("webhook-tls"))
    yield s
    s.stop()


def test_mutate_over_tls_with_keep_alive(server: Server) -> None:
    with server.client() as client:
        for i, (milli, resource) in enumerate([("100", "nvidia.com/mig-1g.10gb"), ("150", "nvidia.com/mig-2g.20gb")]):
            review = make_review(make_pod(gpu_container("c", milli), mode="mig"), uid=f"u{i}")
            answer = client.post("/mutate", json=review)
            assert answer.status_code == 200
            response = answer.json()["response"]
            assert response["uid"] == f"u{i}" and response["allowed"]
            patch = json.loads(base64.b64decode(response["patch"]))
            limits = [op["value"] for op in patch if op["path"] == "/spec/containers/0/resources/limits"]
            assert limits == [{resource: "1"}]


def test_validate_over_tls(server: Server) -> None:
    obj = {"apiVersion": "gpupack.io/v1alpha1", "kind": "SharingPolicy", "metadata": {"name": "p"},
           "spec": {"allowedProfiles": ["5g.50gb"]}}
    review = make_review(obj, kind="SharingPolicy", group="gpupack.io", version="v1alpha1", uid="pol")
    with server.client() as client:
        response = client.post("/validate", json=review).json()["response"]
    assert response["uid"] == "pol" and not response["allowed"] and "5g.50gb" in response["status"]["message"]


def test_oversized_body_refused(server: Server) -> None:
    review = make_review(make_pod(gpu_container(), annotations={"blob": "z" * 300_000}), uid="huge")
    with server.client() as client:
        answer = client.post("/mutate", content=json.dumps(review).encode())
    assert answer.status_code == 200
    response = answer.json()["response"]
    assert response["uid"] == "huge" and not response["allowed"] and "262144" in response["status"]["message"]
    assert response["status"]["code"] == 413 and response["status"]["reason"] == "RequestEntityTooLarge"
    assert response["status"]["details"]["causes"][0]["reason"] == "BodyTooLarge"


def test_malformed_json_carries_its_reason_code(server: Server) -> None:
    with server.client() as client:
        response = client.post("/mutate", content=b'{"request": {"uid": "broken", ').json()["response"]
    assert not response["allowed"] and response["status"]["code"] == 400
    assert response["status"]["details"]["causes"][0]["reason"] == "MalformedJSON"


def test_tls12_offers_no_cbc_suites(server: Server) -> None:
    for offered, accepted in (("ECDHE-RSA-AES128-SHA:ECDHE-ECDSA-AES128-SHA:AES128-SHA256:AES256-SHA", False),
                              ("ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES128-GCM-SHA256", True)):
        ctx = ssl.create_default_context(cafile=str(server.ca))
        ctx.maximum_version = ssl.TLSVersion.TLSv1_2
        ctx.set_ciphers(offered)
        try:
            with socket.create_connection(("127.0.0.1", server.port), timeout=5) as raw:
                with ctx.wrap_socket(raw, server_hostname="localhost") as tls:
                    negotiated = tls.cipher()
            assert accepted and negotiated is not None and "GCM" in negotiated[0], (offered, negotiated)
        except ssl.SSLError:
            assert not accepted, offered


def test_metrics_and_health(server: Server) -> None:
    with server.client() as client:
        assert client.get("/healthz").status_code == 200
        text = client.get("/metrics").text
    assert 'gpupack_webhook_requests_total{endpoint="mutate",outcome="allowed"}' in text


def _stalled(server: Server, first_bytes: bytes) -> ssl.SSLSocket:
    ctx = ssl.create_default_context(cafile=str(server.ca))
    raw = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    tls = ctx.wrap_socket(raw, server_hostname="localhost")
    if first_bytes:
        tls.sendall(first_bytes)
    return tls


@pytest.mark.parametrize("first_bytes", [
    b"",  # connected, then nothing
    b"POST /mutate HTTP/1.1\r\nHost: localhost\r\n",  # part of the headers
    b"POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Length: 200000\r\n\r\n" + b"x" * 65536,  # part of a body, under the size limit
], ids=["silent", "partial-headers", "partial-body"])
def test_a_client_too_slow_to_send_its_request_is_disconnected(server: Server, first_bytes: bytes) -> None:
    """Stalled clients used to stay connected for over 70 s and, enough of them, exhaust the sockets."""
    with server.client() as client:
        before = server.metric_value(client, "gpupack_webhook_slow_clients_dropped_total")
    tls = _stalled(server, first_bytes)
    try:
        # The server closes it (the deadline is 1 s here); the 30 s socket timeout only bounds a failure.
        assert tls.recv(1024) == b""
    except (ConnectionResetError, ssl.SSLError):
        pass  # closed under the TLS layer: just as disconnected
    finally:
        tls.close()
    with server.client() as client:
        assert server.metric_value(client, "gpupack_webhook_slow_clients_dropped_total") == before + 1
        # Prompt clients are served as ever.
        response = client.post("/mutate", json=make_review(make_pod(gpu_container()), uid="after")).json()
    assert response["response"]["uid"] == "after"


def test_certificate_rotation_without_restart(server: Server) -> None:
    assert server.presented_certificate(server.ca) == server.der
    new_ca, new_der = write_pair(server.dir)
    deadline = time.monotonic() + 30
    seen = b""
    while time.monotonic() < deadline:
        try:
            seen = server.presented_certificate(new_ca)
        except ssl.SSLError:  # still the old certificate, which the new CA does not sign
            time.sleep(0.2)
            continue
        break
    assert seen == new_der
    assert server.proc.poll() is None  # same process
    with httpx.Client(base_url=server.url, verify=ssl.create_default_context(cafile=str(new_ca))) as client:
        assert client.get("/metrics").text.count("gpupack_webhook_tls_reloads_total 1.0") == 1

