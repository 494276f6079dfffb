/**
 * The env server: exposes one loaded environment over HTTP so a trainer or an evaluator on
 * another process or machine can run rollouts with it (`vf serve <env>`).
 *
 * Routes (JSON bodies, snake_case):
 * - `GET /health` → `{ ok, env_id, in_flight, queued, max_concurrent, requests, version }`
 * - `GET /info` → the environment's id, args, sampling args, pass threshold, eval defaults
 *   and eval dataset size
 * - `POST /dataset` `{ n?, seed? }` → `{ rows }`: formatted evaluation rows
 * - `POST /rollouts` `{ request_id?, inputs, model, client, sampling_args?,
 *   independent_scoring?, state_columns? }` → an NDJSON stream: one
 *   `{ type: "group", example_id, outputs, retryable }` line per finished group (in finishing
 *   order), then `{ type: "done", count }`, or a last `{ type: "error", error, message }`
 *   line. Idle streams get a `{ type: "heartbeat" }` line now and then.
 * - `POST /cancel` `{ request_id }` → `{ cancelled }`: aborts that request's rollouts
 *
 * Groups in flight across all requests are bounded by `maxConcurrent`; the rest wait in a
 * queue. A client that disconnects from its stream cancels its request.
 *
 * Security: `client` carries the trainer's model endpoint and its API key in the request
 * body, and the server calls whatever `base_url` a request names. Serve on loopback (the
 * default), or on a trusted network behind TLS, and set `token` when anyone else can reach
 * the port. The server reads no keys from its own environment, except variables listed in
 * `allowKeyVars`, which a request may name in `client.api_key_var`.
 *
 * @example
 * ```ts
 * const server = await startEnvServer(env, { port: 8123 });
 * // a trainer: ServerEnvironment.connect(server.url), or POST /rollouts itself
 * await server.close();
 * ```
 * @module
 */
// deno-lint-ignore no-import-prefix
import { Hono } from "npm:hono@^4.13.0";
// deno-lint-ignore no-import-prefix
import { z } from "npm:zod@^4.6.0";
import { type ClientConfig, OpenAIChatClient } from "../model/client.ts";
import type { EnvironmentHandle } from "../eval/evaluate.ts";
import { serveHttp } from "../model/http_server.ts";
import type { Row } from "../types.ts";
import { VERSION } from "../version.ts";

/** The version of the request and response shapes; `/info` reports it. */
export const ENV_SERVER_PROTOCOL = 1;

/** Options of {@link startEnvServer}. */
export interface EnvServerOptions {
  /** Port to listen on; default 0 (a free port). */
  port?: number;
  /** Interface to listen on; default `"127.0.0.1"`. */
  hostname?: string;
  /** Groups running at once across all requests; the rest wait. Default 32. */
  maxConcurrent?: number;
  /** The id reported to clients; default `env.envId`. */
  envId?: string;
  /** Defaults `vf eval` uses when -n / -r are not given (from the environment module). */
  evalDefaults?: { num_examples?: number; rollouts_per_example?: number } | null;
  /** When set, every route but `/health` needs `Authorization: Bearer <token>`. */
  token?: string;
  /** Variables a request may name in `client.api_key_var` to use this server's key. Default none. */
  allowKeyVars?: string[];
  /** Milliseconds of silence on a stream before a heartbeat line; default 15000. */
  heartbeatMs?: number;
  /** Serve HTTPS with this certificate chain and key (PEM text). */
  tls?: { cert: string; key: string };
  /** Closes the server when aborted. */
  signal?: AbortSignal;
}

/** A running env server. */
export interface EnvServer extends AsyncDisposable {
  /** The base URL, e.g. `http://127.0.0.1:8123`. */
  readonly url: string;
  readonly port: number;
  /** Groups running now. */
  readonly inFlight: number;
  /** Groups waiting for a slot. */
  readonly queued: number;
  /** Cancels every request (their streams end with an error line), then stops listening. */
  close(): Promise<void>;
}

