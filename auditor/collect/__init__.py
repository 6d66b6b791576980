"""The one-shot readers: nvidia-smi CSV, kubectl JSON and YAML, Prometheus, and the pod and
node objects they carry, into domain records. No store here: the jobs write what they read."""
