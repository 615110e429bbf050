"""Session 9 (issue 14): ``extract_bearer`` without lowering the whole value gives the same token or refusal."""
from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from gateway.identity import AuthenticationError
from gateway.identity.bearer import extract_bearer


def _before(authorization: str | None) -> tuple[str, str]:
    """The session 8 implementation: ("ok", token) or ("refused", reason)."""
    if authorization is None or not authorization.strip() or authorization.strip().lower() == "bearer":
        return ("refused", "missing_token")
    parts = authorization.strip().split(" ")
    if len(parts) != 2 or parts[0].lower() != "bearer" or not parts[1]:
        return ("refused", "malformed_authorization_header")
    return ("ok", parts[1])


def _now(authorization: str | None) -> tuple[str, str]:
    try:
        return ("ok", extract_bearer(authorization))
    except AuthenticationError as err:
        return ("refused", err.reason.value)


_PIECES = st.sampled_from(["Bearer", "bearer", "BEARER", "BeArEr", "Basic", " ", "  ", "\t", "\n", "x", "a.b.c",
                           "\u0130", "\u212a", "ß", "eyJ0", "", "\xa0"])


@settings(max_examples=3000, deadline=None)
@given(st.one_of(st.none(), st.lists(_PIECES, max_size=6).map("".join),
                 st.text(st.characters(max_codepoint=0x24F), max_size=12)))
@example(None)
@example("Bearer")
@example("bearer ")
@example(" BEARER\t")
@example("Bearer  tok")
@example("Bearer tok")
@example("Bearer\u0130")
def test_extract_bearer_unchanged(value: str | None) -> None:
    assert _now(value) == _before(value)
