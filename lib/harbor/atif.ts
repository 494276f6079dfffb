/**
 * Trajectories in ATIF, the Agent Trajectory Interchange Format Harbor and its agents write
 * (RFC 0001, v1.7): one JSON document per rollout with numbered steps (`system`, `user`,
 * `agent`), the agent's tool calls with the observations they produced, per-step token
 * metrics (with the prompt and completion token ids when the run kept them), and other
 * agents of the same episode embedded as `subagent_trajectories`.
 *
 * {@link traceToAtif} turns a vf trace into one (vf's reward, rewards and stop condition go
 * in `extra`); {@link atifProblems} checks the rules of the format a JSON Schema cannot
 * (`atif.schema.json` beside this file holds the rest); {@link atifToMessages} reads one back
 * into chat messages, which `import.ts` uses to read a Harbor job folder into vf's run layout.
 * @module
 */
import { ConfigError } from "../errors.ts";
import type { Message, Messages, ToolCall } from "../types.ts";
import type { TaskTrace } from "../tasks/trace.ts";
import { MessageGraph, type MessageNode } from "../graph.ts";
import { VERSION } from "../version.ts";
import { stepSegments } from "./segments.ts";

/** The ATIF version vf writes. */
export const ATIF_VERSION = "ATIF-v1.7";

/** An ATIF tool call. */
export interface AtifToolCall {
  tool_call_id: string;
  function_name: string;
  arguments: Record<string, unknown>;
  extra?: Record<string, unknown>;
}

/** A reference from an observation to a subagent's trajectory (embedded or a file). */
export interface AtifSubagentRef {
  trajectory_id?: string;
  trajectory_path?: string | null;
  session_id?: string;
  extra?: Record<string, unknown>;
}

/** One result of an observation. */
export interface AtifObservationResult {
  source_call_id?: string;
  content?: string;
  subagent_trajectory_ref?: AtifSubagentRef[];
  extra?: Record<string, unknown>;
}

/** One ATIF step. */
export interface AtifStep {
  step_id: number;
  timestamp?: string;
  source: "system" | "user" | "agent";
  message: string;
  model_name?: string;
  reasoning_content?: string;
  tool_calls?: AtifToolCall[];
  observation?: { results: AtifObservationResult[] };
  metrics?: {
    prompt_tokens?: number;
    completion_tokens?: number;
    cached_tokens?: number;
    prompt_token_ids?: number[];
    completion_token_ids?: number[];
    logprobs?: number[];
    extra?: Record<string, unknown>;
  };
  /** Model inferences the step stands for: 1 for a model reply. */
  llm_call_count?: number;
  extra?: Record<string, unknown>;
}

/** An ATIF trajectory. */
export interface AtifTrajectory {
  schema_version: string;
  /** Run-scoped: vf writes the episode's id (shared by the traces of one episode). */
  session_id?: string;
  /** Document-scoped: vf writes the trace's id. */
  trajectory_id?: string;
  agent: { name: string; version?: string; model_name?: string; extra?: Record<string, unknown> };
  steps: AtifStep[];
  notes?: string;
  final_metrics?: {
    total_prompt_tokens?: number;
    total_completion_tokens?: number;
    total_cached_tokens?: number;
    total_cost_usd?: number | null;
    total_steps?: number;
    extra?: Record<string, unknown>;
  };
  extra?: Record<string, unknown>;
  subagent_trajectories?: AtifTrajectory[];
}

function text(content: unknown): string {
  if (typeof content === "string") return content;
  if (Array.isArray(content)) {
    return content.map((p) => (p as { text?: string })?.text ?? "").join("");
  }
  return content === null || content === undefined ? "" : JSON.stringify(content);
}

function iso(seconds: number | undefined): string | undefined {
  return seconds ? new Date(seconds * 1000).toISOString() : undefined;
}

function args(raw: string): Record<string, unknown> {
  try {
    const parsed = JSON.parse(raw || "{}");
    if (parsed && typeof parsed === "object" && !Array.isArray(parsed)) return parsed;
  } catch { /* kept raw below */ }
  return { raw };
}

/** The token ids of one reply: its prompt's (the branch before it) and its own sampled ones. */
function replyTokens(
  graph: MessageGraph | null,
  node: number | undefined,
): Pick<
  NonNullable<AtifStep["metrics"]>,
  "prompt_token_ids" | "completion_token_ids" | "logprobs"
> {
  const n = node === undefined ? undefined : graph?.nodes[node];
  if (!graph || !n?.token_ids || !n.mask || n.token_ids.length !== n.mask.length) return {};
  const branch = graph.tokens(node!).token_ids;
  const completion = n.token_ids.filter((_, i) => n.mask![i]);
  return {
    prompt_token_ids: branch.slice(0, branch.length - completion.length),
    completion_token_ids: completion,
    ...(n.logprobs?.length === completion.length ? { logprobs: [...n.logprobs] } : {}),
  };
}

