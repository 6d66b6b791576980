"""A store driven through the real CLI: the nvidia-smi CSV and the kubectl pod that import
tests start from, and the row counts they compare (shared by several test groups)."""

from __future__ import annotations

from typer.testing import CliRunner

from auditor.cli import app
from auditor.store import reads
from auditor.store.connection import make_engine

runner = CliRunner()

GOOD_CSV = (
    "timestamp, index, uuid, name, utilization.gpu [%], memory.used [MiB], memory.total [MiB]\n"
    "2026/11/23 08:00:00.000, 0, GPU-aaaa, NVIDIA H100 80GB HBM3, 87 %, 61234 MiB, 81559 MiB\n"
    "2026/11/23 08:00:00.000, 1, GPU-bbbb, NVIDIA H100 80GB HBM3, 0 %, 3 MiB, 81559 MiB\n"
    "2026/11/23 08:00:05.000, 0, GPU-aaaa, NVIDIA H100 80GB HBM3, 91 %, 61234 MiB, 81559 MiB\n"
    "2026/11/23 08:00:05.000, 1, GPU-bbbb, NVIDIA H100 80GB HBM3, [N/A], 3 MiB, 81559 MiB\n"
)
LATER = "2026/11/23 08:00:10.000, 0, GPU-aaaa, NVIDIA H100 80GB HBM3, 50 %, 1 MiB, 81559 MiB\n"


def pod(uid: str, *, gpus: int = 1, kind: str = "Pod") -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": kind,
        "metadata": {
            "name": f"p-{uid}",
            "namespace": "ml",
            "uid": uid,
            "creationTimestamp": "2026-11-23T07:59:00Z",
            "labels": {"team": "nlp"},
        },
        "spec": {
            "nodeName": "node-a",
            "containers": [
                {
                    "name": "main",
                    "image": "pytorch:2",
                    "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                }
            ],
        },
        "status": {
            "phase": "Running",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "True",
                    "lastTransitionTime": "2026-11-23T07:59:30Z",
                }
            ],
            "containerStatuses": [
                {
                    "name": "main",
                    "ready": True,
                    "restartCount": 0,
                    "state": {"running": {"startedAt": "2026-11-23T07:59:40Z"}},
                }
            ],
        },
    }


def invoke(db: str, *args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["--db", db, *args])
    return result.exit_code, result.output


def counts(db: str) -> dict[str, int]:
    engine = make_engine(db)
    with engine.connect() as conn:
        out = reads.count_rows(conn)
    engine.dispose()
    return out
