/**
 * The current ZeroMQ wire's per-turn episode stream (verifiers' `serve/delta.py`, September
 * 2026): vf's trace records as upstream's `Trace` ({@link upstreamTrace}), a live trace
 * grown from the model calls of a run in flight ({@link LiveTrace}), the server's
 * {@link DeltaStreamer} (what of each trace was sent; the rest as one delta per trace, once
 * per event-loop turn) and the client's {@link EpisodeAssembly}.
 *
 * A delta is `{ trace, open?, nodes?, calls?, errors?, extra_usage?, request_rewrites?,
 * response_rewrites?, links?, set?, pending?, discard? }`: `open` (the trace's `version`,
 * `id`, `verifiers` and `task`) once, list fields as the items past what was sent, `links`
 * (node index → semantic parents landing on a node sent earlier), `set` for scalar fields
 * whose value changed, `pending` the messages of the request in flight, `discard` for a trace
 * dropped (an attempt retried, or a live trace the finished record does not extend). The run
 * ends with a reply `{ success, error, head, traces }`: `head` is the episode without its
 * traces as upstream's `Episode` dumps it ({@link upstreamHead}), `traces` each trace's
 * `{ id, nodes, calls }` counts the client checks its assembly against. A delta may also carry
 * `routing_repairs` (node index → the corrected last row of the node's `routed_experts`, an
 * array packed as {@link NdArray}), which upstream sends when the next prefill corrects a
 * mixture-of-experts routing row; vf records no routing and never sends one, and
 * {@link EpisodeAssembly} applies it as upstream's client does.
 * @module
 */
import type { Message, Messages, Response } from "../types.ts";
import type { TaskTrace } from "../tasks/trace.ts";
import { VERSION } from "../version.ts";

/** Sent once, when a trace first appears. */
export const HEADER_FIELDS = ["version", "id", "verifiers", "task"] as const;
/** Append-only: each delta carries the items past the sent count. */
export const LIST_FIELDS = [
  "nodes",
  "calls",
  "errors",
  "extra_usage",
  "request_rewrites",
  "response_rewrites",
] as const;
/** Re-sent whole whenever their value changes. */
export const SCALAR_FIELDS = [
  "agent",
  "tools",
  "mm_token_type_id_map",
  "rewards",
  "metrics",
  "info",
  "root_reply",
  "is_completed",
  "ok",
  "stop_condition",
  "timing",
  "num_input_tokens",
  "num_output_tokens",
  "num_total_tokens",
] as const;

/** upstream's `Trace.version`. */
export const UPSTREAM_TRACE_VERSION = 1;

/** A trace shaped as upstream's dumped `Trace`. */
export type UpstreamTrace = Record<string, unknown> & {
  id: string;
  nodes: Array<Record<string, unknown>>;
  calls: Array<Record<string, unknown>>;
};

/** One delta of the stream. */
export type Delta = Record<string, unknown> & { trace: string };

/** A finished trace's identity and size, for the client's assembly check. */
export interface TraceSummary {
  id: string;
  nodes: number;
  calls: number;
}

const span = (start = 0, end = 0) => ({ start, end });

function emptyTiming(start: number) {
  return {
    start,
    boot: span(),
    setup: span(),
    agent: { ...span(), model: { duration: 0 }, harness: { duration: 0 } },
    finalize: span(),
    scoring: span(),
  };
}

