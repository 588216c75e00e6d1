"""MIG geometry: the GPU model catalog, fit checks, layouts and mig-parted configs.

Pure domain code: imports nothing of gpupack's other packages, no Kubernetes, no NVML.
"""
