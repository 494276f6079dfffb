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
import {
  type ChatCompletionBody,
  type ChatRequest,
  type CompletionReply,
  errorBody,
  type Reply,
  type Responder,
} from "./server_wire.ts";
import {
  completionResponse,
  errorResponse,
  json,
  sleep,
  streamResponse,
} from "./_server_replies.ts";
import { demoResponder } from "./responders.ts";
import { toyPromptTokens } from "./toy_tokenizer.ts";

export type {
  ChatCompletionBody,
  ChatRequest,
  CompletionReply,
  ErrorReply,
  HangReply,
  RawReply,
  Reply,
  Responder,
  ResponderContext,
  WireContentPart,
  WireMessage,
  WireTool,
  WireToolCall,
} from "./server_wire.ts";
export { TOY_TOKENS, toyLogprob, toyPromptTokens } from "./toy_tokenizer.ts";
export {
  DEMO_NO_ANSWER_TEXT,
  demoResponder,
  type DemoResponderOptions,
  lastUserText,
  scriptedResponder,
  systemText,
} from "./responders.ts";

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
  /**
   * The context length, as vLLM's `max_model_len`: a request whose prompt (in toy tokens) and
   * output cap (`max_completion_tokens`, else `max_tokens`) together exceed it gets vLLM's 400
   * naming the limit and the prompt's tokens, a prompt alone over it vLLM's overlong 400.
   * Refused requests are not recorded and do not reach the responder.
   */
  maxModelLen?: number;
  /**
   * The largest output cap taken, as OpenAI's models have: a larger one gets OpenAI's 400
   * ("max_tokens is too large: … supports at most N completion tokens …"), not recorded.
   */
  maxCompletionTokens?: number;
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

/**
 * Start an OpenAI-compatible chat completions server whose replies come from `responder`.
 *
 * Routes: `GET /v1/models` (the default model plus every model seen) and
 * `POST /v1/chat/completions` (`stream: true` is answered as `chat.completion.chunk` events).
 * Requests that are rejected before the responder runs (bad key, invalid JSON) are not
 * recorded.
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
    const refusal = capRefusal(body, options);
    if (refusal) return json(400, refusal);
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

/** The 400 body vLLM or OpenAI answers a cap (or prompt) over the server's limits with. */
function capRefusal(
  body: ChatCompletionBody,
  options: ModelServerOptions,
): Record<string, unknown> | null {
  const raw = body.max_completion_tokens ?? body.max_tokens;
  const cap = typeof raw === "number" ? raw : null;
  const most = options.maxCompletionTokens;
  if (most !== undefined && cap !== null && cap > most) {
    return {
      error: {
        message: `max_tokens is too large: ${cap}. This model supports at most ${most} ` +
          `completion tokens, whereas you provided ${cap}.`,
        type: "invalid_request_error",
        param: "max_tokens",
        code: null,
      },
    };
  }
  const len = options.maxModelLen;
  if (len === undefined) return null;
  const prompt = toyPromptTokens(body).length;
  const vllm = (message: string) => ({
    error: { message, type: "BadRequestError", param: null, code: 400 },
  });
  if (prompt > len) {
    return vllm(
      `This model's maximum context length is ${len} tokens. However, your request has ` +
        `${prompt} input tokens. Please reduce the length of the input messages.`,
    );
  }
  if (cap !== null && prompt + cap > len) {
    return vllm(
      `'max_tokens' or 'max_completion_tokens' is too large: ${cap}. This model's maximum ` +
        `context length is ${len} tokens and your request has ${prompt} input tokens ` +
        `(${cap} > ${len} - ${prompt}).`,
    );
  }
  return null;
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
