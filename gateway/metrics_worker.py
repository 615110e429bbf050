"""A ``worker`` label on every sample a worker of ``serve --workers N`` exposes (session 24, S24-newcomer-1).

With ``serve --workers N`` every worker keeps its own prometheus_client registries, and one listener
(the shared admin socket, or the public ``SO_REUSEPORT`` group) hands each scrape to one worker:
successive scrapes read different processes. Without a label the same series jumped between the
workers' values (13, 84, 13, ...) and Prometheus read every drop as a counter reset. With
``worker="<i>"`` on every sample each worker's series is its own, monotonic; an operator sums over
the label (``sum without (worker) (rate(...[5m]))``, docs/configuration.md "metrics").

Why a label and not prometheus_client's multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``): that mode
supports no custom collectors (the gateway's :class:`gateway.metrics_hist.TallyHistogram`, the
flush-on-collect :class:`gateway.metrics.CounterBatch`, the audit worker's relayed text), no
``Gauge.set_function`` and no per-registry split (the public ``/metrics`` must stay a small subset);
it aggregates every registry in the directory into one exposition.

The label is added to the exposition text (Prometheus text format 0.0.4, as ``generate_latest``
writes it): a sample line is ``name[{labels}] value [timestamp]`` where ``name`` matches
``[a-zA-Z_:][a-zA-Z0-9_:]*``, so the label list (or its place) starts right after the name; comment
lines (``# HELP``, ``# TYPE``) and blank lines are kept as they are. No gateway family has a label
called ``worker`` (tests/gateway/test_s24_fixnew_worker_label.py checks a real exposition).
"""

from __future__ import annotations

__all__ = ["with_worker_label"]


def _label_value(value: str) -> bytes:
    """``value`` escaped as a text-format label value (backslash, double quote, newline)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").encode("utf-8")


def with_worker_label(text: bytes, worker: str | None) -> bytes:
    """``text`` (a text-format exposition, bytes) with ``worker="<worker>"`` first in every sample's labels;
    ``text`` itself when ``worker`` is None (one gateway process: no label, as before). Pure; raises nothing;
    O(len(text))."""
    if worker is None:
        return text
    label = b'worker="' + _label_value(worker) + b'"'
    out: list[bytes] = []
    for line in text.split(b"\n"):
        if not line or line.startswith(b"#"):
            out.append(line)
            continue
        brace, space = line.find(b"{"), line.find(b" ")
        if brace != -1 and (space == -1 or brace < space):  # labels: name{...} value
            sep = b"" if line[brace + 1:brace + 2] == b"}" else b","
            out.append(line[:brace + 1] + label + sep + line[brace + 1:])
        elif space != -1:  # no labels: name value
            out.append(line[:space] + b"{" + label + b"}" + line[space:])
        else:
            out.append(line)  # not a sample line (the format has none such): kept as it is
    return b"\n".join(out)
