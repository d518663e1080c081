"""The long options of ``ray start`` (Ray 2.60.0), without the leading ``--``.

KubeRay turns each ``rayStartParams`` key into ``--<key>=<value>`` on the ``ray start`` command line,
so a key outside this set makes the pod crash-loop with "No such option". Generated from the click
command ``ray.scripts.scripts.start``; tests/unit/test_lint_ray_params.py checks it against the
installed Ray and prints the new set when Ray changes (the lint layer itself never imports Ray).
"""

from __future__ import annotations

RAY_VERSION = "2.60.0"

RAY_START_PARAMS: frozenset[str] = frozenset(
    {
        "address",
        "autoscaling-config",
        "block",
        "cgroup-path",
        "dashboard-agent-grpc-port",
        "dashboard-agent-listen-port",
        "dashboard-host",
        "dashboard-port",
        "disable-usage-stats",
        "enable-object-reconstruction",
        "enable-resource-isolation",
        "head",
        "include-dashboard",
        "include-log-monitor",
        "labels",
        "labels-file",
        "log-color",
        "log-style",
        "max-worker-port",
        "memory",
        "metrics-export-port",
        "min-worker-port",
        "no-monitor",
        "no-redirect-output",
        "node-ip-address",
        "node-manager-port",
        "node-name",
        "num-cpus",
        "num-gpus",
        "object-manager-port",
        "object-spilling-directory",
        "object-store-memory",
        "plasma-directory",
        "port",
        "proxy-server-url",
        "ray-client-server-port",
        "ray-debugger-external",
        "redis-password",
        "redis-shard-ports",
        "redis-username",
        "resources",
        "runtime-env-agent-port",
        "system-config",
        "system-reserved-cpu",
        "system-reserved-memory",
        "temp-dir",
        "tracing-startup-hook",
        "verbose",
        "worker-port-list",
    }
)
