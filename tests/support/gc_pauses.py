"""Short cyclic-GC pauses in the test process: survivors frozen after collection and after each module.

A full (generation 2) collection scans every object the collector tracks. In one ``make test`` process
that is every imported module, hypothesis' and the tests' own objects, growing over ~5,000 tests: after
collection alone ~333,000 objects, ~0.45 s per full collection on the loaded 2-core machine (session 30,
flake30). Such a pause stops the event loop of the test that is running; its timers are due at once
when it ends, so a wall-clock bound of a few hundred milliseconds (a read deadline, an upstream
timeout, a decision deadline) can fire although the work itself was quick: a flake, not a finding.

As ``prefixgate serve`` does after start-up (:func:`gateway.server.freeze_startup_objects`), the
survivors are moved out of the collector's scans (``gc.freeze()``) after a ``gc.collect()``: once when
collection finishes and again after the teardown of each test module's last test, so a full
collection scans only what was allocated since. Garbage is collected before each freeze; an object
frozen while alive and dropped later is not collected (bounded by what lives at a module boundary).
Imported by ``tests/conftest.py``; the hooks change no test's assertion.
"""
from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

__all__ = ["pytest_collection_finish", "pytest_runtest_teardown"]


def _collect_and_freeze() -> None:
    gc.collect()
    gc.freeze()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Freeze the objects alive once the suite is collected (modules, test functions, fixtures' code)."""
    _collect_and_freeze()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """After the last test of a module is torn down (its module-scoped fixtures too), freeze what lives."""
    yield
    if nextitem is None or getattr(nextitem, "module", None) is not getattr(item, "module", None):
        _collect_and_freeze()
