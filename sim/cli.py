"""``prefixgate-sim``: developer commands (simulated replicas, a demo trust domain, the main job).

The product CLI ``prefixgate`` never imports the simulator; everything that
stands in for real infrastructure lives here::

    prefixgate-sim init DIR                      a complete working config in DIR (sim/quickstart.py)
    prefixgate-sim replicas --config FILE        the simulated replicas a gateway config names
    prefixgate-sim replicas --count N            N simulated replicas (--base-port P: P, P+1, ...)
    prefixgate-sim trust-domain create DIR --name TD   a trust domain with a stable signing key
    prefixgate-sim token DIR SPIFFE_ID           mint a JWT-SVID from that trust domain
    prefixgate-sim demo [OPTIONS]                the main job (sim/demo.py; README "Run the main job")
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import click

from sim.replica import replica_options

__all__ = ["main"]

#: Default JWT-SVID lifetime of ``prefixgate-sim token``, seconds (the gateway
#: accepts at most ``identity.max_lifetime_s``, default 3600).
DEFAULT_TOKEN_TTL_S = 900


@click.group()
def main() -> None:
    """PrefixGate developer commands: simulated replicas, a demo trust domain, the main job."""


# ------------------------------------------------------------------ init


@main.command()
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--trust-domain", default="quickstart.test", show_default=True,
              help="Trust domain created in DIR/trust-domain (an existing one is kept).")
@click.option("--port", type=click.IntRange(1, 65535), default=8080, show_default=True, help="Public listener port.")
@click.option("--admin-port", type=click.IntRange(1, 65535), default=8081, show_default=True,
              help="Admin listener port.")
@click.option("--replicas", type=click.IntRange(min=1), default=2, show_default=True,
              help="Replicas named in the config.")
@click.option("--replica-base-port", type=click.IntRange(1, 65535), default=8101, show_default=True,
              help="Replica i listens on this port + i.")
def init(directory: str, trust_domain: str, port: int, admin_port: int, replicas: int,
         replica_base_port: int) -> None:
    """Write a complete working gateway config, secrets and a trust domain into DIRECTORY.

    Then `prefixgate-sim replicas --config DIRECTORY/gateway.yaml` and
    `prefixgate serve --config DIRECTORY/gateway.yaml` serve at once.
    """
    from sim.quickstart import init_gateway_dir

    try:
        res = init_gateway_dir(directory, trust_domain=trust_domain, port=port, admin_port=admin_port,
                               replicas=replicas, replica_base_port=replica_base_port)
    except (FileExistsError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"wrote {res.config} (tenants: {', '.join(res.tenants)}; trust domain {res.trust_domain})")


# ------------------------------------------------------------------ replicas


def _replicas_from_config(path: str) -> list[tuple[str, str, int]]:
    """``(replica id, host, port)`` of every replica listed in a gateway YAML config."""
    import yaml

    try:
        doc = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise click.ClickException(f"cannot read {path}: {exc}") from None
    out = []
    for i, r in enumerate(doc.get("replicas") or []):
        parts = urlsplit(str(r.get("url", "")))
        if parts.scheme != "http" or not parts.hostname or not parts.port:
            raise click.ClickException(f"replicas.{i}.url: the simulator serves plain http://HOST:PORT URLs only")
        out.append((str(r.get("id", f"replica-{i}")), parts.hostname, parts.port))
    if not out:
        raise click.ClickException(f"{path} names no replicas")
    return out


async def _serve_replicas(specs: list[tuple[str, str, int]], template: Any, ready_file: str | None) -> None:
    import dataclasses

    from sim.replica import create_app, run_app_on

    runners = []
    try:
        doc = []
        for rid, host, port in specs:
            runner, url = await run_app_on(create_app(dataclasses.replace(template, replica_id=rid)), host, port)
            runners.append(runner)
            doc.append({"replica_id": rid, "url": url})
            click.echo(f"replica {rid} listening on {url}")
        if ready_file:
            tmp = Path(f"{ready_file}.tmp")
            tmp.write_text(json.dumps(doc), encoding="utf-8")
            tmp.replace(ready_file)
        click.echo(f"{len(doc)} replicas ready (SIGINT/SIGTERM stops them)")
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
    finally:
        for r in runners:
            await r.cleanup()
    click.echo("replicas stopped")


@main.command()
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Start the replicas this gateway config lists (ids and ports from their URLs).")
@click.option("--count", type=click.IntRange(min=1), default=None, help="Start N replicas (without --config).")
@click.option("--host", default="127.0.0.1", show_default=True, help="With --count: bind address.")
@click.option("--base-port", type=click.IntRange(0, 65535), default=0, show_default=True,
              help="With --count: replica i binds base-port + i; 0 = free ports (printed).")
@click.option("--ready-file", type=click.Path(dir_okay=False), default=None,
              help="Write [{replica_id, url}, ...] here once every replica listens.")
@replica_options
def replicas(config_path: str | None, count: int | None, host: str, base_port: int, ready_file: str | None,
             **options: Any) -> None:
    """Run simulated OpenAI-compatible replicas (real block-level prefix cache) until interrupted."""
    from sim.replica import config_from_options, quiet_http2_probes

    if (config_path is None) == (count is None):
        raise click.UsageError("give exactly one of --config FILE or --count N")
    if config_path is not None:
        specs = _replicas_from_config(config_path)
    else:
        assert count is not None
        specs = [(f"replica-{i}", host, base_port + i if base_port else 0) for i in range(count)]
    template = config_from_options("replica-0", options)
    quiet_http2_probes()
    try:
        asyncio.run(_serve_replicas(specs, template, ready_file))
    except OSError as exc:
        raise click.ClickException(f"cannot start the replicas: {exc.strerror or exc}") from None


# ------------------------------------------------------------------ identity


@main.group("trust-domain")
def trust_domain() -> None:
    """A demo SPIFFE trust domain kept in a directory (stable signing key, bundle file)."""


@trust_domain.command("create")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--name", required=True, help="Trust domain name, e.g. example.org.")
@click.option("--alg", default="ES256", show_default=True, help="JWS algorithm (ES256/384/512, RS*, PS*).")
def trust_domain_create(directory: str, name: str, alg: str) -> None:
    """Create a trust domain in DIRECTORY once: its signing key (keys/, mode 0600) and
    bundle.json, the file a gateway's identity.trust_domains.<name>.bundle_file points at.
    Refuses an existing one (a new key would invalidate every token minted from it)."""
    from sim.spiffe_issuer import BUNDLE_FILE, TrustDomainExists, create_trust_domain

    try:
        create_trust_domain(directory, name, alg)
    except (TrustDomainExists, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"trust domain {name}: bundle {Path(directory).resolve() / BUNDLE_FILE}")


@main.command()
@click.argument("directory", type=click.Path(exists=True, file_okay=False))
@click.argument("spiffe_id")
@click.option("--aud", "audience", multiple=True, help="Audience (repeatable). [default: prefixgate]")
@click.option("--ttl", type=click.IntRange(min=1), default=DEFAULT_TOKEN_TTL_S, show_default=True,
              help="Lifetime in seconds (the gateway refuses more than identity.max_lifetime_s, default 3600).")
def token(directory: str, spiffe_id: str, audience: tuple[str, ...], ttl: int) -> None:
    """Print a JWT-SVID for SPIFFE_ID, signed by the trust domain in DIRECTORY.

    DIRECTORY is a trust-domain directory or a `prefixgate-sim init` directory
    (its trust-domain/ is used). Output: the token alone (compact JWS, one
    line), for `Authorization: Bearer <token>`. The key is stable, so every
    token stays valid until it expires.
    """
    from sim.spiffe_issuer import STATE_FILE, load_trust_domain

    root = Path(directory)
    if not (root / STATE_FILE).exists() and (root / "trust-domain" / STATE_FILE).exists():
        root = root / "trust-domain"
    try:
        issuer = load_trust_domain(root)
    except (FileNotFoundError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    if not spiffe_id.startswith(f"spiffe://{issuer.trust_domain}/"):
        raise click.ClickException(f"{spiffe_id!r} is not a SPIFFE ID of trust domain {issuer.trust_domain}")
    aud: str | list[str] = list(audience) if len(audience) > 1 else (audience[0] if audience else "prefixgate")
    click.echo(issuer.mint(spiffe_id, aud, ttl_s=ttl))


# ------------------------------------------------------------------ demo


@main.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
              add_help_option=False)
@click.pass_context
def demo(ctx: click.Context) -> None:
    """The main job (README): every option, --help included, goes to sim.demo."""
    from sim.demo import main as demo_main

    sys.exit(demo_main(list(ctx.args)) or 0)


if __name__ == "__main__":  # pragma: no cover
    main()
