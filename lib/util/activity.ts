/**
 * What each rollout in flight last did, for `vf ctl status --stall N`: a run tracks each
 * rollout with {@linkcode withActivity}, and the rollout's own code (a model call, a tool
 * call, a phase starting) says so with {@linkcode noteActivity}, which finds its rollout
 * through the async context. Outside a tracked rollout it does nothing.
 * @module
 */
import { AsyncLocalStorage } from "node:async_hooks";

/** One rollout in flight: its id, when it started, and what it last did when. */
export interface Activity {
  readonly id: string;
  /** Epoch ms the rollout started. */
  readonly started: number;
  /** Epoch ms of its last progress. */
  at: number;
  /** What it last did: "model call", "model reply", "tool bash", "phase agent", ... */
  what: string;
  /**
   * A group's (several rollouts run as one unit): runs its `index`th member as a rollout of
   * its own, what {@linkcode withRolloutActivity} calls.
   */
  readonly member?: <T>(index: number, fn: () => Promise<T>) => Promise<T>;
}

/** What a tracked rollout is, beside its id: `vf ctl status` lists these. */
export interface RolloutLabels {
  /** The example (a taskset run: the task's index) the rollout is of. */
  exampleId?: number;
  /** Which rollout of the example it is. */
  rolloutIndex?: number;
  /**
   * A group of rollouts tracked as one unit: the rollout index of its `i`th member. Each
   * member run through {@linkcode withRolloutActivity} is then tracked on its own.
   */
  members?: (i: number) => number;
}

const current = new AsyncLocalStorage<Activity>();

/**
 * Runs `fn` as `activity`'s rollout: what it notes updates `activity` (with none, what it
 * notes updates nothing, whichever rollout's context this code was called from).
 */
export function withActivity<T>(activity: Activity | undefined, fn: () => T): T {
  return current.run(activity as Activity, fn);
}

/**
 * The rollout running this code, if tracked: for work done later on its behalf from another
 * context (a model call an agent program makes through the gateway's server).
 */
export function currentActivity(): Activity | undefined {
  return current.getStore();
}

/**
 * Runs `fn` as the `index`th rollout of the group running this code, tracked on its own when
 * the group's tracker asked for it ({@linkcode RolloutLabels.members}); otherwise just `fn()`.
 */
export function withRolloutActivity<T>(index: number, fn: () => Promise<T>): Promise<T> {
  const member = current.getStore()?.member;
  return member ? member(index, fn) : fn();
}

/** The rollout running this code made progress: `what` (kept to 80 characters). */
export function noteActivity(what: string): void {
  const activity = current.getStore();
  if (!activity) return;
  activity.at = Date.now();
  activity.what = what.length > 80 ? what.slice(0, 80) : what;
}