const ClientConfigWire = z.strictObject({
  base_url: z.string().regex(/^https?:\/\/\S+$/, "must be an http(s) URL"),
  api_key: z.string().optional(),
  api_key_var: z.string().optional(),
  timeout: z.number().positive().optional(),
  max_retries: z.number().int().min(0).optional(),
  extra_headers: z.record(z.string(), z.string()).optional(),
  extra_headers_from_state: z.record(z.string(), z.string()).optional(),
  transport: z.enum(["auto", "fetch"]).optional(),
});

const InputRow = z.looseObject({
  example_id: z.number().int(),
  prompt: z.union([z.string(), z.array(z.record(z.string(), z.unknown()))]),
});

/** The body of `POST /rollouts`. */
export const RolloutsRequest = z.strictObject({
  request_id: z.string().min(1).max(200).optional(),
  inputs: z.array(InputRow).min(1),
  model: z.string().min(1),
  client: ClientConfigWire,
  sampling_args: z.record(z.string(), z.unknown()).optional(),
  independent_scoring: z.boolean().optional(),
  state_columns: z.array(z.string()).optional(),
});
/** The body of `POST /rollouts`. */
export type RolloutsRequest = z.infer<typeof RolloutsRequest>;

const DatasetRequest = z.strictObject({
  n: z.number().int().optional(),
  seed: z.number().int().nullable().optional(),
});

const CancelRequest = z.strictObject({ request_id: z.string().min(1) });

/** One line of a `/rollouts` stream. */
export type RolloutsLine =
  | { type: "group"; example_id: number; outputs: unknown[]; retryable: boolean }
  | { type: "done"; count: number }
  | { type: "error"; error: string; message: string; cancelled?: boolean }
  | { type: "heartbeat" };

/** Counts groups in flight and hands out slots first come, first served. */
class Slots {
  inFlight = 0;
  #waiters: Array<() => void> = [];
  readonly limit: number;

  constructor(limit: number) {
    this.limit = limit;
  }

  get queued(): number {
    return this.#waiters.length;
  }

  /** Wait for a slot; rejects with the signal's reason when aborted while waiting. */
  acquire(signal: AbortSignal): Promise<void> {
    signal.throwIfAborted();
    if (this.inFlight < this.limit) {
      this.inFlight++;
      return Promise.resolve();
    }
    return new Promise((resolve, reject) => {
      const grant = () => {
        signal.removeEventListener("abort", onAbort);
        this.inFlight++;
        resolve();
      };
      const onAbort = () => {
        this.#waiters = this.#waiters.filter((w) => w !== grant);
        reject(signal.reason);
      };
      this.#waiters.push(grant);
      signal.addEventListener("abort", onAbort, { once: true });
    });
  }

  release(): void {
    this.inFlight--;
    this.#waiters.shift()?.();
  }
}

/** Issues as `path: message`, joined by `; `. */
function describeIssues(error: z.ZodError): string {
  return error.issues
    .slice(0, 5)
    .map((issue) => {
      const path = issue.path.join(".");
      return path ? `${path}: ${issue.message}` : issue.message;
    })
    .join("; ");
}

function json(status: number, body: unknown): Response {
  return new Response(JSON.stringify(body), {
    status,
    headers: { "content-type": "application/json" },
  });
}

function errorName(error: unknown): string {
  return error instanceof Error ? error.name : "Error";
}

