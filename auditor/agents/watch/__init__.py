"""The pod watcher: list/watch loops over the Kubernetes API (`kube.py` alone imports
`kubernetes`), and its metrics and health check."""
