/**
 * The chat-completions dialect of the model gateway: a program's native request becomes
 * vf messages, tools and sampling; vf's response goes back as a native body or as a
 * server-sent event stream.
 * @module
 */
import type { Message, Messages, Response, SamplingArgs, Tool, ToolCall } from "../types.ts";
import type { ResponseDelta } from "../model/client.ts";

/** A program's chat request, read into vf's terms. */
export interface ChatCall {
  messages: Messages;
  tools: Tool[];
  /** The program's own sampling keys (the run's override them). */
  sampling: SamplingArgs;
  stream: boolean;
  includeUsage: boolean;
  /** Choices asked for (`n`); each is its own model call. Default 1. */
  n?: number;
  /** What the gateway cannot give the model: provider-side tools, context edits. */
  notHonoured?: { name: string; type: string }[];
  /** Names of free-form (`custom`) tools: offered as a function taking `{input}`. */
  customTools?: Set<string>;
  /** Whether the program asked for the model's reasoning (Anthropic `thinking`). */
  thinking?: boolean;
}

/** A streamed reply in one dialect: each piece becomes that dialect's events as it comes. */
export interface StreamWriter {
  /** The events of one piece of choice `index`'s reply. */
  delta(delta: ResponseDelta, index?: number): string;
  /** The events that finish the stream: what the pieces did not carry, then the end. */
  finish(responses: Response[]): string;
  /** The error event that ends a stream already under way. */
  error(message: string, status: number): string;
}

/** The schema a free-form (`custom`) tool is offered with: one string, its input. */
export const CUSTOM_TOOL_PARAMETERS = {
  type: "object",
  properties: { input: { type: "string", description: "The tool's free-form input" } },
  required: ["input"],
};

/** A request the gateway refuses, with the HTTP status the program sees. */
export class GatewayRefusal extends Error {
  constructor(readonly status: number, message: string) {
    super(message);
    this.name = "GatewayRefusal";
  }
}

const NOT_SAMPLING = new Set([
  "messages",
  "model",
  "tools",
  "stream",
  "stream_options",
  "functions",
  "user",
  "store",
  "metadata",
  "n",
  "max_tokens",
  "max_completion_tokens",
]);

function text(content: unknown): string {
  if (typeof content === "string") return content;
  if (Array.isArray(content)) {
    return content.map((p) =>
      p && typeof p === "object" && typeof (p as { text?: unknown }).text === "string"
        ? (p as { text: string }).text
        : ""
    ).join("");
  }
  return "";
}

function readMessage(raw: unknown, i: number): Message {
  if (!raw || typeof raw !== "object") {
    throw new GatewayRefusal(400, `messages[${i}] is not an object`);
  }
  const m = raw as Record<string, unknown>;
  switch (m.role) {
    case "system":
    case "developer":
      return { role: "system", content: text(m.content) };
    case "user":
      return {
        role: "user",
        content: typeof m.content === "string" ? m.content : (m.content as never) ?? "",
      };
    case "assistant": {
      const calls: ToolCall[] = [];
      if (Array.isArray(m.tool_calls)) {
        for (const c of m.tool_calls as Record<string, unknown>[]) {
          const fn = (c.function ?? {}) as Record<string, unknown>;
          calls.push({
            id: String(c.id ?? ""),
            name: String(fn.name ?? ""),
            arguments: typeof fn.arguments === "string"
              ? fn.arguments
              : JSON.stringify(fn.arguments ?? {}),
          });
        }
      }
      const content = m.content === null || m.content === undefined ? null : text(m.content);
      return { role: "assistant", content, ...(calls.length ? { tool_calls: calls } : {}) };
    }
    case "tool":
      return { role: "tool", tool_call_id: String(m.tool_call_id ?? ""), content: text(m.content) };
    default:
      throw new GatewayRefusal(400, `messages[${i}].role "${String(m.role)}" is not supported`);
  }
}

/**
 * Read a native chat-completions body.
 * @throws {GatewayRefusal} 400 for a body without messages or with an unknown role
 */
