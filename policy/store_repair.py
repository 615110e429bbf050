"""What the policy store's target may hold that the store did not commit, and how it is given back
(R18-1; session 19: S19-R4, S19-R5).

A change the target may have applied without the store committing it: its push failed without a
definite answer (a remote OPA's reply lost: a timeout, a reset), its admin request was cancelled while
the push was in flight, or the disk commit after it failed and the give-back failed too, or a crash
left it uncommitted. (A target that applies nothing once cancelled, the embedded engine, has its push
cancelled with the request; its give-back is a rebuild of the committed set, with no second pass.)
:class:`TargetRepair` keeps each such change by its key (kind, module id or data path) and gives the
target the COMMITTED state of that key back (:func:`restoring`: a put of the committed text, or a
delete when the committed set has none), never a stale inverse, so a give-back sent late, or twice, is
always right.

Ordering (S19-R4): a push to a remote target runs in a task of its own (:meth:`TargetRepair.start`) that
a cancel of the admin request does not stop; it ends when the target answers or the target's own client gives up.
Every give-back first waits for the pushes still in flight: an HTTP request is not taken back by
closing the client's side, and a delete sent before the put it undoes reaches OPA first, answers 404
(done) and the put then lands and stays.

When (S19-R5): a change's give-back runs at once (:meth:`TargetRepair.give_back_soon`, a task under the
store's lock), not at the next change. When the push's outcome is not definite (it failed, or was
cancelled inside the client), the same key is given back once more ``settle_s`` seconds later: a
request the target received but had not applied when the client gave up lands within its own
processing time. A target that cannot be reached keeps the key pending: the store refuses the next
change until the give-back succeeds (fail closed, :meth:`TargetRepair.run` raises). After a crash mid-change
(a journal restored at start) the same give-back runs when the store starts (:meth:`TargetRepair.at_start`,
session 20, S19-R10), not at the next change.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import replace

from policy.loader import PolicySet
from policy.store_types import ChangeRecord, PolicyTarget

__all__ = ["TargetRepair", "restoring"]

log = logging.getLogger(__name__)


def restoring(change: ChangeRecord, committed: PolicySet) -> ChangeRecord:
    """The change that gives a target ``committed``'s state of ``change``'s key: a put when ``committed``
    holds the module or data document, else a delete (a whole set, target ``*``: a put of it)."""
    if change.target == "*":
        return replace(change, op="put")
    held = committed.modules if change.kind == "policy" else committed.data_docs
    return replace(change, op="put" if change.target in held else "delete")


def _retrieved(task: asyncio.Future[None]) -> None:
    """Mark a push's outcome as read (its failure is the give-back's business, not the loop's warning)."""
    if not task.cancelled():
        task.exception()


class TargetRepair:
    """The keys a target may hold uncommitted, given back to the committed set (module docstring).

    Args:
        target: the store's target.
        lock: the store's lock (a give-back runs under it, as a change does).
        committed: returns the store's committed set now.
        settle_s: seconds after a push of unknown outcome when its key is given back once more (0: not).
        committed_version: returns the store's committed version now; a give-back carries it as its
            ``version`` (the embedded engine labels its decisions with it; session 25). None: the change's.
    """

    def __init__(self, target: PolicyTarget, lock: asyncio.Lock, committed: Callable[[], PolicySet],
                 settle_s: float, committed_version: Callable[[], int] | None = None) -> None:
        self._target = target
        self._lock = lock
        self._committed = committed
        self._committed_version = committed_version
        self.settle_s = settle_s
        #: a push runs on after its caller is cancelled (:class:`policy.store_types.PolicyTarget`)
        self.detached: bool = getattr(target, "applies_after_cancel", True)
        #: (kind, target) -> the change the target may hold (or its inverse: only the key counts)
        self.pending: dict[tuple[str, str], ChangeRecord] = {}
        self._inflight: set[asyncio.Future[None]] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    def hold(self, change: ChangeRecord) -> None:
        """Note that the target may hold ``change``'s key uncommitted (given back by :meth:`run`)."""
        self.pending[(change.kind, change.target)] = change

    def start(self, change: ChangeRecord, policy_set: PolicySet) -> asyncio.Future[None]:
        """Apply ``change`` (``policy_set``: the whole new set) in a task of its own, returned: await it through
        ``asyncio.shield`` when :attr:`detached` (a cancel of the caller does not stop it; :meth:`run` waits for
        it while it runs), else directly (a cancel stops it: it applied nothing)."""
        task = asyncio.ensure_future(self._target.apply(change, policy_set))
        task.add_done_callback(_retrieved)
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)
        return task

    def give_back_soon(self, change: ChangeRecord, push: asyncio.Future[None] | None) -> None:
        """Give ``change``'s key back now, in a task kept referenced: after ``push`` (its push) has an outcome,
        under the lock; once more ``settle_s`` later when that outcome is not a success. A failure is logged;
        the key stays pending (the next change retries it first)."""
        self.hold(change)
        self._keep(asyncio.get_running_loop().create_task(self._give_back(change, push)))

    async def at_start(self) -> None:
        """Give back now what the store's start found pending (S19-R10: a journal restored at start, the change
        a stopped process left uncommitted, :meth:`hold`-ed): a target that applies after a cancel (a remote
        OPA) may hold it. One pass at once, awaited, under the lock (a failure is logged: the key stays
        pending, retried before the next change, as after a lost reply), and once more ``settle_s`` later in
        a task (a push the stopped process sent may still land). A target that applies nothing once its
        caller stops (the embedded engine) loaded the committed set: nothing to give back (the key stays
        pending, as before)."""
        if not self.detached or not self.pending:
            return
        changes = list(self.pending.values())
        await self._pass(changes[0], again=False)  # :meth:`run` gives every pending key back
        if self.settle_s > 0:
            for change in changes:
                self._keep(asyncio.get_running_loop().create_task(self._later(change)))

    def close(self) -> None:
        """Cancel the give-backs still scheduled (the target's client is closing; the keys stay pending)."""
        for task in list(self._tasks):
            task.cancel()

    def _keep(self, task: asyncio.Task[None]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _give_back(self, change: ChangeRecord, push: asyncio.Future[None] | None) -> None:
        if push is not None:
            await asyncio.wait({push})
        unsure = self.detached and (push is None or push.cancelled() or push.exception() is not None)
        await self._pass(change, again=False)
        if unsure and self.settle_s > 0:
            await self._later(change)

    async def _later(self, change: ChangeRecord) -> None:
        await asyncio.sleep(self.settle_s)  # a request the target got late lands within its processing time
        await self._pass(change, again=True)

    async def _pass(self, change: ChangeRecord, *, again: bool) -> None:
        async with self._lock:
            if again:
                self.hold(change)
            try:
                await self.run()
            except Exception as err:  # noqa: BLE001 - the key stays pending: retried before the next change
                log.error("policy: giving the target its committed %s %r back failed (%s)", change.kind,
                          change.target, err.__class__.__name__)

    async def run(self) -> None:
        """Wait for the pushes still in flight, then give the target each pending key's committed state
        (call it under the store's lock).

        Raises:
            PolicyTargetError (or what the target raises): the target refused; that key and the rest stay pending.
        """
        if self._inflight:
            await asyncio.wait(set(self._inflight))
        for key, change in list(self.pending.items()):
            committed = self._committed()
            back = restoring(change, committed)
            if self._committed_version is not None:
                back = replace(back, version=self._committed_version())
            await self._target.apply(back, committed)
            del self.pending[key]
