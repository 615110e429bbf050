"""Step-by-step wall map of PrefixGate's request path on a sequential client (not a test).

``python -m bench.pipeline_map [--requests 400] [--rounds 4] [--name pipeline_map]``

Issue 14, session 28 (wait28). bench.timeline (session 27) splits a sequential request into spans between
a dozen stamps; this map splits its two gateway windows further: the pipeline before the upstream write
(``app`` -> ``up_written``) and the answer path (``up_first`` -> ``written``), and the work run in the
replica wait (``prep_a`` -> ``prep_b``: ``InferencePipeline._prepare``), about 50 stamps in all. The question
it answers: which steps on a sequential client's path could run while the loop waits for the replica (a
reorder), and what they cost.

How: this tree is copied to a temporary directory (``.git``, ``.venv`` and ``bench/results`` left out); in
the copy, a one-line stamp call ``_S(name)`` is inserted at each anchor of :data:`ANCHORS` (a line of the
product code found exactly once in its file; :func:`patch_tree` raises :class:`AnchorError` naming it when
the code moved) and bench.timeline's child hands ``_S`` its stamp function (through ``builtins``: the
stamps go to the request's record by bench.timeline's context variable, so a loop callback of the request,
e.g. the replica-wait work, stamps its own request). Then ``python -m bench.timeline --targets prefixgate``
runs in the copy, and per round the median over requests of each consecutive pair of :data:`ORDER` present in
a request is computed (pairs whose stamps are both present; a stamp seen twice keeps its first time).
Reported: the median over rounds of those medians, and the rounds' client latency, the two windows and the
load. Each stamp costs ~0.1 µs; a sum of step medians is not the window's median (a few rounds carry a
~200 µs preemption at a socket write: see the per-round table). Nothing of the product path changes.
Results: ``bench/results/<name>.{json,md}``. Session 30: flow control's fast path chooses before the upstream
write and charges (``Router.commit``) right after it, so ``r_commit``, ``r_disp`` and ``r_rec`` follow ``up_written``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.overhead import REPO
from bench.sampled_serve import options

__all__ = ["ANCHORS", "ORDER", "AnchorError", "patch_tree", "step_medians"]

#: file -> [(anchor text, stamp name, True: the stamp after the anchor's line, False: before it)]
ANCHORS: dict[str, list[tuple[str, str, bool]]] = {
    "gateway/pipeline.py": [
        ("shed = gw.overload.shed_or_enter()", "h0", False),
        ("gw.audit.start_span(rec, request.headers)", "span", True),
        ("rec.t_auth = time.perf_counter()", "auth", True),
        ("bounds = adm.request_bounds(tenant)", "admit", True),
        ("raw = await read_body(", "body", True),
        ("del raw, front\n", "parsed", True),
        ("held.reservation = await res if", "reserved", True),
        ("del tokens  # R12-2", "chains", True),
        ("rec.t_keys = time.perf_counter()", "cands", True),
        ("rec.t_decided = time.perf_counter()", "decided", True),
        ("allowed = gw.pep.allowed_candidates(candidates, decision)", "allowed", True),
        ("body = upstream_body(req, max_tokens,", "ubody", True),
        ("return await self._route_and_proxy(request, req, rec, tenant, route_req", "rreq", False),
        ("                choice = pending.choice\n", "routed", True),
        ("rec.t_route = time.perf_counter()", "t_route", True),
        ("gw.audit.inject_trace_headers(headers, rec)", "headers", True),
        ("progress, held.progress = held.progress,", "pre_open", True),
        ("held.attempt = gw.replica_set.attempt(replica.id, tenant.id)", "opened", False),
        ("up = await unless_client_leaves(request, call)", "pre_await", False),
        ("held.up = up\n", "resumed", False),
        ("return await plain_response(request, rec, held,", "pr0", False),
        ("rec.prefix_fingerprint = PrefixKeys.prefix_fingerprint(chains)", "prep_a", False),
        ("self.gw.router.settle()  # last", "prep_b", True),
        ("        after: list[Callable[[], None]] = []  # what the record", "e_prep", False),
        ("            self._complete(rec, held.usage, held.choice, after)", "settled", False),
        ("            recorded = True", "completed", True),
        ("        self.gw.recorder.record(rec)  # its metrics", "t_end_set", False),
    ],
    "gateway/flow.py": [
        ("        self.slot_gate.new_round()\n        if self._place(", "r_round", False),
        ("        self.queue.pass_through(w.tenant_id, w.weight)\n        self._route(", "r_slot", False),
        ("        self._route(w, w.cands, defer)  # nothing awaited", "r_pass", False),
        ("        self._route(w, w.cands, defer)  # nothing awaited", "r_routedflow", True),
        ("            ticket = None if defer else self.router.commit(w.req, choice)", "r_chosen", False),
    ],
    "routing/router.py": [
        ("        return self.policy.choose(req, cands)\n", "r_choose0", False),
        ("        prefill = max(0, req.prompt_tokens - choice.predicted_prefix_tokens)\n        ticket", "r_commit", False),
        ("        self._record(choice.replica_id, req.block_keys)  # applied", "r_disp", False),
        ("        self._record(choice.replica_id, req.block_keys)  # applied", "r_rec", True),
    ],
    "gateway/proxy.py": [
        ("    written = session.send_idle(\"POST\", url, data, fields, deadline=deadline)", "dumped", False),
        ("                await resp.wait_head()", "head_ok", True),
        ("        encoding = resp.headers.get(\"content-encoding\")", "chunk0", False),
    ],
    "gateway/upstream_conn.py": [
        ("        transport.write(data)\n        self._reset_message()", "w0", False),
    ],
    "gateway/pipeline_answer.py": [
        ("data = up.whole_body()  # a short answer", "whole", True),
        ("            obj = json_fast.loads_answer(data)\n        else:", "ans_parsed", True),
        ("    answer = PlainAnswer(data, rec.request_id)", "ans0", False),
        ("    answer = PlainAnswer(data, rec.request_id)", "ans1", True),
    ],
    "gateway/inference_asgi.py": [
        ("            if isinstance(response, EndingStreamingResponse):", "handled", False),
        ("                await send(start)", "start_sent", True),
        ("            try:\n                recorder.hand_off()", "blp_ran", False),
        ("                await send({\"type\": \"http.response.body\", \"body\": response.body})", "blp_done", False),
    ],
    "gateway/auditing.py": [
        ("        self.emitted += 1\n        if spans is not None:", "row_built", False),
    ],
    "audit/remote.py": [
        ("        seq = self._seq = self._seq + 1\n", "row_in", True),
        ("        size = len(frame)\n        backlog = self._backlog + size", "row_dumped", True),
    ],
}

#: the stamps in path order (bench.timeline's own: app, up_written, up_first, handed_off, written, serve_end)
ORDER: tuple[str, ...] = (
    "app", "h0", "span", "auth", "admit", "body", "parsed", "reserved", "chains", "cands", "decided", "allowed",
    "ubody", "rreq", "r_round", "r_slot", "r_pass", "r_choose0", "r_chosen", "r_routedflow", "routed", "t_route",
    "headers", "pre_open", "dumped", "w0", "up_written", "r_commit", "r_disp", "r_rec", "opened", "pre_await", "prep_a",
    "prep_b", "up_first", "head_ok", "chunk0", "resumed", "pr0", "whole", "ans_parsed", "ans0", "ans1", "handled",
    "start_sent", "e_prep", "settled", "t_end_set", "row_built", "row_in", "row_dumped", "completed", "blp_ran",
    "handed_off", "blp_done", "written", "serve_end")

_HOOK = ("import builtins as _pm_builtins\n\n\ndef _S(name):\n    f = getattr(_pm_builtins, '_pipeline_map_stamp', None)\n"
         "    if f is not None:\n        f(name)\n")
_FUTURE = "\nfrom __future__ import annotations\n"


class AnchorError(LookupError):
    """An anchor of :data:`ANCHORS` is not in its file exactly once (the product code moved): the map is stale."""


def patch_tree(root: Path, anchors: dict[str, list[tuple[str, str, bool]]] | None = None) -> int:
    """Insert the stamp calls of ``anchors`` (default :data:`ANCHORS`) into the files under ``root``, in
    place, each at its anchor's indentation (before the anchor's first line, or after it), and the ``_S`` hook after each file's ``from __future__`` line.
    Returns the stamps inserted. Raises :class:`AnchorError` (nothing written for that file) when an anchor
    is missing or not unique, or a file has no ``from __future__ import annotations`` line."""
    count = 0
    for rel, spec in (ANCHORS if anchors is None else anchors).items():
        path = root / rel
        text = path.read_text()
        if text.count(_FUTURE) != 1:
            raise AnchorError(f"{rel}: no single 'from __future__ import annotations' line")
        for anchor, name, after in spec:
            n = text.count(anchor)
            if n != 1:
                raise AnchorError(f"{rel}: anchor for stamp {name!r} found {n} times: {anchor!r}")
            at = text.find(anchor)
            line_start = text.rfind("\n", 0, at) + 1
            indent = re.match(r"[ ]*", text[line_start:]).group(0)  # type: ignore[union-attr]
            call = f"{indent}_S({name!r})\n"
            if after:  # after the anchor's first line
                end = text.find("\n", at)
                text = text[:end + 1] + call + text[end + 1:]
            else:
                text = text[:line_start] + call + text[line_start:]
            count += 1
        text = text.replace(_FUTURE, _FUTURE + _HOOK, 1)
        path.write_text(text)
    return count


def _patch_timeline(root: Path) -> None:
    """The copy's bench.timeline: its stamp function handed to ``_S`` (builtins), its per-round analysis
    extended with every consecutive pair of :data:`ORDER` (keys ``F a -> b``)."""
    path = root / "bench" / "timeline.py"
    text = path.read_text()
    install, ret = "    st = _Stamps()\n", "\n    return out\n\n\ndef _med("
    if text.count(install) != 1 or text.count(ret) != 1:
        raise AnchorError("bench/timeline.py: its _install or analyse changed")
    text = text.replace(install, install + "    import builtins\n    builtins._pipeline_map_stamp = st.stamp\n", 1)
    fine = ("\n    from bench.pipeline_map import step_medians\n"
            "    out.update(step_medians(reqs))")
    text = text.replace(ret, fine + ret, 1)
    path.write_text(text)


def step_medians(reqs: Sequence[dict[str, int]], order: Sequence[str] = ORDER) -> dict[str, float]:
    """Per consecutive pair ``a, b`` of ``order``: ``"F a -> b"`` -> the median over ``reqs`` (stamp dicts,
    ns) holding both of ``b - a``, in µs (0.1 µs rounding); pairs no request holds are left out."""
    out: dict[str, float] = {}
    for a, b in zip(order, order[1:]):
        vals = [r[b] - r[a] for r in reqs if a in r and b in r]
        if vals:
            out[f"F {a} -> {b}"] = round(statistics.median(vals) / 1000, 1)
    return out


def _copy_tree(dst: Path) -> None:
    skip_top, skip_any = {".git", ".venv"}, shutil.ignore_patterns("__pycache__", "*.egg-info", ".pytest_cache")

    def ignore(d: str, names: list[str]) -> set[str]:
        here = Path(d).resolve()
        out = set(skip_any(d, names))
        if here == REPO:
            out |= skip_top & set(names)
        elif here == REPO / "bench":
            out |= {"results"} & set(names)
        return out

    shutil.copytree(REPO, dst, ignore=ignore)


def run(requests: int, rounds: int, name: str) -> dict[str, Any]:
    """The measurement (module doc); returns the result document."""
    work = Path(tempfile.mkdtemp(prefix="pg-pipeline-map-"))
    try:
        tree = work / "tree"
        _copy_tree(tree)
        stamps = patch_tree(tree)
        _patch_timeline(tree)
        env = {**os.environ, "PYTHONPATH": str(tree)}
        subprocess.run([sys.executable, "-m", "bench.timeline", "--targets", "prefixgate", "--requests",
                        str(requests), "--rounds", str(rounds), "--name", name, "--out", str(work / "out")],
                       cwd=tree, env=env, check=True)
        doc = json.loads((work / "out" / f"{name}.json").read_text())
    finally:
        shutil.rmtree(work, ignore_errors=True)
    doc["benchmark"], doc["tree"], doc["stamps_inserted"] = "pipeline_map", str(REPO), stamps
    return doc


def report(doc: dict[str, Any], requests: int, rounds: int) -> str:
    """The result document as markdown: the steps' medians, then the rounds."""
    med = doc["medians_us"]["prefixgate"]
    lines = [f"# Step map of a sequential request (`python -m bench.pipeline_map --requests {requests} "
             f"--rounds {rounds}`)", "",
             f"Tree {doc['tree']}; µs, median over the rounds of each round's median; 1-min load average: "
             f"{', '.join(doc['loadavg_1min'])}.", "", "| step (stamp → stamp) | µs |", "|---|---:|"]
    for a, b in zip(ORDER, ORDER[1:]):
        key = f"F {a} -> {b}"
        if key in med:
            lines.append(f"| {a} → {b} | {med[key]} |")
    lines += ["", "| round | client latency | pipeline pre | replica | answer path | load |", "|---:|---:|---:|---:|---:|---:|"]
    for i, r in enumerate(doc["per_round"]["prefixgate"]):
        lines.append(f"| {i} | {r['client latency']} | {r['pipeline pre']} | {r['replica']} | {r['answer path']} "
                     f"| {r['load']} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point."""
    ap = options("bench.pipeline_map", __doc__ or "", requests=400, rounds=4)
    args = ap.parse(argv)
    doc = run(args.requests, args.rounds, args.name)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(doc, indent=2) + "\n")
    text = report(doc, args.requests, args.rounds)
    (args.out / f"{args.name}.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
