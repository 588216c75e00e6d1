"""``gpupack demo``: the whole system on a local control plane with simulated GPU nodes."""
