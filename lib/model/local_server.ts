/**
 * A real, deterministic, scriptable OpenAI-compatible HTTP server on loopback.
 *
 * End-to-end tests point the model client at it and script every reply (text, tool calls,
 * rate limits, malformed JSON, hangs); `vf demo` serves {@link demoResponder} from it so a
 * bundled environment can be evaluated with no API key and no internet. It speaks the
 * `chat.completion` wire format, and streams it (`stream: true`) as `chat.completion.chunk`
 * events: the text word by word, a reply's `chunk_delay_ms` apart. Like vLLM (0.10.2 and newer) it answers
 * `return_token_ids: true` with `prompt_token_ids` and `choices[0].token_ids`, and
 * `logprobs: true` with `choices[0].logprobs.content`, from a toy byte-level tokenizer whose
 * chat template keeps every earlier turn's tokens as an exact prefix of the next prompt.
 *
 * Run directly it serves the demo model:
 * `deno run -A lib/model/local_server.ts --port 8000 [--hostname 127.0.0.1] [--accuracy 0.75]
 * [--seed 0] [--api-key KEY]`.
 *
 * @example
 * ```ts
 * await using server = await startModelServer({ responder: () => ({ content: "hi" }) });
 * const res = await fetch(`${server.url}/chat/completions`, {
 *   method: "POST",
 *   headers: { "content-type": "application/json" },
 *   body: JSON.stringify({ model: "m", messages: [{ role: "user", content: "hello" }] }),
 * });
 * (await res.json()).choices[0].message.content; // "hi"
 * ```
 * @module
 */

// Full specifiers let mod.ts be imported from a URL (DESIGN.md, "Remote import").
// deno-lint-ignore no-import-prefix
import { Hono } from "npm:hono@^4.13.0";
import process from "node:process";
import { serveHttp } from "./http_server.ts";

/** A content part of a message as sent on the wire. */
export interface WireContentPart {
  type: string;
  text?: string;
  [key: string]: unknown;
}

/** A tool call inside an assistant message as sent on the wire. */
export interface WireToolCall {
  id: string;
  type: "function";
  function: { name: string; arguments: string };
}

/** A chat message as sent on the wire (OpenAI chat completions format). */
export interface WireMessage {
  role: string;
  content?: string | WireContentPart[] | null;
  tool_calls?: WireToolCall[] | null;
  tool_call_id?: string;
  [key: string]: unknown;
}

/** A tool definition as sent on the wire. */
export interface WireTool {
  type?: string;
  function?: { name: string; description?: string; parameters?: unknown; [key: string]: unknown };
  [key: string]: unknown;
}

/** The JSON body of a `POST /v1/chat/completions` request. */
export interface ChatCompletionBody {
  model: string;
  messages: WireMessage[];
  tools?: WireTool[];
  stream?: boolean;
  [key: string]: unknown;
}

/** One chat completions request as received by the server. */
export interface ChatRequest {
  /** The parsed JSON body. */
  body: ChatCompletionBody;
  /** The request headers, with lower-case names. */
  headers: Record<string, string>;
  /** When a streamed reply's last byte was handed to the connection (ms since the epoch). */
  finishedAt?: number;
}

/** A normal completion. */
export interface CompletionReply {
  /** The assistant text; defaults to `null` when there are tool calls, else `""`. */
  content?: string | null;
  /** Tool calls; an object `arguments` is sent as JSON text, a string as is (even if invalid). */
  tool_calls?: Array<{ id?: string; name: string; arguments: string | object }>;
  reasoning_content?: string;
  /** Defaults to `"tool_calls"` when tool calls are present, else `"stop"`. */
  finish_reason?: string;
  /** Defaults to ceil(characters / 4) of the prompt's and of the reply's text. */
  usage?: { prompt_tokens: number; completion_tokens: number };
  /** Wait this long before answering. */
  delay_ms?: number;
  /** When the request streams: wait this long before each chunk after the first. */
  chunk_delay_ms?: number;
}

/** An HTTP error. A string `body` is wrapped as `{ error: { message, type, code } }`. */
export interface ErrorReply {
  status: number;
  /** The response body; defaults to an OpenAI-style error naming the status. */
  body?: unknown;
  delay_ms?: number;
  headers?: Record<string, string>;
}

