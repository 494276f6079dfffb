#!/usr/bin/env bash
# The test command: installs vf's npm dependencies (quietly), prepares what the tests need
# (tests/setup.sh), runs every test with `deno test`, and ends with one line
# "N passed, N failed".
#
# Type-checking does not hold the tests back: one `deno test --no-run` type-checks every test
# module, cli.ts and scripts/*.ts in one process over one shared module graph while the tests
# already run with `--no-check`; a type error still fails the run, counted as one more failure
# and printed after the tests with the checker's messages.
set -uo pipefail
cd "$(dirname "$0")/.."

if command -v deno >/dev/null 2>&1; then
  DENO=(deno)
else
  DENO=(npx --yes deno@2.9.6)
fi

if ! "${DENO[@]}" install -q; then
  echo "deno install failed: vf's npm dependencies are missing (is the npm registry reachable?)" >&2
  echo "0 passed, 1 failed"
  exit 1
fi

if ! bash tests/setup.sh; then
  echo "tests/setup.sh failed: the Docker-backed tests cannot run" >&2
  echo "0 passed, 1 failed"
  exit 1
fi

LOG=$(mktemp)
CHECK_LOG=$(mktemp)
# The type check covers the test modules and the entry points no test imports (the CLI, the
# scripts), so a type error in cli.ts fails the run too; with no arguments, every test module.
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(.)
"${DENO[@]}" test --no-run --quiet "${targets[@]}" cli.ts scripts/*.ts >"$CHECK_LOG" 2>&1 &
check_pid=$!

"${DENO[@]}" test -A --parallel --no-check "$@" 2>&1 | tee "$LOG"
status=${PIPESTATUS[0]}
# deno prints e.g. "ok | 120 passed (3 steps) | 0 failed (12s)" or "FAILED | 3 passed | 1 failed"
summary=$(sed 's/\x1b\[[0-9;]*m//g' "$LOG" | grep -E '(ok|FAILED) \| [0-9]+ passed' | tail -1)
passed=$(sed -E 's/.*\| ([0-9]+) passed.*/\1/' <<<"$summary")
failed=$(sed -E 's/.*\| ([0-9]+) failed.*/\1/' <<<"$summary")
if [ -z "$summary" ]; then
  passed=0
  failed=1
  [ "$status" = 0 ] && status=1
fi

if ! wait "$check_pid"; then
  echo >&2
  cat "$CHECK_LOG" >&2
  echo "type check failed: the errors above (deno test --no-run) count as 1 failure" >&2
  failed=$((failed + 1))
  [ "$status" = 0 ] && status=1
fi
rm -f "$LOG" "$CHECK_LOG"
echo "${passed} passed, ${failed} failed"
exit "$status"
