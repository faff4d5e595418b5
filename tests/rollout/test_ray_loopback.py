"""The local Ray instance the `ray` env backend starts listens on 127.0.0.1 only (issue 29, item 8)."""

from __future__ import annotations

import ipaddress

import pytest

from trl_agents.rollout import EnvPool


def _listening(pids: set[int]) -> list[tuple[str, str, int]]:
    """(process name, address, port) of the TCP sockets the processes `pids` listen on."""
    import psutil

    found = []
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.pid in pids:
            try:
                name = psutil.Process(conn.pid).name()
            except psutil.NoSuchProcess:
                continue
            found.append((name, conn.laddr.ip, conn.laddr.port))
    return found


def _loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    return ip.is_loopback or bool(getattr(ip, "ipv4_mapped", None) and ip.ipv4_mapped.is_loopback)


@pytest.mark.slow
def test_local_ray_backend_listens_on_loopback_only(monkeypatch):
    ray = pytest.importorskip("ray")
    psutil = pytest.importorskip("psutil")
    if ray.is_initialized():
        pytest.skip("Ray is already initialised in this process: the pool would not start its own instance")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    pool = EnvPool(default_env="frozenlake", backend="ray", step_timeout=60.0)
    try:
        env = pool.acquire({"seed": 0})  # starts Ray and one environment actor
        assert env.reset({"seed": 0})
        me = psutil.Process()
        pids = {me.pid} | {child.pid for child in me.children(recursive=True)}
        sockets = _listening(pids)
        names = {name for name, _, _ in sockets}
        assert any("gcs_server" in name for name in names) and any("raylet" in name for name in names), sockets
        exposed = [socket for socket in sockets if not _loopback(socket[1])]
        assert not exposed, f"Ray listens beyond 127.0.0.1: {exposed}"
        pool.release(env)
    finally:
        pool.close()
    assert not ray.is_initialized()
