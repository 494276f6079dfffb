/**
 * The multi-turn rollout loop (model turn, environment response, repeat until a stop fires)
 * and the single-turn environment built on it.
 * @module
 */
import type { ChatClient } from "../model/client.ts";
import { OverlongPromptError, VfError } from "../errors.ts";
import { normalizeMessages } from "../messages.ts";
import { isThenable, Rubric } from "../scoring/rubric.ts";
import { nowSeconds, type State } from "../state.ts";
import type { AssistantMessage, Messages, Response, Row } from "../types.ts";
import {
  Environment,
  type EnvironmentOptions,
  isFatalError,
  type RolloutOptions,
} from "./environment.ts";

/** What a rollout's timer resolves with when it wins the race against the rollout. */
const TIMEOUT = Symbol("timeout");

/** No final environment response. */
const NO_MESSAGES: Messages = [];

/** The signal of a rollout nobody can cancel (no run signal, no rollout timeout). */
const NEVER_ABORTED = new AbortController().signal;

/** Options of {@link MultiTurnEnv}. */
export interface MultiTurnEnvOptions extends EnvironmentOptions {
  /** Model turns before the rollout stops; ≤ 0 means unlimited. Default -1. */
  maxTurns?: number;
  /** Wall-clock cap for one rollout's generation phase, in seconds. */
  timeoutSeconds?: number | null;
  /** Stop once this many completion tokens were used; ≤ 0 means unlimited. */
  maxTotalCompletionTokens?: number;
}

/** The multi-turn rollout loop: model turn, environment response, repeat until a stop fires. */
export abstract class MultiTurnEnv extends Environment {
  maxTurns: number;
  timeoutSeconds: number | null;
  maxTotalCompletionTokens: number;

  constructor(options: MultiTurnEnvOptions = {}) {
    super(options);
    this.maxTurns = options.maxTurns ?? -1;
    this.timeoutSeconds = options.timeoutSeconds ?? null;
    this.maxTotalCompletionTokens = options.maxTotalCompletionTokens ?? -1;
    this.addStopCondition("has_error", (s) => s.error !== null && s.error !== undefined, 100);
    this.addStopCondition("has_final_env_response", (s) => s.final_env_response !== null);
    this.addStopCondition(
      "max_total_completion_tokens_reached",
      (s) =>
        this.maxTotalCompletionTokens > 0 && s.usage.output_tokens >= this.maxTotalCompletionTokens,
    );
    this.addStopCondition(
      "max_turns_reached",
      (s) => this.maxTurns > 0 && s.trajectory.length >= this.maxTurns,
    );
    this.addStopCondition("prompt_too_long", (s) => s.prompt_too_long);
    const monitor = new Rubric({ parser: this.parser });
    monitor.addMetric(({ state }) => state.trajectory.length, 0, "num_turns");
    this.addRubric(monitor);
  }

  /** Set the per-rollout timeout (used by `--timeout`). */
  setTimeoutSeconds(value: number | null): void {
    this.timeoutSeconds = value;
  }

  /** The environment's reply to the conversation so far: new messages to append. */
  abstract envResponse(messages: Messages, state: State): Promise<Messages> | Messages;

  /** Per-rollout setup hook; default no-op. */
  setupState(_state: State): Promise<void> | void {}

  /** The messages to send next: the prompt on the first turn, else history plus env response. */
  getPromptMessages(state: State): Messages | Promise<Messages> {
    if (state.trajectory.length === 0) return state.prompt;
    return this.#nextPrompt(state);
  }

