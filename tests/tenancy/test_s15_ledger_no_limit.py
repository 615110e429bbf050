"""Session 15 (issue 14): the in-process ledger answers a tenant without a token limit without its bucket
sync; the answers are the ones the sync gave: no prompt room bound, nothing held in a bucket, and a limit
removed by a registry reload drops the bucket (a limit put back starts a full one, as before)."""

from __future__ import annotations

from tenancy.ledger import InProcessLedger
from tenancy.registry import Tenant


def test_no_limit_means_any_prompt_and_no_bucket() -> None:
    led = InProcessLedger(clock=lambda: 10.0)
    t = Tenant(id="t")
    assert led.prompt_room(t) is None
    res = led.reserve(t, 500, 100)
    assert (res.prompt_tokens, res.output_tokens) == (500, 100)
    assert led.level("t", "prompt") is None and led.level("t", "output") is None
    assert led.totals()["t"].reserved == {"prompt": 500, "output": 100}


def test_a_limit_removed_by_a_reload_drops_the_bucket_and_one_put_back_starts_full() -> None:
    led = InProcessLedger(clock=lambda: 10.0)
    limited = Tenant(id="t", prompt_tokens_per_s=1.0, prompt_tokens_burst=40, output_tokens_per_s=1.0,
                     output_tokens_burst=10)
    led.reserve(limited, 30, 5)
    room = led.prompt_room(limited)
    assert room is not None and room.cap == 10  # 40 - 30, nothing refilled at a frozen clock
    assert led.level("t", "output") == 5
    unlimited = Tenant(id="t")  # the reload's new object, without limits
    assert led.prompt_room(unlimited) is None
    led.reserve(unlimited, 1000, 1000)  # nothing refused: no bucket
    assert led.level("t", "prompt") is None and led.level("t", "output") is None
    assert led.prompt_room(limited) is None  # the limit back: a new bucket, full (None: any prompt fits)
    led.reserve(limited, 25, 0)
    room = led.prompt_room(limited)
    assert room is not None and room.cap == 15  # 40 - 25: the old level was not kept
