"""Per-tenant memo of the prompt-side work for a prompt's leading text (issue 14, session 21).

Tokenizing a prompt (~0.13 µs per word token) and hashing its tenant-keyed block chain (~1.3 µs per
16-token KV block, :mod:`tenancy.prefix`) are at Python's floor per token; real prompts resend their
leading text (a tenant's system prompt; in multi-turn chat the whole earlier conversation). The memo
keeps, per tenant and key version, the token ids and chain digests of the *segments* of prompts the
tenant sent, so a prompt that starts with text the same tenant sent recently tokenizes and hashes only
its new part.

Cut points (exactness). A prompt is cut into segments of about :data:`CUT_CHARS` characters: cut
``k`` is the end of the first *class run* (a word run ``\\w+``, a blank run ``\\s+`` or one symbol
``[^\\w\\s]``, with ``str``'s Unicode classes: :data:`tenancy.tokenizer._CLASS_RUN_RE`'s runs) that
ends at or after ``cut(k-1) + CUT_CHARS`` and within the next :data:`CUT_CHARS` characters, and is
followed by a character of the text (no run end there: no more cuts). The word tokenizer's tokens
never cross a run end (a word token is word characters only, a symbol one character, a long-blank token
blanks only, and the blank pattern's ``(?<!\\s)`` sees a non-blank or the text start on both sides of the
cut), so ``encode(a + b) == encode(a) + encode(b)`` for a cut between ``a`` and ``b``: the tokenizer
itself reads long texts in slices cut there (:func:`tenancy.tokenizer._first_tokens`). Proven by
hypothesis against the memo-less functions (tests/tenancy/test_s21_prompt_memo.py). The cut choice depends
only on the text up to one character past the cut, so two prompts sharing leading text share its cuts.

Entries. Cut ``k``'s entry is stored under a keyed digest of the text up to the cut (BLAKE2b-128 keyed
with a subkey of the tenant's current prefix key and its kid, so nobody without the key can compute
it) and holds: the segment's first and last character offsets and first token index (checked on a hit),
the segment's token ids (4 bytes each) and the chain digests of the KV blocks that end inside it. A
lookup walks the new prompt's cuts in order while their digests hit (each hit is the exact text of the
stored prefix, whose segments are then exactly the stored ones), then tokenizes the rest segment by
segment; the chain resumes from the last hit digest (:func:`tenancy.prefix.block_hash_chain`'s
``seed``) when :meth:`PromptMemo.chains` hashes it, and stores the new segments' entries then (only
admitted prompts are stored). Prompt text is never stored, logged or exported: only keyed digests,
offsets and token ids (as held by the request in flight).

Tenancy. One slot per tenant, holding one key version: a slot made under another kid is replaced (its
entries dropped) the first time the tenant's current kid differs; during a rotation's grace (more than
one recognised key) the memo is not used at all, and :meth:`PromptMemo.chains` answers None (the caller
hashes as without the memo) unless the kid at hashing time is the one the lookup used. No entry of one
tenant is reachable from another's lookup (separate slot, separate digest key).

Bounds. Each slot is a :class:`cachetools.LRUCache` of at most ``bytes_per_tenant`` bytes and
``entries_per_tenant`` entries (an entry counts at least ``bytes_per_tenant // entries_per_tenant``
bytes); the slots are an LRU of at most ``tenants`` tenants. So the memo holds at most
``tenants x bytes_per_tenant`` bytes of entries, and a tenant evicts only its own entries (another
tenant's slot only by being one of more than ``tenants`` tenants active in turn). Work per prompt: a
hit costs the keyed hash of its segment and one dict lookup, less than tokenizing and hashing it; a
miss adds one hash pass over the text, one cut search and one tokenizer call per segment
(bench/results/tokmemo-s21-*.md). With ``limit`` the walk stops once more than ``limit`` tokens are
known, as :meth:`tenancy.tokenizer.WordTokenizer.encode` does, so the work stays O(limit + CUT_CHARS).

Not thread-safe: the gateway calls it from its event loop only (the HuggingFace tokenizer, the only one
run off the loop, does not use the memo).
"""

from __future__ import annotations

import hashlib
import re
from array import array
from collections.abc import Sequence
from typing import Any

from cachetools import LRUCache

from tenancy.key_derivation import PrefixChains, TenantKey
from tenancy.keys import KeyRing
from tenancy.prefix import DEFAULT_DIGEST_SIZE, block_hash_chain, hmac_sha256
from tenancy.tokenizer import MAX_TOKEN_CHARS, Tokenizer, WordTokenizer

__all__ = ["PromptMemo", "MemoIds", "CUT_CHARS", "ENTRY_OVERHEAD_BYTES", "next_cut"]

