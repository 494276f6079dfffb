/**
 * A run's outputs summarised as they finish (counts, errors by kind, stop conditions, reward and
 * metric spreads), so the end-of-run summary needs no output kept in memory.
 * @module
 */
import { isUnscoredOutput } from "./results.ts";
import type { RolloutOutput } from "../state.ts";

/** Error kinds an {@link OutputTally} keeps apart (so its memory stays flat). */
export const MAX_ERROR_KINDS = 50;

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
      if (isUnscoredOutput(o)) continue;
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

  /** Population standard deviation of the scored rewards (null before any). */
  get rewardStd(): number | null {
    return this.#reward.n ? this.#reward.std : null;
  }

  /** Population standard deviation of a metric over the scored outputs that have it. */
  metricStd(name: string): number {
    return this.#metrics.get(name)?.std ?? 0;
  }
}