/** This exact body, sent with content-type `application/json` (for malformed JSON tests). */
export interface RawReply {
  raw: string;
  /** Defaults to 200. */
  status?: number;
  delay_ms?: number;
}

/** Never answer, until the client aborts or the server closes. */
export interface HangReply {
  hang: true;
}

/** What a responder returns for one request. */
export type Reply = CompletionReply | ErrorReply | RawReply | HangReply;

/** What a responder learns besides the request. */
export interface ResponderContext {
  /** The 0-based count of requests handed to the responder before this one (its position in
   * {@link ModelServer.requests}). */
  index: number;
}

/** Decides the reply to one chat completions request. */
export type Responder = (
  request: ChatRequest,
  ctx: ResponderContext,
) => Reply | Promise<Reply>;

/** Options of {@link startModelServer}. */
export interface ModelServerOptions {
  /** Decides every reply. */
  responder: Responder;
  /** Port to listen on; default 0 (a free port). */
  port?: number;
  /** Interface to listen on; default `"127.0.0.1"`. */
  hostname?: string;
  /** When set, requests without `Authorization: Bearer <apiKey>` get a 401. */
  apiKey?: string;
  /** The model listed by `GET /v1/models` and used when a request names none; default `"vf-demo"`. */
  model?: string;
  /** Keep every request in {@link ModelServer.requests}; default true. A long-running server
   * (the demo CLI) turns it off so memory stays flat. */
  record?: boolean;
  /** Closes the server when aborted. */
  signal?: AbortSignal;
  /**
   * Answer `return_token_ids: true` with token ids, as vLLM does; default true. False acts
   * like an endpoint that ignores the flag (no token ids, logprobs still honoured).
   */
  tokenIds?: boolean;
}

/** A running model server. Close it (or `await using` it) when done. */
export interface ModelServer extends AsyncDisposable {
  /** The base URL, ending in `/v1`, e.g. `http://127.0.0.1:41234/v1`. */
  readonly url: string;
  readonly port: number;
  /** Every chat completions request handed to the responder, in arrival order (unless
   * `record: false`). */
  readonly requests: ChatRequest[];
  /** Chat completions requests being handled now (a hang released by a client abort leaves). */
  readonly inFlight: number;
  /** Releases hanging requests (they get a 503), then stops listening. Idempotent. */
  close(): Promise<void>;
}

const DEFAULT_MODEL = "vf-demo";

function errorBody(message: string, type: string, code: string | null = null) {
  return { error: { message, type, param: null, code } };
}

function defaultErrorType(status: number): string {
  if (status === 401) return "authentication_error";
  if (status === 403) return "permission_error";
  if (status === 404) return "not_found_error";
  if (status === 429) return "rate_limit_error";
  if (status >= 500) return "server_error";
  return "invalid_request_error";
}

function json(status: number, body: unknown, headers: Record<string, string> = {}): Response {
  return new Response(JSON.stringify(body), {
    status,
    headers: { "content-type": "application/json", ...headers },
  });
}

function errorResponse(reply: ErrorReply): Response {
  let body = reply.body;
  if (body === undefined) {
    body = errorBody(`Scripted error with status ${reply.status}`, defaultErrorType(reply.status));
  } else if (typeof body === "string") {
    body = errorBody(body, defaultErrorType(reply.status));
  }
  return json(reply.status, body, reply.headers);
}

/** The text of a message's content: the string, or its text parts joined by newlines. */
function contentText(content: WireMessage["content"] | undefined): string {
  if (typeof content === "string") return content;
  if (!Array.isArray(content)) return "";
  return content
    .filter((part) => typeof part?.text === "string")
    .map((part) => part.text)
    .join("\n");
}

function messageChars(message: WireMessage): number {
  let chars = contentText(message.content).length;
  for (const call of message.tool_calls ?? []) {
    chars += (call.function?.name ?? "").length + (call.function?.arguments ?? "").length;
  }
  return chars;
}

