/**
 * Steering a running eval from outside: {@linkcode RunControl} is a start gate that can pause
 * the run, resume it and change how many rollouts run at once; {@linkcode serveControl} puts
 * it on an owner-only unix socket that `vf ctl` talks to, one JSON line each way. Every
 * action is kept and written into the run's metadata (`control.actions`).
 * @module
 */

import { chmod, lstat, mkdir, readdir, rm } from "node:fs/promises";
import { createServer, type Server, type Socket } from "node:net";
import { homedir } from "node:os";
import { join } from "node:path";
import type { Progress, StartGate } from "./evaluate.ts";

/** One action taken on a run, as metadata records it. */
export interface ControlAction {
  /** ISO time the action was taken. */
  at: string;
  action: "pause" | "resume" | "set";
  /** `set`: the new `max_concurrent`. */
  max_concurrent?: number;
}

/** What `vf ctl status` shows: counts only, never transcripts. */
export interface ControlStatus {
  run_id: string;
  pid: number;
  paused: boolean;
  max_concurrent: number;
  in_flight: number;
  queued: number;
  done: number;
  total: number;
  errors: number;
  avg_reward: number;
  rollouts_per_s: number;
  elapsed_s: number;
  /** Seconds since the last rollout finished while others were in flight, or null. */
  no_progress_s: number | null;
  /** In flight with no rollout finished for `stall_after_s`. */
  stalled: boolean;
  stall_after_s: number;
  actions: ControlAction[];
  /** What the run adds (its spend). */
  live?: Record<string, unknown>;
}

/**
 * A start gate steered at run time: `pause()` lets what runs finish and starts nothing more;
 * `setMaxConcurrent(n)` bounds the rollouts in flight (up to the run's worker ceiling).
 */
export class RunControl implements StartGate {
  readonly runId: string;
  readonly actions: ControlAction[] = [];
  #paused = false;
  #limit: number;
  #inFlight = 0;
  #waiters: Array<() => void> = [];
  #total: number;
  #done = 0;
  #errors = 0;
  #avgReward = 0;
  #started = Date.now();
  #lastProgress = Date.now();
  #stallAfterMs: number;
  #live?: () => Record<string, unknown> | undefined;
  #stopped = false;

  /**
   * @param runId the run's id (its folder name)
   * @param options.maxConcurrent rollouts in flight at once to begin with
   * @param options.total rollouts the run will make
   * @param options.stallAfterS seconds without a finished rollout that count as a stall; default 60
   * @param options.live fields status adds (the run's spend)
   */
  constructor(
    runId: string,
    options: {
      maxConcurrent: number;
      total?: number;
      stallAfterS?: number;
      live?: () => Record<string, unknown> | undefined;
    },
  ) {
    this.runId = runId;
    this.#limit = Math.max(1, options.maxConcurrent);
    this.#total = options.total ?? 0;
    this.#stallAfterMs = (options.stallAfterS ?? 60) * 1000;
    this.#live = options.live;
  }

  get paused(): boolean {
    return this.#paused;
  }

  get maxConcurrent(): number {
    return this.#limit;
  }

  /** Sets the number of rollouts the run will make (known once the dataset is loaded). */
  set total(n: number) {
    this.#total = n;
  }

