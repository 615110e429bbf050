"""A live stream's write path under uvloop: the server connection's writes held to the end of the loop step
(:class:`gateway.coalesce.CoalescingTransport`) against write-through (session 28, issue 14; not a test).

``python -m bench.coalesce_stream_micro [--modes coalesce,through,raw] [--events 2000] [--rounds 8]``

One thread, one uvloop loop, loopback socket pairs: a "replica" writes one 300-byte event to an upstream
socket; the relay task (waiting on a future the upstream protocol's ``data_received`` completes, as
:meth:`gateway.upstream_response.UpstreamResponse.read_chunk` does) writes it to the client socket through
the transport of the mode; the client's ``data_received`` has the replica write the next event. One event in
flight at a time, so every event is one upstream read, one relay step and one client write, as a stream whose
events are apart in time. Modes: ``coalesce`` (the transport as before session 28: the write waits for a
``call_soon`` callback at the end of its step), ``through`` (the same transport with ``write_through(True)``,
as the relay turns it on for a stream's middle parts), ``raw`` (the socket transport itself: the floor).
Figure: thread CPU µs per event (everything in the thread: the replica, relay and client sides are the same in
every mode), median of rounds, modes interleaved (order reversed every other round). Prints the table.
"""

from __future__ import annotations

import asyncio
import os
import socket
import statistics
import time
from typing import Any

import click

from gateway.coalesce import CoalescingTransport

EVENT = b"x" * 300


async def _run(mode: str, events: int) -> float:
    """Thread CPU µs per event of ``events`` relayed events in ``mode``."""
    loop = asyncio.get_running_loop()
    socks = [*socket.socketpair(), *socket.socketpair()]
    for s in socks:
        s.setblocking(False)
    up_r, up_w, cl_r, cl_w = socks
    queued: list[bytes] = []
    waiter: list[Any] = [None]
    done: asyncio.Future[None] = loop.create_future()
    count = [0]

    class Upstream(asyncio.Protocol):
        def data_received(self, data: bytes) -> None:
            queued.append(data)
            w = waiter[0]
            if w is not None and not w.done():
                w.set_result(None)

    class Client(asyncio.Protocol):
        def data_received(self, data: bytes) -> None:
            count[0] += 1
            if count[0] >= events:
                if not done.done():
                    done.set_result(None)
            else:
                replica.write(EVENT)

    replica, _ = await loop.create_connection(asyncio.Protocol, sock=up_w)
    await loop.create_connection(Upstream, sock=up_r)
    client_tx, _ = await loop.create_connection(asyncio.Protocol, sock=cl_w)
    await loop.create_connection(Client, sock=cl_r)
    out: Any = client_tx if mode == "raw" else CoalescingTransport(client_tx, loop)  # type: ignore[arg-type]
    if mode == "through":
        out.write_through(True)

    async def relay() -> None:
        while True:
            while not queued:
                waiter[0] = loop.create_future()
                await waiter[0]
            data = queued[0] if len(queued) == 1 else b"".join(queued)
            queued.clear()
            out.write(data)

    task = asyncio.ensure_future(relay())
    t0 = time.thread_time()
    replica.write(EVENT)
    await done
    cpu = (time.thread_time() - t0) / events * 1e6
    task.cancel()
    for s in socks:
        s.close()
    return cpu


async def _main(modes: list[str], events: int, rounds: int) -> dict[str, list[float]]:
    res: dict[str, list[float]] = {m: [] for m in modes}
    for r in range(rounds):
        for m in (modes if r % 2 == 0 else modes[::-1]):
            res[m].append(await _run(m, events))
    return res


@click.command()
@click.option("--modes", default="coalesce,through,raw", show_default=True)
@click.option("--events", default=2000, show_default=True)
@click.option("--rounds", default=8, show_default=True)
def main(modes: str, events: int, rounds: int) -> None:
    """Thread CPU per relayed event, per write mode (module doc)."""
    import uvloop

    names = modes.split(",")
    res = uvloop.run(_main(names, events, rounds))
    print(f"load average {os.getloadavg()[0]:.2f}; {rounds} rounds x {events} events; thread CPU µs per event")
    print("| mode | median | rounds |\n|---|---:|---|")
    for m in names:
        print(f"| {m} | {statistics.median(res[m]):.2f} | {', '.join(f'{x:.2f}' for x in res[m])} |")


if __name__ == "__main__":
    main()
