"""S31-newcomer31-5: a replica's own 4xx message is passed to the client (gateway/pipeline_answer.py
``passthrough_error``), and engines quote the request in it (vLLM's validation errors carry ``input_value='...'``,
its context-length refusal the prompt's token count). Such a body is rendered for that answer alone (``client_text``),
never kept in the process-wide cache of error bodies (gateway/errors.py ``_BODIES``), where one tenant's text made
another tenant's identical refusal cheaper and stayed in memory until the cache filled (the S24-review-6 rule)."""
from __future__ import annotations

import orjson
import pytest

from gateway import errors
from gateway.pipeline_answer import failure_error
from gateway.proxy import UpstreamFailure

MARKER = "QQQ\u2603"  # never in an id or a hash (rule 16)
MESSAGES = [
    "1 validation error for ChatCompletionRequest\nmessages.0.content\n  Input should be a valid string "
    f"[type=string_type, input_value='{MARKER} the prompt', input_type=str]",
    f"This model's maximum context length is 8192 tokens. However, you requested 9001 tokens ({MARKER}).",
]


@pytest.mark.parametrize("message", MESSAGES)
def test_a_replica_4xx_message_is_not_kept_in_the_shared_body_cache(message: str) -> None:
    body = orjson.dumps({"error": {"message": message, "type": "BadRequestError", "param": None, "code": 400}})
    err = failure_error(UpstreamFailure("status", "the replica answered 400", status=400, body=body))
    assert err.status == 400 and err.code == "upstream_rejected" and err.message == message
    response = err.response()
    assert MARKER.encode() in response.body  # the client still reads the replica's message
    assert not any(MARKER in key[1] for key in errors._BODIES)  # nothing of it kept process-wide


def test_the_fixed_replica_message_is_still_answered() -> None:
    err = failure_error(UpstreamFailure("status", "the replica answered 422", status=422, body=b"not json"))
    assert err.status == 422 and err.message == "the replica rejected the request"
    assert orjson.loads(err.response().body)["error"]["code"] == "upstream_rejected"
