/**
 * The message graph of a rollout: every distinct message once, each pointing at the message
 * before it. A model call walks its prompt from the root, reusing nodes while they match, adds
 * the rest (not sampled) and then the reply (sampled). A harness that rewrites history
 * (compaction, an edited earlier message) forks a new branch where the prompts differ; a
 * branch is a root-to-leaf path.
 * @module
 */
import { createHash } from "node:crypto";
import type { Message, Messages } from "../types.ts";

/** One message in the graph. */
export interface MessageNode {
  /** The node before it; null at a root. */
  parent: number | null;
  message: Message;
  /** Whether the model produced it (a reply), as opposed to prompt text. */
  sampled: boolean;
  /** Seconds since the epoch. */
  timestamp: number;
}

function canonicalJson(value: unknown): string {
  if (Array.isArray(value)) return `[${value.map(canonicalJson).join(",")}]`;
  if (value && typeof value === "object") {
    return `{${
      Object.keys(value).sort().map((k) =>
        `${JSON.stringify(k)}:${canonicalJson((value as Record<string, unknown>)[k])}`
      ).join(",")
    }}`;
  }
  return JSON.stringify(value ?? null);
}

function canonicalArguments(args: string): string {
  try {
    return canonicalJson(JSON.parse(args));
  } catch {
    return args;
  }
}

const hashes = new WeakMap<object, string>();

/**
 * A message's identity: its role, content (null and "" alike), reasoning, tool calls (id,
 * name and arguments as canonical JSON, so key order and spacing do not matter) and the tool
 * call it answers.
 */
export function messageHash(message: Message): string {
  const cached = hashes.get(message);
  if (cached) return cached;
  const m = message as Message & {
    reasoning_content?: string | null;
    tool_calls?: Array<{ id: string; name: string; arguments: string }> | null;
    tool_call_id?: string;
  };
  const fields = [
    m.role,
    typeof m.content === "string" || m.content == null ? m.content ?? "" : canonicalJson(m.content),
    m.reasoning_content ?? "",
    (m.tool_calls ?? []).map((c) => [c.id, c.name, canonicalArguments(c.arguments)]),
    m.tool_call_id ?? "",
  ];
  const hash = createHash("sha256").update(JSON.stringify(fields)).digest("hex").slice(0, 32);
  hashes.set(message, hash);
  return hash;
}

/** The message graph (see the module doc). */
export class MessageGraph {
  readonly nodes: MessageNode[];
  readonly #index = new Map<string, number>();

  constructor(nodes: MessageNode[] = []) {
    this.nodes = nodes;
    nodes.forEach((n, i) => this.#index.set(`${n.parent ?? -1}:${messageHash(n.message)}`, i));
  }

  /**
   * A graph of one linear conversation: `sampled` holds the indices of the messages the model
   * produced.
   */
  static linear(messages: Messages, sampled: Set<number>, timestamp = 0): MessageGraph {
    return new MessageGraph(messages.map((message, i) => ({
      parent: i === 0 ? null : i - 1,
      message,
      sampled: sampled.has(i),
      timestamp,
    })));
  }

  #add(parent: number | null, message: Message, sampled: boolean): number {
    const i = this.nodes.push({
      parent,
      message: structuredClone(message),
      sampled,
      timestamp: Date.now() / 1000,
    }) - 1;
    this.#index.set(`${parent ?? -1}:${messageHash(message)}`, i);
    return i;
  }

  /** Walk `prompt` from the root over matching nodes, then add the rest; the tail's last node. */
  #walk(prompt: Messages): number | null {
    let at: number | null = null;
    let i = 0;
    for (; i < prompt.length; i++) {
      const next = this.#index.get(`${at ?? -1}:${messageHash(prompt[i])}`);
      if (next === undefined) break;
      at = next;
    }
    for (; i < prompt.length; i++) at = this.#add(at, prompt[i], false);
    return at;
  }

  /** Record one model call: its prompt, then its reply; returns the reply's node. */
  commit(prompt: Messages, reply: Message): number {
    // A reply is always a new node; later prompts that repeat it continue from it.
    return this.#add(this.#walk(prompt), reply, true);
  }

  /** Record a prompt that was stopped before inference; returns its last node. */
  commitPrompt(prompt: Messages): number | null {
    return this.#walk(prompt);
  }

  /** Nodes nothing follows, in index order. */
  leaves(): number[] {
    const parents = new Set(this.nodes.map((n) => n.parent));
    return this.nodes.map((_, i) => i).filter((i) => !parents.has(i));
  }

  /** The node indices from the root to `leaf`. */
  path(leaf: number): number[] {
    const out: number[] = [];
    for (let i: number | null = leaf; i !== null; i = this.nodes[i].parent) out.push(i);
    return out.reverse();
  }

  /** Every branch's messages, one per leaf (the last one is the newest). */
  branches(): Messages[] {
    return this.leaves().map((leaf) => this.path(leaf).map((i) => this.nodes[i].message));
  }
}
