/**
 * The message graph of a rollout: every distinct message once, each pointing at the message
 * before it. A model call walks its prompt from the root, reusing nodes while they match, adds
 * the rest (not sampled) and then the reply (sampled). A harness that rewrites history
 * (compaction, an edited earlier message) forks a new branch where the prompts differ; a
 * branch is a root-to-leaf path.
 *
 * With token data (vLLM's `return_token_ids`), each node holds the tokens it adds to the
 * sequence the model saw: prompt messages none of their own (a chat completions endpoint does
 * not say which tokens belong to which message), a reply the prompt tokens new since the
 * previous node of its branch (the tool results, the chat template around them, the generation
 * prompt; mask false) followed by its sampled tokens (mask true, one logprob each). Joined
 * along a branch ({@link MessageGraph.tokens}) they are exactly the last call's prompt ids plus
 * its completion ids. When a prompt's tokens do not start with its branch's tokens (a chat
 * template that re-renders earlier turns, e.g. dropping their reasoning), the call starts a new
 * branch from the root, so each branch still joins to exactly what the model saw.
 * @module
 */
import { createHash } from "node:crypto";
import type { Message, Messages, ResponseTokens } from "./types.ts";

/** One message in the graph. */
export interface MessageNode {
  /** The node before it; null at a root. */
  parent: number | null;
  message: Message;
  /** Whether the model produced it (a reply), as opposed to prompt text. */
  sampled: boolean;
  /** Seconds since the epoch. */
  timestamp: number;
  /** The tokens this node adds to its branch's sequence (present only with token data). */
  token_ids?: number[];
  /** Per token of `token_ids`: true for a sampled token (the loss mask). */
  mask?: boolean[];
  /** The sampling logprob of each sampled token (one per true `mask` entry). */
  logprobs?: number[];
}

/** A branch's token sequence: what a trainer needs, without retokenizing. */
export interface BranchTokens {
  token_ids: number[];
  mask: boolean[];
  /** One per sampled token (true `mask` entry), in order. */
  logprobs: number[];
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

  #add(
    parent: number | null,
    message: Message,
    sampled: boolean,
    tokens?: Pick<MessageNode, "token_ids" | "mask" | "logprobs">,
  ): number {
    const i = this.nodes.push({
      parent,
      message: structuredClone(message),
      sampled,
      timestamp: Date.now() / 1000,
      ...tokens,
    }) - 1;
    this.#index.set(`${parent ?? -1}:${messageHash(message)}`, i);
    return i;
  }

  /** How many leading messages of `prompt` already have nodes, and the last of them. */
  #match(prompt: Messages): { at: number | null; matched: number } {
    let at: number | null = null;
    let i = 0;
    for (; i < prompt.length; i++) {
      const next = this.#index.get(`${at ?? -1}:${messageHash(prompt[i])}`);
      if (next === undefined) break;
      at = next;
    }
    return { at, matched: i };
  }

  /** Walk `prompt` from the root over matching nodes, then add the rest; the tail's last node. */
  #walk(prompt: Messages): number | null {
    let { at, matched: i } = this.#match(prompt);
    for (; i < prompt.length; i++) at = this.#add(at, prompt[i], false);
    return at;
  }

  /**
   * Record one model call: its prompt, then its reply; returns the reply's node. With
   * `tokens`, the reply's node holds the prompt tokens new to its branch and the sampled ones
   * (see the module doc).
   */
  commit(prompt: Messages, reply: Message, tokens?: ResponseTokens | null): number {
    // A reply is always a new node; later prompts that repeat it continue from it.
    if (!tokens) return this.#add(this.#walk(prompt), reply, true);
    let { at, matched } = this.#match(prompt);
    let prefix = at === null ? [] : this.tokens(at).token_ids;
    if (!startsWith(tokens.prompt_ids, prefix)) {
      // The exact-prefix invariant broke: this call's sequence starts a branch of its own.
      at = null;
      matched = 0;
      prefix = [];
    }
    for (let i = matched; i < prompt.length; i++) {
      at = this.#add(at, prompt[i], false, { token_ids: [], mask: [], logprobs: [] });
    }
    const added = tokens.prompt_ids.slice(prefix.length);
    return this.#add(at, reply, true, {
      token_ids: [...added, ...tokens.completion_ids],
      mask: [...added.map(() => false), ...tokens.completion_mask.map((m) => m === 1)],
      logprobs: [...tokens.completion_logprobs],
    });
  }

  /** Whether any node holds token data. */
  get hasTokens(): boolean {
    return this.nodes.some((n) => n.token_ids !== undefined);
  }

  /**
   * The token sequence of the branch ending at `leaf` (default: the newest leaf): each node's
   * tokens, masks and logprobs joined from the root.
   */
  tokens(leaf: number | null = this.leaves().at(-1) ?? null): BranchTokens {
    const out: BranchTokens = { token_ids: [], mask: [], logprobs: [] };
    if (leaf === null) return out;
    for (const i of this.path(leaf)) {
      const n = this.nodes[i];
      out.token_ids.push(...(n.token_ids ?? []));
      out.mask.push(...(n.mask ?? []));
      out.logprobs.push(...(n.logprobs ?? []));
    }
    return out;
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

function startsWith(ids: number[], prefix: number[]): boolean {
  if (prefix.length > ids.length) return false;
  for (let i = 0; i < prefix.length; i++) if (ids[i] !== prefix[i]) return false;
  return true;
}
