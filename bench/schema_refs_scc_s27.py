"""Session 27 (tidy27, S27-tidy27-1): the strongly-connected-components count of gateway/schema_refs.py (``_count``,
own Tarjan) against maintained graph libraries, on the bodies of bench/refused_cpu_s26_refs.py.

Each candidate has ``_count``'s signature and reuses ``_settle`` (the counting rules); only the components and
their reverse topological order come from the library, through documented calls: networkx ``condensation`` +
``topological_sort`` (the tree's ``_count`` since S27-tidy27-1: the whole owners' graph condensed, the reached
components settled; and a first try condensing the reached subgraph view), rustworkx ``condensation`` +
``topological_sort``, scipy ``connected_components(connection='strong')`` + stdlib ``graphlib.TopologicalSorter``
on the components, igraph ``connected_components(mode='strong')`` + ``cluster_graph`` + ``topological_sorting``.
The libraries are not project dependencies but networkx: install them aside
(``pip install --target DIR networkx rustworkx igraph``) and put DIR after the tree on ``PYTHONPATH``.

``python bench/schema_refs_scc_s27.py parse OUT ROUNDS N``: in one process, thread CPU
(``time.thread_time``) of ``gateway.request.parse_inference_request`` per body (:func:`_bodies`) and candidate
(median of N calls), candidates interleaved (order reversed every other round), ``own`` (session 26's Tarjan)
twice (``own`` and ``own'``: the A/A); min / median / max over the rounds, and the answer (``ok`` or the error
code). Every candidate's answers and inlined counts are checked equal first.
``python bench/schema_refs_scc_s27.py import OUT ROUNDS``: one fresh child per library and round; thread CPU and
wall time of ``import LIB`` after ``import gateway.app`` (what a gateway process has loaded), and the RSS added. Run
it with a tree before S27-tidy27-1 first on ``PYTHONPATH`` (after it, gateway.app has imported networkx already)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from refused_cpu_s26_refs import PRE, _bodies as _s26_bodies  # noqa: E402


def _bodies() -> dict[str, str]:
    """bench/refused_cpu_s26_refs.py's bodies and one more: three tools each a ring of 1,500 definitions (~196 KB,
    under ``max_tool_schemas_bytes``: each tool's cyclic count runs, the worst case of ``_count`` per body)."""
    ring = {"$defs": {f"d{i}": {"anyOf": [{"$ref": f"#/$defs/d{(i + 1) % 1500}"}]} for i in range(1500)},
            "$ref": "#/$defs/d0"}
    tools = [{"type": "function", "function": {"name": f"f{i}", "parameters": ring}} for i in range(3)]
    return {**_s26_bodies(), "3 tools, each a ring of 1500 defs": PRE + '"tools":' + json.dumps(
        tools, separators=(",", ":")) + "}"}

LIBS = {"networkx": "import networkx", "rustworkx": "import rustworkx",
        "scipy+graphlib": "import graphlib, numpy, scipy.sparse, scipy.sparse.csgraph", "igraph": "import igraph"}


def _edges(refs: dict[int, list[int]], kids: dict[int, list[int]]) -> list[tuple[int, int]]:
    return [(v, w) for m in (refs, kids) for v, ws in m.items() for w in ws]


def count_networkx(root, nodes, refs, kids, size_of, cap):  # type: ignore[no-untyped-def]
    import networkx as nx

    from gateway import schema_refs as sr
    g = nx.DiGraph()
    g.add_node(root)
    g.add_edges_from(_edges(refs, kids))
    reach = nx.descendants(g, root)
    reach.add(root)
    cg = nx.condensation(g.subgraph(reach))
    inl: dict[int, int] = {}
    ext: dict[int, int] = {}
    for c in reversed(list(nx.topological_sort(cg))):
        sr._settle(list(cg.nodes[c]["members"]), nodes, refs, kids, inl, ext, size_of, cap)
    return inl[root]


