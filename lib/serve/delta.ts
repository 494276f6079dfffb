/**
 * The current ZeroMQ wire's per-turn episode stream (verifiers' `serve/delta.py`, September
 * 2026): a live trace grown from the model calls of a run in flight ({@link LiveTrace}), the
 * server's {@link DeltaStreamer} (what of each trace was sent; the rest as one delta per trace,
 * once per event-loop turn) and the client's {@link EpisodeAssembly}. The traces' upstream
 * shape is `upstream.ts`'s.
 *
 * A delta is `{ trace, open?, nodes?, calls?, payload?, errors?, extra_usage?, request_rewrites?,
 * response_rewrites?, links?, set?, pending?, discard? }`: `open` (the trace's `version`,
 * `id`, `verifiers` and `task`) once, list fields as the items past what was sent, `links`
 * (node index → semantic parents landing on a node sent earlier), `set` for scalar fields
 * whose value changed, `pending` the messages of the request in flight, `discard` for a trace
 * dropped (an attempt retried, or a live trace the finished record does not extend). The run
 * ends with a reply `{ success, error, head, traces }`: `head` is the episode without its
 * traces as upstream's `Episode` dumps it (`upstreamHead` in `upstream.ts`), `traces` each trace's
 * `{ id, nodes, calls }` counts the client checks its assembly against. A delta may also carry
 * `routing_repairs` (node index → the corrected last row of the node's `routed_experts`, an
 * array packed as {@link NdArray}), which upstream sends when the next prefill corrects a
 * mixture-of-experts routing row; vf records no routing and never sends one, and
 * {@link EpisodeAssembly} applies it as upstream's client does.
 * @module
 */
import type { Message, Messages, Response } from "../types.ts";
import { VERSION } from "../version.ts";
import {
  emptyTiming,
  messageText,
  node,
  sameMessage,
  span,
  tokenCounts,
  UPSTREAM_TRACE_VERSION,
  type UpstreamTrace,
  usage,
} from "./upstream.ts";

/** Sent once, when a trace first appears. */
export const HEADER_FIELDS = ["version", "id", "verifiers", "task"] as const;
/** Append-only: each delta carries the items past the sent count. */
export const LIST_FIELDS = [
  "nodes",
  "calls",
  "payload",
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
  "is_timeout",
  "timing",
  "num_input_tokens",
  "num_output_tokens",
  "num_total_tokens",
] as const;

/** One delta of the stream. */
export type Delta = Record<string, unknown> & { trace: string };

/** A finished trace's identity and size, for the client's assembly check. */
export interface TraceSummary {
  id: string;
  nodes: number;
  calls: number;
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
      payload: [],
      rewards: {},
      metrics: {},
      info: {},
      root_reply: null,
      extra_usage: [],
      is_completed: false,
      ok: false,
      stop_condition: null,
      is_timeout: false,
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
  readonly traces: Map<string, Record<string, unknown> & { nodes: unknown[]; calls: unknown[] }> =
    new Map();
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
