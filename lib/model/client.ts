/**
 * The OpenAI-compatible chat completions client: retries with backoff on 429/5xx and
 * connection failures, per-request timeouts, and error mapping. Plain-http endpoints go
 * through vf's keep-alive HTTP/1.1 pool (`http1.ts`); https and proxied ones through `fetch`.
 * @module
 */
import {
  AuthenticationError,
  ConfigError,
  EmptyModelResponseError,
  InvalidModelResponseError,
  ModelError,
  OverlongPromptError,
} from "../errors.ts";
import { Http1Error, http1Request, Http1TimeoutError, usesProxy } from "./http1.ts";
import { contentText, normalizeToolCall } from "../messages.ts";
import { VERSION } from "../version.ts";
import type {
  FinishReason,
  Messages,
  Response,
  ResponseTokens,
  SamplingArgs,
  Tool,
  ToolCall,
  Usage,
} from "../types.ts";

/** How to reach a model endpoint. Field names match verifiers' ClientConfig. */
export interface ClientConfig {
  /** Base URL ending before `/chat/completions`, e.g. `http://127.0.0.1:8000/v1`. */
  base_url: string;
  /** Name of the environment variable that holds the API key. */
  api_key_var?: string;
  /** The key itself (takes precedence over `api_key_var`). */
  api_key?: string;
  /** Per-request timeout in seconds; default 600. */
  timeout?: number;
  /** Retries on 429, 5xx and connection failures; default 5. */
  max_retries?: number;
  /** Headers sent with every request. */
  extra_headers?: Record<string, string>;
  /** Header name → state key, read from the rollout state per request. */
  extra_headers_from_state?: Record<string, string>;
  /**
   * `"auto"` (default): plain `http:` endpoints without a proxy go through vf's keep-alive
   * HTTP/1.1 pool, which costs far less CPU per request than `fetch`; `https:` and proxied
   * endpoints use `fetch`. `"fetch"`: always `fetch`.
   */
  transport?: "auto" | "fetch";
}

/** Options of one chat request. */
export interface ChatRequestOptions {
  tools?: Tool[];
  samplingArgs?: SamplingArgs;
  headers?: Record<string, string>;
  signal?: AbortSignal;
  /** Which rollout of its group the call belongs to (the model-call cache keys by it). */
  cacheSalt?: string;
  /**
   * Called with each piece of the reply as the endpoint produces it: the request then streams
   * (`stream: true`, usage asked for) and still resolves to the whole {@link Response}. Not
   * streamed when token data is asked for; a client that cannot stream calls it never.
   */
  onDelta?: (delta: ResponseDelta) => void;
}

/** One streamed piece of a reply: text, reasoning, or a tool call's part (by its index). */
export interface ResponseDelta {
  content?: string;
  reasoning?: string;
  tool_call?: { index: number; id?: string; name?: string; arguments?: string };
}

/** Anything that answers chat prompts. */
export interface ChatClient {
  readonly baseUrl: string;
  /** Header name → state key, resolved by the environment before each call. */
  readonly headersFromState: Record<string, string>;
  getResponse(prompt: Messages, model: string, options?: ChatRequestOptions): Promise<Response>;
}

/** The endpoint could not be reached at all (after retries). Ends the run. */
export class EndpointUnreachableError extends ModelError {}

/**
 * Token capture was required (`return_token_ids = "required"`) and the endpoint answered
 * without token data. The rollout's model error, never a reward.
 */
export class MissingTokenDataError extends ModelError {}

/** How a request asks for token data: not at all, when the endpoint has it, or always. */
export type TokenCapture = "off" | "auto" | "required";

/**
 * The token capture a sampling value asks for: `return_token_ids = true` records token data
 * when the endpoint returns it, `"required"` fails the call when it does not.
 * @throws {ConfigError} for any other value
 */
