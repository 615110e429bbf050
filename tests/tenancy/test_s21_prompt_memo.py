"""Session 21 (issue 14): the per-tenant prompt memo (tenancy/prompt_memo.py) gives the same token ids, the
same ``limit`` answers and the same chains as the memo-less tokenizer and key ring, on texts built to share
prefixes with adversarial neighbourhoods around the cuts (long blank runs, 64-character words, non-ASCII,
symbols); entries are per tenant and key version; the memo is bounded."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tenancy.prompt_memo as pm
from tenancy.keys import KeyRing
from tenancy.prompt_memo import MemoIds, PromptMemo, next_cut
from tenancy.tokenizer import WordTokenizer

TOK = WordTokenizer()
MASTER = b"s21-prompt-memo-master-secret-32b"

# pieces around which the tokenizer's rules change: word lengths 63/64/65/129, blank runs 1/64/65/130 (ASCII,
# \x1c, NBSP, EM SPACE, line breaks), symbols, Latin-1 and other non-ASCII words, underscores and digits
PIECES = st.sampled_from([
    "a", "word", "x" * 63, "y" * 64, "z" * 65, "w" * 129, "_", "42", "caf\u00e9", "\u00e9" * 64, "\u4e2d\u6587",
    "\u00c6\u00f8", "\U0001f600", " ", "  ", " " * 64, " " * 65, " " * 130, "\n", "\t\n", "\x1c", "\u00a0" * 65,
    "\u2003", "\u2003" * 66, "!", ".", "<|user|>\n", "{", "\u00bf", "-", "'",
])
TEXT = st.lists(PIECES, max_size=60).map("".join)


def _memo(ring: KeyRing, *, block_size: int = 4, max_blocks: int | None = 40, size: int = 1 << 20,
          entries: int = 4096, tenants: int = 8) -> PromptMemo:
    return PromptMemo(ring, TOK, block_size=block_size, max_prefix_blocks=max_blocks, bytes_per_tenant=size,
                      entries_per_tenant=entries, tenants=tenants)


@pytest.fixture
def small_cuts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Cuts every ~8 characters, so short texts hold many segments (the rule is the same at any spacing)."""
    monkeypatch.setattr(pm, "CUT_CHARS", 8)


@settings(max_examples=300, deadline=None)
@given(TEXT, st.integers(min_value=0, max_value=4000))
def test_every_cut_is_compositional(text: str, at: int) -> None:
    """encode(a + b) == encode(a) + encode(b) where the rule cuts (a class-run end followed by a character)."""
    for m in pm._RUN_END_RE.finditer(text, min(at, len(text))):
        p = m.end()
        assert TOK.encode(text) == TOK.encode(text[:p]) + TOK.encode(text[p:]), p
        break


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(TEXT, st.lists(st.tuples(st.integers(0, 10_000), TEXT), min_size=1, max_size=6),
       st.lists(st.one_of(st.none(), st.integers(0, 400)), min_size=6, max_size=6))
def test_memo_equals_tokenizer_and_ring(small_cuts: None, base: str, turns: list[tuple[int, str]],
                                        limits: list[int | None]) -> None:
    """Texts sharing prefixes with a base (cut at any character, then a new tail), in order: the ids, the
    ``limit`` answers and the chains equal the memo-less functions', with a cap on the blocks hashed."""
    ring = KeyRing(MASTER)
    memo = _memo(ring, max_blocks=12)
    sent = base
    for (keep, tail), limit in zip(turns, limits):
        text = sent[:keep % (len(sent) + 1)] + tail
        assert memo.encode("acme", text, limit) == TOK.encode(text, limit)
        ids = memo.encode("acme", text)
        want = TOK.encode(text)
        assert list(ids) == want
        got = memo.chains("acme", ids)
        if got is not None:
            assert got == ring.prefix_chain("acme", want, 4, max_blocks=12)
        sent = text + tail


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(TEXT, TEXT, TEXT)
def test_conversation_resends_hit_and_stay_exact(small_cuts: None, first: str, reply: str, follow: str) -> None:
    """A multi-turn chat resends the whole earlier conversation: the second turn is served from entries for
    all but at most its last two segments before the new text, with the same ids and chains."""
    ring = KeyRing(MASTER)
    memo = _memo(ring)
    t1 = "<|system|>\nBe brief.\n<|user|>\n" + first + "\n"
    t2 = t1 + "<|assistant|>\n" + reply + "\n<|user|>\n" + follow + "\n"
    for text in (t1, t2):
        ids = memo.encode("acme", text)
        assert list(ids) == TOK.encode(text)
        got = memo.chains("acme", ids)
        assert got is None or got == ring.prefix_chain("acme", TOK.encode(text), 4, max_blocks=40)
    if len(t1) > 4 * pm.CUT_CHARS and next_cut(t1, 0) is not None:
        assert memo.hit_tokens > 0


