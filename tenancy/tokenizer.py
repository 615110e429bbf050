"""Tokenizers shared by the gateway and the replica simulator.

The gateway needs token ids only to cut a prompt into fixed-size KV blocks and
hash them; it never needs the real model's ids unless the replicas run a real
model. Two implementations sit behind one :class:`Tokenizer` protocol:

* :class:`WordTokenizer` (the default): deterministic, needs no downloaded
  files. One token per word (``\\w+``) or per non-space symbol; the id is a
  32-bit BLAKE2b digest of the token text, so the same text always yields the
  same ids in every process.
* :class:`HuggingFaceTokenizer`: wraps a local ``tokenizer.json`` through the
  ``tokenizers`` package, for deployments whose replicas run a real model.

Chat requests are rendered to one string by :func:`render_chat` before
tokenizing, so gateway and simulator see identical token sequences.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "Tokenizer",
    "WordTokenizer",
    "HuggingFaceTokenizer",
    "TokenizerError",
    "render_chat",
    "prompt_text",
    "get_tokenizer",
]

_TOKEN_RE = re.compile(r"\w+|[^\w\s]", re.UNICODE)


class TokenizerError(ValueError):
    """Raised when a tokenizer cannot be built or a prompt cannot be rendered."""


@runtime_checkable
class Tokenizer(Protocol):
    """Turns text into token ids.

    ``name`` identifies the tokenizer (it is part of cache-compatibility
    checks). ``encode`` returns a list of non-negative ints.
    """

    name: str

    def encode(self, text: str) -> list[int]:
        """Return the token ids of ``text``."""
        ...


class WordTokenizer:
    """Deterministic word-level tokenizer; no files, and by default no state
    shared between calls.

    Each match of ``\\w+|[^\\w\\s]`` is one token; its id is the first 4 bytes
    (big-endian) of ``BLAKE2b(token, digest_size=4)``. Repeated words *within
    one* :meth:`encode` call are hashed once.

    ``cache_size`` > 0 also memoises ids *across* calls in a bounded dict.
    Never do that in the gateway: a memo shared by all tenants is a timing
    side channel (a word another tenant sent recently encodes faster, which
    the cross-tenant timing probe in ``tests/security/test_timing_probe.py``
    measured). The default, 0, keeps no state between calls.
    """

    name = "word-blake2b-32"

    def __init__(self, cache_size: int = 0) -> None:
        if cache_size < 0:
            raise ValueError("cache_size must be >= 0")
        self._cache: dict[str, int] = {}
        self._cache_size = cache_size

    def token_id(self, word: str) -> int:
        """Return the 32-bit id of one token string."""
        tid = self._cache.get(word) if self._cache_size else None
        if tid is None:
            tid = int.from_bytes(hashlib.blake2b(word.encode("utf-8"), digest_size=4).digest(), "big")
            if len(self._cache) < self._cache_size:
                self._cache[word] = tid
        return tid

    def encode(self, text: str) -> list[int]:
        """Return one id per word or symbol of ``text`` (empty list for blank text)."""
        tid = self.token_id
        local: dict[str, int] = {}
        out: list[int] = []
        append = out.append
        for m in _TOKEN_RE.findall(text):
            v = local.get(m)
            if v is None:
                v = local[m] = tid(m)
            append(v)
        return out


class HuggingFaceTokenizer:
    """Adapter for a local HuggingFace ``tokenizer.json`` (package ``tokenizers``).

    Raises :class:`TokenizerError` if the file cannot be loaded. Nothing is
    downloaded: only a local path is accepted.
    """

    def __init__(self, path: str) -> None:
        try:
            from tokenizers import Tokenizer as _HfTokenizer
        except ImportError as exc:  # pragma: no cover - dependency is declared
            raise TokenizerError("package 'tokenizers' is not installed") from exc
        try:
            self._tok = _HfTokenizer.from_file(path)
        except Exception as exc:
            raise TokenizerError(f"cannot load tokenizer file {path!r}: {exc}") from exc
        self.name = f"hf:{path}"

    def encode(self, text: str) -> list[int]:
        """Return the model's token ids for ``text`` (no special tokens added)."""
        return list(self._tok.encode(text, add_special_tokens=False).ids)


def _content_text(content: Any) -> str:
    """Flatten an OpenAI message ``content`` (string or list of text parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for part in content:
            if isinstance(part, Mapping) and part.get("type") == "text" and isinstance(part.get("text"), str):
                parts.append(part["text"])
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