def count_rustworkx(root, nodes, refs, kids, size_of, cap):  # type: ignore[no-untyped-def]
    import rustworkx as rx

    from gateway import schema_refs as sr
    g = rx.PyDiGraph()
    index: dict[int, int] = {}

    def ix(v: int) -> int:
        i = index.get(v)
        if i is None:
            i = index[v] = g.add_node(v)
        return i
    ix(root)
    g.add_edges_from_no_data([(ix(v), ix(w)) for v, w in _edges(refs, kids)])
    reach = rx.descendants(g, index[root])
    reach.add(index[root])
    cg = rx.condensation(g.subgraph(list(reach)))
    inl: dict[int, int] = {}
    ext: dict[int, int] = {}
    for c in reversed(rx.topological_sort(cg)):
        sr._settle(list(cg[c]), nodes, refs, kids, inl, ext, size_of, cap)
    return inl[root]


def count_scipy(root, nodes, refs, kids, size_of, cap):  # type: ignore[no-untyped-def]
    from graphlib import TopologicalSorter

    import numpy as np
    from scipy.sparse import csr_array
    from scipy.sparse.csgraph import breadth_first_order, connected_components

    from gateway import schema_refs as sr
    index = {root: 0}
    src, dst = [], []
    for v, w in _edges(refs, kids):
        src.append(index.setdefault(v, len(index)))
        dst.append(index.setdefault(w, len(index)))
    n = len(index)
    m = csr_array((np.ones(len(src), dtype=bool), (np.array(src, dtype=np.int64), np.array(dst, dtype=np.int64))),
                  shape=(n, n))
    reach = breadth_first_order(m, 0, directed=True, return_predecessors=False)
    keys = list(index)
    m = m[reach][:, reach]
    _, labels = connected_components(m, directed=True, connection="strong")
    lab = labels.tolist()
    members: dict[int, list[int]] = {}
    for i, r in enumerate(reach.tolist()):
        members.setdefault(lab[i], []).append(keys[r])
    ts: TopologicalSorter[int] = TopologicalSorter()
    for c in members:
        ts.add(c)
    coo = m.tocoo()
    for a, b in zip(coo.row.tolist(), coo.col.tolist()):
        if lab[a] != lab[b]:
            ts.add(lab[a], lab[b])  # a's component after b's
    inl: dict[int, int] = {}
    ext: dict[int, int] = {}
    for c in ts.static_order():
        sr._settle(members[c], nodes, refs, kids, inl, ext, size_of, cap)
    return inl[root]


def count_igraph(root, nodes, refs, kids, size_of, cap):  # type: ignore[no-untyped-def]
    import igraph as ig

    from gateway import schema_refs as sr
    index = {root: 0}
    ed = [(index.setdefault(v, len(index)), index.setdefault(w, len(index))) for v, w in _edges(refs, kids)]
    g = ig.Graph(n=len(index), edges=ed, directed=True)
    reach = sorted(g.subcomponent(0, mode="out"))
    keys = list(index)
    cl = g.induced_subgraph(reach).connected_components(mode="strong")
    cg = cl.cluster_graph(combine_edges=False)
    cg.simplify(multiple=True, loops=True)
    members = [[keys[reach[i]] for i in c] for c in cl]
    inl: dict[int, int] = {}
    ext: dict[int, int] = {}
    for c in reversed(cg.topological_sorting(mode="out")):
        sr._settle(members[c], nodes, refs, kids, inl, ext, size_of, cap)
    return inl[root]


def _candidates() -> dict[str, Any]:
    """``own``: session 26's Tarjan (the oracle of tests/gateway/test_s27_tidy27_schema_refs_scc.py); ``networkx``:
    the tree's ``_count``; ``networkx (subgraph)``: the first try, the reached subgraph condensed."""
    import importlib.util

    from gateway import schema_refs as sr
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "gateway",
                        "test_s27_tidy27_schema_refs_scc.py")
    spec = importlib.util.spec_from_file_location("_s27_scc_oracle", path)
    assert spec is not None and spec.loader is not None
    oracle = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(oracle)
    return {"own": oracle._tarjan_count, "own'": oracle._tarjan_count, "networkx": sr._count,
            "networkx (subgraph)": count_networkx, "rustworkx": count_rustworkx, "scipy+graphlib": count_scipy,
            "igraph": count_igraph}