  /** Waits while paused or full; a group bigger than the limit runs alone. */
  async allows(size = 1): Promise<boolean> {
    while (this.#paused || (this.#inFlight > 0 && this.#inFlight + size > this.#limit)) {
      if (this.#stopped) return false;
      await new Promise<void>((resolve) => this.#waiters.push(resolve));
    }
    if (this.#stopped) return false;
    this.#inFlight += size;
    return true;
  }

  finished(_outcome?: unknown, size = 1): void {
    this.#inFlight = Math.max(0, this.#inFlight - size);
    this.#wake();
  }

  /** Hears the run's progress (what `status` reports). */
  progress(p: Pick<Progress, "done" | "total" | "errors" | "avgReward">): void {
    this.#done = p.done;
    this.#total = p.total;
    this.#errors = p.errors;
    this.#avgReward = p.avgReward;
    this.#lastProgress = Date.now();
  }

  /** The run is stopping (interrupted): nothing waits for a resume any more. */
  stop(): void {
    this.#stopped = true;
    this.#wake();
  }

  pause(): ControlAction {
    this.#paused = true;
    return this.#record({ at: new Date().toISOString(), action: "pause" });
  }

  resume(): ControlAction {
    this.#paused = false;
    this.#lastProgress = Date.now();
    this.#wake();
    return this.#record({ at: new Date().toISOString(), action: "resume" });
  }

  /** @throws {RangeError} for a limit that is not a positive integer */
  setMaxConcurrent(n: number): ControlAction {
    if (!Number.isInteger(n) || n < 1) {
      throw new RangeError(`max_concurrent must be a positive integer, got ${JSON.stringify(n)}`);
    }
    this.#limit = n;
    this.#wake();
    return this.#record({ at: new Date().toISOString(), action: "set", max_concurrent: n });
  }

  status(): ControlStatus {
    const now = Date.now();
    const elapsed = (now - this.#started) / 1000;
    const noProgress = this.#inFlight > 0 ? (now - this.#lastProgress) / 1000 : null;
    const live = this.#live?.();
    return {
      run_id: this.runId,
      pid: process.pid,
      paused: this.#paused,
      max_concurrent: this.#limit,
      in_flight: this.#inFlight,
      queued: Math.max(0, this.#total - this.#done - this.#inFlight),
      done: this.#done,
      total: this.#total,
      errors: this.#errors,
      avg_reward: this.#avgReward,
      rollouts_per_s: elapsed > 0 ? this.#done / elapsed : 0,
      elapsed_s: elapsed,
      no_progress_s: noProgress,
      stalled: noProgress !== null && noProgress * 1000 >= this.#stallAfterMs,
      stall_after_s: this.#stallAfterMs / 1000,
      actions: [...this.actions],
      ...(live ? { live } : {}),
    };
  }

  /** What metadata.json records under `control`. */
  metadata(): Record<string, unknown> {
    return {
      control: { paused: this.#paused, max_concurrent: this.#limit, actions: [...this.actions] },
    };
  }

  #record(action: ControlAction): ControlAction {
    this.actions.push(action);
    return action;
  }

  #wake(): void {
    const waiters = this.#waiters;
    this.#waiters = [];
    for (const w of waiters) w();
  }
}

/** Where control sockets live: `VF_CTL_DIR`, else `~/.cache/vf/ctl`. */
export function controlDir(): string {
  return process.env.VF_CTL_DIR || join(homedir(), ".cache", "vf", "ctl");
}

/** A request `vf ctl` sends. */
export type ControlRequest =
  | { action: "status" }
  | { action: "pause" }
  | { action: "resume" }
  | { action: "set"; max_concurrent: number };

/** Answers one request: `{ ok: true, status }` or `{ ok: false, error }`. */
export function handleControl(control: RunControl, request: unknown): Record<string, unknown> {
  const r = request as Partial<{ action: string; max_concurrent: unknown }> | null;
  try {
    switch (r?.action) {
      case "status":
        break;
      case "pause":
        control.pause();
        break;
      case "resume":
        control.resume();
        break;
      case "set":
        control.setMaxConcurrent(Number(r.max_concurrent));
        break;
      default:
        throw new RangeError(
          `Unknown action ${JSON.stringify(r?.action)}; known: status, pause, resume, set`,
        );
    }
    return { ok: true, status: control.status() };
  } catch (error) {
    return { ok: false, error: error instanceof Error ? error.message : String(error) };
  }
}

/**
 * Serves `control` on `<dir>/<run id>.sock`, readable and writable by its owner only (the
 * folder is 0700, the socket 0600). Close it with the returned function.
 * @throws {Error} when the folder belongs to someone else or is open to others
 */
export async function serveControl(
  control: RunControl,
  options: { dir?: string } = {},
): Promise<{ path: string; close: () => Promise<void> }> {
  const dir = options.dir ?? controlDir();
  await mkdir(dir, { recursive: true, mode: 0o700 });
  const info = await lstat(dir);
  if (!info.isDirectory() || (process.getuid && info.uid !== process.getuid())) {
    throw new Error(
      `Control folder "${dir}" is not a folder of this user; remove it or set VF_CTL_DIR`,
    );
  }
  await chmod(dir, 0o700);
  const path = join(dir, `${control.runId}.sock`);
  await rm(path, { force: true });
  const sockets = new Set<Socket>();
  const server: Server = createServer((socket) => {
    sockets.add(socket);
    socket.on("close", () => sockets.delete(socket));
    socket.on("error", () => {});
    let buffer = "";
    socket.setEncoding("utf8");
    socket.on("data", (chunk: string) => {
      buffer += chunk;
      if (buffer.length > 64 * 1024) socket.destroy();
      const end = buffer.indexOf("\n");
      if (end < 0) return;
      let request: unknown;
      try {
        request = JSON.parse(buffer.slice(0, end));
      } catch {
        request = null;
      }
      socket.end(JSON.stringify(handleControl(control, request)) + "\n");
    });
  });
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(path, () => resolve());
  });
  await chmod(path, 0o600);
  server.unref();
  return {
    path,
    close: async () => {
      for (const s of sockets) s.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
      await rm(path, { force: true });
    },
  };
}

/** The run ids with a control socket in `dir`. */
export async function listControlSockets(dir = controlDir()): Promise<string[]> {
  const names = await readdir(dir).catch(() => [] as string[]);
  return names.filter((n) => n.endsWith(".sock")).map((n) => n.slice(0, -".sock".length)).sort();
}
