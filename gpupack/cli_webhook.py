"""``gpupack webhook``: run the admission webhook, or ask it about one pod offline.

* ``gpupack webhook serve --tls-cert FILE --tls-key FILE [--host H] [--port N]
  [--inventory FILE] [--no-scheduler-extender]`` serves ``/mutate``, ``/validate``,
  ``/scheduler/prioritize``, ``/healthz``, ``/readyz`` and ``/metrics`` over HTTPS.
* ``gpupack webhook decide --inventory FILE POD.yaml [--namespace NS]`` prints
  what the webhook would do to a pod (the patched pod, or the denial), with no
  server: exit 0 if admitted, 1 if denied, 2 on bad input.
* ``gpupack webhook certs --service NAME --namespace NS --out DIR`` writes a
  self-signed CA and serving certificate for clusters without cert-manager.
"""

from __future__ import annotations

import argparse
import base64
import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

from gpupack.cli import EXIT_NO, EXIT_OK, UsageError, describe_input_error
from kube.inputfile import read_bytes, read_stream, read_text

MAX_CERT_DAYS = 3650
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("webhook", help="admission webhook: serve, decide, certs")
    sub = parser.add_subparsers(dest="webhook_command", metavar="SUBCOMMAND", parser_class=type(parser))

    serve = sub.add_parser("serve", help="serve the admission webhook over HTTPS")
    serve.add_argument("--tls-cert", help="PEM certificate (chain) file; env GPUPACK_WEBHOOK_TLS_CERT")
    serve.add_argument("--tls-key", help="PEM private key file; env GPUPACK_WEBHOOK_TLS_KEY")
    serve.add_argument("--host", help="listen address (default 0.0.0.0)")
    serve.add_argument("--port", type=int, help="listen port (default 8443)")
    serve.add_argument("--inventory", help="YAML/JSON list of GPUNode objects to serve instead of watching the API (a regular file of at most 16 MiB; GPUPACK_MAX_INPUT_BYTES raises that)")
    serve.add_argument("--kubeconfig", help="kubeconfig when not running in a cluster")
    serve.add_argument("--max-body-bytes", type=int, help="largest AdmissionReview accepted (default 3 MiB)")
    serve.add_argument("--log-level", choices=["critical", "error", "warning", "info", "debug"])
    serve.add_argument(
        "--placement", choices=["engine", "scheduler"],
        help="engine (default): every gpupack pod is gated and the controller's packing engine chooses its node; "
        "scheduler: pods whose capacity exists go straight to kube-scheduler; env GPUPACK_WEBHOOK_PLACEMENT",
    )
    serve.add_argument(
        "--scheduler-extender", action=argparse.BooleanOptionalAction, default=None,
        help="serve kube-scheduler's prioritize extender at POST /scheduler/prioritize (default on): watch every "
        "pod and prefer, for the pods kube-scheduler places, the nodes holding no GPU pod of lower priority; "
        "--no-scheduler-extender: no pod watch, route not served; env GPUPACK_WEBHOOK_SCHEDULER_EXTENDER",
    )
    serve.set_defaults(handler=_serve)

    decide = sub.add_parser("decide", help="show what the webhook would do to a pod (offline)")
    decide.add_argument("pod", help="pod manifest (YAML or JSON); '-' reads standard input; at most 16 MiB, GPUPACK_MAX_INPUT_BYTES")
    decide.add_argument("--inventory", required=True, help="YAML/JSON list of GPUNode (and SharingPolicy) objects (a regular file of at most 16 MiB; GPUPACK_MAX_INPUT_BYTES raises that)")
    decide.add_argument("--namespace", default="default", help="namespace the pod is created in")
    decide.set_defaults(handler=_decide)

    certs = sub.add_parser("certs", help="write a self-signed CA and serving certificate (no cert-manager)")
    certs.add_argument("--service", default="gpupack-webhook", help="Service name (default gpupack-webhook)")
    certs.add_argument("--namespace", default="gpupack-system", help="Service namespace")
    certs.add_argument("--host", action="append", default=[], help="extra DNS name or IP (repeatable)")
    certs.add_argument("--days", type=int, default=365, help="validity in days (default 365)")
    certs.add_argument("--out", required=True, help="directory for ca.crt, tls.crt, tls.key")
    certs.set_defaults(handler=_certs)


