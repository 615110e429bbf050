"""``prefixgate-sim init``: a complete, working gateway configuration in one directory.

:func:`init_gateway_dir` writes, under ``DIR``::

    DIR/gateway.yaml            the configuration (commented; docs/configuration.md)
    DIR/master.key              32 random bytes as hex, mode 0600 (tenancy.master_secret_file)
    DIR/trust-domain/           a trust domain with a stable signing key (sim.spiffe_issuer)
    DIR/keys/audit-signing.key  Ed25519 audit checkpoint key (+ .pub), outside the audit dir
    DIR/audit/                  audit log (hash-chained JSONL) and its spill

so that ``prefixgate serve --config DIR/gateway.yaml`` serves at once, in
front of the replicas ``prefixgate-sim replicas --config DIR/gateway.yaml``
starts. Two tenants, ``acme`` and ``globex``, each own the workloads under
``spiffe://<trust domain>/<tenant>/``; ``ops/admin`` is the operator. Each
tenant gets request and token limits (rate, concurrency, prompt size, prompt
and output tokens per second) and flow control bounds the prompt tokens
queued at a replica (review findings R3-3, R3-4).
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from sim.spiffe_issuer import BUNDLE_FILE, STATE_FILE, create_trust_domain, load_trust_domain

__all__ = ["InitResult", "init_gateway_dir", "QUICKSTART_TRUST_DOMAIN", "TENANTS"]

QUICKSTART_TRUST_DOMAIN = "quickstart.test"

#: predicted uncached prompt tokens queued at one replica (``flow.replica_max_queued_prefill_tokens``):
#: twice the tenants' ``max_prompt_tokens`` (8192)
PREFILL_TOKENS = 16384

#: (tenant id, tier, models) of the tenants ``init`` configures.
TENANTS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("acme", "standard", ("sim-model",)),
    ("globex", "premium", ("sim-model",)),
)

_TEMPLATE = """\
# PrefixGate configuration written by `prefixgate-sim init` (reference:
# docs/configuration.md; every section with comments: examples/gateway.yaml).
#   prefixgate-sim replicas --config {cfg}   # the replicas named below
#   prefixgate serve --config {cfg}          # the gateway
#   prefixgate-sim token {dir} spiffe://{td}/acme/app   # a JWT-SVID for tenant acme
#   prefixgate-sim token {dir} spiffe://{td}/ops/admin --aud prefixgate-admin   # the operator's, admin listener

# public listener: /v1/*, /healthz, /readyz, /metrics
listen: {{host: 127.0.0.1, port: {port}}}
# admin listener: operators only (a JWT-SVID for identity.admin_audience, default prefixgate-admin,
# from an ID in tenancy.operators)
admin: {{host: 127.0.0.1, port: {admin_port}}}

models: [sim-model]          # models the gateway serves; each tenant lists its own below