export function tokenCapture(value: unknown): TokenCapture {
  if (value === undefined || value === null || value === false) return "off";
  if (value === true) return "auto";
  if (value === "required") return "required";
  throw new ConfigError(
    `Sampling "return_token_ids" must be true, false or "required", got ${JSON.stringify(value)}`,
  );
}

/**
 * Read vLLM's token data from a chat completions body: `prompt_token_ids` at the top level,
 * `token_ids` on the choice and `logprobs.content[].logprob` (vLLM ≥ 0.10.2 with
 * `return_token_ids` and `logprobs`). Returns what is wrong instead (`has no "<field>"`) when the
 * data is absent or inconsistent.
 */
export function parseResponseTokens(body: unknown): ResponseTokens | { problem: string } {
  const b = (body ?? {}) as Record<string, unknown>;
  const choice = (Array.isArray(b.choices) ? b.choices[0] : undefined) as
    | Record<string, unknown>
    | undefined;
  const promptIds = b.prompt_token_ids;
  if (!isIntArray(promptIds)) return { problem: 'has no "prompt_token_ids"' };
  const completionIds = choice?.token_ids;
  if (!isIntArray(completionIds)) return { problem: 'has no "choices[0].token_ids"' };
  const content = (choice?.logprobs as { content?: unknown } | null | undefined)?.content;
  if (!Array.isArray(content)) return { problem: 'has no "choices[0].logprobs.content"' };
  const logprobs = content.map((c) => Number((c as { logprob?: unknown } | null)?.logprob));
  if (logprobs.length !== completionIds.length || logprobs.some((l) => Number.isNaN(l))) {
    return {
      problem: `has ${logprobs.length} entries in "choices[0].logprobs.content" for ` +
        `${completionIds.length} token ids`,
    };
  }
  return {
    prompt_ids: promptIds,
    prompt_mask: promptIds.map(() => 0),
    completion_ids: completionIds,
    completion_mask: completionIds.map(() => 1),
    completion_logprobs: logprobs,
  };
}

function isIntArray(value: unknown): value is number[] {
  return Array.isArray(value) && value.every((v) => Number.isInteger(v));
}

const USER_AGENT = `vf/${VERSION}`;

const OVERLONG_PHRASES = [
  "this model's maximum context length is",
  "is longer than the model's context length",
  "is longer than the maximum model length",
  "exceeds the model's context length",
  "exceed the configured limit",
  "exceeds the configured limit",
  "exceeded model",
  "prompt_too_long",
  "context length",
  "maximum model length",
];

/** Convert internal messages to the chat completions wire form. */
export function toWireMessages(messages: Messages): Record<string, unknown>[] {
  return messages.map((m) => {
    switch (m.role) {
      case "assistant": {
        const out: Record<string, unknown> = { role: "assistant", content: m.content ?? null };
        if (m.tool_calls && m.tool_calls.length > 0) {
          out.tool_calls = m.tool_calls.map((c) => ({
            id: c.id,
            type: "function",
            function: { name: c.name, arguments: c.arguments },
          }));
        }
        if (m.reasoning_content) out.reasoning_content = m.reasoning_content;
        return out;
      }
      case "tool":
        return { role: "tool", tool_call_id: m.tool_call_id, content: m.content };
      case "text":
        return { role: "user", content: m.content };
      default:
        return { role: m.role, content: m.content };
    }
  });
}

/** Normalise sampling args: `max_tokens` → `max_completion_tokens`, nulls dropped. */
export function normalizeSamplingArgs(args: SamplingArgs = {}): SamplingArgs {
  const out: SamplingArgs = {};
  for (const [k, v] of Object.entries(args)) {
    if (v === null || v === undefined) continue;
    if (k === "max_tokens") {
      if (args.max_completion_tokens === undefined) out.max_completion_tokens = v;
      continue;
    }
    if (k === "extra_body" && typeof v === "object") {
      Object.assign(out, v);
      continue;
    }
    out[k] = v;
  }
  return out;
}

function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const t = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(t);
      reject(signal!.reason);
    };
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

