/**
 * Trajectories in ATIF, the Agent Trajectory Interchange Format Harbor and its agents write:
 * one JSON document per rollout with numbered steps (`system`, `user`, `agent`), the agent's
 * tool calls with the observations they produced, and per-step and final token metrics.
 *
 * {@link traceToAtif} turns a vf trace into one (vf's reward, rewards and stop condition go
 * in `extra`); {@link atifToMessages} reads one back into chat messages, and
 * {@link importHarborJob} reads a Harbor job folder (a `result.json` and
 * `agent/trajectory.json` per trial) into vf's run layout.
 * @module
 */
import { existsSync } from "node:fs";
import { readdir, readFile } from "node:fs/promises";
import { basename, join } from "node:path";
import { ConfigError } from "../errors.ts";
import type { Message, Messages, ToolCall } from "../types.ts";
import type { TaskTrace } from "../tasks/trace.ts";
import { TRACE_FORMAT_VERSION } from "../tasks/trace.ts";
import { VERSION } from "../version.ts";

/** The ATIF version vf writes. */
export const ATIF_VERSION = "ATIF-v1.6";

/** An ATIF tool call. */
export interface AtifToolCall {
  tool_call_id: string;
  function_name: string;
  arguments: Record<string, unknown>;
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
  observation?: { results: Array<{ source_call_id?: string; content: string }> };
  metrics?: { prompt_tokens?: number; completion_tokens?: number };
  extra?: Record<string, unknown>;
}

