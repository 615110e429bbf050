"""Tokenizers shared by the gateway and the replica simulator.

The gateway needs token ids only to cut a prompt into fixed-size KV blocks and
hash them; it never needs the real model's ids unless the replicas run a real
model. Two implementations sit behind one :class:`Tokenizer` protocol:

* :class:`WordTokenizer` (the default): deterministic, needs no downloaded
  files. One token per word (``\\w+``, at most :data:`MAX_TOKEN_CHARS`
  characters: a longer word is split into pieces of that length) or per
  non-space symbol; a whitespace run longer than :data:`MAX_TOKEN_CHARS` is
  split into tokens too (shorter runs separate tokens and count nothing).
  The id is the CRC-32 of the token text, so the same text always yields
  the same ids in every process.
* :class:`HuggingFaceTokenizer` (:mod:`tenancy.hf_tokenizer`): wraps a local
  ``tokenizer.json`` through the ``tokenizers`` package, for deployments whose
  replicas run a real model.

Chat requests are rendered to one string by :func:`render_chat` before
tokenizing, so gateway and simulator see identical token sequences.

Bounded work (issue 12): ``encode(text, limit)`` stops after ``limit + 1``
tokens, and every tokenizer states :meth:`~Tokenizer.max_text_bytes`, an upper
bound on the UTF-8 size of a text of at most ``n`` tokens, so the gateway can
refuse a too-large prompt by its size before tokenizing anything
(docs/tenancy.md, "Request bounds").
"""

from __future__ import annotations

import itertools
import re
import zlib
from collections.abc import Iterable, Mapping
from typing import Any, Protocol, runtime_checkable

from tenancy.hf_tokenizer import HuggingFaceTokenizer
from tenancy.tokenizer_base import MIN_MESSAGE_BYTES, TokenizerError
from tenancy.plain_words import MAX_TOKEN_CHARS as _PLAIN_MAX_CHARS
from tenancy.plain_words import ascii_tokens, latin1_tokens

__all__ = [
    "Tokenizer",
    "WordTokenizer",
    "HuggingFaceTokenizer",
    "TokenizerError",
    "render_chat",
    "prompt_text",
    "get_tokenizer",
    "MAX_TOKEN_CHARS",
    "FAST_SCAN_CHARS_PER_TOKEN",
    "MIN_MESSAGE_BYTES",
]

#: Longest word-tokenizer token, in characters (longer words and whitespace runs are split).
MAX_TOKEN_CHARS = 64
assert _PLAIN_MAX_CHARS == MAX_TOKEN_CHARS
#: ``encode(text, limit)`` scans at most this many characters per token of ``limit + 1`` in one C-level
#: pass (s4: was :data:`MAX_TOKEN_CHARS`, so 64 one-character tokens per allowed token); a text whose
#: slice holds fewer tokens is read on in slices of that size (s5; s4: match by match).
FAST_SCAN_CHARS_PER_TOKEN = 4
# a word piece, a symbol, or a whitespace run too long to be a free separator
# (a blank run is tried only where it starts, ``(?<!\s)``: without it every position inside a run of
# <= 64 blanks rescanned the rest of the run, 64x the work per blank; review R4b-1. Same tokens: a
# match can never start inside a run, since a run long enough is matched whole from its start.)
_TOKEN_RE = re.compile(r"\w{1,%d}|[^\w\s]|(?<!\s)\s{%d,}" % (MAX_TOKEN_CHARS, MAX_TOKEN_CHARS + 1), re.UNICODE)
# the same tokens of an ASCII text, scanned as bytes (session 3: the tokens need no str.encode each,
# ~25% less per prompt). On ASCII, str's \w is [A-Za-z0-9_] and str's \s is bytes' \s plus \x1c-\x1f.
_ASCII_TOKEN_RE = re.compile(rb"[A-Za-z0-9_]{1,%d}|[^A-Za-z0-9_\s\x1c-\x1f]|(?<![\s\x1c-\x1f])[\s\x1c-\x1f]{%d,}"
                             % (MAX_TOKEN_CHARS, MAX_TOKEN_CHARS + 1))
# the same tokens again, for the part of a long text read after its first slice (session 5, R4b-1): a
# free blank run (<= 64) is read in one possessive step as the prefix of the token after it (a match
# per token, no failed try per blank: ~10x less on 64-blank runs), the token is the group; a run too
# long to be free fails the prefix (``(?!\s)``) and is the ``\s{65,}`` token. Not the first slice's
# pattern: per one-character token it costs ~1.4x (the prefix is tried before each token).
_SPARSE_TOKEN_RE = re.compile(r"(?:\s{1,%d}+(?!\s))?(\w{1,%d}|[^\w\s]|\s{%d,})"
                              % (MAX_TOKEN_CHARS, MAX_TOKEN_CHARS, MAX_TOKEN_CHARS + 1))