export function parseChatRequest(body: unknown): ChatCall {
  if (!body || typeof body !== "object" || Array.isArray(body)) {
    throw new GatewayRefusal(400, "the request body must be a JSON object");
  }
  const b = body as Record<string, unknown>;
  if (!Array.isArray(b.messages) || b.messages.length === 0) {
    throw new GatewayRefusal(400, "messages must be a non-empty list");
  }
  const tools: Tool[] = [];
  const notHonoured: { name: string; type: string }[] = [];
  const customTools = new Set<string>();
  for (const raw of Array.isArray(b.tools) ? b.tools as Record<string, unknown>[] : []) {
    const type = typeof raw.type === "string" ? raw.type : "function";
    if (type === "custom") {
      const custom = (raw.custom ?? raw) as Record<string, unknown>;
      if (typeof custom.name !== "string") throw new GatewayRefusal(400, "a tool has no name");
      customTools.add(custom.name);
      tools.push({
        name: custom.name,
        description: typeof custom.description === "string" ? custom.description : "",
        parameters: CUSTOM_TOOL_PARAMETERS,
      });
      continue;
    }
    if (type !== "function") {
      notHonoured.push({ name: String(raw.name ?? type), type });
      continue;
    }
    const fn = (raw.function ?? raw) as Record<string, unknown>;
    if (typeof fn.name !== "string") throw new GatewayRefusal(400, "a tool has no name");
    tools.push({
      name: fn.name,
      description: typeof fn.description === "string" ? fn.description : "",
      parameters: (fn.parameters as Record<string, unknown>) ?? { type: "object" },
    });
  }
  const sampling: SamplingArgs = {};
  for (const [k, v] of Object.entries(b)) {
    if (!NOT_SAMPLING.has(k) && v !== null && v !== undefined) sampling[k] = v;
  }
  // One cap whichever name the program used, so the run's max_tokens replaces it.
  const cap = b.max_completion_tokens ?? b.max_tokens;
  if (typeof cap === "number") sampling.max_tokens = cap;
  const n = b.n === undefined || b.n === null ? 1 : Number(b.n);
  if (!Number.isInteger(n) || n < 1 || n > 16) {
    throw new GatewayRefusal(400, `n must be a whole number from 1 to 16, not ${String(b.n)}`);
  }
  const streamOptions = (b.stream_options ?? {}) as Record<string, unknown>;
  return {
    messages: b.messages.map(readMessage),
    tools,
    sampling,
    stream: b.stream === true,
    includeUsage: streamOptions.include_usage === true,
    n,
    notHonoured,
    customTools,
  };
}

function wireToolCalls(calls: ToolCall[] | null | undefined) {
  return (calls ?? []).map((c, index) => ({
    index,
    id: c.id,
    type: "function",
    function: { name: c.name, arguments: c.arguments },
  }));
}

function wireUsage(r: Response) {
  return r.usage
    ? {
      prompt_tokens: r.usage.prompt_tokens,
      completion_tokens: r.usage.completion_tokens,
      total_tokens: r.usage.total_tokens,
    }
    : undefined;
}

/** vf's responses (one per choice) as a native `chat.completion` body. */
export function chatCompletionBody(
  r: Response | Response[],
  model: string,
): Record<string, unknown> {
  const all = Array.isArray(r) ? r : [r];
  const first = all[0];
  return {
    id: first.id || `chatcmpl-vf-${crypto.randomUUID()}`,
    object: "chat.completion",
    created: first.created || Math.floor(Date.now() / 1000),
    model,
    choices: all.map((one, index) => {
      const calls = wireToolCalls(one.message.tool_calls).map(({ index: _i, ...c }) => c);
      return {
        index,
        message: {
          role: "assistant",
          content: one.message.content ?? null,
          ...(one.message.reasoning_content
            ? { reasoning_content: one.message.reasoning_content }
            : {}),
          ...(calls.length ? { tool_calls: calls } : {}),
        },
        logprobs: null,
        finish_reason: one.message.finish_reason ?? (calls.length ? "tool_calls" : "stop"),
      };
    }),
    ...(all.some((one) => one.usage) ? { usage: sumUsage(all) } : {}),
  };
}

function sumUsage(all: Response[]) {
  const usage = { prompt_tokens: 0, completion_tokens: 0, total_tokens: 0 };
  for (const one of all) {
    const u = wireUsage(one);
    if (!u) continue;
    usage.prompt_tokens += u.prompt_tokens;
    usage.completion_tokens += u.completion_tokens;
    usage.total_tokens += u.total_tokens;
  }
  return usage;
}

/** The reply's text (its text parts joined). */
export function replyText(r: Response): string {
  const c = r.message.content;
  return typeof c === "string" ? c : c ? text(c) : "";
}

