"""``prefixgate`` command line (click).

    prefixgate serve --config FILE      run the gateway (public + admin listener); --workers N needs state.backend: redis
    prefixgate audit verify PATH...     check JSONL audit chains (one per instance directory; --anchors: off-host copies)
    prefixgate audit keygen PATH        write a new Ed25519 checkpoint signing key
    prefixgate policy test [DIR]        compile a Rego directory (default: the shipped one) and run its tests
    prefixgate policy export DIR        copy the shipped policy into DIR (to edit it; then set policy.dir)
    prefixgate keys rotate-tenant ...   operator key operations against the state file
    prefixgate config check --config F  validate a configuration file (no secret, no network) and print its warnings

Developer commands (simulated replicas, a demo trust domain, the main job)
are ``prefixgate-sim`` (sim/cli.py): this CLI never imports the simulator.
"""

from __future__ import annotations

import logging
import sys

import click

__all__ = ["main", "serving_refusal"]


@click.group()
@click.option("--log-level", default="INFO", show_default=True, help="Python logging level.")
def main(log_level: str) -> None:
    """PrefixGate: a security-focused, multi-tenant, cache-aware gateway for LLM inference."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")


@main.command()
@click.option("--config", "config_path", required=True, type=click.Path(exists=True, dir_okay=False),
              help="YAML configuration file (docs/configuration.md).")
@click.option("--workers", type=click.IntRange(min=1), default=1, show_default=True,
              help="Gateway processes on this host; more than 1 needs state.backend: redis (docs/scale-out.md).")
@click.option("--worker-index", type=click.IntRange(min=0), default=None, hidden=True,
              help="Internal: run as worker i of --workers N on the inherited listening sockets.")
def serve(config_path: str, workers: int, worker_index: int | None) -> None:
    """Run the gateway until SIGINT/SIGTERM; drains in-flight requests on shutdown."""
    from gateway.import_names import collision_message

    collision = collision_message()  # before importing `policy`: it may be another project's (R5-9)
    if collision:
        raise click.ClickException(collision)
    from gateway.child_python import child_env
    from policy import reexec_with_go_gc

    # R12-4: the re-exec (and, through PYTHONSAFEPATH, its children) imports PrefixGate
    # from where this process did, never from the working directory
    reexec_with_go_gc(["-P", "-m", "gateway.cli", *sys.argv[1:]], child_env())
    from audit.dirlock import AuditDirectoryInUse
    from audit.worker_process import AuditWorkerError
    from gateway.config import ConfigError, load_config
    from gateway.server import run_serving
    from gateway.server import serve as run

    try:
        cfg = load_config(config_path)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    refusal = serving_refusal(cfg.state.backend, workers, on_unavailable=cfg.state.on_unavailable,
                              instances_expected=cfg.state.instances_expected,
                              policy_versions=cfg.policy.versions_dir is not None)
    if refusal:
        raise click.ClickException(refusal)
    if worker_index is None and workers > cfg.flow.instances:  # S17-2: a warning (no quota is exceeded)
        logging.getLogger("prefixgate.cli").warning(
            "serve --workers %d with flow.instances %d: each worker admits %s of a replica's room "
            "(docs/scale-out.md); set flow.instances to the number of gateway processes sharing the replicas",
            workers, cfg.flow.instances, "all" if cfg.flow.instances == 1 else f"1/{cfg.flow.instances}")
    try:
        if worker_index is not None:  # a child of `serve --workers N` (gateway/workers.py)
            from gateway.workers import catch_early_stop, inherited_sockets, per_worker_supported, worker_config

            if cfg.state.backend != "redis":
                raise click.ClickException("--worker-index needs state.backend: redis")
            stop_requested = catch_early_stop()
            run_serving(run(worker_config(cfg, worker_index), config_path=config_path, sockets=inherited_sockets(),
                            stop_requested=stop_requested, worker=str(worker_index)),
                        batch_accept=cfg.server.listener_per_worker and per_worker_supported())  # session 23
        elif workers > 1:
            from gateway.workers import run_workers

            sys.exit(run_workers(cfg, config_path, workers))
        else:
            run_serving(run(cfg, config_path=config_path))
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    except OSError as exc:
        raise click.ClickException(f"cannot start the gateway: {exc.strerror or exc}") from None
    except (AuditDirectoryInUse, AuditWorkerError) as exc:
        raise click.ClickException(f"cannot start the gateway: {exc}") from None


def serving_refusal(backend: str, workers: int, *, on_unavailable: str = "fail_closed",
                    instances_expected: int = 1, policy_versions: bool = False) -> str | None:
    """Why ``serve`` must not start with ``state.backend`` = ``backend`` and ``workers`` processes
    (None: it may start).

    Several processes with in-process state would each enforce the whole of
    every tenant's limits (N times the limit), so ``workers > 1`` needs the
    shared backend (issue 16; docs/scale-out.md says what is shared). With
    ``state.on_unavailable: local`` each process enforces the limits divided by
    ``state.instances_expected`` while Redis is away, so that divisor must count
    at least this host's ``workers`` (session 17, S17-2). ``policy_versions``
    (``policy.versions_dir`` set: operator policy management writes ``policy.dir``
    and the version history) refuses ``workers > 1``: the workers of one host
    would share one directory and history, so a change made through one worker
    is never adopted by the others (session 18, S18-store-1); run one ``serve``
    per policy directory instead (docs/scale-out.md).
    """
    if workers > 1 and backend != "redis":
        return (f"serve --workers {workers} needs state.backend: redis (with state.url); with in-process "
                f"state every worker would enforce each tenant's limits on its own")
    if backend == "redis" and on_unavailable == "local" and workers > instances_expected:
        return (f"serve --workers {workers} with state.on_unavailable: local needs state.instances_expected >= "
                f"{workers} (all processes on all hosts; it is {instances_expected}): during a Redis outage every "
                f"worker would enforce each tenant's limits divided by {instances_expected}")
    if workers > 1 and policy_versions:
        return (f"serve --workers {workers} with policy.versions_dir: the workers would share one policy directory "
                f"and version history, and a policy change made through one worker would never reach the others; "
                f"run one serve process per policy.dir/versions_dir (each with --workers 1, sharing state.url), "
                f"or unset policy.versions_dir")
    return None


def _add_audit_commands() -> None:
    """Mount the audit and key-ring command groups of the packages that own them."""
    from audit.cli import audit_group

    main.add_command(audit_group, name="audit")
    from tenancy.cli import keys_group

    main.add_command(keys_group, name="keys")


_add_audit_commands()


@main.group()
def config() -> None:
    """Configuration tools."""


@config.command("check")
@click.option("--config", "config_path", required=True, type=click.Path(exists=True, dir_okay=False),
              help="YAML configuration file (docs/configuration.md).")
def config_check(config_path: str) -> None:
    """Validate the file as ``serve`` would, of what needs no secret or network (exit 1 on an error):
    the schema, the tenants, the salt-pool rule, the policy (``policy.dir`` loads and compiles;
    ``policy.url`` set in remote mode; gateway/config_check.py, review RV2-7) and that the directory of
    ``tenancy.state_file`` exists (key and salt rotations are saved there; S22-newcomer-2). For a dry check
    on a machine without that directory, point it elsewhere for this run only, e.g.
    ``PREFIXGATE__TENANCY__STATE_FILE=/tmp/pg/keystate.json prefixgate config check --config F``. Then print, one line
    each, the warnings ``serve`` logs at start about its tenants (``configuration:``, ``limits:``):
    entries that cannot be served as written, tenants without a prompt-token limit, tenants with
    ``usage_cached_tokens: pass`` sharing a pool (review R12b-6), tenants one request of which may reserve
    more prompt tokens than their ``prompt_tokens_burst`` (review S15-5). Starts nothing, reads no secret, asks
    no server (the master secret, Redis, remote trust bundles and policy server are not checked)."""
    from gateway.config import ConfigError, load_config
    from gateway.config_check import build_time_errors
    from gateway.tenant_warnings import tenant_warnings
    from tenancy.registry import TenantRegistry

    try:
        cfg = load_config(config_path)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    registry = TenantRegistry.from_config(cfg.tenancy.tenants, operators=cfg.tenancy.operators)
    errors = build_time_errors(cfg, registry)
    if errors:  # serve refuses the file for these (exit 1)
        raise click.ClickException("; ".join(errors))
    lines = tenant_warnings(registry, cfg, cfg.models)  # the lines serve logs at start and a reload logs
    for line in lines:
        click.echo(line)
    click.echo(f"{config_path}: valid, {len(lines)} warning(s)")


@main.group()
def policy() -> None:
    """Rego policy tools."""


@policy.command("test")
@click.argument("directory", type=click.Path(exists=True, file_okay=False), required=False)
def policy_test(directory: str | None) -> None:
    """Compile every module in DIRECTORY (default: the policy installed with PrefixGate) and run
    its Rego unit tests (like ``opa test``)."""
    from policy.store import check_policy_dir

    if directory is None:
        from rego import policy_dir

        directory = str(policy_dir())
    report = check_policy_dir(directory)
    click.echo(report.render())
    sys.exit(0 if report.ok else 1)


@policy.command("export")
@click.argument("directory", type=click.Path(file_okay=False))
def policy_export(directory: str) -> None:
    """Copy the shipped policy (modules, Rego tests, data) into DIRECTORY, which must not exist.

    Point ``policy.dir`` at it to run an edited copy (and ``policy.versions_dir``
    to manage it through the admin listener)."""
    import shutil
    from pathlib import Path

    from rego import policy_dir

    target = Path(directory)
    if target.exists():
        raise click.ClickException(f"{target} exists; choose a new directory")
    src = policy_dir()
    shutil.copytree(src, target, ignore=shutil.ignore_patterns("__pycache__", "*.py", "*.pyc"))
    click.echo(f"copied the shipped policy from {src} to {target}")


if __name__ == "__main__":  # pragma: no cover
    main()
