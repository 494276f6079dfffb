/**
 * One rollout's trace: the record written to `traces.jsonl` ({@link TaskTrace}, versioned by
 * {@link TRACE_FORMAT_VERSION}) and {@link Trace}, a typed view of it: derived values (turns,
 * truncation, the last reply, usage, branches, a transcript), rewards with their weights, and
 * mutators that keep the total reward right. {@link Trace.read} is a lenient reader: it takes
 * the current format and the version-1 lines older runs wrote, keeps fields it does not know,
 * and `Trace.read(JSON.parse(JSON.stringify(trace))).toJSON()` equals `trace.toJSON()`.
 *
 * ```ts
 * for (const line of lines) {
 *   const trace = Trace.read(JSON.parse(line));
 *   console.log(trace.numTurns, trace.lastReply, trace.rewards);
 * }
 * ```
 * @module
 */
import { renderTranscript } from "../messages.ts";
import { type SerializedError, serializeError } from "../errors.ts";
import type { Messages } from "../types.ts";
import { MessageGraph, type MessageNode } from "../graph.ts";
import type { EgressDenial } from "../gateway/gateway.ts";
import type { NetworkPolicy } from "../gateway/policy.ts";
import type { ModelCallRecord, ToolCallRecord } from "./harness.ts";

/**
 * Version of trace records. 2 added `role`, `trainable`, `attempt`, `episode_id`,
 * `reward_weights`, `judge_usage` and (for a rewritten history) `nodes`; version 1 lines are
 * read as a single agent's (see `Trace.read`).
 */
export const TRACE_FORMAT_VERSION = 2;

/** One rollout's trace, one line of `traces.jsonl`. */
export interface TaskTrace {
  format_version: number;
  trace_id: string;
  run_id: string;
  taskset: string;
  task: { key: string; idx: number; hash: string };
  example_id: number;
  rollout_index: number;
  model: string;
  harness: string;
  /** The role this agent played in its episode (`agent` in a single-agent run). */
  role: string;
  /** Whether this trace is training data (false for judges and simulated users). */
  trainable: boolean;
  /** This role's run number within its episode (0 for the first; best-of-n counts up). */
  attempt: number;
  /** The episode this trace belongs to. */
  episode_id?: string;
  /**
   * `attempts`: agent sandboxes tried when more than one was needed (infrastructure failures
   * retry in a fresh sandbox); absent means the first one worked.
   */
  runtime: {
    type: string;
    image?: string;
    attempts?: number;
    /** fork_group: the trace id of the rollout whose setup (and sandbox snapshot) this one started from. */
    forked_from?: string;
  };
  scoring: { mode: "shared" | "isolated"; attempts: number };
  messages: Messages;
  /**
   * The message graph, when the history was rewritten (more than one branch) or the endpoint
   * returned token ids (`return_token_ids`: `token_ids`/`mask`/`logprobs` per node);
   * otherwise the one branch is `messages`.
   */
  nodes?: MessageNode[];
  model_calls: ModelCallRecord[];
  /** Model requests of this rollout that were retried (set when the trace is written). */
  model_retries?: number;
  tool_calls: ToolCallRecord[];
  stop_condition: string | null;
  reward: number | null;
  /**
   * Reward minus the mean reward of the task's scored rollouts in this run (null when
   * unscored); set on what `runTaskset()` returns, not on the lines written as episodes end.
   */
  advantage?: number | null;
  rewards: Record<string, number>;
  /** Each reward's weight in `reward`, where it is not 1. */
  reward_weights?: Record<string, number>;
  metrics: Record<string, number>;
  /** Tokens the judges' calls used (their replies are in `info.judge`), apart from `usage`. */
  judge_usage?: { input_tokens: number; output_tokens: number };
  /** The egress policy of the agent phase and the connections it refused (every phase). */
  network?: { policy: NetworkPolicy; denied: EgressDenial[] };
  ok: boolean;
  /** `infra`: the failure was infrastructure (sandbox, engine), not the agent's or the task's. */
  error: (SerializedError & { phase: string; infra?: boolean }) | null;
  usage: { input_tokens: number; output_tokens: number };
  /**
   * `started_at` (epoch seconds) and milliseconds per phase (`setup_ms`, `sandbox_ms`,
   * `agent_ms`, `finalize_ms`, `artifacts_ms`, `scoring_ms`, `judge_ms`, `total_ms`). In
   * isolated scoring the grader starts while the artifacts are collected, so `artifacts_ms`
   * lies within `scoring_ms`.
   */
  timing: Record<string, number>;
  info: Record<string, unknown>;
}

/** Stop conditions that cut the rollout short. */
const TRUNCATING = new Set([
  "max_turns",
  "max_turns_reached",
  "max_input_tokens",
  "max_output_tokens",
  "max_total_tokens",
  "context_length",
]);

/** A rollout's trace, typed (see the module doc). */
export class Trace {
  /** The record, as written to `traces.jsonl`. */
  readonly record: TaskTrace;

  constructor(record: TaskTrace) {
    this.record = record;
  }

