"""Session 3: request and event ids from batched ``os.urandom`` (no syscall per id): same formats
as ``uuid.uuid4()`` (event ids: UUID v4 strings, docs/audit.md; request ids: ``uuid4().hex``),
unique, fresh after a fork, safe to take from several threads."""

from __future__ import annotations

import os
import threading
import uuid

import pytest

from audit import ids
from audit.event import new_event_id
from gateway.record import new_request_id


def test_event_ids_are_uuid4_strings() -> None:
    for _ in range(3 * ids.BATCH + 7):  # crosses refills
        s = new_event_id()
        u = uuid.UUID(s)
        assert u.version == 4 and u.variant == uuid.RFC_4122 and str(u) == s


def test_request_ids_are_uuid4_hex() -> None:
    for _ in range(2 * ids.BATCH + 3):
        s = new_request_id()
        u = uuid.UUID(hex=s)
        assert len(s) == 32 and u.version == 4 and u.variant == uuid.RFC_4122 and u.hex == s


def test_ids_are_unique_across_threads() -> None:
    got: list[list[str]] = [[] for _ in range(4)]

    def take(out: list[str]) -> None:
        for _ in range(5 * ids.BATCH):
            out.append(new_event_id())

    threads = [threading.Thread(target=take, args=(g,)) for g in got]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    flat = [s for g in got for s in g]
    assert len(set(flat)) == len(flat) == 20 * ids.BATCH


def test_ids_use_urandom_in_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = os.urandom

    def counting(n: int) -> bytes:
        calls.append(n)
        return real(n)

    monkeypatch.setattr(ids.os, "urandom", counting)
    ids.reset()
    for _ in range(ids.BATCH):
        new_event_id()
        new_request_id()
    assert len(calls) == 2  # one refill per stream, not one syscall per id


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_does_not_repeat_the_parents_ids() -> None:
    new_event_id()  # the parent's batch is filled
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        os.close(r)
        os.write(w, " ".join(new_event_id() for _ in range(8)).encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        child = f.read().split()
    os.waitpid(pid, 0)
    parent = [new_event_id() for _ in range(8)]
    assert len(child) == 8 and not set(child) & set(parent)
