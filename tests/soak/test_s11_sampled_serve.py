"""Session 11 (review D3): bench.stage_timer and bench.critical_path share their sampled child
(``prefixgate serve`` whose wrappers' samples SIGUSR1 clears and SIGUSR2 writes), its collection
and their common options (bench/sampled_serve.py)."""
from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from bench import critical_path, sampled_serve, stage_timer


def test_clear_empties_every_list_and_dump_writes_them_whole(tmp_path: Path) -> None:
    samples = {"a": [1, 2], "b": [3]}
    out = tmp_path / "samples.json"
    clear, dump = sampled_serve.sample_handlers(samples, str(out))
    dump()
    assert json.loads(out.read_text()) == {"a": [1, 2], "b": [3]}
    assert not (tmp_path / "samples.json.tmp").exists()
    clear()
    assert samples == {"a": [], "b": []}
    dump()
    assert json.loads(out.read_text()) == {"a": [], "b": []}


async def test_collect_asks_the_process_for_its_samples_and_reads_them(tmp_path: Path) -> None:
    samples = {"x": [7]}
    out = tmp_path / "s.json"
    _, dump = sampled_serve.sample_handlers(samples, str(out))
    out.write_text("stale")
    old = signal.signal(signal.SIGUSR2, dump)
    try:
        assert await sampled_serve.collect(os.getpid(), out, timeout_s=10) == {"x": [7]}
    finally:
        signal.signal(signal.SIGUSR2, old)


def test_both_benches_take_the_shared_options() -> None:
    for mod, requests in ((stage_timer, 2000), (critical_path, 400)):
        ap = sampled_serve.options(mod.__name__, mod.__doc__ or "", requests=requests, rounds=3)
        args = ap.parse(["--requests", "5", "--name", "n"])
        assert (args.requests, args.rounds, args.name, args.child, args.samples_out) == (5, 3, "n", None, None)