function backoffMs(attempt: number, retryAfter: string | null): number {
  const ra = retryAfter ? Number(retryAfter) : NaN;
  if (Number.isFinite(ra) && ra >= 0) return Math.min(ra * 1000, 60_000);
  const base = Math.min(250 * 2 ** attempt, 8_000);
  return base / 2 + Math.random() * (base / 2);
}

/** Parse a chat completions body into a normalised {@link Response}. */
export function parseChatCompletion(body: unknown): Response {
  if (body === null || typeof body !== "object") {
    throw new EmptyModelResponseError("Model returned an empty response");
  }
  const b = body as Record<string, unknown>;
  const choices = b.choices;
  if (!Array.isArray(choices)) {
    throw new EmptyModelResponseError("Model response has no choices");
  }
  if (choices.length !== 1) {
    throw new InvalidModelResponseError(`Model response has ${choices.length} choices, expected 1`);
  }
  const choice = choices[0] as Record<string, unknown>;
  const msg = (choice.message ?? {}) as Record<string, unknown>;
  const content = typeof msg.content === "string" ? msg.content : null;
  const reasoning = [msg.reasoning, msg.reasoning_content, msg.reasoning_details].find((r) =>
    typeof r === "string"
  ) as string | undefined;
  const toolCalls: ToolCall[] = [];
  if (Array.isArray(msg.tool_calls)) {
    for (const raw of msg.tool_calls) {
      try {
        toolCalls.push(normalizeToolCall(raw));
      } catch { /* unparseable tool calls are dropped */ }
    }
  }
  if (!content && toolCalls.length === 0 && !reasoning) {
    throw new EmptyModelResponseError(
      "Model returned a message with no content, no tool calls and no reasoning",
    );
  }
  const fr = choice.finish_reason;
  const finish: FinishReason = fr === "stop" || fr === "length" || fr === "tool_calls" ? fr : null;
  const u = (b.usage ?? null) as Record<string, number> | null;
  let usage: Usage | null = null;
  if (u) {
    const prompt = Number(u.prompt_tokens ?? u.input_tokens ?? 0);
    const completion = Number(u.completion_tokens ?? u.output_tokens ?? 0);
    usage = {
      prompt_tokens: prompt,
      completion_tokens: completion,
      reasoning_tokens: 0,
      total_tokens: Number(u.total_tokens ?? prompt + completion),
    };
  }
  return {
    id: String(b.id ?? ""),
    created: Number(b.created ?? 0),
    model: String(b.model ?? ""),
    usage,
    message: {
      role: "assistant",
      content,
      ...(reasoning ? { reasoning_content: reasoning } : {}),
      tool_calls: toolCalls.length > 0 ? toolCalls : null,
      finish_reason: finish,
      is_truncated: finish === "length",
    },
  };
}

/** Resolve the API key from a config: explicit key, else `$api_key_var`, else "EMPTY". */
export function resolveApiKey(config: ClientConfig, env = readEnv): string {
  if (config.api_key) return config.api_key;
  if (config.api_key_var) return env(config.api_key_var) || "EMPTY";
  return "EMPTY";
}

/** Why a fetch failed: Deno and Node say only "fetch failed" and keep the reason as `cause`. */
function fetchFailureReason(error: unknown): string {
  const cause = error instanceof Error ? error.cause : undefined;
  if (cause instanceof Error && cause.message) return cause.message;
  return error instanceof Error ? error.message : String(error);
}

/** The remedy named in the authentication error: which variable to check or set. */
function describeKeySource(config: ClientConfig, env = readEnv): string {
  if (config.api_key) return "check the api_key given to the client";
  if (!config.api_key_var) return "set api_key_var (-k) to the variable holding the key";
  return env(config.api_key_var)
    ? `check the key in $${config.api_key_var} (choose the variable with -k / api_key_var)`
    : `$${config.api_key_var} is not set; set it or choose the variable with -k / api_key_var`;
}