#: characters between cuts: a segment holds CUT_CHARS to 2 x CUT_CHARS characters (the last one fewer)
CUT_CHARS = 1024
#: bytes an entry counts beyond its token ids (4 each) and chain digests (tuple, offsets, dict slot)
ENTRY_OVERHEAD_BYTES = 256
# the last character of a class run followed by another character: a symbol, a word character before a
# non-word one, a blank before a non-blank (tenancy.tokenizer._CLASS_RUN_RE's run ends, str classes)
_RUN_END_RE = re.compile(r"[^\w\s](?=.)|\w(?=\W)|\s(?=\S)", re.S)
_PERSON = b"pg-prompt-memo"
assert array("I").itemsize == 4  # token ids are 32-bit (CRC-32)


def next_cut(text: str, pos: int) -> int | None:
    """The cut after ``pos`` (a cut or 0) in ``text``: the end of the first class run ending at index
    ``>= pos + CUT_CHARS`` (characters) and before ``pos + 2 x CUT_CHARS``, followed by a character; None
    when there is none. Reads at most :data:`CUT_CHARS` + 1 characters. Raises nothing."""
    start = pos + CUT_CHARS - 1
    m = _RUN_END_RE.search(text, start, min(len(text), start + CUT_CHARS + 1))
    return None if m is None else m.end()


class MemoIds(list):  # type: ignore[type-arg]
    """The token ids of one prompt (a ``list[int]``, equal to the tokenizer's), carrying the memo's
    plan for :meth:`PromptMemo.chains` (``plan``: None when nothing is left to do)."""

    __slots__ = ("plan",)


class _Plan:
    """What :meth:`PromptMemo.chains` needs: the lookup's slot and kid, the hit's chain digests, and the
    new entries ``(digest, end char, tokens up to it)`` to store."""

    __slots__ = ("slot", "kid", "hit_chain", "new")

    def __init__(self, slot: _Slot, kid: str, hit_chain: list[bytes], new: list[tuple[bytes, int, int]]):
        self.slot, self.kid, self.hit_chain, self.new = slot, kid, hit_chain, new


class _Slot:
    """One tenant's entries under one key version: ``hasher`` (keyed BLAKE2b, copied per lookup) and
    ``entries`` (digest -> ``(end char, ids up to it, chain digests of its full blocks)``)."""

    __slots__ = ("kid", "hasher", "entries")

    def __init__(self, key: TenantKey, max_bytes: int, min_entry_bytes: int) -> None:
        self.kid = key.kid
        subkey = hmac_sha256(key.key, b"pg-prompt-memo-v1|" + key.kid.encode("utf-8"))
        self.hasher = hashlib.blake2b(key=subkey, digest_size=16, person=_PERSON)
        self.entries: LRUCache[bytes, tuple[Any, ...]] = LRUCache(
            maxsize=max_bytes, getsizeof=lambda e: max(min_entry_bytes, len(e[1]) * 4 + len(e[2]) * 32
                                                       + ENTRY_OVERHEAD_BYTES))


