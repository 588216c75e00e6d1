"""Sharing domain: request model, mode choice, cluster model, packing engine, simulator.

Pure domain code: may import ``mig``; no Kubernetes, NVML or HTTP.
"""
