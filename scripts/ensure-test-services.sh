#!/usr/bin/env bash
# Installs what the test suite (and a jailed job runner) needs beyond Python packages, from Debian's packages, when it is missing.
# The tests start and stop their own servers; this script only makes sure the programs exist.
set -euo pipefail
need=()
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
command -v bwrap >/dev/null 2>&1 || need+=(bubblewrap)  # the runner jails every job with it
command -v chromium >/dev/null 2>&1 || need+=(chromium)  # the fleet page's browser tests (Playwright drives it)
command -v promtool >/dev/null 2>&1 || need+=(prometheus)  # promtool checks the alert rules; the end-to-end test scrapes with it
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null; then
    echo "installing test services: ${need[*]}"
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  else
    echo "warning: ${need[*]} missing and cannot be installed here (needs root + apt-get); those tests will be skipped with the reason" >&2
  fi
fi
