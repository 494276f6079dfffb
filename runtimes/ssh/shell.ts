/**
 * The POSIX shell snippets the SSH runtime runs on a host (and the kubernetes and Docker
 * runtimes in their containers): quoting, the command wrapper (working directory,
 * environment, process group), process-tree kills, workdir setup, and file reads and writes
 * over a command.
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
 * A kill script over the pids given as arguments: it finds their descendants (following
 * processes that left the group), stopping each as it is found so none can fork away, then
 * SIGKILLs them and waits until the ones it could kill are gone (a few reads of their status,
 * then 50 ms naps, 2 s at most in all), so a caller that returns after it finds none left. Descendants come from the kernel's children lists where it has them (a
 * walk of the tree only); otherwise from every process's PPid under /proc, which on a host
 * with hundreds of processes costs a second or more per pass. With `roots`, the pids'
 * process groups and the pids themselves are stopped first and killed too; without, the pids
 * are left alive (a channel supervisor outlives the command it ran). Without /proc only the
 * groups are killed. `childrenLists: false` always walks /proc (for tests of that branch).
 */
export function killScript(roots: boolean, childrenLists = true): string {
  const stopRoot = roots ? ` kill -STOP -- "-$p" 2>/dev/null || kill -STOP "$p" 2>/dev/null;` : "";
  // The roots' own processes are killed (and waited for) only with `roots`.
  const killRoots = roots
    ? `for p in "$@"; do kill -KILL -- "-$p" 2>/dev/null; kill -KILL "$p" 2>/dev/null && dead="$dead $p"; done\n`
    : "";
  // A found pid joins $all and $kids and is stopped; another pass runs while one finds more.
  const found =
    `case "$all" in *" $n "*) ;; *) all="$all$n "; kids="$kids $n"; kill -STOP "$n" 2>/dev/null; changed=1 ;; esac`;
  return `all=" "
kids=
for p in "$@"; do all="$all$p ";${stopRoot} done
changed=1
if ${childrenLists ? "" : "false && "}[ -r "/proc/$$/task/$$/children" ]; then
  while [ "$changed" = 1 ]; do
    changed=0
    for p in $all; do
      for f in /proc/"$p"/task/*/children; do
        line=
        read -r line 2>/dev/null <"$f"
        for n in $line; do ${found}; done
      done
    done
  done
elif [ -d /proc/self ]; then
  while [ "$changed" = 1 ]; do
    changed=0
    for d in /proc/[0-9]*; do
      n=\${d#/proc/}
      case "$all" in *" $n "*) continue ;; esac
      [ -r "$d/status" ] || continue
      pp=
      while read -r k v rest; do
        if [ "$k" = "PPid:" ]; then pp=$v; break; fi
      done 2>/dev/null <"$d/status"
      case "$all" in *" $pp "*) ${found} ;; esac
    done
  done
fi
dead=
${killRoots}for n in $kids; do kill -KILL "$n" 2>/dev/null && dead="$dead $n"; done
ticks=0
for n in $dead; do
  spins=0
  while :; do
    st=Z
    while read -r k v rest; do
      if [ "$k" = "State:" ]; then st=$v; break; fi
    done 2>/dev/null <"/proc/$n/status"
    case $st in Z|X) break ;; esac
    if [ "$spins" -lt 50 ]; then spins=$((spins + 1)); continue; fi
    [ "$ticks" -lt 40 ] || break
    ticks=$((ticks + 1))
    sleep 0.05 2>/dev/null || break
  done
done
exit 0`;
}

/** Kills the process trees (groups and every descendant) of the pids given. */
export const KILL_TREES = killScript(true);

/** Kills every process below the pids given (channel supervisors), never the pids themselves. */
export const KILL_BELOW = killScript(false);

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

/**
 * The sweep of a dedicated host: kills every process whose initial environment carries the
 * sandbox's tag (`$1`, `VF_SANDBOX_ID=vf-<hex>`, which every command of the sandbox is started
 * with), so a daemon that left its tree (`setsid`, a double fork) cannot act after the sandbox
 * is released. Each is stopped as it is found (so none forks away), pass after pass until a
 * pass finds no new one, then all are SIGKILLed and waited for (2 s at most). Prints the number
 * still alive (0 on success), or `noproc` without `/proc`.
 */
export const SWEEP_TAGGED = `tag=$1
me=$$
[ -d /proc/self ] || { echo noproc; exit 0; }
stopped=" "
changed=1
while [ "$changed" = 1 ]; do
  changed=0
  for f in $(grep -laF -- "$tag" /proc/[0-9]*/environ 2>/dev/null); do
    n=\${f#/proc/}
    n=\${n%/environ}
    [ "$n" = "$me" ] && continue
    case "$stopped" in *" $n "*) continue ;; esac
    kill -STOP "$n" 2>/dev/null || continue
    stopped="$stopped$n "
    changed=1
  done
done
for n in $stopped; do kill -KILL "$n" 2>/dev/null; done
left=0
ticks=0
for n in $stopped; do
  while :; do
    st=Z
    while read -r k v rest; do
      if [ "$k" = "State:" ]; then st=$v; break; fi
    done 2>/dev/null <"/proc/$n/status"
    case $st in Z|X) break ;; esac
    if [ "$ticks" -ge 40 ]; then left=$((left + 1)); break; fi
    ticks=$((ticks + 1))
    sleep 0.05 2>/dev/null || sleep 1
  done
done
echo "$left"`;
