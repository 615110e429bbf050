"""CPU the loop thread spends in CPython's cyclic garbage collector (review F16-1).

:class:`gateway.cpu_budget.CpuMeter` charges a tenant the thread CPU of its request's
preparation span. A collection of the older generations (``gc`` generations 1 and 2: 0.2-8 ms
and 60-150 ms measured on the 2-core CI machine, session 16) runs in whichever span allocates
the object that crosses a threshold, so it charged a tenant for garbage that every tenant's
requests made: a tenant with a small budget could be put into debt (429
``cpu_budget_exhausted``) by a collection that another tenant's traffic caused. The meter
subtracts the collector's CPU that fell inside a span, read from :data:`GC_TIME`.

Generation-0 collections are left in the span: they are short (tens of µs) and mostly collect
what the request itself just allocated. Only collections on the thread that installed the
clock (the event loop's: the gateway serves on the main thread) are counted: a collection on
the tokenizer thread does not run in the loop thread's CPU time. Source of the callback
protocol: the ``gc.callbacks`` list, Python Library Reference, "gc — Garbage Collector interface".
"""

from __future__ import annotations

import gc
import threading
import time
from typing import Any

__all__ = ["GcTime", "GC_TIME"]


class GcTime:
    """Accumulated thread-CPU seconds (:func:`time.thread_time`) of generation >= 1 collections on
    one thread, in :attr:`total_s` (a float that only grows; read it before and after a span).
    :meth:`install` registers the ``gc.callbacks`` hook once for the calling thread."""

    __slots__ = ("total_s", "_t0", "_thread", "_installed")

    def __init__(self) -> None:
        self.total_s = 0.0
        self._t0: float | None = None
        self._thread: int | None = None
        self._installed = False

    def install(self) -> GcTime:
        """Count the calling thread's collections from now on (idempotent); returns ``self``."""
        if not self._installed:
            self._thread = threading.get_ident()
            gc.callbacks.append(self._on_gc)
            self._installed = True
        return self

    def uninstall(self) -> None:
        """Stop counting (tests; the process's :data:`GC_TIME` stays installed)."""
        if self._installed:
            gc.callbacks.remove(self._on_gc)
            self._installed = False

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if info["generation"] == 0 or threading.get_ident() != self._thread:
            return
        if phase == "start":
            self._t0 = time.thread_time()
        elif self._t0 is not None:
            self.total_s += time.thread_time() - self._t0
            self._t0 = None


#: the process's collector clock (installed by :class:`gateway.cpu_budget.CpuBudget` with real clocks)
GC_TIME = GcTime()
