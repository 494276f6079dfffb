/**
 * The per-rollout mutable record and its timing.
 * @module
 */
import type { ChatClient } from "./client.ts";
import type { Messages, RolloutInput, SamplingArgs, Tool, TrajectoryStep } from "./types.ts";

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
    model: { spans: [] },
    env: { spans: [] },
  };
}

function spanDuration(s: Span): number {
  return s.end > 0 ? Math.max(0, s.end - s.start) : 0;
}

/** The timing record with its derived durations, as written to disk. */
export function timingDump(t: RolloutTiming): Record<string, unknown> {
  const model = t.model.spans.reduce((a, s) => a + spanDuration(s), 0);
  const env = t.env.spans.reduce((a, s) => a + spanDuration(s), 0);
  const total = t.scoring.end > 0 ? t.scoring.end - t.generation.start : 0;
  const setup = spanDuration(t.setup);
  const scoring = spanDuration(t.scoring);
  return {
    start_time: t.start_time,
    setup: { ...t.setup, duration: setup },
    generation: { ...t.generation, duration: spanDuration(t.generation) },
    scoring: { ...t.scoring, duration: scoring },
    model: { spans: t.model.spans, duration: model },
    env: { spans: t.env.spans, duration: env },
    total,
    overhead: total > 0 ? total - setup - model - env - scoring : 0,
  };
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
