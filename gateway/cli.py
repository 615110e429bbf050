"""``prefixgate`` command line (click).

    prefixgate serve --config FILE      run the gateway (public + admin listener)
    prefixgate demo [OPTIONS]           the main job: simulated replicas + gateway + trace replay
    prefixgate audit verify FILE...     check a JSONL audit log's hash chain and checkpoints (--anchors: off-host copies)
    prefixgate audit keygen PATH        write a new Ed25519 checkpoint signing key
    prefixgate policy test DIR          compile a Rego directory and run its tests offline
    prefixgate keys rotate-tenant ...   operator key operations against the state file
"""

from __future__ import annotations

import logging
import sys

import click

__all__ = ["main"]


@click.group()
@click.option("--log-level", default="INFO", show_default=True, help="Python logging level.")
def main(log_level: str) -> None:
    """PrefixGate: a security-focused, multi-tenant, cache-aware gateway for LLM inference."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")


@main.command()
@click.option("--config", "config_path", required=True, type=click.Path(exists=True, dir_okay=False),
              help="YAML configuration file (docs/configuration.md).")
def serve(config_path: str) -> None:
    """Run the gateway until SIGINT/SIGTERM; drains in-flight requests on shutdown."""
    from policy import reexec_with_go_gc

    reexec_with_go_gc(["-m", "gateway.cli", *sys.argv[1:]])
    from audit.dirlock import AuditDirectoryInUse
    from audit.remote import AuditWorkerError
    from gateway.config import ConfigError, load_config
    from gateway.server import run_serving
    from gateway.server import serve as run

    try:
        cfg = load_config(config_path)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        run_serving(run(cfg, config_path=config_path))
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    except OSError as exc:
        raise click.ClickException(f"cannot start the gateway: {exc.strerror or exc}") from None
    except (AuditDirectoryInUse, AuditWorkerError) as exc:
        raise click.ClickException(f"cannot start the gateway: {exc}") from None


@main.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
              add_help_option=False)
@click.pass_context
def demo(ctx: click.Context) -> None:
    """The main job on embedded defaults (see README); every option, --help included, goes to ``python -m sim.demo``."""
    from sim.demo import main as demo_main

    sys.exit(demo_main(list(ctx.args)) or 0)


def _add_audit_commands() -> None:
    """Mount the audit and key-ring command groups of the packages that own them."""
    from audit.cli import audit_group

    main.add_command(audit_group, name="audit")
    from tenancy.cli import keys_group

    main.add_command(keys_group, name="keys")


_add_audit_commands()


@main.group()
def policy() -> None:
    """Rego policy tools."""


@policy.command("test")
@click.argument("directory", type=click.Path(exists=True, file_okay=False))
def policy_test(directory: str) -> None:
    """Compile every module in DIRECTORY and run its Rego unit tests (like ``opa test``)."""
    from policy.store import check_policy_dir

    report = check_policy_dir(directory)
    click.echo(report.render())
    sys.exit(0 if report.ok else 1)


if __name__ == "__main__":  # pragma: no cover
    main()
