"""Submit throughput through the API: jobs accepted per second with ``POST /api/v1/jobs/batch``.

Each run: a fresh store, one tenant, ``--jobs`` job bodies of mixed shapes sent as batches of
``--batch`` (at most 10,000) through ``Client.submit_batch`` to the app served by a real uvicorn on
127.0.0.1 (``--via http``, default) or in-process through ``fastapi.testclient.TestClient``
(``--via inprocess``). The figure is jobs / wall seconds of the requests (validation, one
transaction of bulk inserts per batch, the JSON answer), after one warm-up batch that is not
counted. For comparison the single-job route (``POST /api/v1/jobs``) is timed over ``--single``
jobs sent one after another, and over ``--single`` jobs sent by ``--concurrent`` clients at once
(each a thread with its own connection, as Kueue's generators or many users submit; their submits
are committed in groups, see ``JobStore.submit``). Databases: SQLite (a file in a temp dir)
always; PostgreSQL with ``--pg-url URL``, or a throwaway server started the way
``tests/unit/conftest.py`` does when PostgreSQL is installed (``--no-pg`` to skip). No
scheduling loop runs: this measures accepting work, nothing else.

    .venv/bin/python bench/submit.py [--jobs 20000] [--batch 10000] [--single 500] [--concurrent 40]
                                     [--via http|inprocess] [--pg-url URL]
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import uvicorn
from _pg import postgres_server
from fastapi.testclient import TestClient

from tpufleet.api.app import create_app
from tpufleet.client.http import Client
from tpufleet.control.store.facade import Store

SHAPES = [("v4-16", 1), ("v4-32", 1), ("v4-16", 2), ("v6e-16", 1)]


def bodies(n: int) -> list[dict[str, Any]]:
    return [
        {
            "command": ["python", "train.py", f"--step={i}"],
            "accelerator_type": SHAPES[i % len(SHAPES)][0],
            "num_slices": SHAPES[i % len(SHAPES)][1],
            "priority": i % 3,
            "env": {"RUN": str(i)},
        }
        for i in range(n)
    ]


@contextlib.contextmanager
def served(store: Store, via: str) -> Iterator[tuple[str, httpx.Client | None]]:
    """The API over ``store``: (its URL, None) for a uvicorn server in a thread, or
    ("http://testserver", a TestClient) in-process."""
    app = create_app(store)
    if via == "inprocess":
        with TestClient(app) as http:
            yield "http://testserver", http
        return
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", None
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def run(url: str, args: argparse.Namespace) -> dict[str, float]:
    store = Store.open(url)
    store.tenants.create("bench", {"v4": 1024, "v6e": 1024})
    token = store.tokens.issue("bench")
    with served(store, args.via) as (server, http):
        client = Client(server, token, http=http, timeout_s=300)
        client.submit_batch(bodies(100))  # warm-up: connections, caches, the first transaction
        work = bodies(args.jobs)
        started = time.perf_counter()
        for at in range(0, len(work), args.batch):
            client.submit_batch(work[at : at + args.batch])
        batch_s = time.perf_counter() - started
        started = time.perf_counter()
        for body in work[: args.single]:
            client.submit(
                body["command"], body["accelerator_type"], num_slices=body["num_slices"], env=body["env"]
            )
        single_s = time.perf_counter() - started
        concurrent_s = concurrently(server, token, http, work[: args.single], args.concurrent)
    queued = store.counts()["queued"]
    store.close()
    assert queued == 100 + args.jobs + 2 * args.single, queued
    return {
        "batch_jobs_s": args.jobs / batch_s,
        "single_jobs_s": args.single / single_s,
        "concurrent_jobs_s": args.single / concurrent_s,
    }


def concurrently(
    server: str, token: str, http: httpx.Client | None, work: list[dict[str, Any]], n: int
) -> float:
    """Seconds for ``n`` clients, each in its own thread, to submit ``work`` one job per request
    (every client takes the next job until none is left); an error in any is raised."""
    todo = iter(work)
    lock = threading.Lock()
    errors: list[BaseException] = []

    def client() -> None:
        mine = Client(server, token, http=http, timeout_s=300)
        try:
            while True:
                with lock:
                    body = next(todo, None)
                if body is None:
                    return
                mine.submit(
                    body["command"], body["accelerator_type"], num_slices=body["num_slices"], env=body["env"]
                )
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=client) for _ in range(n)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return time.perf_counter() - started


@contextlib.contextmanager
def postgres(args: argparse.Namespace) -> Iterator[str | None]:
    if args.pg_url or args.no_pg:
        yield args.pg_url
        return
    with postgres_server() as server:
        yield server.new_database() if server is not None else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=10_000)
    parser.add_argument("--single", type=int, default=500, help="jobs sent one by one, for comparison")
    parser.add_argument("--concurrent", type=int, default=40, help="clients sending --single jobs at once")
    parser.add_argument("--via", choices=("http", "inprocess"), default="http")
    parser.add_argument("--pg-url", default=None)
    parser.add_argument("--no-pg", action="store_true")
    args = parser.parse_args()
    print(
        f"{args.jobs:,} jobs in batches of {args.batch:,} via {args.via}; {args.single} single submits, "
        f"one at a time and from {args.concurrent} clients at once"
    )
    with tempfile.TemporaryDirectory() as tmp, postgres(args) as pg:
        urls = {"sqlite": f"sqlite:///{tmp}/bench.db"} | ({"postgresql": pg} if pg else {})
        for name, url in urls.items():
            got = run(url, args)
            print(
                f"{name:>10}: batch {got['batch_jobs_s']:8,.0f} jobs/s   "
                f"single {got['single_jobs_s']:6,.0f} jobs/s   "
                f"{args.concurrent} clients {got['concurrent_jobs_s']:6,.0f} jobs/s"
            )


if __name__ == "__main__":
    main()
