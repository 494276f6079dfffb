/**
 * Reading a streamed chat completions reply: each `chat.completion.chunk` event's piece is
 * handed on as it comes, and the pieces add up to the `chat.completion` body of the whole.
 * @module
 */
import { InvalidModelResponseError, ModelError } from "../errors.ts";

/** One streamed piece of a reply: text, reasoning, or a tool call's part (by its index). */
export interface ResponseDelta {
  content?: string;
  reasoning?: string;
  tool_call?: { index: number; id?: string; name?: string; arguments?: string };
}

/**
 * Read a `chat.completion.chunk` event stream, handing each piece to `onDelta`, into the
 * `chat.completion` body it adds up to. An error event in the stream is thrown.
 */
export async function readChatStream(
  stream: ReadableStream<Uint8Array>,
  onDelta: (delta: ResponseDelta) => void,
): Promise<Record<string, unknown>> {
  const decoder = new TextDecoder();
  let buffer = "";
  let head: Record<string, unknown> = {};
  let content: string | null = null;
  let reasoning = "";
  let finish: unknown = null;
  let usage: unknown = undefined;
  const calls: { id: string; type: "function"; function: { name: string; arguments: string } }[] =
    [];
  const event = (data: string) => {
    if (data === "[DONE]") return;
    let chunk: Record<string, unknown>;
    try {
      chunk = JSON.parse(data);
    } catch (error) {
      throw new InvalidModelResponseError(
        `Model stream sent malformed JSON: ${JSON.stringify(data.slice(0, 120))}`,
        { cause: error },
      );
    }
    if (chunk.error) {
      const e = chunk.error as { message?: unknown };
      throw new ModelError(`Model stream sent an error: ${String(e.message ?? data)}`);
    }
    if (!head.id && chunk.id) head = { id: chunk.id, created: chunk.created, model: chunk.model };
    if (chunk.usage) usage = chunk.usage;
    const choice = (Array.isArray(chunk.choices) ? chunk.choices[0] : undefined) as
      | Record<string, unknown>
      | undefined;
    if (!choice) return;
    if (choice.finish_reason) finish = choice.finish_reason;
    const delta = (choice.delta ?? {}) as Record<string, unknown>;
    if (typeof delta.content === "string" && delta.content) {
      content = (content ?? "") + delta.content;
      onDelta({ content: delta.content });
    }
    const thought = typeof delta.reasoning_content === "string"
      ? delta.reasoning_content
      : delta.reasoning;
    if (typeof thought === "string" && thought) {
      reasoning += thought;
      onDelta({ reasoning: thought });
    }
    for (const raw of Array.isArray(delta.tool_calls) ? delta.tool_calls : []) {
      const c = raw as Record<string, unknown>;
      const index = Number(c.index ?? calls.length);
      const fn = (c.function ?? {}) as Record<string, unknown>;
      const call = calls[index] ??= {
        id: "",
        type: "function",
        function: { name: "", arguments: "" },
      };
      if (typeof c.id === "string" && c.id) call.id = c.id;
      if (typeof fn.name === "string") call.function.name += fn.name;
      if (typeof fn.arguments === "string") call.function.arguments += fn.arguments;
      onDelta({
        tool_call: {
          index,
          ...(typeof c.id === "string" && c.id ? { id: c.id } : {}),
          ...(typeof fn.name === "string" && fn.name ? { name: fn.name } : {}),
          ...(typeof fn.arguments === "string" ? { arguments: fn.arguments } : {}),
        },
      });
    }
  };
  const reader = stream.getReader();
  for (;;) {
    const { value, done } = await reader.read();
    buffer += decoder.decode(value ?? new Uint8Array(), { stream: !done });
    let end: number;
    while ((end = buffer.search(/\r?\n\r?\n/)) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end).replace(/^\r?\n\r?\n/, "");
      const data = block.split(/\r?\n/).filter((l) => l.startsWith("data:"))
        .map((l) => l.slice(5).replace(/^ /, "")).join("\n");
      if (data) event(data);
    }
    if (done) break;
  }
  if (buffer.trim()) {
    const data = buffer.split(/\r?\n/).filter((l) => l.startsWith("data:"))
      .map((l) => l.slice(5).replace(/^ /, "")).join("\n");
    if (data) event(data);
  }
  return {
    ...head,
    choices: [{
      index: 0,
      message: {
        role: "assistant",
        content,
        ...(reasoning ? { reasoning_content: reasoning } : {}),
        ...(calls.length ? { tool_calls: calls.filter(Boolean) } : {}),
      },
      finish_reason: finish,
    }],
    ...(usage ? { usage } : {}),
  };
}
