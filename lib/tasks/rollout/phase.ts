/**
 * The phases of a rollout: a phase races its timeout and the run's signal, and a failure
 * inside one is tagged with the phase's name ({@link PhaseError}) for the trace.
 * @module
 */
import { TaskError } from "../../errors.ts";
import { unrefTimer } from "../../util/_timers.ts";
import { noteActivity } from "../../util/activity.ts";

/** The longest delay a timer takes (a longer one would fire at once). */
const MAX_TIMER_MS = 2 ** 31 - 1;

/** Options of {@link phase}. */
export interface PhaseOptions {
  /** The phase's timeout in seconds; none (or 0) for no limit. */
  seconds?: number;
  /** The run's signal: its abort ends the phase with its reason. */
  signal?: AbortSignal;
  /** The timeout to name when it passes, when `seconds` is what was left of it; default `seconds`. */
  stated?: number;
  /** Gets `fn`'s own promise, which may still run after the phase was cut short. */
  running?: (work: Promise<unknown>) => void;
}

/**
 * Race a phase against its timeout (seconds) and the run's signal. `fn` can stop the
 * timeout's clock while it waits its turn (for a sandbox slot under [limits]) and start it
 * afresh once served: queueing behind other rollouts is not the phase taking too long.
 * @throws {TaskError} naming the phase when its timeout passes
 */
export async function phase<T>(
  name: string,
  fn: (signal: AbortSignal, queued: (waiting: boolean) => void) => Promise<T>,
  options: PhaseOptions = {},
): Promise<T> {
  const { seconds, signal, stated = seconds, running } = options;
  noteActivity(`phase ${name}`);
  const controller = new AbortController();
  const signals = [controller.signal, ...(signal ? [signal] : [])];
  const clock = new AbortController();
  let timer: ReturnType<typeof setTimeout> | undefined;
  const arm = () => {
    clearTimeout(timer);
    timer = unrefTimer(setTimeout(() => {
      clock.abort(new DOMException(`Timed out after ${seconds} s`, "TimeoutError"));
    }, Math.min(seconds! * 1000, MAX_TIMER_MS)));
  };
  if (seconds && seconds > 0) {
    signals.push(clock.signal);
    arm();
  }
  const queued = (waiting: boolean) => {
    if (!(seconds && seconds > 0) || clock.signal.aborted) return;
    if (waiting) clearTimeout(timer);
    else arm();
  };
  const combined = AbortSignal.any(signals);
  return await new Promise<T>((resolve, reject) => {
    const onAbort = () => {
      const reason = combined.reason;
      reject(
        reason instanceof DOMException && reason.name === "TimeoutError"
          ? new TaskError(`Phase "${name}" timed out after ${stated}s`, { cause: reason })
          : reason,
      );
    };
    if (combined.aborted) return onAbort();
    combined.addEventListener("abort", onAbort, { once: true });
    const work = fn(combined, queued);
    running?.(work);
    work.then(resolve, reject).finally(() => combined.removeEventListener("abort", onAbort));
  }).finally(() => {
    clearTimeout(timer);
    controller.abort();
  });
}

/** A failure inside a named phase of a rollout (the trace records the phase). */
export class PhaseError extends Error {
  constructor(readonly phase: string, readonly error: unknown) {
    super(String(error));
  }
}

/** Run `fn` as phase `name`: what it throws becomes a {@link PhaseError} (unless it is one). */
export async function inPhase<T>(name: string, fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (error) {
    if (error instanceof PhaseError) throw error;
    throw new PhaseError(name, error);
  }
}

/** Resolves once `work` settles, or after `ms` (its timer cleared either way). */
export function settledWithin(work: Promise<unknown>, ms: number): Promise<void> {
  return new Promise((resolve) => {
    const timer = unrefTimer(setTimeout(resolve, ms));
    const done = () => {
      clearTimeout(timer);
      resolve();
    };
    work.then(done, done);
  });
}