function readEnv(name: string): string | undefined {
  // deno-lint-ignore no-explicit-any
  const g = globalThis as any;
  try {
    return g.Deno?.env?.get(name) ?? g.process?.env?.[name];
  } catch {
    return undefined;
  }
}

/** OpenAI chat completions over HTTP (see {@link ClientConfig.transport}). */
export class OpenAIChatClient implements ChatClient {
  readonly baseUrl: string;
  /** The config it was built from, e.g. to forward the endpoint to an env server. */
  readonly config?: Readonly<ClientConfig>;
  readonly headersFromState: Record<string, string>;
  #key: string;
  /** Where the key came from, for the authentication error (never the key itself). */
  #keySource: string;
  #timeoutMs: number;
  #maxRetries: number;
  #headers: Record<string, string>;
  /** The headers of a request that adds none of its own, built once (and never changed). */
  #baseHeaders: Readonly<Record<string, string>>;
  /** Set when requests go through vf's HTTP/1.1 pool (plain http, no proxy); else `fetch`. */
  #http1Endpoint: URL | null;

  constructor(config: ClientConfig) {
    this.baseUrl = config.base_url.replace(/\/+$/, "");
    this.config = { ...config };
    this.#key = resolveApiKey(config);
    this.#keySource = describeKeySource(config);
    this.#timeoutMs = (config.timeout ?? 600) * 1000;
    this.#maxRetries = config.max_retries ?? 5;
    this.#headers = lowerCaseKeys(config.extra_headers);
    this.#baseHeaders = Object.freeze(this.#requestHeaders(undefined));
    this.headersFromState = config.extra_headers_from_state ?? {};
    let endpoint: URL | null = null;
    try {
      endpoint = new URL(`${this.baseUrl}/chat/completions`);
    } catch { /* reported below */ }
    if (!endpoint || (endpoint.protocol !== "http:" && endpoint.protocol !== "https:")) {
      throw new ConfigError(
        `Model base URL "${config.base_url}" is not an http(s) URL; ` +
          "give one like http://127.0.0.1:8000/v1 (-b / base_url)",
      );
    }
    const http1 = (config.transport ?? "auto") === "auto" && endpoint.protocol === "http:" &&
      !usesProxy(endpoint, readEnv);
    this.#http1Endpoint = http1 ? endpoint : null;
  }

