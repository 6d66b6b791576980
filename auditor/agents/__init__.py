"""The long-running in-cluster services: `watch` (pods and nodes from the Kubernetes API)
and `sample` (NVML and pod-resources on each node), and what they share (`serve`: the
/metrics and /healthz server and the logging setup). They read and hand records to a sink
they are given; they never touch the store themselves."""