/** Wait `ms`, or less if `signal` aborts first; says whether the wait was cut short. */
function sleep(ms: number, signal: AbortSignal): Promise<boolean> {
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
function streamResponse(
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

/** Special tokens of the toy tokenizer; every other token is one UTF-8 byte (0–255). */
export const TOY_TOKENS = {
  system: 256,
  user: 257,
  assistant: 258,
  tool: 259,
  end: 260,
  tools: 261,
} as const;

const encoder = new TextEncoder();

/** What the toy chat template renders of a message: its text, then each tool call. */
function templateBody(message: WireMessage): string {
  let text = contentText(message.content);
  for (const call of message.tool_calls ?? []) {
    text += `<tool_call>${call.function?.name ?? ""} ${call.function?.arguments ?? ""}</tool_call>`;
  }
  return text;
}

/** The toy tokenizer's ids of a message as it stands in a prompt (role, body, end). */
function messageTokens(message: WireMessage): number[] {
  const role = TOY_TOKENS[message.role as "system" | "user" | "assistant" | "tool"] ??
    TOY_TOKENS.user;
  return [role, ...encoder.encode(templateBody(message)), TOY_TOKENS.end];
}

/**
 * The prompt's token ids under the toy chat template: the tool names (when tools are given),
 * each message, then the generation prompt (the assistant role token). The completion of a
 * reply is its body and the end token, so prompt + completion is a prefix of the next prompt.
 */
export function toyPromptTokens(body: ChatCompletionBody): number[] {
  const out: number[] = [];
  const tools = (body.tools ?? []).map((t) => t.function?.name ?? "");
  if (tools.length > 0) out.push(TOY_TOKENS.tools, ...encoder.encode(tools.join(",")));
  for (const m of body.messages) out.push(...messageTokens(m));
  out.push(TOY_TOKENS.assistant);
  return out;
}

/** A deterministic logprob for the token `id` at completion position `i`, in (-1, 0). */
export function toyLogprob(id: number, i: number): number {
  return -(((id * 31 + i * 7) % 97) + 1) / 100;
}

function completionResponse(
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

/**
 * Start an OpenAI-compatible chat completions server whose replies come from `responder`.
 *
 * Routes: `GET /v1/models` (the default model plus every model seen) and
 * `POST /v1/chat/completions` (non-streaming; `stream: true` gets a 400). Requests that are
 * rejected before the responder runs (bad key, invalid JSON, streaming) are not recorded.
 *
 * @param options.responder decides every reply
 * @param options.port default 0, a free port
 * @param options.hostname default `"127.0.0.1"`
 * @param options.apiKey when set, other keys get a 401 with an OpenAI-style error body
 * @returns the running server; close it when done
 * @throws when the port cannot be bound
 * @example
 * ```ts
 * await using server = await startModelServer({
 *   responder: scriptedResponder([{ status: 429, headers: { "retry-after": "0" } }, { content: "ok" }]),
 * });
 * ```
 */
export async function startModelServer(options: ModelServerOptions): Promise<ModelServer> {
  const { responder, apiKey } = options;
  const defaultModel = options.model ?? DEFAULT_MODEL;
  const requests: ChatRequest[] = [];
  const models = new Set<string>([defaultModel]);
  const closing = new AbortController();
  let inFlight = 0;
  let counter = 0;
  const record = options.record ?? true;

  const closedResponse = () => json(503, errorBody("The model server is closing", "server_error"));

  async function answer(request: ChatRequest, index: number, raw: Request): Promise<Response> {
    let reply: Reply;
    try {
      reply = await responder(request, { index });
    } catch (error) {
      const message = error instanceof Error ? error.message : String(error);
      return json(500, errorBody(`Responder failed: ${message}`, "server_error"));
    }
    if ("hang" in reply && reply.hang) {
      // Only a hang reads request.signal: Deno warns (once) when it is read at all, and a
      // delay needs no client-abort detection since it ends by itself or at close().
      const signal = AbortSignal.any([raw.signal, closing.signal]);
      await new Promise<void>((resolve) => {
        if (signal.aborted) return resolve();
        signal.addEventListener("abort", () => resolve(), { once: true });
      });
      return closedResponse();
    }
    const delay = "delay_ms" in reply ? reply.delay_ms ?? 0 : 0;
    if (delay > 0 && await sleep(delay, closing.signal)) return closedResponse();
    if ("raw" in reply) {
      return new Response(reply.raw, {
        status: reply.status ?? 200,
        headers: { "content-type": "application/json" },
      });
    }
    if ("status" in reply && typeof reply.status === "number") return errorResponse(reply);
    if (request.body.stream === true) {
      const whole = await completionResponse(
        reply as CompletionReply,
        { ...request, body: { ...request.body, return_token_ids: false, logprobs: false } },
        index,
        defaultModel,
        false,
      ).json();
      return streamResponse(
        whole,
        request,
        (reply as CompletionReply).chunk_delay_ms ?? 0,
        closing.signal,
      );
    }
    return completionResponse(
      reply as CompletionReply,
      request,
      index,
      defaultModel,
      options.tokenIds ?? true,
    );
  }

  const app = new Hono();
  if (apiKey !== undefined) {
    app.use("*", async (c, next) => {
      const auth = c.req.header("authorization") ?? "";
      if (auth === `Bearer ${apiKey}`) return await next();
      const given = auth.replace(/^Bearer\s+/i, "");
      const shown = given.length > 8 ? `${given.slice(0, 3)}...${given.slice(-4)}` : given;
      return json(
        401,
        errorBody(
          given === ""
            ? "You didn't provide an API key. Provide it in the Authorization header as a Bearer token"
            : `Incorrect API key provided: "${shown}"`,
          "invalid_request_error",
          "invalid_api_key",
        ),
      );
    });
  }
  app.get("/v1/models", () =>
    json(200, {
      object: "list",
      data: [...models].map((id) => ({ id, object: "model", created: 0, owned_by: "vf" })),
    }));
  app.post("/v1/chat/completions", async (c) => {
    let body: ChatCompletionBody;
    try {
      body = JSON.parse(await c.req.text());
    } catch (error) {
      return json(
        400,
        errorBody(
          `Request body is not valid JSON: ${(error as Error).message}`,
          "invalid_request_error",
        ),
      );
    }
    if (typeof body !== "object" || body === null || !Array.isArray(body.messages)) {
      return json(
        400,
        errorBody(
          'Request body must be an object with a "messages" array',
          "invalid_request_error",
        ),
      );
    }
    if (typeof body.model === "string") models.add(body.model);
    const request: ChatRequest = { body, headers: Object.fromEntries(c.req.raw.headers) };
    const index = record ? requests.push(request) - 1 : counter;
    counter++;
    inFlight++;
    try {
      return await answer(request, index, c.req.raw);
    } finally {
      inFlight--;
    }
  });
  app.notFound((c) =>
    json(404, errorBody(`No route for ${c.req.method} ${c.req.path}`, "invalid_request_error"))
  );
  app.onError((error) => json(500, errorBody(String(error), "server_error")));

  const listener = await serveHttp(app.fetch, { port: options.port, hostname: options.hostname });
  const host = options.hostname ?? "127.0.0.1";
  const urlHost = host.includes(":") ? `[${host}]` : host;
  let closed: Promise<void> | undefined;
  const close = () => {
    closed ??= (async () => {
      closing.abort();
      await listener.close();
    })();
    return closed;
  };
  options.signal?.addEventListener("abort", () => void close(), { once: true });
  return {
    url: `http://${urlHost}:${listener.port}/v1`,
    port: listener.port,
    requests,
    get inFlight() {
      return inFlight;
    },
    close,
    [Symbol.asyncDispose]: close,
  };
}

/** The text of the last user message, or `""`. */
export function lastUserText(request: ChatRequest): string {
  const messages = request.body.messages;
  for (let i = messages.length - 1; i >= 0; i--) {
    if (messages[i].role === "user") return contentText(messages[i].content);
  }
  return "";
}

/** The text of every system message joined by blank lines, or `""`. */
export function systemText(request: ChatRequest): string {
  return request.body.messages
    .filter((m) => m.role === "system" || m.role === "developer")
    .map((m) => contentText(m.content))
    .join("\n\n");
}

/**
 * A responder that gives `replies` in order, one per call. When they run out it errors with
 * a 500 "script exhausted", or repeats the last reply (`repeatLast`), or starts over (`loop`).
 *
 * @param replies the script
 * @param options.loop start again from the first reply; default false
 * @param options.repeatLast keep giving the last reply; default false
 */
export function scriptedResponder(
  replies: Reply[],
  options: { loop?: boolean; repeatLast?: boolean } = {},
): Responder {
  let next = 0;
  return () => {
    const i = next++;
    if (i < replies.length) return replies[i];
    if (replies.length > 0 && options.loop) return replies[i % replies.length];
    if (replies.length > 0 && options.repeatLast) return replies[replies.length - 1];
    return {
      status: 500,
      body: errorBody(
        `Script exhausted: request ${i + 1} but only ${replies.length} replies were scripted`,
        "server_error",
        "script_exhausted",
      ),
    };
  };
}

/** A uniform number in [0, 1) from a string (FNV-1a, then murmur3's finaliser). */
function unitHash(text: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < text.length; i++) {
    h ^= text.charCodeAt(i);
    h = Math.imul(h, 0x01000193);
  }
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  h ^= h >>> 16;
  return (h >>> 0) / 0x100000000;
}

/** The longest arithmetic expression in `text` (digits joined by operators), if any. */
function findExpression(text: string): string | undefined {
  let best: string | undefined;
  for (const run of text.match(/[\d+\-*/^%().\s×÷]+/g) ?? []) {
    const candidate = run.trim().replace(/[.\s]+$/, "");
    if (!/\d\s*[-+*/^%×÷]\s*\(*\s*\d/.test(candidate)) continue;
    if (best === undefined || candidate.length > best.length) best = candidate;
  }
  return best;
}

function wrongAnswer(answer: string): string {
  const n = Number(answer.replaceAll(",", "").trim());
  if (answer.trim() !== "" && Number.isFinite(n)) return String(n + 1);
  return `not ${answer}`;
}

/** Drop one character, at a position chosen by `h`, so the text is close but not equal. */
function perturb(text: string, h: number): string {
  const chars = Array.from(text);
  if (chars.length === 0) return "x";
  chars.splice(Math.floor(h * chars.length), 1);
  return chars.join("");
}

/** Options of {@link demoResponder}. */
export interface DemoResponderOptions {
  /** The probability of answering correctly; default 0.75. */
  accuracy?: number;
  /** Changes which questions are answered correctly; default 0. */
  seed?: number;
  /** The answer key: question (the last user message's text) → answer. */
  answers?: Map<string, string> | ((question: string) => string | undefined);
}

/** The reply of {@link demoResponder} when it has no answer key for a question. */
export const DEMO_NO_ANSWER_TEXT =
  "I am vf's scripted demo model, not a language model, and I have no answer key for this question.";

/**
 * A deterministic stand-in model for `vf demo`. It is scripted, not a language model:
 *
 * - tools include `calculator` and no tool has answered yet: it calls `calculator` with the
 *   arithmetic expression found in the question; after a tool message it answers
 *   `\boxed{<tool result>}`;
 * - the system prompt mentions reversing: it answers `<reversed_text>\n…\n</reversed_text>`,
 *   reversed correctly with probability `accuracy`, else with one character dropped;
 * - the question is in `answers`: a short step-by-step text ending in `\boxed{ANSWER}`, correct
 *   with probability `accuracy`, else wrong (answer + 1 when numeric);
 * - otherwise a fixed text, {@link DEMO_NO_ANSWER_TEXT}.
 *
 * Whether an answer is correct depends only on a hash of the question, `seed` and how many
 * times this responder has seen the question before, so repeated rollouts of one question
 * vary (pass@k differs from pass@1) while a whole run is reproducible: for each question the
 * sequence of right and wrong replies is fixed, whatever order the requests arrive in.
 */
export function demoResponder(options: DemoResponderOptions = {}): Responder {
  const accuracy = options.accuracy ?? 0.75;
  const seed = options.seed ?? 0;
  const answers = options.answers;
  const lookup = (question: string): string | undefined => {
    if (answers === undefined) return undefined;
    if (typeof answers === "function") return answers(question);
    const exact = answers.get(question) ?? answers.get(question.trim());
    if (exact !== undefined) return exact;
    // The environment may have wrapped the question in instructions: take the longest key inside.
    let found: [string, string] | undefined;
    for (const [key, value] of answers) {
      if (key !== "" && question.includes(key) && (!found || key.length > found[0].length)) {
        found = [key, value];
      }
    }
    return found?.[1];
  };

  const seen = new Map<string, number>();
  return (request) => {
    const question = lastUserText(request).trim();
    const occurrence = seen.get(question) ?? 0;
    seen.set(question, occurrence + 1);
    const h = unitHash(`${seed}\u0000${question}\u0000${occurrence}`);
    const correct = h < accuracy;
    const messages = request.body.messages;

    const hasCalculator = (request.body.tools ?? []).some((tool) =>
      (tool.function?.name ?? tool.name) === "calculator"
    );
    if (hasCalculator) {
      const toolMessages = messages.filter((m) => m.role === "tool");
      if (toolMessages.length === 0) {
        return {
          content: null,
          tool_calls: [{
            name: "calculator",
            arguments: { expression: findExpression(question) ?? question },
          }],
        };
      }
      const result = contentText(toolMessages[toolMessages.length - 1].content).trim();
      return { content: `The calculator says ${result}.\n\n\\boxed{${result}}` };
    }

    if (/revers/i.test(systemText(request))) {
      const reversed = Array.from(question).reverse().join("");
      const text = correct ? reversed : perturb(reversed, unitHash(`${h}`));
      return { content: `<reversed_text>\n${text}\n</reversed_text>` };
    }

    const answer = lookup(question);
    if (answer === undefined) return { content: DEMO_NO_ANSWER_TEXT };
    const given = correct ? answer : wrongAnswer(answer);
    const brief = question.length > 80 ? `${question.slice(0, 77)}...` : question;
    return {
      content: `I am vf's scripted demo model; I look answers up rather than reason.\n` +
        `Step 1: read the question: "${brief}"\n` +
        `Step 2: work out the result: ${given}.\n\n` +
        `\\boxed{${given}}`,
    };
  };
}

function parseCli(args: string[]): Record<string, string> {
  const out: Record<string, string> = {};
  for (let i = 0; i < args.length; i++) {
    const arg = args[i];
    if (!arg.startsWith("--")) throw new Error(`Unexpected argument "${arg}"`);
    const eq = arg.indexOf("=");
    if (eq >= 0) out[arg.slice(2, eq)] = arg.slice(eq + 1);
    else if (arg === "--help" || arg === "-h") out.help = "true";
    else out[arg.slice(2)] = args[++i] ?? "";
  }
  return out;
}

async function main(): Promise<void> {
  const usage = "Usage: lib/model/local_server.ts [--port 8000] [--hostname 127.0.0.1] " +
    "[--accuracy 0.75] [--seed 0] [--api-key KEY]";
  let flags: Record<string, string>;
  try {
    flags = parseCli(process.argv.slice(2));
  } catch (error) {
    console.error(`${(error as Error).message}\n${usage}`);
    process.exit(2);
  }
  if (flags.help) {
    console.log(usage);
    return;
  }
  const known = new Set(["port", "hostname", "accuracy", "seed", "api-key", "help"]);
  const unknown = Object.keys(flags).filter((k) => !known.has(k));
  const port = Number(flags.port ?? "8000");
  const accuracy = Number(flags.accuracy ?? "0.75");
  const seed = Number(flags.seed ?? "0");
  if (unknown.length > 0 || !Number.isInteger(port) || !(accuracy >= 0 && accuracy <= 1)) {
    console.error(
      unknown.length > 0
        ? `Unknown option "--${unknown[0]}"\n${usage}`
        : `Invalid --port "${flags.port}" or --accuracy "${flags.accuracy}"\n${usage}`,
    );
    process.exit(2);
  }
  const server = await startModelServer({
    responder: demoResponder({ accuracy, seed }),
    port,
    hostname: flags.hostname,
    apiKey: flags["api-key"],
    record: false,
  });
  console.log(`vf scripted demo model (not an LLM) serving model "vf-demo" at ${server.url}`);
  // Exit at once: nothing is persisted, and a graceful close from a node:process signal
  // handler takes about 2 s under Deno.
  const stop = () => process.exit(0);
  process.on("SIGINT", stop);
  process.on("SIGTERM", stop);
}

if (import.meta.main) await main();