  async getResponse(
    prompt: Messages,
    model: string,
    options: ChatRequestOptions = {},
  ): Promise<Response> {
    const body: Record<string, unknown> = {
      model,
      messages: toWireMessages(prompt),
      ...normalizeSamplingArgs(options.samplingArgs),
    };
    // One choice per request; group size comes from rollouts_per_example. (A delete makes the
    // body slower to serialise: only when there is something to delete.)
    if ("n" in body) delete body.n;
    const capture = tokenCapture(body.return_token_ids);
    if (capture === "off") {
      if ("return_token_ids" in body) delete body.return_token_ids;
    } else {
      // vLLM's flags: token ids of prompt and completion, and a logprob per sampled token.
      body.return_token_ids = true;
      body.logprobs = true;
    }
    if (options.tools && options.tools.length > 0) {
      body.tools = options.tools.map((t) => ({
        type: "function",
        function: {
          name: t.name,
          description: t.description,
          parameters: t.parameters,
          ...(t.strict !== undefined && t.strict !== null ? { strict: t.strict } : {}),
        },
      }));
    }
    const onDelta = capture === "off" ? options.onDelta : undefined;
    if (onDelta) {
      body.stream = true;
      body.stream_options = { include_usage: true };
    }
    const payload = JSON.stringify(body);
    const url = `${this.baseUrl}/chat/completions`;
    const headers = options.headers && hasKeys(options.headers)
      ? this.#requestHeaders(options.headers)
      : this.#baseHeaders;
    let lastError: unknown;
    for (let attempt = 0; attempt <= this.#maxRetries; attempt++) {
      options.signal?.throwIfAborted();
      let reply: Reply;
      try {
        reply = onDelta
          ? await this.#postFetch(url, headers, payload, options.signal, onDelta)
          : await this.#post(url, headers, payload, options.signal);
      } catch (error) {
        if (options.signal?.aborted) throw options.signal.reason;
        if (!(error instanceof TransportFailure)) throw error;
        if (error.kind === "read") {
          throw new ModelError(`Reading the response from "${url}" failed: ${error.reason}`, {
            cause: error.cause,
          });
        }
        lastError = error.kind === "timeout"
          ? new ModelError(
            `Model request to "${url}" timed out after ${this.#timeoutMs / 1000}s`,
            { cause: error.cause },
          )
          : new EndpointUnreachableError(
            `Cannot reach the model endpoint "${this.baseUrl}": ${error.reason}; ` +
              "check the base URL (-b) and that the server is running",
            { cause: error.cause },
          );
        if (attempt < this.#maxRetries) {
          await sleep(backoffMs(attempt, null), options.signal);
          continue;
        }
        throw withRetries(lastError, attempt);
      }
      const { status, text } = reply;
      if (reply.streamed) {
        const response = parseChatCompletion(reply.streamed);
        if (attempt > 0) response.retries = attempt;
        return response;
      }
      if (status >= 200 && status < 300) {
        let json: unknown;
        try {
          json = JSON.parse(text);
        } catch (error) {
          throw new InvalidModelResponseError(
            `Model endpoint "${url}" returned malformed JSON: ${
              JSON.stringify(text.slice(0, 120))
            }`,
            { cause: error },
          );
        }
        const response = parseChatCompletion(json);
        if (capture !== "off") {
          const tokens = parseResponseTokens(json);
          if ("problem" in tokens) {
            if (capture === "required") {
              throw new MissingTokenDataError(
                `Model endpoint "${url}" returned no token data: the response ` +
                  `${tokens.problem} although return_token_ids = "required"; serve the ` +
                  "model with vLLM 0.10.2 or newer, or set return_token_ids = true to record " +
                  "token data only when the endpoint returns it",
              );
            }
          } else response.tokens = tokens;
        }
        if (attempt > 0) response.retries = attempt;
        return response;
      }
      const lower = text.toLowerCase();
      if (status === 401 || status === 403) {
        throw new AuthenticationError(
          `Model endpoint "${this.baseUrl}" rejected the API key (HTTP ${status}): ${
            text.slice(0, 200)
          }; ${this.#keySource}`,
        );
      }
      if (status === 400 && OVERLONG_PHRASES.some((p) => lower.includes(p))) {
        throw new OverlongPromptError(
          `Prompt is longer than the model's context: ${text.slice(0, 200)}`,
        );
      }
      lastError = new ModelError(
        `Model endpoint "${url}" answered HTTP ${status}: ${text.slice(0, 300)}`,
      );
      if ((status === 429 || status >= 500) && attempt < this.#maxRetries) {
        await sleep(backoffMs(attempt, reply.retryAfter), options.signal);
        continue;
      }
      throw withRetries(lastError, attempt);
    }
    throw lastError;
  }

