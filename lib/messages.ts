/**
 * Message normalisation: plain objects from datasets, users and providers become typed
 * messages; OpenAI-style tool calls are flattened to `{id, name, arguments}`.
 * @module
 */
import type { Content, Message, Messages, Tool, ToolCall } from "./types.ts";

const ROLES = new Set(["system", "user", "assistant", "tool", "text"]);

/** Flatten one tool call from either the OpenAI shape or the flat shape. */
export function normalizeToolCall(raw: unknown): ToolCall {
  if (typeof raw !== "object" || raw === null) {
    throw new TypeError(`Tool call must be an object, got ${JSON.stringify(raw)}`);
  }
  const call = raw as Record<string, unknown>;
  const fn = call.function as Record<string, unknown> | undefined;
  const name = String(fn?.name ?? call.name ?? "");
  const args = fn ? fn.arguments : call.arguments;
  return {
    id: String(call.id ?? name),
    name,
    arguments: typeof args === "string" ? args : JSON.stringify(args ?? {}),
  };
}

/** Turn a string or a list of message-like objects into typed messages. */
export function normalizeMessages(value: unknown): Messages {
  if (typeof value === "string") return [{ role: "text", content: value }];
  if (!Array.isArray(value)) {
    throw new TypeError(`Messages must be a string or a list, got ${typeof value}`);
  }
  return value.map((raw, i) => normalizeMessage(raw, i));
}

function normalizeMessage(raw: unknown, index: number): Message {
  if (typeof raw !== "object" || raw === null) {
    throw new TypeError(`Message ${index} must be an object, got ${JSON.stringify(raw)}`);
  }
  const msg = raw as Record<string, unknown>;
  const role = msg.role;
  if (typeof role !== "string" || !ROLES.has(role)) {
    throw new TypeError(`Message ${index} has unknown role ${JSON.stringify(role)}`);
  }
  if (role === "assistant") {
    const out: Record<string, unknown> = { ...msg };
    const calls = msg.tool_calls;
    if (Array.isArray(calls) && calls.length > 0) out.tool_calls = calls.map(normalizeToolCall);
    else delete out.tool_calls;
    if (out.content === undefined) out.content = null;
    return out as Message;
  }
  if (role === "tool") {
    return {
      ...msg,
      tool_call_id: String(msg.tool_call_id ?? ""),
      content: contentOf(msg),
    } as Message;
  }
  return { ...msg, content: contentOf(msg) } as Message;
}

function contentOf(msg: Record<string, unknown>): Content {
  const c = msg.content;
  if (typeof c === "string" || Array.isArray(c)) return c as Content;
  return c === null || c === undefined ? "" : String(c);
}

/** The plain text of message content: parts' text joined by spaces. */
export function contentText(content: Content | null | undefined): string {
  if (typeof content === "string") return content;
  if (Array.isArray(content)) {
    return content
      .map((p) => (p as { type: string; text?: unknown }))
      .filter((p) => p.type === "text" && typeof p.text === "string")
      .map((p) => p.text as string)
      .join(" ")
      .trim();
  }
  return "";
}

/** Validate and normalise tool definitions; the OpenAI `{type:"function"}` shape is rejected. */
export function normalizeToolDefs(value: unknown, where = "tool_defs"): Tool[] {
  if (value === null || value === undefined) return [];
  if (!Array.isArray(value)) throw new TypeError(`${where} must be a list`);
  return value.map((raw, i) => {
    if (typeof raw !== "object" || raw === null) {
      throw new TypeError(`${where}[${i}] must be an object`);
    }
    const t = raw as Record<string, unknown>;
    if (t.type === "function" && typeof t.function === "object") {
      throw new RangeError(
        `${where}[${i}] uses the OpenAI {type: "function", function: {...}} shape; ` +
          `give {name, description, parameters} instead`,
      );
    }
    if (typeof t.name !== "string" || t.name === "") {
      throw new TypeError(`${where}[${i}].name must be a non-empty string`);
    }
    const parameters = (t.parameters ?? { type: "object", properties: {} }) as Record<
      string,
      unknown
    >;
    const tool: Tool = {
      ...t,
      name: t.name,
      description: typeof t.description === "string" ? t.description : "",
      parameters,
    };
    return tool;
  });
}

/** A deep copy of plain JSON-like data. */
export function clone<T>(value: T): T {
  return structuredClone(value);
}

/**
 * A conversation as plain text for a reader (a judge, a person): one block per message, a
 * `[role]` header then its text; an assistant's tool calls as `[tool_call name(arguments)]`
 * lines (reasoning is left out); a tool result under `[tool name]`. Blocks are separated by a
 * blank line; the text parts of multi-part content are joined by newlines, images dropped.
 */
export function renderTranscript(messages: Messages): string {
  const toolNames = new Map<string, string>();
  const text = (content: unknown): string => {
    if (typeof content === "string") return content;
    if (!Array.isArray(content)) return "";
    return content
      .filter((p) => p?.type === "text" && typeof p.text === "string")
      .map((p) => p.text as string)
      .join("\n");
  };
  const blocks: string[] = [];
  for (const m of messages) {
    const name = m.role === "tool" ? toolNames.get(m.tool_call_id) : undefined;
    const lines = [m.role === "tool" && name ? `[tool ${name}]` : `[${m.role}]`];
    const body = text(m.content);
    if (body) lines.push(body);
    if (m.role === "assistant") {
      for (const call of m.tool_calls ?? []) {
        toolNames.set(call.id, call.name);
        lines.push(`[tool_call ${call.name}(${call.arguments})]`);
      }
    }
    blocks.push(lines.join("\n"));
  }
  return blocks.join("\n\n");
}
