#!/usr/bin/env bash
# Build the helm binary gpupack's chart tests run (lint, template, install, upgrade,
# uninstall against the real control plane) from helm.sh/helm/v3, pinned in go.mod.
# Usage: tools/helm/build.sh [--print-path]   (tools/go-tool.sh says the rest)
exec "$(dirname "${BASH_SOURCE[0]}")/../go-tool.sh" helm "$@"
