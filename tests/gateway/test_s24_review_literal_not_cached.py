"""S24-review-6: the 400 for a number beyond a double quotes the literal (its first 32 characters: client
text), so its body is rendered for that answer alone (``client_text``), never kept in the process-wide cache
of error bodies (gateway/errors.py ``_BODIES``), where one tenant's literal made another tenant's identical
refusal cheaper (one JSON encoding) and stayed in memory until the cache filled."""
from __future__ import annotations

import pytest

from gateway import errors
from gateway.errors import GatewayError
from gateway.request import parse_inference_request


@pytest.mark.parametrize("literal", ["1e400", "-2e308", "123456789e999"])
def test_out_of_range_literal_refusal_is_not_cached(literal: str) -> None:
    raw = ('{"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": %s}' % literal).encode()
    with pytest.raises(GatewayError) as info:
        parse_inference_request(raw, "chat")
    err = info.value
    assert err.code == "invalid_json" and literal[:32] in err.message and err.client_text
    response = err.response()
    assert literal[:32].encode() in response.body
    assert not any(literal[:32] in key[1] for key in errors._BODIES)  # nothing of it kept process-wide