def _parse(out_file: str, rounds: int, n: int) -> None:
    import orjson

    from gateway import schema_refs as sr
    from gateway.config_http import JsonSchemaLimits
    from gateway.errors import GatewayError
    from gateway.request import parse_inference_request
    bodies = {k: v.encode() for k, v in _bodies().items()}
    cands = _candidates()
    own = sr._count
    lim = JsonSchemaLimits()

    def size(v: Any) -> int:
        return len(orjson.dumps(v))

    def run(raw: bytes) -> str:
        try:
            parse_inference_request(raw, "chat", 32, json_schema=lim)
        except GatewayError as err:
            return err.code
        return "ok"
    for name, raw in bodies.items():  # same answers and counts first
        body = orjson.loads(raw)
        schemas = ([body["response_format"]["json_schema"]["schema"]] if "response_format" in body
                   else [t["function"]["parameters"] for t in body["tools"]])
        seen = set()
        for fn in cands.values():
            sr._count = fn
            seen.add((run(raw), tuple(sr.inlined_bytes(s, size, 1 << 30) for s in schemas)))
        sr._count = own
        assert len(seen) == 1, (name, seen)
    res: dict[tuple[str, str], list[float]] = {}
    answers: dict[str, str] = {}
    names = list(cands)
    for r in range(rounds):
        for cname in (names if r % 2 == 0 else names[::-1]):
            sr._count = cands[cname]
            for bname, raw in bodies.items():
                times = []
                for _ in range(n):
                    t0 = time.thread_time()
                    answers[bname] = run(raw)
                    times.append((time.thread_time() - t0) * 1e6)
                res.setdefault((cname, bname), []).append(statistics.median(times))
            sr._count = own
    load = os.getloadavg()
    lines = [f"# parse_inference_request thread CPU per call, µs (median of {n} calls; min / median / max over "
             f"{rounds} interleaved rounds, one process), {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC, "
             f"loadavg {load[0]:.2f} {load[1]:.2f} (shared 2-core machine)", "# " + " | ".join(names)]
    for bname, raw in bodies.items():
        cells = []
        for cname in names:
            v = res[(cname, bname)]
            cells.append(f"{min(v):8.1f} / {statistics.median(v):8.1f} / {max(v):8.1f}")
        lines.append(f"{bname:34s} {len(raw):6d} B {answers[bname]:24s}| " + " | ".join(cells))
    _write(out_file, lines)


CHILD = r'''
import json, resource, sys, time
import gateway.app
rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0, w0 = time.thread_time(), time.perf_counter()
exec(sys.argv[1])
t1, w1 = time.thread_time(), time.perf_counter()
rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps([(t1 - t0) * 1e3, (w1 - w0) * 1e3, (rss1 - rss0) / 1024]))
'''


def _import(out_file: str, rounds: int) -> None:
    res: dict[str, list[list[float]]] = {}
    names = list(LIBS)
    for r in range(rounds):
        for lib in (names if r % 2 == 0 else names[::-1]):
            got = subprocess.run([sys.executable, "-c", CHILD, LIBS[lib]], capture_output=True, text=True,
                                 check=True, cwd="/").stdout  # gateway from PYTHONPATH, not the working directory
            res.setdefault(lib, []).append(json.loads(got))
    load = os.getloadavg()
    lines = [f"# import cost after `import gateway.app`, fresh child per library and round, median of {rounds} "
             f"rounds, {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC, loadavg {load[0]:.2f} {load[1]:.2f}",
             "# library: thread CPU ms | wall ms | max RSS added MiB"]
    for lib in names:
        cols = list(zip(*res[lib]))
        lines.append(f"{lib:16s} {statistics.median(cols[0]):8.1f} | {statistics.median(cols[1]):8.1f} | "
                     f"{statistics.median(cols[2]):6.1f}   ({LIBS[lib]})")
    _write(out_file, lines)


def _write(out_file: str, lines: list[str]) -> None:
    text = "\n".join(lines) + "\n"
    with open(out_file, "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    if sys.argv[1] == "parse":
        _parse(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        _import(sys.argv[2], int(sys.argv[3]))
