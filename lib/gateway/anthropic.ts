/**
 * The Anthropic Messages dialect of the model gateway (`POST /v1/messages`): a program's
 * native request becomes vf messages, tools and sampling, and vf's response goes back as a
 * native `message` or its event stream. The program's temperature and top_p are dropped
 * (the run's apply); its `max_tokens` is kept unless the run sets one.
 * @module
 */
import type { Message, Messages, Response, SamplingArgs, Tool, ToolCall } from "../types.ts";
import { type ChatCall, GatewayRefusal } from "./chat.ts";

type Block = Record<string, unknown>;

function blocks(content: unknown): Block[] {
  if (typeof content === "string") return [{ type: "text", text: content }];
  return Array.isArray(content) ? content as Block[] : [];
}

function blockText(content: unknown): string {
  return blocks(content).map((b) =>
    b.type === "text" ? String(b.text ?? "") : b.type === "image" ? "[image]" : ""
  ).join("");
}

/**
 * Read a native Messages body.
 * @throws {GatewayRefusal} 400 for a body without messages or with an unknown role
 */
export function parseMessagesRequest(body: unknown): ChatCall {
  if (!body || typeof body !== "object" || Array.isArray(body)) {
    throw new GatewayRefusal(400, "the request body must be a JSON object");
  }
  const b = body as Record<string, unknown>;
  if (!Array.isArray(b.messages) || b.messages.length === 0) {
    throw new GatewayRefusal(400, "messages must be a non-empty list");
  }
  const messages: Messages = [];
  const system = blockText(b.system);
  if (system) messages.push({ role: "system", content: system });
  for (const [i, raw] of (b.messages as Record<string, unknown>[]).entries()) {
    if (raw?.role === "user") {
      const text: string[] = [];
      for (const block of blocks(raw.content)) {
        if (block.type === "tool_result") {
          const content = typeof block.content === "string"
            ? block.content
            : blockText(block.content);
          messages.push({
            role: "tool",
            tool_call_id: String(block.tool_use_id ?? ""),
            content: block.is_error ? `Error: ${content}` : content,
          });
        } else if (block.type === "text") text.push(String(block.text ?? ""));
        else if (block.type === "image") text.push("[image]");
      }
      if (text.length) messages.push({ role: "user", content: text.join("") });
    } else if (raw?.role === "assistant") {
      const calls: ToolCall[] = [];
      const text: string[] = [];
      let reasoning = "";
      for (const block of blocks(raw.content)) {
        if (block.type === "tool_use") {
          calls.push({
            id: String(block.id ?? ""),
            name: String(block.name ?? ""),
            arguments: JSON.stringify(block.input ?? {}),
          });
        } else if (block.type === "text") text.push(String(block.text ?? ""));
        else if (block.type === "thinking") reasoning += String(block.thinking ?? "");
      }
      const message: Message = {
        role: "assistant",
        content: text.length ? text.join("") : null,
        ...(calls.length ? { tool_calls: calls } : {}),
        ...(reasoning ? { reasoning_content: reasoning } : {}),
      };
      messages.push(message);
    } else {
      throw new GatewayRefusal(400, `messages[${i}].role "${String(raw?.role)}" is not supported`);
    }
  }
  const tools: Tool[] = [];
  for (const t of Array.isArray(b.tools) ? b.tools as Record<string, unknown>[] : []) {
    if (typeof t.name !== "string") throw new GatewayRefusal(400, "a tool has no name");
    // Provider-side tools (web search, ...) have no schema here; they are not offered.
    if (!t.input_schema) continue;
    tools.push({
      name: t.name,
      description: typeof t.description === "string" ? t.description : "",
      parameters: t.input_schema as Record<string, unknown>,
    });
  }
  const sampling: SamplingArgs = {};
  if (typeof b.max_tokens === "number") sampling.max_tokens = b.max_tokens;
  if (Array.isArray(b.stop_sequences) && b.stop_sequences.length) sampling.stop = b.stop_sequences;
  return { messages, tools, sampling, stream: b.stream === true, includeUsage: true };
}

function stopReason(r: Response): string {
  if (r.message.tool_calls?.length) return "tool_use";
  return r.message.finish_reason === "length" ? "max_tokens" : "end_turn";
}

function contentBlocks(r: Response): Block[] {
  const out: Block[] = [];
  if (r.message.content) out.push({ type: "text", text: r.message.content });
  for (const c of r.message.tool_calls ?? []) {
    let input: unknown = {};
    try {
      input = JSON.parse(c.arguments || "{}");
    } catch {
      input = { raw: c.arguments };
    }
    out.push({ type: "tool_use", id: c.id, name: c.name, input });
  }
  return out;
}

/** vf's response as a native Messages `message`. */
export function messagesBody(r: Response, model: string): Record<string, unknown> {
  return {
    id: r.id ? `msg_${r.id}` : `msg_vf_${crypto.randomUUID()}`,
    type: "message",
    role: "assistant",
    model,
    content: contentBlocks(r),
    stop_reason: stopReason(r),
    stop_sequence: null,
    usage: {
      input_tokens: r.usage?.prompt_tokens ?? 0,
      output_tokens: r.usage?.completion_tokens ?? 0,
    },
  };
}

/** vf's response as a Messages event stream (message_start … message_stop). */
export function messagesStream(r: Response, model: string): string {
  const full = messagesBody(r, model);
  const event = (type: string, data: Record<string, unknown>) =>
    `event: ${type}\ndata: ${JSON.stringify({ type, ...data })}\n\n`;
  let out = event("message_start", {
    message: {
      ...full,
      content: [],
      stop_reason: null,
      usage: { ...full.usage as Block, output_tokens: 0 },
    },
  });
  (full.content as Block[]).forEach((block, index) => {
    if (block.type === "text") {
      out += event("content_block_start", { index, content_block: { type: "text", text: "" } });
      out += event("content_block_delta", {
        index,
        delta: { type: "text_delta", text: block.text },
      });
    } else {
      out += event("content_block_start", {
        index,
        content_block: { type: "tool_use", id: block.id, name: block.name, input: {} },
      });
      out += event("content_block_delta", {
        index,
        delta: { type: "input_json_delta", partial_json: JSON.stringify(block.input) },
      });
    }
    out += event("content_block_stop", { index });
  });
  out += event("message_delta", {
    delta: { stop_reason: full.stop_reason, stop_sequence: null },
    usage: { output_tokens: (full.usage as Block).output_tokens },
  });
  return out + event("message_stop", {});
}

/** An Anthropic-style error body. */
export function anthropicError(message: string): Record<string, unknown> {
  return { type: "error", error: { type: "invalid_request_error", message } };
}

/** A rough token count for `count_tokens` (about four characters a token; not recorded). */
export function estimateTokens(call: ChatCall): number {
  const text = JSON.stringify(call.messages) + JSON.stringify(call.tools);
  return Math.ceil(text.length / 4);
}