  /**
   * Read a trace record leniently: the current format or version 1 (a single agent's line
   * before episodes: role `agent`, trainable, first attempt); missing lists and maps are
   * empty, unknown fields are kept.
   * @throws {TypeError} when `value` is not a trace at all
   */
  static read(value: unknown): Trace {
    const r = value as Partial<TaskTrace> | null;
    if (!r || typeof r !== "object" || typeof r.trace_id !== "string" || !r.task) {
      throw new TypeError("Not a trace record: it needs a trace_id and a task");
    }
    const record = {
      ...r,
      format_version: r.format_version ?? 1,
      role: r.role ?? "agent",
      trainable: r.trainable ?? true,
      attempt: r.attempt ?? 0,
      messages: r.messages ?? [],
      model_calls: r.model_calls ?? [],
      tool_calls: r.tool_calls ?? [],
      rewards: r.rewards ?? {},
      metrics: r.metrics ?? {},
      info: r.info ?? {},
      usage: r.usage ?? { input_tokens: 0, output_tokens: 0 },
      timing: r.timing ?? {},
      reward: r.reward ?? null,
      error: r.error ?? null,
      ok: r.ok ?? false,
      stop_condition: r.stop_condition ?? null,
    } as TaskTrace;
    return new Trace(record);
  }

  /** The record to write (the current format version). */
  toJSON(): TaskTrace {
    return { ...this.record, format_version: Math.max(this.record.format_version, 1) };
  }

  /** Whether the record was written in an older format. */
  get isLegacy(): boolean {
    return this.record.format_version < TRACE_FORMAT_VERSION;
  }

  /**
   * The message graph: the stored one for a rewritten history, else the one branch built
   * from `messages` (the replies are the messages the model calls added).
   */
  get graph(): MessageGraph {
    if (this.record.nodes?.length) return new MessageGraph(this.record.nodes as MessageNode[]);
    const sampled = new Set<number>();
    for (const call of this.record.model_calls) {
      if (call.response && !call.error && !call.sampling) sampled.add(call.request_messages);
    }
    return MessageGraph.linear(this.record.messages, sampled);
  }

  /** Every branch's messages (one unless a harness rewrote the history). */
  get branches(): Messages[] {
    return this.graph.branches();
  }

  /** The conversation as it ended (the last branch). */
  get messages(): Messages {
    return this.record.messages;
  }

  /** Model replies in the trace (sampled messages, every branch). */
  get numTurns(): number {
    return this.graph.nodes.filter((n) => n.sampled).length;
  }

  /** Whether a limit cut the rollout short, or the last reply stopped at its length. */
  get isTruncated(): boolean {
    if (this.record.stop_condition && TRUNCATING.has(this.record.stop_condition)) return true;
    const last = [...this.record.model_calls].reverse().find((c) =>
      c.response && !c.error && !c.sampling
    );
    return (last?.response?.message as { finish_reason?: string } | undefined)?.finish_reason ===
      "length";
  }

  /** The trimmed text of the model's last reply ("" when it never replied). */
  get lastReply(): string {
    const nodes = this.graph.nodes;
    for (let i = nodes.length - 1; i >= 0; i--) {
      const n = nodes[i];
      if (!n.sampled || n.message.role !== "assistant") continue;
      const c = n.message.content;
      if (typeof c === "string") return c.trim();
      if (Array.isArray(c)) {
        return c.map((p) => (p as { text?: string }).text ?? "").join("").trim();
      }
      return "";
    }
    return "";
  }

  /** Tokens of the agent's model calls (judges' are `judgeUsage`). */
  get usage(): { input_tokens: number; output_tokens: number; total_tokens: number } {
    const u = this.record.usage;
    return { ...u, total_tokens: u.input_tokens + u.output_tokens };
  }

  /** Tokens of the judges' calls, or null when no judge ran. */
  get judgeUsage(): { input_tokens: number; output_tokens: number } | null {
    return this.record.judge_usage ?? null;
  }

  /** Each reward with its weight in the total. */
  get rewards(): Record<string, { score: number; weight: number }> {
    const weights = this.record.reward_weights ?? {};
    return Object.fromEntries(
      Object.entries(this.record.rewards).map((
        [k, score],
      ) => [k, { score, weight: weights[k] ?? 1 }]),
    );
  }

  get reward(): number | null {
    return this.record.reward;
  }

  get ok(): boolean {
    return this.record.ok;
  }

  /** The last branch as text: `[role]` blocks, tool calls and tool results. */
  get transcript(): string {
    return renderTranscript(this.record.messages);
  }

  /** Set a reward (weight default 1) and recompute the total from every reward. */
  recordReward(name: string, score: number, weight = 1): void {
    if (!Number.isFinite(score)) {
      throw new RangeError(`Reward "${name}" must be finite, got ${score}`);
    }
    this.record.rewards[name] = score;
    const weights = { ...(this.record.reward_weights ?? {}) };
    if (weight === 1) delete weights[name];
    else weights[name] = weight;
    if (Object.keys(weights).length) this.record.reward_weights = weights;
    else delete this.record.reward_weights;
    this.record.reward = Object.entries(this.rewards).reduce(
      (a, [, r]) => a + r.score * r.weight,
      0,
    );
  }

  /** Set a metric. */
  recordMetric(name: string, value: number): void {
    this.record.metrics[name] = value;
  }

  /** End the rollout with `condition`; the first condition recorded wins. */
  stop(condition: string): void {
    this.record.stop_condition ??= condition;
  }

  /** Record a failure: the trace is not ok, its reward is void, it stops with `error`. */
  recordError(error: unknown, phase = "rollout"): void {
    this.record.error = { ...serializeError(error), phase };
    this.record.ok = false;
    this.record.reward = null;
    this.stop("error");
  }
}
