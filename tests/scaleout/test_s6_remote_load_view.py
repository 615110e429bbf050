"""RemoteLoadView.apply_delta updates in place (session 6): same values as the per-instance floored sums."""
from __future__ import annotations

import random

from routing.shared import LoadDelta, LoadSnapshot, RemoteLoadView


def test_in_place_deltas_match_a_floored_model() -> None:
    rng = random.Random(6)
    view = RemoteLoadView()
    model: dict[str, dict[str, list[int]]] = {}
    for step in range(3000):
        inst, rid = rng.choice(["i1", "i2", "i3"]), rng.choice(["r0", "r1"])
        if step % 500 == 499:  # a snapshot replaces what is held of one instance
            loads = {"r0": (rng.randint(0, 50), rng.randint(0, 50), rng.randint(0, 3))}
            view.apply_snapshot(inst, LoadSnapshot(loads))
            model[inst] = {r: list(v) for r, v in loads.items()}
            continue
        d = LoadDelta(rid, rng.randint(-60, 60), rng.randint(-60, 60), rng.randint(-2, 2))
        view.apply_delta(inst, d)
        cur = model.setdefault(inst, {}).setdefault(rid, [0, 0, 0])
        for i, x in enumerate((d.prefill_tokens, d.decode_tokens, d.running_requests)):
            cur[i] = max(0, cur[i] + x)
        if step % 700 == 0:
            view.drop("i2")
            model.pop("i2", None)
        for r in ("r0", "r1"):
            want = tuple(sum(m.get(r, [0, 0, 0])[i] for m in model.values()) for i in range(3))
            assert view.total(r) == want, (step, r)
