/**
 * The lifecycle code the sandbox backends (docker, kubernetes, ssh, prime) share: the
 * start-once and stop-once protocol with its state checks, the labels that let `vf cleanup`
 * find a backend's leftovers, and the wait for a process sweep and the reading of its answer.
 * The sweep scripts themselves are in `_sweep.ts`.
 * @module
 */

import { CommandTimeoutError } from "../lib/errors.ts";
import { SandboxError, SandboxFileNotFoundError, SandboxStateError } from "./errors.ts";
import { type Tracked, trackRuntime, untrackRuntime } from "./registry.ts";
import { describeArgv, untilInterrupted } from "./_util.ts";

/** Where a runtime is in its life. */
export type RuntimeState = "new" | "starting" | "running" | "stopped";

/**
 * The start and stop protocol of a backend: concurrent `start()` calls share one start, a
 * stopped runtime never starts again, the runtime is tracked for signal teardown from its
 * first start until its stop has ended, a start that fails stops the runtime (cleaning up
 * what it created) and rethrows, and `stop()` runs its teardown once, after a start still in
 * flight has settled.
 */
export class Lifecycle {
  state: RuntimeState = "new";
  /** The start sequence itself; `stop()` waits for it before tearing down. */
  launch: Promise<void> | undefined;
  #starting: Promise<void> | undefined;
  #stopping: Promise<void> | undefined;
  readonly #runtime: Tracked;
  readonly #kind: string;

  /**
   * @param runtime what `trackRuntime` registers
   * @param kind the runtime's type, for the state errors (`docker`, `kubernetes`, …)
   */
  constructor(runtime: Tracked, kind: string) {
    this.#runtime = runtime;
    this.#kind = kind;
  }

  /**
   * @param launch the runtime's own start sequence
   * @param stop its `stop()`
   */
  start(launch: () => Promise<void>, stop: () => Promise<void>): Promise<void> {
    if (this.state === "stopped") {
      return Promise.reject(new SandboxStateError(`Cannot start a stopped ${this.#kind} runtime`));
    }
    if (this.#starting) return this.#starting;
    this.state = "starting";
    trackRuntime(this.#runtime);
    this.launch = launch();
    this.#starting = this.launch.then(() => {
      if (this.state === "starting") this.state = "running";
    }, async (error) => {
      await stop().catch(() => {});
      throw error;
    });
    return this.#starting;
  }

  /**
   * Stops once: every later call gets the first call's promise. The state becomes `stopped`
   * at once (`halt`, when given, runs right after, to cut a start short); `teardown` runs
   * after a start in flight has settled; `release` runs when the teardown has ended, however
   * it ended, and then the runtime is untracked.
   */
  stop(
    teardown: () => Promise<void>,
    options: { halt?: () => void; release?: () => void } = {},
  ): Promise<void> {
    if (this.#stopping) return this.#stopping;
    const wasStarting = this.state === "starting";
    this.state = "stopped";
    options.halt?.();
    this.#stopping = (async () => {
      if (wasStarting) await this.launch?.catch(() => {});
      await teardown();
    })().finally(() => {
      options.release?.();
      untrackRuntime(this.#runtime);
    });
    return this.#stopping;
  }

  /** Throws when the runtime was stopped meanwhile (a start checks between its steps). */
  checkNotStopped(): void {
    if (this.state === "stopped") {
      throw new SandboxStateError(`The ${this.#kind} runtime was stopped while it was starting`);
    }
  }

  /**
   * `handle` (the container id, the client, the connection) while the runtime runs; otherwise
   * a {@linkcode SandboxStateError}: `stopped()` says which runtime is stopped.
   */
  require<T>(handle: T | undefined, stopped: () => string): T {
    if (this.state === "running" && handle !== undefined) return handle;
    if (this.state === "stopped") throw new SandboxStateError(stopped());
    throw new SandboxStateError(`The ${this.#kind} runtime is not started; call start() first`);
  }
}

