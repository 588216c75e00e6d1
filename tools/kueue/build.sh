#!/usr/bin/env bash
# Build the Kueue manager (sigs.k8s.io/kueue/cmd/kueue, pinned in go.mod) that
# `gpupack dev cluster up --kueue` runs out of cluster against the local control plane,
# and copy the module's CRDs and webhook manifests (config/components/crd/bases,
# config/components/webhook/manifests.yaml) beside the binary, so the dev cluster reads
# the very manifests of the version it runs.
# Usage: tools/kueue/build.sh [--print-path]   (tools/go-tool.sh says the rest)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [[ "${1:-}" == "--print-path" ]]; then
    exec "${here}/../go-tool.sh" kueue --print-path
fi
bin="$("${here}/../go-tool.sh" kueue)"
dir="$(dirname "${bin}")"
if [[ ! -f "${dir}/config/webhook/manifests.yaml" ]]; then
    version="$(basename "${dir}")"
    # The module is in the module cache after the build; `go mod download -json` names its directory.
    src="$(cd "${here}" && GOFLAGS=-mod=readonly go mod download -json "sigs.k8s.io/kueue@${version}" \
        | awk -F'"' '$2 == "Dir" {print $4}')"
    [[ -d "${src}/config/components/crd/bases" ]] || {
        echo "tools/kueue/build.sh: no config/components/crd/bases in the module at '${src}'" >&2; exit 4; }
    tmp="$(mktemp -d "${dir}/.config.XXXXXX")"
    mkdir -p "${tmp}/crd" "${tmp}/webhook"
    cp "${src}"/config/components/crd/bases/*.yaml "${tmp}/crd/"
    cp "${src}/config/components/webhook/manifests.yaml" "${tmp}/webhook/"
    chmod -R u+w,go+rX "${tmp}"  # mktemp made it 0700
    rm -rf "${dir}/config" && mv "${tmp}" "${dir}/config"
fi
echo "${bin}"
