/**
 * The process-wide registry of live runtimes. Runtimes add themselves when they start and
 * remove themselves when they stop. While any is live, the registry listens for SIGINT and
 * SIGTERM (stops them all, then exits 130 or 143), for SIGHUP (the same, exit 129: a closed
 * terminal or dropped ssh session never reaches what runs in a session of its own, such as a
 * toolset's server; not under `nohup`), for `beforeExit` (stops them when the
 * program ends without doing so) and for `exit` (a last synchronous best effort, e.g.
 * removing a subprocess runtime's temp dir), which also runs when the process dies of an
 * exception or rejection nothing caught (Deno sends no exit event then). Listeners are installed lazily with the first
 * live runtime and removed with the last, so a program without runtimes is untouched.
 * Anything else that must not outlive the process registers the same way: a toolset's local
 * stdio server (type `"toolset"`, lib/tools/local_stdio.ts) ends its process tree on stop.
 * @module
 */

import { readFileSync } from "node:fs";
import process from "node:process";

/** What the registry needs from a runtime. */
export interface Tracked {
  readonly type: string;
  readonly id: string;
  stop(): Promise<void>;
  /** Synchronous last-resort cleanup at process exit, when the runtime can do one. */
  stopSync?(): void;
}

const live = new Set<Tracked>();
let installed = false;
let stopping: Promise<void> | undefined;

/** How long signal-driven cleanup may take before the process exits anyway. */
const CLEANUP_DEADLINE_MS = 15_000;

function onSignal(signal: "SIGINT" | "SIGTERM" | "SIGHUP"): void {
  const code = signal === "SIGINT" ? 130 : signal === "SIGHUP" ? 129 : 143;
  if (stopping) {
    // A second signal while cleaning up: give up on cleanup.
    process.exit(code);
  }
  stopping = stopAllRuntimes({ timeoutMs: CLEANUP_DEADLINE_MS });
  stopping.finally(() => process.exit(code));
}

const onSigint = () => onSignal("SIGINT");
const onSigterm = () => onSignal("SIGTERM");
const onSighup = () => onSignal("SIGHUP");

/**
 * Whether the process started with SIGHUP ignored (`nohup vf ...`). Read at import, before any
 * listener: Deno restores SIGHUP's default action as soon as any signal gets a listener.
 */
function hangupIgnoredAtStart(): boolean {
  if (process.platform === "win32") return false;
  const status = "/proc/self/status";
  try {
    // Asked first: a process without the permission must not be prompted for it.
    if (Deno.permissions.querySync({ name: "read", path: status }).state !== "granted") {
      return false;
    }
    const ignored = /^SigIgn:\s*([0-9a-f]+)$/m.exec(readFileSync(status, "utf8"));
    return ignored !== null && (BigInt(`0x${ignored[1]}`) & 1n) === 1n;
  } catch {
    return false; // not Linux: nothing says it is ignored
  }
}

/** Under `nohup` a hangup stays ignored, whatever listeners come and go. */
const nohup = hangupIgnoredAtStart();
if (nohup) process.on("SIGHUP", () => {});
const hangups = !nohup && process.platform !== "win32";

const onBeforeExit = () => {
  if (live.size > 0 && !stopping) {
    stopping = stopAllRuntimes({ timeoutMs: CLEANUP_DEADLINE_MS }).finally(() => {
      stopping = undefined;
    });
  }
};
const onExit = () => {
  for (const runtime of live) {
    try {
      runtime.stopSync?.();
    } catch {
      // best effort at exit
    }
  }
};

/**
 * vf is dying of an exception or rejection nothing caught: no exit event will come, so the
 * last synchronous cleanup runs now (unless a handler of the program's prevented the crash).
 */
const onCrash = (event: Event) => {
  if (!event.defaultPrevented) onExit();
};

let appHandlesSignals = false;

/**
 * Let the application handle SIGINT/SIGTERM itself (the CLI aborts its run, saves what is
 * finished and stops its runtimes); the registry then only cleans up at exit.
 */
export function setAppHandlesSignals(value: boolean): void {
  appHandlesSignals = value;
}

function install(): void {
  if (installed) return;
  installed = true;
  if (!appHandlesSignals) {
    process.on("SIGINT", onSigint);
    process.on("SIGTERM", onSigterm);
  }
  // The application's own handling covers SIGINT and SIGTERM; a hangup is always ours.
  if (hangups) process.on("SIGHUP", onSighup);
  process.on("beforeExit", onBeforeExit);
  process.on("exit", onExit);
  globalThis.addEventListener("error", onCrash);
  globalThis.addEventListener("unhandledrejection", onCrash);
}

function uninstall(): void {
  if (!installed) return;
  installed = false;
  process.off("SIGINT", onSigint);
  process.off("SIGTERM", onSigterm);
  if (hangups) process.off("SIGHUP", onSighup);
  process.off("beforeExit", onBeforeExit);
  process.off("exit", onExit);
  globalThis.removeEventListener("error", onCrash);
  globalThis.removeEventListener("unhandledrejection", onCrash);
}

/** Adds a runtime to the registry (runtimes call this when they start). */
export function trackRuntime(runtime: Tracked): void {
  live.add(runtime);
  install();
}

/** Removes a runtime from the registry (runtimes call this when they stop). */
export function untrackRuntime(runtime: Tracked): void {
  live.delete(runtime);
  if (live.size === 0) uninstall();
}

/** The runtimes started and not yet stopped in this process. */
export function liveRuntimes(): Tracked[] {
  return [...live];
}

/**
 * Stops every live runtime concurrently; failures are ignored (this is cleanup).
 * @param options.timeoutMs give up waiting after this long (default: wait for all)
 */
export async function stopAllRuntimes(options: { timeoutMs?: number } = {}): Promise<void> {
  const all = Promise.allSettled([...live].map((runtime) => runtime.stop()));
  if (options.timeoutMs === undefined) {
    await all;
    return;
  }
  let timer: ReturnType<typeof setTimeout> | undefined;
  await Promise.race([
    all,
    new Promise<void>((resolve) => (timer = setTimeout(resolve, options.timeoutMs))),
  ]);
  clearTimeout(timer);
}
