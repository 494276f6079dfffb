#!/usr/bin/env bash
# The test command: prepares what the tests need (tests/setup.sh), runs every test with
# `deno test`, and ends with one line "N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/.."

if command -v deno >/dev/null 2>&1; then
  DENO=(deno)
else
  DENO=(npx --yes deno@2.9.6)
fi

if ! bash tests/setup.sh; then
  echo "tests/setup.sh failed: the Docker-backed tests cannot run" >&2
  echo "0 passed, 1 failed"
  exit 1
fi

LOG=$(mktemp)
"${DENO[@]}" test -A --parallel "$@" 2>&1 | tee "$LOG"
status=${PIPESTATUS[0]}
# deno prints e.g. "ok | 120 passed (3 steps) | 0 failed (12s)" or "FAILED | 3 passed | 1 failed"
summary=$(sed 's/\x1b\[[0-9;]*m//g' "$LOG" | grep -E '(ok|FAILED) \| [0-9]+ passed' | tail -1)
passed=$(sed -E 's/.*\| ([0-9]+) passed.*/\1/' <<<"$summary")
failed=$(sed -E 's/.*\| ([0-9]+) failed.*/\1/' <<<"$summary")
rm -f "$LOG"
if [ -z "$summary" ]; then
  passed=0
  failed=1
  [ "$status" = 0 ] && status=1
fi
echo "${passed} passed, ${failed} failed"
exit "$status"
