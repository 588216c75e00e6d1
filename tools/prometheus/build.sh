#!/usr/bin/env bash
# Build the Prometheus server the e2e test of the recommender's Prometheus source
# scrapes the node agent with, from github.com/prometheus/prometheus, pinned in go.mod,
# without its service-discovery plugins (tool.env).
# Usage: tools/prometheus/build.sh [--print-path]   (tools/go-tool.sh says the rest)
exec "$(dirname "${BASH_SOURCE[0]}")/../go-tool.sh" prometheus "$@"
