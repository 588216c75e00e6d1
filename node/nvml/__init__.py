"""NVML backends behind one small interface: the real one (nvidia-ml-py) and a simulation."""
