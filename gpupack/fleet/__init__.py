"""SIMULATION: many simulated nodes' agents in one process (``gpupack agent fleet``), for replays and benchmarks."""
