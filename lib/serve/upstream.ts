/**
 * vf's trace records shaped as verifiers' (upstream's) `Trace` and `Episode` as they dump
 * them on the trainer wire: {@link upstreamTrace} for a finished trace, {@link upstreamHead}
 * for the episode without its traces, {@link upstreamEpisode2026_08} for the earlier wire's
 * whole episode, and the pieces a live trace ({@link LiveTrace} in `delta.ts`) is grown from.
 * @module
 */
import type { Message, Messages } from "../types.ts";
import type { TaskTrace } from "../tasks/trace.ts";
import { VERSION } from "../version.ts";

/** upstream's `Trace.version`. */
export const UPSTREAM_TRACE_VERSION = 1;

/** A trace shaped as upstream's dumped `Trace`. */
export type UpstreamTrace = Record<string, unknown> & {
  id: string;
  nodes: Array<Record<string, unknown>>;
  calls: Array<Record<string, unknown>>;
};

export const span = (start = 0, end = 0) => ({ start, end });

export function emptyTiming(start: number) {
  return {
    start,
    boot: span(),
    setup: span(),
    agent: { ...span(), model: { duration: 0 }, harness: { duration: 0 } },
    finalize: span(),
    scoring: span(),
  };
}

export function node(
  parent: number | null,
  message: Message,
  sampled: boolean,
  timestamp: number,
  tokens?: { token_ids?: number[]; mask?: boolean[]; logprobs?: number[] },
): Record<string, unknown> {
  return {
    parent,
    message,
    sampled,
    timestamp,
    token_ids: tokens?.token_ids ?? [],
    mask: tokens?.mask ?? [],
    is_content: [],
    logprobs: tokens?.logprobs ?? [],
    advantages: null,
    reference_logprobs: null,
    loss_weights: null,
    multi_modal_data: null,
    routed_experts: null,
    sampling_mask: null,
    semantic_parents: [],
  };
}

/** A usage as upstream's `Usage` dumps it (its `input_tokens`/`total_tokens` are properties). */
export function usage(
  u: { prompt_tokens?: number; completion_tokens?: number } | null | undefined,
) {
  if (!u) return null;
  return {
    prompt_tokens: Number(u.prompt_tokens ?? 0),
    completion_tokens: Number(u.completion_tokens ?? 0),
    cached_input_tokens: null,
    reasoning_tokens: null,
    cost: null,
  };
}

type WireUsage = {
  prompt_tokens: number;
  completion_tokens: number;
  cached_input_tokens?: number | null;
};
const inputTokens = (u: WireUsage) => u.prompt_tokens + (u.cached_input_tokens ?? 0);
const totalTokens = (u: WireUsage) => inputTokens(u) + u.completion_tokens;

/**
 * A trace's token counts as upstream's `Trace` computes them over its branches (one per leaf
 * of the node graph, each with the calls of its nodes): `num_output_tokens` the completions
 * summed over branches, `num_total_tokens` each branch's last call's prompt and completion
 * summed over branches, `num_input_tokens` each call's prompt beyond the previous call's
 * whole sequence on its branch (never below 0), a call shared by branches counted once.
 */
export function tokenCounts(
  nodes: Array<Record<string, unknown>>,
  calls: Array<Record<string, unknown>>,
): { num_input_tokens: number; num_output_tokens: number; num_total_tokens: number } {
  const hasChild = new Set(nodes.map((n) => n.parent).filter((p) => typeof p === "number"));
  const byNode = new Map<number, Record<string, unknown>>();
  for (const c of calls) if (typeof c.node === "number") byNode.set(c.node, c);
  const seen = new Set<Record<string, unknown>>();
  let input = 0, output = 0, total = 0;
  for (let leaf = 0; leaf < nodes.length; leaf++) {
    if (hasChild.has(leaf)) continue;
    const path: number[] = [];
    for (let at: unknown = leaf; typeof at === "number"; at = nodes[at]?.parent) path.unshift(at);
    const used = path.flatMap((i) => {
      const c = byNode.get(i);
      return c && c.usage ? [c] : [];
    });
    let previous = 0;
    for (const c of used) {
      const u = c.usage as WireUsage;
      if (!seen.has(c)) {
        seen.add(c);
        input += Math.max(0, inputTokens(u) - previous);
      }
      previous = totalTokens(u);
      output += u.completion_tokens;
    }
    if (used.length > 0) total += totalTokens(used.at(-1)!.usage as WireUsage);
  }
  return { num_input_tokens: input, num_output_tokens: output, num_total_tokens: total };
}

function wireError(type: string, message: string) {
  return { type, message, status_code: null, traceback: null };
}

export function messageText(m: Message | undefined): string | null {
  if (!m) return null;
  const c = (m as { content?: unknown }).content;
  return typeof c === "string" ? c : c === undefined || c === null ? null : JSON.stringify(c);
}