/** What of `full` is left to send after `sent` went out (all of it when they disagree). */
export function remainder(full: string, sent: string): string {
  return full.startsWith(sent) ? full.slice(sent.length) : sent ? "" : full;
}

/**
 * A `chat.completion.chunk` event stream written as the reply comes: the role, then content,
 * reasoning and tool-call pieces, the finish reason, usage when asked (`include_usage`: every
 * chunk then carries `usage: null`, and a last chunk without choices the totals), `[DONE]`.
 */
export function chatStreamWriter(model: string, includeUsage: boolean): StreamWriter {
  const base = {
    id: `chatcmpl-vf-${crypto.randomUUID()}`,
    object: "chat.completion.chunk",
    created: Math.floor(Date.now() / 1000),
    model,
  };
  interface Sent {
    content: string;
    reasoning: string;
    calls: Map<number, string>;
  }
  const sent = new Map<number, Sent>();
  const chunk = (index: number, delta: Record<string, unknown>, finish: string | null = null) =>
    `data: ${
      JSON.stringify({
        ...base,
        choices: [{ index, delta, logprobs: null, finish_reason: finish }],
        ...(includeUsage ? { usage: null } : {}),
      })
    }\n\n`;
  const state = (index: number): [Sent, string] => {
    let s = sent.get(index);
    if (s) return [s, ""];
    s = { content: "", reasoning: "", calls: new Map() };
    sent.set(index, s);
    return [s, chunk(index, { role: "assistant", content: "" })];
  };
  const writer: StreamWriter = {
    delta(d, index = 0) {
      let [s, out] = state(index);
      if (d.content) {
        s.content += d.content;
        out += chunk(index, { content: d.content });
      }
      if (d.reasoning) {
        s.reasoning += d.reasoning;
        out += chunk(index, { reasoning_content: d.reasoning });
      }
      const c = d.tool_call;
      if (c) {
        const args = s.calls.get(c.index);
        const fn = { ...(c.name ? { name: c.name } : {}), arguments: c.arguments ?? "" };
        out += chunk(index, {
          tool_calls: [
            args === undefined
              ? { index: c.index, id: c.id ?? "", type: "function", function: { name: "", ...fn } }
              : { index: c.index, ...(c.id ? { id: c.id } : {}), function: fn },
          ],
        });
        s.calls.set(c.index, (args ?? "") + (c.arguments ?? ""));
      }
      return out;
    },
    finish(responses) {
      let out = "";
      responses.forEach((r, index) => {
        const [s, head] = state(index);
        out += head;
        const content = remainder(replyText(r), s.content);
        if (content) out += chunk(index, { content });
        const reasoning = remainder(r.message.reasoning_content ?? "", s.reasoning);
        if (reasoning) out += chunk(index, { reasoning_content: reasoning });
        const calls = r.message.tool_calls ?? [];
        calls.forEach((call, i) => {
          const args = s.calls.get(i);
          if (args === undefined) {
            out += chunk(index, {
              tool_calls: [{
                index: i,
                id: call.id,
                type: "function",
                function: { name: call.name, arguments: call.arguments },
              }],
            });
          } else {
            const rest = remainder(call.arguments, args);
            if (rest) {
              out += chunk(index, { tool_calls: [{ index: i, function: { arguments: rest } }] });
            }
          }
        });
        out += chunk(index, {}, r.message.finish_reason ?? (calls.length ? "tool_calls" : "stop"));
      });
      if (includeUsage && responses.some((r) => r.usage)) {
        out += `data: ${JSON.stringify({ ...base, choices: [], usage: sumUsage(responses) })}\n\n`;
      }
      return out + "data: [DONE]\n\n";
    },
    error(message, status) {
      return `data: ${JSON.stringify(errorBody(message, status))}\n\n`;
    },
  };
  return writer;
}

/** vf's response as a whole `chat.completion.chunk` event stream. */
export function chatCompletionStream(r: Response, model: string, includeUsage: boolean): string {
  return chatStreamWriter(model, includeUsage).finish([r]);
}

const OPENAI_ERROR_TYPES: Record<number, string> = {
  401: "authentication_error",
  403: "permission_error",
  404: "not_found_error",
  429: "rate_limit_error",
};

/** An OpenAI-style error body; its type follows the HTTP status. */
export function errorBody(message: string, status = 400): Record<string, unknown> {
  const type = OPENAI_ERROR_TYPES[status] ??
    (status >= 500 ? "server_error" : "invalid_request_error");
  return { error: { message, type, param: null, code: null } };
}
