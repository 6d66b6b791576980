"""Which pod a host process belongs to, from `/proc/<pid>/cgroup` (SPEC §7 per-tenant activity).

The kubelet puts each pod's containers under a cgroup named after the pod's UID, whatever
the cgroup version and driver:

    cgroup v1, cgroupfs:  12:memory:/kubepods/burstable/pod<uid>/<container id>
    cgroup v1, systemd:   4:cpu,cpuacct:/kubepods.slice/kubepods-burstable.slice/
                          kubepods-burstable-pod<uid with _ for ->.slice/cri-containerd-<id>.scope
    cgroup v2:            0::/kubepods.slice/kubepods-besteffort.slice/
                          kubepods-besteffort-pod<uid with _>.slice/cri-containerd-<id>.scope
    cgroup v2, cgroupfs:  0::/kubepods/pod<uid>/<container id>

A guaranteed pod sits right under `kubepods`. Static pods are named by a 32-hex config hash
instead of a UUID. The sampler reads the host's processes, so it needs the host's PID
namespace (`hostPID: true` in the DaemonSet); the proc root is a parameter, so tests hand
it a fake tree.
"""

from __future__ import annotations

import re
from pathlib import Path

_POD = re.compile(
    r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
    r"|[0-9a-f]{32})(?=[./]|$)"
)
MAX_CGROUP_BYTES = 64 * 1024
"""A cgroup file is a few lines; more is not one, and is not read further."""


def pod_uid_in(cgroup_text: str) -> str | None:
    """The pod UID a `/proc/<pid>/cgroup` text names (dashes restored), or None for a
    process outside any pod (the host's, or a system daemon's)."""
    for line in cgroup_text.splitlines():
        path = line.split(":", 2)[-1]
        if "kubepods" not in path:
            continue
        found = _POD.findall(path)
        if found:
            return str(found[-1]).replace("_", "-")
    return None


class PodsOfProcesses:
    """Maps PIDs to pod UIDs through a proc tree (`/proc` of the host by default)."""

    def __init__(self, proc_root: Path = Path("/proc")) -> None:
        self.proc_root = proc_root

    def pod_of(self, pid: int) -> str | None:
        """The pod UID of a process, or None (no such process any more, not in a pod, or
        its cgroup file unreadable)."""
        try:
            with (self.proc_root / str(pid) / "cgroup").open("rb") as f:
                raw = f.read(MAX_CGROUP_BYTES)
        except OSError:
            return None
        return pod_uid_in(raw.decode("utf-8", errors="replace"))
