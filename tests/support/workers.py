"""``prefixgate serve --workers 2`` as a child process for the scale-out tests (issue 16).

:func:`start_workers_gateway` starts simulated replicas, writes a demo gateway
config with ``state.backend: redis`` and starts ``python -m gateway.cli serve
--workers 2`` on free ports; it returns at once (the caller decides what to
wait for: a start window, ``/readyz``, both workers). :func:`children` and
:func:`running` read ``/proc`` to see the worker processes.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from sim.cluster import Cluster, start_cluster
from sim.demo import DemoPaths, gateway_config, prepare_identity
from sim.procs import ManagedProcess, free_port, python_module_cmd, start_process
from sim.replica import ReplicaConfig

__all__ = ["WorkersGateway", "children", "running", "start_workers_gateway"]


def children(pid: int) -> list[int]:
    """The pids of ``pid``'s child processes (``[]`` when it has none or is gone)."""
    try:
        return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def running(pid: int) -> bool:
    """True while process ``pid`` exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


@dataclass
class WorkersGateway:
    """A started ``serve --workers 2``: its replicas, demo paths, token issuer, public port and process.

    The caller stops ``proc`` (``sim.procs.stop_process``) and then ``cluster``."""

    cluster: Cluster
    paths: DemoPaths
    issuer: Any
    port: int
    proc: ManagedProcess

    @property
    def base(self) -> str:
        """``http://127.0.0.1:<port>``."""
        return f"http://127.0.0.1:{self.port}"


async def start_workers_gateway(tmp_path: Path, redis_url: str, key_prefix: str, *, replicas: int = 1,
                                tenant: Mapping[str, Any] | None = None) -> WorkersGateway:
    """Start ``replicas`` simulated replicas (time scale 100) and ``serve --workers 2`` in front of them.

    One tenant, ``tenant-a`` (its config entry updated with ``tenant``, e.g. rate
    limits); shared state in the Redis at ``redis_url`` under ``key_prefix``. Files
    go under ``tmp_path / "work"``. Returns without waiting for readiness.
    Raises what :func:`sim.procs.start_process` raises (the replicas are stopped first)."""
    cluster = await start_cluster(replicas, ReplicaConfig(time_scale=100.0))
    try:
        paths = DemoPaths.under(tmp_path / "work")
        issuer = prepare_identity(paths)
        port = free_port()
        cfg = gateway_config("cache_aware", cluster.ready_doc(), ["tenant-a"], paths, listen_port=port,
                             admin_port=free_port())
        cfg["tenancy"]["tenants"][0].update(tenant or {})
        cfg["state"] = {"backend": "redis", "url": redis_url, "key_prefix": key_prefix}
        cfg_path = paths.work / "gateway.yaml"
        cfg_path.write_text(yaml.safe_dump(cfg))
        proc = start_process("gateway", python_module_cmd("gateway.cli", "serve", "--config", str(cfg_path),
                                                          "--workers", "2"), paths.logs)
    except BaseException:
        await cluster.stop()
        raise
    return WorkersGateway(cluster, paths, issuer, port, proc)
