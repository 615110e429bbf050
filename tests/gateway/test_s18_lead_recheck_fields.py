"""Session 18 (R18-2): the re-decision rewrites the upstream body's ``user`` (the tenant's ``forward_user``
now: a pseudonym set, or the field removed) and a lower ``max_tokens`` in one pass, for the dict body (flow
control off) and the queued JSON bytes alike (gateway/pep_recheck.py ``with_fields``)."""
from __future__ import annotations

import orjson

from gateway.pep_recheck import with_fields, with_max_tokens


def test_a_field_is_set_replaced_or_removed_and_the_key_order_kept() -> None:
    body = {"model": "m", "max_tokens": 20, "user": "old", "stream": False}
    assert with_fields(body, {"user": None}) == {"model": "m", "max_tokens": 20, "stream": False}
    assert with_fields(body, {"user": "new", "max_tokens": 3}) == \
        {"model": "m", "max_tokens": 3, "user": "new", "stream": False}
    assert body["user"] == "old"  # a copy: the caller's dict is not changed
    queued = orjson.dumps(body)
    assert with_fields(queued, {"user": None}) == b'{"model":"m","max_tokens":20,"stream":false}'
    assert list(orjson.loads(with_fields(queued, {"user": "p", "max_tokens": 3}))) == \
        ["model", "max_tokens", "user", "stream"]
    assert with_fields({"model": "m"}, {"user": None}) == {"model": "m"}  # absent stays absent


def test_with_max_tokens_is_with_fields_of_one() -> None:
    assert with_max_tokens(b'{"model":"m","max_tokens":20}', 3) == b'{"model":"m","max_tokens":3}'
