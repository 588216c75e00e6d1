"""Settings from the environment, self-signed certificates and TLS rotation (no network)."""

from __future__ import annotations

import os
import ssl
from pathlib import Path

import pytest
from cryptography import x509

from gpupack.cli import main
from webhook.certs import make_self_signed, service_names, write_self_signed
from webhook.inventory_source import InventoryError, load_objects
from webhook.settings import WebhookSettings
from webhook.tls import ReloadingTLS, TLSConfigError


def test_settings_env_then_overrides() -> None:
    env = {"GPUPACK_WEBHOOK_PORT": "9443", "GPUPACK_WEBHOOK_ACCESS_LOG": "true", "GPUPACK_WEBHOOK_TLS_CERT": "/c"}
    settings = WebhookSettings.from_env(env, port=None, tls_cert="/override")
    assert settings.port == 9443 and settings.access_log is True and settings.tls_cert == "/override"


def test_settings_bad_env_value_names_the_variable() -> None:
    with pytest.raises(ValueError, match="GPUPACK_WEBHOOK_PORT='eighty'"):
        WebhookSettings.from_env({"GPUPACK_WEBHOOK_PORT": "eighty"})


def test_self_signed_covers_service_names(tmp_path: Path) -> None:
    paths = write_self_signed(tmp_path, "gpupack-webhook", "gpupack-system", ["127.0.0.1"])
    cert = x509.load_pem_x509_certificate(paths[1].read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(service_names("gpupack-webhook", "gpupack-system")) <= set(san.get_values_for_type(x509.DNSName))
    assert oct(os.stat(paths[2]).st_mode & 0o777) == "0o600"
    # the CA verifies the serving certificate
    ctx = ssl.create_default_context(cafile=str(paths[0]))
    assert ctx.cert_store_stats()["x509_ca"] == 1


def _write(dir_: Path, hosts: list[str]) -> bytes:
    ca, cert, key = make_self_signed(hosts)
    (dir_ / "tls.crt").write_bytes(cert)
    (dir_ / "tls.key").write_bytes(key)
    return cert


def test_rotation_reloads_and_broken_pair_keeps_old(tmp_path: Path) -> None:
    _write(tmp_path, ["a.example"])
    reloads: list[int] = []
    tls = ReloadingTLS(str(tmp_path / "tls.crt"), str(tmp_path / "tls.key"), on_reload=lambda: reloads.append(1))
    live = tls.context
    assert tls.check() is False  # unchanged files
    # Half-rotated: new certificate, old key -> ignored, old pair stays.
    ca, cert, key = make_self_signed(["b.example"])
    (tmp_path / "tls.crt").write_bytes(cert)
    assert tls.check() is False and reloads == []
    (tmp_path / "tls.key").write_bytes(key)
    assert tls.check() is True and reloads == [1]
    assert tls.context is live  # same context object: the server keeps using it


def test_missing_certificate_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(TLSConfigError, match="cannot load TLS certificate"):
        ReloadingTLS(str(tmp_path / "nope.crt"), str(tmp_path / "nope.key"))


def test_inventory_file_errors(tmp_path: Path) -> None:
    bad = tmp_path / "inv.yaml"
    bad.write_text("- kind: Pod\n  metadata: {name: x}\n")
    with pytest.raises(InventoryError, match="valid kinds: GPUNode, Namespace, Node, SharingPolicy"):
        load_objects(bad)
    bad.write_text("[unclosed")
    with pytest.raises(InventoryError, match="not valid YAML"):
        load_objects(bad)
    with pytest.raises(InventoryError, match="cannot read"):
        load_objects(tmp_path / "missing.yaml")


def test_inventory_file_accepts_list_kinds(tmp_path: Path) -> None:
    f = tmp_path / "inv.json"
    f.write_text('{"kind": "List", "items": [{"kind": "GPUNode", "metadata": {"name": "n"}}]}')
    assert [o["metadata"]["name"] for o in load_objects(f)] == ["n"]


def test_cli_serve_rejects_missing_tls(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["webhook", "serve", "--inventory", "x.yaml"]) == 2
    assert "--tls-cert and --tls-key are required" in capsys.readouterr().err


def test_cli_decide(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = Path(__file__).resolve().parents[2]
    pod = tmp_path / "pod.yaml"
    pod.write_text(
        "kind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n  - name: c\n    image: x\n"
        "    resources: {limits: {gpupack.io/gpu-milli: '100'}}\n"
    )
    assert main(["webhook", "decide", "--inventory", str(root / "examples" / "inventory.yaml"), str(pod)]) == 0
    assert "nvidia.com/mig-1g.10gb" in capsys.readouterr().out
    pod.write_text(pod.read_text().replace("'100'", "'0'"))
    assert main(["webhook", "decide", "--inventory", str(root / "examples" / "inventory.yaml"), str(pod)]) == 1
    assert "1..1000" in capsys.readouterr().err


def test_inventory_file_reloads_and_survives_bad_edits(tmp_path: Path) -> None:
    from webhook.inventory_source import FileWatch, InventoryHolder, load_file

    f = tmp_path / "inv.yaml"
    f.write_text("- kind: GPUNode\n  metadata: {name: a}\n")
    holder = InventoryHolder()
    load_file(holder, f)
    watch = FileWatch(holder, f)
    assert watch.check() is False
    f.write_text("- kind: GPUNode\n  metadata: {name: a}\n- kind: GPUNode\n  metadata: {name: b}\n")
    assert watch.check() is True
    assert [n.name for n in holder.current.nodes] == ["a", "b"]
    f.write_text("[not yaml")
    assert watch.check() is False
    assert [n.name for n in holder.current.nodes] == ["a", "b"]


def test_placement_setting_is_checked() -> None:
    from webhook.settings import WebhookSettings

    assert WebhookSettings.from_env({}).placement == "engine"
    assert WebhookSettings.from_env({"GPUPACK_WEBHOOK_PLACEMENT": "scheduler"}).placement == "scheduler"
    with pytest.raises(ValueError, match="engine, scheduler"):
        WebhookSettings.from_env({"GPUPACK_WEBHOOK_PLACEMENT": "random"})


def test_the_file_watcher_outlives_bytes_that_are_not_utf8(tmp_path: Path) -> None:
    """Non-UTF-8 bytes used to kill the reload thread, so later valid edits were never loaded."""
    import time

    from webhook.inventory_source import FileWatch, InventoryHolder, load_file

    f = tmp_path / "inv.yaml"
    f.write_text("- kind: GPUNode\n  metadata: {name: a}\n")
    holder = InventoryHolder()
    load_file(holder, f)
    watch = FileWatch(holder, f, every=0.02)
    watch.start()
    try:
        f.write_bytes(b"\xff\xfe\x00garbage")
        time.sleep(0.2)  # several polls see the bad file
        assert [n.name for n in holder.current.nodes] == ["a"]
        f.write_text("- kind: GPUNode\n  metadata: {name: b}\n")
        deadline = time.monotonic() + 10
        while [n.name for n in holder.current.nodes] != ["b"] and time.monotonic() < deadline:
            time.sleep(0.02)
        assert [n.name for n in holder.current.nodes] == ["b"]
    finally:
        watch.stop()


def test_a_binary_inventory_file_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from gpupack.cli import main

    f = tmp_path / "inv.yaml"
    f.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    pod = tmp_path / "pod.yaml"
    pod.write_text("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: c, image: x}]}\n")
    assert main(["webhook", "decide", "--inventory", str(f), str(pod)]) == 2
    assert "not UTF-8 text" in capsys.readouterr().err


def test_connection_limits_are_settings_and_are_checked() -> None:
    defaults = WebhookSettings.from_env({})
    assert (defaults.max_connections_per_source, defaults.tls_handshake_seconds) == (500, 10.0)
    env = {"GPUPACK_WEBHOOK_MAX_CONNECTIONS_PER_SOURCE": "8", "GPUPACK_WEBHOOK_TLS_HANDSHAKE_SECONDS": "2.5"}
    settings = WebhookSettings.from_env(env)
    assert (settings.max_connections_per_source, settings.tls_handshake_seconds) == (8, 2.5)
    with pytest.raises(ValueError, match="max_connections_per_source must be at least 1"):
        WebhookSettings.from_env({"GPUPACK_WEBHOOK_MAX_CONNECTIONS_PER_SOURCE": "0"})
    with pytest.raises(ValueError, match="tls_handshake_seconds"):
        WebhookSettings.from_env({"GPUPACK_WEBHOOK_TLS_HANDSHAKE_SECONDS": "0"})
