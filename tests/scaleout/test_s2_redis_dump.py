"""Nothing but MACs, numbers, ids (and the operator's policy text / tenant table) in Redis: a dump of
every key after routing, rotations, a policy change and a registry reload (issue 16)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import redis.asyncio as aioredis

from routing.types import RouteRequest
from tests.scaleout.s2_instances import PREFIX, REPLICAS, instance, write_secret
from tests.support.waiting import wait_for

PROMPT = "The quarterly figures for the Zanzibar account are confidential; summarise them in three bullet points."
HEX64 = re.compile(r"^[0-9a-f]{64}$")


async def _dump(raw: aioredis.Redis) -> dict[str, object]:
    out: dict[str, object] = {}
    async for key in raw.scan_iter(count=1000):
        k = key.decode()
        kind = (await raw.type(key)).decode()
        if kind == "string":
            out[k] = (await raw.get(key)).decode()
        elif kind == "hash":
            out[k] = {f.decode(): v.decode() for f, v in (await raw.hgetall(key)).items()}
        elif kind == "stream":
            out[k] = [{f.decode(): v.decode() for f, v in fields.items()} for _, fields in await raw.xrange(key)]
        else:
            out[k] = f"<{kind}>"
    return out


async def test_redis_holds_no_prompt_token_or_secret(tmp_path: Path, redis_server) -> None:
    secret_file = write_secret(tmp_path / "master.key")
    gws = [instance(tmp_path, i, redis_server.url, secret_file) for i in range(2)]
    for gw in gws:
        await gw.shared.start()
    a, b = gws
    try:
        tokens = a.admission.tokenizer.encode(PROMPT * 4)
        chains = a.keys.prefix_chains(a.registry.get("tenant-a"), tokens)
        assert chains.current
        for _ in range(3):
            _, ticket = a.router.route(RouteRequest("tenant-a", chains.current, len(tokens), 32, 16), REPLICAS)
            ticket.first_byte()
            ticket.finish()
        a.keyring.rotate_tenant("tenant-a")
        await a.shared.keys.publish("tenant-a")
        tiers = a.pdp.store.get_data("prefixgate/config/tiers")
        tiers["gold"] = {"max_tokens": 2048}
        await a.pdp.store.put_data("prefixgate/config/tiers", tiers, "spiffe://demo.prefixgate.test/ops/admin")
        await a.shared.settle()
        await a.shared.routing.flush()
        await wait_for(lambda: b.pdp.store.version == 1 and b.shared.routing.applied > 0, what="shared")
        salt = a.keyring.cache_salt("tenant-a")
        keys = [k.key for k in a.keyring.lookup_keys("tenant-a")]
    finally:
        for gw in gws:
            await gw.shared.stop()
    raw = aioredis.Redis.from_url(redis_server.url)
    try:
        dump = await _dump(raw)
        text = json.dumps(dump)
    finally:
        await raw.aclose()
    secret_text = secret_file.read_text().strip()
    forbidden = [PROMPT[:40], secret_text, salt, *(k.hex() for k in keys), json.dumps(tokens[:12])[1:-1]]
    for f in forbidden:
        assert f not in text, f"found {f[:12]}... in Redis"
    # every key is one of the documented ones, every value of the expected shape
    expected = {f"{PREFIX}keys:check", f"{PREFIX}keys:tenants", f"{PREFIX}routing:events",
                f"{PREFIX}docs:policy"}
    assert set(dump) == expected, sorted(dump)  # alive keys were given up at stop
    assert HEX64.match(dump[f"{PREFIX}keys:check"])
    assert all(re.match(r"^\d+:\d+:[0-9a-f]{64}$", v) for v in dump[f"{PREFIX}keys:tenants"].values())
    for entry in dump[f"{PREFIX}routing:events"]:
        assert set(entry) == {"i", "n", "b", "m"} and HEX64.match(entry["m"])
        assert re.match(r"^[0-9a-f]{16}$", entry["i"])
        assert re.match(r"^\d+:\d+$", entry["n"])  # R13-2: the writer's entry number and time (ms)
        for ev in json.loads(entry["b"]):
            for part in ev[1:]:
                values = part if isinstance(part, list) else list(part.values()) if isinstance(part, dict) else [part]
                for v in values:  # replica ids, counts, hex HMAC block keys
                    flat = v if isinstance(v, list) else [v]
                    assert all(isinstance(x, int) or x in REPLICAS or re.match(r"^[0-9a-f]{32,64}$", x)
                               for x in flat), ev
    version, mac, body = dump[f"{PREFIX}docs:policy"].split(":", 2)
    assert version == "1" and HEX64.match(mac) and set(json.loads(body)) == {"modules", "data"}
