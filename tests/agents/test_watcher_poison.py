"""One bad pod never stops the watcher: it is fitted where that loses nothing, else logged,
counted and skipped, and every pod after it is recorded (SQLite and PostgreSQL).

The poison pods are ones Kubernetes accepts (or a broken API proxy could send): a
completion-index label of twenty digits, a 300-character team annotation, a team annotation
with a NUL and an unpaired surrogate, a `status.phase` that is an object, a GPU limit of
10^23. They arrive in the first list and again as watch events between normal pods.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubeapi import FakeApiServer, wait_until
from kubeobjects import T0, pod
from sqlalchemy import select, text
from watchharness import Harness

from auditor.store.schema import pods

S = 1000


@pytest.fixture
def server() -> Iterator[FakeApiServer]:
    with FakeApiServer() as srv:
        yield srv


@pytest.fixture
def h(server: FakeApiServer, db_url: str, tmp_path: Path) -> Harness:
    return Harness(server, db_url, tmp_path)


def running_pod(name: str, uid: str, **kw: Any) -> dict[str, Any]:
    return pod(name, uid=uid, created=T0, bound=T0 + 10 * S, started=T0 + 20 * S, **kw)


def poison(n: int) -> dict[str, dict[str, Any]]:
    """The poison pods of round `n`, by what is wrong with them."""
    huge_index = running_pod(
        f"huge-index-{n}",
        f"uid-huge-index-{n}",
        labels={
            "team": "vision",
            "batch.kubernetes.io/job-name": "sweep",
            "batch.kubernetes.io/job-completion-index": "9" * 20,
        },
    )
    long_team = running_pod(f"long-team-{n}", f"uid-long-team-{n}", labels={})
    long_team["metadata"]["annotations"] = {"team": "t" * 300}
    dirty_team = running_pod(f"dirty-team-{n}", f"uid-dirty-team-{n}", labels={})
    dirty_team["metadata"]["annotations"] = {"team": "nl\x00p\ud800"}
    phase_object = running_pod(f"phase-object-{n}", f"uid-phase-object-{n}")
    phase_object["status"]["phase"] = {"value": "Running"}
    many_gpus = running_pod(f"many-gpus-{n}", f"uid-many-gpus-{n}")
    many_gpus["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "1" + "0" * 23
    return {
        "huge_index": huge_index,
        "long_team": long_team,
        "dirty_team": dirty_team,
        "phase_object": phase_object,
        "many_gpus": many_gpus,
    }


SKIPPED = ("phase_object", "many_gpus")
"""Pods that cannot be read: skipped and counted. The others are fitted and recorded."""


def stored(h: Harness) -> dict[str, dict[str, Any]]:
    with h.engine.connect() as conn:
        rows = conn.execute(select(pods.c.uid, pods.c.team, pods.c.rank, pods.c.annotations))
        return {r.uid: dict(r._mapping) for r in rows}


def test_poison_pods_are_fitted_or_skipped_and_every_other_pod_is_recorded(h: Harness) -> None:
    c = h.cluster
    c.put("pods", running_pod("before", "uid-before"))
    for obj in poison(0).values():
        c.put("pods", obj)
    c.put("pods", running_pod("after", "uid-after"))
    with h.running():
        wait_until(lambda: "uid-after" in stored(h))
        # the same poison again as watch events, between normal pods
        c.put("pods", running_pod("watched-before", "uid-watched-before"))
        for obj in poison(1).values():
            c.put("pods", obj)
        c.put("pods", running_pod("watched-after", "uid-watched-after"))
        wait_until(lambda: "uid-watched-after" in stored(h))
        wait_until(lambda: h.count("skipped_objects") >= 2 * len(SKIPPED))

    rows = stored(h)
    normal = {"uid-before", "uid-after", "uid-watched-before", "uid-watched-after"}
    assert normal <= set(rows)
    for n in (0, 1):
        assert f"uid-phase-object-{n}" not in rows
        assert f"uid-many-gpus-{n}" not in rows
        # recorded, with what could not be stored fitted rather than the pod lost
        assert rows[f"uid-huge-index-{n}"]["rank"] is None
        team = rows[f"uid-long-team-{n}"]["team"]
        assert len(team) == 253
        assert team.startswith("t" * 200)
        assert "…" in team
        assert rows[f"uid-dirty-team-{n}"]["team"] == "nl\ufffdp\ufffd"
    assert h.count("skipped_objects") == 2 * len(SKIPPED)
    assert h.count("errors") == 0, "a poison pod made the loop back off"
    assert h.count("relists") == 1


def test_a_row_the_database_refuses_is_skipped_not_retried_forever(h: Harness) -> None:
    """A limit no check foresaw (here a trigger refusing one name): the batch is written again
    one pod at a time, the refused pod skipped and counted, the cursor moves on."""
    if h.engine.dialect.name == "sqlite":
        ddl = [
            "CREATE TRIGGER refuse BEFORE INSERT ON pods WHEN NEW.name = 'refused' "
            "BEGIN SELECT RAISE(ABORT, 'refused by policy'); END"
        ]
    else:
        ddl = [
            "CREATE FUNCTION refuse() RETURNS trigger AS $$ BEGIN "
            "IF NEW.name = 'refused' THEN RAISE EXCEPTION 'refused by policy' "
            "USING ERRCODE = 'check_violation'; END IF; RETURN NEW; END $$ LANGUAGE plpgsql",
            "CREATE TRIGGER refuse BEFORE INSERT ON pods FOR EACH ROW EXECUTE FUNCTION refuse()",
        ]
    with h.engine.begin() as conn:
        for statement in ddl:
            conn.execute(text(statement))
    c = h.cluster
    c.put("pods", running_pod("a", "uid-a"))
    c.put("pods", running_pod("refused", "uid-refused"))
    c.put("pods", running_pod("b", "uid-b"))
    with h.running():
        wait_until(lambda: "uid-b" in stored(h))
        c.put("pods", running_pod("refused", "uid-refused-2"))
        c.put("pods", running_pod("c", "uid-c"))
        wait_until(lambda: "uid-c" in stored(h))

    assert set(stored(h)) == {"uid-a", "uid-b", "uid-c"}
    assert h.count("skipped_objects") == 2
    assert h.count("errors") == 0
