/**
 * The OpenAI Responses dialect of the model gateway (`POST /v1/responses`): `input` items
 * (messages, function calls and their outputs) become vf messages, `instructions` the system
 * message; vf's response goes back as a `response` object or its event stream. The program's
 * own sampling keys are dropped (the run's apply); `max_output_tokens` is kept unless the run
 * sets a limit. Free-form (`custom`) tools are offered as functions taking `{input}`, and
 * calls of them go back as `custom_tool_call` items; provider-side tools are not offered and
 * are recorded as such.
 * @module
 */
import type { Messages, Response, SamplingArgs, Tool, ToolCall } from "../types.ts";
import {
  type ChatCall,
  CUSTOM_TOOL_PARAMETERS,
  GatewayRefusal,
  remainder,
  replyText,
  type StreamWriter,
} from "./chat.ts";

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
    } else if (type === "function_call" || type === "custom_tool_call") {
      const call: ToolCall = {
        id: String(item.call_id ?? item.id ?? ""),
        name: String(item.name ?? ""),
        arguments: type === "custom_tool_call"
          ? JSON.stringify({ input: String(item.input ?? "") })
          : typeof item.arguments === "string"
          ? item.arguments
          : "{}",
      };
      // Consecutive calls belong to one assistant turn.
      const last = messages.at(-1);
      if (last?.role === "assistant" && (last.tool_calls?.length || !last.content)) {
        last.tool_calls = [...(last.tool_calls ?? []), call];
      } else messages.push({ role: "assistant", content: null, tool_calls: [call] });
    } else if (type === "function_call_output" || type === "custom_tool_call_output") {
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
  const notHonoured: { name: string; type: string }[] = [];
  const customTools = new Set<string>();
  for (const t of Array.isArray(b.tools) ? b.tools as Item[] : []) {
    if (t.type === "custom" && typeof t.name === "string") {
      customTools.add(t.name);
      tools.push({
        name: t.name,
        description: typeof t.description === "string" ? t.description : "",
        parameters: CUSTOM_TOOL_PARAMETERS,
      });
      continue;
    }
    // Provider-side tools (web_search, file_search, namespaces, ...) are not offered.
    if (t.type !== "function") {
      notHonoured.push({ name: String(t.name ?? t.type), type: String(t.type) });
      continue;
    }
    if (typeof t.name !== "string") throw new GatewayRefusal(400, "a function tool has no name");
    tools.push({
      name: t.name,
      description: typeof t.description === "string" ? t.description : "",
      parameters: (t.parameters as Record<string, unknown>) ?? { type: "object" },
    });
  }
  const sampling: SamplingArgs = {};
  if (typeof b.max_output_tokens === "number") sampling.max_tokens = b.max_output_tokens;
  return {
    messages,
    tools,
    sampling,
    stream: b.stream === true,
    includeUsage: true,
    notHonoured,
    customTools,
  };
}

function itemId(prefix: string): string {
  return `${prefix}_${crypto.randomUUID().replace(/-/g, "")}`;
}

function messageItem(id: string, text: string): Item {
  return {
    type: "message",
    id,
    role: "assistant",
    status: "completed",
    content: [{ type: "output_text", text, annotations: [] }],
  };
}

function customInput(args: string): string {
  try {
    const parsed = JSON.parse(args || "{}");
    if (typeof parsed?.input === "string") return parsed.input;
  } catch { /* not JSON: the text as it is */ }
  return args;
}

function callItem(id: string, call: ToolCall, custom: boolean): Item {
  return custom
    ? {
      type: "custom_tool_call",
      id,
      call_id: call.id,
      name: call.name,
      input: customInput(call.arguments),
      status: "completed",
    }
    : {
      type: "function_call",
      id,
      call_id: call.id,
      name: call.name,
      arguments: call.arguments,
      status: "completed",
    };
}

function responseObject(r: Response, model: string, output: Item[], id: string) {
  const input = r.usage?.prompt_tokens ?? 0;
  const out = r.usage?.completion_tokens ?? 0;
  return {
    id,
    object: "response",
    created_at: r.created || Math.floor(Date.now() / 1000),
    model,
    status: r.message.finish_reason === "length" ? "incomplete" : "completed",
    ...(r.message.finish_reason === "length"
      ? { incomplete_details: { reason: "max_output_tokens" } }
      : {}),
    output,
    usage: { input_tokens: input, output_tokens: out, total_tokens: input + out },
  };
}

/** vf's response as a native `response` object. */
export function responsesBody(
  r: Response,
  model: string,
  customTools: Set<string> = new Set(),
): Record<string, unknown> {
  const items: Item[] = [];
  const text = replyText(r);
  if (text) items.push(messageItem(itemId("msg"), text));
  for (const c of r.message.tool_calls ?? []) {
    items.push(
      callItem(itemId(customTools.has(c.name) ? "ctc" : "fc"), c, customTools.has(c.name)),
    );
  }
  return responseObject(r, model, items, itemId("resp"));
}

