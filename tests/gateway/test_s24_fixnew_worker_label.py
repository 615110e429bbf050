"""``serve --workers N``: every sample of ``/admin/metrics`` and ``/metrics`` carries ``worker="<i>"``
(session 24, S24-newcomer-1).

Before, each worker exposed its own registries under the same series names: successive scrapes of one
listener read different workers (``prefixgate_requests_total{...}`` 13, 84, 13, ...) and Prometheus read
each drop as a counter reset. Now a worker's series are its own (summed over ``worker`` by the operator);
one process (``worker`` None) exposes exactly what it did.
"""
from __future__ import annotations

from typing import Any

import httpx
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gateway.app import build_admin_app, build_public_app
from gateway.metrics_worker import with_worker_label


def _samples(text: bytes) -> list[tuple[str, dict[str, str], float]]:
    return [(s.name, dict(s.labels), s.value)
            for fam in text_string_to_metric_families(text.decode()) for s in fam.samples]


def _labelled(text: bytes, worker: str) -> list[tuple[str, dict[str, str], float]]:
    return [(name, {"worker": worker, **labels}, value) for name, labels, value in _samples(text)]


def test_one_process_exposes_the_same_text() -> None:
    text = b'# HELP a_total x\n# TYPE a_total counter\na_total{b="c"} 1.0\nd 2.0\n'
    assert with_worker_label(text, None) is text


_label_values = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=6)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["x", "y"]), _label_values, st.integers(0, 10 ** 6)), max_size=6),
       st.sampled_from(["0", "1", "12"]))
def test_every_sample_gets_the_label_and_keeps_its_own(rows: list[tuple[str, str, int]], worker: str) -> None:
    reg = CollectorRegistry()
    counter = Counter("c", "a counter", ["k", "v"], registry=reg)
    plain = Gauge("g", "no labels", registry=reg)
    hist = Histogram("h_seconds", "a histogram", ["k"], registry=reg, buckets=(0.1, 1))
    for k, v, n in rows:  # label values with spaces, braces, quotes, backslashes, newlines
        counter.labels(k, v).inc(n)
        hist.labels(k).observe(n / 1000)
    plain.set(len(rows))
    text = generate_latest(reg)
    assert _samples(with_worker_label(text, worker)) == _labelled(text, worker)


async def test_the_admin_and_public_metrics_of_a_worker_carry_its_label(stack: Any) -> None:
    r = await stack.client.post("/v1/chat/completions", headers=stack.auth(), json={
        "model": "sim-model", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 2})
    assert r.status_code == 200, r.text
    gw, op = stack.components, stack.operator_auth()
    transports = {name: httpx.ASGITransport(app=app, client=("127.0.0.1", 40000)) for name, app in (
        ("admin", build_admin_app(gw, worker="1")), ("public", build_public_app(gw, manage_lifecycle=False, worker="1")))}
    async with httpx.AsyncClient(transport=transports["admin"], base_url="http://gw") as admin, \
            httpx.AsyncClient(transport=transports["public"], base_url="http://gw") as public:
        labelled = (await admin.get("/admin/metrics", headers=op)).content
        labelled_public = (await public.get("/metrics")).content
    unlabelled = (await stack.client.get(f"{stack.admin_url}/admin/metrics", headers=op)).content
    samples = _samples(labelled)
    assert samples and all(labels.get("worker") == "1" for _, labels, _ in samples)
    # the same series as the one-process exposition (read just after), each with the label, and no family
    # of the gateway has a label of that name already
    assert {(n, tuple(sorted(lb.items()))) for n, lb, _ in samples} == {
        (n, tuple(sorted(lb.items()))) for n, lb, _ in _labelled(unlabelled, "1")}
    assert not any("worker" in lb for _, lb, _ in _samples(unlabelled))
    requests = [v for n, lb, v in samples if n == "prefixgate_requests_total" and lb.get("status") == "200"]
    assert requests and requests[0] >= 1
    public_samples = _samples(labelled_public)
    assert public_samples and all(labels.get("worker") == "1" for _, labels, _ in public_samples)
