"""A labelled latency histogram counted in plain lists, exposed through a custom collector (issue 14).

``prometheus_client``'s ``Histogram.observe`` locks and increments one bucket and the sum (~1.6 µs
each here, two per request after its last byte: request duration and time to the first byte). Session
13 (meter): :class:`TallyHistogram` counts an observation with one ``bisect`` into a per-label-set list
and one float addition (~0.3 µs), and hands the counts to a registry at collect time as a
``HistogramMetricFamily`` (prometheus_client's public custom-collector API,
https://prometheus.github.io/client_python/collector/custom/). The exposition is the one a
``prometheus_client.Histogram`` of the same name, labels and buckets writes: ``_bucket`` per ``le``
(cumulative, ``+Inf`` last), ``_count``, ``_sum`` and, unless ``PROMETHEUS_DISABLE_CREATED_SERIES`` is
set (the client's own switch), ``_created`` per child (tests/gateway/test_s13_meter_hist.py compares the
two fed the same values). Used from the event loop only (no lock), as :class:`gateway.metrics.CounterBatch`.
"""

from __future__ import annotations

import os
import time
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from typing import Any

from prometheus_client.core import HistogramMetricFamily
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

__all__ = ["TallyHistogram"]

_INF = float("inf")


class _Child:
    """One label set: ``counts[i]`` observations in bucket ``i`` (not cumulative), their ``total``."""

    __slots__ = ("bounds", "counts", "total", "created")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last: above every finite bound (+Inf)
        self.total = 0.0
        self.created = time.time()

    def observe(self, amount: float) -> None:
        """Count ``amount`` (seconds) in the first bucket whose upper bound is >= it (Prometheus' ``le``)."""
        self.counts[bisect_left(self.bounds, amount)] += 1
        self.total += amount


class TallyHistogram:
    """A histogram family ``name`` (help ``documentation``) with label names ``labelnames`` and finite
    upper ``buckets`` (sorted, non-negative; ``+Inf`` is added), registered on ``registry``.

    :meth:`labels` returns a child with ``observe(amount)``, as ``prometheus_client.Histogram`` does
    (children cached per label-value tuple; at most :data:`MAX_CHILDREN`, beyond which a new label set
    raises :class:`ValueError`: the gateway's label values are its few endpoints). Raises
    :class:`ValueError` for unsorted or negative buckets or a wrong number of label values."""

    MAX_CHILDREN = 1024

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], buckets: Sequence[float],
                 registry: Any) -> None:
        bounds = tuple(float(b) for b in buckets if float(b) != _INF)
        if list(bounds) != sorted(bounds) or (bounds and bounds[0] < 0):
            raise ValueError("buckets must be sorted and non-negative")
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._bounds = bounds
        self._les = [floatToGoString(b) for b in bounds] + ["+Inf"]
        self._children: dict[tuple[str, ...], _Child] = {}
        self._created = os.environ.get("PROMETHEUS_DISABLE_CREATED_SERIES", "False").lower() not in (
            "true", "1", "t")  # prometheus_client's own reading of its switch
        registry.register(self)

    def labels(self, *values: Any) -> _Child:
        """The child of these positional label values (stringified, as prometheus_client does)."""
        child = self._children.get(values)
        if child is None:
            if len(values) != len(self.labelnames):
                raise ValueError("incorrect label count")
            key = tuple(str(v) for v in values)
            child = self._children.get(key)
            if child is None:
                if len(self._children) >= self.MAX_CHILDREN:
                    raise ValueError("too many label sets")
                child = _Child(self._bounds)
                self._children[key] = child
            self._children[values] = child
        return child

    def _family(self) -> HistogramMetricFamily:
        return HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def collect(self) -> Iterable[HistogramMetricFamily]:
        """The collector protocol: one family with every label set's buckets, count, sum (and created)."""
        family = self._family()
        seen: set[int] = set()
        for key, child in list(self._children.items()):
            if id(child) in seen or any(type(v) is not str for v in key):
                continue  # the same child under its unstringified key
            seen.add(id(child))
            acc = 0.0
            buckets = []
            for le, n in zip(self._les, list(child.counts)):
                acc += n
                buckets.append((le, acc))
            family.add_metric(key, buckets, child.total)
            if self._created:
                family.samples.append(Sample(self.name + "_created", dict(zip(self.labelnames, key)),
                                             child.created, None, None))
        yield family

    def describe(self) -> Iterable[HistogramMetricFamily]:
        """The family's name (no samples), for the registry's duplicate check."""
        yield self._family()
