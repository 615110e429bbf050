"""Memory and CPU of the audit line formats' caches under per-request values (not a test; S28-final28-2).

``PYTHONPATH=TREE python -m bench.s28_final28_audit_caches [--events 12000]``

Run once per tree (this one, an export of another commit: ``git archive C | tar -x -C DIR``). Prints, for events
whose SPIFFE ID and client address differ from event to event (one tenant, one endpoint, one replica):

* the memory the CEF and OCSF format caches hold after ``--events`` events and their peak (``tracemalloc``,
  MiB; 64-byte and 2,048-byte SPIFFE IDs, the latter the SPIFFE maximum);
* thread CPU per event of ``cef_line`` + ``ocsf_line`` (µs, best of 5 passes of 20,000 events) with one client
  address and with a distinct address per event (session 28's caches are cleared every 4,096 entries; session
  29's drop their least recently used entry).

Synthetic values only: no prompt text."""

from __future__ import annotations

import gc
import time
import tracemalloc

import click

from audit import cef, ocsf
from audit.event import AuditEvent, Identity, Kind, Outcome, RouteInfo


def _event(i: int, id_bytes: int = 64, spread: bool = True, ids: int | None = None) -> AuditEvent:
    """An inference event: SPIFFE ID ``i`` (of ``id_bytes`` bytes; ``ids``: that many IDs in turn), client
    address ``fd00::i`` (``spread``) or one address."""
    n = i if ids is None else i % ids
    sid = "spiffe://quickstart.test/acme/" + f"w{n:06d}" + "a" * max(0, id_bytes - 37)
    return AuditEvent(kind=Kind.INFERENCE, outcome=Outcome.SUCCEEDED, time_ms=i + 1, event_id=f"e{i}",
                      identity=Identity(sid, "quickstart.test"), tenant="acme", endpoint="/v1/chat/completions",
                      model="m", route=RouteInfo(replica="r1"),
                      client_address=f"fd00::{i:x}" if spread else "10.0.0.1")


def _clear() -> None:
    """Empty the format caches of either layout: session 28's dicts, session 29's ``functools.lru_cache``."""
    for module, names in ((cef, ("_WHO", "_WHERE", "_ESCAPED")), (ocsf, ("_USERS", "_SRCS", "_APIS", "_DSTS"))):
        for name in names:
            getattr(module, name, {}).clear()
        for value in vars(module).values():
            if callable(getattr(value, "cache_clear", None)):
                value.cache_clear()


def memory(events: int, id_bytes: int) -> tuple[float, float]:
    """(retained, peak) MiB the caches hold after ``events`` events of distinct IDs and addresses."""
    _clear()
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    for i in range(events):
        ev = _event(i, id_bytes)
        cef.cef_line(ev)
        ocsf.ocsf_line(ev)
        del ev
    cur, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return (cur - base) / 2**20, (peak - base) / 2**20


def cpu(spread: bool, n: int = 20_000) -> float:
    """Thread CPU µs per event of both lines (best of 5), 8 IDs in turn, addresses spread or one."""
    evs = [_event(i, spread=spread, ids=8) for i in range(n)]
    best = float("inf")
    for _ in range(5):
        t = time.thread_time()
        for ev in evs:
            cef.cef_line(ev)
            ocsf.ocsf_line(ev)
        best = min(best, (time.thread_time() - t) / n * 1e6)
    return best


@click.command()
@click.option("--events", type=int, default=12_000, show_default=True, help="events for the memory figures")
def main(events: int) -> None:
    """Print the figures (module doc)."""
    print(f"tree: {cef.__file__.rsplit('/audit/', 1)[0]}")
    for id_bytes in (64, 2048):
        cur, peak = memory(events, id_bytes)
        print(f"SPIFFE ID {id_bytes} B, {events} distinct IDs and addresses: caches hold {cur:.1f} MiB, "
              f"peak {peak:.1f} MiB")
    print(f"cef_line + ocsf_line: one address {cpu(False):.2f} us/event, an address per event "
          f"{cpu(True):.2f} us/event")


if __name__ == "__main__":
    main()
