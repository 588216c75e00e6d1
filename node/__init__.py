"""Node agent: NVML backends (real and simulated), inventory publisher, MIG reconciler."""