/** An ATIF trajectory. */
export interface AtifTrajectory {
  schema_version: string;
  session_id?: string;
  agent: { name: string; version?: string; model_name?: string };
  steps: AtifStep[];
  final_metrics?: {
    total_prompt_tokens?: number;
    total_completion_tokens?: number;
    total_cached_tokens?: number;
    total_cost_usd?: number | null;
    total_steps?: number;
    extra?: Record<string, unknown>;
  };
  extra?: Record<string, unknown>;
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

/** A vf trace as an ATIF trajectory. */
export function traceToAtif(trace: TaskTrace): AtifTrajectory {
  const steps: AtifStep[] = [];
  const calls = trace.model_calls.filter((c) => c.response);
  let agentTurn = 0;
  for (const m of trace.messages) {
    if (m.role === "tool") {
      // An observation of the agent step that asked for it.
      const owner = [...steps].reverse().find((s) =>
        s.tool_calls?.some((c) =>
          c.tool_call_id === m.tool_call_id
        )
      ) ?? steps.at(-1);
      if (owner) {
        owner.observation ??= { results: [] };
        owner.observation.results.push({
          source_call_id: m.tool_call_id,
          content: text(m.content),
        });
      }
      continue;
    }
    const step: AtifStep = {
      step_id: steps.length + 1,
      source: m.role === "assistant" ? "agent" : m.role === "system" ? "system" : "user",
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
      const usage = call?.response?.usage;
      if (usage) {
        step.metrics = {
          prompt_tokens: usage.prompt_tokens,
          completion_tokens: usage.completion_tokens,
        };
      }
    }
    steps.push(step);
  }
  return {
    schema_version: ATIF_VERSION,
    session_id: trace.trace_id,
    agent: { name: `vf-${trace.harness}`, version: VERSION, model_name: trace.model },
    steps,
    final_metrics: {
      total_prompt_tokens: trace.usage.input_tokens,
      total_completion_tokens: trace.usage.output_tokens,
      total_steps: steps.length,
    },
    extra: {
      vf_run_id: trace.run_id,
      task: trace.task.key,
      rollout_index: trace.rollout_index,
      reward: trace.reward,
      rewards: trace.rewards,
      stop_condition: trace.stop_condition,
      error: trace.error ? { type: trace.error.error, message: trace.error.message } : null,
    },
  };
}

/**
 * An ATIF trajectory's steps as chat messages: agent tool calls become assistant tool calls,
 * and their observations the tool messages that answer them.
 * @throws {ConfigError} when it is not an ATIF trajectory
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

function harborError(type: string, message: string, phase: string): TaskTrace["error"] {
  return {
    error: type,
    message,
    error_chain_repr: `${type}(${JSON.stringify(message)})`,
    error_chain_str: `${type}: ${message}`,
    phase,
    // Harbor does not say whose failure it was, and nothing was scored: never a 0.
    infra: true,
  };
}

/**
 * A Harbor job folder (one subfolder per trial with `result.json`, and
 * `agent/trajectory.json` when the agent wrote ATIF) as vf traces. A trial with an
 * exception is an error on its trace, never a 0; one without a verifier result is unscored.
 * @throws {ConfigError} naming the folder when it holds no trial
 */
export async function importHarborJob(jobDir: string, runId: string): Promise<TaskTrace[]> {
  if (!existsSync(jobDir)) throw new ConfigError(`${jobDir}: no such folder`);
  const traces: TaskTrace[] = [];
  const counts = new Map<string, number>();
  for (
    const entry of (await readdir(jobDir, { withFileTypes: true })).sort((a, b) =>
      a.name < b.name ? -1 : 1
    )
  ) {
    if (!entry.isDirectory()) continue;
    const dir = join(jobDir, entry.name);
    const resultPath = join(dir, "result.json");
    if (!existsSync(resultPath)) continue;
    let result: Record<string, unknown>;
    try {
      result = JSON.parse(await readFile(resultPath, "utf8"));
    } catch (error) {
      throw new ConfigError(`${resultPath}: not JSON: ${(error as Error).message}`);
    }
    const taskName = String(result.task_name ?? basename(dir).replace(/__[^_]+$/, ""));
    const agentInfo = (result.agent_info ?? {}) as Record<string, unknown>;
    const modelInfo = (agentInfo.model_info ?? {}) as Record<string, unknown>;
    const agentResult = (result.agent_result ?? {}) as Record<string, unknown>;
    const verifier = (result.verifier_result ?? null) as
      | { rewards?: Record<string, unknown> }
      | null;
    const exception = result.exception_info as Record<string, unknown> | null | undefined;
    const trajectoryPath = join(dir, "agent", "trajectory.json");
    let messages: Messages = [];
    let model = String(modelInfo.name ?? "");
    if (existsSync(trajectoryPath)) {
      const doc = JSON.parse(await readFile(trajectoryPath, "utf8"));
      messages = atifToMessages(doc, trajectoryPath);
      model ||= String(doc.agent?.model_name ?? "");
    }
    const rewards: Record<string, number> = {};
    for (const [k, v] of Object.entries(verifier?.rewards ?? {})) {
      if (typeof v === "number" && Number.isFinite(v)) rewards[k] = v;
    }
    const scored = !exception && Object.keys(rewards).length > 0;
    const index = counts.get(taskName) ?? 0;
    counts.set(taskName, index + 1);
    const started = Date.parse(String(result.started_at ?? ""));
    traces.push({
      format_version: TRACE_FORMAT_VERSION,
      trace_id: String(result.id ?? crypto.randomUUID()),
      run_id: runId,
      taskset: "harbor-import",
      task: { key: taskName, idx: 0, hash: "" },
      example_id: 0,
      rollout_index: index,
      model,
      harness: String(agentInfo.name ?? "harbor"),
      role: "agent",
      trainable: true,
      attempt: 0,
      runtime: { type: "harbor" },
      scoring: { mode: "shared", attempts: 1 },
      messages,
      model_calls: [],
      tool_calls: [],
      stop_condition: exception ? "has_error" : null,
      reward: scored
        ? ("reward" in rewards ? rewards.reward : Object.values(rewards).reduce((a, b) => a + b, 0))
        : null,
      rewards: scored ? rewards : {},
      metrics: {},
      ok: !exception,
      error: exception
        ? harborError(
          String(exception.exception_type ?? "HarborError"),
          String(exception.exception_message ?? "the trial failed"),
          "agent",
        )
        : scored
        ? null
        : harborError("HarborError", "the trial has no verifier result", "scoring"),
      usage: {
        input_tokens: Number(agentResult.n_input_tokens ?? 0),
        output_tokens: Number(agentResult.n_output_tokens ?? 0),
      },
      timing: Number.isFinite(started) ? { started_at: started / 1000 } : {},
      info: { harbor_trial: basename(dir) },
    } as TaskTrace);
  }
  if (traces.length === 0) {
    throw new ConfigError(`${jobDir}: no Harbor trial here (no */result.json)`);
  }
  return traces;
}
