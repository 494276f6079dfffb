/**
 * How the scripted model server answers: a scripted reply rendered as a `chat.completion`
 * body (with the toy tokenizer's token data when asked for), as its `chat.completion.chunk`
 * stream, or as an OpenAI-style error.
 * @module
 */
import {
  type ChatRequest,
  type CompletionReply,
  contentText,
  errorBody,
  type ErrorReply,
  type WireMessage,
  type WireToolCall,
} from "./server_wire.ts";
import { messageTokens, toyLogprob, toyPromptTokens } from "./toy_tokenizer.ts";

function defaultErrorType(status: number): string {
  if (status === 401) return "authentication_error";
  if (status === 403) return "permission_error";
  if (status === 404) return "not_found_error";
  if (status === 429) return "rate_limit_error";
  if (status >= 500) return "server_error";
  return "invalid_request_error";
}

/** A JSON response. */
export function json(
  status: number,
  body: unknown,
  headers: Record<string, string> = {},
): Response {
  return new Response(JSON.stringify(body), {
    status,
    headers: { "content-type": "application/json", ...headers },
  });
}

/** The response of a scripted HTTP error. */
export function errorResponse(reply: ErrorReply): Response {
  let body = reply.body;
  if (body === undefined) {
    body = errorBody(`Scripted error with status ${reply.status}`, defaultErrorType(reply.status));
  } else if (typeof body === "string") {
    body = errorBody(body, defaultErrorType(reply.status));
  }
  return json(reply.status, body, reply.headers);
}

function messageChars(message: WireMessage): number {
  let chars = contentText(message.content).length;
  for (const call of message.tool_calls ?? []) {
    chars += (call.function?.name ?? "").length + (call.function?.arguments ?? "").length;
  }
  return chars;
}

/** Wait `ms`, or less if `signal` aborts first; says whether the wait was cut short. */
export function sleep(ms: number, signal: AbortSignal): Promise<boolean> {
  if (signal.aborted) return Promise.resolve(true);
  return new Promise((resolve) => {
    const onAbort = () => {
      clearTimeout(timer);
      resolve(true);
    };
    const timer = setTimeout(() => {
      signal.removeEventListener("abort", onAbort);
      resolve(false);
    }, ms);
    signal.addEventListener("abort", onAbort, { once: true });
  });
}

/** A completion body sent as `chat.completion.chunk` events, the text a word a chunk. */
export function streamResponse(
  whole: Record<string, unknown>,
  request: ChatRequest,
  delayMs: number,
  closing: AbortSignal,
): Response {
  const choice = (whole.choices as Record<string, unknown>[])[0];
  const message = choice.message as Record<string, unknown>;
  const base = {
    id: whole.id,
    object: "chat.completion.chunk",
    created: whole.created,
    model: whole.model,
  };
  const chunk = (delta: Record<string, unknown>, finish: unknown = null) => ({
    ...base,
    choices: [{ index: 0, delta, logprobs: null, finish_reason: finish }],
  });
  const pieces: Record<string, unknown>[] = [chunk({ role: "assistant", content: "" })];
  if (typeof message.reasoning_content === "string") {
    pieces.push(chunk({ reasoning_content: message.reasoning_content }));
  }
  for (
    const word
      of (typeof message.content === "string" ? message.content : "").match(/\S+\s*|\s+/g) ?? []
  ) {
    pieces.push(chunk({ content: word }));
  }
  ((message.tool_calls ?? []) as WireToolCall[]).forEach((call, index) => {
    const args = call.function.arguments;
    const half = Math.ceil(args.length / 2);
    pieces.push(chunk({
      tool_calls: [{
        index,
        id: call.id,
        type: "function",
        function: { name: call.function.name, arguments: args.slice(0, half) },
      }],
    }));
    if (args.length > half) {
      pieces.push(chunk({ tool_calls: [{ index, function: { arguments: args.slice(half) } }] }));
    }
  });
  pieces.push(chunk({}, choice.finish_reason));
  const usage = (request.body.stream_options as { include_usage?: unknown } | undefined)
    ?.include_usage;
  if (usage === true) pieces.push({ ...base, choices: [], usage: whole.usage });
  const encoder = new TextEncoder();
  const body = new ReadableStream<Uint8Array>({
    async start(controller) {
      for (const [i, piece] of pieces.entries()) {
        if (i > 0 && delayMs > 0 && await sleep(delayMs, closing)) break;
        controller.enqueue(encoder.encode(`data: ${JSON.stringify(piece)}\n\n`));
      }
      controller.enqueue(encoder.encode("data: [DONE]\n\n"));
      request.finishedAt = Date.now();
      controller.close();
    },
  });
  return new Response(body, {
    status: 200,
    headers: { "content-type": "text/event-stream", "cache-control": "no-cache" },
  });
}

