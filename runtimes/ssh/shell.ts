/**
 * The POSIX shell snippets the SSH runtime runs on a host (and the kubernetes runtime in its
 * containers): quoting, the command wrapper (working directory, environment, process group),
 * workdir setup, and file reads and writes over a command. The kill scripts are in
 * `runtimes/_sweep.ts`.
 * @module
 */

// ---- remote shell snippets -------------------------------------------------------------

/** Quotes a word for a POSIX shell. */
export function shellQuote(word: string): string {
  return /^[\w@%+=:,./-]+$/.test(word) ? word : `'${word.replace(/'/g, `'\\''`)}'`;
}

/** A command line that runs `script` under /bin/sh whatever the login shell is. */
export function shCommand(script: string, args: string[]): string {
  return `exec /bin/sh -c ${shellQuote(script)} vf ${args.map(shellQuote).join(" ")}`;
}

/** Control lines the wrappers print first on stderr, then strip. */
export const CONTROL = 0x1f;

/**
 * Runs "$@" in directory $1. sshd starts every exec in a new session (setsid), so the
 * command's pid, reported on stderr's first line, is also its process group.
 */
export const RUN_WRAPPER = `cd "$1" 2>/dev/null || { printf '\\037vf:nocwd\\n' >&2; exit 1; }
shift
printf '\\037vf:%s\\n' "$$" >&2
exec "$@"`;

/**
 * Prepares the workspace and reports what the host offers: "<uid> <switch>", where switch
 * is how commands change user (runuser for root, sudo -n, or none). $1 is the workdir and
 * $2 "new" (create it, failing when it exists) or "ensure" (mkdir -p).
 */
export const PREPARE =
  `if [ "$2" = new ]; then mkdir -m 755 -- "$1" || exit 3; else mkdir -p -- "$1" || exit 3; fi
uid=$(id -u)
if [ "$uid" = 0 ] && command -v runuser >/dev/null 2>&1; then sw=runuser
elif command -v sudo >/dev/null 2>&1 && sudo -n true >/dev/null 2>&1; then sw=sudo
else sw=none; fi
echo "$uid $sw"`;

export const ENV_NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;

/** Prints a file after checking it exists, is not a directory and fits `$2` bytes. */
export const READ_FILE = `[ -e "$1" ] || { printf '\\037vf:missing\\n' >&2; exit 1; }
[ -d "$1" ] && { printf '\\037vf:dir\\n' >&2; exit 1; }
s=$(( $(wc -c <"$1") )) || exit 1
if [ -n "$2" ] && [ "$s" -gt "$2" ]; then printf '\\037vf:big %s\\n' "$s" >&2; exit 1; fi
exec cat "$1"`;

export const WRITE_FILE = `d=$(dirname -- "$1")
mkdir -p -- "$d" || exit 1
cat >"$1" && chmod "$2" "$1"`;
