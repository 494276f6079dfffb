#!/usr/bin/env bash
# Puts `vf` on PATH: a small launcher in a bin folder that runs this checkout's cli.ts with
# Deno (or, with --binary, the single binary from `deno task compile`).
#
#   deno task install                      from a checkout (npx --yes deno@2.9.6 task install)
#   bash scripts/install.sh [options]      the same
#   curl -fsSL <raw URL of this file> | VF_REPO=<git URL> bash
#                                          no checkout yet: clones VF_REPO into VF_HOME first
#
# Options (or environment variables):
#   --bin-dir DIR   (VF_BIN_DIR)  where `vf` goes; default /usr/local/bin as root, else
#                                 ~/.local/bin. The folder is created; add it to PATH if it
#                                 is not there yet (the script says so).
#   --binary                      install dist/vf (built first when missing) instead of a
#                                 launcher: no Deno needed to run it afterwards
#   VF_HOME                       where a VF_REPO clone goes; default ~/.local/share/vf
#
# Deno: the `deno` on PATH, else `npx --yes deno@2.9.6`. A Deno that only npx's cache holds is
# copied into the bin folder beside `vf`, so `deno` is on PATH afterwards too.
set -euo pipefail

DENO_VERSION=2.9.6
log() { printf 'install: %s\n' "$*" >&2; }
die() {
  log "$*"
  exit 1
}

BIN_DIR=${VF_BIN_DIR:-}
BINARY=0
while [ $# -gt 0 ]; do
  case "$1" in
    --bin-dir)
      [ $# -ge 2 ] || die 'option "--bin-dir" needs a folder, e.g. --bin-dir ~/bin'
      BIN_DIR=$2
      shift 2
      ;;
    --bin-dir=*)
      BIN_DIR=${1#--bin-dir=}
      shift
      ;;
    --binary)
      BINARY=1
      shift
      ;;
    -h | --help)
      sed -n '2,20p' "${BASH_SOURCE[0]:-/dev/null}" 2>/dev/null | sed 's/^# \{0,1\}//'
      exit 0
      ;;
    *) die "unknown option \"$1\"; use --bin-dir DIR or --binary" ;;
  esac
done
if [ -z "$BIN_DIR" ]; then
  if [ "$(id -u)" = 0 ]; then BIN_DIR=/usr/local/bin; else BIN_DIR="$HOME/.local/bin"; fi
fi

# -- the checkout ---------------------------------------------------------------------------
is_checkout() { [ -f "$1/cli.ts" ] && [ -f "$1/deno.json" ]; }

ROOT=""
if [ -n "${BASH_SOURCE[0]:-}" ] && [ -f "${BASH_SOURCE[0]}" ]; then
  here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
  is_checkout "$here" && ROOT=$here
fi
if [ -z "$ROOT" ]; then
  [ -n "${VF_REPO:-}" ] ||
    die "not run from a vf checkout and VF_REPO is not set; set VF_REPO to vf's git URL"
  ROOT=${VF_HOME:-$HOME/.local/share/vf}
  command -v git >/dev/null 2>&1 || die "git is needed to fetch \"$VF_REPO\"; install git"
  if is_checkout "$ROOT" && [ -d "$ROOT/.git" ]; then
    log "updating $ROOT from $VF_REPO"
    git -C "$ROOT" pull -q --ff-only "$VF_REPO"
  else
    [ ! -e "$ROOT" ] || [ -z "$(ls -A "$ROOT")" ] ||
      die "VF_HOME \"$ROOT\" exists and is not a vf checkout; remove it or set VF_HOME"
    log "cloning $VF_REPO into $ROOT"
    git clone -q "$VF_REPO" "$ROOT"
  fi
  is_checkout "$ROOT" || die "\"$VF_REPO\" has no cli.ts and deno.json at its root"
  ROOT=$(cd "$ROOT" && pwd -P)
fi

mkdir -p "$BIN_DIR"
BIN_DIR=$(cd "$BIN_DIR" && pwd -P)
[ -w "$BIN_DIR" ] || die "cannot write to \"$BIN_DIR\"; choose another folder with --bin-dir"

# -- Deno -----------------------------------------------------------------------------------
# The real executable behind whatever `deno` is (npm's bin.cjs shim, a symlink).
deno_exe() { "$@" eval -q 'console.log(Deno.execPath())'; }

if command -v deno >/dev/null 2>&1; then
  DENO=$(deno_exe deno)
elif command -v npx >/dev/null 2>&1; then
  log "no deno on PATH; fetching deno@$DENO_VERSION with npx"
  DENO=$(deno_exe npx --yes "deno@$DENO_VERSION")
else
  die "neither deno nor npx is on PATH; install Node.js (for npx) or Deno first"
fi
[ -x "$DENO" ] || die "could not find the Deno executable (got \"$DENO\")"
case "$DENO" in
  */_npx/*)
    # npx's cache is not a place to run from later (npm may clean it): keep a copy.
    if [ "$DENO" != "$BIN_DIR/deno" ]; then
      cp "$DENO" "$BIN_DIR/deno.partial.$$"
      mv "$BIN_DIR/deno.partial.$$" "$BIN_DIR/deno"
      log "copied Deno $("$BIN_DIR/deno" --version | head -1 | cut -d' ' -f2) to $BIN_DIR/deno"
    fi
    DENO=$BIN_DIR/deno
    ;;
esac

# -- vf -------------------------------------------------------------------------------------
(cd "$ROOT" && "$DENO" install -q) ||
  die "could not install vf's npm dependencies in \"$ROOT\" (deno install failed)"

if [ $BINARY = 1 ]; then
  if [ ! -x "$ROOT/dist/vf" ]; then
    log "building $ROOT/dist/vf (deno task compile)"
    (cd "$ROOT" && "$DENO" run -A scripts/compile.ts) || die "deno task compile failed"
  fi
  cp "$ROOT/dist/vf" "$BIN_DIR/vf.partial.$$"
  mv "$BIN_DIR/vf.partial.$$" "$BIN_DIR/vf"
  what="the binary built from $ROOT"
else
  q() { printf "'%s'" "${1//\'/\'\\\'\'}"; }
  {
    printf '#!/bin/sh\n'
    printf '# vf: runs %s/cli.ts with Deno. Written by scripts/install.sh; run it again to\n' "$ROOT"
    printf '# update this file, or delete the file to uninstall.\n'
    # A young generation of 64 MiB semi-spaces, as `deno task vf` runs it: at hundreds of
    # rollouts in flight the default 16 MiB one is collected so often that copying the live
    # rollouts costs a tenth of a run's CPU (docs/benchmarks.md).
    printf 'exec %s run -A --v8-flags=--max-semi-space-size=64 %s "$@"\n' "$(q "$DENO")" "$(q "$ROOT/cli.ts")"
  } >"$BIN_DIR/vf.partial.$$"
  chmod 755 "$BIN_DIR/vf.partial.$$"
  mv "$BIN_DIR/vf.partial.$$" "$BIN_DIR/vf"
  what="a launcher for $ROOT/cli.ts (Deno $DENO)"
fi

log "installed $BIN_DIR/vf: $what"
case ":$PATH:" in
  *":$BIN_DIR:"*) log 'try: vf --version && vf demo' ;;
  *)
    log "$BIN_DIR is not on PATH; add it, e.g.:"
    log "  echo 'export PATH=\"$BIN_DIR:\$PATH\"' >> ~/.profile && export PATH=\"$BIN_DIR:\$PATH\""
    ;;
esac
