"""Embedded OPA decision point (the default PDP).

Evaluation runs in a worker thread by default (``offload=True``): measured
(docs/policy.md, "Latency") one uncached decision with the shipped policy
costs ~250 µs p50 and over 1 ms p99 (Go-side input conversion and GC), not
tens of µs, while the thread hop costs ~40 µs; ctypes releases the GIL, so
the event loop keeps serving streams meanwhile. ``offload=False`` evaluates
inline (lower p50 for tiny policies). Cache hits never reach the engine.

Deadline (fail closed): every decision has an overall deadline ``timeout_s``
(default :data:`DEFAULT_TIMEOUT_S`, the gateway's ``policy.timeout_s``
default). Offloaded evaluations run on the engine's own small thread pool
(never the loop's default executor, so a hung engine cannot starve other
``to_thread`` users); past the deadline :meth:`EmbeddedOpa.decide` raises
:class:`PolicyUnavailableError` and the late result is discarded. A Go-side
evaluation cannot be interrupted: a hung one keeps its worker (and the
engine's eval lock), so later decisions queue and time out too, i.e. the
gateway keeps answering 503 until the engine recovers or is swapped. Inline
evaluations cannot be preempted either; one that finishes after the
deadline is discarded the same way.

Warm start (session 11): with ``offload`` the pool's threads are started when the engine is built,
and each evaluates the decision document once on an empty input (answer and errors ignored, at
most :data:`WARM_TIMEOUT_S`). The first offloaded decision of a fresh engine otherwise paid the
thread's start and its first call into Go: 8-70 ms on a loaded 2-core box (then ~0.5 ms), against
the 50 ms default deadline, so a freshly started gateway could fail its first request closed.

Changes are applied by building a new engine and swapping the reference
(atomic in CPython); an in-flight evaluation keeps the old engine alive until
it returns. Change listeners (e.g. a DecisionCache) are called after a swap.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

from opa_bindings import OpaEngine, OpaError, OpaUndefinedError

from policy.decision import Decision, PolicyError, PolicyUnavailableError, decision_from_result
from policy.loader import PolicySet, build_engine, load_policy_dir

DEFAULT_QUERY = "data.prefixgate.authz.decision"

#: Default overall deadline of one embedded decision, seconds (the gateway's
#: ``policy.timeout_s`` default).
DEFAULT_TIMEOUT_S = 0.05

#: Worker threads of the offload pool. The engine serializes evaluations
#: under its own lock, so more workers would only queue on it.
EVAL_WORKERS = 2

#: Most seconds the construction waits for the pool's warm-up evaluations.
WARM_TIMEOUT_S = 2.0


def _document_path(query: str) -> str:
    if not query.startswith("data.") or any(c in query for c in " \t\n[]()=:"):
        raise ValueError(f"query must be a plain data reference, got {query!r}")
    return query[len("data.") :]


class EmbeddedOpa:
    """Embedded OPA engine evaluating ``query`` for each decision.

    Args:
        policy_dir: directory to load (``*.rego`` without ``*_test.rego``,
            ``data/**.json``, ``data.json``); None starts with ``policy_set``.
        data_files: extra JSON files merged at the data root.
        query: the decision document, a plain ``data.`` reference.
        policy_set: a ready PolicySet (used when ``policy_dir`` is None).
        offload: evaluate in a worker thread (default) instead of inline.
        timeout_s: overall deadline of one decision, seconds (> 0), or None
            for no deadline (benchmarks only).
        allowed_builtins: built-ins the modules may call (None: the default
            list, :data:`policy.builtin_allowlist.DEFAULT_ALLOWED_BUILTINS`); every
            set is checked before it reaches the engine.

    Raises:
        PolicyCompileError: the initial set does not load or compile, or
            calls a built-in outside the allow-list (BuiltinNotAllowedError).
        ValueError: ``timeout_s`` is not positive.
    """

    #: a cancelled :meth:`apply` swapped nothing (:class:`policy.store_types.PolicyTarget`, S19-R4)
    applies_after_cancel = False
    #: :meth:`apply` loads the whole new set, whatever the change (a roll-back's ``*`` too; session 24)
    applies_whole_sets = True

    def __init__(
        self,
        policy_dir: str | Path | None = None,
        *data_files: str | Path,
        query: str = DEFAULT_QUERY,
        policy_set: PolicySet | None = None,
        offload: bool = True,
        timeout_s: float | None = DEFAULT_TIMEOUT_S,
        allowed_builtins: Iterable[str] | None = None,
    ) -> None:
        if timeout_s is not None and not timeout_s > 0:
            raise ValueError("timeout_s must be positive (or None)")
        self._path = _document_path(query)
        self._timeout_s = timeout_s
        self._executor: ThreadPoolExecutor | None = None
        self._dir = Path(policy_dir) if policy_dir is not None else None
        self._data_files = data_files
        self._offload = offload
        self._listeners: list[Callable[[], None]] = []
        self._allowed = None if allowed_builtins is None else frozenset(allowed_builtins)
        self.revision = 0
        #: the policy store's version of the set in force (:meth:`apply` takes the change's; None: not
        #: versioned). Set with the engine on the loop thread; :meth:`decide` reads both before an
        #: evaluation and drops the version when the engine changed during it (offloaded evaluation)
        self.policy_version: int | None = None
        self._closed = False
        if self._dir is not None:
            policy_set = load_policy_dir(self._dir, *data_files)
        self._policy_set = policy_set or PolicySet()
        self._engine: OpaEngine = self._build(self._policy_set)
        if offload:
            self._executor = ThreadPoolExecutor(EVAL_WORKERS, thread_name_prefix="opa-eval")
            wait([self._executor.submit(self._warm) for _ in range(EVAL_WORKERS)], timeout=WARM_TIMEOUT_S)

    def _warm(self) -> None:
        """One evaluation on an empty input in a pool thread (module doc, "Warm start")."""
        try:
            self._engine.eval_document(self._path, {})
        except OpaError:  # undefined, a conflict, a built-in error on an empty input: only the warm-up
            pass

    def _build(self, policy_set: PolicySet) -> OpaEngine:
        return build_engine(policy_set.policies(), policy_set.data_tree(), allowed_builtins=self._allowed)

    @property
    def policy_set(self) -> PolicySet:
        """The active policy set (modules and data documents)."""
        return self._policy_set

    def add_change_listener(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` after every policy or data change."""
        self._listeners.append(callback)

    def load(self, policy_set: PolicySet) -> None:
        """Compile ``policy_set`` into a new engine and swap it in.

        Raises:
            PolicyCompileError: the set does not compile or calls a built-in
                outside the allow-list; the active engine stays.
        """
        self._swap(self._build(policy_set), policy_set, None)

    def _swap(self, engine: OpaEngine, policy_set: PolicySet, version: int | None) -> None:
        self._engine, self._policy_set, self.policy_version = engine, policy_set, version
        self.revision += 1
        for callback in self._listeners:
            callback()

    def reload(self) -> None:
        """Re-read ``policy_dir`` and swap (see :meth:`load`)."""
        if self._dir is None:
            raise ValueError("EmbeddedOpa was built without a policy_dir")
        self.load(load_policy_dir(self._dir, *self._data_files))

    async def apply(self, change: Any, policy_set: PolicySet) -> None:
        """PolicyTarget hook for :class:`policy.store.PolicyStore`: load the set, labelled with
        ``change.version`` (:attr:`policy_version`; a give-back carries the committed version).

        The engine is built in a worker thread (S17-7: a compile takes ~1 s with the shipped
        policy; the bindings document an engine as usable from any thread, and ctypes releases
        the GIL), then swapped in on the calling (loop) thread.

        Raises:
            PolicyCompileError: as :meth:`load`; the active engine stays.
        """
        self._swap(await asyncio.to_thread(self._build, policy_set), policy_set, getattr(change, "version", None))

    def evaluate(self, input: dict[str, Any]) -> Any:
        """Evaluate the decision document synchronously; None if undefined.

        Raises:
            PolicyError: engine error (e.g. a conflict or builtin error).
        """
        engine = self._engine
        try:
            return engine.eval_document(self._path, input)
        except OpaUndefinedError:
            return None
        except OpaError as exc:
            if exc.code == "closed":
                raise PolicyUnavailableError("embedded engine closed") from None
            raise PolicyError(f"policy evaluation failed: {exc.code}") from None

    async def decide(self, input: dict[str, Any]) -> Decision:
        """Evaluate one decision (see :class:`policy.decision.DecisionPoint`).

        Raises:
            PolicyUnavailableError: past the deadline, or the engine is closed.
            PolicyError: evaluation failed or the output has a wrong shape.
        """
        engine, version = self._engine, self.policy_version  # set together by _swap, on this (loop) thread
        if self._offload:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(EVAL_WORKERS, thread_name_prefix="opa-eval")
            fut = asyncio.get_running_loop().run_in_executor(self._executor, self.evaluate, input)
            try:
                async with asyncio.timeout(self._timeout_s):
                    result = await fut
            except TimeoutError:
                raise PolicyUnavailableError(
                    f"embedded OPA decision deadline of {self._timeout_s}s exceeded") from None
        else:
            t0 = time.perf_counter()
            result = self.evaluate(input)
            if self._timeout_s is not None and time.perf_counter() - t0 > self._timeout_s:
                raise PolicyUnavailableError(f"embedded OPA decision deadline of {self._timeout_s}s exceeded")
        if self._engine is not engine:  # a change was swapped in while a pool thread evaluated: which set
            version = None  # decided is unknown (every swap installs a new engine object, never an old one)
        return decision_from_result(result, str(uuid.uuid4()), version)

    async def health(self) -> tuple[bool, str]:
        """``(ok, reason)`` for readiness: ready while open with at least one
        policy module loaded (no I/O; the engine is in this process)."""
        if self._closed:
            return False, "embedded engine closed"
        if not self._policy_set.policies():
            return False, "no policy module loaded"
        return True, ""

    def close(self) -> None:
        """Release the engine and the worker pool; later decisions raise
        PolicyUnavailableError."""
        self._closed = True
        self._engine.close()
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