def _serve(args: argparse.Namespace) -> int:
    from gpupack.devcluster.errors import PortInUse
    from gpupack.devcluster.process import check_port_free
    from kube.client import KubeConfigError
    from webhook.inventory_source import InventoryError
    from webhook.server import serve
    from webhook.settings import WebhookSettings
    from webhook.tls import TLSConfigError

    try:
        settings = WebhookSettings.from_env(
            tls_cert=args.tls_cert,
            tls_key=args.tls_key,
            host=args.host,
            port=args.port,
            inventory_file=args.inventory,
            max_body_bytes=args.max_body_bytes,
            log_level=args.log_level,
            placement=args.placement,
            scheduler_extender=args.scheduler_extender,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if not settings.tls_cert or not settings.tls_key:
        raise UsageError("--tls-cert and --tls-key are required (the API server only calls webhooks over HTTPS)")
    for name, path in (("--tls-cert", settings.tls_cert), ("--tls-key", settings.tls_key)):
        try:  # OpenSSL would wait on a FIFO and read /dev/zero without end: bounded and regular first
            read_bytes(path)
        except OSError as exc:
            raise UsageError(f"{name} {describe_input_error(exc)}") from None
    try:  # now, with one line: uvicorn would log an error and exit 3
        check_port_free(settings.port, "gpupack webhook", settings.host)
    except PortInUse as exc:
        raise UsageError(f"{exc.cause}; choose another with --port") from None
    except OSError as exc:
        raise UsageError(f"cannot listen on {settings.host}:{settings.port}: {exc.strerror or exc}") from None
    try:
        return serve(settings, kubeconfig=args.kubeconfig)
    except (TLSConfigError, InventoryError, KubeConfigError) as exc:
        raise UsageError(str(exc)) from None


def _decide(args: argparse.Namespace) -> int:
    from sharing.admission.patch import apply_patch
    from webhook.admission import review_pod
    from webhook.inventory_source import InventoryError, InventoryHolder, load_file
    from webhook.settings import WebhookSettings

    holder = InventoryHolder()
    try:
        inventory = load_file(holder, args.inventory)
        text = (read_stream(sys.stdin.buffer, "<stdin>", syntax="yaml") if args.pod == "-"
                else read_text(args.pod, syntax="yaml"))
        pod = yaml.safe_load(text)
    except (InventoryError, OSError, yaml.YAMLError) as exc:
        raise UsageError(str(exc)) from None
    if not isinstance(pod, dict) or pod.get("kind", "Pod") != "Pod":
        raise UsageError(f"{args.pod}: expected a Pod manifest")
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "gpupack-cli",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": args.namespace,
            "operation": "CREATE",
            "object": pod,
        },
    }
    response = review_pod(review, inventory, WebhookSettings()).review["response"]
    if not response["allowed"]:
        print(f"denied: {response['status']['message']}", file=sys.stderr)
        return EXIT_NO
    print(f"# {response.get('status', {}).get('message', 'allowed')}")
    for warning in response.get("warnings", []):
        print(f"# warning: {warning}")
    if "patch" in response:
        pod = apply_patch(pod, json.loads(base64.b64decode(response["patch"])))
    print(yaml.safe_dump(pod, sort_keys=False), end="")
    return EXIT_OK


def _certs(args: argparse.Namespace) -> int:
    from webhook.certs import write_self_signed

    if not 1 <= args.days <= MAX_CERT_DAYS:
        raise UsageError(f"--days {args.days} must be 1..{MAX_CERT_DAYS} (a self-signed certificate "
                         "for the webhook is rotated, not kept for ever)")
    for flag, value in (("--service", args.service), ("--namespace", args.namespace)):
        if not DNS_LABEL.fullmatch(value):
            raise UsageError(f"{flag} {value!r} is not a Kubernetes name (lower-case letters, digits and '-', "
                             "at most 63, starting and ending with a letter or digit)")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {args.out}: exists and is not a directory")
    paths = write_self_signed(Path(args.out), args.service, args.namespace, args.host, args.days)
    for path in paths:
        print(path)
    return EXIT_OK