/** Options of {@link traceToAtif}. */
export interface TraceToAtifOptions {
  /**
   * Other traces of the trace's episode (judges, simulated users, other roles): embedded as
   * `subagent_trajectories`, each referenced from a closing system step. Default none.
   */
  subagents?: TaskTrace[];
}

/**
 * A vf trace as an ATIF v1.7 trajectory: one step per message (tool outputs are the
 * observation of the agent step that called them), each agent step with its model call's
 * model, time, tokens and, when the run saved them (`save_tokens`), token ids and logprobs.
 */
export function traceToAtif(trace: TaskTrace, options: TraceToAtifOptions = {}): AtifTrajectory {
  const steps: AtifStep[] = [];
  const calls = trace.model_calls.filter((c) => c.response && !c.sampling);
  const graph = trace.nodes?.some((n: MessageNode) => n.token_ids !== undefined)
    ? new MessageGraph(trace.nodes as MessageNode[])
    : null;
  const toolRecords = new Map((trace.tool_calls ?? []).map((t) => [t.id, t]));
  let agentTurn = 0;
  for (const m of trace.messages) {
    if (m.role === "tool") {
      // An observation of the agent step that asked for it (else of the last agent step).
      const owner = [...steps].reverse().find((s) =>
        s.tool_calls?.some((c) =>
          c.tool_call_id === m.tool_call_id
        )
      ) ?? [...steps].reverse().find((s) => s.source === "agent");
      if (owner) {
        const known = owner.tool_calls?.some((c) => c.tool_call_id === m.tool_call_id);
        const record = m.tool_call_id ? toolRecords.get(m.tool_call_id) : undefined;
        owner.observation ??= { results: [] };
        owner.observation.results.push({
          ...(known ? { source_call_id: m.tool_call_id } : {}),
          content: text(m.content),
          ...(record && (record.exit_code !== undefined || record.error)
            ? {
              extra: {
                ...(record.exit_code !== undefined ? { exit_code: record.exit_code } : {}),
                ...(record.error ? { error: record.error } : {}),
                duration_ms: record.duration_ms,
              },
            }
            : {}),
        });
      } else {
        // Nothing asked for it: it stays in the history as what the user side said.
        steps.push({ step_id: steps.length + 1, source: "user", message: text(m.content) });
      }
      continue;
    }
    const step: AtifStep = {
      step_id: steps.length + 1,
      source: m.role === "assistant" ? "agent" : m.role === "user" ? "user" : "system",
      message: text(m.content),
    };
    if (m.role === "assistant") {
      const call = calls[agentTurn++];
      step.model_name = call?.response?.model || trace.model;
      const at = iso(call?.started_at);
      if (at) step.timestamp = at;
      if (m.reasoning_content) step.reasoning_content = String(m.reasoning_content);
      if (m.tool_calls?.length) {
        step.tool_calls = m.tool_calls.map((c) => ({
          tool_call_id: c.id,
          function_name: c.name,
          arguments: args(c.arguments),
        }));
      }
      if (call) {
        step.llm_call_count = 1;
        const usage = call.response?.usage as
          | (Record<string, unknown> & {
            prompt_tokens?: number;
            completion_tokens?: number;
            reasoning_tokens?: number;
          })
          | null
          | undefined;
        const cached = (usage?.prompt_tokens_details as { cached_tokens?: unknown } | undefined)
          ?.cached_tokens;
        const metrics: NonNullable<AtifStep["metrics"]> = {
          ...(usage
            ? { prompt_tokens: usage.prompt_tokens, completion_tokens: usage.completion_tokens }
            : {}),
          ...(typeof cached === "number" ? { cached_tokens: cached } : {}),
          ...replyTokens(graph, call.node),
          ...(usage?.reasoning_tokens
            ? { extra: { reasoning_tokens: usage.reasoning_tokens } }
            : {}),
        };
        if (Object.keys(metrics).length) step.metrics = metrics;
      }
    }
    steps.push(step);
  }
  const subagents = (options.subagents ?? []).filter((t) => t.trace_id !== trace.trace_id);
  if (subagents.length) {
    steps.push({
      step_id: steps.length + 1,
      source: "system",
      message: `Other agents of episode ${trace.episode_id ?? trace.trace_id}`,
      observation: {
        results: subagents.map((t) => ({
          content: `${t.role} (attempt ${t.attempt}): reward ${t.reward ?? "none"}`,
          subagent_trajectory_ref: [{
            trajectory_id: t.trace_id,
            session_id: t.episode_id ?? t.trace_id,
            extra: { role: t.role, trainable: t.trainable },
          }],
        })),
      },
    });
  }
  const cachedTotal = steps.reduce((a, s) => a + (s.metrics?.cached_tokens ?? 0), 0);
  return {
    schema_version: ATIF_VERSION,
    session_id: trace.episode_id ?? trace.trace_id,
    trajectory_id: trace.trace_id,
    agent: { name: `vf-${trace.harness}`, version: VERSION, model_name: trace.model },
    steps,
    final_metrics: {
      total_prompt_tokens: trace.usage.input_tokens,
      total_completion_tokens: trace.usage.output_tokens,
      ...(cachedTotal ? { total_cached_tokens: cachedTotal } : {}),
      total_steps: steps.length,
    },
    extra: {
      vf_run_id: trace.run_id,
      task: trace.task.key,
      rollout_index: trace.rollout_index,
      role: trace.role,
      reward: trace.reward,
      rewards: trace.rewards,
      stop_condition: trace.stop_condition,
      error: trace.error ? { type: trace.error.error, message: trace.error.message } : null,
    },
    ...(subagents.length ? { subagent_trajectories: subagents.map((t) => traceToAtif(t)) } : {}),
  };
}

