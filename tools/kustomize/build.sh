#!/usr/bin/env bash
# Build the kustomize binary gpupack's manifest tests run (every kustomization
# renders; the Helm chart matches it) from sigs.k8s.io/kustomize/kustomize/v5, pinned in go.mod.
# Usage: tools/kustomize/build.sh [--print-path]   (tools/go-tool.sh says the rest)
exec "$(dirname "${BASH_SOURCE[0]}")/../go-tool.sh" kustomize "$@"
