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
from gpupack.testing.admission_reviews import gpu_container, make_pod, make_review

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
    def __init__(self, tmp: Path, **settings: str) -> None:
        self.dir = tmp
        self.ca, self.der = write_pair(tmp)
        self.port = free_port()
        env = dict(os.environ, PYTHONPATH=str(ROOT), GPUPACK_WEBHOOK_TLS_RELOAD_SECONDS="0.2",
                   GPUPACK_WEBHOOK_MAX_BODY_BYTES=str(256 * 1024), GPUPACK_WEBHOOK_REQUEST_READ_SECONDS="1")
        env.update({f"GPUPACK_WEBHOOK_{name.upper()}": value for name, value in settings.items()})
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

    def client(self, source: str | None = None) -> httpx.Client:
        """An HTTPS client; ``source`` binds it to another loopback address (a second client host)."""
        verify = ssl.create_default_context(cafile=str(self.ca))
        transport = httpx.HTTPTransport(verify=verify, local_address=source) if source else None
        return httpx.Client(base_url=self.url, verify=verify, transport=transport, timeout=10)

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



# Flood: small caps so that a handful of connections reach them. The read deadline is long
# so that silent connections stay open for the whole test unless the server refuses them.
FLOOD = dict(max_connections="20", max_connections_per_source="5", tls_handshake_seconds="1",
             request_read_seconds="120", log_level="warning")
API_SERVER = "127.0.0.2"  # all of 127.0.0.0/8 is loopback on Linux: a second source address


@pytest.fixture(scope="module")
def flood_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = Server(tmp_path_factory.mktemp("webhook-flood"), **FLOOD)
    yield s
    s.stop()


def _silent_tls(server: Server) -> ssl.SSLSocket:
    ctx = ssl.create_default_context(cafile=str(server.ca))
    raw = socket.create_connection(("127.0.0.1", server.port), timeout=30, source_address=("127.0.0.1", 0))
    return ctx.wrap_socket(raw, server_hostname="localhost")


def test_one_source_cannot_take_the_connection_cap(flood_server: Server) -> None:
    """25 silent TLS connections from one address used to fill the cap of 20: every admission got 503."""
    with flood_server.client(API_SERVER) as client:
        before = flood_server.metric_value(client, 'gpupack_webhook_connections_refused_total{reason="per_source_limit"}')
    silent = []
    try:
        for _ in range(25):
            silent.append(_silent_tls(flood_server))
        with flood_server.client(API_SERVER) as client:
            answer = client.post("/mutate", json=make_review(make_pod(gpu_container()), uid="through"))
            assert answer.status_code == 200
            assert answer.json()["response"]["uid"] == "through"
            refused = 0.0
            for _ in range(50):  # the last handshakes may still be in the server's queue: bounded wait
                refused = flood_server.metric_value(
                    client, 'gpupack_webhook_connections_refused_total{reason="per_source_limit"}') - before
                if refused >= 20:
                    break
                time.sleep(0.2)
        assert refused == 20  # the flooding source holds 5, no more
        # The refused ones were closed by the server, not left hanging.
        closed = 0
        for tls in silent[5:]:
            try:
                closed += tls.recv(1024) == b""
            except (ConnectionResetError, ssl.SSLError):
                closed += 1
        assert closed == 20
    finally:
        for tls in silent:
            tls.close()


def test_the_refusals_are_logged_once_per_change_of_state(tmp_path: Path) -> None:
    server = Server(tmp_path, **FLOOD)
    silent = []
    try:
        for _ in range(12):
            silent.append(_silent_tls(server))
        with server.client(API_SERVER) as client:
            for _ in range(50):
                if server.metric_value(client, 'gpupack_webhook_connections_refused_total{reason="per_source_limit"}') >= 7:
                    break
                time.sleep(0.2)
    finally:
        for tls in silent:
            tls.close()
        server.stop()
    assert server.proc.stdout is not None
    output = server.proc.stdout.read().decode()
    assert output.count("refusing connections from 127.0.0.1") == 1, output


def test_a_connection_that_never_starts_tls_is_closed(flood_server: Server) -> None:
    """Plain TCP connections that sent nothing were held for 60 s (the event loop's default)."""
    with flood_server.client(API_SERVER) as client:
        before = flood_server.metric_value(client, 'gpupack_webhook_connections_refused_total{reason="tls_handshake"}')
    raw = socket.create_connection(("127.0.0.1", flood_server.port), timeout=30, source_address=(API_SERVER, 0))
    try:
        # The server closes it (the deadline is 1 s here); the 30 s timeout only bounds a failure.
        try:
            assert raw.recv(1024) == b""
        except ConnectionResetError:
            pass  # reset rather than closed: just as disconnected
    finally:
        raw.close()
    with flood_server.client(API_SERVER) as client:
        after = 0.0
        for _ in range(50):  # the counter's timer fires with the loop's own deadline: bounded wait
            after = flood_server.metric_value(client, 'gpupack_webhook_connections_refused_total{reason="tls_handshake"}')
            if after > before:
                break
            time.sleep(0.2)
        assert after == before + 1
