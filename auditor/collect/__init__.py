"""The edges: readers of outside sources (files, NVML, the Kubernetes API) into domain records."""
