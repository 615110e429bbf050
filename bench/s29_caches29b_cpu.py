"""Session 29 caches29b: thread CPU (time.thread_time) per call of row_is_clean, request_event+scrub_event and
BoundChildren.labels over 4,000 realistic rows (8 tenants, 4 models, a new id and address per row), best of 5.
Run with PYTHONPATH=<tree> for each tree (an A/A export beside). In-process, no network."""
import time
from audit.request_event import REQUEST_ROW_FIELDS, request_event
from audit.scrub import row_is_clean, scrub_event
from gateway.metrics import BoundChildren, CounterBatch
from prometheus_client import CollectorRegistry, Counter
I = {n: i for i, n in enumerate(REQUEST_ROW_FIELDS)}
def row(i):
    r = [None] * len(REQUEST_ROW_FIELDS)
    v = dict(event_id=f"0f1e2d3c-{i:08x}", time_ms=1700000000000 + i, outcome="allowed", request_id=f"{i:032x}",
             spiffe_id=f"spiffe://prod.example/ns/t{i % 8}/sa/app", trust_domain="prod.example", tenant=f"tenant-{i % 8}",
             decision_id=f"d-{i:016x}", reason_code="ok", reason="allowed by policy", endpoint="/v1/chat/completions",
             model=f"llama-3-8b-{i % 4}", prompt_tokens=100 + i % 900, output_tokens=50, sequences=1, basis="usage",
             replica=f"r{i % 4}", pool="gpu", routing_policy="prefix", client_address=f"10.1.{i % 200}.{i % 250}:{40000 + i % 20000}",
             trace_id=f"{i:032x}", prefix_fingerprint=f"{i:016x}", policy_version="v1", status_code=200)
    for k, x in v.items(): r[I[k]] = x
    for k in ("t0", "t_auth", "t_parsed", "t_keys", "t_decided", "t_route", "t_first_byte", "t_end"): r[I[k]] = 1.0 + I[k] * 1e-4
    return r
rows = [row(i) for i in range(4000)]
fp = I["prefix_fingerprint"]
reg = CollectorRegistry(); batch = CounterBatch(); reg.register(batch)
fam = BoundChildren(Counter("r", "r", ["tenant", "outcome"], registry=reg), batch)
keys = [(f"tenant-{i % 8}", "allowed") for i in range(4000)]
def clean():
    for r in rows: row_is_clean(r, fp)
def event():
    for r in rows: scrub_event(request_event(r))
def labels():
    for k in keys: fam.labels(*k)
for name, f in (("row_is_clean", clean), ("request_event+scrub_event", event), ("BoundChildren.labels", labels)):
    f(); best = min((lambda t: (f(), time.thread_time() - t)[1])(time.thread_time()) for _ in range(5))
    print(f"{name}: {best / len(rows) * 1e6:.3f} us/call")
