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
 * The `--max-cost` gate: `allows()` before each new rollout (or group) says whether it may
 * start. It expects each unit to cost the mean of those finished so far.
 */
export class CostBudget {
  #started = 0;
  #finished = 0;
  #stopped = false;

  constructor(readonly meter: CostMeter, readonly maxUsd: number) {}

  /** Whether the budget stopped the run from starting more. */
  get stopped(): boolean {
    return this.#stopped;
  }

  /** May another unit start? Counts it as started when it may. */
  allows(): boolean {
    if (this.#stopped) return false;
    const spent = this.meter.summary.usd;
    const perUnit = this.#finished ? spent / this.#finished : 0;
    const inFlight = this.#started - this.#finished;
    if (spent + (inFlight + 1) * perUnit > this.maxUsd || spent >= this.maxUsd) {
      this.#stopped = true;
      return false;
    }
    this.#started++;
    return true;
  }

  /** A unit finished (null: it was let start but never ran). */
  finished(outcome?: unknown): void {
    if (outcome === null) this.#started--;
    else this.#finished++;
  }
}