/** Whether two messages say the same (role and content). */
export function sameMessage(a: unknown, b: unknown): boolean {
  const x = a as Message, y = b as Message;
  return x?.role === y?.role && messageText(x) === messageText(y);
}

/**
 * A legacy environment's output row (what `results.jsonl` holds: `prompt`, `completion`,
 * `reward`, `metrics`, `error`) seen as a trace record; a trace record as it is.
 */
function fromLegacyOutput(record: TaskTrace): TaskTrace {
  if (typeof record.trace_id === "string") return record;
  const row = record as unknown as Record<string, unknown>;
  const list = (v: unknown) => (Array.isArray(v) ? v as Messages : []);
  const metrics = Object.fromEntries(
    Object.entries((row.metrics ?? {}) as Record<string, unknown>).filter(([, v]) =>
      typeof v === "number"
    ),
  ) as Record<string, number>;
  const error = row.error
    ? {
      error: String((row.error as { error?: unknown }).error ?? "Error"),
      message: String((row.error as { message?: unknown }).message ?? row.error),
    }
    : null;
  return {
    ...record,
    trace_id: crypto.randomUUID().replaceAll("-", ""),
    messages: [...list(row.prompt), ...list(row.completion)],
    model_calls: [],
    rewards: typeof row.reward === "number" ? { reward: row.reward } : {},
    metrics,
    ok: !row.error,
    error: error as TaskTrace["error"],
    stop_condition: typeof row.stop_condition === "string" ? row.stop_condition : null,
    timing: {},
    info: typeof row.info === "object" && row.info !== null
      ? row.info as Record<string, unknown>
      : {},
  } as TaskTrace;
}

/**
 * A vf trace record as upstream's `Trace` (dumped): its nodes from the message graph (or the
 * conversation when there is none), model calls as `calls`, rewards with their weights,
 * the error, timing spans in epoch seconds. vf's own fields that upstream has no place for
 * (`trace_id`, `run_id`, `role`, `attempt`, `model_calls`'s retries) ride in `info.vf`.
 *
 * @param trace the record as `traces.jsonl` holds it
 * @param taskData the task's data, as the trainer sent it
 */
export function upstreamTrace(
  record: TaskTrace,
  taskData: Record<string, unknown>,
): UpstreamTrace {
  const trace = fromLegacyOutput(record);
  const started = Number(trace.timing?.started_at ?? Date.now() / 1000);
  const nodes = trace.nodes?.length
    ? trace.nodes.map((n) => node(n.parent, n.message, n.sampled, n.timestamp, n))
    : (trace.messages ?? []).map((m, i) =>
      node(i === 0 ? null : i - 1, m, m.role === "assistant", started)
    );
  const sampledNodes = nodes.flatMap((n, i) => (n.sampled ? [i] : []));
  let assistant = 0;
  const calls = (trace.model_calls ?? []).filter((c) => !(c as { sampling?: string }).sampling).map(
    (c) => {
      const at = c.node ?? (c.response ? sampledNodes[assistant++] : undefined);
      return {
        node: at ?? null,
        model: c.response?.model ?? trace.model,
        sampling: null,
        endpoint: "/chat/completions",
        finish_reason: (c.response?.message as { finish_reason?: string } | undefined)
          ?.finish_reason ?? null,
        usage: usage(c.response?.usage),
        time: span(c.started_at, c.started_at + c.duration_ms / 1000),
        error: c.error ? wireError("ModelError", c.error) : null,
        policy: null,
      };
    },
  );
  const weights = trace.reward_weights ?? {};
  const rewards = Object.fromEntries(
    Object.entries(trace.rewards ?? {}).map(([k, score]) => [k, {
      score,
      weight: weights[k] ?? 1,
    }]),
  );
  const ms = (k: string) => Number(trace.timing?.[k] ?? 0) / 1000;
  const setupEnd = started + ms("setup_ms");
  const agentEnd = setupEnd + ms("agent_ms");
  const finalizeEnd = agentEnd + ms("finalize_ms");
  const lastReply = [...(trace.messages ?? [])].reverse().find((m) => m.role === "assistant");
  return {
    version: UPSTREAM_TRACE_VERSION,
    id: trace.trace_id,
    verifiers: { version: `vf ${VERSION}`, commit: null },
    task: {
      type: "Task",
      data: taskData,
      key: trace.task?.key ?? null,
      hash: trace.task?.hash ?? null,
    },
    agent: {
      config: { harness: trace.harness, model: trace.model },
      runtime: trace.runtime ? { ...trace.runtime } : null,
      name: trace.role ?? "agent",
      trainable: trace.trainable ?? true,
    },
    tools: [],
    mm_token_type_id_map: null,
    nodes,
    calls,
    request_rewrites: [],
    response_rewrites: [],
    payload: [],
    rewards,
    metrics: { ...(trace.metrics ?? {}) },
    info: {
      ...(trace.info ?? {}),
      vf: {
        trace_id: trace.trace_id,
        run_id: trace.run_id,
        role: trace.role,
        attempt: trace.attempt,
        reward: trace.reward,
      },
    },
    root_reply: messageText(lastReply),
    extra_usage: trace.judge_usage
      ? [usage({
        prompt_tokens: trace.judge_usage.input_tokens,
        completion_tokens: trace.judge_usage.output_tokens,
      })]
      : [],
    is_completed: trace.error === null || trace.error === undefined,
    is_timeout: timedOut(trace),
    ok: trace.ok,
    stop_condition: trace.stop_condition ?? null,
    errors: trace.error ? [wireError(trace.error.error ?? "Error", trace.error.message ?? "")] : [],
    ...tokenCounts(nodes, calls),
    timing: {
      ...emptyTiming(started),
      setup: span(started, setupEnd),
      agent: {
        ...span(setupEnd, agentEnd),
        model: { duration: calls.reduce((a, c) => a + (c.time.end - c.time.start), 0) },
        harness: { duration: 0 },
      },
      finalize: span(agentEnd, finalizeEnd),
      scoring: span(finalizeEnd, finalizeEnd + ms("scoring_ms")),
    },
  };
}