/**
 * The error of a command that did not finish within `timeoutMs` (its process tree has been
 * killed by then); `where` names the sandbox ("in container …", "on SSH host …").
 */
export function commandTimeout(
  argv: string[],
  timeoutMs: number | undefined,
  where: string,
): CommandTimeoutError {
  return new CommandTimeoutError(
    `Command "${describeArgv(argv)}" did not finish within ${timeoutMs} ms ${where}; its ` +
      `process tree was killed (raise timeoutMs if it needs longer)`,
    { cause: new DOMException(`Timed out after ${timeoutMs} ms`, "TimeoutError") },
  );
}

/**
 * The error of a command whose working directory does not exist: `path` is the one looked
 * for, `shown` the one the message names (the caller's `cwd`), `where` the sandbox.
 */
export function missingWorkdir(
  path: string,
  shown: string | undefined,
  where: string,
): SandboxFileNotFoundError {
  return new SandboxFileNotFoundError(
    path,
    `Working directory "${shown}" does not exist ${where}`,
  );
}

/** The label every sandbox vf creates carries, so `vf cleanup` finds the ones left behind. */
export const MANAGED_LABEL = "vf.managed";

/**
 * The labels a backend puts on what it creates: `vf.managed=1`, and the run id and task when
 * known. `value` fits a value to the backend's rules (Kubernetes label values are limited).
 */
export function sandboxLabels(
  options: { runId?: string; task?: string },
  value: (v: string) => string = (v) => v,
): Record<string, string> {
  const labels: Record<string, string> = { [MANAGED_LABEL]: "1" };
  if (options.runId) labels["vf.run_id"] = value(options.runId);
  if (options.task) labels["vf.task"] = value(options.task);
  return labels;
}

/** The label filters that find vf's leftovers: all of them, or one run's. */
export function leftoverSelector(
  runId: string | undefined,
  value: (v: string) => string = (v) => v,
): string[] {
  const selector = [`${MANAGED_LABEL}=1`];
  if (runId) selector.push(`vf.run_id=${value(runId)}`);
  return selector;
}

/** How long a process sweep may take before it is given up. */
export const SWEEP_TIMEOUT_MS = 60_000;

/**
 * Waits for a sweep's command to end ({@linkcode SWEEP_TIMEOUT_MS} at most, or until
 * `signal` aborts); on either, `close` ends the command and the abort's reason or a
 * {@linkcode SandboxError} naming `where` is thrown. Returns what `done` gave.
 */
export async function awaitSweep<T>(
  done: Promise<T>,
  options: { where: string; close: () => void; signal?: AbortSignal },
): Promise<T> {
  const ran = await untilInterrupted(done, {
    timeoutMs: SWEEP_TIMEOUT_MS,
    signal: options.signal,
  });
  if (ran.outcome === "done") return ran.value;
  options.close();
  if (ran.outcome === "abort") throw options.signal!.reason;
  throw new SandboxError(`Killing the processes in ${options.where} did not finish within 60 s`);
}

/**
 * Reads what a sweep printed (`0` on success, the number of survivors, or `noproc`): the
 * error to throw, or undefined when it succeeded.
 * @param said the sweep's trimmed stdout
 * @param options.where the sandbox, for the message ("in container …", "on SSH host …")
 * @param options.survivors appended to the survivors' count (why they may have survived)
 * @param options.cannotRun what to say when the sweep printed neither (it could not run)
 */
export async function sweepFailure(
  said: string,
  options: { where: string; survivors?: string; cannotRun: () => string | Promise<string> },
): Promise<SandboxError | undefined> {
  if (said === "0") return undefined;
  const why = said === "noproc"
    ? "it has no /proc"
    : /^\d+$/.test(said)
    ? `${said} process(es) survived SIGKILL${options.survivors ?? ""}`
    : await options.cannotRun();
  return new SandboxError(`Cannot kill the processes left ${options.where}: ${why}`);
}
