"""Node agent: NVML backends (real and simulated), node snapshot publisher, MIG reconciler."""
