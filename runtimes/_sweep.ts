/**
 * The sweep: a POSIX sh script, run as root in a sandbox, that kills every process there but
 * the runtime's own, so nothing an agent left running (a daemon reparented to init, a detached
 * exec, a process of another user) can act afterwards. It backs `Runtime.killProcesses`.
 * @module
 */

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
ticks=0
for n in $stopped; do
  spins=0
  while :; do
    st=Z
    while read -r k v rest; do
      if [ "$k" = "State:" ]; then st=$v; break; fi
    done 2>/dev/null <"/proc/$n/status"
    case $st in Z|X) break ;; esac
    if [ "$spins" -lt 50 ]; then spins=$((spins + 1)); continue; fi
    if [ "$ticks" -ge 40 ]; then left=$((left + 1)); break; fi
    ticks=$((ticks + 1))
    sleep 0.05 2>/dev/null || sleep 1
  done
done
echo "$left"`;
