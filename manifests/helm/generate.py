"""Generate the Helm chart's templates from the plain manifests in ``manifests/``.

The kustomize install (``manifests/kustomization.yaml``) is the source of
truth; the chart is the same objects with a few values templated (namespace,
image, replicas, component switches, resources, controller and agent settings,
cert-manager on/off). Optional parts that the kustomize install leaves out are
in the chart behind values that are off by default: the GPU-health alert rules
(``manifests/prometheus-rules``, ``prometheusRules.enabled``), which need the
Prometheus Operator's CRD, and the controller's evictions from failed GPUs (the
component ``manifests/gpu-fault-evictions``, ``controller.evictOnGpuFault``: its
RBAC, and the setting the component patches into the controller's Deployment),
right-sizing's ``Recreate`` grant (the component ``manifests/right-sizing-recreate``,
``controller.rightSizingRecreate``: its RBAC and its policy on Deployment writes),
and the DRA node pool (the component ``manifests/agent-dra``, ``dra.enabled``:
the DRA agent and kubelet plugin DaemonSet and the plugin's RBAC; the node
agent's admission policies and policy RBAC render when either agent does). The
DeviceClasses (``manifests/dra``) are in the default install, as in kustomize,
rendered only where the cluster serves ``resource.k8s.io/v1`` (the chart allows
Kubernetes below 1.34). Generating instead of hand-copying keeps the two from
drifting: ``tests/unit/test_controller_helm.py`` regenerates into a temporary
directory and fails when the committed chart differs.

    python manifests/helm/generate.py            # rewrite manifests/helm/gpupack/{templates,crds}
    python manifests/helm/generate.py --out DIR  # write elsewhere (the drift test)
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
CHART = Path(__file__).resolve().parent / "gpupack"
IMAGE = "ghcr.io/gpupack/gpupack:0.1.0"
HEADER = "# Generated from manifests/ by manifests/helm/generate.py; edit those, then regenerate.\n"
NS = "{{ .Values.namespace }}"


def _load(path: str) -> str:
    return (ROOT / path).read_text(encoding="utf-8")


def _template(text: str, component: str | None = None, extra: dict[str, str] | None = None) -> str:
    text = text.replace("namespace: gpupack-system", f"namespace: {NS}")
    text = text.replace("gpupack-system/gpupack-webhook", f"{NS}/gpupack-webhook")
    text = text.replace("values: [kube-system, gpupack-system]", f"values: [kube-system, {NS}]")
    text = text.replace("gpupack-webhook.gpupack-system.svc", f"gpupack-webhook.{NS}.svc")
    text = text.replace("system:serviceaccount:gpupack-system:", f"system:serviceaccount:{NS}:")
    text = text.replace(
        f"image: {IMAGE}",
        'image: "{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}"\n'
        "          imagePullPolicy: {{ .Values.image.pullPolicy }}",
    )
    for old, new in (extra or {}).items():
        if old not in text:
            raise SystemExit(f"generate.py: expected text not found (manifest changed?): {old!r}")
        text = text.replace(old, new)
    if not text.endswith("\n"):
        text += "\n"
    if component:
        text = _when(f".Values.{component}.enabled", text)
    return text


def _when(condition: str, text: str) -> str:
    """``text`` rendered only if the Go template ``condition`` holds."""
    return "{{- if %s }}\n%s{{- end }}\n" % (condition, text)


def _helm_literal(text: str) -> str:
    """``text`` with every ``{{ ... }}`` (Prometheus's alert templates) made a Go raw string, so Helm
    writes it out unchanged instead of evaluating it."""
    def literal(match: re.Match[str]) -> str:
        if "`" in match.group(1):
            raise SystemExit(f"generate.py: a backtick cannot be kept in a Helm raw string: {match.group(0)!r}")
        return "{{`{{" + match.group(1) + "}}`}}"

    return re.sub(r"\{\{(.*?)\}\}", literal, text)


def _quoted(env: str, value: str) -> str:
    return f"            - {{name: {env}, value: {{{{ {value} | quote }}}}}}\n"


def _extras() -> dict[str, dict[str, str]]:
    """Per source file: literal text -> templated text (the generator fails if the text is gone)."""
    return {
        "webhook/deployment.yaml": {
            "  replicas: 2\n": "  replicas: {{ .Values.webhook.replicas }}\n",
            "            - {name: GPUPACK_WEBHOOK_PLACEMENT, value: engine}\n":
                _quoted("GPUPACK_WEBHOOK_PLACEMENT", ".Values.webhook.placement"),
            "            requests: {cpu: 100m, memory: 128Mi}\n            limits: {memory: 512Mi}\n":
                "            {{- toYaml .Values.webhook.resources | nindent 12 }}\n",
        },
        "webhook/networkpolicy.yaml": {
            "        - ipBlock: {cidr: 0.0.0.0/0}\n      ports:\n        - {protocol: TCP, port: 8443}\n":
                "        - ipBlock: {cidr: {{ .Values.webhook.apiServerCIDR | quote }}}\n"
                "      ports:\n        - {protocol: TCP, port: 8443}\n",
            "        - ipBlock: {cidr: 0.0.0.0/0}\n      ports:\n        - {protocol: TCP, port: 443}\n":
                "        - ipBlock: {cidr: {{ .Values.webhook.apiServerCIDR | quote }}}\n"
                "      ports:\n        - {protocol: TCP, port: 443}\n",
        },
        "webhook/mutating.yaml": {
            "    failurePolicy: Fail\n": "    failurePolicy: {{ .Values.webhook.failurePolicy }}\n",
        },
        "controller/deployment.yaml": {
            "  replicas: 2\n": "  replicas: {{ .Values.controller.replicas }}\n",
            '            - {name: GPUPACK_CONTROLLER_BATCH_SECONDS, value: "0.5"}\n':
                _quoted("GPUPACK_CONTROLLER_BATCH_SECONDS", ".Values.controller.batchSeconds"),
            '            - {name: GPUPACK_CONTROLLER_RESYNC_SECONDS, value: "10"}\n':
                _quoted("GPUPACK_CONTROLLER_RESYNC_SECONDS", ".Values.controller.resyncSeconds"),
            '            - {name: GPUPACK_CONTROLLER_LEASE_SECONDS, value: "15"}\n':
                _quoted("GPUPACK_CONTROLLER_LEASE_SECONDS", ".Values.controller.leaseSeconds")
                + _quoted("GPUPACK_CONTROLLER_LEASE_NAMESPACE", ".Values.namespace")
                + _quoted("GPUPACK_CONTROLLER_POLICY", ".Values.controller.policy"),
            '            - {name: GPUPACK_CONTROLLER_MIG_MODE_CHANGES, value: "false"}\n':
                _quoted("GPUPACK_CONTROLLER_MIG_MODE_CHANGES", ".Values.controller.migModeChanges"),
            # What manifests/gpu-fault-evictions patches, as a value (which also renders its RBAC).
            "            # Evicting the pods of a failed GPU needs RBAC the default install does not\n"
            "            # grant: the component manifests/gpu-fault-evictions sets this and grants it.\n"
            '            - {name: GPUPACK_CONTROLLER_EVICT_ON_GPU_FAULT, value: "false"}\n':
                "            # Evicting the pods of a failed GPU: controller.evictOnGpuFault, which also\n"
                "            # renders the RBAC it needs (gpu-fault-evictions-rbac.yaml).\n"
                + _quoted("GPUPACK_CONTROLLER_EVICT_ON_GPU_FAULT", ".Values.controller.evictOnGpuFault"),
            "            requests: {cpu: 100m, memory: 256Mi}\n            limits: {memory: 1Gi}\n":
                "            {{- toYaml .Values.controller.resources | nindent 12 }}\n",
        },
        "agent/daemonset.yaml": {
            "            - {name: GPUPACK_AGENT_MODE, value: direct}\n":
                "            - {name: GPUPACK_AGENT_MODE, value: {{ .Values.agent.mode }}}\n",
            '            - {name: GPUPACK_AGENT_IDLE_SECONDS, value: "300"}\n':
                _quoted("GPUPACK_AGENT_IDLE_SECONDS", ".Values.agent.idleSeconds"),
            "            - {name: GPUPACK_AGENT_DEVICE_PLUGIN_NAMESPACE, value: gpu-operator}\n":
                "            - {name: GPUPACK_AGENT_DEVICE_PLUGIN_NAMESPACE, value: {{ .Values.gpuOperatorNamespace }}}\n",
            "            - {name: GPUPACK_AGENT_UNHEALTHY_TAINT_EFFECT, value: NoSchedule}\n":
                _quoted("GPUPACK_AGENT_UNHEALTHY_TAINT_EFFECT", ".Values.agent.unhealthyTaintEffect"),
            "            requests: {cpu: 20m, memory: 96Mi}\n            limits: {memory: 256Mi}\n":
                "            {{- toYaml .Values.agent.resources | nindent 12 }}\n",
        },
        # The DRA pool's agent shares the device-plugin agent's settings; each container has its resources.
        "agent-dra/daemonset.yaml": {
            '            - {name: GPUPACK_AGENT_IDLE_SECONDS, value: "300"}\n':
                _quoted("GPUPACK_AGENT_IDLE_SECONDS", ".Values.agent.idleSeconds"),
            "            - {name: GPUPACK_AGENT_UNHEALTHY_TAINT_EFFECT, value: NoSchedule}\n":
                _quoted("GPUPACK_AGENT_UNHEALTHY_TAINT_EFFECT", ".Values.agent.unhealthyTaintEffect"),
            "            - {name: GPUPACK_DRA_SHARE_MODE, value: mps}\n":
                _quoted("GPUPACK_DRA_SHARE_MODE", ".Values.dra.shareMode"),
            "            requests: {cpu: 20m, memory: 96Mi}\n            limits: {memory: 256Mi}\n"
            "          volumeMounts:\n            - {name: pod-resources,":
                "            {{- toYaml .Values.dra.agent.resources | nindent 12 }}\n"
                "          volumeMounts:\n            - {name: pod-resources,",
            "            requests: {cpu: 20m, memory: 96Mi}\n            limits: {memory: 256Mi}\n"
            "          volumeMounts:\n            - {name: plugins-registry,":
                "            {{- toYaml .Values.dra.plugin.resources | nindent 12 }}\n"
                "          volumeMounts:\n            - {name: plugins-registry,",
        },
    }


def render() -> dict[str, str]:
    files: dict[str, str] = {}
    files["templates/namespace.yaml"] = (
        "{{- if .Values.createNamespace }}\n"
        + _template(_load("namespace/namespace.yaml")).replace("name: gpupack-system", f"name: {NS}")
        + "{{- end }}\n"
    )
    for entry in yaml.safe_load(_load("rbac/kustomization.yaml"))["resources"]:
        text = _template(_load(f"rbac/{entry}"))
        if entry == "node-agent-pods.yaml":  # manifests/hardened's choice, as a value
            text = "{{- if not .Values.agent.podReadsByAuthorizer }}\n" + text + "{{- end }}\n"
        files[f"templates/rbac-{Path(entry).stem}.yaml"] = text
    extras = _extras()
    for component, directory in (("webhook", "webhook"), ("controller", "controller"), ("agent", "agent")):
        kustomization = yaml.safe_load(_load(f"{directory}/kustomization.yaml"))
        for entry in kustomization["resources"]:
            source = f"{directory}/{entry}"
            text = _load(source)
            if source == "agent/rbac-gpu-operator.yaml":
                text = text.replace("namespace: gpu-operator", "namespace: {{ .Values.gpuOperatorNamespace }}")
            target = f"templates/{component}-{Path(entry).stem}.yaml"
            if source == "webhook/certificate.yaml":
                files[target] = (
                    "{{- if and .Values.webhook.enabled .Values.webhook.certManager }}\n"
                    + _template(text) + "{{- end }}\n"
                )
            elif component == "agent" and entry != "daemonset.yaml":
                # The own-node admission policies and the agent's RBAC hold for the DRA pool's agent
                # too (the same ServiceAccount): a DRA-only install keeps them.
                files[target] = _when("or .Values.agent.enabled .Values.dra.enabled",
                                      _template(text, None, extras.get(source)))
            else:
                files[target] = _template(text, component, extras.get(source))
    # gpupack's DeviceClasses: in the default install (manifests/kustomization.yaml lists manifests/dra),
    # where the API server serves them (resource.k8s.io/v1: Kubernetes 1.34 and later).
    for entry in yaml.safe_load(_load("dra/kustomization.yaml"))["resources"]:
        files[f"templates/dra-{Path(entry).stem}.yaml"] = _when(
            '.Capabilities.APIVersions.Has "resource.k8s.io/v1"', _template(_load(f"dra/{entry}")))
    # The DRA node pool: off by default, as in kustomize (manifests/agent-dra is opt-in).
    for entry in yaml.safe_load(_load("agent-dra/kustomization.yaml"))["resources"]:
        source = f"agent-dra/{entry}"
        files[f"templates/agent-dra-{Path(entry).stem}.yaml"] = _template(_load(source), "dra", extras.get(source))
    # Optional, off by default as in kustomize (manifests/kustomization.yaml does not list them).
    # The component's Deployment patch is the env entry templated in _extras().
    for entry in yaml.safe_load(_load("gpu-fault-evictions/kustomization.yaml"))["resources"]:
        files[f"templates/gpu-fault-evictions-{Path(entry).stem}.yaml"] = (
            "{{- if and .Values.controller.enabled .Values.controller.evictOnGpuFault }}\n"
            + _template(_load(f"gpu-fault-evictions/{entry}")) + "{{- end }}\n"
        )
    # Right-sizing's Recreate grant (evictions; Deployment patches confined to one annotation): off
    # by default, as in kustomize; no setting to patch, the namespaces' modes are the switch.
    for entry in yaml.safe_load(_load("right-sizing-recreate/kustomization.yaml"))["resources"]:
        files[f"templates/right-sizing-recreate-{Path(entry).stem}.yaml"] = (
            "{{- if and .Values.controller.enabled .Values.controller.rightSizingRecreate }}\n"
            + _template(_load(f"right-sizing-recreate/{entry}")) + "{{- end }}\n"
        )
    files["templates/prometheus-rules.yaml"] = _template(
        _helm_literal(_load("prometheus-rules/gpu-health-rules.yaml")), "prometheusRules",
        {"    app.kubernetes.io/component: alert-rules\n":
            "    app.kubernetes.io/component: alert-rules\n"
            "    {{- with .Values.prometheusRules.labels }}\n    {{- toYaml . | nindent 4 }}\n    {{- end }}\n"})
    out = {k: HEADER + v for k, v in files.items()}
    # CRDs go to crds/: Helm installs them once and never deletes them, so an
    # uninstall keeps every GPUNode, SharingPolicy and GPURecommendation (and the GPUs' layouts).
    # The list is the kustomization's, so a new CRD reaches both installs.
    for crd in yaml.safe_load(_load("crds/kustomization.yaml"))["resources"]:
        out[f"crds/{crd}"] = _load(f"crds/{crd}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=CHART)
    args = parser.parse_args(argv)
    for name, text in render().items():
        path = args.out / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
