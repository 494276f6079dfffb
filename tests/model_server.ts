/**
 * The test model server and conveniences for tests that drive a real OpenAI-compatible
 * endpoint on loopback.
 *
 * @example
 * ```ts
 * await withModelServer(scriptedResponder([toolCallReply("calculator", { expression: "2+2" })]),
 *   async (server) => {
 *     // point the client at server.url, then inspect server.requests
 *   });
 * ```
 * @module
 */

import {
  type CompletionReply,
  type ErrorReply,
  type ModelServer,
  type ModelServerOptions,
  type Responder,
  startModelServer,
} from "../lib/model/local_server.ts";

export {
  type ChatCompletionBody,
  type ChatRequest,
  type CompletionReply,
  DEMO_NO_ANSWER_TEXT,
  demoResponder,
  type DemoResponderOptions,
  type ErrorReply,
  type HangReply,
  lastUserText,
  type ModelServer,
  type ModelServerOptions,
  type RawReply,
  type Reply,
  type Responder,
  type ResponderContext,
  scriptedResponder,
  startModelServer,
  systemText,
  type WireMessage,
  type WireTool,
  type WireToolCall,
} from "../lib/model/local_server.ts";

/**
 * Start a model server, run `fn` with it, and close it even when `fn` throws.
 *
 * @param responder decides every reply
 * @param fn the test body
 * @param options other server options (apiKey, port, hostname)
 * @returns what `fn` returns
 */
export async function withModelServer<T>(
  responder: Responder,
  fn: (server: ModelServer) => T | Promise<T>,
  options: Omit<ModelServerOptions, "responder"> = {},
): Promise<T> {
  const server = await startModelServer({ ...options, responder });
  try {
    return await fn(server);
  } finally {
    await server.close();
  }
}

/** A plain text completion. */
export function textReply(
  content: string,
  extra: Omit<CompletionReply, "content"> = {},
): CompletionReply {
  return { ...extra, content };
}

/** A completion that calls one tool; object arguments are sent as JSON text. */
export function toolCallReply(
  name: string,
  args: string | object,
  options: { id?: string; content?: string | null } = {},
): CompletionReply {
  return {
    content: options.content ?? null,
    tool_calls: [{ id: options.id, name, arguments: args }],
  };
}

/** A scripted agent: one `bash` tool call per turn, running `commands` in order, then "done". */
export function bashModel(...commands: string[]): Responder {
  return ({ body }) => {
    const turn = body.messages.filter((m) => m.role === "assistant").length;
    return turn < commands.length
      ? toolCallReply("bash", { command: commands[turn] })
      : textReply("done");
  };
}

/** A 429 with a `retry-after` header (seconds). */
export function rateLimitReply(retryAfterSeconds = 0): ErrorReply {
  return {
    status: 429,
    headers: { "retry-after": String(retryAfterSeconds) },
    body: "Rate limit reached for requests; please retry after the time given in retry-after",
  };
}

/** The 400 an OpenAI endpoint sends when the prompt is longer than the context. */
export function contextLengthReply(maxTokens = 8192, promptTokens = maxTokens + 1): ErrorReply {
  return {
    status: 400,
    body: {
      error: {
        message: `This model's maximum context length is ${maxTokens} tokens. However, you ` +
          `requested ${promptTokens} tokens. Please reduce the length of the messages.`,
        type: "invalid_request_error",
        param: "messages",
        code: "context_length_exceeded",
      },
    },
  };
}
