"""One log monitor for a whole lean fleet: the head's, forwarding every host's worker output too.

Ray runs a log monitor on every node: a Python process (~44 MiB PSS, ~0.4 s of CPU to start) that
tails the node's worker logs and publishes new lines to the GCS, from where they reach the drivers
(``log_to_driver``) and Ray jobs' logs. On a real TPU pod each host is its own machine and needs
its own; the hosts of an emulated fleet share this machine's file system, so the head's log monitor
reads theirs too and the hosts start none (``rayhost.py --host-logs``, ``plan.lean_head_argv``).

It runs Ray's own ``LogMonitor`` (``ray._private.log_monitor``), one per node: the head's logs
directory as Ray's log monitor would, and the logs directory of every host whose Ray temp dir is
a ``h<seq>`` folder under the fleet's temp dir (``EmulatedFleet._host_start``). What each publishes
is what the host's own log monitor would have published: the same files, the same IP (every node
of a fleet has this machine's) and the workers' pids. One loop steps every monitor in turn, as
Ray's ``LogMonitor.run`` steps its one, and sleeps 0.1 s when none had anything new.

A host's directory is watched from the first time it is found until its node is no longer alive in
the GCS (a host killed, preempted or removed; a host brought back gets a new temp dir): the nodes
are read every ``NODES_EVERY_S``, and a directory is dropped only when a read succeeded, the node
was registered once, and it is not alive now. Whatever a dead host's workers wrote after the last
step is lost, as it is with a host's own log monitor, which dies with the host.

Run from the head launcher's fork (``rayhost._become_the_log_monitor``) with the command line Ray
gives ``log_monitor.py`` (the flags below are Ray's), under that command line's title.
"""

from __future__ import annotations

import argparse
import glob
import os
import time
from dataclasses import dataclass, field
from typing import Any

# How often the fleet's temp dir is searched for new hosts, and the GCS asked which still live.
FIND_EVERY_S = 0.5
NODES_EVERY_S = 2.0
# Files one host's monitor keeps open at most (Ray's default is 200 for a node's one monitor; a
# fleet's hosts share this process's descriptors).
HOST_MAX_OPEN_FILES = 32
IDLE_SLEEP_S = 0.1  # as Ray's LogMonitor.run


def host_logs_dirs(fleet_temp_dir: str) -> list[str]:
    """The logs dir of every host Ray started under the fleet's temp dir (``<temp>/h<seq>``)."""
    found = glob.glob(os.path.join(glob.escape(fleet_temp_dir), "h*", "session_latest", "logs"))
    return sorted(os.path.realpath(d) for d in found)


def host_dir_of_socket(fleet_temp_dir: str, raylet_socket: str) -> str | None:
    """``<temp>/h<seq>`` for a raylet socket under it (``<temp>/h<seq>/session_*/sockets/raylet``)."""
    prefix = os.path.realpath(fleet_temp_dir) + os.sep
    path = os.path.realpath(raylet_socket)
    if not path.startswith(prefix):
        return None
    first = path[len(prefix) :].split(os.sep, 1)[0]
    return prefix + first if first.startswith("h") else None


@dataclass
class _Watched:
    monitor: Any  # ray._private.log_monitor.LogMonitor
    host_dir: str  # <temp>/h<seq>, or "" for the head
    last_names: float = 0.0
    seen_alive: bool = False