function node(
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
function usage(u: { prompt_tokens?: number; completion_tokens?: number } | null | undefined) {
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

function messageText(m: Message | undefined): string | null {
  if (!m) return null;
  const c = (m as { content?: unknown }).content;
  return typeof c === "string" ? c : c === undefined || c === null ? null : JSON.stringify(c);
}

/** Whether two messages say the same (role and content). */
function sameMessage(a: unknown, b: unknown): boolean {
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

/**
 * The trace of a run in flight, grown from its model calls: each call's prompt messages the
 * trace does not hold yet, then the reply, committed together when the reply lands; the
 * prompt of a call in flight is `pending`.
 */
export class LiveTrace {
  readonly trace: UpstreamTrace;
  pending: Messages = [];
  #path: number[] = [];
  #named = false;

  constructor(id: string, taskData: Record<string, unknown>, model: string) {
    const now = Date.now() / 1000;
    this.trace = {
      version: UPSTREAM_TRACE_VERSION,
      id,
      verifiers: { version: `vf ${VERSION}`, commit: null },
      task: { type: "Task", data: taskData, key: null, hash: null },
      agent: { config: { model }, runtime: null, name: "agent", trainable: true },
      tools: [],
      mm_token_type_id_map: null,
      nodes: [],
      calls: [],
      request_rewrites: [],
      response_rewrites: [],
      rewards: {},
      metrics: {},
      info: {},
      root_reply: null,
      extra_usage: [],
      is_completed: false,
      ok: false,
      stop_condition: null,
      errors: [],
      timing: emptyTiming(now),
      num_input_tokens: 0,
      num_output_tokens: 0,
      num_total_tokens: 0,
    };
  }

  /** The task was built: the header carries its key and hash (it is sent once, later). */
  task(task: { key: string; hash: string }): void {
    const header = this.trace.task as Record<string, unknown>;
    header.key = task.key;
    header.hash = task.hash;
  }

  /**
   * A request went out: its messages the trace does not hold are the preview. The first
   * request names the trace: `session`, the rollout's trace id its model calls carry as
   * `X-Session-ID`, becomes the trace's id before anything of it is sent.
   */
  request(prompt: Messages, session?: string): void {
    if (session && !this.#named) this.trace.id = session;
    this.#named = true;
    this.pending = prompt.slice(this.#shared(prompt));
  }

  /** How many of `prompt`'s first messages are the trace's current path. */
  #shared(prompt: Messages): number {
    const nodes = this.trace.nodes;
    let n = 0;
    while (
      n < this.#path.length && n < prompt.length &&
      sameMessage(nodes[this.#path[n]].message, prompt[n])
    ) n++;
    return n;
  }

  /** A reply landed: the turn (new prompt messages and the reply) and its call commit. */
  commit(prompt: Messages, response: Response, started: number, ended: number): void {
    const shared = this.#shared(prompt);
    this.#path = this.#path.slice(0, shared);
    const nodes = this.trace.nodes;
    for (const m of prompt.slice(shared)) {
      nodes.push(node(this.#path.at(-1) ?? null, m, false, started));
      this.#path.push(nodes.length - 1);
    }
    nodes.push(
      node(
        this.#path.at(-1) ?? null,
        response.message as Message,
        true,
        ended,
        response.tokens
          ? {
            token_ids: response.tokens.completion_ids,
            mask: response.tokens.completion_mask.map(Boolean),
            logprobs: response.tokens.completion_logprobs,
          }
          : undefined,
      ),
    );
    this.#path.push(nodes.length - 1);
    this.trace.calls.push({
      node: nodes.length - 1,
      model: response.model,
      sampling: null,
      endpoint: "/chat/completions",
      finish_reason: (response.message as { finish_reason?: string }).finish_reason ?? null,
      usage: usage(response.usage),
      time: span(started, ended),
      error: null,
      policy: null,
    });
    this.trace.root_reply = messageText(response.message as Message);
    Object.assign(this.trace, tokenCounts(nodes, this.trace.calls));
    this.pending = [];
  }

  /**
   * Adopt the finished record: when its nodes begin with the live ones, it takes the live
   * trace's id and nodes (what the client holds), and the stream goes on as the same trace.
   * @returns whether it could
   */
  adopt(final: UpstreamTrace): boolean {
    const live = this.trace.nodes;
    if (live.length > final.nodes.length) return false;
    for (let i = 0; i < live.length; i++) {
      if (!sameMessage(live[i].message, final.nodes[i].message)) return false;
      if (live[i].parent !== final.nodes[i].parent) return false;
    }
    if (final.calls.length < this.trace.calls.length) return false;
    final.id = this.trace.id;
    final.nodes.splice(0, live.length, ...live);
    final.calls.splice(0, this.trace.calls.length, ...this.trace.calls);
    Object.assign(final, tokenCounts(final.nodes, final.calls));
    return true;
  }
}

const stable = (value: unknown) => JSON.stringify(value);

interface Cursor {
  sent: Record<(typeof LIST_FIELDS)[number], number>;
  links: number[];
  scalars: Map<string, string>;
  pending: string;
}

/**
 * Sends a run's trace changes as deltas. {@link DeltaStreamer.changed} schedules a flush;
 * changes within one event-loop turn ride one flush. Deltas leave in diff order, one send at
 * a time; {@link DeltaStreamer.finish} sends what is left, after which the reply may go.
 */
export class DeltaStreamer {
  readonly #traces: () => Iterable<UpstreamTrace>;
  readonly #pending: (id: string) => Messages;
  readonly #send: (delta: Delta) => Promise<void>;
  #cursors = new Map<string, Cursor>();
  #timer: ReturnType<typeof setTimeout> | undefined;
  #chain: Promise<void> = Promise.resolve();
  /** Deltas sent. */
  sent = 0;

  /**
   * @param traces the run's traces now
   * @param send puts one delta on the wire
   * @param pending a trace's preview (default none)
   */
  constructor(
    traces: () => Iterable<UpstreamTrace>,
    send: (delta: Delta) => Promise<void>,
    pending: (id: string) => Messages = () => [],
  ) {
    this.#traces = traces;
    this.#send = send;
    this.#pending = pending;
  }

  /** Something changed: flush at the end of this event-loop turn. */
  changed(): void {
    if (this.#timer !== undefined) return;
    this.#timer = setTimeout(() => {
      this.#timer = undefined;
      void this.flush();
    }, 0);
  }

  /** Diff and send now (after any flush in progress). */
  flush(): Promise<void> {
    this.#chain = this.#chain.then(async () => {
      for (const delta of this.#diff()) {
        await this.#send(delta);
        this.sent++;
      }
    });
    return this.#chain;
  }

  /** Cancel the scheduled flush and send the final state. */
  finish(): Promise<void> {
    clearTimeout(this.#timer);
    this.#timer = undefined;
    return this.flush();
  }

  /** Stop without sending more (a cancelled run). */
  stop(): Promise<void> {
    clearTimeout(this.#timer);
    this.#timer = undefined;
    return this.#chain;
  }

  #diff(): Delta[] {
    const traces = [...this.#traces()];
    const live = new Set(traces.map((t) => t.id));
    const deltas: Delta[] = [];
    for (const id of [...this.#cursors.keys()]) {
      if (live.has(id)) continue;
      this.#cursors.delete(id);
      deltas.push({ trace: id, discard: true });
    }
    for (const trace of traces) {
      const delta: Delta = { trace: trace.id };
      let cursor = this.#cursors.get(trace.id);
      if (!cursor) {
        cursor = {
          sent: Object.fromEntries(LIST_FIELDS.map((f) => [f, 0])) as Cursor["sent"],
          links: [],
          scalars: new Map(),
          pending: "[]",
        };
        this.#cursors.set(trace.id, cursor);
        delta.open = Object.fromEntries(HEADER_FIELDS.map((f) => [f, trace[f]]));
      }
      const links: Record<number, unknown[]> = {};
      for (let i = 0; i < cursor.sent.nodes; i++) {
        const parents = (trace.nodes[i].semantic_parents as unknown[] | undefined) ?? [];
        if (parents.length > cursor.links[i]) {
          links[i] = parents.slice(cursor.links[i]);
          cursor.links[i] = parents.length;
        }
      }
      if (Object.keys(links).length > 0) delta.links = links;
      for (const field of LIST_FIELDS) {
        const items = (trace[field] as unknown[] | undefined) ?? [];
        const sent = cursor.sent[field];
        if (items.length > sent) {
          delta[field] = items.slice(sent);
          cursor.sent[field] = items.length;
          if (field === "nodes") {
            for (const n of items.slice(sent) as Array<Record<string, unknown>>) {
              cursor.links.push(((n.semantic_parents as unknown[]) ?? []).length);
            }
          }
        }
      }
      const set: Record<string, unknown> = {};
      for (const field of SCALAR_FIELDS) {
        const text = stable(trace[field] ?? null);
        if (cursor.scalars.get(field) !== text) {
          cursor.scalars.set(field, text);
          set[field] = trace[field] ?? null;
        }
      }
      if (Object.keys(set).length > 0) delta.set = set;
      const pending = this.#pending(trace.id);
      const text = stable(pending);
      if (text !== cursor.pending) {
        cursor.pending = text;
        // nodes landing clear the preview on the client by themselves
        if (pending.length > 0 || !("nodes" in delta)) delta.pending = pending;
      }
      if (Object.keys(delta).length > 1) deltas.push(delta);
    }
    return deltas;
  }
}

/** A numpy array as upstream packs it on the wire (`graph._encode_ndarray`): raw bytes. */
export interface NdArray {
  __nd__: true;
  dtype: string;
  shape: number[];
  data: Uint8Array;
}

type IntArray =
  | Uint8Array
  | Uint16Array
  | Uint32Array
  | Int8Array
  | Int16Array
  | Int32Array;
const INT_ARRAYS: Record<
  string,
  { new (buffer: ArrayBuffer): IntArray; BYTES_PER_ELEMENT: number }
> = {
  uint8: Uint8Array,
  uint16: Uint16Array,
  uint32: Uint32Array,
  int8: Int8Array,
  int16: Int16Array,
  int32: Int32Array,
};

function intArray(a: NdArray): IntArray {
  const Type = INT_ARRAYS[a.dtype];
  if (!Type) throw new TypeError(`routed_experts: dtype "${a.dtype}" is not an integer type`);
  return new Type(a.data.slice().buffer);
}

/**
 * `current` with its last row replaced by `row` (one row), as upstream's client rebuilds
 * it: numpy's concatenation, which widens to the larger integer type when a repair needs it.
 */
export function replaceLastRow(current: NdArray, row: NdArray): NdArray {
  const width = current.shape.slice(1).reduce((a, b) => a * b, 1);
  const kept = intArray(current).subarray(0, (current.shape[0] - 1) * width);
  const added = intArray(row);
  const dtype =
    INT_ARRAYS[row.dtype].BYTES_PER_ELEMENT > INT_ARRAYS[current.dtype].BYTES_PER_ELEMENT
      ? row.dtype
      : current.dtype;
  const out = new INT_ARRAYS[dtype](
    new ArrayBuffer(
      (kept.length + added.length) *
        INT_ARRAYS[dtype].BYTES_PER_ELEMENT,
    ),
  );
  out.set(kept);
  out.set(added, kept.length);
  return {
    __nd__: true,
    dtype,
    shape: [current.shape[0] - 1 + row.shape[0], ...current.shape.slice(1)],
    data: new Uint8Array(out.buffer),
  };
}

/**
 * A client's picture of one served episode, as the deltas arrive: trace objects in arrival
 * order, each shaped like upstream's dumped `Trace` plus its `pending` preview.
 */
export class EpisodeAssembly {
  readonly traces = new Map<
    string,
    Record<string, unknown> & { nodes: unknown[]; calls: unknown[] }
  >();
  /** Deltas applied. */
  updates = 0;

  /**
   * Apply one delta.
   * @throws {TypeError} for a delta of a trace never opened
   */
  apply(delta: Record<string, unknown>): void {
    const id = String(delta.trace);
    this.updates++;
    if (delta.discard) {
      this.traces.delete(id);
      return;
    }
    let trace = this.traces.get(id);
    if (!trace) {
      if (!delta.open || typeof delta.open !== "object") {
        throw new TypeError(`A delta of trace "${id}" arrived before the trace was opened`);
      }
      trace = {
        ...(delta.open as Record<string, unknown>),
        ...Object.fromEntries(LIST_FIELDS.map((f) => [f, []])),
        pending: [],
      } as unknown as Record<string, unknown> & { nodes: unknown[]; calls: unknown[] };
      this.traces.set(id, trace);
    }
    for (const [index, links] of Object.entries((delta.links ?? {}) as Record<string, unknown[]>)) {
      const n = trace.nodes[Number(index)] as { semantic_parents: unknown[] };
      n.semantic_parents.push(...links);
    }
    const repairs = (delta.routing_repairs ?? {}) as Record<string, NdArray>;
    for (const [index, row] of Object.entries(repairs)) {
      const n = trace.nodes[Number(index)] as { routed_experts: NdArray };
      n.routed_experts = replaceLastRow(n.routed_experts, row);
    }
    for (const field of LIST_FIELDS) {
      if (Array.isArray(delta[field])) {
        const items = field === "nodes"
          ? (delta[field] as Array<Record<string, unknown>>).map((n) => ({
            ...n,
            semantic_parents: [...((n.semantic_parents as unknown[]) ?? [])],
          }))
          : delta[field] as unknown[];
        (trace[field] as unknown[]).push(...items);
      }
    }
    Object.assign(trace, (delta.set ?? {}) as Record<string, unknown>);
    if ("nodes" in delta) trace.pending = [];
    if ("pending" in delta) trace.pending = delta.pending;
  }

  /**
   * The whole episode record: `head` joined with the assembled traces in the server's order.
   * @throws {Error} when a trace is missing or its counts differ from the server's
   */
  finish(head: Record<string, unknown>, summaries: TraceSummary[]): Record<string, unknown> {
    const traces = summaries.map((s) => {
      const t = this.traces.get(s.id);
      if (!t) throw new Error(`The served episode is missing trace "${s.id}"`);
      const { pending: _, ...trace } = t;
      if (trace.nodes.length !== s.nodes || trace.calls.length !== s.calls) {
        throw new Error(
          `Served trace "${s.id}" assembled ${trace.nodes.length} nodes / ${trace.calls.length} ` +
            `calls, the server reports ${s.nodes} / ${s.calls}`,
        );
      }
      return trace;
    });
    return { ...head, traces };
  }
}
