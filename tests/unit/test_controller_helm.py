"""The Helm chart: generated from the plain manifests without drift, values all declared."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "manifests" / "helm" / "gpupack"


def _generator() -> Any:
    spec = importlib.util.spec_from_file_location("helm_generate", ROOT / "manifests" / "helm" / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_chart_matches_the_manifests_it_is_generated_from() -> None:
    rendered = _generator().render()
    committed = {str(p.relative_to(CHART)): p.read_text() for p in CHART.rglob("*.yaml")
                 if p.parent.name in ("templates", "crds")}
    assert set(rendered) == set(committed), "run python manifests/helm/generate.py"
    for name, text in rendered.items():
        assert committed[name] == text, f"{name} drifted from manifests/; run python manifests/helm/generate.py"


def test_every_value_a_template_uses_is_declared() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    used = set()
    for path in (CHART / "templates").glob("*.yaml"):
        used |= set(re.findall(r"\.Values\.([A-Za-z0-9_.]+)", path.read_text()))
    assert used
    for dotted in sorted(used):
        node: Any = values
        for part in dotted.split("."):
            assert isinstance(node, dict) and part in node, f".Values.{dotted} is not in values.yaml"
            node = node[part]


def test_helm_template_renders_the_same_objects_as_kustomize() -> None:
    """Runs ``helm template`` where helm is installed (PATH or $GPUPACK_HELM); the checks above always run."""
    helm = os.environ.get("GPUPACK_HELM") or shutil.which("helm")
    from tests.e2e.test_controller_install_e2e import render

    expected = sorted((o["kind"], o["metadata"]["name"]) for o in render(ROOT / "manifests")
                      if o["kind"] != "CustomResourceDefinition")
    if helm is None:
        templates = "\n".join(p.read_text() for p in (CHART / "templates").glob("*.yaml"))
        templates = templates.replace("{{ .Values.namespace }}", "gpupack-system")
        for kind, name in expected:  # without helm: every object is at least present in a template
            assert re.search(rf"kind: {kind}\n(.*\n){{0,3}}\s*name: {re.escape(name)}\n", templates), (kind, name)
        return
    out = subprocess.run([helm, "template", "gpupack", str(CHART), "--namespace", "gpupack-system", "--kube-version", "1.37.2"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    objects = [d for d in yaml.safe_load_all(out.stdout) if d]
    assert sorted((o["kind"], o["metadata"]["name"]) for o in objects) == expected
    controller = next(o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == "gpupack-controller")
    env = {e["name"]: e.get("value") for e in controller["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["GPUPACK_CONTROLLER_MIG_MODE_CHANGES"] == "false" and env["GPUPACK_CONTROLLER_BATCH_SECONDS"] == "0.5"
