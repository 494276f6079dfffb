/**
 * Steering a running eval or taskset run from outside: {@linkcode RunControl} is a start gate
 * that can pause the run (after what is in flight, or now, sending it back to the queue),
 * resume it, requeue errored rollouts and change how many rollouts run at once, the sandbox
 * limits and the timeouts; {@linkcode serveControl} puts
 * it on an owner-only unix socket that `vf ctl` talks to, one JSON line each way. Every
 * action is kept and written into the run's metadata (`control.actions`). A run that tracks
 * its rollouts ({@linkcode RunControl.track}) has each one's last progress in `status`, so
 * `vf ctl status --stall N` lists those idle for N s.
 * @module
 */

import { chmod, lstat, mkdir, readdir, rm } from "node:fs/promises";
import { createServer, type Server, type Socket } from "node:net";
import { homedir } from "node:os";
import { join } from "node:path";
import type { Progress, RunSteering, StartGate } from "./evaluate.ts";
import { type Activity, type RolloutLabels, withActivity } from "../util/activity.ts";

export type { RunSteering };

/** One action taken on a run, as metadata records it. */
export interface ControlAction {
  /** ISO time the action was taken. */
  at: string;
  action: "pause" | "resume" | "set" | "requeue";
  /**
   * What it was given and did: `pause` its `mode` and the rollouts it `interrupted`; `set` the
   * knobs' new values; `requeue` the errored `rollouts` sent back to the queue.
   */
  args: Record<string, unknown>;
}

/** A rollout in flight that made no progress for the stall threshold: ids and labels only. */
export interface StalledRollout {
  /**
   * The rollout's id: `vf eval`'s `example <id> rollout <index>` (`example <id>` for a group
   * an environment runs as one unit), a taskset run's `task key#rollout index`.
   */
  id: string;
  /** The example it is a rollout of (a taskset run: the task's index), when known. */
  example_id?: number;
  /** Which rollout of its example it is, when known. */
  rollout_index?: number;
  /** What it last did: "model call", "model reply", "tool bash", "phase agent", ... */
  last: string;
  /** Seconds since it last did anything. */
  idle_s: number;
  /** Seconds since it started. */
  running_s: number;
}

/** What `vf ctl status` shows: counts only, never transcripts. */
export interface ControlStatus {
  run_id: string;
  pid: number;
  paused: boolean;
  max_concurrent: number;
  /** Every knob `set` can change (max_concurrent, sandbox limits, timeouts) and its value. */
  knobs: Record<string, number | null>;
  in_flight: number;
  queued: number;
  done: number;
  total: number;
  errors: number;
  /** Rollouts interrupted by `pause --now` and sent back to the queue. */
  interrupted: number;
  /** Errored rollouts sent back by `requeue`. */
  requeued: number;
  avg_reward: number;
  rollouts_per_s: number;
  elapsed_s: number;
  /** Seconds since the last rollout finished while others were in flight, or null. */
  no_progress_s: number | null;
  /** In flight with no rollout finished for `stall_after_s`. */
  stalled: boolean;
  stall_after_s: number;
  /**
   * Rollouts in flight idle for `stall_after_s` or more, longest idle first; absent when the
   * run does not track its rollouts.
   */
  stalled_rollouts?: StalledRollout[];
  /** Rollouts the run tracks in flight. */
  tracked?: number;
  actions: ControlAction[];
  /** What the run adds (its spend). */
  live?: Record<string, unknown>;
}

/** A rollout (or a group of them) in flight as the control tracks it. */
interface Tracked extends Activity {
  readonly exampleId?: number;
  readonly rolloutIndex?: number;
  /** Members of a group running now. */
  live: number;
}

/** A value `vf ctl set` can change while the run goes on. */
export interface ControlKnob {
  get(): number | null;
  /** @throws {RangeError} for a value the knob cannot take */
  set(value: number): void;
}

/** The labels of a rollout tracked without any. */
const NO_LABELS: RolloutLabels = Object.freeze({});

/**
 * A start gate steered at run time: `pause()` lets what runs finish and starts nothing more
 * (`pause("now")` interrupts it too, back to the queue); `setMaxConcurrent(n)` bounds the
 * rollouts in flight (up to the run's worker ceiling); `set()` changes any registered knob.
 */