class PromptMemo:
    """The per-tenant prompt memo (module docstring) over ``keyring`` and ``tokenizer``.

    ``block_size`` (tokens) and ``max_prefix_blocks`` are ``routing``'s, as
    :class:`gateway.prefix_keys.PrefixKeys` hashes with them; ``bytes_per_tenant`` (0: off),
    ``entries_per_tenant`` and ``tenants`` bound it. A tokenizer other than
    :class:`~tenancy.tokenizer.WordTokenizer` is never memoised (its compositionality is not known).
    ``hit_tokens`` / ``tokens`` count the tokens served from entries and all tokens looked up.
    Raises :class:`ValueError` for a negative bound or ``entries_per_tenant`` < 1.
    """

    def __init__(self, keyring: KeyRing, tokenizer: Tokenizer, *, block_size: int, max_prefix_blocks: int | None,
                 bytes_per_tenant: int, entries_per_tenant: int, tenants: int) -> None:
        if bytes_per_tenant < 0 or entries_per_tenant < 1 or tenants < 1:
            raise ValueError("prompt memo bounds: bytes_per_tenant >= 0, entries_per_tenant >= 1, tenants >= 1")
        self.keyring = keyring
        self.tokenizer = tokenizer
        self.block_size = block_size
        self.max_prefix_blocks = max_prefix_blocks
        self.bytes_per_tenant = bytes_per_tenant
        self.min_entry_bytes = max(1, bytes_per_tenant // entries_per_tenant)
        on = bytes_per_tenant > 0 and type(tokenizer) is WordTokenizer
        self._slots: LRUCache[str, _Slot] | None = LRUCache(maxsize=tenants) if on else None
        self.hit_tokens = self.tokens = 0

    @property
    def enabled(self) -> bool:
        """True when prompts are memoised (a positive size and the word tokenizer)."""
        return self._slots is not None

    def _slot(self, tenant_id: str, key: TenantKey) -> _Slot:
        """The tenant's slot under ``key`` (a slot of another kid is replaced, its entries dropped)."""
        slots = self._slots
        assert slots is not None
        slot = slots.get(tenant_id)
        if slot is None or slot.kid != key.kid:
            slot = slots[tenant_id] = _Slot(key, self.bytes_per_tenant, self.min_entry_bytes)
        return slot

    def encode(self, tenant_id: str, text: str, limit: int | None = None) -> list[int]:
        """``self.tokenizer.encode(text, limit)`` (same ids, same ``limit`` meaning: a result longer than
        ``limit`` says "more than ``limit`` tokens"), the longest leading part of ``text`` ending at a cut
        served from ``tenant_id``'s entries; a :class:`MemoIds` with a plan for :meth:`chains` when the whole
        text was read. The plain call for a short text (no cut), a rotation in grace, or the memo off. With
        ``limit``, cuts past ``2 x 64 x (limit + 2)`` characters are not read (the tokenizer's own bound).
        Raises what the tokenizer raises (``UnicodeEncodeError`` for a lone surrogate in a token)."""
        tok = self.tokenizer
        if self._slots is None or len(text) < CUT_CHARS + 1:
            return tok.encode(text, limit)
        keys = self.keyring.lookup_keys(tenant_id)
        if len(keys) != 1:  # a rotation in grace: every chain the plain way
            return tok.encode(text, limit)
        key = keys[0]
        slot = self._slot(tenant_id, key)
        entries = slot.entries
        stop = None if limit is None else max(0, limit) + 1
        cap = len(text) if stop is None else min(len(text), 2 * MAX_TOKEN_CHARS * (stop + 1) + 1)
        cuts: list[int] = []
        digests: list[bytes] = []
        h = slot.hasher.copy()
        pos, cut = 0, next_cut(text, 0)
        while cut is not None and cut < cap:  # the keyed digest of the text up to each cut: one pass
            h.update(text[pos:cut].encode("utf-8", "surrogatepass"))
            cuts.append(cut)
            digests.append(h.digest())
            pos, cut = cut, next_cut(text, cut)
        hit = len(cuts) - 1
        while hit >= 0 and (digests[hit] not in entries or entries[digests[hit]][0] != cuts[hit]):
            hit -= 1  # the longest stored prefix first
        if hit >= 0:
            e = entries[digests[hit]]
            ids, chain, pos = MemoIds(e[1]), list(e[2]), cuts[hit]
        else:
            ids, chain, pos = MemoIds(), [], 0
        ids.plan = None
        hits = len(ids)
        if stop is not None and hits >= stop:
            del ids[stop:]
            return ids
        new: list[tuple[bytes, int, int]] = []
        for j in range(hit + 1, len(cuts)):  # entries at cuts 1, 2, 4, 8, ... and the last one
            if j & (j + 1) == 0 or j == len(cuts) - 1:
                ids.extend(tok.encode(text[pos:cuts[j]], None if stop is None else stop - len(ids) - 1))
                if stop is not None and len(ids) >= stop:
                    del ids[stop:]
                    return ids
                new.append((digests[j], cuts[j], len(ids)))
                pos = cuts[j]
        ids.extend(tok.encode(text[pos:], None if stop is None else stop - len(ids) - 1))
        if stop is not None and len(ids) >= stop:
            del ids[stop:]
            return ids
        self.hit_tokens += hits
        self.tokens += len(ids)
        ids.plan = _Plan(slot, key.kid, chain, new)
        return ids

    def chains(self, tenant_id: str, tokens: Sequence[int]) -> PrefixChains | None:
        """The chains of ``tokens`` (a :class:`MemoIds` of :meth:`encode` for ``tenant_id``) as
        :meth:`tenancy.keys.KeyRing.prefix_chain` gives them (``block_size``, ``max_prefix_blocks``),
        resumed after the hit's blocks, and the new entries stored; None (the caller hashes the plain way)
        for other tokens, a used plan, a rotation in grace or a kid other than the lookup's. Raises
        :class:`ValueError` as :func:`tenancy.prefix.block_hash_chain`."""
        plan = tokens.plan if type(tokens) is MemoIds else None
        if plan is None:
            return None
        tokens.plan = None  # type: ignore[attr-defined]  # one use: a plan's entries are stored once
        keys = self.keyring.lookup_keys(tenant_id)
        if len(keys) != 1 or keys[0].kid != plan.kid:
            return None
        key, bs, hit = keys[0], self.block_size, plan.hit_chain
        chain = hit + block_hash_chain(key.key, tokens, bs, key_id=key.kid, max_blocks=self.max_prefix_blocks,
                                       first_block=len(hit), seed=hit[-1] if hit else None)
        entries = plan.slot.entries
        for digest, end, n in plan.new:
            try:
                entries[digest] = (end, array("I", tokens[:n]), tuple(chain[:n // bs]))
            except ValueError:  # larger than the tenant's whole share: not stored
                pass
        return PrefixChains(key.kid, tuple(chain))

    def counts(self) -> dict[str, int]:
        """``{"tenants", "entries", "bytes", "hit_tokens", "tokens"}``: sizes (bytes as counted for the
        bound) and the token counters; no text, no digest."""
        slots = list(self._slots.values()) if self._slots is not None else []
        return {"tenants": len(slots), "entries": sum(len(s.entries) for s in slots),
                "bytes": sum(s.entries.currsize for s in slots), "hit_tokens": self.hit_tokens, "tokens": self.tokens}