/**
 * A trace as its ATIF documents: one per step's session for a multi-step Harbor trace (each
 * step is a fresh session of the agent, and Harbor keeps one trajectory per step), each with
 * the step's messages, model calls and tokens, `trajectory_id` `<trace_id>-step-<n>` and the
 * step in `extra` (`step`, `step_index`, `step_reward`, `vf_trace_id`); else the one document
 * of {@link traceToAtif}. The episode's other agents go with the last.
 * @throws {Error} when the trace's step ranges are not in order inside its messages
 */
export function traceToAtifDocs(
  trace: TaskTrace,
  options: TraceToAtifOptions = {},
): AtifTrajectory[] {
  const segments = stepSegments(trace.info, trace.messages.length);
  if (typeof segments === "string") throw new Error(segments);
  if (!segments) return [traceToAtif(trace, options)];
  const calls = trace.model_calls.filter((c) => c.response && !c.sampling);
  const replies = (from: number, to: number) =>
    trace.messages.slice(from, to).filter((m) => m.role === "assistant").length;
  return segments.map((seg, i) => {
    const before = replies(0, seg.from);
    const own = calls.slice(before, before + replies(seg.from, seg.to));
    const tokens = (k: "prompt_tokens" | "completion_tokens") =>
      own.reduce((a, c) => a + (c.response?.usage?.[k] ?? 0), 0);
    const doc = traceToAtif(
      {
        ...trace,
        messages: trace.messages.slice(seg.from, seg.to),
        model_calls: own,
        usage: {
          input_tokens: tokens("prompt_tokens"),
          output_tokens: tokens("completion_tokens"),
        },
      },
      i === segments.length - 1 ? options : {},
    );
    doc.trajectory_id = `${trace.trace_id}-step-${seg.index + 1}`;
    doc.extra = {
      ...doc.extra,
      vf_trace_id: trace.trace_id,
      step: seg.name,
      step_index: seg.index,
      step_reward: seg.reward,
    };
    return doc;
  });
}

/**
 * What breaks the rules of ATIF a JSON Schema cannot say (Harbor's validator checks them):
 * step ids run 1, 2, 3…; an observation's `source_call_id` names a tool call of its step;
 * tool call ids are unique in a step; embedded subagents have unique `trajectory_id`s; a ref
 * to an embedded subagent resolves. Each problem names its path; empty when there are none.
 */
export function atifProblems(doc: AtifTrajectory, at = ""): string[] {
  const out: string[] = [];
  const ids = new Set<string>();
  (doc.subagent_trajectories ?? []).forEach((sub, i) => {
    const where = `${at}subagent_trajectories[${i}]`;
    if (!sub.trajectory_id) out.push(`${where}.trajectory_id: missing on an embedded subagent`);
    else if (ids.has(sub.trajectory_id)) {
      out.push(`${where}.trajectory_id: "${sub.trajectory_id}" is not unique`);
    } else ids.add(sub.trajectory_id);
    out.push(...atifProblems(sub, `${where}.`));
  });
  (doc.steps ?? []).forEach((s, i) => {
    const where = `${at}steps[${i}]`;
    if (s.step_id !== i + 1) out.push(`${where}.step_id: ${s.step_id} where ${i + 1} is due`);
    const calls = (s.tool_calls ?? []).map((c) => c.tool_call_id);
    const twice = calls.find((c, j) => calls.indexOf(c) !== j);
    if (twice) out.push(`${where}.tool_calls: "${twice}" twice`);
    (s.observation?.results ?? []).forEach((r, j) => {
      if (r.source_call_id && !calls.includes(r.source_call_id)) {
        out.push(
          `${where}.observation.results[${j}].source_call_id: "${r.source_call_id}" is no tool call of the step`,
        );
      }
      (r.subagent_trajectory_ref ?? []).forEach((ref, k) => {
        if (ref.trajectory_id && !ref.trajectory_path && !ids.has(ref.trajectory_id)) {
          out.push(
            `${where}.observation.results[${j}].subagent_trajectory_ref[${k}].trajectory_id: "${ref.trajectory_id}" resolves to no embedded subagent`,
          );
        }
      });
    });
  });
  return out;
}

