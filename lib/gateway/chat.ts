/**
 * The chat-completions dialect of the model gateway: a program's native request becomes
 * vf messages, tools and sampling; vf's response goes back as a native body or as a
 * server-sent event stream.
 * @module
 */
import type { Message, Messages, Response, SamplingArgs, Tool, ToolCall } from "../types.ts";

/** A program's chat request, read into vf's terms. */
export interface ChatCall {
  messages: Messages;
  tools: Tool[];
  /** The program's own sampling keys (the run's override them). */
  sampling: SamplingArgs;
  stream: boolean;
  includeUsage: boolean;
}

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
  for (const raw of Array.isArray(b.tools) ? b.tools as Record<string, unknown>[] : []) {
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
  const streamOptions = (b.stream_options ?? {}) as Record<string, unknown>;
  return {
    messages: b.messages.map(readMessage),
    tools,
    sampling,
    stream: b.stream === true,
    includeUsage: streamOptions.include_usage === true,
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

/** vf's response as a native `chat.completion` body. */
export function chatCompletionBody(r: Response, model: string): Record<string, unknown> {
  const calls = wireToolCalls(r.message.tool_calls).map(({ index: _i, ...c }) => c);
  return {
    id: r.id || `chatcmpl-vf-${crypto.randomUUID()}`,
    object: "chat.completion",
    created: r.created || Math.floor(Date.now() / 1000),
    model,
    choices: [{
      index: 0,
      message: {
        role: "assistant",
        content: r.message.content ?? null,
        ...(calls.length ? { tool_calls: calls } : {}),
      },
      finish_reason: r.message.finish_reason ?? (calls.length ? "tool_calls" : "stop"),
    }],
    ...(r.usage ? { usage: wireUsage(r) } : {}),
  };
}

/**
 * vf's response as a `chat.completion.chunk` event stream: the role and content, the tool
 * calls, the finish reason (and usage when asked), then `[DONE]`.
 */
export function chatCompletionStream(r: Response, model: string, includeUsage: boolean): string {
  const base = {
    id: r.id || `chatcmpl-vf-${crypto.randomUUID()}`,
    object: "chat.completion.chunk",
    created: r.created || Math.floor(Date.now() / 1000),
    model,
  };
  const chunk = (delta: Record<string, unknown>, finish: string | null, extra = {}) =>
    `data: ${
      JSON.stringify({ ...base, choices: [{ index: 0, delta, finish_reason: finish }], ...extra })
    }\n\n`;
  const calls = wireToolCalls(r.message.tool_calls);
  let out = chunk({ role: "assistant", content: r.message.content ?? "" }, null);
  if (calls.length) out += chunk({ tool_calls: calls }, null);
  out += chunk({}, r.message.finish_reason ?? (calls.length ? "tool_calls" : "stop"));
  if (includeUsage && r.usage) {
    out += `data: ${JSON.stringify({ ...base, choices: [], usage: wireUsage(r) })}\n\n`;
  }
  return out + "data: [DONE]\n\n";
}

/** An OpenAI-style error body. */
export function errorBody(message: string): Record<string, unknown> {
  return { error: { message, type: "invalid_request_error" } };
}
