#!/usr/bin/env bash
# The whole pytest suite as `make test` runs it: three pytest processes side by side.
#
#   scripts/side-by-side-tests.sh PYTHON [PYTEST ARGS...]
#
# - fast: the host tests, the unit tests and the conformance suites' in-memory cases, at a lower
#   CPU priority (nice 10), on three workers a test at a time (--dist worksteal: each worker starts
#   on a third of them in order, the host tests on the first, and takes from the others' ends once
#   its own have run out);
# - shared: the tests that share an emulated fleet (tests/conftest.py): those of tests/integration
#   and the conformance suites' Ray cases (marked integration), on two workers a file at a time
#   (--dist loadfile: a file's tests keep their order and share their fixtures), so the shared fleet
#   is two fleets, one per worker;
# - own: beside them, the tests that start a fleet or a control plane of their own (SOLO below:
#   the demo, the chaos soaks, the README tour, ...), also two workers a file at a time. The
#   replicas' soak (tests/host) is one of them: a minute and a half that mostly waits, which took
#   one of the fast stream's three workers (the longest stream) for that long. So is the API
#   processes' file (tests/host): its serves, started niced in the fast stream, took a minute to
#   answer while the fleets ran.
#
# The three keep both cores busy from the fleets' start to the end (/proc/stat sampled every 5 s on
# a clean clone: 1.9 to 2.0 cores busy throughout, 2026-12-06), so the run takes about its CPU time
# over two: ~1,400 CPU-s of its own processes, most of them Ray workers the fleet tests start (Ray
# Train's actors, the JAX and PyTorch processes on the hosts, the control plane's runner actors).
# Where it went on a clean clone (2026-12-07: every process's CPU sampled twice a second, each
# charged to the test running on the pytest worker whose fleet it belongs to; 1,824 CPU-s in all,
# with the 65 of the bootstrap and the lint's):
# - 262 Ray worker processes, ~490 CPU-s. A Ray job's workers start twice (Ray's setup_worker,
#   then the worker: its runtime_env), ~2.6 CPU-s each; the others ~1.4.
# - A Ray Train run is ~40-50 CPU-s (its controller, synchronisation, preemption-watcher and
#   placement-group-cleaner actors, the JobSupervisor, Ray Data's when it feeds the workers, two
#   workers importing JAX): test_ray_jobs's story test (five runs) 267, its TorchTrainer test 79.
# - tpufleet demo --chaos 174, the README and docs tour 166 (115 alone; four fleets of its own),
#   the PyTorch jobs 139 (a torch_xla process ~10 CPU-s, a torch one ~3), the chaos soak 74.
# - 14 Ray clusters, each head ~13 CPU-s to start; the pytest workers' own work ~310 (collecting
#   the fast stream's tests is ~11 CPU-s a worker).
# The fast stream runs niced so that the fleets' processes, whose tests wait on start-ups, grace
# periods and timeouts, always come first: it does most of its work once the fleet streams are done.
# Nothing any of them runs looks at processes it did not start (leak checks go by PID or by the
# fleet's own temp dir; tests/host/conftest.py keeps the host tests that sweep or scan processes
# apart), and each fleet picks free ports. The outputs are shown in that order once all have ended.
# TPUFLEET_TEST_FLEET_DIR (a fleet of your own) wants one worker: pass -n 0.
set -uo pipefail
cd "$(dirname "$0")/.."
py=$1
shift

SOLO=(
  tests/e2e
  tests/host/test_chaos_replicas.py
  tests/host/test_api_processes.py
  tests/integration/test_tour.py
  tests/integration/test_chaos.py
  tests/integration/test_autoscale_emulator.py
  tests/integration/test_serve_process.py
  tests/integration/test_tenancy_sandbox.py
)
ignore=()       # what the shared stream leaves to the own one
fast_ignore=()  # what the fast stream leaves to the own one
for path in "${SOLO[@]}"; do
  if [[ $path == tests/integration/* ]]; then ignore+=("--ignore=$path"); fi
  if [[ $path == tests/host/* ]]; then fast_ignore+=("--ignore=$path"); fi
done

# pytest keeps the test modules it rewrote (its assertions) in __pycache__ only where Python may write
# bytecode: with PYTHONDONTWRITEBYTECODE=1 (this machine's environment) each of the seven workers
# rewrote every module it collects again, ~4.7 CPU-s more for each of the fast stream's three.
unset PYTHONDONTWRITEBYTECODE
fast_log=$(mktemp "${TMPDIR:-/tmp}/tpufleet-fast-tests.XXXXXX")
own_log=$(mktemp "${TMPDIR:-/tmp}/tpufleet-own-fleet-tests.XXXXXX")
# One JAX compilation cache for the hosts of every emulated fleet the three start (plan.py's
# jax_cache_env): the same examples run on them again and again, and each compile is ~1 CPU-s.
TPUFLEET_EMULATOR_JAX_CACHE=$(mktemp -d "${TMPDIR:-/tmp}/tpufleet-jax-cache.XXXXXX")
export TPUFLEET_EMULATOR_JAX_CACHE
pids=()
# An interrupted run (Ctrl-C, a CI timeout) stops the background processes too, by their PIDs.
trap 'kill "${pids[@]}" 2>/dev/null; rm -rf "$fast_log" "$own_log" "$TPUFLEET_EMULATOR_JAX_CACHE"' EXIT

nice -n 10 "$py" -m pytest tests/host tests/unit tests/conformance -m "not integration" "${fast_ignore[@]}" \
  -n 3 --dist worksteal --durations=10 "$@" >"$fast_log" 2>&1 &
fast=$!
pids+=("$fast")
"$py" -m pytest "${SOLO[@]}" -n 2 --dist loadfile --durations=10 "$@" >"$own_log" 2>&1 &
own=$!
pids+=("$own")

"$py" -m pytest tests/integration tests/conformance -m integration "${ignore[@]}" -n 2 --dist loadfile --durations=25 "$@"
shared=$?
wait "$fast"
fast_rc=$?
wait "$own"
own_rc=$?
echo
echo "======== beside it: the unit, host and in-memory conformance tests (nice 10) ========"
cat "$fast_log"
echo
echo "======== beside it: the tests that start their own fleet or control plane ========"
cat "$own_log"
for rc in "$fast_rc" "$shared" "$own_rc"; do
  if ((rc != 0)); then exit "$rc"; fi
done
exit 0
