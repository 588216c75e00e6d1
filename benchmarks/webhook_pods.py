"""Realistic AdmissionReview bodies for the webhook benchmark.

A pod as a Deployment creates it after the API server's defaulting: owner
reference, labels, a projected service-account token volume, probes, env,
tolerations, security context - about 4 KB of JSON, which is what the webhook
parses on every call. Shapes cycle through MIG-, MPS-, time-slicing- and
auto-mode requests, plus some pods without GPU requests (skipped fast).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

SHAPES: list[tuple[str, str | None, str | None]] = [
    ("250", "10Gi", None),
    ("100", None, None),
    ("140", "9Gi", "mig"),
    ("250", "20Gi", "mps"),
    ("250", None, "time-slicing"),
    ("500", "40G", None),
    ("1000", None, "mig"),
    ("", None, None),  # no GPU request
]


def pod(i: int) -> dict[str, Any]:
    milli, memory, mode = SHAPES[i % len(SHAPES)]
    limits: dict[str, str] = {"cpu": "4", "memory": "16Gi"}
    if milli:
        limits["gpupack.io/gpu-milli"] = milli
    if memory:
        limits["gpupack.io/gpu-memory"] = memory
    annotations = {"kubectl.kubernetes.io/restartedAt": "2026-11-30T01:00:00Z", "prometheus.io/scrape": "true"}
    if mode:
        annotations["gpupack.io/sharing"] = mode
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "inference-7d9f8b6c5-",
            "namespace": "ml-serving",
            "labels": {"app": "inference", "pod-template-hash": "7d9f8b6c5", "team": "vision", "tier": "gpu"},
            "annotations": annotations,
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": "inference-7d9f8b6c5",
                    "uid": str(uuid.UUID(int=i)),
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "volumes": [
                {
                    "name": "kube-api-access-x7k2p",
                    "projected": {
                        "sources": [
                            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                            {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
                        ],
                        "defaultMode": 420,
                    },
                },
                {"name": "model-cache", "emptyDir": {"sizeLimit": "20Gi"}},
            ],
            "containers": [
                {
                    "name": "server",
                    "image": "registry.example.com/vision/inference:1.42.0",
                    "args": ["--model", "/models/resnet", "--port", "8000", "--max-batch", "32"],
                    "ports": [{"name": "http", "containerPort": 8000, "protocol": "TCP"}],
                    "env": [
                        {"name": "MODEL_NAME", "value": "resnet152"},
                        {"name": "LOG_LEVEL", "value": "info"},
                        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}},
                    ],
                    "resources": {"limits": limits, "requests": dict(limits)},
                    "volumeMounts": [
                        {"name": "model-cache", "mountPath": "/models"},
                        {"name": "kube-api-access-x7k2p", "readOnly": True, "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"},
                    ],
                    "readinessProbe": {"httpGet": {"path": "/ready", "port": 8000, "scheme": "HTTP"}, "periodSeconds": 5, "timeoutSeconds": 1, "successThreshold": 1, "failureThreshold": 3},
                    "livenessProbe": {"httpGet": {"path": "/live", "port": 8000, "scheme": "HTTP"}, "initialDelaySeconds": 30, "periodSeconds": 10, "timeoutSeconds": 1, "successThreshold": 1, "failureThreshold": 3},
                    "terminationMessagePath": "/dev/termination-log",
                    "terminationMessagePolicy": "File",
                    "imagePullPolicy": "IfNotPresent",
                    "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "runAsNonRoot": True},
                },
                {
                    "name": "metrics-sidecar",
                    "image": "registry.example.com/infra/metrics-agent:0.9.1",
                    "resources": {"limits": {"cpu": "100m", "memory": "128Mi"}, "requests": {"cpu": "50m", "memory": "64Mi"}},
                    "terminationMessagePath": "/dev/termination-log",
                    "terminationMessagePolicy": "File",
                    "imagePullPolicy": "IfNotPresent",
                },
            ],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "inference",
            "serviceAccount": "inference",
            "securityContext": {"fsGroup": 2000},
            "schedulerName": "default-scheduler",
            "tolerations": [
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
            ],
            "priority": 0,
            "enableServiceLinks": True,
            "preemptionPolicy": "PreemptLowerPriority",
        },
        "status": {},
    }


def review(i: int) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.UUID(int=10**6 + i)),
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "ml-serving",
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller", "uid": "d2a3", "groups": ["system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"]},
            "object": pod(i),
            "oldObject": None,
            "dryRun": False,
            "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"},
        },
    }


def bodies(n: int = 64) -> list[bytes]:
    return [json.dumps(review(i)).encode() for i in range(n)]