/**
 * A Responses event stream written as the reply comes: `response.created`, an output item
 * per message or function call opened at its first piece, the done events and
 * `response.completed` at the end. A custom tool's input is sent whole at the end (the
 * endpoint streams it JSON-encoded).
 */
export function responsesStreamWriter(
  model: string,
  customTools: Set<string> = new Set(),
): StreamWriter {
  let sequence = 0;
  const id = itemId("resp");
  const event = (type: string, data: Record<string, unknown>) =>
    `event: ${type}\ndata: ${JSON.stringify({ type, sequence_number: sequence++, ...data })}\n\n`;
  let started = false;
  let outputs = 0;
  let message: { id: string; index: number; text: string } | null = null;
  const calls = new Map<number, { id: string; index: number; args: string; custom: boolean }>();
  const start = () => {
    if (started) return "";
    started = true;
    const response = {
      id,
      object: "response",
      created_at: Math.floor(Date.now() / 1000),
      model,
      status: "in_progress",
      output: [],
      usage: null,
    };
    return event("response.created", { response }) + event("response.in_progress", { response });
  };
  const text = (piece: string) => {
    let out = "";
    if (!message) {
      message = { id: itemId("msg"), index: outputs++, text: "" };
      out += event("response.output_item.added", {
        output_index: message.index,
        item: {
          type: "message",
          id: message.id,
          role: "assistant",
          status: "in_progress",
          content: [],
        },
      });
      out += event("response.content_part.added", {
        item_id: message.id,
        output_index: message.index,
        content_index: 0,
        part: { type: "output_text", text: "", annotations: [] },
      });
    }
    message.text += piece;
    return out + event("response.output_text.delta", {
      item_id: message.id,
      output_index: message.index,
      content_index: 0,
      delta: piece,
    });
  };
  const tool = (i: number, callId: string, name: string, args: string) => {
    let out = "";
    let c = calls.get(i);
    if (!c) {
      const custom = customTools.has(name);
      c = { id: itemId(custom ? "ctc" : "fc"), index: outputs++, args: "", custom };
      calls.set(i, c);
      out += event("response.output_item.added", {
        output_index: c.index,
        item: custom
          ? {
            type: "custom_tool_call",
            id: c.id,
            call_id: callId,
            name,
            input: "",
            status: "in_progress",
          }
          : {
            type: "function_call",
            id: c.id,
            call_id: callId,
            name,
            arguments: "",
            status: "in_progress",
          },
      });
    }
    c.args += args;
    if (args && !c.custom) {
      out += event("response.function_call_arguments.delta", {
        item_id: c.id,
        output_index: c.index,
        delta: args,
      });
    }
    return out;
  };
  return {
    delta(d) {
      let out = start();
      if (d.content) out += text(d.content);
      const c = d.tool_call;
      if (c) out += tool(c.index, c.id ?? "", c.name ?? "", c.arguments ?? "");
      return out;
    },
    finish([r]) {
      let out = start();
      const rest = remainder(replyText(r), message?.text ?? "");
      if (rest) out += text(rest);
      const toolCalls = r.message.tool_calls ?? [];
      toolCalls.forEach((call, i) => {
        const sent = calls.get(i)?.args;
        out += tool(
          i,
          call.id,
          call.name,
          sent === undefined ? call.arguments : remainder(call.arguments, sent),
        );
      });
      const items: [number, Item][] = [];
      if (message) {
        const m = message as { id: string; index: number; text: string };
        const part = { item_id: m.id, output_index: m.index, content_index: 0 };
        out += event("response.output_text.done", { ...part, text: m.text });
        out += event("response.content_part.done", {
          ...part,
          part: { type: "output_text", text: m.text, annotations: [] },
        });
        const item = messageItem(m.id, m.text);
        out += event("response.output_item.done", { output_index: m.index, item });
        items.push([m.index, item]);
      }
      toolCalls.forEach((call, i) => {
        const c = calls.get(i)!;
        const item = callItem(c.id, call, c.custom);
        if (c.custom) {
          out += event("response.custom_tool_call_input.delta", {
            item_id: c.id,
            output_index: c.index,
            delta: item.input,
          });
          out += event("response.custom_tool_call_input.done", {
            item_id: c.id,
            output_index: c.index,
            input: item.input,
          });
        } else {
          out += event("response.function_call_arguments.done", {
            item_id: c.id,
            output_index: c.index,
            arguments: call.arguments,
          });
        }
        out += event("response.output_item.done", { output_index: c.index, item });
        items.push([c.index, item]);
      });
      const output = items.sort((a, b) => a[0] - b[0]).map(([, item]) => item);
      return out + event("response.completed", { response: responseObject(r, model, output, id) });
    },
    error(message, status) {
      return event("error", {
        code: status >= 500 ? "server_error" : "invalid_request",
        message,
        param: null,
      });
    },
  };
}

/** vf's response as a whole Responses event stream (response.created … response.completed). */
export function responsesStream(r: Response, model: string): string {
  return responsesStreamWriter(model).finish([r]);
}