  async #nextPrompt(state: State): Promise<Messages> {
    const last = state.trajectory[state.trajectory.length - 1];
    const messages = [...last.prompt, ...last.completion];
    const reply = normalizeMessages(await this.envResponse(messages, state));
    return [...messages, ...reply];
  }

  /** Record a model response as a trajectory step. */
  addModelResponse(state: State, prompt: Messages, response: Response): void {
    // One copy of the message without its finish reason and truncation flag (the keys in the
    // order a rest-and-spread copy would give them).
    const source = response.message;
    const is_truncated = source.is_truncated;
    const copy: Record<string, unknown> = {};
    for (const key in source) {
      if (key === "finish_reason" || key === "is_truncated") continue;
      if (key === "tool_calls" && !source.tool_calls) continue;
      copy[key] = (source as unknown as Record<string, unknown>)[key];
    }
    copy.role = "assistant";
    const completion = copy as unknown as AssistantMessage;
    state.is_truncated ||= is_truncated;
    state.trajectory.push({
      prompt,
      completion: [completion],
      response,
      reward: null,
      advantage: null,
      is_truncated,
      trajectory_id: state.trajectory_id,
      extras: {},
    });
  }

  /** The completion: everything after the original prompt, plus a final env response. */
  renderCompletion(state: State): void {
    if (state.trajectory.length === 0) {
      state.completion = [];
      return;
    }
    const last = state.trajectory[state.trajectory.length - 1];
    // What `[...last.prompt, ...last.completion, ...final].slice(prompt.length)` is, written
    // into one array of its size: the spread and the slice made two (this runs per rollout).
    const { prompt, completion: reply } = last;
    const final = state.final_env_response ?? NO_MESSAGES;
    const skip = state.prompt.length;
    const completion = new Array(Math.max(0, prompt.length + reply.length + final.length - skip));
    let at = 0;
    for (let i = skip; i < prompt.length; i++) completion[at++] = prompt[i];
    for (let i = Math.max(0, skip - prompt.length); i < reply.length; i++) {
      completion[at++] = reply[i];
    }
    for (let i = Math.max(0, skip - prompt.length - reply.length); i < final.length; i++) {
      completion[at++] = final[i];
    }
    state.completion = completion;
  }

  /**
   * The turn loop. With `finish`, it also runs the cleanups and renders the completion once
   * it ends, however it ends: a rollout without a timeout of its own is one async frame.
   */
  async #loop(state: State, signal: AbortSignal, finish: boolean): Promise<State> {
    try {
      state.timing.generation.start = nowSeconds();
      state.timing.setup.start = state.timing.generation.start;
      try {
        const setup = this.setupState(state);
        if (setup) await setup;
      } catch (error) {
        if (isFatalError(error) || signal.aborted) throw error;
        state.error = error;
      } finally {
        state.timing.setup.end = nowSeconds();
      }
      for (;;) {
        let done = this.isCompleted(state);
        if (typeof done !== "boolean") done = await done;
        if (done) break;
        signal.throwIfAborted();
        try {
          const t0 = nowSeconds();
          let prompt = this.getPromptMessages(state);
          if (!Array.isArray(prompt)) prompt = await prompt;
          if (state.trajectory.length > 0) {
            state.timing.env.spans.push({ start: t0, end: nowSeconds() });
          }
          if (state.final_env_response !== null) continue;
          const t1 = nowSeconds();
          const response = await this.getModelResponse(state, prompt);
          state.timing.model.spans.push({ start: t1, end: nowSeconds() });
          this.addModelResponse(state, prompt, response);
        } catch (error) {
          if (signal.aborted || isFatalError(error)) throw error;
          if (error instanceof OverlongPromptError) {
            state.prompt_too_long = true;
            state.is_truncated = true;
          } else {
            state.error = error;
          }
        }
      }
    } finally {
      if (finish) {
        const cleaning = this.#finish(state);
        if (cleaning) await cleaning;
      }
    }
    return state;
  }

  /** Cleanups, the end of generation, and the completion rendered. */
  #finish(state: State): Promise<void> | void {
    const cleaning = this.runCleanups(state);
    if (isThenable(cleaning)) {
      return Promise.resolve(cleaning).then(() => {
        state.timing.generation.end = nowSeconds();
        this.renderCompletion(state);
      });
    }
    state.timing.generation.end = nowSeconds();
    this.renderCompletion(state);
  }

  rollout(
    input: Row,
    client: ChatClient,
    model: string,
    options: RolloutOptions = {},
  ): Promise<State> {
    let state: State;
    try {
      state = this.initState(input, client, model, options.samplingArgs);
    } catch (error) {
      return Promise.reject(error);
    }
    const outer = options.signal;
    const seconds = this.timeoutSeconds;
    // Anything but a positive number (null, and undefined or NaN set from outside) is no limit.
    if (seconds === null || !(seconds > 0)) {
      // No signal of its own: the run's serves (thousands of rollouts adding and removing
      // listeners on it cost measurable CPU).
      const signal = outer ?? NEVER_ABORTED;
      state.signal = signal;
      return this.#loop(state, signal, true);
    }
    return this.#timed(state, outer, seconds);
  }

  /** A rollout with a timeout of its own: a signal, a timer, and a grace for slow hooks. */
  async #timed(state: State, outer: AbortSignal | undefined, seconds: number): Promise<State> {
    const controller = new AbortController();
    const onAbort = () => controller.abort(outer?.reason);
    if (outer?.aborted) onAbort();
    outer?.addEventListener("abort", onAbort, { once: true });
    const signal = controller.signal;
    state.signal = signal;
    let timer: ReturnType<typeof setTimeout> | undefined;
    try {
      const loop = this.#loop(state, signal, false);
      const timeout = new Promise<typeof TIMEOUT>((resolve) => {
        timer = setTimeout(() => resolve(TIMEOUT), seconds * 1000);
      });
      const winner = await Promise.race([loop, timeout]);
      if (winner === TIMEOUT) {
        controller.abort(new VfError("Rollout timed out"));
        // Give hooks that ignore the signal a moment to settle, but never hang on them.
        let grace: ReturnType<typeof setTimeout> | undefined;
        await Promise.race([
          loop.catch(() => {}),
          new Promise((r) => (grace = setTimeout(r, 2000))),
        ]);
        clearTimeout(grace);
        state.timed_out = true;
        state.is_completed = true;
        state.stop_condition = "timeout_reached";
      }
    } finally {
      clearTimeout(timer);
      outer?.removeEventListener("abort", onAbort);
      const cleaning = this.#finish(state);
      if (cleaning) await cleaning;
    }
    return state;
  }
}

/** One model turn, no environment response. */
export class SingleTurnEnv extends MultiTurnEnv {
  constructor(options: Omit<MultiTurnEnvOptions, "maxTurns"> = {}) {
    super({ ...options, maxTurns: 1 });
  }

  envResponse(): Messages {
    throw new Error("SingleTurnEnv has no environment response");
  }
}
