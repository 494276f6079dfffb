/**
 * Adaptive concurrency (`[limits] adaptive = true`): how many rollouts (or groups, or
 * episodes) run at once is found rather than fixed. The limit starts low, grows by one each
 * time a full limit's worth of work finishes healthy (no infrastructure error, latency not
 * rising past three times its settled level and 50 ms over it), and halves on an error (an engine 5xx, a 429 or 5xx
 * from a provider, a sandbox that did not start) or when latency climbs; it never leaves
 * [1, the configured maximum]. What it did goes into the run's metadata.
 * @module
 */
import type { StartGate } from "./evaluate.ts";

/** How a unit of work went. */
export interface WorkOutcome {
  /** False on an infrastructure failure (engine, provider, sandbox). */
  ok: boolean;
  /** How long the part that loads the backend took (a sandbox start, a model call). */
  latencyMs?: number;
}

/** What the controller did, for metadata. */
export interface AdaptiveStats {
  limit: number;
  max: number;
  highest: number;
  increases: number;
  backoffs: number;
}

/** An AIMD limit on work in flight, usable as a {@link StartGate}. */
export class AdaptiveController implements StartGate {
  #limit: number;
  readonly max: number;
  #inFlight = 0;
  #healthy = 0;
  #highest: number;
  #increases = 0;
  #backoffs = 0;
  /** Latency's settled level (the lowest smoothed value seen) and its smoothed value now. */
  #baseline: number | null = null;
  #smoothed: number | null = null;
  readonly #waiters: Array<() => void> = [];

  constructor(options: { max: number; start?: number }) {
    this.max = Math.max(1, Math.floor(options.max));
    this.#limit = Math.min(this.max, Math.max(1, options.start ?? 4));
    this.#highest = this.#limit;
  }

  /** The limit now. */
  get limit(): number {
    return this.#limit;
  }

  /** Work in flight now. */
  get inFlight(): number {
    return this.#inFlight;
  }

  /** Wait until the limit lets one more start; always true (it never refuses for good). */
  async allows(): Promise<boolean> {
    while (this.#inFlight >= this.#limit) {
      await new Promise<void>((resolve) => this.#waiters.push(resolve));
    }
    this.#inFlight++;
    return true;
  }

  /**
   * A unit finished: adjust the limit by how it went (null: it never ran, only give the slot
   * back), and let a waiter start.
   */
  finished(outcome: WorkOutcome | null = { ok: true }): void {
    this.#inFlight = Math.max(0, this.#inFlight - 1);
    if (outcome === null) return this.#wake();
    const latency = outcome.latencyMs;
    let rising = false;
    if (latency !== undefined && Number.isFinite(latency)) {
      this.#smoothed = this.#smoothed === null ? latency : 0.8 * this.#smoothed + 0.2 * latency;
      this.#baseline = this.#baseline === null
        ? this.#smoothed
        : Math.min(this.#baseline, this.#smoothed);
      // Rising: well past its settled level, by a margin that ignores jitter of fast calls.
      rising = this.#smoothed > 3 * this.#baseline && this.#smoothed > this.#baseline + 50;
    }
    if (!outcome.ok || rising) {
      const next = Math.max(1, Math.floor(this.#limit / 2));
      if (next < this.#limit) this.#backoffs++;
      this.#limit = next;
      this.#healthy = 0;
      // Latency settles again at the lower limit: measure it afresh.
      if (rising) this.#smoothed = this.#baseline;
    } else if (++this.#healthy >= this.#limit && this.#limit < this.max) {
      this.#limit++;
      this.#increases++;
      this.#healthy = 0;
      this.#highest = Math.max(this.#highest, this.#limit);
    }
    this.#wake();
  }

  #wake(): void {
    while (this.#waiters.length && this.#inFlight < this.#limit) this.#waiters.shift()!();
  }

  stats(): AdaptiveStats {
    return {
      limit: this.#limit,
      max: this.max,
      highest: this.#highest,
      increases: this.#increases,
      backoffs: this.#backoffs,
    };
  }
}

/** Gates that must all allow a start (a budget and a controller, say). */
export function allGates(gates: Array<StartGate | null | undefined>): StartGate | undefined {
  const list = gates.filter((g): g is StartGate => Boolean(g));
  if (list.length <= 1) return list[0];
  return {
    async allows(size?: number, wanted?: () => boolean) {
      const taken: StartGate[] = [];
      for (const g of list) {
        // Held by an earlier gate while the work ran out: the later ones (a budget) never
        // hear of a start that is no longer wanted.
        if (taken.length && wanted && !wanted()) {
          for (const t of taken) t.finished(null, size);
          return false;
        }
        if (!(await g.allows(size, wanted))) {
          for (const t of taken) t.finished(null, size);
          return false;
        }
        taken.push(g);
      }
      return true;
    },
    finished(outcome?: WorkOutcome | null, size?: number) {
      for (const g of list) g.finished(outcome, size);
    },
  };
}
