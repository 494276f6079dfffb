/**
 * The per-rollout mutable record and its timing, and {@linkcode RolloutOutput}, its
 * serialised form. Environments fill a State, rubrics score it, `evaluate` and the env
 * server write its output: it sits below all of them.
 * @module
 */
import { type SerializedError, serializeError } from "./errors.ts";
import { isJsonPlain, jsonCopy } from "./util/_plain.ts";
import type { ChatClient } from "./model/client.ts";
import { MessageGraph, type MessageNode } from "./graph.ts";
import type { Messages, RolloutInput, SamplingArgs, Tool, TrajectoryStep, Usage } from "./types.ts";

/** A start/end span in Unix seconds. */
export interface Span {
  start: number;
  end: number;
}

/** Phase timings of one rollout (Unix seconds). */
export interface RolloutTiming {
  start_time: number;
  setup: Span;
  generation: Span;
  scoring: Span;
  model: { spans: Span[] };
  env: { spans: Span[] };
}

/** Seconds since the epoch, fractional. */
export function nowSeconds(): number {
  return Date.now() / 1000;
}

/** A fresh timing record. */
export function newTiming(): RolloutTiming {
  return {
    start_time: nowSeconds(),
    setup: { start: 0, end: 0 },
    generation: { start: 0, end: 0 },
    scoring: { start: 0, end: 0 },
    // Every rollout makes a model call; environment steps are for multi-turn ones.
    model: { spans: roomForOne() },
    env: { spans: [] },
  };
}

/**
 * An empty array with room for one element, for per-rollout lists that mostly get one (a
 * single-turn rollout's trajectory and model spans): the first push onto `[]` reserves 17
 * slots, about 130 bytes more than one. V8 keeps the slot that `pop()` empties.
 */
export function roomForOne<T>(): T[] {
  const list: T[] = [undefined as T];
  list.pop();
  return list;
}

function spanDuration(s: Span): number {
  return s.end > 0 ? Math.max(0, s.end - s.start) : 0;
}

/** The timing record with its derived durations, as written to disk. */
export function timingDump(t: RolloutTiming): Record<string, unknown> {
  const model = spansDuration(t.model.spans);
  const env = spansDuration(t.env.spans);
  const total = t.scoring.end > 0 ? t.scoring.end - t.generation.start : 0;
  const setup = spanDuration(t.setup);
  const scoring = spanDuration(t.scoring);
  return {
    start_time: t.start_time,
    setup: withDuration(t.setup, micro(setup)),
    generation: withDuration(t.generation, micro(spanDuration(t.generation))),
    scoring: withDuration(t.scoring, micro(scoring)),
    model: { spans: t.model.spans, duration: micro(model) },
    env: { spans: t.env.spans, duration: micro(env) },
    total: micro(total),
    overhead: total > 0 ? micro(total - setup - model - env - scoring) : 0,
  };
}

/**
 * Seconds rounded to the microsecond. A difference of two timestamps carries float noise in
 * its last digits (0.0009999275207519531 for 1 ms); the rounded figure is what was measured,
 * and it is quicker to write.
 */
function micro(seconds: number): number {
  return Math.round(seconds * 1e6) / 1e6 || 0;
}

function spansDuration(spans: Span[]): number {
  let sum = 0;
  for (const s of spans) sum += spanDuration(s);
  return sum;
}

/** The span with its duration (and any other keys it was given, as a spread would keep). */
function withDuration(span: Span, duration: number): Span & { duration: number } {
  if (isStartEnd(span)) return { start: span.start, end: span.end, duration };
  return { ...span, duration };
}

/**
 * Whether the span's keys are `start` then `end` and no more. A for…in walk, not
 * `Object.keys()`: three spans per rollout made an array of keys each.
 */
function isStartEnd(span: Span): boolean {
  let n = 0;
  for (const key in span) {
    if (n > 1 || key !== (n === 0 ? "start" : "end")) return false;
    n++;
  }
  return n === 2;
}

/** Per-rollout state. Environments may add their own keys. */
export interface State {
  input: RolloutInput;
  prompt: Messages;
  answer: string;
  task: string;
  info: Record<string, unknown>;
  example_id: number;
  client: ChatClient;
  model: string;
  sampling_args: SamplingArgs;
  is_completed: boolean;
  is_truncated: boolean;
  tool_defs: Tool[];
  trajectory: TrajectoryStep[];
  completion: Messages;
  usage: { input_tokens: number; output_tokens: number; seen: boolean };
  trajectory_id: string;
  reward: number | null;
  advantage: number | null;
  metrics: Record<string, number> | null;
  error: unknown;
  final_env_response: Messages | null;
  stop_condition: string | null;
  prompt_too_long: boolean;
  timed_out: boolean;
  timing: RolloutTiming;
  signal?: AbortSignal;
  [key: string]: unknown;
}

/** Version of every persisted record (results, traces, metadata). */
export const FORMAT_VERSION = 1;

