/**
 * The env server's HTTP transport: exposes one loaded environment, or a taskset, over HTTP so
 * a trainer or an evaluator on another process or machine can run rollouts with it
 * (`vf serve <env>`, `vf serve <taskset>`). Requests, cancellation and the limit are the
 * env server's core (`core.ts`), which the ZeroMQ transport shares.
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
 * - `POST /run` `{ request_id?, task_data, client, model, sampling? }` → `{ success, error,
 *   episode }`: the ZeroMQ wire's `run` (payload and reply alike) as one JSON exchange: one
 *   episode of the served taskset, or one rollout of the legacy environment on the row
 *   `task_data` maps to. A failed run is `{ success: false, error: "<Type>: <message>" }`
 *   (a cancelled one `"Cancelled: rollout aborted"`); a body that does not fit is a 400.
 * - `POST /cancel` `{ request_id }` → `{ cancelled }`: aborts that request's rollouts or run
 *
 * A taskset serves `/health`, `/info` (`{ protocol_version, version, env_id, kind:
 * "taskset", max_concurrent }`), `/run` and `/cancel`; `/dataset` and `/rollouts` are a
 * legacy environment's.
 *
 * Groups and runs in flight across all requests are bounded by `maxConcurrent`; the rest wait
 * in a queue. A client that disconnects from its stream (or its `/run`) cancels its request.
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
import { serveHttp } from "../model/http_server.ts";
import type { Row } from "../types.ts";
import { VERSION } from "../version.ts";
import { EnvServerCore, type EnvServerTarget } from "./core.ts";
import {
  Cancelled,
  describeIssues,
  ENV_SERVER_PROTOCOL,
  errorMessage,
  errorName,
  RequestError,
  type RolloutsLine,
  RunPayload,
  wireError,
} from "./wire.ts";

export { ENV_SERVER_PROTOCOL, type RolloutsLine };

/** Options of {@link startEnvServer}. */
export interface EnvServerOptions {
  /** Port to listen on; default 0 (a free port). */
  port?: number;
  /** Interface to listen on; default `"127.0.0.1"`. */
  hostname?: string;
  /**
   * Groups and runs at once across all requests; the rest wait. Default 32. Ignored when a
   * core is served (its own limit holds).
   */
  maxConcurrent?: number;
  /** The id reported to clients; default `env.envId` (a runner's `id`). Ignored for a core. */
  envId?: string;
  /** Defaults `vf eval` uses when -n / -r are not given (from the environment module). */
  evalDefaults?: { num_examples?: number; rollouts_per_example?: number } | null;
  /** When set, every route but `/health` needs `Authorization: Bearer <token>`. */
  token?: string;
  /**
   * Variables a request may name in `client.api_key_var` to use this server's key. Default
   * none. Ignored when a core is served.
   */
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
  /** Groups and runs running now. */
  readonly inFlight: number;
  /** Groups and runs waiting for a slot. */
  readonly queued: number;
  /**
   * Cancels every request of its core (streams end with an error line), stops listening,
   * and closes the core when the server made it.
   */
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
  max_output_tokens: z.number().int().positive().optional(),
  reasoning: z.boolean().optional(),
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

/** The body of `POST /run`: the ZeroMQ `run` payload, with the request id the frames carry there. */
const RunRequestBody = RunPayload.extend({
  request_id: z.string().min(1).max(200).optional(),
});

const DatasetRequest = z.strictObject({
  n: z.number().int().optional(),
  seed: z.number().int().nullable().optional(),
});

const CancelRequest = z.strictObject({ request_id: z.string().min(1) });

function json(status: number, body: unknown): Response {
  return new Response(JSON.stringify(body), {
    status,
    headers: { "content-type": "application/json" },
  });
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
 * Serve a legacy environment, or a taskset's episodes, over HTTP until closed.
 *
 * @param served a loaded environment (or any handle `generate` accepts; every request shares
 *   it), an episode runner (`tasksetRunner`: `/run` only), or a core shared with the ZeroMQ
 *   transport
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
  served: EnvServerTarget | EnvServerCore,
  options: EnvServerOptions = {},
): Promise<EnvServer> {
  const owned = !(served instanceof EnvServerCore);
  const core = served instanceof EnvServerCore ? served : new EnvServerCore(served, {
    maxConcurrent: options.maxConcurrent,
    allowKeyVars: options.allowKeyVars,
    envId: options.envId,
  });
  const env = core.environment;
  const heartbeatMs = options.heartbeatMs ?? 15_000;
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
  const tasksetOnly = (path: string) =>
    json(404, {
      error: `Taskset "${core.id}" serves POST /run, not ${path}; ` +
        `/dataset and /rollouts are served for a legacy environment`,
    });

  function clientFor(config: z.infer<typeof ClientConfigWire>): OpenAIChatClient | Response {
    const resolved: ClientConfig = { ...config };
    if (config.api_key === undefined && config.api_key_var !== undefined) {
      if (!core.allowsKeyVar(config.api_key_var)) {
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

  function rollouts(environment: NonNullable<typeof env>, body: RolloutsRequest): Response {
    const requestId = body.request_id ?? crypto.randomUUID();
    if (core.has(requestId)) {
      return json(409, { error: `request_id: "${requestId}" is already running` });
    }
    const client = clientFor(body.client);
    if (client instanceof Response) return client;
    const request = core.open(requestId);
    const signal = request.signal;
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
        const runGroup = (group: Row[]) =>
          core.withSlot(signal, async () => {
            const result = await environment.runGroupOutputs(group, client, body.model, {
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
          });
        const done = Promise.all(groups.map((group) =>
          runGroup(group).catch((error) => {
            if (failure === null) {
              failure = signal.aborted ? signal.reason : error;
              request.abort(failure);
            }
          })
        ));
        void done.then(() => {
          unwatch(beat);
          request.end();
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
        request.abort(
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
      env_id: core.id,
      in_flight: core.inFlight,
      queued: core.queued,
      max_concurrent: core.maxConcurrent,
      requests: core.requests,
      version: VERSION,
    }));
  app.get("/info", async () => {
    if (!env) {
      return json(200, {
        protocol_version: ENV_SERVER_PROTOCOL,
        version: VERSION,
        env_id: core.id,
        kind: "taskset",
        max_concurrent: core.maxConcurrent,
      });
    }
    const ds = await env.getEvalDataset();
    return json(200, {
      protocol_version: ENV_SERVER_PROTOCOL,
      version: VERSION,
      env_id: core.id,
      env_args: env.envArgs,
      sampling_args: env.samplingArgs,
      pass_threshold: env.passThreshold,
      eval_defaults: options.evalDefaults ?? null,
      eval_dataset_size: ds.length,
      max_concurrent: core.maxConcurrent,
    });
  });
  app.post("/dataset", async (c) => {
    if (!env) return tasksetOnly("/dataset");
    const body = await readBody(c.req.raw, DatasetRequest);
    if (body instanceof Response) return body;
    const ds = await env.getEvalDataset(body.n ?? -1, body.seed ?? null);
    return json(200, { rows: ds.toList() });
  });
  app.post("/rollouts", async (c) => {
    if (!env) return tasksetOnly("/rollouts");
    if (core.closing.aborted) return json(503, { error: "The env server is shutting down" });
    const body = await readBody(c.req.raw, RolloutsRequest);
    if (body instanceof Response) return body;
    return rollouts(env, body);
  });
  app.post("/run", async (c) => {
    if (core.closing.aborted) return json(503, { error: "The env server is shutting down" });
    const body = await readBody(c.req.raw, RunRequestBody);
    if (body instanceof Response) return body;
    const { request_id: id, ...payload } = body;
    const requestId = id ?? crypto.randomUUID();
    if (core.has(requestId)) {
      return json(409, { error: `request_id: "${requestId}" is already running` });
    }
    try {
      // A client that goes away cancels its run.
      const episode = await core.run(requestId, payload, { signal: c.req.raw.signal });
      return json(200, { success: true, error: null, episode });
    } catch (error) {
      if (error instanceof RequestError) return json(400, { error: error.message });
      return json(200, { success: false, error: wireError(error) });
    }
  });
  app.post("/cancel", async (c) => {
    const body = await readBody(c.req.raw, CancelRequest);
    if (body instanceof Response) return body;
    const cancelled = core.cancel(
      body.request_id,
      new Cancelled(`Request "${body.request_id}" was cancelled`),
    );
    return json(200, { cancelled });
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
      const stopped = core.cancelAll(new Cancelled("The env server is shutting down"));
      await listener.close();
      await stopped;
      if (owned) await core.close();
    })();
    return closed;
  };
  options.signal?.addEventListener("abort", () => void close(), { once: true });
  return {
    url: `${options.tls ? "https" : "http"}://${urlHost}:${listener.port}`,
    port: listener.port,
    get inFlight() {
      return core.inFlight;
    },
    get queued() {
      return core.queued;
    },
    close,
    [Symbol.asyncDispose]: close,
  };
}
