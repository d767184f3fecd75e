"""One call run on a thread of its own while the caller does something else, its value (or its exception) taken
later: what ``KnowledgeLookup`` does with the query encoder's load while Milvus opens.

A plain thread, not a one-worker ``ThreadPoolExecutor``: no work queue, future or pool to shut down for a single
call, and nothing registered to run at the interpreter's exit.

Example:
    >>> loading = OnThread(sum, [1, 2, 3], name="adder")
    >>> loading.result()
    6
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class OnThread(Generic[T]):
    """``function(*args)`` started at once on a new thread; :meth:`result` waits for it."""

    def __init__(self, function: Callable[..., T], *args: Any, name: str) -> None:
        self._function, self._args = function, args
        self._value: T | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._value = self._function(*self._args)
        except BaseException as exc:  # handed to the caller of result(), raised there
            self._error = exc
        finally:
            self._function, self._args = None, ()  # type: ignore[assignment]  # nothing held once done

    def result(self) -> T:
        """The call's value once it has returned; its exception, raised here, if it raised one."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]  # set by _run before the thread ended