/**
 * Whether a trace ended on a timeout: a phase's limit (its error's chain holds the
 * `TimeoutError` the phase raced) or a legacy environment's `timeout_reached` stop.
 */
function timedOut(trace: TaskTrace): boolean {
  return /(^| -> )TimeoutError\(/.test(trace.error?.error_chain_repr ?? "") ||
    trace.stop_condition === "timeout_reached";
}

/** vf's own fields of an episode record that upstream's `Episode` has no place for. */
const VF_HEAD_FIELDS = [
  "format_version",
  "run_id",
  "taskset",
  "example_id",
  "episode_index",
  "timing",
] as const;

/**
 * A vf episode record (or a legacy environment's, which has the same head) as upstream's
 * `Episode` dumps it without its traces: `id`, `env` (`{ id, name }`), `task` (the trace's
 * `TraceTask`: `type`, `data`, `key`, `hash`), `group`, `run`, `ok` and `errors` (each
 * `{ type, message, status_code, traceback }`; vf's phase leads the message). vf's own
 * fields ride in `vf`, which upstream's model ignores.
 *
 * @param record the episode as `traces.jsonl` holds it, without or with its traces
 * @param taskData the task's data, as the trainer sent it
 */
export function upstreamHead(
  record: Record<string, unknown>,
  taskData: Record<string, unknown>,
): Record<string, unknown> {
  const task = (record.task ?? {}) as { key?: string; hash?: string };
  const errors = Array.isArray(record.errors)
    ? record.errors as Array<Record<string, unknown>>
    : [];
  return {
    id: String(record.episode_id ?? crypto.randomUUID()).replaceAll("-", ""),
    env: { id: String(record.env_id ?? ""), name: null },
    task: { type: "Task", data: taskData, key: task.key ?? null, hash: task.hash ?? null },
    group: null,
    run: null,
    ok: record.ok === true,
    errors: errors.map((e) =>
      wireError(
        String(e.error ?? e.type ?? "Error"),
        `${e.phase ? `${e.phase}: ` : ""}${String(e.message ?? "")}`,
      )
    ),
    vf: Object.fromEntries(
      VF_HEAD_FIELDS.filter((k) => record[k] !== undefined).map((k) => [k, record[k]]),
    ),
  };
}

/** Fields of the September 2026 `Trace` that the August one (the `2026-08` wire) has not. */
export const TRACE_FIELDS_SINCE_2026_09 = [
  "mm_token_type_id_map",
  "payload",
  "is_timeout",
  "root_reply",
  "num_input_tokens",
  "num_output_tokens",
  "num_total_tokens",
] as const;

/**
 * A vf episode record as the `2026-08` wire's reply carries it: upstream's August `Episode`
 * (`WireEpisode`), its head ({@link upstreamHead}) with its traces, each upstream's `Trace` as
 * it dumped then (without {@link TRACE_FIELDS_SINCE_2026_09}).
 *
 * @param record the episode as `traces.jsonl` holds it
 * @param taskData the task's data, as the trainer sent it
 */
export function upstreamEpisode2026_08(
  record: Record<string, unknown>,
  taskData: Record<string, unknown>,
): Record<string, unknown> {
  const traces = ((record.traces ?? []) as TaskTrace[]).map((t) => {
    const trace: Record<string, unknown> = upstreamTrace(t, taskData);
    for (const field of TRACE_FIELDS_SINCE_2026_09) delete trace[field];
    // August's MessageNode: no semantic links yet, and `kept_tokens` where `sampling_mask` is.
    trace.nodes = (trace.nodes as Array<Record<string, unknown>>).map((n) => {
      const { semantic_parents: _, sampling_mask: __, ...rest } = n;
      return { ...rest, kept_tokens: null };
    });
    return trace;
  });
  return { ...upstreamHead(record, taskData), traces };
}
