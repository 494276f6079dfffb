/**
 * Math answer equivalence for MathRubric (spec §14.4). Python `verifiers` uses `math_verify`
 * (sympy); JavaScript has no equivalent, so this module checks in three tiers, each tried only
 * when the previous one cannot decide:
 *
 * 1. string equality after {@linkcode normalizeMathAnswer};
 * 2. numeric equality of plain numbers (integers exactly, otherwise a relative tolerance of
 *    1e-6), where a percentage also matches its value divided by 100;
 * 3. a symbolic check with mathjs: both sides are converted from simple LaTeX, constant
 *    expressions are evaluated, and expressions with free variables are compared at a few
 *    fixed pseudo-random points (with `simplify((a) - (b)) == 0` when sampling cannot decide).
 *
 * Tuples, intervals, sets and bare comma lists are compared element by element.
 * {@linkcode verifyMath} runs the check in a worker under a hard timeout.
 *
 * @example
 * ```ts
 * import { closeMathWorkers, verifyMath } from "./math_verify.ts";
 * console.log(await verifyMath("\\frac{1}{2}", "0.5")); // true
 * closeMathWorkers();
 * ```
 * @module
 */

import { mathEquivalentSync } from "./math_equivalence.ts";
import { unrefTimer } from "../util/_timers.ts";

export { mathEquivalentSync, normalizeMathAnswer } from "./math_equivalence.ts";

// ---------------------------------------------------------------------------------------------
// Worker pool

/** Options for {@linkcode verifyMath}. */
export interface VerifyMathOptions {
  /** Wall-clock budget for the check once a worker has taken it, in ms. Default 5000. */
  timeoutMs?: number;
  /** A longer `pred` is not equivalent, without any work. Default 50000. */
  maxChars?: number;
  /** Rejects the call with the signal's reason and stops the worker running it. */
  signal?: AbortSignal;
}

interface Job {
  id: number;
  gold: string;
  pred: string;
  timeoutMs: number;
  signal?: AbortSignal;
  onAbort?: () => void;
  resolve(ok: boolean): void;
  reject(reason: unknown): void;
}

interface Slot {
  worker: Worker;
  ready: boolean;
  job: Job | null;
  timer?: ReturnType<typeof setTimeout>;
}

interface WorkerReply {
  id?: number;
  ok?: boolean;
  ready?: boolean;
}

const POOL_SIZE = 2;
const IDLE_MS = 2000;
// In a binary built by `bun build --compile` every bundled module shares the executable's
// import.meta.url (`file:///$bunfs/root/vf`, `B:/~BUN/root/` on Windows); the worker is a
// separate entrypoint there, at its path from the project root (scripts/compile.ts).
const WORKER_URL = /\/(\$bunfs|~BUN)\/root\//.test(import.meta.url)
  ? new URL("./lib/scoring/_math_worker.ts", import.meta.url).href
  : new URL("./_math_worker.ts", import.meta.url).href;

const slots: Slot[] = [];
const queue: Job[] = [];
let idleTimer: ReturnType<typeof setTimeout> | undefined;
let workersUnavailable = typeof Worker === "undefined";
let anyWorkerReady = false;
let nextJobId = 1;
const stats = { started: 0, terminated: 0, timedOut: 0 };

/** Lets the process exit while only this timer is pending (Deno, Node and Bun spell it apart). */
function runSync(job: Job): void {
  settle(job);
  job.resolve(mathEquivalentSync(job.gold, job.pred));
}

/** Detaches the abort listener; call before resolving or rejecting a job. */
function settle(job: Job): void {
  if (job.onAbort) job.signal?.removeEventListener("abort", job.onAbort);
}

function removeSlot(slot: Slot): void {
  clearTimeout(slot.timer);
  slot.worker.terminate();
  stats.terminated++;
  const k = slots.indexOf(slot);
  if (k >= 0) slots.splice(k, 1);
}

function spawn(): void {
  let worker: Worker;
  try {
    worker = new Worker(WORKER_URL, { type: "module" });
  } catch {
    // No worker support here (or not allowed): check in this thread, without a hard timeout.
    workersUnavailable = true;
    return;
  }
  stats.started++;
  const slot: Slot = { worker, ready: false, job: null };
  slots.push(slot);
  worker.onmessage = (event: MessageEvent<WorkerReply>) => {
    const reply = event.data;
    if (reply?.ready) {
      slot.ready = true;
      anyWorkerReady = true;
      pump();
      return;
    }
    const job = slot.job;
    if (!job || reply?.id !== job.id) return;
    clearTimeout(slot.timer);
    slot.job = null;
    settle(job);
    job.resolve(reply.ok === true);
    pump();
  };
  worker.onerror = (event: ErrorEvent) => {
    // Handled here, or the runtime would treat it as an uncaught error of the whole process.
    event.preventDefault();
    const job = slot.job;
    slot.job = null;
    removeSlot(slot);
    // A worker that never started (missing read permission, a bundle without the worker
    // file) will not start next time either: check in this thread from now on.
    if (!slot.ready && !anyWorkerReady && !workersUnavailable) {
      workersUnavailable = true;
      // Said once: a pathological answer can now block the process.
      console.warn(
        `Math worker "${WORKER_URL}" failed to start (${event.message}); checking answers in this thread without a timeout`,
      );
    }
    if (job) {
      settle(job);
      job.resolve(false);
    }
    pump();
  };
}