@dataclass
class FleetLogs:
    """The head's ``LogMonitor`` and one per host, stepped together (see the module docstring)."""

    ip: str
    head_logs_dir: str
    fleet_temp_dir: str
    gcs_client: Any
    gcs_address: str | None
    watched: dict[str, _Watched] = field(default_factory=dict)
    retired: set[str] = field(default_factory=set)
    _found_at: float = float("-inf")
    _nodes_at: float = float("-inf")

    def __post_init__(self) -> None:
        head = self._monitor(self.head_logs_dir, gcs_address=self.gcs_address)
        self.watched[self.head_logs_dir] = _Watched(head, "")

    def _monitor(self, logs_dir: str, **kwargs: Any) -> Any:
        from ray._private.log_monitor import LogMonitor, is_proc_alive

        return LogMonitor(self.ip, logs_dir, self.gcs_client, is_proc_alive, **kwargs)

    def find_hosts(self) -> None:
        """Start watching every host logs dir not yet watched (nor retired)."""
        head = self.watched[self.head_logs_dir].monitor
        for logs_dir in host_logs_dirs(self.fleet_temp_dir):
            if logs_dir in self.watched or logs_dir in self.retired:
                continue
            monitor = self._monitor(logs_dir, max_files_open=HOST_MAX_OPEN_FILES)
            monitor.is_autoscaler_v2 = head.is_autoscaler_v2  # asked of the GCS once, by the head's
            host_dir = os.path.dirname(os.path.dirname(logs_dir))  # <temp>/h<seq>/session_x/logs
            self.watched[logs_dir] = _Watched(monitor, host_dir)

    def retire_dead_hosts(self, alive_sockets: list[str] | None) -> None:
        """Stop watching the hosts whose node was alive once and is not now. ``None``: the GCS did
        not answer, so nothing is known and nothing is dropped."""
        if alive_sockets is None:
            return
        alive = {d for s in alive_sockets if (d := host_dir_of_socket(self.fleet_temp_dir, s))}
        for logs_dir, w in list(self.watched.items()):
            if not w.host_dir:
                continue
            if w.host_dir in alive:
                w.seen_alive = True
            elif w.seen_alive:
                w.monitor._close_all_files()
                del self.watched[logs_dir]
                self.retired.add(logs_dir)

    def _alive_sockets(self) -> list[str] | None:
        try:
            nodes = self.gcs_client.get_all_node_info(timeout=5).values()
        except Exception:  # the GCS answers late or restarts: keep every host until it answers
            return None
        return [n.raylet_socket_name for n in nodes if n.state == 0]  # GcsNodeInfo.ALIVE

    def step(self, now: float) -> bool:
        """One round over every monitor, as one turn of ``LogMonitor.run``; True if any published."""
        if now - self._found_at >= FIND_EVERY_S:
            self._found_at = now
            self.find_hosts()
        if len(self.watched) > 1 and now - self._nodes_at >= NODES_EVERY_S:
            self._nodes_at = now
            self.retire_dead_hosts(self._alive_sockets())
        published = False
        for w in list(self.watched.values()):
            if w.monitor.should_update_filenames(w.last_names):
                w.monitor.update_log_filenames()
                w.last_names = time.time()
            w.monitor.open_closed_files()
            published = w.monitor.check_log_files_and_publish_updates() or published
        return published

    def run(self) -> None:
        while True:
            if not self.step(time.monotonic()):
                time.sleep(IDLE_SLEEP_S)


def _ray_flags(argv: list[str]) -> argparse.Namespace:
    """The flags Ray gives ``log_monitor.py`` that this reads (others are ignored)."""
    import ray._private.ray_constants as ray_constants

    p = argparse.ArgumentParser(prog="log_monitor", add_help=False)
    p.add_argument("--gcs-address")
    p.add_argument("--node-ip-address")
    p.add_argument("--logging-level", default=ray_constants.LOGGER_LEVEL)
    p.add_argument("--logging-format", default=ray_constants.LOGGER_FORMAT)
    p.add_argument("--logging-filename", default=ray_constants.LOG_MONITOR_LOG_FILE_NAME)
    p.add_argument("--logs-dir", required=True)
    p.add_argument("--logging-rotate-bytes", type=int, required=True)
    p.add_argument("--logging-rotate-backup-count", type=int, required=True)
    p.add_argument("--stdout-filepath", default="")
    p.add_argument("--stderr-filepath", default="")
    return p.parse_known_args(argv)[0]


def main(argv: list[str], fleet_temp_dir: str) -> None:
    """What Ray's ``log_monitor.py`` does as ``__main__`` with ``argv``, for the whole fleet."""
    import importlib
    import traceback

    import ray._private.ray_constants as ray_constants
    import ray._private.utils as ray_utils
    from ray._private import logging_utils
    from ray._private.ray_logging import setup_component_logger

    args = _ray_flags(argv)
    rotation = (args.logging_rotate_bytes, args.logging_rotate_backup_count)
    logger = setup_component_logger(
        logging_level=args.logging_level,
        logging_format=args.logging_format,
        log_dir=args.logs_dir,
        filename=args.logging_filename,
        max_bytes=rotation[0],
        backup_count=rotation[1],
    )
    logging_utils.redirect_stdout_stderr_if_needed(args.stdout_filepath, args.stderr_filepath, *rotation)
    raylet: Any = importlib.import_module("ray._raylet")  # a compiled module, without stubs
    gcs_client = raylet.GcsClient(address=args.gcs_address)
    fleet = FleetLogs(args.node_ip_address, args.logs_dir, fleet_temp_dir, gcs_client, args.gcs_address)
    try:
        fleet.run()
    except Exception:  # as Ray's: tell the drivers, then fail
        message = "The emulated fleet's log monitor failed:\n" + ray_utils.format_error_message(
            traceback.format_exc()
        )
        ray_utils.publish_error_to_driver(
            ray_constants.LOG_MONITOR_DIED_ERROR, message, gcs_client=gcs_client
        )
        logger.error(message)
        raise