export class RunControl implements StartGate, RunSteering {
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
  #interrupted = 0;
  #requeued = 0;
  #started = Date.now();
  #lastProgress = Date.now();
  #stallAfterMs: number;
  #live?: () => Record<string, unknown> | undefined;
  #stopped = false;
  #interrupt = new AbortController();
  #requeue: (() => number) | null = null;
  #knobs = new Map<string, ControlKnob>();
  #checkConcurrency?: (n: number) => void;
  #rollouts = new Set<Tracked>();
  #tracking = false;

  /**
   * @param runId the run's id (its folder name)
   * @param options.maxConcurrent rollouts in flight at once to begin with
   * @param options.total rollouts the run will make
   * @param options.stallAfterS seconds without a finished rollout that count as a stall; default 60
   * @param options.live fields status adds (the run's spend)
   * @param options.checkConcurrency throws for a `max_concurrent` the run cannot serve (a
   *   dedicated ssh host serves one rollout at a time)
   */
  constructor(
    runId: string,
    options: {
      maxConcurrent: number;
      total?: number;
      stallAfterS?: number;
      live?: () => Record<string, unknown> | undefined;
      checkConcurrency?: (n: number) => void;
    },
  ) {
    this.runId = runId;
    this.#limit = Math.max(1, options.maxConcurrent);
    this.#total = options.total ?? 0;
    this.#stallAfterMs = (options.stallAfterS ?? 60) * 1000;
    this.#live = options.live;
    this.#checkConcurrency = options.checkConcurrency;
    this.#knobs.set("max_concurrent", {
      get: () => this.#limit,
      set: (n) => {
        if (!Number.isInteger(n) || n < 1) {
          throw new RangeError(`max_concurrent must be a positive integer, got ${n}`);
        }
        this.#limit = n;
        this.#wake();
      },
    });
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

  get interrupt(): AbortSignal {
    return this.#interrupt.signal;
  }

  onRequeue(requeue: () => number): void {
    this.#requeue = requeue;
  }

  interrupted(n: number): void {
    this.#interrupted += n;
  }

  planned(total: number, done: number): void {
    this.#total = total;
    this.#done = done;
  }

  /** Lets `set` change `name` (a sandbox limit, a timeout) while the run goes on. */
  knob(name: string, knob: ControlKnob): void {
    this.#knobs.set(name, knob);
  }

  /**
   * Runs one rollout as `id`, tracking its progress (model calls, tool calls, phases noted with
   * `noteActivity`) for `status`'s stalled rollouts. A group run as one unit with
   * `labels.members` has each member its environment runs through `withRolloutActivity`
   * tracked as a rollout of its own, `<id> rollout <index>`; the group is listed itself only
   * while none of its members runs (before them, or scoring them after).
   */
  track<T>(id: string, fn: () => Promise<T>, labels: RolloutLabels = NO_LABELS): Promise<T> {
    this.#tracking = true;
    const now = Date.now();
    const members = labels.members;
    const activity: Tracked = {
      id,
      started: now,
      at: now,
      what: "started",
      exampleId: labels.exampleId,
      rolloutIndex: labels.rolloutIndex,
      live: 0,
      member: members ? (i, run) => this.#member(activity, members(i), run) : undefined,
    };
    const rollouts = this.#rollouts;
    rollouts.add(activity);
    // then()s, not an async frame held per rollout in flight.
    let running: Promise<T>;
    try {
      running = withActivity(activity, fn);
    } catch (error) {
      rollouts.delete(activity);
      return Promise.reject(error);
    }
    return running.then((value) => {
      rollouts.delete(activity);
      return value;
    }, (error) => {
      rollouts.delete(activity);
      throw error;
    });
  }

  async #member<T>(group: Tracked, rolloutIndex: number, fn: () => Promise<T>): Promise<T> {
    group.live++;
    try {
      return await this.track(`${group.id} rollout ${rolloutIndex}`, fn, {
        exampleId: group.exampleId,
        rolloutIndex,
      });
    } finally {
      // The group's own idle time starts when its last member ends.
      if (--group.live === 0) {
        group.at = Date.now();
        group.what = "rollouts done";
      }
    }
  }

  /**
   * Waits while paused or full; a group bigger than the limit runs alone. Answers at once
   * (no promise) when the group may start now, as it mostly may.
   */
  allows(size = 1): boolean | Promise<boolean> {
    if (this.#mustWait(size)) return this.#allowsLater(size);
    if (this.#stopped) return false;
    this.#inFlight += size;
    return true;
  }

  #mustWait(size: number): boolean {
    return this.#paused || (this.#inFlight > 0 && this.#inFlight + size > this.#limit);
  }

  async #allowsLater(size: number): Promise<boolean> {
    while (this.#mustWait(size)) {
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

  /**
   * Starts no more rollouts. `after` (the default) lets those in flight finish; `now`
   * interrupts them too: their model calls are aborted and they go back to the queue, neither
   * errors nor results, to run again on {@link resume}.
   */
  pause(mode: "now" | "after" = "after"): ControlAction {
    this.#paused = true;
    const args: Record<string, unknown> = { mode };
    if (mode === "now") {
      args.in_flight = this.#inFlight;
      const interrupt = this.#interrupt;
      this.#interrupt = new AbortController();
      interrupt.abort(new DOMException("Paused by vf ctl pause --now", "AbortError"));
    }
    return this.#record("pause", args);
  }

  resume(): ControlAction {
    this.#paused = false;
    this.#lastProgress = Date.now();
    this.#wake();
    return this.#record("resume", {});
  }

  /** Sends the run's errored rollouts back to the queue; their retried outcome replaces them. */
  requeue(): ControlAction {
    if (!this.#requeue) throw new RangeError("This run cannot requeue rollouts");
    const n = this.#requeue();
    this.#requeued += n;
    this.#wake();
    return this.#record("requeue", { rollouts: n });
  }

  /** @throws {RangeError} for a limit that is not a positive integer */
  setMaxConcurrent(n: number): ControlAction {
    return this.set({ max_concurrent: n });
  }

  /**
   * Changes knobs (`max_concurrent`, and what the run registered: sandbox limits, timeouts);
   * all are checked before any changes.
   * @throws {RangeError} naming an unknown knob or a value it cannot take
   */
  set(values: Record<string, unknown>): ControlAction {
    const entries = Object.entries(values);
    if (entries.length === 0) throw new RangeError("Nothing to set; give KEY=VALUE");
    for (const [name, value] of entries) {
      if (!this.#knobs.has(name)) {
        throw new RangeError(
          `Unknown setting ${JSON.stringify(name)}; this run has: ${
            [...this.#knobs.keys()].join(", ")
          }`,
        );
      }
      if (typeof value !== "number" || !Number.isFinite(value) || value <= 0) {
        throw new RangeError(`${name} must be a positive number, got ${JSON.stringify(value)}`);
      }
      if (name.startsWith("max_") && !Number.isInteger(value)) {
        throw new RangeError(`${name} must be a positive integer, got ${value}`);
      }
      if (name === "max_concurrent") this.#checkConcurrency?.(value);
    }
    for (const [name, value] of entries) this.#knobs.get(name)!.set(value as number);
    return this.#record("set", Object.fromEntries(entries));
  }

  /** Every knob and its value now. */
  knobs(): Record<string, number | null> {
    return Object.fromEntries([...this.#knobs].map(([name, k]) => [name, k.get()]));
  }

  /**
   * Counts, knobs, actions and stalls.
   * @param options.stallAfterS the stall threshold in seconds for this answer; default the
   *   run's (60)
   */
  status(options: { stallAfterS?: number } = {}): ControlStatus {
    const now = Date.now();
    const elapsed = (now - this.#started) / 1000;
    const noProgress = this.#inFlight > 0 ? (now - this.#lastProgress) / 1000 : null;
    const stallMs = options.stallAfterS !== undefined
      ? options.stallAfterS * 1000
      : this.#stallAfterMs;
    const live = this.#live?.();
    // A group whose members run is listed as its members.
    const tracked = this.#tracking ? [...this.#rollouts].filter((a) => a.live === 0) : undefined;
    const stalledRollouts = tracked
      ?.filter((a) => now - a.at >= stallMs)
      .sort((a, b) => a.at - b.at)
      .map((a): StalledRollout => ({
        id: a.id,
        ...(a.exampleId !== undefined ? { example_id: a.exampleId } : {}),
        ...(a.rolloutIndex !== undefined ? { rollout_index: a.rolloutIndex } : {}),
        last: a.what,
        idle_s: (now - a.at) / 1000,
        running_s: (now - a.started) / 1000,
      }));
    return {
      run_id: this.runId,
      pid: process.pid,
      paused: this.#paused,
      max_concurrent: this.#limit,
      knobs: this.knobs(),
      in_flight: this.#inFlight,
      queued: Math.max(0, this.#total - this.#done - this.#inFlight),
      done: this.#done,
      total: this.#total,
      errors: this.#errors,
      interrupted: this.#interrupted,
      requeued: this.#requeued,
      avg_reward: this.#avgReward,
      rollouts_per_s: elapsed > 0 ? this.#done / elapsed : 0,
      elapsed_s: elapsed,
      no_progress_s: noProgress,
      stalled: noProgress !== null && noProgress * 1000 >= stallMs,
      stall_after_s: stallMs / 1000,
      ...(stalledRollouts ? { stalled_rollouts: stalledRollouts, tracked: tracked!.length } : {}),
      actions: [...this.actions],
      ...(live ? { live } : {}),
    };
  }

  /** What metadata.json records under `control`. */
  metadata(): Record<string, unknown> {
    return {
      control: {
        paused: this.#paused,
        max_concurrent: this.#limit,
        knobs: this.knobs(),
        interrupted: this.#interrupted,
        requeued: this.#requeued,
        actions: [...this.actions],
      },
    };
  }

  #record(action: ControlAction["action"], args: Record<string, unknown>): ControlAction {
    const entry = { at: new Date().toISOString(), action, args };
    this.actions.push(entry);
    return entry;
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
  /** `stall`: the seconds without progress that count as a stall (default the run's, 60). */
  | { action: "status"; stall?: number }
  | { action: "pause"; mode?: "now" | "after" }
  | { action: "resume" }
  | { action: "requeue" }
  | { action: "set"; values: Record<string, number> }
  /** Older clients: `set` of `max_concurrent` alone. */
  | { action: "set"; max_concurrent: number };

/** Answers one request: `{ ok: true, status }` or `{ ok: false, error }`. */
export function handleControl(control: RunControl, request: unknown): Record<string, unknown> {
  const r = request as
    | Partial<
      { action: string; mode: unknown; values: unknown; max_concurrent: unknown; stall: unknown }
    >
    | null;
  let stallAfterS: number | undefined;
  try {
    switch (r?.action) {
      case "status":
        if (r.stall !== undefined) {
          if (typeof r.stall !== "number" || !Number.isFinite(r.stall) || r.stall < 0) {
            throw new RangeError(
              `status stall must be a number of seconds ≥ 0, got ${JSON.stringify(r.stall)}`,
            );
          }
          stallAfterS = r.stall;
        }
        break;
      case "pause":
        if (r.mode !== undefined && r.mode !== "now" && r.mode !== "after") {
          throw new RangeError(
            `pause mode must be "now" or "after", got ${JSON.stringify(r.mode)}`,
          );
        }
        control.pause(r.mode ?? "after");
        break;
      case "resume":
        control.resume();
        break;
      case "requeue":
        control.requeue();
        break;
      case "set": {
        const values = r.values ?? { max_concurrent: r.max_concurrent };
        if (typeof values !== "object" || values === null || Array.isArray(values)) {
          throw new RangeError("set needs values: an object of KEY: number");
        }
        control.set(values as Record<string, unknown>);
        break;
      }
      default:
        throw new RangeError(
          `Unknown action ${JSON.stringify(r?.action)}; known: status, pause, resume, requeue, set`,
        );
    }
    return { ok: true, status: control.status({ stallAfterS }) };
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
