"""Session 11: the embedded engine's offload pool is started and warmed when the engine is built.

The first offloaded decision of a fresh engine paid the worker thread's start and its first call
into Go: 8-70 ms on the loaded 2-core box (then ~0.5 ms), against the 50 ms default deadline, so
a freshly started gateway could answer its first request 503 ``policy_unavailable`` (seen in
tests/policy_e2e under CPU load). Now the pool's threads exist, each has evaluated once (an
empty input; answer and errors ignored), before the first decision.
"""
from __future__ import annotations

import threading

from policy.embedded import EVAL_WORKERS, EmbeddedOpa
from policy.loader import PolicySet
from rego import policy_dir


def _eval_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("opa-eval")]


def test_the_offload_pool_is_started_and_warmed_at_construction() -> None:
    before = set(_eval_threads())
    engine = EmbeddedOpa(policy_dir())
    try:
        started = set(_eval_threads()) - before
        assert 1 <= len(started) <= EVAL_WORKERS
    finally:
        engine.close()


def test_inline_mode_starts_no_thread() -> None:
    before = set(_eval_threads())
    engine = EmbeddedOpa(policy_dir(), offload=False)
    try:
        assert not set(_eval_threads()) - before
    finally:
        engine.close()


async def test_a_policy_that_fails_on_an_empty_input_still_builds_and_decides() -> None:
    # a conflict on {} (two values for one complete rule) fails the warm-up's evaluation: ignored
    src = """package prefixgate.authz

decision := {"allow": true} if not input.request
decision := {"allow": false} if not input.request
decision := {"allow": true, "reason_code": "allowed", "reason": "ok"} if input.request
"""
    engine = EmbeddedOpa(policy_set=PolicySet({"p.rego": src}, {}))
    try:
        d = await engine.decide({"request": {"model": "m"}})
        assert d.allow
    finally:
        engine.close()
