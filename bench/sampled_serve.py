"""A ``prefixgate serve`` child whose in-process samples a bench reads by signal (not a test).

Shared by :mod:`bench.stage_timer` (time per call of listed functions) and
:mod:`bench.critical_path` (the critical path's marks). The child wraps what it measures, then
serves; SIGUSR1 empties every sample list, SIGUSR2 writes them all as one JSON object
(name -> list of integers, ns) to the samples file, replaced atomically. The parent clears,
drives requests, then :func:`collect` asks for the samples and reads them.

bench.critical_path copies this file into a baseline tree that lacks it (with itself), so it
imports nothing of this tree but :mod:`sim.click_options` (present since session 4).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import click

from sim.click_options import ClickOptions

__all__ = ["collect", "options", "sample_handlers", "serve_sampled"]


def sample_handlers(samples: Mapping[str, list[Any]], out_file: str) -> tuple[Callable[..., None], Callable[..., None]]:
    """``(clear, dump)``: ``clear()`` empties every list of ``samples``; ``dump()`` writes
    ``samples`` as JSON to ``out_file`` (through ``out_file + ".tmp"``, then renamed). Both take and
    ignore a signal handler's arguments."""

    def clear(*_: Any) -> None:
        for s in samples.values():
            s.clear()

    def dump(*_: Any) -> None:
        Path(out_file + ".tmp").write_text(json.dumps(samples))
        os.replace(out_file + ".tmp", out_file)

    return clear, dump


def serve_sampled(module: str, config_file: str, out_file: str,
                  install: Callable[[], Mapping[str, list[Any]]]) -> None:
    """Run ``prefixgate serve`` on ``config_file`` in this process (re-executed once as
    ``python -m <module> <argv>`` with the Go GC settings of the gateway), after ``install()``
    wrapped what it measures and returned its sample lists; SIGUSR1 clears them, SIGUSR2 writes
    them to ``out_file`` (:func:`sample_handlers`). Returns when the gateway stops."""
    from gateway.config import load_config
    from gateway.server import run_serving, serve
    from policy import reexec_with_go_gc

    reexec_with_go_gc(["-m", module, *sys.argv[1:]])
    clear, dump = sample_handlers(install(), out_file)
    signal.signal(signal.SIGUSR1, clear)
    signal.signal(signal.SIGUSR2, dump)
    run_serving(serve(load_config(config_file), config_path=config_file))


async def collect(pid: int, out: Path, timeout_s: float = 30.0) -> dict[str, list[Any]]:
    """Ask process ``pid`` for its samples (SIGUSR2) and read them from ``out`` once written.
    Raises FileNotFoundError when ``out`` did not appear within ``timeout_s`` seconds."""
    out.unlink(missing_ok=True)
    os.kill(pid, signal.SIGUSR2)
    deadline = time.monotonic() + timeout_s
    while not out.exists() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return json.loads(out.read_text())


def options(module: str, doc: str, *, requests: int, rounds: int) -> ClickOptions:
    """The options of a sampled bench ``python -m <module>``: ``--requests`` and ``--rounds``
    (defaults given), ``--out`` (bench/results), ``--name`` (the module's last name) and the
    child's hidden ``--child CONFIG`` and ``--samples-out FILE``. Add more with ``.option``."""
    ap = ClickOptions(prog=f"python -m {module}", description=doc.splitlines()[0] if doc else None)
    ap.option("--requests", type=int, default=requests)
    ap.option("--rounds", type=int, default=rounds)
    ap.option("--out", type=click.Path(path_type=Path), default=Path(__file__).resolve().parent / "results")
    ap.option("--name", default=module.rsplit(".", 1)[-1])
    ap.option("--child", hidden=True)
    ap.option("--samples-out", hidden=True)
    return ap