function errorMessage(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

/** A cancellation's reason, recognised when the stream's last line is written. */
class Cancelled extends Error {
  override name = "Cancelled";
}

async function readBody<T>(request: Request, schema: z.ZodType<T>): Promise<T | Response> {
  let raw: unknown;
  try {
    const text = await request.text();
    raw = text.trim() === "" ? {} : JSON.parse(text);
  } catch (error) {
    return json(400, { error: `Request body is not valid JSON: ${errorMessage(error)}` });
  }
  const parsed = schema.safeParse(raw);
  if (!parsed.success) return json(400, { error: describeIssues(parsed.error) });
  return parsed.data;
}

function groupByExample(inputs: Row[]): Row[][] {
  const groups = new Map<unknown, Row[]>();
  for (const row of inputs) {
    const group = groups.get(row.example_id);
    if (group) group.push(row);
    else groups.set(row.example_id, [row]);
  }
  return [...groups.values()];
}

/**
 * Serve `env` over HTTP until closed.
 *
 * @param env a loaded environment (or any handle `generate` accepts); every request shares it
 * @param options port, hostname, concurrency and access settings
 * @returns the running server; close it when done
 * @throws when the port cannot be bound
 * @example
 * ```ts
 * await using server = await startEnvServer(env, { maxConcurrent: 64 });
 * const health = await (await fetch(`${server.url}/health`)).json();
 * ```
 */
export async function startEnvServer(
  env: EnvironmentHandle,
  options: EnvServerOptions = {},
): Promise<EnvServer> {
  const maxConcurrent = options.maxConcurrent ?? 32;
  if (!Number.isInteger(maxConcurrent) || maxConcurrent < 1) {
    throw new RangeError(`maxConcurrent must be an integer ≥ 1, got ${maxConcurrent}`);
  }
  const envId = options.envId ?? env.envId;
  const slots = new Slots(maxConcurrent);
  const requests = new Map<string, AbortController>();
  const allowKeyVars = new Set(options.allowKeyVars ?? []);
  const heartbeatMs = options.heartbeatMs ?? 15_000;
  const closing = new AbortController();
  const encoder = new TextEncoder();
  // One timer for every open stream: each maps to a function that sends a heartbeat when idle.
  const streams = new Set<() => void>();
  let ticker: ReturnType<typeof setInterval> | undefined;
  const watch = (beat: () => void) => {
    streams.add(beat);
    ticker ??= setInterval(
      () => streams.forEach((b) => b()),
      Math.max(10, Math.floor(heartbeatMs / 2)),
    );
  };
  const unwatch = (beat: () => void) => {
    streams.delete(beat);
    if (streams.size === 0 && ticker !== undefined) {
      clearInterval(ticker);
      ticker = undefined;
    }
  };

  function clientFor(config: z.infer<typeof ClientConfigWire>): OpenAIChatClient | Response {
    const resolved: ClientConfig = { ...config };
    if (config.api_key === undefined && config.api_key_var !== undefined) {
      if (!allowKeyVars.has(config.api_key_var)) {
        return json(400, {
          error: `client.api_key_var: "${config.api_key_var}" is not allowed on this server; ` +
            `send client.api_key, or start the server with --allow-key-var ${config.api_key_var}`,
        });
      }
    } else {
      delete resolved.api_key_var; // never read a variable the request did not need
    }
    return new OpenAIChatClient(resolved);
  }

  function rollouts(body: RolloutsRequest): Response {
    const requestId = body.request_id ?? crypto.randomUUID();
    if (requests.has(requestId)) {
      return json(409, { error: `request_id: "${requestId}" is already running` });
    }
    const client = clientFor(body.client);
    if (client instanceof Response) return client;
    const controller = new AbortController();
    const signal = AbortSignal.any([controller.signal, closing.signal]);
    requests.set(requestId, controller);
    const groups = groupByExample(body.inputs as Row[]);
    let open = true;
    let lastWrite = Date.now();
    let beat = () => {};

    const stream = new ReadableStream<Uint8Array>({
      start(sink) {
        const write = (line: RolloutsLine) => {
          if (!open) return;
          lastWrite = Date.now();
          try {
            sink.enqueue(encoder.encode(JSON.stringify(line) + "\n"));
          } catch { /* the client went away; cancel() aborts the rest */ }
        };
        beat = () => {
          if (Date.now() - lastWrite >= heartbeatMs) write({ type: "heartbeat" });
        };
        watch(beat);

        let failure: unknown = null;
        let count = 0;
        const runGroup = async (group: Row[]) => {
          await slots.acquire(signal);
          try {
            const result = await env.runGroupOutputs(group, client, body.model, {
              samplingArgs: body.sampling_args,
              signal,
              independentScoring: body.independent_scoring,
              stateColumns: body.state_columns,
            });
            // Serialise before writing, so a bad state column fails the request, not the stream.
            const line = JSON.stringify({
              type: "group",
              example_id: Number(group[0].example_id),
              outputs: result.outputs,
              retryable: result.retryable,
            }) + "\n";
            signal.throwIfAborted();
            if (open) {
              lastWrite = Date.now();
              sink.enqueue(encoder.encode(line));
            }
            count++;
          } finally {
            slots.release();
          }
        };
        const done = Promise.all(groups.map((group) =>
          runGroup(group).catch((error) => {
            if (failure === null) {
              failure = signal.aborted ? signal.reason : error;
              controller.abort(failure);
            }
          })
        ));
        void done.then(() => {
          unwatch(beat);
          requests.delete(requestId);
          if (failure === null) {
            write({ type: "done", count });
          } else if (failure instanceof Cancelled) {
            write({ type: "error", error: "Cancelled", message: failure.message, cancelled: true });
          } else {
            write({ type: "error", error: errorName(failure), message: errorMessage(failure) });
          }
          if (open) {
            open = false;
            sink.close();
          }
        });
      },
      cancel() {
        // The client disconnected: stop its rollouts.
        open = false;
        unwatch(beat);
        controller.abort(
          new Cancelled(`Request "${requestId}" was cancelled: the client disconnected`),
        );
      },
    });
    return new Response(stream, {
      headers: {
        "content-type": "application/x-ndjson",
        "cache-control": "no-store",
        "vf-request-id": requestId,
      },
    });
  }

  const app = new Hono();
  if (options.token !== undefined) {
    const expected = `Bearer ${options.token}`;
    app.use("*", async (c, next) => {
      if (c.req.path === "/health" || c.req.header("authorization") === expected) {
        return await next();
      }
      return json(401, {
        error: "Missing or wrong token; send Authorization: Bearer <token> (VF_SERVER_TOKEN)",
      });
    });
  }
  app.get("/health", () =>
    json(200, {
      ok: true,
      env_id: envId,
      in_flight: slots.inFlight,
      queued: slots.queued,
      max_concurrent: maxConcurrent,
      requests: requests.size,
      version: VERSION,
    }));
  app.get("/info", async () => {
    const ds = await env.getEvalDataset();
    return json(200, {
      protocol_version: ENV_SERVER_PROTOCOL,
      version: VERSION,
      env_id: envId,
      env_args: env.envArgs,
      sampling_args: env.samplingArgs,
      pass_threshold: env.passThreshold,
      eval_defaults: options.evalDefaults ?? null,
      eval_dataset_size: ds.length,
      max_concurrent: maxConcurrent,
    });
  });
  app.post("/dataset", async (c) => {
    const body = await readBody(c.req.raw, DatasetRequest);
    if (body instanceof Response) return body;
    const ds = await env.getEvalDataset(body.n ?? -1, body.seed ?? null);
    return json(200, { rows: ds.toList() });
  });
  app.post("/rollouts", async (c) => {
    if (closing.signal.aborted) return json(503, { error: "The env server is shutting down" });
    const body = await readBody(c.req.raw, RolloutsRequest);
    if (body instanceof Response) return body;
    return rollouts(body);
  });
  app.post("/cancel", async (c) => {
    const body = await readBody(c.req.raw, CancelRequest);
    if (body instanceof Response) return body;
    const controller = requests.get(body.request_id);
    if (!controller || controller.signal.aborted) return json(200, { cancelled: false });
    controller.abort(new Cancelled(`Request "${body.request_id}" was cancelled`));
    return json(200, { cancelled: true });
  });
  app.notFound((c) => json(404, { error: `No route for ${c.req.method} ${c.req.path}` }));
  app.onError((error) => json(500, { error: `${errorName(error)}: ${errorMessage(error)}` }));

  const listener = await serveHttp(app.fetch, {
    port: options.port,
    hostname: options.hostname,
    tls: options.tls,
  });
  const host = options.hostname ?? "127.0.0.1";
  const urlHost = host.includes(":") ? `[${host}]` : host;
  let closed: Promise<void> | undefined;
  const close = () => {
    closed ??= (async () => {
      closing.abort(new Cancelled("The env server is shutting down"));
      await listener.close();
    })();
    return closed;
  };
  options.signal?.addEventListener("abort", () => void close(), { once: true });
  return {
    url: `${options.tls ? "https" : "http"}://${urlHost}:${listener.port}`,
    port: listener.port,
    get inFlight() {
      return slots.inFlight;
    },
    get queued() {
      return slots.queued;
    },
    close,
    [Symbol.asyncDispose]: close,
  };
}
