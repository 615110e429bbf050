"""Fallback parse cost of strict_numbers' parse_float: thread CPU, medians of rounds (fixops s22)."""
import json, statistics, sys, time
sys.path.insert(0, sys.argv[1])
from gateway.json_fast import loads_checked
from gateway.request import MAX_INT_DIGITS
N = int(sys.argv[2])
# a body that json reads (a lone surrogate escape makes orjson refuse it): N floats in logit_bias-like list
floats = ",".join(f"{i * 0.731:.3f}" for i in range(N))
bodies = {
    "fallback_floats": ('{"s":"\\ud800","x":[' + floats + ']}').encode(),
    "fallback_longint_floats": ('{"n":1234567890123456789,"x":[' + floats + ']}').encode(),
    "fallback_ints": ('{"s":"\\ud800","x":[' + ",".join(str(i) for i in range(N)) + ']}').encode(),
    "fast_chat": b'{"model":"m","messages":[{"role":"user","content":"' + b"hello world " * 50 + b'"}],"temperature":0.7,"top_p":0.9}',
}
strict = sys.argv[3] == "strict"
for name, raw in bodies.items():
    text = raw.decode()
    rounds = []
    for _ in range(7):
        reps = 20 if name.startswith("fallback") else 20000
        t = time.thread_time_ns()
        for _ in range(reps):
            loads_checked(raw, text, max_int_digits=MAX_INT_DIGITS, max_depth=32, strict_numbers=strict)
        rounds.append((time.thread_time_ns() - t) / reps)
    print(f"{name} {'strict' if strict else 'plain'} median_us={statistics.median(rounds)/1000:.1f} min={min(rounds)/1000:.1f} max={max(rounds)/1000:.1f}")
