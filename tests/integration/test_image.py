"""gpupack's container image, built by tools/image/build.sh and run with runc.

The image is unpacked (umoci) and each command runs as the user the image
declares, with a read-only root filesystem (a tmpfs on /tmp, as the manifests
give), sharing the host's network so the test can reach the webhook:
``gpupack --version``, ``gpupack agent snapshot`` on the simulated NVML backend,
and ``gpupack webhook serve`` answering a real AdmissionReview over TLS.

Needs root, runc and the image's build tools (build.sh installs mmdebstrap and
umoci with apt-get when they are missing). Where they cannot be had, the tests
fail with the cause; ``GPUPACK_SKIP_IMAGE=1`` skips them on purpose.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import ssl
import subprocess
import time
import tomllib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpupack.devcluster.process import free_port
from webhook.certs import make_self_signed
from gpupack.testing.admission_reviews import gpu_container, make_pod, make_review

ROOT = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
IMAGE_USER = 65532


class Image:
    """The unpacked image: a runc bundle whose config.json is rewritten for each run."""

    def __init__(self, bundle: Path, mounts: Path) -> None:
        self.bundle, self.mounts = bundle, mounts
        self.base = json.loads((bundle / "config.json").read_text())

    def config(self, args: list[str]) -> None:
        config = json.loads(json.dumps(self.base))
        process = config["process"]
        process["args"] = args
        process["terminal"] = False
        config["root"]["readonly"] = True
        # The host's network: the test connects to the webhook on loopback.
        config["linux"]["namespaces"] = [n for n in config["linux"]["namespaces"] if n["type"] != "network"]
        config["mounts"] += [
            {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev", "mode=1777"]},
            {"destination": "/etc/gpupack", "type": "bind", "source": str(self.mounts), "options": ["rbind", "ro"]},
        ]
        (self.bundle / "config.json").write_text(json.dumps(config))

    def run(self, args: list[str], timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
        self.config(args)
        name = f"gpupack-test-{uuid.uuid4().hex[:8]}"
        try:
            return subprocess.run(["runc", "run", "--bundle", str(self.bundle), name], capture_output=True,
                                  text=True, timeout=timeout_s)
        finally:
            subprocess.run(["runc", "delete", "--force", name], capture_output=True)

    @property
    def process_user(self) -> Any:
        return self.base["process"]["user"]


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Image]:
    if os.environ.get("GPUPACK_SKIP_IMAGE", "") not in ("", "0"):
        pytest.skip("GPUPACK_SKIP_IMAGE=1 is set: the image tests skipped on purpose")
    if os.geteuid() != 0 or shutil.which("runc") is None:
        pytest.fail("the image tests need root and runc (apt-get install runc); "
                    "set GPUPACK_SKIP_IMAGE=1 to skip them on purpose", pytrace=False)
    built = subprocess.run(["bash", str(ROOT / "tools" / "image" / "build.sh")], capture_output=True, text=True,
                           timeout=1200)
    if built.returncode != 0:
        pytest.fail(f"tools/image/build.sh failed ({built.returncode}):\n{built.stderr[-3000:]}", pytrace=False)
    out = Path(built.stdout.strip().splitlines()[-1])
    tmp = tmp_path_factory.mktemp("image")
    unpacked = subprocess.run(["umoci", "unpack", "--image", f"{out / 'oci'}:{VERSION}", str(tmp / "bundle")],
                              capture_output=True, text=True, timeout=300)
    assert unpacked.returncode == 0, unpacked.stderr
    mounts = tmp / "etc-gpupack"
    mounts.mkdir()
    yield Image(tmp / "bundle", mounts)


def test_the_image_declares_a_non_root_user_and_runs_as_it(image: Image) -> None:
    assert image.process_user["uid"] == IMAGE_USER and image.process_user["gid"] == IMAGE_USER
    ran = image.run(["/usr/bin/id", "-u"])
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == str(IMAGE_USER)


def test_version(image: Image) -> None:
    ran = image.run(["/usr/local/bin/gpupack", "--version"])
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == f"gpupack {VERSION}"


def test_the_root_filesystem_is_read_only_and_tmp_is_not(image: Image) -> None:
    ran = image.run(["/bin/sh", "-c", "touch /opt/x; echo root=$?; touch /tmp/x; echo tmp=$?"])
    assert "root=1" in ran.stdout and "tmp=0" in ran.stdout, ran.stdout + ran.stderr


def test_no_package_manager_or_compiler_is_left(image: Image) -> None:
    rootfs = image.bundle / "rootfs"
    assert (rootfs / "usr" / "bin" / "python3").exists()
    for name in ("dpkg", "apt", "apt-get", "pip", "pip3", "gcc", "cc", "c++", "make"):
        present = [d for d in ("usr/bin", "usr/sbin", "bin", "sbin", "usr/local/bin") if (rootfs / d / name).exists()]
        assert not present, f"{name} in {present}"
    assert not (rootfs / "var" / "lib" / "dpkg").exists()


def test_agent_snapshot_on_the_simulated_backend(image: Image) -> None:
    ran = image.run(["/usr/local/bin/gpupack", "agent", "snapshot", "--simulate", "A100-80GB:2"])
    assert ran.returncode == 0, ran.stderr
    snapshot = json.loads(ran.stdout)
    assert snapshot["backend"] == "simulated"
    assert [g["device"]["name"] for g in snapshot["gpus"]] == ["NVIDIA A100-SXM4-80GB"] * 2


def test_webhook_serve_answers_an_admission_review_over_tls(image: Image, tmp_path: Path) -> None:
    ca, cert, key = make_self_signed(["127.0.0.1", "localhost"])
    for name, data in (("tls.crt", cert), ("tls.key", key)):
        (image.mounts / name).write_bytes(data)
        (image.mounts / name).chmod(0o644)  # read by the image's user
    shutil.copy(ROOT / "examples" / "inventory.yaml", image.mounts / "inventory.yaml")
    (tmp_path / "ca.crt").write_bytes(ca)
    port = free_port()
    image.config(["/usr/local/bin/gpupack", "webhook", "serve", "--tls-cert", "/etc/gpupack/tls.crt",
                  "--tls-key", "/etc/gpupack/tls.key", "--inventory", "/etc/gpupack/inventory.yaml",
                  "--host", "127.0.0.1", "--port", str(port)])
    name = f"gpupack-webhook-{uuid.uuid4().hex[:8]}"
    log = (tmp_path / "webhook.log").open("w")
    proc = subprocess.Popen(["runc", "run", "--bundle", str(image.bundle), name], stdout=log, stderr=subprocess.STDOUT)
    try:
        url = f"https://127.0.0.1:{port}"
        with httpx.Client(verify=ssl.create_default_context(cafile=str(tmp_path / "ca.crt")), timeout=5) as http:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if http.get(url + "/readyz").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert proc.poll() is None, (tmp_path / "webhook.log").read_text()
                assert time.monotonic() < deadline, "webhook in the image never became ready"
                time.sleep(0.3)
            review = make_review(make_pod(gpu_container(milli="300")), uid="image-smoke")
            answer = http.post(url + "/mutate", json=review)
        assert answer.status_code == 200
        response = answer.json()["response"]
        assert response["uid"] == "image-smoke" and response["allowed"] is True
        assert json.loads(base64.b64decode(response["patch"]))  # the pod is rewritten
        state = json.loads(subprocess.run(["runc", "state", name], capture_output=True, text=True).stdout)
        status = Path(f"/proc/{state['pid']}/status").read_text()
        assert f"Uid:\t{IMAGE_USER}\t" in status  # the server itself runs as the image's user
    finally:
        subprocess.run(["runc", "kill", name, "KILL"], capture_output=True)
        proc.wait(timeout=30)
        subprocess.run(["runc", "delete", "--force", name], capture_output=True)
        log.close()
