"""Issue 14 (session 23, helper "cuts"): the hand-written ``__init__`` of the per-request value types
(:mod:`routing.types`: ``ReplicaLoad``, ``RouteRequest``, ``Candidate``, ``RouteChoice``;
:class:`tenancy.key_derivation.PrefixChains`) builds the same object as the ``__init__`` the frozen
dataclass generates from the same fields: the same signature (names, order, defaults; ``RouteChoice``'s
``scores`` a new dict each), the same fields in the instance dictionary, equal, same hash and repr, and still
frozen. The reference is a frozen dataclass made from each class's own ``fields()``, so a field added later
without its ``__init__`` line fails here."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routing.types import Candidate, ReplicaLoad, RouteChoice, RouteRequest
from tenancy.key_derivation import PrefixChains

CLASSES = (ReplicaLoad, RouteRequest, Candidate, RouteChoice, PrefixChains)


def _reference(cls: type) -> type:
    """A frozen dataclass of ``cls``'s fields with the generated ``__init__`` (the type before session 23)."""
    spec = [(f.name, f.type, dataclasses.field(default=f.default, default_factory=f.default_factory))
            for f in dataclasses.fields(cls)]
    return dataclasses.make_dataclass(cls.__name__, spec, frozen=True)


REFERENCES = {cls: _reference(cls) for cls in CLASSES}

_values = st.one_of(st.integers(-2**40, 2**40), st.text(max_size=8), st.binary(max_size=8), st.none(),
                    st.booleans(), st.tuples(st.binary(max_size=4)),
                    st.dictionaries(st.text(max_size=3), st.floats(allow_nan=False), max_size=3))


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_signature_is_the_fields_in_order_with_their_defaults(cls: type) -> None:
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    fields = dataclasses.fields(cls)
    assert [p.name for p in params] == [f.name for f in fields]
    for p, f in zip(params, fields):
        if f.default is not dataclasses.MISSING:
            assert p.default == f.default
        elif f.default_factory is not dataclasses.MISSING:
            assert p.default is not inspect.Parameter.empty  # a sentinel: the factory runs per object
        else:
            assert p.default is inspect.Parameter.empty


def _same(new: Any, ref: Any) -> None:
    assert new.__dict__ == ref.__dict__
    assert list(new.__dict__) == list(ref.__dict__)
    assert repr(new) == repr(ref)
    try:
        want: Any = hash(ref)
    except TypeError as exc:  # a dict field (scores): unhashable in both
        want = type(exc)
        with pytest.raises(TypeError):
            hash(new)
    else:
        assert hash(new) == want
    assert new == type(new)(**new.__dict__)
    assert dataclasses.replace(new) == new


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(CLASSES), st.data())
def test_built_as_the_generated_init_builds_it(cls: type, data: st.DataObject) -> None:
    fields = dataclasses.fields(cls)
    required = [f for f in fields if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    given_n = data.draw(st.integers(len(required), len(fields)))
    values = [data.draw(_values) for _ in range(given_n)]
    by_keyword = data.draw(st.booleans())
    if by_keyword:
        kw = {f.name: v for f, v in zip(fields, values)}
        new, ref = cls(**kw), REFERENCES[cls](**kw)
    else:
        new, ref = cls(*values), REFERENCES[cls](*values)
    _same(new, ref)
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(new, fields[0].name, 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        delattr(new, fields[0].name)


def test_scores_default_is_a_new_dict_each_time() -> None:
    a, b = RouteChoice("r", "p", 1, 2, "x"), RouteChoice("r", "p", 1, 2, "x")
    assert a.scores == {} and b.scores == {} and a.scores is not b.scores
    assert RouteChoice("r", "p", 1, 2, "x", None).scores is None  # given explicitly: kept, as the dataclass does


def test_missing_or_unknown_arguments_raise_type_error_as_before() -> None:
    for cls in CLASSES:
        with pytest.raises(TypeError):
            cls()
        with pytest.raises(TypeError):
            REFERENCES[cls]()
    with pytest.raises(TypeError):
        ReplicaLoad("r", bogus=1)  # type: ignore[call-arg]
