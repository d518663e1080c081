#!/usr/bin/env bash
# The integration and end-to-end tests as `make test` runs them: two pytest processes side by side.
#
#   scripts/side-by-side-tests.sh PYTHON [PYTEST ARGS...]
#
# One process runs the tests that share an emulated fleet (tests/conftest.py): those of
# tests/integration and the conformance suites' Ray cases (marked integration; their in-memory cases
# run with the unit tests); the other, at the same time, the tests that start a fleet or a control
# plane of their own (SOLO below: the demo, the chaos soak, the README tour, ...). Each runs its files
# on two pytest-xdist workers, a file to a worker (--dist loadfile: a file's tests keep their order
# and share their fixtures), so the shared fleet is two fleets, one per worker. The suite mostly
# waits (on grace periods, a soak's minute, a slice being made): one process kept the two cores 59 %
# busy; four, side by side, fill the gaps (12 min -> 5-6 min for this step). Nothing either runs
# looks at processes it did not start (leak checks go by PID or by the fleet's own temp dir), and
# each fleet picks free ports. The second process's output is shown when it ends.
# TPUFLEET_TEST_FLEET_DIR (a fleet of your own) wants one worker: pass -n 0.
set -uo pipefail
cd "$(dirname "$0")/.."
py=$1
shift

SOLO=(
  tests/e2e
  tests/integration/test_tour.py
  tests/integration/test_chaos.py
  tests/integration/test_autoscale_emulator.py
  tests/integration/test_serve_process.py
  tests/integration/test_tenancy_sandbox.py
)
ignore=()
for path in "${SOLO[@]}"; do
  if [[ $path == tests/integration/* ]]; then ignore+=("--ignore=$path"); fi
done

log=$(mktemp "${TMPDIR:-/tmp}/tpufleet-solo-tests.XXXXXX")
"$py" -m pytest "${SOLO[@]}" -n 2 --dist loadfile --durations=10 "$@" >"$log" 2>&1 &
solo=$!
# An interrupted run (Ctrl-C, a CI timeout) stops the second process too, by its PID.
trap 'kill "$solo" 2>/dev/null; rm -f "$log"' EXIT

"$py" -m pytest tests/integration tests/conformance -m integration "${ignore[@]}" -n 2 --dist loadfile --durations=25 "$@"
shared=$?
wait "$solo"
own=$?
echo
echo "======== beside it: the tests that start their own fleet or control plane ========"
cat "$log"
if ((shared != 0)); then exit "$shared"; fi
exit "$own"