  #requestHeaders(extra: Record<string, string> | undefined): Record<string, string> {
    return {
      "content-type": "application/json",
      authorization: `Bearer ${this.#key}`,
      "user-agent": USER_AGENT,
      ...this.#headers,
      ...lowerCaseKeys(extra),
    };
  }

  /** One POST attempt over the chosen transport. */
  #post(
    url: string,
    headers: Readonly<Record<string, string>>,
    body: string,
    signal: AbortSignal | undefined,
  ): Promise<Reply> {
    return this.#http1Endpoint
      ? this.#postHttp1(this.#http1Endpoint, headers, body, signal)
      : this.#postFetch(
        url,
        headers,
        body,
        signal,
      );
  }

  async #postHttp1(
    url: URL,
    headers: Record<string, string>,
    body: string,
    signal: AbortSignal | undefined,
  ): Promise<Reply> {
    try {
      const res = await http1Request({
        method: "POST",
        url,
        headers,
        body,
        signal,
        timeoutMs: this.#timeoutMs,
      });
      return {
        status: res.status,
        text: res.text,
        retryAfter: res.headers.get("retry-after") ?? null,
      };
    } catch (error) {
      if (signal?.aborted || !(error instanceof Http1Error)) throw error;
      const kind = error instanceof Http1TimeoutError
        ? "timeout"
        : error.phase === "receive"
        ? "read"
        : "connect";
      throw new TransportFailure(kind, error.message, error);
    }
  }

  async #postFetch(
    url: string,
    headers: Record<string, string>,
    body: string,
    outer: AbortSignal | undefined,
    onDelta?: (delta: ResponseDelta) => void,
  ): Promise<Reply> {
    // One controller and one timer per attempt (cheaper than AbortSignal.timeout/any at
    // thousands of requests per second); the timer also bounds reading the body.
    const controller = new AbortController();
    let timedOut = false;
    const timer = setTimeout(() => {
      timedOut = true;
      controller.abort(new DOMException("Model request timed out", "TimeoutError"));
    }, this.#timeoutMs);
    const onOuter = () => controller.abort(outer!.reason);
    outer?.addEventListener("abort", onOuter, { once: true });
    try {
      let res: globalThis.Response;
      try {
        res = await fetch(url, { method: "POST", headers, body, signal: controller.signal });
      } catch (error) {
        if (outer?.aborted) throw outer.reason;
        throw new TransportFailure(
          timedOut ? "timeout" : "connect",
          fetchFailureReason(error),
          error,
        );
      }
      try {
        const ok = res.status >= 200 && res.status < 300;
        if (
          onDelta && ok && res.body && /event-stream/i.test(res.headers.get("content-type") ?? "")
        ) {
          return {
            status: res.status,
            text: "",
            retryAfter: null,
            streamed: await readChatStream(res.body, onDelta),
          };
        }
        return {
          status: res.status,
          text: await res.text(),
          retryAfter: res.headers.get("retry-after"),
        };
      } catch (error) {
        if (outer?.aborted) throw outer.reason;
        throw new TransportFailure(
          timedOut ? "timeout" : "read",
          fetchFailureReason(error),
          error,
        );
      }
    } finally {
      clearTimeout(timer);
      outer?.removeEventListener("abort", onOuter);
    }
  }
}

function hasKeys(record: Record<string, string>): boolean {
  for (const _ in record) return true;
  return false;
}

/** Header names are case-insensitive: later ones (e.g. a user's `Authorization`) replace ours. */
function lowerCaseKeys(headers: Record<string, string> | undefined): Record<string, string> {
  const out: Record<string, string> = {};
  for (const name in headers) out[name.toLowerCase()] = headers[name];
  return out;
}

/** Marks an error thrown after retried attempts with how many there were. */
function withRetries(error: unknown, attempt: number): unknown {
  if (attempt > 0 && error instanceof Error) Object.assign(error, { retries: attempt });
  return error;
}

/** What one attempt got back. */
interface Reply {
  status: number;
  text: string;
  retryAfter: string | null;
  /** A streamed reply, put together as a `chat.completion` body. */
  streamed?: Record<string, unknown>;
}

/**
 * Read a `chat.completion.chunk` event stream, handing each piece to `onDelta`, into the
 * `chat.completion` body it adds up to. An error event in the stream is thrown.
 */
async function readChatStream(
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

/** One attempt failed in transport: no connection, no complete reply in time, or a broken read. */
class TransportFailure extends Error {
  constructor(
    readonly kind: "connect" | "timeout" | "read",
    readonly reason: string,
    override readonly cause: unknown,
  ) {
    super(reason);
  }
}

/** Text of the first choice; used by judges. */
export function responseText(response: Response): string {
  return contentText(response.message.content ?? "");
}
