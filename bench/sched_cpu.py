"""CPU time of a process from the Linux scheduler's own nanosecond count (not a test).

Shared by :mod:`bench.overhead` (its "CPU µs/req" column) and :mod:`bench.stream_cost` (session 23,
S22-native-1: ``bench.overhead`` read psutil's ``cpu_times``, which count 10 ms clock ticks, +-20 µs per
request over 500 requests; differences of ~50 µs were then below its resolution).
"""

from __future__ import annotations

import os

__all__ = ["SchedCpu"]


class SchedCpu:
    """CPU seconds of a process's threads (and, ``children``, its descendants'), from the scheduler's own
    nanosecond count (``/proc/PID/task/TID/schedstat``, first field: time on a CPU, user + system; Linux): psutil's
    ``cpu_times`` counts 10 ms clock ticks, too coarse for a hundred requests of a few hundred µs.
    ``main_thread``: the event loop's thread only (not OPA's Go threads, the tokenizer's)."""

    def __init__(self, pid: int, children: bool = True, main_thread: bool = False) -> None:
        import psutil

        self.proc = psutil.Process(pid)
        self.children = children
        self.main_thread = main_thread

    def seconds(self) -> float:
        """The CPU seconds so far of the process's live threads (and live descendants'); a thread or
        process that ended since counts 0."""
        import psutil

        pids = [self.proc.pid]
        if self.children:
            try:
                pids += [c.pid for c in self.proc.children(recursive=True)]
            except psutil.Error:
                pass
        total = 0
        for pid in pids:
            try:
                tids = [str(pid)] if self.main_thread else os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            for tid in tids:
                try:
                    with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as f:
                        total += int(f.read().split()[0])
                except (OSError, ValueError, IndexError):
                    pass
        return total / 1e9
