#!/usr/bin/env bash
# The unit, integration and end-to-end tests as `make test` runs them: three pytest processes side
# by side.
#
#   scripts/side-by-side-tests.sh PYTHON [PYTEST ARGS...]
#
# One process runs the tests that share the session's emulated fleet (tests/integration/conftest.py),
# one after another as they must; the second, at the same time, the tests that start a fleet or a
# control plane of their own (SOLO below: the demo, the chaos soak, the README tour, ...); the
# third, the unit tests (but those in HOST_TESTS, which scan or kill the host's processes and
# run alone before this script; `make test` passes them as --ignore). Measured per test (CPU time
# of the whole machine against wall time), the two integration processes keep the two cores only
# ~78 % busy over their ~12 minutes (much of the suite waits: on grace periods, on a soak's minute,
# on a slice being made), which is about the unit tests' own CPU time; beside them, the unit tests
# fill those gaps instead of running before them. Nothing any of them runs looks at processes it did
# not start (leak checks go by PID or by the fleet's own temp dir), and each fleet picks free ports.
# The other processes' output is shown when they end.
set -uo pipefail
cd "$(dirname "$0")/.."
py=$1
shift
unit_args=()
while (($#)) && [[ $1 == --ignore=* ]]; do  # leading --ignore=...: unit tests that must not run here
  unit_args+=("$1")
  shift
done

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

solo_log=$(mktemp "${TMPDIR:-/tmp}/tpufleet-solo-tests.XXXXXX")
unit_log=$(mktemp "${TMPDIR:-/tmp}/tpufleet-unit-tests.XXXXXX")
"$py" -m pytest "${SOLO[@]}" --durations=10 "$@" >"$solo_log" 2>&1 &
solo=$!
"$py" -m pytest tests/unit "${unit_args[@]}" -q --durations=10 "$@" >"$unit_log" 2>&1 &
unit=$!
# An interrupted run (Ctrl-C, a CI timeout) stops the other processes too, by their PIDs.
trap 'kill "$solo" "$unit" 2>/dev/null; rm -f "$solo_log" "$unit_log"' EXIT

"$py" -m pytest tests/integration "${ignore[@]}" --durations=25 "$@"
shared=$?
wait "$solo"
own=$?
wait "$unit"
units=$?
echo
echo "======== beside it: the tests that start their own fleet or control plane ========"
cat "$solo_log"
echo
echo "======== beside it: the unit tests ========"
cat "$unit_log"
for rc in "$shared" "$own" "$units"; do
  if ((rc != 0)); then exit "$rc"; fi
done
exit 0