_ASCII_SPARSE_TOKEN_RE = re.compile(rb"(?:[\s\x1c-\x1f]{1,%d}+(?![\s\x1c-\x1f]))?"
                                    rb"([A-Za-z0-9_]{1,%d}|[^A-Za-z0-9_\s\x1c-\x1f]|[\s\x1c-\x1f]{%d,})"
                                    % (MAX_TOKEN_CHARS, MAX_TOKEN_CHARS, MAX_TOKEN_CHARS + 1))
# the same tokens of a text of Latin-1 characters only (U+0000..U+00FF), scanned as its Latin-1 bytes
# (session 6, review R5b-4: NBSP/NEL blank runs cost ~1.5x ASCII ones through the str patterns, whose
# \s and \w test each character's Unicode category; here both are byte sets, as in the ASCII patterns).
# The sets are str's \w and \s restricted to Latin-1, computed from them, so the tokens are the same.
_L1_WORD = re.escape("".join(chr(c) for c in range(256) if re.match(r"\w", chr(c))).encode("latin-1"))
_L1_BLANK = re.escape("".join(chr(c) for c in range(256) if re.match(r"\s", chr(c))).encode("latin-1"))
_LATIN1_TOKEN_RE = re.compile(b"[%s]{1,%d}|[^%s%s]|(?<![%s])[%s]{%d,}" % (
    _L1_WORD, MAX_TOKEN_CHARS, _L1_WORD, _L1_BLANK, _L1_BLANK, _L1_BLANK, MAX_TOKEN_CHARS + 1))
_LATIN1_SPARSE_TOKEN_RE = re.compile(b"(?:[%s]{1,%d}+(?![%s]))?([%s]{1,%d}|[^%s%s]|[%s]{%d,})" % (
    _L1_BLANK, MAX_TOKEN_CHARS, _L1_BLANK, _L1_WORD, MAX_TOKEN_CHARS, _L1_WORD, _L1_BLANK, _L1_BLANK,
    MAX_TOKEN_CHARS + 1))
# one word run, one blank run or one symbol: no token crosses its end, so a text cut there tokenizes
# as the two halves' tokens in a row (a cut inside a word or a blank run may change the tokens)
_CLASS_RUN_RE = re.compile(r"\w+|\s+|[^\w\s]")


def _find_tokens(text: str, first: bool) -> list[str] | list[bytes]:
    """The tokens of ``text`` (long blank runs not yet cut) with the first-slice (``first``) or the
    sparse patterns: ASCII bytes for an ASCII text, str for a Latin-1 text (scanned as its Latin-1
    bytes), else the str patterns."""
    if text.isascii():
        return (_ASCII_TOKEN_RE if first else _ASCII_SPARSE_TOKEN_RE).findall(text.encode("ascii"))
    try:
        raw = text.encode("latin-1")  # a copy for a text of Latin-1 characters only; fails fast otherwise
    except UnicodeEncodeError:
        return (_TOKEN_RE if first else _SPARSE_TOKEN_RE).findall(text)
    got = (_LATIN1_TOKEN_RE if first else _LATIN1_SPARSE_TOKEN_RE).findall(raw)
    if not got:
        return []
    if max(map(len, got)) > MAX_TOKEN_CHARS:  # a long blank run may hold a line break: one by one
        return list(map(bytes.decode, got, itertools.repeat("latin-1")))
    # no other token holds a line break: decode all at once, split again
    return b"\n".join(got).decode("latin-1").split("\n")


def _first_tokens(text: str, stop: int) -> list[str] | list[bytes]:
    """The tokens of the start of ``text`` (long blank runs not yet cut): more than ``stop``, or all.

    Reads ``text`` in slices that end where no token crosses (:data:`_CLASS_RUN_RE`), so the
    slices' tokens in a row are the text's: the first of about :data:`FAST_SCAN_CHARS_PER_TOKEN` x
    ``stop`` characters (:data:`_TOKEN_RE`), then slices of that size (:data:`_SPARSE_TOKEN_RE`: a
    text that needed them has at least 4 characters per token) until more than ``stop`` tokens
    are found. Never past ``2 x 64 x (stop + 1) + 1`` characters: ``stop`` tokens and the free blank
    runs before them fit in ``128 x stop``, so a cut there changes none of the first ``stop`` tokens
    once long blank runs are cut into pieces. Work O(stop) (s5, review R4b-1: before, everything after
    the first slice went match by match with :data:`_TOKEN_RE`, ~37 ms for 64-blank-separated
    tokens at ``stop`` 8193; now ~4 ms).
    """
    cap = min(len(text), 2 * MAX_TOKEN_CHARS * (stop + 1) + 1)
    size = FAST_SCAN_CHARS_PER_TOKEN * stop
    first = True
    parts: list[Any] = []
    pos = count = 0
    while pos < cap:
        end = pos + size
        end = cap if end >= cap else _CLASS_RUN_RE.match(text, end - 1, cap).end()
        got = _find_tokens(text[pos:end], first)
        parts.append(got)
        count += len(got)
        if count > stop:
            break
        pos, first = end, False
    if len(parts) == 1:
        return parts[0]
    if len({type(p[0]) for p in parts if p}) > 1:  # ASCII and other slices: all str
        parts = [list(map(bytes.decode, p)) if p and isinstance(p[0], bytes) else p for p in parts]
    return list(itertools.chain.from_iterable(parts))


