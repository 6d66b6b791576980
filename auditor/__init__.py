"""GPU scheduling-waste auditor: where a Kubernetes GPU cluster's GPU-hours go."""

__version__ = "0.1.0"