/**
 * Checks the fields of one step that {@link atifToMessages} reads (the file may come from
 * anywhere): a wrong type is a ConfigError naming the file and the step's field.
 */
function checkStep(s: Record<string, unknown>, source: string, at: string): void {
  const fail = (field: string, want: string, got: unknown): never => {
    const text = JSON.stringify(got) ?? String(got);
    throw new ConfigError(
      `${source}: ${at}.${field}: must be ${want}, not ${
        text.length > 60 ? `${text.slice(0, 60)}…` : text
      }`,
    );
  };
  const isObject = (v: unknown): v is Record<string, unknown> =>
    v !== null && typeof v === "object" && !Array.isArray(v);
  const optional = (v: unknown) => v === undefined || v === null;
  if (!optional(s.message) && typeof s.message !== "string" && !Array.isArray(s.message)) {
    fail("message", "a string or a list of content parts", s.message);
  }
  if (!optional(s.reasoning_content) && typeof s.reasoning_content !== "string") {
    fail("reasoning_content", "a string", s.reasoning_content);
  }
  if (!optional(s.tool_calls)) {
    if (!Array.isArray(s.tool_calls)) fail("tool_calls", "a list", s.tool_calls);
    (s.tool_calls as unknown[]).forEach((c, j) => {
      if (!isObject(c)) return fail(`tool_calls[${j}]`, "an object", c);
      if (typeof c.function_name !== "string") {
        fail(`tool_calls[${j}].function_name`, "a string", c.function_name);
      }
      if (!optional(c.tool_call_id) && typeof c.tool_call_id !== "string") {
        fail(`tool_calls[${j}].tool_call_id`, "a string", c.tool_call_id);
      }
    });
  }
  if (optional(s.observation)) return;
  if (!isObject(s.observation)) return fail("observation", "an object", s.observation);
  const results = s.observation.results;
  if (optional(results)) return;
  if (!Array.isArray(results)) return fail("observation.results", "a list", results);
  results.forEach((r, j) => {
    if (!isObject(r)) return fail(`observation.results[${j}]`, "an object", r);
    if (!optional(r.source_call_id) && typeof r.source_call_id !== "string") {
      fail(`observation.results[${j}].source_call_id`, "a string", r.source_call_id);
    }
  });
}

/**
 * An ATIF trajectory's steps as chat messages: agent tool calls become assistant tool calls,
 * and their observations the tool messages that answer them.
 * @throws {ConfigError} when it is not an ATIF trajectory, or a step's field has the wrong
 * type (naming `source` and the field)
 */
export function atifToMessages(doc: unknown, source: string): Messages {
  const t = doc as AtifTrajectory;
  if (!t || typeof t.schema_version !== "string" || !/^ATIF-v1\./.test(t.schema_version)) {
    throw new ConfigError(`${source}: not an ATIF trajectory (no schema_version "ATIF-v1.x")`);
  }
  if (!Array.isArray(t.steps)) throw new ConfigError(`${source}: steps must be a list`);
  const out: Message[] = [];
  t.steps.forEach((s, i) => {
    if (!s || typeof s !== "object") {
      throw new ConfigError(`${source}: steps[${i}] is not an object`);
    }
    if (s.source === "agent") {
      checkStep(s as unknown as Record<string, unknown>, source, `steps[${i}]`);
      const calls: ToolCall[] = (s.tool_calls ?? []).map((c, j) => ({
        id: c.tool_call_id || `call_${i}_${j}`,
        name: c.function_name,
        arguments: JSON.stringify(c.arguments ?? {}),
      }));
      out.push({
        role: "assistant",
        // An agent step that only calls tools has an empty message: no content.
        content: s.message === "" && calls.length ? null : s.message ?? null,
        ...(s.reasoning_content ? { reasoning_content: s.reasoning_content } : {}),
        ...(calls.length ? { tool_calls: calls } : {}),
      });
      for (const [j, r] of (s.observation?.results ?? []).entries()) {
        out.push({
          role: "tool",
          tool_call_id: r.source_call_id ?? calls[j]?.id ?? `call_${i}_${j}`,
          content: text(r.content),
        });
      }
    } else if (s.source === "system") {
      out.push({ role: "system", content: text(s.message) });
    } else if (s.source === "user") {
      out.push({ role: "user", content: text(s.message) });
    } else {
      throw new ConfigError(
        `${source}: steps[${i}].source "${String(s.source)}" is not system, user or agent`,
      );
    }
  });
  return out;
}
