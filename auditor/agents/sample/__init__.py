"""The node sampler: NVML (`nvml.py` alone imports `pynvml`), the kubelet's pod-resources,
the on-disk buffer that rides out a store outage, and the sampler's metrics."""
