/**
 * The Anthropic Messages dialect of the model gateway (`POST /v1/messages`): a program's
 * native request becomes vf messages, tools and sampling, and vf's response goes back as a
 * native `message` or its event stream. The program's temperature and top_p are dropped
 * (the run's apply); its `max_tokens` is kept unless the run sets one. A `system` message
 * mid-conversation stays where it is; `thinking` and `output_config.effort` become a reasoning
 * effort the model client sends as `reasoning_effort` only to an endpoint set to take it
 * (`[client] reasoning = true`; else it is recorded as not honoured, since OpenAI's
 * non-reasoning models refuse the field), and the reasoning comes back as thinking blocks;
 * `output_config.format` its `response_format`; `context_management` edits are not made and
 * are recorded as such.
 * @module
 */
import type { Message, Messages, Response, SamplingArgs, Tool, ToolCall } from "../types.ts";
import { type ChatCall, GatewayRefusal, remainder, replyText, type StreamWriter } from "./chat.ts";
import { PROGRAM_REASONING_EFFORT } from "../model/wire.ts";

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
    if (raw?.role === "system") {
      messages.push({ role: "system", content: blockText(raw.content) });
    } else if (raw?.role === "user") {
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
  const notHonoured: { name: string; type: string }[] = [];
  for (const t of Array.isArray(b.tools) ? b.tools as Record<string, unknown>[] : []) {
    if (typeof t.name !== "string") throw new GatewayRefusal(400, "a tool has no name");
    // Provider-side tools (web search, code execution, ...) have no schema to offer.
    if (!t.input_schema) {
      notHonoured.push({ name: t.name, type: String(t.type ?? "server_tool") });
      continue;
    }
    tools.push({
      name: t.name,
      description: typeof t.description === "string" ? t.description : "",
      parameters: t.input_schema as Record<string, unknown>,
    });
  }
  const sampling: SamplingArgs = {};
  if (typeof b.max_tokens === "number") sampling.max_tokens = b.max_tokens;
  if (Array.isArray(b.stop_sequences) && b.stop_sequences.length) sampling.stop = b.stop_sequences;
  const thinking = (b.thinking ?? {}) as Record<string, unknown>;
  const thinks = thinking.type === "enabled" || thinking.type === "adaptive";
  // The program's wish, not the run's: sent only where the endpoint takes reasoning_effort.
  if (thinks) {
    const budget = Number(thinking.budget_tokens ?? 0);
    sampling[PROGRAM_REASONING_EFFORT] = !budget
      ? "medium"
      : budget <= 4096
      ? "low"
      : budget <= 16384
      ? "medium"
      : "high";
  }
  const output = (b.output_config ?? {}) as Record<string, unknown>;
  if (typeof output.effort === "string") {
    sampling[PROGRAM_REASONING_EFFORT] = output.effort === "max" ? "high" : output.effort;
  }
  const format = output.format as Record<string, unknown> | undefined;
  if (format?.type === "json_schema" && format.schema) {
    sampling.response_format = {
      type: "json_schema",
      json_schema: { name: "output", schema: format.schema },
    };
  }
  const edits = (b.context_management as { edits?: unknown } | undefined)?.edits;
  for (const edit of Array.isArray(edits) ? edits as Record<string, unknown>[] : []) {
    notHonoured.push({ name: String(edit.type ?? "edit"), type: "context_management" });
  }
  return {
    messages,
    tools,
    sampling,
    stream: b.stream === true,
    includeUsage: true,
    notHonoured,
    thinking: thinks,
  };
}

function stopReason(r: Response): string {
  if (r.message.tool_calls?.length) return "tool_use";
  return r.message.finish_reason === "length" ? "max_tokens" : "end_turn";
}

/** The signature of a thinking block the gateway writes (the model's own is not kept). */
const SIGNATURE = "vf-gateway";

function toolInput(args: string): unknown {
  try {
    return JSON.parse(args || "{}");
  } catch {
    return { raw: args };
  }
}

