/**
 * The OpenAI Responses dialect of the model gateway (`POST /v1/responses`): `input` items
 * (messages, function calls and their outputs) become vf messages, `instructions` the system
 * message; vf's response goes back as a `response` object or its event stream. The program's
 * own sampling keys are dropped (the run's apply); `max_output_tokens` is kept unless the run
 * sets a limit.
 * @module
 */
import type { Messages, Response, SamplingArgs, Tool, ToolCall } from "../types.ts";
import { type ChatCall, GatewayRefusal } from "./chat.ts";

type Item = Record<string, unknown>;

function itemText(content: unknown): string {
  if (typeof content === "string") return content;
  if (!Array.isArray(content)) return "";
  return (content as Item[]).map((p) =>
    typeof p.text === "string" ? p.text : p.type === "input_image" ? "[image]" : ""
  ).join("");
}

/**
 * Read a native Responses body.
 * @throws {GatewayRefusal} 400 for a body without input or with an unknown item
 */
export function parseResponsesRequest(body: unknown): ChatCall {
  if (!body || typeof body !== "object" || Array.isArray(body)) {
    throw new GatewayRefusal(400, "the request body must be a JSON object");
  }
  const b = body as Record<string, unknown>;
  if (b.previous_response_id) {
    throw new GatewayRefusal(
      400,
      "previous_response_id is not supported: the gateway keeps no conversation; send the whole input",
    );
  }
  const messages: Messages = [];
  if (typeof b.instructions === "string" && b.instructions) {
    messages.push({ role: "system", content: b.instructions });
  }
  const items: Item[] = typeof b.input === "string"
    ? [{ role: "user", content: b.input }]
    : Array.isArray(b.input)
    ? b.input as Item[]
    : [];
  if (items.length === 0) {
    throw new GatewayRefusal(400, "input must be a string or a non-empty list");
  }
  for (const [i, item] of items.entries()) {
    const type = item.type ?? "message";
    if (type === "message") {
      const role = item.role;
      if (role === "system" || role === "developer") {
        messages.push({ role: "system", content: itemText(item.content) });
      } else if (role === "user") {
        messages.push({ role: "user", content: itemText(item.content) });
      } else if (role === "assistant") {
        messages.push({ role: "assistant", content: itemText(item.content) || null });
      } else throw new GatewayRefusal(400, `input[${i}].role "${String(role)}" is not supported`);
    } else if (type === "function_call") {
      const call: ToolCall = {
        id: String(item.call_id ?? item.id ?? ""),
        name: String(item.name ?? ""),
        arguments: typeof item.arguments === "string" ? item.arguments : "{}",
      };
      // Consecutive calls belong to one assistant turn.
      const last = messages.at(-1);
      if (last?.role === "assistant" && (last.tool_calls?.length || !last.content)) {
        last.tool_calls = [...(last.tool_calls ?? []), call];
      } else messages.push({ role: "assistant", content: null, tool_calls: [call] });
    } else if (type === "function_call_output") {
      messages.push({
        role: "tool",
        tool_call_id: String(item.call_id ?? ""),
        content: typeof item.output === "string" ? item.output : itemText(item.output),
      });
    } else if (type === "reasoning") {
      continue; // the model's own summary of its reasoning; not sent back
    } else {
      throw new GatewayRefusal(400, `input[${i}].type "${String(type)}" is not supported`);
    }
  }
  const tools: Tool[] = [];
  for (const t of Array.isArray(b.tools) ? b.tools as Item[] : []) {
    // Provider-side tools (web_search, file_search, ...) are not offered.
    if (t.type !== "function") continue;
    if (typeof t.name !== "string") throw new GatewayRefusal(400, "a function tool has no name");
    tools.push({
      name: t.name,
      description: typeof t.description === "string" ? t.description : "",
      parameters: (t.parameters as Record<string, unknown>) ?? { type: "object" },
    });
  }
  const sampling: SamplingArgs = {};
  if (typeof b.max_output_tokens === "number") sampling.max_tokens = b.max_output_tokens;
  return { messages, tools, sampling, stream: b.stream === true, includeUsage: true };
}

interface Output {
  items: Item[];
}

function outputItems(r: Response): Output {
  const items: Item[] = [];
  if (r.message.content) {
    items.push({
      type: "message",
      id: `msg_${crypto.randomUUID().replace(/-/g, "")}`,
      role: "assistant",
      status: "completed",
      content: [{ type: "output_text", text: r.message.content, annotations: [] }],
    });
  }
  for (const c of r.message.tool_calls ?? []) {
    items.push({
      type: "function_call",
      id: `fc_${crypto.randomUUID().replace(/-/g, "")}`,
      call_id: c.id,
      name: c.name,
      arguments: c.arguments,
      status: "completed",
    });
  }
  return { items };
}

/** vf's response as a native `response` object. */
export function responsesBody(r: Response, model: string): Record<string, unknown> {
  const input = r.usage?.prompt_tokens ?? 0;
  const output = r.usage?.completion_tokens ?? 0;
  return {
    id: `resp_${crypto.randomUUID().replace(/-/g, "")}`,
    object: "response",
    created_at: r.created || Math.floor(Date.now() / 1000),
    model,
    status: r.message.finish_reason === "length" ? "incomplete" : "completed",
    ...(r.message.finish_reason === "length"
      ? { incomplete_details: { reason: "max_output_tokens" } }
      : {}),
    output: outputItems(r).items,
    usage: { input_tokens: input, output_tokens: output, total_tokens: input + output },
  };
}

/** vf's response as a Responses event stream (response.created … response.completed). */
export function responsesStream(r: Response, model: string): string {
  const full = responsesBody(r, model);
  let sequence = 0;
  const event = (type: string, data: Record<string, unknown>) =>
    `event: ${type}\ndata: ${JSON.stringify({ type, sequence_number: sequence++, ...data })}\n\n`;
  let out = event("response.created", {
    response: { ...full, status: "in_progress", output: [] },
  });
  (full.output as Item[]).forEach((item, output_index) => {
    const empty = item.type === "message" ? { ...item, status: "in_progress", content: [] } : item;
    out += event("response.output_item.added", { output_index, item: empty });
    if (item.type === "message") {
      const text = ((item.content as Item[])[0].text as string) ?? "";
      const part = { item_id: item.id, output_index, content_index: 0 };
      out += event("response.content_part.added", {
        ...part,
        part: { type: "output_text", text: "", annotations: [] },
      });
      out += event("response.output_text.delta", { ...part, delta: text });
      out += event("response.output_text.done", { ...part, text });
      out += event("response.content_part.done", {
        ...part,
        part: { type: "output_text", text, annotations: [] },
      });
    } else {
      out += event("response.function_call_arguments.delta", {
        item_id: item.id,
        output_index,
        delta: item.arguments,
      });
      out += event("response.function_call_arguments.done", {
        item_id: item.id,
        output_index,
        arguments: item.arguments,
      });
    }
    out += event("response.output_item.done", { output_index, item });
  });
  return out + event("response.completed", { response: full });
}
