"""The strict-number rule of JSON read from outside (RFC 8259 §6): no ``NaN``/``Infinity`` tokens and no
number literal beyond a double's range, both of which :mod:`json` reads by default (``NaN``, ``inf``) and
orjson refuses. One rule for every reader: the gateway's request bodies (:func:`gateway.json_fast.loads_checked`
with ``strict_numbers``; session 21, S21-newcomer-5, session 22, S21-fixnew-2) and the policy admin API's data
documents (:mod:`policy.admin`; session 23, S22-fixops-1). It lives in ``policy`` because ``policy`` never imports
``gateway`` while ``gateway`` may import ``policy`` (docs/architecture.md, dependencies point down).

Use as ``json.loads(text, parse_constant=refuse_constant, parse_float=finite_float)``; both raise a
:class:`NonFiniteLiteral` (a ``ValueError``), which :func:`json.loads` lets through unchanged.
"""
from __future__ import annotations

import math
from typing import NoReturn

__all__ = ["NonFiniteLiteral", "NumberOutOfRange", "finite_float", "refuse_constant"]


class NonFiniteLiteral(ValueError):
    """A ``NaN``, ``Infinity`` or ``-Infinity`` token outside strings: not JSON (RFC 8259 §6 has no
    such numbers), which :mod:`json` reads by default and orjson refuses (session 21, S21-newcomer-5)."""

    def __init__(self, literal: str) -> None:
        super().__init__(f"{literal} is not a JSON value (RFC 8259 allows no NaN or Infinity)")
        self.literal = literal


class NumberOutOfRange(NonFiniteLiteral):
    """A number literal beyond a double's range (``1e400``, ``-2e308``): :mod:`json` reads it as
    ``inf``, orjson refuses it ("number is infinity when parsed as double"). RFC 8259 §6 lets an
    implementation limit the range of numbers; an infinity is not a JSON value either way (session
    22, S21-fixnew-2: ``temperature: 1e400`` answered "should be less than or equal to 2").
    ``literal``: the number's first 32 characters."""

    def __init__(self, literal: str) -> None:
        ValueError.__init__(self, f"number out of range: {literal[:32]} overflows a double (RFC 8259 §6)")
        self.literal = literal[:32]


def finite_float(literal: str) -> float:
    """``parse_float`` for :func:`json.loads`: ``float(literal)``; raises :class:`NumberOutOfRange`
    when that is infinite (an underflow reads as 0.0 or a subnormal, as in orjson)."""
    value = float(literal)
    if math.isinf(value):
        raise NumberOutOfRange(literal)
    return value


def refuse_constant(literal: str) -> NoReturn:
    """``parse_constant`` for :func:`json.loads`: raises :class:`NonFiniteLiteral` for ``literal``."""
    raise NonFiniteLiteral(literal)
