"""The soak's replicas (``tpufleet chaos --replicas N``): N ``tpufleet serve`` processes on one
PostgreSQL database, and the leader faults done to them: the leader SIGKILLed (started again
later), SIGSTOPped for longer than the lease then SIGCONTed, SIGTERMed (it hands the lease over;
started again later), and every replica SIGKILLed together and started again.

Which replica a leader fault hits is the one that leads when it comes due (asked over
``/healthz``); how long a replica stays stopped or down is drawn from the soak's seeded stream.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from tpufleet.chaos.plan import LEADER_FAULTS
from tpufleet.chaos.server import ControlPlane
from tpufleet.client.http import Client
from tpufleet.errors import ClusterError

__all__ = ["LEADER_FAULTS", "LEADER_RETURNS", "FailoverClient", "Replicas"]

LEADER_RETURNS = ("replica_restart", "replica_cont", "replicas_restart")  # what brings a replica back

# The soak's serve command for replica ``i``: ``i -> (argv, env)``.
ReplicaCommand = Callable[[int], tuple[list[str], dict[str, str]]]


class Replicas:
    """N replicas, each a :class:`ControlPlane` of its own (its URL, its state dir, its logs in
    ``log_dir/replica-<i>``), with what the soak asks of its one control plane (``start``,
    ``ensure_up``, ``kill``, ``starts``) done to all of them."""

    def __init__(self, urls: list[str], log_dir: Path, serve: ReplicaCommand, lease_s: float) -> None:
        self.lease_s = lease_s
        self.planes: list[ControlPlane] = []
        for i, url in enumerate(urls):
            where = log_dir / f"replica-{i}"
            where.mkdir(parents=True, exist_ok=True)
            self.planes.append(ControlPlane(url, where, lambda i=i: serve(i)))  # type: ignore[misc]
        self.url = urls[0]
        self.stopped: set[int] = set()  # SIGSTOPped, not yet SIGCONTed

    @property
    def starts(self) -> int:
        return sum(p.starts for p in self.planes)

    def killable(self) -> bool:
        return any(p.killable() for p in self.planes)

    def start(self) -> None:
        for plane in self.planes:
            plane.start()

    def ensure_up(self) -> None:
        """Every replica running and answering: the stopped ones continued, the dead ones started."""
        for i in sorted(self.stopped):
            self.cont(i)
        for plane in self.planes:
            plane.ensure_up()

    def kill(self, sig: int) -> None:
        """``sig`` to every replica (a stopped one is continued first, so a SIGTERM reaches it)."""
        for i in sorted(self.stopped):
            self.cont(i)
        for plane in self.planes:
            plane.kill(sig)

    def cont(self, i: int) -> bool:
        """SIGCONT replica ``i``; False when it was not stopped (or has died since)."""
        if i not in self.stopped:
            return False
        self.stopped.discard(i)
        proc = self.planes[i].server
        if proc is None or proc.poll() is not None:
            return False
        os.killpg(proc.pid, signal.SIGCONT)
        return True

    def stop(self, i: int) -> None:
        proc = self.planes[i].server
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGSTOP)
            self.stopped.add(i)

    def leader(self, wait_s: float) -> int | None:
        """The replica that says it leads (``/healthz``), waiting up to ``wait_s`` for one
        (a takeover under way); None when none does by then."""
        deadline = time.monotonic() + wait_s
        while True:
            for i, plane in enumerate(self.planes):
                if i in self.stopped or plane.server is None or plane.server.poll() is not None:
                    continue
                try:
                    if httpx.get(f"{plane.url}/healthz", timeout=5.0).json().get("leader"):
                        return i
                except (httpx.HTTPError, ValueError):
                    continue
            if time.monotonic() > deadline:
                return None
            time.sleep(0.2)

    def fault(
        self, kind: str, target: str | None, rng: random.Random, push: Callable[..., None]
    ) -> str | None:
        """Do one leader fault or return (``LEADER_FAULTS``, ``LEADER_RETURNS``); what it hit, or
        None when there was nothing to do (no replica leads, or it is back already). ``push(delay,
        kind, target)`` plans the return."""
        if kind == "replica_restart":
            assert target is not None
            self.planes[int(target)].ensure_up()
            return f"replica {target}"
        if kind == "replica_cont":
            assert target is not None
            return f"replica {target}" if self.cont(int(target)) else None
        if kind == "replicas_restart":
            self.ensure_up()
            return "every replica"
        if kind == "replicas_kill_all":
            for i in sorted(self.stopped):
                self.cont(i)
            for plane in self.planes:
                plane.kill(signal.SIGKILL)
            push(rng.uniform(1, 5), "replicas_restart")
            return "every replica"
        leader = self.leader(wait_s=2 * self.lease_s + 5)
        if leader is None:
            return None
        if kind == "leader_kill":
            self.planes[leader].kill(signal.SIGKILL)
            push(rng.uniform(1, 5), "replica_restart", str(leader))
        elif kind == "leader_term":
            self.planes[leader].kill(signal.SIGTERM)
            push(rng.uniform(1, 5), "replica_restart", str(leader))
        elif kind == "leader_stop":
            self.stop(leader)
            push(self.lease_s + rng.uniform(1, 3), "replica_cont", str(leader))
        else:
            raise ValueError(f"not a leader fault: {kind}")
        return f"replica {leader}"


class FailoverClient(Client):
    """The soak's admin client over every replica: a read that finds its replica unreachable (down,
    or stopped: it times out) goes to the next one, the last one's error when none answers. A write
    (a submit) is never sent twice by this client: its error is raised, and the next call starts at
    the next replica (the soak looks a submit whose answer was lost up by name first)."""

    def __init__(self, servers: list[tuple[str, str]], timeout_s: float = 5.0) -> None:
        super().__init__(servers[0][0], servers[0][1], timeout_s=timeout_s)
        self.servers = servers
        self._at = 0

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        err: ClusterError | None = None
        tries = len(self.servers) if method == "GET" else 1
        for _ in range(tries):
            self.server, self.token = self.servers[self._at]
            try:
                return super().request(method, path, **dict(kwargs))
            except ClusterError as e:  # unreachable, or a 5xx: the next replica
                err = e
                self._at = (self._at + 1) % len(self.servers)
        assert err is not None
        raise err
