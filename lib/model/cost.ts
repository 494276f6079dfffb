/**
 * What a run's model calls cost: per-model prices (`[models."<id>"] input_per_mtok`,
 * `output_per_mtok`, in USD per million tokens, from the TOML or the endpoint registry), a
 * meter around the client that adds up every real call (cache hits are free), and the budget
 * gate behind `--max-cost`: no new rollout starts once the spend so far, plus what the
 * rollouts in flight are expected to cost, would cross it.
 * @module
 */
import type { Messages, Response } from "../types.ts";
import type { ChatClient, ChatRequestOptions } from "./client.ts";

/** Prices of one model in USD per million tokens. */
export interface ModelPrice {
  input_per_mtok: number;
  output_per_mtok: number;
}

/** A run's spend. */
export interface CostSummary {
  usd: number;
  input_tokens: number;
  output_tokens: number;
  calls: number;
  /** Calls of models without a price (their tokens are counted, not priced). */
  unpriced_calls: number;
}

/** Adds up the cost of every call that reaches the endpoint. */
export class CostMeter implements ChatClient {
  constructor(
    readonly inner: ChatClient,
    readonly prices: Record<string, ModelPrice>,
    readonly summary: CostSummary = {
      usd: 0,
      input_tokens: 0,
      output_tokens: 0,
      calls: 0,
      unpriced_calls: 0,
    },
  ) {}

  /**
   * A meter around another endpoint's client (a judge's, a role's own) that adds to this
   * run's spend, with the same prices, so the summary and `--max-cost` count its calls too.
   */
  alongside(inner: ChatClient): CostMeter {
    return new CostMeter(inner, this.prices, this.summary);
  }

  get baseUrl(): string {
    return this.inner.baseUrl;
  }

  get headersFromState(): Record<string, string> {
    return this.inner.headersFromState;
  }

  /** The cost of `usage` for `model`, or null without a price. */
  priceOf(model: string, input: number, output: number): number | null {
    const p = this.prices[model];
    return p ? (input * p.input_per_mtok + output * p.output_per_mtok) / 1e6 : null;
  }

  async getResponse(
    prompt: Messages,
    model: string,
    options?: ChatRequestOptions,
  ): Promise<Response> {
    const response = await this.inner.getResponse(prompt, model, options);
    const input = response.usage?.prompt_tokens ?? 0;
    const output = response.usage?.completion_tokens ?? 0;
    this.summary.calls++;
    this.summary.input_tokens += input;
    this.summary.output_tokens += output;
    const usd = this.priceOf(model, input, output);
    if (usd === null) this.summary.unpriced_calls++;
    else this.summary.usd += usd;
    return response;
  }
}

/**
 * The `--max-cost` gate: `allows(size)` before each new unit (a group of `size` rollouts, an
 * episode) says whether it may start. It expects each rollout to cost the mean of those paid
 * for so far; a resumed run counts the spend and the rollouts of its earlier sessions too
 * ({@link CostBudget.carryOver}), so its estimate is the same as if it had never stopped.
 */
export class CostBudget {
  /** Rollouts let start, and those finished whose spend is in the meter (carried ones too). */
  #started = 0;
  #finished = 0;
  #startedHere = 0;
  #carried = { usd: 0, rollouts: 0 };
  #stopped = false;

  constructor(readonly meter: CostMeter, readonly maxUsd: number) {}

  /** Whether the budget stopped the run from starting more. */
  get stopped(): boolean {
    return this.#stopped;
  }

  /** Units started in this session. */
  get startedHere(): number {
    return this.#startedHere;
  }

  /** What earlier sessions of a resumed run spent, and on how many rollouts. */
  get carried(): { usd: number; rollouts: number } {
    return { ...this.#carried };
  }

  /** The expected cost of one more rollout (0 before any has finished). */
  get perRollout(): number {
    return this.#finished ? this.meter.summary.usd / this.#finished : 0;
  }

  /**
   * A resumed run: the spend already in the meter paid for `rollouts` saved rollouts. Call it
   * once, after the meter is seeded and before the first `allows()`.
   */
  carryOver(rollouts: number): void {
    this.#carried = { usd: this.meter.summary.usd, rollouts };
    this.#started += rollouts;
    this.#finished += rollouts;
  }

  /** May a unit of `size` rollouts start? Counts it as started when it may. */
  allows(size = 1): boolean {
    if (this.#stopped) return false;
    const spent = this.meter.summary.usd;
    const inFlight = this.#started - this.#finished;
    const expected = spent + (inFlight + size) * this.perRollout;
    // A hair of slack: prices in floating point must not stop a budget the run fits exactly.
    if (spent >= this.maxUsd || expected > this.maxUsd * (1 + 1e-9)) {
      this.#stopped = true;
      return false;
    }
    this.#started += size;
    this.#startedHere++;
    return true;
  }

  /** A unit of `size` rollouts finished (a null outcome: it was let start but never ran). */
  finished(outcome?: unknown, size = 1): void {
    if (outcome === null) {
      this.#started -= size;
      this.#startedHere--;
    } else this.#finished += size;
  }
}
