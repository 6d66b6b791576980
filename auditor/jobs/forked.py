"""A function run beside this one, in a forked process where that is safe, else in a thread.

Reading rows through a database driver holds Python's interpreter lock for every value it
builds, so two reads in two threads take as long as one after the other. A forked child
runs on another core at the cost of a fork (milliseconds: the imports are shared) and of
pickling what it returns. A fork is safe only while this process runs no other thread (one
holding a lock at the fork would hold it in the child for ever), and only on Linux (macOS's
system libraries may crash in a forked child), so elsewhere the function runs in a thread
instead: slower, the same result.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Generic, TypeVar

from auditor.errors import AuditorError

T = TypeVar("T")


class Beside(Generic[T]):
    """`fn(*args)` running beside the caller; `result()` waits for it, raising what it
    raised."""

    def __init__(self, fn: Callable[..., T], *args: Any) -> None:
        self._child: Any = None
        self._future: Future[T] | None = None
        if sys.platform.startswith("linux") and threading.active_count() == 1:
            import multiprocessing

            context = multiprocessing.get_context("fork")
            self._pipe, sending = context.Pipe(duplex=False)
            self._child = context.Process(target=_run, args=(sending, fn, args), daemon=True)
            self._child.start()
            sending.close()
        else:
            pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="beside")
            self._future = pool.submit(fn, *args)
            pool.shutdown(wait=False)

    def result(self) -> T:
        if self._future is not None:
            return self._future.result()
        try:
            ok, value = self._pipe.recv()
        except EOFError as e:  # the child died before it answered: killed for memory
            raise AuditorError("a reading process died (out of memory?)") from e
        finally:
            self._pipe.close()
            self._child.join()
        if not ok:
            raise value
        return value  # type: ignore[no-any-return]


def _run(sending: Any, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    try:
        answer = (True, fn(*args))
    except BaseException as e:  # raised again in the parent, as it would be in a thread
        answer = (False, e)
    sending.send(answer)
    sending.close()