/** A scripted completion as a `chat.completion` body, with token data when the request asks for it. */
export function completionResponse(
  reply: CompletionReply,
  request: ChatRequest,
  index: number,
  defaultModel: string,
  tokenIds: boolean,
): Response {
  const toolCalls: WireToolCall[] = (reply.tool_calls ?? []).map((call, i) => ({
    id: call.id ?? `call_${index}_${i}`,
    type: "function",
    function: {
      name: call.name,
      arguments: typeof call.arguments === "string"
        ? call.arguments
        : JSON.stringify(call.arguments),
    },
  }));
  const content = reply.content !== undefined ? reply.content : toolCalls.length > 0 ? null : "";
  const message: Record<string, unknown> = { role: "assistant", content, refusal: null };
  if (reply.reasoning_content !== undefined) message.reasoning_content = reply.reasoning_content;
  if (toolCalls.length > 0) message.tool_calls = toolCalls;
  const usage = reply.usage ?? {
    prompt_tokens: Math.ceil(
      request.body.messages.reduce((sum, m) => sum + messageChars(m), 0) / 4,
    ),
    completion_tokens: Math.ceil(
      ((content ?? "").length + (reply.reasoning_content ?? "").length +
        toolCalls.reduce((s, c) => s + c.function.name.length + c.function.arguments.length, 0)) /
        4,
    ),
  };
  const choice: Record<string, unknown> = {
    index: 0,
    message,
    logprobs: null,
    finish_reason: reply.finish_reason ?? (toolCalls.length > 0 ? "tool_calls" : "stop"),
  };
  const out: Record<string, unknown> = {
    id: `chatcmpl-vf-${index}`,
    object: "chat.completion",
    created: Math.floor(Date.now() / 1000),
    model: typeof request.body.model === "string" ? request.body.model : defaultModel,
    choices: [choice],
    usage: {
      prompt_tokens: usage.prompt_tokens,
      completion_tokens: usage.completion_tokens,
      total_tokens: usage.prompt_tokens + usage.completion_tokens,
    },
  };
  const wantIds = tokenIds && request.body.return_token_ids === true;
  if (wantIds || request.body.logprobs === true) {
    const completion = messageTokens({ role: "assistant", content, tool_calls: toolCalls })
      .slice(1);
    if (request.body.logprobs === true) {
      choice.logprobs = {
        content: completion.map((id, i) => ({
          token: id < 256 ? String.fromCharCode(id) : `<|${id}|>`,
          logprob: toyLogprob(id, i),
          bytes: id < 256 ? [id] : [],
          top_logprobs: [],
        })),
      };
    }
    if (wantIds) {
      const prompt = toyPromptTokens(request.body);
      out.prompt_token_ids = prompt;
      choice.token_ids = completion;
      if (!reply.usage) {
        out.usage = {
          prompt_tokens: prompt.length,
          completion_tokens: completion.length,
          total_tokens: prompt.length + completion.length,
        };
      }
    }
  }
  return json(200, out);
}