@runtime_checkable
class Tokenizer(Protocol):
    """Turns text into token ids.

    ``name`` identifies the tokenizer (it is part of cache-compatibility
    checks). ``encode`` returns a list of non-negative ints.
    """

    name: str

    def encode(self, text: str, limit: int | None = None) -> list[int]:
        """Return the token ids of ``text``.

        With ``limit``: stop early; a result longer than ``limit`` (at most
        ``limit + 1`` ids) only says "more than ``limit`` tokens" (its ids
        are then unspecified).
        """
        ...

    def max_text_bytes(self, tokens: int) -> int:
        """Upper bound on the UTF-8 bytes of a text that encodes to at most ``tokens`` tokens."""
        ...

    def max_messages(self, tokens: int) -> int:
        """Upper bound on the chat messages whose rendering fits in ``tokens`` tokens."""
        ...


class WordTokenizer:
    """Deterministic word-level tokenizer; no files, no state shared between calls.

    Tokens are, left to right: a run of 1..64 word characters (``\\w``; a
    longer word becomes several 64-character tokens and a remainder), one
    symbol (``[^\\w\\s]``), or a whitespace run longer than 64 characters
    (cut into 64-character tokens and a remainder); whitespace runs of up to
    64 characters only separate tokens. Each token's id is the CRC-32
    (``zlib.crc32``, unsigned) of its UTF-8 bytes, computed by C-level
    iteration over the token list (session 3: before, a Python loop took a
    32-bit BLAKE2b digest per token, name ``word-blake2b-32``; the token
    strings are unchanged, the ids and so every prefix key changed, hence
    the new :attr:`name`). An id only cuts prompts into blocks for the
    tenant-keyed HMAC chain (:mod:`tenancy.prefix`): 32-bit ids collide by
    construction under either hash, and a collision can only make one
    tenant's own prompts share a routing key.

    The tokenizer keeps no memo of ids across calls: one shared by all
    tenants is a timing side channel (a word another tenant sent recently
    encodes faster; measured by ``tests/security/test_timing_probe.py``).
    """

    name = "word-crc32-v2"

    @staticmethod
    def token_id(word: str) -> int:
        """Return the 32-bit id of one token string (CRC-32 of its UTF-8 bytes)."""
        return zlib.crc32(word.encode("utf-8"))

    def encode(self, text: str, limit: int | None = None) -> list[int]:
        """Return one id per token of ``text`` (empty list for blank text).

        With ``limit`` (>= 0) the scan stops after ``limit + 1`` tokens: it reads
        at most about :data:`FAST_SCAN_CHARS_PER_TOKEN` x (``limit + 1``) tokens
        and ``2 x 64 x (limit + 2)`` characters (:func:`_first_tokens`), so the
        work is O(limit) whatever the size of ``text``: a result longer than
        ``limit`` means "more than ``limit`` tokens" (its ids are still the
        first ``limit + 1`` of the whole text's). Raises
        ``UnicodeEncodeError`` for a lone surrogate in a token.
        """
        stop = None if limit is None else max(0, limit) + 1
        found: list[str] | list[bytes]
        if stop is None or len(text) <= FAST_SCAN_CHARS_PER_TOKEN * stop:
            # ASCII words, symbols and blanks: bytes.split() of the text with its symbols spaced out gives
            # the pattern's tokens (tenancy/plain_words.py; s8: words and blanks only, s9: prose too)
            # (s9: a Latin-1 text the same way on its Latin-1 bytes; its tokens come back as UTF-8)
            words = ascii_tokens(text.encode("ascii")) if text.isascii() else latin1_tokens(text)
            if words is not None:
                if stop is not None:
                    del words[stop:]
                return list(map(zlib.crc32, words))
            # a text this short holds O(stop) tokens: one C-level scan (issue 14: ~2x faster)
            found = _find_tokens(text, True)
        else:
            found = _first_tokens(text, stop)
        if stop is not None:
            del found[stop:]
        if not found:
            return []
        step = MAX_TOKEN_CHARS
        if max(map(len, found)) > step:  # only a long blank run is longer: 64-character pieces
            pieces: list[Any] = []
            for m in found:
                if len(m) > step:
                    pieces.extend(m[i:i + step] for i in range(0, min(len(m), step * (stop or len(m))), step))
                else:
                    pieces.append(m)
            found = pieces
            if stop is not None:
                del found[stop:]
            if isinstance(found[0], str):
                return list(map(zlib.crc32, map(str.encode, found)))
        # C-level iteration only (session 3: ~5x less than a Python loop with BLAKE2b per token)
        if isinstance(found[0], bytes):
            return list(map(zlib.crc32, found))
        # no token holds a line break (only a long blank run can): encode all at once, split again
        return list(map(zlib.crc32, "\n".join(found).encode("utf-8").split(b"\n")))

    def max_text_bytes(self, tokens: int) -> int:
        """``7 * 64 * (tokens + 1)``: the most UTF-8 bytes a text of at most ``tokens`` tokens can hold.

        Derivation: a token is at most 64 characters of at most 4 UTF-8
        bytes (256 bytes); a free separator is a whitespace run of at most
        64 characters, each at most 3 bytes (Python's ``\\s`` holds no
        4-byte character): at most ``tokens + 1`` of them, 192 bytes each.
        So bytes <= 256 t + 192 (t + 1) <= 448 (t + 1).
        """
        return 7 * MAX_TOKEN_CHARS * (max(0, tokens) + 1)

    def max_messages(self, tokens: int) -> int:
        """``tokens // 5``: every rendered message holds the 5 tokens ``<`` ``|`` role ``|`` ``>``."""
        return max(1, max(0, tokens) // 5)

    def max_json_values(self, tokens: int) -> int:
        """``tokens``: the most JSON values and object keys a compact JSON rendering (no blanks, as
        ``json.dumps(..., separators=(",", ":"))`` writes it) of at most ``tokens`` tokens can hold.

        Derivation: each value or key starts with a character no token of the one before it holds: ``"``,
        ``{``, ``[`` (one symbol token each), ``-`` (a symbol) or a word character (``true``, ``false``,
        ``null``, a digit) after a symbol (``,``, ``:``, ``[``, ``{``), which ends any word run. So every
        value and key starts a token of its own (session 22, S22-review-4). Optional method: a tokenizer
        without it is bounded by :meth:`max_text_bytes` only (:func:`tenancy.bounds.request_bounds`).
        """
        return max(0, tokens)


def _content_text(content: Any) -> str:
    """Flatten an OpenAI message ``content`` (string or list of text parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for part in content:  # ``type(part) is dict`` first: the ABC check costs ~0.1 us a part (S20-R3)
            if ((type(part) is dict or isinstance(part, Mapping)) and part.get("type") == "text"
                    and isinstance(text := part.get("text"), str)):
                parts.append(text)
            else:
                raise TokenizerError("only text content parts are supported")
        return "\n".join(parts)
    raise TokenizerError("message content must be a string or a list of text parts")


def render_chat(messages: Iterable[Mapping[str, Any]]) -> str:
    """Render OpenAI chat ``messages`` into one prompt string.

    Template (documented, stable across versions so that cached prefixes stay
    valid): each message becomes ``"<|role|>\\n" + content + "\\n"``, in order.
    Earlier turns therefore form a byte-identical prefix of later requests of
    the same conversation. Raises :class:`TokenizerError` on a malformed
    message.
    """
    out: list[str] = []
    for msg in messages:
        if not isinstance(msg, Mapping):
            raise TokenizerError("each message must be an object")
        role = msg.get("role")
        if not isinstance(role, str) or not role:
            raise TokenizerError("each message needs a string 'role'")
        out.append(f"<|{role}|>\n{_content_text(msg.get('content'))}\n")
    return "".join(out)


def prompt_text(endpoint: str, body: Mapping[str, Any]) -> str:
    """Return the text to tokenize for an OpenAI request body.

    ``endpoint`` is ``"chat"`` (uses ``messages``) or ``"completions"``
    (uses ``prompt``, a string or a list of strings joined by newlines).
    Raises :class:`TokenizerError` for a body that has neither form.
    """
    if endpoint == "chat":
        return render_chat(body.get("messages") or [])
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
        return "\n".join(prompt)
    raise TokenizerError("'prompt' must be a string or a list of strings")


def get_tokenizer(spec: str | None = None) -> Tokenizer:
    """Build a tokenizer from a config value.

    ``None`` or ``"word"`` gives :class:`WordTokenizer`; ``"hf:/path/to/tokenizer.json"``
    gives :class:`HuggingFaceTokenizer`. Raises :class:`TokenizerError` otherwise.
    """
    if spec in (None, "", "word"):
        return WordTokenizer()
    if spec.startswith("hf:"):
        return HuggingFaceTokenizer(spec[3:])
    raise TokenizerError(f"unknown tokenizer {spec!r} (use 'word' or 'hf:/path/tokenizer.json')")
