/**
 * The process-kill scripts every backend runs in its sandboxes, all POSIX sh: the sweep of a
 * container (`SWEEP`) and of a dedicated SSH host (`SWEEP_TAGGED`), which back
 * `Runtime.killProcesses` so nothing an agent left running (a daemon reparented to init, a
 * detached exec, a process of another user) can act afterwards, and the process-tree kills
 * (`KILL_TREES`, `KILL_BELOW`) of a command that timed out or was cancelled. They share one
 * wait for the killed to be gone ({@linkcode awaitGone}); the TypeScript side of a sweep
 * (its timeout, reading its answer) is in `lifecycle.ts`.
 * @module
 */

/**
 * The wait every kill script ends with, over the pids in `$<list>`: a few reads of each one's
 * status, then 50 ms naps, until it is gone (a zombie counts as gone), 2 s in all at most.
 * With `count`, a pid still alive then adds one to `$left` (which the script has set), and a
 * `sleep` that takes no fraction naps 1 s instead; without, the wait just ends there.
 */
export function awaitGone(list: string, count: boolean): string {
  return `ticks=0
for n in $${list}; do
  spins=0
  while :; do
    st=Z
    while read -r k v rest; do
      if [ "$k" = "State:" ]; then st=$v; break; fi
    done 2>/dev/null <"/proc/$n/status"
    case $st in Z|X) break ;; esac
    if [ "$spins" -lt 50 ]; then spins=$((spins + 1)); continue; fi
    if [ "$ticks" -ge 40 ]; then ${count ? "left=$((left + 1)); " : ""}break; fi
    ticks=$((ticks + 1))
    sleep 0.05 2>/dev/null || ${count ? "sleep 1" : "break"}
  done
done`;
}

/**
 * Arguments: the process name of the container's own command (`sleep`) or `-`, then the pids
 * to spare (the command channel's supervisors). PID 1 and the sweep itself are always spared.
 * When PID 1 is not that command (an init runs it, as Docker's does), the oldest child of PID
 * 1 by that name is spared too: killing it would stop the container. No process can be older
 * than the command, so a look-alike an agent left is not spared.
 *
 * Every other process is stopped as it is found (so none can fork away), pass after pass until
 * a pass finds no new one; then all are SIGKILLed and waited for (2 s at most). It prints the
 * number of processes still alive after that, those it was not allowed to signal included (0
 * when the sweep succeeded), and exits 0; without `/proc` it prints `noproc`.
 */
export const SWEEP = `me=$$
keep=" 1 $me "
want=$1
shift
for p in "$@"; do keep="$keep$p "; done
[ -d /proc/self ] || { echo noproc; exit 0; }
st=
read -r st 2>/dev/null </proc/1/stat
c=\${st#*\\(}
if [ "$want" != - ] && [ "\${c%\\)*}" != "$want" ]; then
  main=
  first=
  for d in /proc/[0-9]*; do
    st=
    read -r st 2>/dev/null <"$d/stat" || continue
    c=\${st#*\\(}
    [ "\${c%\\)*}" = "$want" ] || continue
    st=\${st##*) }
    set -- $st
    [ "$2" = 1 ] || continue
    t=\${20}
    if [ -z "$first" ] || [ "$t" -lt "$first" ]; then first=$t; main=\${d#/proc/}; fi
  done
  [ -n "$main" ] && keep="$keep$main "
fi
stopped=" "
denied=" "
changed=1
while [ "$changed" = 1 ]; do
  changed=0
  for d in /proc/[0-9]*; do
    n=\${d#/proc/}
    case "$keep$stopped$denied" in *" $n "*) continue ;; esac
    st=
    read -r st 2>/dev/null <"$d/stat" || continue
    st=\${st##*) }
    set -- $st
    [ "$2" = "$me" ] && continue
    if ! kill -STOP "$n" 2>/dev/null; then
      # Gone meanwhile, or not ours to signal (a sandbox user that is not root): a survivor.
      [ -e "$d" ] && denied="$denied$n "
      continue
    fi
    stopped="$stopped$n "
    changed=1
  done
done
for n in $stopped; do kill -KILL "$n" 2>/dev/null; done
left=0
for n in $denied; do
  st=Z
  while read -r k v rest; do
    if [ "$k" = "State:" ]; then st=$v; break; fi
  done 2>/dev/null <"/proc/$n/status"
  case $st in Z|X) ;; *) left=$((left + 1)) ;; esac
done
${awaitGone("stopped", true)}
echo "$left"`;

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
${awaitGone("dead", false)}
exit 0`;
}

/** Kills the process trees (groups and every descendant) of the pids given. */
export const KILL_TREES = killScript(true);

/** Kills every process below the pids given (channel supervisors), never the pids themselves. */
export const KILL_BELOW = killScript(false);

/**
 * The sweep of a dedicated host: kills every process whose initial environment carries the
 * sandbox's tag (`$1`, `VF_SANDBOX_ID=vf-<hex>`, which every command of the sandbox is started
 * with), so a daemon that left its tree (`setsid`, a double fork) cannot act after the sandbox
 * is released. Each is stopped as it is found (so none forks away), pass after pass until a
 * pass finds no new one, then all are SIGKILLed and waited for ({@linkcode awaitGone}). Prints the number
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
${awaitGone("stopped", true)}
echo "$left"`;
