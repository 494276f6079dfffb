/**
 * The OpenAI-compatible chat completions client: retries with backoff on 429/5xx and
 * connection failures, per-request timeouts, and error mapping. Plain-http endpoints go
 * through vf's keep-alive HTTP/1.1 pool (`http1.ts`); https and proxied ones through `fetch`.
 * The wire form (messages and sampling out, completion bodies and token data in) is
 * `wire.ts`'s; a streamed reply is read by `chat_stream.ts`.
 * @module
 */
import {
  AuthenticationError,
  ConfigError,
  InvalidModelResponseError,
  ModelError,
  OverlongPromptError,
} from "../errors.ts";
import { Http1Error, Http1TimeoutError, usesProxy } from "./http1.ts";
import { http1Post, http1PostHere } from "./http1_thread.ts";
import { VERSION } from "../version.ts";
import type { Messages, Response, SamplingArgs, Tool } from "../types.ts";
import {
  fittingOutputCap,
  normalizeSamplingArgs,
  parseChatCompletion,
  parseResponseTokens,
  PROGRAM_REASONING_EFFORT,
  tokenCapture,
  toWireMessages,
} from "./wire.ts";
import { readChatStream, type ResponseDelta } from "./chat_stream.ts";

export {
  fittingOutputCap,
  normalizeSamplingArgs,
  parseChatCompletion,
  parseResponseTokens,
  PROGRAM_REASONING_EFFORT,
  responseText,
  type TokenCapture,
  tokenCapture,
  toWireMessages,
} from "./wire.ts";
export type { ResponseDelta } from "./chat_stream.ts";

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
   * HTTP/1.1 pool, which costs far less CPU per request than `fetch`, run on a worker thread of
   * its own (`http1_thread.ts`; on the calling thread where no worker can start); `https:` and
   * proxied endpoints use `fetch`. `"http1"`: the same, with the pool on the calling thread.
   * `"fetch"`: always `fetch`.
   */
  transport?: "auto" | "http1" | "fetch";
  /**
   * The endpoint's output-token limit: a request's cap (`max_tokens`/`max_completion_tokens`)
   * above it is sent as this, and the response says so in `output_cap`.
   */
  max_output_tokens?: number;
  /**
   * Whether the endpoint's model takes `reasoning_effort`: a program's own request for
   * reasoning (through the model gateway) is sent only when true; else it is listed on the
   * response as not honoured. The run's own `reasoning_effort` is always sent.
   */
  reasoning?: boolean;
  /**
   * Send `X-Session-ID: <trace id>` on each model call of a rollout (as prime-rl's train
   * client does), so an inference router keeps the rollout on one replica. Default false.
   */
  session_header?: boolean;
  /**
   * vLLM's prefix-cache salt (`cache_salt` in the request body, not vf's own model-call
   * cache): `"group"` one per task group, so prefix caches are shared within a group and
   * never across groups; `"rollout"` one per rollout (its trace id). Default: none sent.
   */
  cache_salt?: "group" | "rollout";
}