function pump(): void {
  if (idleTimer !== undefined) {
    clearTimeout(idleTimer);
    idleTimer = undefined;
  }
  if (workersUnavailable) {
    while (queue.length > 0) runSync(queue.shift()!);
  }
  while (queue.length > 0) {
    const slot = slots.find((s) => s.ready && s.job === null);
    if (!slot) {
      if (slots.length < Math.min(POOL_SIZE, queue.length + slots.filter((s) => s.job).length)) {
        spawn();
        if (workersUnavailable) return pump();
        continue;
      }
      break;
    }
    const job = queue.shift()!;
    slot.job = job;
    slot.timer = setTimeout(() => {
      if (slot.job !== job) return;
      // The worker may be stuck in a pathological input: it is not reused.
      stats.timedOut++;
      slot.job = null;
      removeSlot(slot);
      settle(job);
      job.resolve(false);
      pump();
    }, job.timeoutMs);
    slot.worker.postMessage({ id: job.id, gold: job.gold, pred: job.pred });
  }
  if (queue.length === 0 && slots.length > 0 && slots.every((s) => s.job === null)) {
    idleTimer = setTimeout(closeMathWorkers, IDLE_MS);
    unrefTimer(idleTimer);
  }
}

function abortJob(job: Job): void {
  const k = queue.indexOf(job);
  if (k >= 0) queue.splice(k, 1);
  const slot = slots.find((s) => s.job === job);
  if (slot) {
    slot.job = null;
    removeSlot(slot);
  }
  settle(job);
  job.reject(job.signal!.reason);
  pump();
}

/**
 * Whether `pred` is mathematically equivalent to `gold`, checked in a worker thread under a
 * hard timeout, so a pathological answer cannot block the event loop. An empty or over-long
 * `pred`, an error and a timeout all give `false`. Workers are pooled (two), reused across
 * calls and stopped after 2 s idle, so they never keep the process alive; where workers cannot
 * be created the check runs in this thread without a timeout.
 *
 * @param gold The reference answer.
 * @param pred The model's extracted answer.
 * @param options `timeoutMs` (default 5000), `maxChars` (default 50000), `signal`.
 * @returns `true` when the answers are equivalent.
 * @throws The signal's reason when `signal` aborts before the check finishes.
 * @example
 * ```ts
 * await verifyMath("1,000", "1000"); // true
 * ```
 */
export function verifyMath(
  gold: string,
  pred: string,
  options: VerifyMathOptions = {},
): Promise<boolean> {
  const { timeoutMs = 5000, maxChars = 50_000, signal } = options;
  if (signal?.aborted) return Promise.reject(signal.reason);
  if (pred.trim() === "" || pred.length > maxChars || gold.length > maxChars) {
    return Promise.resolve(false);
  }
  return new Promise<boolean>((resolve, reject) => {
    const job: Job = { id: nextJobId++, gold, pred, timeoutMs, signal, resolve, reject };
    if (signal) {
      job.onAbort = () => abortJob(job);
      signal.addEventListener("abort", job.onAbort, { once: true });
    }
    queue.push(job);
    pump();
  });
}

/**
 * Stops every math worker now. Checks still running or queued resolve `false`. Later calls to
 * {@linkcode verifyMath} start new workers.
 */
export function closeMathWorkers(): void {
  if (idleTimer !== undefined) {
    clearTimeout(idleTimer);
    idleTimer = undefined;
  }
  const pending = [...queue.splice(0), ...slots.flatMap((s) => (s.job ? [s.job] : []))];
  for (const slot of [...slots]) {
    slot.job = null;
    removeSlot(slot);
  }
  for (const job of pending) {
    settle(job);
    job.resolve(false);
  }
}

/** Worker counters for tests: started, terminated, and terminated because a check timed out. */
export function _mathWorkerStats(): {
  live: number;
  started: number;
  terminated: number;
  timedOut: number;
} {
  return { live: slots.length, ...stats };
}