function contentBlocks(r: Response): Block[] {
  const out: Block[] = [];
  if (r.message.reasoning_content) {
    out.push({ type: "thinking", thinking: r.message.reasoning_content, signature: SIGNATURE });
  }
  const text = replyText(r);
  if (text) out.push({ type: "text", text });
  for (const c of r.message.tool_calls ?? []) {
    out.push({ type: "tool_use", id: c.id, name: c.name, input: toolInput(c.arguments) });
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

const ANTHROPIC_ERROR_TYPES: Record<number, string> = {
  401: "authentication_error",
  403: "permission_error",
  404: "not_found_error",
  413: "request_too_large",
  429: "rate_limit_error",
  503: "overloaded_error",
};

/** An Anthropic-style error body; its type follows the HTTP status. */
export function anthropicError(message: string, status = 400): Record<string, unknown> {
  const type = ANTHROPIC_ERROR_TYPES[status] ??
    (status >= 500 ? "api_error" : "invalid_request_error");
  return { type: "error", error: { type, message } };
}

/**
 * A Messages event stream written as the reply comes: `message_start`, a block per kind of
 * piece (thinking, text, each tool call) opened when its first piece arrives and closed when
 * another kind begins, then `message_delta` with the stop reason and usage, `message_stop`.
 */
export function messagesStreamWriter(model: string): StreamWriter {
  const event = (type: string, data: Record<string, unknown>) =>
    `event: ${type}\ndata: ${JSON.stringify({ type, ...data })}\n\n`;
  let started = false;
  let next = 0;
  let open: { kind: "thinking" | "text" | "tool_use"; index: number; tool?: number } | null = null;
  let text = "";
  let thought = "";
  const tools = new Map<number, { args: string; closed: boolean; block: number }>();
  const start = () => {
    if (started) return "";
    started = true;
    return event("message_start", {
      message: {
        id: `msg_vf_${crypto.randomUUID()}`,
        type: "message",
        role: "assistant",
        model,
        content: [],
        stop_reason: null,
        stop_sequence: null,
        usage: { input_tokens: 0, output_tokens: 0 },
      },
    });
  };
  const close = () => {
    if (!open) return "";
    let out = "";
    if (open.kind === "thinking") {
      out += event("content_block_delta", {
        index: open.index,
        delta: { type: "signature_delta", signature: SIGNATURE },
      });
    }
    if (open.kind === "tool_use") tools.get(open.tool!)!.closed = true;
    out += event("content_block_stop", { index: open.index });
    open = null;
    return out;
  };
  const openBlock = (kind: "thinking" | "text", block: Block) => {
    if (open?.kind === kind) return "";
    const out = close();
    open = { kind, index: next++ };
    return out + event("content_block_start", { index: open.index, content_block: block });
  };
  const textDelta = (piece: string) =>
    openBlock("text", { type: "text", text: "" }) +
    event("content_block_delta", {
      index: open!.index,
      delta: { type: "text_delta", text: piece },
    });
  const thinkingDelta = (piece: string) =>
    openBlock("thinking", { type: "thinking", thinking: "", signature: "" }) +
    event("content_block_delta", {
      index: open!.index,
      delta: { type: "thinking_delta", thinking: piece },
    });
  const toolDelta = (i: number, id: string, name: string, args: string) => {
    let out = "";
    let tool = tools.get(i);
    if (!tool) {
      out += close();
      tool = { args: "", closed: false, block: next++ };
      tools.set(i, tool);
      open = { kind: "tool_use", index: tool.block, tool: i };
      out += event("content_block_start", {
        index: tool.block,
        content_block: { type: "tool_use", id, name, input: {} },
      });
    } else if (tool.closed) return ""; // a piece for a block already closed: sent at the end
    if (args) {
      tool.args += args;
      out += event("content_block_delta", {
        index: tool.block,
        delta: { type: "input_json_delta", partial_json: args },
      });
    }
    return out;
  };
  return {
    delta(d) {
      let out = start();
      if (d.reasoning) {
        thought += d.reasoning;
        out += thinkingDelta(d.reasoning);
      }
      if (d.content) {
        text += d.content;
        out += textDelta(d.content);
      }
      const c = d.tool_call;
      if (c) out += toolDelta(c.index, c.id ?? "", c.name ?? "", c.arguments ?? "");
      return out;
    },
    finish([r]) {
      let out = start();
      const thinking = remainder(r.message.reasoning_content ?? "", thought);
      if (thinking) out += thinkingDelta(thinking);
      const rest = remainder(replyText(r), text);
      if (rest) out += textDelta(rest);
      (r.message.tool_calls ?? []).forEach((call, i) => {
        const tool = tools.get(i);
        if (!tool) {
          // Never streamed: the whole input at once, as JSON the client can parse.
          out += toolDelta(i, call.id, call.name, JSON.stringify(toolInput(call.arguments)));
        } else if (!tool.closed) {
          const more = remainder(call.arguments, tool.args);
          if (more) out += toolDelta(i, call.id, call.name, more);
        }
      });
      out += close();
      out += event("message_delta", {
        delta: { stop_reason: stopReason(r), stop_sequence: null },
        usage: {
          input_tokens: r.usage?.prompt_tokens ?? 0,
          output_tokens: r.usage?.completion_tokens ?? 0,
        },
      });
      return out + event("message_stop", {});
    },
    error(message, status) {
      return event("error", { error: anthropicError(message, status).error });
    },
  };
}

/** vf's response as a whole Messages event stream (message_start … message_stop). */
export function messagesStream(r: Response, model: string): string {
  return messagesStreamWriter(model).finish([r]);
}

/** A rough token count for `count_tokens` (about four characters a token; not recorded). */
export function estimateTokens(call: ChatCall): number {
  const text = JSON.stringify(call.messages) + JSON.stringify(call.tools);
  return Math.ceil(text.length / 4);
}