def test_other_tenant_never_hits(small_cuts: None) -> None:
    """Tenant B sending A's exact prompt gets no hit (its own slot, its own digest key) and B's chain."""
    ring = KeyRing(MASTER)
    memo = _memo(ring)
    text = "shared system prompt, the same for both tenants. " * 20
    ids = memo.encode("acme", text)
    memo.chains("acme", ids)
    assert memo.encode("acme", text + "more").plan is not None and memo.hit_tokens > 0
    before = memo.hit_tokens
    ids_b = memo.encode("bravo", text)
    assert memo.hit_tokens == before  # no token of B's came from A's entries
    assert memo.chains("bravo", ids_b) == ring.prefix_chain("bravo", TOK.encode(text), 4, max_blocks=40)
    assert memo.chains("bravo", ids_b) is None  # a plan is used once


def test_rotation_never_serves_an_old_key(small_cuts: None) -> None:
    """During a rotation's grace the memo is not used (every chain the plain way); after it, the new kid has
    a new slot: no entry made under the old key is served, and chains are the new key's."""
    now = [0.0]
    ring = KeyRing(MASTER, grace_s=10, clock=lambda: now[0])
    memo = _memo(ring)
    text = "a long and repeated system prompt for this tenant. " * 10
    memo.chains("acme", memo.encode("acme", text))
    old_kid = ring.current("acme").kid
    ring.rotate_tenant("acme")
    in_grace = memo.encode("acme", text)
    assert type(in_grace) is not MemoIds and in_grace == TOK.encode(text)
    now[0] = 11.0  # grace over: one key again, the new one
    hits = memo.hit_tokens
    ids = memo.encode("acme", text)
    assert memo.hit_tokens == hits  # the old kid's entries were dropped with its slot
    got = memo.chains("acme", ids)
    assert got is not None and got.kid != old_kid
    assert got == ring.prefix_chain("acme", TOK.encode(text), 4, max_blocks=40)


def test_kid_change_between_lookup_and_hash_falls_back(small_cuts: None) -> None:
    """A rotation between the tokens and the chains: the memo answers None, the caller hashes plainly."""
    ring = KeyRing(MASTER, grace_s=0)
    memo = _memo(ring)
    text = "some prompt text that is long enough to cut. " * 5
    ids = memo.encode("acme", text)
    ring.rotate_tenant("acme")
    assert memo.chains("acme", ids) is None


def test_bounds_entries_bytes_tenants(small_cuts: None) -> None:
    """Many distinct prompts: each tenant holds at most its entries and bytes, at most ``tenants`` slots."""
    ring = KeyRing(MASTER)
    memo = _memo(ring, size=20_000, entries=50, tenants=3)
    for i in range(200):
        tid = f"t{i % 5}"
        text = f"prompt number {i} of tenant {tid}: " + "words and more words " * 8
        memo.chains(tid, memo.encode(tid, text))
    got = memo.counts()
    assert got["tenants"] <= 3
    assert got["bytes"] <= 3 * 20_000 and got["entries"] <= 3 * 50
    for slot in memo._slots.values():  # type: ignore[union-attr]
        assert len(slot.entries) <= 50 and slot.entries.currsize <= 20_000


def test_off_and_other_tokenizers_are_plain() -> None:
    """Size 0 turns it off; a tokenizer other than the word tokenizer is never memoised."""
    ring = KeyRing(MASTER)
    assert not _memo(ring, size=0).enabled

    class Other(WordTokenizer):
        pass

    other = PromptMemo(ring, Other(), block_size=4, max_prefix_blocks=None, bytes_per_tenant=1 << 20,
                       entries_per_tenant=10, tenants=1)
    assert not other.enabled
    text = "x " * 5000
    assert type(other.encode("acme", text)) is list
    with pytest.raises(ValueError):
        _memo(ring, entries=0)


def test_no_text_in_entries(small_cuts: None) -> None:
    """Entries hold offsets, ids and digests only: no piece of the prompt text."""
    ring = KeyRing(MASTER)
    memo = _memo(ring)
    text = "secretive-marker " * 40
    memo.chains("acme", memo.encode("acme", text))
    for slot in memo._slots.values():  # type: ignore[union-attr]
        for key, entry in slot.entries.items():
            assert b"secretive" not in key and all(not isinstance(x, str) for x in entry)