/** One serialised rollout (snake_case, as in verifiers). */
export interface RolloutOutput {
  format_version: number;
  example_id: number;
  task: string;
  prompt: Messages;
  completion: Messages;
  answer?: string;
  info?: Record<string, unknown>;
  reward: number;
  advantage?: number | null;
  metrics: Record<string, number>;
  timing: Record<string, unknown>;
  is_completed: boolean;
  is_truncated: boolean;
  stop_condition: string | null;
  tool_defs: Tool[] | null;
  error: SerializedError | null;
  token_usage?: {
    input_tokens: number;
    output_tokens: number;
    final_input_tokens: number;
    final_output_tokens: number;
  };
  trajectory_id: string;
  /**
   * `vf ctl requeue`: the `trajectory_id` of the errored rollout this one ran again for; readers
   * keep this one and drop that one.
   */
  retry_of?: string;
  /** Model requests of this rollout that were retried before they succeeded or gave up. */
  model_retries?: number;
  /**
   * The message graph with each node's `token_ids`, `mask` and `logprobs`, when the model
   * calls returned token data (`return_token_ids`). Written to `results.jsonl` only when asked
   * (`save_tokens`), since it is large.
   */
  nodes?: MessageNode[];
  [extra: string]: unknown;
}

function jsonReplacer(_key: string, v: unknown): unknown {
  if (typeof v === "bigint") return Number(v);
  if (v instanceof Error) return serializeError(v);
  if (v instanceof Map) return Object.fromEntries(v);
  if (v instanceof Set) return [...v];
  return v;
}

function jsonSafe(value: unknown): unknown {
  return jsonCopy(value, jsonReplacer);
}

/** A value of a state nobody changes after: kept as it is when it is plain JSON already. */
function jsonKept(value: unknown): unknown {
  return isJsonPlain(value) ? value : jsonCopy(value, jsonReplacer);
}

function hasKeys(record: Record<string, unknown>): boolean {
  for (const _ in record) return true;
  return false;
}

/** Serialise a finished state. `stateColumns` copies extra state keys (JSON-safe values only). */
export function stateToOutput(state: State, stateColumns: string[] = []): RolloutOutput {
  return toOutput(state, stateColumns, jsonSafe);
}

/**
 * {@link stateToOutput} of a state its caller lets go (a finished group's, in
 * `runGroupOutputs`): a prompt and completion that are plain JSON already are shared with the
 * output instead of copied, which cost a few hundred bytes per rollout.
 */
export function releasedStateToOutput(state: State, stateColumns: string[] = []): RolloutOutput {
  return toOutput(state, stateColumns, jsonKept);
}

function toOutput(
  state: State,
  stateColumns: string[],
  messagesOf: (messages: Messages) => unknown,
): RolloutOutput {
  const metrics = state.metrics ?? {};
  const out: RolloutOutput = {
    format_version: FORMAT_VERSION,
    example_id: state.example_id,
    task: state.task ?? "default",
    prompt: messagesOf(state.prompt) as Messages,
    completion: messagesOf(state.completion) as Messages,
    reward: state.reward ?? 0,
    advantage: state.advantage,
    metrics,
    timing: timingDump(state.timing),
    is_completed: state.is_completed,
    is_truncated: state.is_truncated,
    stop_condition: state.stop_condition,
    tool_defs: state.tool_defs.length > 0 ? state.tool_defs : null,
    error: state.error ? serializeError(state.error) : null,
    trajectory_id: state.trajectory_id,
    // Model requests retried (429, 5xx, timeouts), those that failed at last included.
    model_retries: ((state.error as { retries?: number } | null | undefined)?.retries) ?? 0,
  };
  let tokens = false;
  for (const step of state.trajectory) {
    out.model_retries! += step.response.retries ?? 0;
    if (step.response.tokens) tokens = true;
  }
  if (out.error) {
    out.error_chain = out.error.error_chain_repr;
    out.long_error_chain = out.error.error_chain_str;
  }
  if (state.answer) out.answer = state.answer;
  if (state.info && hasKeys(state.info)) {
    out.info = jsonSafe(state.info) as Record<string, unknown>;
  }
  for (const k in metrics) if (!(k in out)) out[k] = metrics[k];
  if (state.usage.seen) {
    let finalOut = 0;
    let lastUsage: Usage | null = null;
    for (const step of state.trajectory) {
      const usage = step.response.usage;
      if (!usage) continue;
      finalOut += usage.completion_tokens ?? 0;
      lastUsage = usage;
    }
    const finalIn = lastUsage
      ? Math.max(0, lastUsage.prompt_tokens + lastUsage.completion_tokens - finalOut)
      : 0;
    out.token_usage = {
      input_tokens: state.usage.input_tokens,
      output_tokens: state.usage.output_tokens,
      final_input_tokens: finalIn,
      final_output_tokens: finalOut,
    };
  }
  if (tokens) out.nodes = tokenGraph(state).nodes;
  for (const col of stateColumns) {
    const value = state[col];
    try {
      out[col] = jsonSafe(value ?? null);
    } catch (error) {
      throw new TypeError(`State column "${col}" is not JSON-serialisable: ${error}`);
    }
  }
  return out;
}

/** The message graph of a rollout's model calls, each reply carrying its call's tokens. */
export function tokenGraph(state: Pick<State, "trajectory">): MessageGraph {
  const graph = new MessageGraph();
  for (const step of state.trajectory) {
    const reply = step.completion.find((m) => m.role === "assistant") ?? step.completion[0];
    if (reply) graph.commit(step.prompt, reply, step.response.tokens);
  }
  return graph;
}