# In front of real models also set `routing: {{tokenizer: "hf:/path/tokenizer.json"}}` (the served
# model's): with the default `word` tokenizer every token bound counts word tokens (docs/configuration.md).
replicas:                    # OpenAI-compatible upstreams (vLLM, SGLang, or the simulator)
{replicas}
tenancy:
  master_secret_file: "{dir}/master.key"    # per-tenant keys are derived from it (mode 0600)
  master_secret_env: null
  state_file: "{dir}/keystate.json"         # key versions and salt epochs (never keys)
  operators: [spiffe://{td}/ops/admin]
  # Every tenant fact lives here and only here: the policy gets models, pools,
  # tier, regulated and data_residency from this list through its input.
  tenants:
{tenants}
identity:
  audience: prefixgate
  trust_domains:
    {td}: {{bundle_file: "{dir}/trust-domain/{bundle}"}}

flow:                        # flow control (docs/fairness.md)
  # predicted uncached prompt tokens dispatched to one replica and not yet
  # prefilled (2 x max_prompt_tokens): beyond it requests wait in the fair
  # per-tenant queues. It bounds each replica's queue, not who fills it: while
  # another tenant is active, one tenant holds at most its weight's share
  # (flow.tenant_share_idle_s, default 5 s); a tenant alone may use it all
  replica_max_queued_prefill_tokens: {prefill}

policy:
  mode: embedded             # no `dir`: the policy installed with PrefixGate

audit:
  jsonl: {{dir: "{dir}/audit/jsonl", signing_key_file: "{dir}/keys/audit-signing.key"}}
  spill: {{dir: "{dir}/audit/spill"}}
"""

_REPLICA = "  - {{id: replica-{i}, url: \"http://127.0.0.1:{port}\", pool: default}}"

_TENANT = """\
    - id: {tid}
      spiffe_ids: [spiffe://{td}/{tid}/]   # every workload under /{tid}/
      models: [{models}]
      pools: [default]
      tier: {tier}            # its token cap comes from the policy data (tiers)
      rate_rps: 50
      max_concurrency: 16
      # token limits: without them one request may carry a prompt up to
      # limits.max_body_bytes, and prompt tokens/s are unbounded (docs/tenancy.md)
      max_prompt_tokens: 8192       # per prompt; longer answers 400
      max_batch_prompts: 8          # x max_prompt_tokens = 65536 = prompt_tokens_burst: one request within it
      max_output_tokens: 4096       # the policy's tier cap may clamp lower
      prompt_tokens_per_s: 20000    # token buckets (429 over them)
      prompt_tokens_burst: 65536
      output_tokens_per_s: 8000     # max_tokens x sequences reserved at admission
      output_tokens_burst: 32768"""


@dataclass(frozen=True)
class InitResult:
    """What :func:`init_gateway_dir` wrote: the config path, the trust domain and its directory."""

    config: Path
    trust_domain: str
    trust_domain_dir: Path
    tenants: tuple[str, ...]


def init_gateway_dir(directory: str | os.PathLike[str], *, trust_domain: str = QUICKSTART_TRUST_DOMAIN,
                     port: int = 8080, admin_port: int = 8081, replicas: int = 2,
                     replica_base_port: int = 8101) -> InitResult:
    """Write a complete working configuration into ``directory`` (layout in the module docstring).

    Replica ``i`` is expected at ``http://127.0.0.1:<replica_base_port + i>``.
    An existing trust domain in ``DIR/trust-domain`` is kept (tokens minted
    from it stay valid). Raises :class:`FileExistsError` if
    ``DIR/gateway.yaml`` exists (nothing is overwritten) and
    :class:`ValueError` for a bad trust-domain name or count.
    """
    if replicas < 1:
        raise ValueError("at least one replica is needed")
    root = Path(directory).resolve()
    if any(c in str(root) for c in '"\\\n'):
        raise ValueError(f"{root}: a directory name with quotes, backslashes or newlines is not supported")
    cfg = root / "gateway.yaml"
    if cfg.exists():
        raise FileExistsError(f"{cfg} exists; init never overwrites a configuration")
    root.mkdir(parents=True, exist_ok=True)
    td_dir = root / "trust-domain"
    if (td_dir / STATE_FILE).exists():
        trust_domain = load_trust_domain(td_dir).trust_domain
    else:
        create_trust_domain(td_dir, trust_domain)
    secret = root / "master.key"
    if not secret.exists():
        fd = os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_hex(32))
    signing = root / "keys" / "audit-signing.key"
    if not signing.exists():
        from audit.keys import generate_signing_key

        signing.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        generate_signing_key(signing)
    (root / "audit").mkdir(exist_ok=True)
    text = _TEMPLATE.format(
        cfg=cfg, dir=root, td=trust_domain, prefill=PREFILL_TOKENS, port=port, admin_port=admin_port, bundle=BUNDLE_FILE,
        replicas="\n".join(_REPLICA.format(i=i, port=replica_base_port + i) for i in range(replicas)) + "\n",
        tenants="\n".join(_TENANT.format(tid=t, td=trust_domain, tier=tier, models=", ".join(models))
                          for t, tier, models in TENANTS) + "\n",
    )
    cfg.write_text(text, encoding="utf-8")
    return InitResult(cfg, trust_domain, td_dir, tuple(t for t, _, _ in TENANTS))
