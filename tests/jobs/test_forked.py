"""`Beside`: a function run beside the caller, forked where no other thread runs, else in a
thread; either way its result or its error comes back as a thread would give it."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from auditor.errors import InputError
from auditor.jobs.forked import Beside


def where() -> tuple[int, str]:
    return os.getpid(), threading.current_thread().name


def fails() -> None:
    raise InputError("no such job", field="JOB_OR_POD")


@pytest.fixture
def other_thread() -> Iterator[None]:
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    yield
    stop.set()
    other.join()


# A process of its own, one thread: whatever threads this test session runs, it forks.
ALONE = """
import os, sys
from auditor.errors import AuditorError, InputError
from auditor.jobs.forked import Beside

def fails():
    raise InputError("no such job", field="JOB_OR_POD")

if sys.argv[1] == "where":
    print("forked" if Beside(os.getpid).result() != os.getpid() else "here")
elif sys.argv[1] == "fail":
    try:
        Beside(fails).result()
    except InputError as e:
        print(e)
else:
    try:
        Beside(os._exit, 9).result()  # as the OOM killer ends a process: nothing sent back
    except AuditorError as e:
        print(e)
"""


def alone(what: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", ALONE, what], capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def test_alone_it_runs_in_a_forked_process() -> None:
    assert alone("where") == "forked"


def test_a_forked_childs_error_is_raised_again() -> None:
    assert alone("fail") == "field 'JOB_OR_POD': no such job"


def test_a_child_that_dies_is_an_error_not_a_hang() -> None:
    assert alone("die") == "a reading process died (out of memory?)"


@pytest.mark.usefixtures("other_thread")
def test_beside_another_thread_it_runs_in_a_thread() -> None:
    pid, name = Beside(where).result()
    assert pid == os.getpid()
    assert name != threading.current_thread().name


@pytest.mark.usefixtures("other_thread")
def test_its_error_is_raised_again() -> None:
    with pytest.raises(InputError, match="field 'JOB_OR_POD': no such job"):
        Beside(fails).result()
