/**
 * A run's outputs summarised as they finish (counts, errors by kind, stop conditions, reward and
 * metric spreads), so the end-of-run summary needs no output kept in memory.
 * @module
 */
import { isUnscoredOutput } from "./results.ts";
import type { RolloutOutput } from "../state.ts";

/** Error kinds an {@link OutputTally} keeps apart (so its memory stays flat). */
export const MAX_ERROR_KINDS = 50;

/**
 * Examples whose rewards an {@link OutputTally} keeps rollout by rollout, for the summary's
 * `r1: [...]` lines: the lowest example ids, so memory stays flat however many run.
 */
export const MAX_LISTED_EXAMPLES = 100;

/** A running mean and population standard deviation (Welford), for summaries of any length. */
class RunningStats {
  n = 0;
  #mean = 0;
  #m2 = 0;

  add(x: number): void {
    this.n++;
    const delta = x - this.#mean;
    this.#mean += delta / this.n;
    this.#m2 += delta * (x - this.#mean);
  }

  /** Takes `x` back out (the inverse of {@link add}). */
  remove(x: number): void {
    if (this.n <= 1) {
      this.n = 0;
      this.#mean = 0;
      this.#m2 = 0;
      return;
    }
    const mean = (this.n * this.#mean - x) / (this.n - 1);
    this.#m2 -= (x - this.#mean) * (x - mean);
    this.#mean = mean;
    this.n--;
  }

  get std(): number {
    return this.n < 2 ? 0 : Math.sqrt(Math.max(0, this.#m2 / this.n));
  }
}

/**
 * What the end-of-run summary needs from the outputs, gathered as they finish, so a run of any
 * size can be summarised without keeping its outputs in memory.
 */
export class OutputTally {
  /** Outputs seen. */
  count = 0;
  /** Outputs with an error. */
  errors = 0;
  /** Outputs whose model requests were retried. */
  retried = 0;
  /** Outputs per stop condition (`none` when there was none), in first-seen order. */
  readonly stops: Map<string, number> = new Map();
  /**
   * Errors per `"<type>: <message>"` (the message cut at 100 characters), in first-seen order;
   * the first {@link MAX_ERROR_KINDS} kinds only.
   */
  readonly errorKinds: Map<string, number> = new Map();
  readonly #reward = new RunningStats();
  readonly #metrics = new Map<string, RunningStats>();
  /** Rewards per example in the order its rollouts finished (null: never scored). */
  readonly #byExample = new Map<number, Array<number | null>>();
  #maxListed = -Infinity;

  /** The tally of `outputs`. */
  static of(outputs: RolloutOutput[]): OutputTally {
    const tally = new OutputTally();
    tally.add(outputs);
    return tally;
  }

  /** Folds outputs in. */
  add(outputs: RolloutOutput[]): void {
    for (const o of outputs) {
      this.count++;
      const stop = o.stop_condition ?? "none";
      this.stops.set(stop, (this.stops.get(stop) ?? 0) + 1);
      if (o.error) {
        this.errors++;
        const kind = `${o.error.error}: ${o.error.message.slice(0, 100)}`;
        const seen = this.errorKinds.get(kind);
        // The first kinds are what a summary shows; past a few dozen, only the count grows.
        if (seen !== undefined || this.errorKinds.size < MAX_ERROR_KINDS) {
          this.errorKinds.set(kind, (seen ?? 0) + 1);
        }
      }
      if (Number(o.model_retries ?? 0) > 0) this.retried++;
      const unscored = isUnscoredOutput(o);
      this.#list(o.example_id, unscored ? null : o.reward);
      if (unscored) continue;
      this.#reward.add(o.reward);
      const metrics = o.metrics ?? {};
      for (const name in metrics) {
        const value = metrics[name];
        if (typeof value !== "number") continue;
        let stats = this.#metrics.get(name);
        if (!stats) this.#metrics.set(name, stats = new RunningStats());
        stats.add(value);
      }
    }
  }

  /** Takes back outputs {@link add} folded in (a requeued rollout's errored first run). */
  remove(outputs: RolloutOutput[]): void {
    const less = (map: Map<string, number>, key: string) => {
      const n = (map.get(key) ?? 0) - 1;
      if (n > 0) map.set(key, n);
      else map.delete(key);
    };
    for (const o of outputs) {
      this.count--;
      less(this.stops, o.stop_condition ?? "none");
      if (o.error) {
        this.errors--;
        less(this.errorKinds, `${o.error.error}: ${o.error.message.slice(0, 100)}`);
      }
      if (Number(o.model_retries ?? 0) > 0) this.retried--;
      const unscored = isUnscoredOutput(o);
      const rewards = this.#byExample.get(o.example_id);
      const i = rewards?.indexOf(unscored ? null : o.reward) ?? -1;
      if (rewards && i >= 0) rewards.splice(i, 1);
      if (unscored) continue;
      this.#reward.remove(o.reward);
      const metrics = o.metrics ?? {};
      for (const name in metrics) {
        const value = metrics[name];
        if (typeof value === "number") this.#metrics.get(name)?.remove(value);
      }
    }
  }

  /** Keep a reward of example `id` if it is among the lowest ids listed. */
  #list(id: number, reward: number | null): void {
    if (!Number.isInteger(id)) return;
    let rewards = this.#byExample.get(id);
    if (!rewards) {
      if (this.#byExample.size >= MAX_LISTED_EXAMPLES) {
        if (id > this.#maxListed) return;
        this.#byExample.delete(this.#maxListed);
        this.#byExample.set(id, rewards = []);
        this.#maxListed = Math.max(...this.#byExample.keys());
      } else {
        this.#byExample.set(id, rewards = []);
        this.#maxListed = Math.max(this.#maxListed, id);
      }
    }
    rewards.push(reward);
  }

  /**
   * Rewards by rollout index, as upstream's summary lists them: entry `i` holds each listed
   * example's `i`-th rollout (in example order; null where it was never scored), for the
   * lowest {@link MAX_LISTED_EXAMPLES} example ids.
   */
  rewardsByRollout(): { rollouts: Array<Array<number | null>>; examples: number } {
    const ids = [...this.#byExample.keys()].sort((a, b) => a - b);
    const r = Math.max(0, ...ids.map((id) => this.#byExample.get(id)!.length));
    const rollouts = Array.from(
      { length: r },
      (_, i) =>
        ids.filter((id) => this.#byExample.get(id)!.length > i)
          .map((id) => this.#byExample.get(id)![i]),
    );
    return { rollouts, examples: ids.length };
  }

  /** Population standard deviation of the scored rewards (null before any). */
  get rewardStd(): number | null {
    return this.#reward.n ? this.#reward.std : null;
  }

  /** Population standard deviation of a metric over the scored outputs that have it. */
  metricStd(name: string): number {
    return this.#metrics.get(name)?.std ?? 0;
  }
}