/** The rollout a model call belongs to (see {@link ChatRequestOptions.session}). */
export interface CallSession {
  /** The rollout's trace id: `X-Session-ID` under `session_header`. */
  traceId: string;
  /** Its group (run and task): the `cache_salt` under `cache_salt = "group"`. */
  group: string;
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
   * The rollout the call belongs to; sent as `X-Session-ID` and vLLM's `cache_salt` only
   * when the client's config asks (`session_header`, `cache_salt`).
   */
  session?: CallSession;
  /**
   * Called with each piece of the reply as the endpoint produces it: the request then streams
   * (`stream: true`, usage asked for) and still resolves to the whole {@link Response}. Not
   * streamed when token data is asked for; a client that cannot stream calls it never.
   */
  onDelta?: (delta: ResponseDelta) => void;
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

const USER_AGENT = `vf/${VERSION}`;

/** Endpoints already warned about a program's reasoning effort they are not set to take. */
const warnedReasoning = new Set<string>();

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
  /** The pool runs on its worker thread (`http1_thread.ts`), not the caller's. */
  #http1OffThread: boolean;
  #chatUrlText: string | undefined;

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
    const transport = config.transport ?? "auto";
    const http1 = transport !== "fetch" && endpoint.protocol === "http:" &&
      !usesProxy(endpoint, readEnv);
    this.#http1Endpoint = http1 ? endpoint : null;
    this.#http1OffThread = transport === "auto";
  }

  getResponse(
    prompt: Messages,
    model: string,
    options: ChatRequestOptions = {},
  ): Promise<Response> {
    try {
      return this.#request(prompt, model, options);
    } catch (error) {
      return Promise.reject(error);
    }
  }

  /** The request's body and headers, then its attempts. */
  #request(prompt: Messages, model: string, options: ChatRequestOptions): Promise<Response> {
    // No sampling arguments (the common case): no normalised copy to spread.
    const sampling = options.samplingArgs;
    const body: Record<string, unknown> = sampling && hasKeys(sampling)
      ? { model, messages: toWireMessages(prompt), ...normalizeSamplingArgs(sampling) }
      : { model, messages: toWireMessages(prompt) };
    // One choice per request; group size comes from rollouts_per_example. (A delete makes the
    // body slower to serialise: only when there is something to delete.)
    if ("n" in body) delete body.n;
    const session = options.session;
    if (session && this.config?.cache_salt) {
      body.cache_salt = this.config.cache_salt === "group" ? session.group : session.traceId;
    }
    // A program's reasoning effort goes only where the endpoint takes it; the run's wins.
    let notHonoured: { name: string; type: string }[] | undefined;
    if (PROGRAM_REASONING_EFFORT in body) {
      const effort = body[PROGRAM_REASONING_EFFORT];
      delete body[PROGRAM_REASONING_EFFORT];
      if (body.reasoning_effort === undefined) {
        if (this.config?.reasoning === true) body.reasoning_effort = effort;
        else {
          notHonoured = [{ name: String(effort), type: "reasoning_effort" }];
          this.#warnReasoning(String(effort));
        }
      }
    }
    // The output cap: clamped to the endpoint's limit; lowered once if the endpoint refuses it.
    const capKey = typeof body.max_completion_tokens === "number"
      ? "max_completion_tokens"
      : typeof body.max_tokens === "number"
      ? "max_tokens"
      : null;
    let outputCap: Response["output_cap"];
    const limit = this.config?.max_output_tokens;
    if (capKey && limit !== undefined && (body[capKey] as number) > limit) {
      outputCap = { requested: body[capKey] as number, sent: limit, reason: "max_output_tokens" };
      body[capKey] = limit;
    }
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
    const url = this.#chatUrl;
    const extraHeaders = session && this.config?.session_header
      ? { ...options.headers, "x-session-id": session.traceId }
      : options.headers;
    const headers = extraHeaders && hasKeys(extraHeaders)
      ? this.#requestHeaders(extraHeaders)
      : this.#baseHeaders;
    const call: Call = { body, payload, url, headers, capKey, outputCap, notHonoured, capture };
    // The common call (no stream, the HTTP/1.1 pool) answered at once: its first attempt is a
    // then() on the request instead of an async frame held while the reply is awaited.
    if (!onDelta && this.#http1Endpoint) {
      options.signal?.throwIfAborted();
      return this.#sendHttp1(this.#http1Endpoint, headers, payload, options.signal).then(
        (reply) =>
          reply.status >= 200 && reply.status < 300
            ? parsedResponse(reply.text, call, 0)
            : this.#attempts(call, options, { reply }),
        (error) => this.#attempts(call, options, { error }),
      );
    }
    return this.#attempts(call, options, null, onDelta);
  }

  /**
   * The attempt loop: retries, the output cap lowered once, errors. `first` is the first
   * attempt's outcome when it was already made (its reply, or its HTTP/1.1 failure).
   */
  async #attempts(
    call: Call,
    options: ChatRequestOptions,
    first: { reply?: Reply; error?: unknown } | null,
    onDelta?: (delta: ResponseDelta) => void,
  ): Promise<Response> {
    const { body, url, headers, capKey, notHonoured } = call;
    let { payload, outputCap } = call;
    let lastError: unknown;
    for (let attempt = 0; attempt <= this.#maxRetries; attempt++) {
      const made = first;
      first = null;
      if (!made) options.signal?.throwIfAborted();
      let reply: Reply;
      try {
        if (made) reply = made.reply ?? http1Failure(made.error);
        else {
          reply = onDelta
            ? await this.#postFetch(url, headers, payload, options.signal, onDelta)
            : await this.#post(url, headers, payload, options.signal);
        }
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
        return annotated(response, outputCap, notHonoured);
      }
      if (status >= 200 && status < 300) {
        return parsedResponse(text, { ...call, outputCap }, attempt);
      }
      // A cap the endpoint refuses, naming its limit: once more with the cap that fits.
      const fit = capKey && outputCap?.reason !== "endpoint_limit" && status >= 400 &&
          status < 500 && status !== 429
        ? fittingOutputCap(text, body[capKey] as number)
        : null;
      if (fit !== null) {
        outputCap = {
          requested: outputCap?.requested ?? body[capKey!] as number,
          sent: fit,
          reason: "endpoint_limit",
        };
        body[capKey!] = fit;
        payload = JSON.stringify(body);
        attempt--; // not one of the retries of a failure
        continue;
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
          `Prompt is longer than the model's context${
            outputCap?.reason === "endpoint_limit"
              ? ` (with the output cap lowered to ${outputCap.sent})`
              : ""
          }: ${text.slice(0, 200)}`,
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

  /** `…/chat/completions` of the base URL, built once. */
  get #chatUrl(): string {
    return this.#chatUrlText ??= `${this.baseUrl}/chat/completions`;
  }

  #warnReasoning(effort: string): void {
    if (warnedReasoning.has(this.baseUrl)) return;
    warnedReasoning.add(this.baseUrl);
    console.warn(
      `vf: a program asked "${this.baseUrl}" for reasoning (effort "${effort}"), which is not ` +
        "sent: the endpoint is not set to take reasoning_effort ([client] reasoning = true, or " +
        "reasoning = true on its endpoints.toml entry); recorded on the trace as not_honoured",
    );
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

  #postHttp1(
    url: URL,
    headers: Record<string, string>,
    body: string,
    signal: AbortSignal | undefined,
  ): Promise<Reply> {
    // A then() instead of an async frame; an aborted run's error is the signal's reason,
    // which getResponse throws whatever this rejects with.
    return this.#sendHttp1(url, headers, body, signal).then(undefined, http1Failure);
  }

  /** One POST through the HTTP/1.1 pool: on its worker thread, or on this one. */
  #sendHttp1(
    url: URL,
    headers: Readonly<Record<string, string>>,
    body: string,
    signal: AbortSignal | undefined,
  ): Promise<Reply> {
    const post = this.#http1OffThread ? http1Post : http1PostHere;
    return post({ url, headers, body, signal, timeoutMs: this.#timeoutMs });
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

/** What the attempts of one call share. */
interface Call {
  body: Record<string, unknown>;
  payload: string;
  url: string;
  headers: Readonly<Record<string, string>>;
  capKey: "max_completion_tokens" | "max_tokens" | null;
  outputCap: Response["output_cap"];
  notHonoured: Response["not_honoured"];
  capture: ReturnType<typeof tokenCapture>;
}

/** A 2xx reply's body as the call's response. */
function parsedResponse(text: string, call: Call, attempt: number): Response {
  const { url, capture, outputCap, notHonoured } = call;
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (error) {
    throw new InvalidModelResponseError(
      `Model endpoint "${url}" returned malformed JSON: ${JSON.stringify(text.slice(0, 120))}`,
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
  return annotated(response, outputCap, notHonoured);
}

/** A transport failure of the HTTP/1.1 client as the attempt loop tells them apart. */
function http1Failure(error: unknown): never {
  if (!(error instanceof Http1Error)) throw error;
  const kind = error instanceof Http1TimeoutError
    ? "timeout"
    : error.phase === "receive"
    ? "read"
    : "connect";
  throw new TransportFailure(kind, error.message, error);
}

/** The response with the output cap and the settings not honoured, when there are any. */
function annotated(
  response: Response,
  outputCap: Response["output_cap"],
  notHonoured: Response["not_honoured"],
): Response {
  if (outputCap) response.output_cap = outputCap;
  if (notHonoured) response.not_honoured = notHonoured;
  return response;
}

function hasKeys(record: object): boolean {
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
