"""Session 25 review (S25-review-2, -3): gateway-process CPU per refused chat request for adversarial
``response_format`` / forced-tool schemas, two running gateways A and B measured in interleaved rounds
(``/proc/<pid>/stat`` utime+stime deltas over N sequential requests on one keep-alive connection; loopback).

Setup (as run for bench/results/s25-review-refused-cpu*.txt): ``prefixgate-sim init`` config, tenant
``rate_rps`` 5000, ``limits.refused_cpu_ms_per_s: null`` (no 429 mid-run), two copies on ports 18580 / 18590,
A started with ``PYTHONPATH`` = the tree under test, B = the base tree (``git archive c7e7fbd``) or, for the
A/A, the same tree. Usage: ``python bench/refused_cpu_s25.py TOKEN_FILE A_PORT:A_PID B_PORT:B_PID N ROUNDS``."""

from __future__ import annotations

import http.client, json, os, sys, time, statistics
TOK = open(sys.argv[1]).read().strip()
GW = {g: tuple(map(int, a.split(":"))) for g, a in zip("AB", sys.argv[2:4])}
HZ = os.sysconf("SC_CLK_TCK")
def cpu(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (``/proc/<pid>/stat``, clock ticks)."""
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / HZ
pre = '{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"max_tokens":3,'
def rf(schema: str) -> str:
    """A chat body whose ``response_format`` JSON schema is ``schema`` (JSON text)."""
    return pre + '"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":' + schema + '}}}'
BODIES = {
  "baseline max_tokens 0 (60 KiB)": '{"model":"sim-model","messages":[{"role":"user","content":"' + "a " * 30000 + '"}],"max_tokens":0}',
  "lists depth 30 x 8000 zeros": rf('{"x":' + "[" * 30 + ",".join(["0"] * 8000) + "]" * 30 + "}"),
  "lists depth 200 x 7800 zeros": rf('{"x":' + "[" * 200 + ",".join(["0"] * 7800) + "]" * 200 + "}"),
  "8000 empty objects": rf('{"x":[' + ",".join(["{}"] * 8000) + "]}"),
  "pattern over bound": rf('{"pattern":"' + "a" * 2000 + '"}'),
  "$ref: 20 defs, each refers twice": rf(json.dumps({"$defs": {**{f"d{i}": {"type": "object", "properties": {
      "a": {"$ref": f"#/$defs/d{i + 1}"}, "b": {"$ref": f"#/$defs/d{i + 1}"}}} for i in range(20)},
      "d20": {"type": "string"}}, "$ref": "#/$defs/d0"})),
  "$ref: chain of 2000 defs": rf(json.dumps({"$defs": {**{f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(2000)},
      "d2000": {"type": "string"}}, "$ref": "#/$defs/d0"})),
  "forced tool, depth 200 x 7800": pre + '"tool_choice":"required","tools":[{"type":"function","function":{"name":"f","parameters":{"x":' + "[" * 200 + ",".join(["0"] * 7800) + "]" * 200 + "}}}]}",
}
N, ROUNDS = int(sys.argv[4]), int(sys.argv[5])
res = {(g, b): [] for g in GW for b in BODIES}
status = {}
for r in range(ROUNDS):
    order = ["A", "B"] if r % 2 == 0 else ["B", "A"]
    for g in order:
        port, pid = GW[g]
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        for name, body in BODIES.items():
            raw = body.encode()
            c0 = cpu(pid)
            for _ in range(N):
                conn.request("POST", "/v1/chat/completions", raw, {"authorization": "Bearer " + TOK, "content-type": "application/json"})
                resp = conn.getresponse(); data = resp.read()
                if resp.getheader("connection", "").lower() == "close":
                    conn.close(); conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            res[(g, name)].append((cpu(pid) - c0) / N * 1000)
            status[(g, name)] = (resp.status, json.loads(data)["error"]["code"] if resp.status >= 400 else "")
        conn.close()
out = [f"# CPU ms per refused request (gateway process utime+stime, /proc, {HZ} Hz ticks), {N} requests x {ROUNDS} interleaved rounds,",
       f"# A = {sys.argv[2]}, B = {sys.argv[3]} (see bench/results/s25-review-refused-cpu*.txt for which trees); loopback, one client",
       f"{'body':34s} {'bytes':>7s}  {'A min/med/max ms':>22s} {'B min/med/max ms':>22s}  answer A | answer B"]
for name, body in BODIES.items():
    a, b = res[("A", name)], res[("B", name)]
    f = lambda v: f"{min(v):6.2f}/{statistics.median(v):6.2f}/{max(v):6.2f}"
    out.append(f"{name:34s} {len(body):7d}  {f(a):>22s} {f(b):>22s}  {status[('A', name)]} | {status[('B', name)]}")
print("\n".join(out))
