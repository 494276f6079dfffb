/**
 * The env server's ZeroMQ wire, the one verifiers' trainers (prime-rl) speak: a ROUTER
 * socket (`ROUTER_MANDATORY`, no high-water marks, linger 0) that answers DEALER clients.
 *
 * Frames: a request is `[request_id, method, msgpack(payload)]` (the ROUTER sees the
 * client's identity in front), a reply `[request_id, msgpack(response)]`; request ids are
 * 32 hex digits. Methods:
 * - `health` `{}` → `{ success: true, error: null, in_flight, queued, max_concurrent, … }`
 * - `run` `{ task_data, client, model, sampling }` → `{ success, error, episode }`: one
 *   episode of the served taskset (or legacy environment) on `task_data`, against the
 *   trainer's endpoint `client` (`{ base_url, api_key?, api_key_var?, headers? }`)
 * - `cancel` `{ request_id }` → `{ success: true, cancelled }`: aborts that run, whose own
 *   reply is then `{ success: false, error: "Cancelled: rollout aborted" }`
 *
 * Any failure is replied as `{ success: false, error: "<Type>: <message>" }` and the server
 * goes on serving. Runs in flight are bounded by `maxConcurrent`; the rest wait.
 *
 * Security: as with the HTTP server, a request names the model endpoint the server calls.
 * Bind to loopback (the default) or a trusted network. The server reads no key from its own
 * environment except variables listed in `allowKeyVars`; any other `client.api_key_var` is
 * ignored (the request is sent with no key, as verifiers does when the variable is unset).
 *
 * @example
 * ```ts
 * const server = await startZmqEnvServer(runner, { address: "tcp://127.0.0.1:0" });
 * // a trainer: await ZmqEnvClient.connect(server.address), then client.run({...})
 * await server.close();
 * ```
 * @module
 */
// deno-lint-ignore no-import-prefix
import { z } from "npm:zod@^4.6.0";
import { type ChatClient, type ClientConfig, OpenAIChatClient } from "../model/client.ts";
import { Semaphore } from "../model/limits.ts";
import type { SamplingArgs } from "../types.ts";
import { VERSION } from "../version.ts";
import { frameText, loadZmq, messages, pack, RECEIVE_OPTIONS, unpack, wireError } from "./_zmq.ts";

/** The default bind address, as verifiers uses it. */
export const DEFAULT_ZMQ_ADDRESS = "tcp://127.0.0.1:5000";

/** One `run` request, checked, with its model client built. */
export interface EpisodeRequest {
  /** The task's data as the trainer sent it (the runner checks it against its schema). */
  taskData: Record<string, unknown>;
  client: ChatClient;
  model: string;
  samplingArgs: SamplingArgs;
  /** The request's id (32 hex digits). */
  requestId: string;
}

/** What the server runs a `run` request with: a taskset's episodes or a legacy environment's. */
export interface EpisodeRunner {
  /** The served environment's id, reported by `health`. */
  readonly id: string;
  /**
   * Run one episode; resolve with its record (what vf writes per episode). Throws for a
   * request that cannot run (bad `task_data`); a failed rollout is data on the record.
   */
  run(request: EpisodeRequest, signal: AbortSignal): Promise<Record<string, unknown>>;
  /** Releases what the runner holds (cached envs, shared toolsets). */
  close?(): Promise<void>;
}

/** Options of {@link startZmqEnvServer}. */
export interface ZmqEnvServerOptions {
  /** Where to bind; default `tcp://127.0.0.1:5000`. Port 0 picks a free one. */
  address?: string;
  /** Runs at once; the rest wait in arrival order. Default 32. */
  maxConcurrent?: number;
  /** Variables a request may name in `client.api_key_var` to use this server's key. */
  allowKeyVars?: string[];
  /** Told about replies that could not be delivered (the client went away). Default: warn. */
  onWarning?: (message: string) => void;
  /** Closes the server when aborted. */
  signal?: AbortSignal;
}

/** A running ZeroMQ env server. */
export interface ZmqEnvServer extends AsyncDisposable {
  /** The bound endpoint, e.g. `tcp://127.0.0.1:5000` (the real port when bound to 0). */
  readonly address: string;
  /** Runs going now. */
  readonly inFlight: number;
  /** Runs waiting for a slot. */
  readonly queued: number;
  /** Aborts every run (each replies cancelled), waits for them to wind down, closes the socket. */
  close(): Promise<void>;
}

const ClientWire = z.looseObject({
  base_url: z.string().regex(/^https?:\/\/\S+$/, "must be an http(s) URL"),
  api_key: z.string().nullish(),
  api_key_var: z.string().nullish(),
  headers: z.record(z.string(), z.string()).nullish(),
  extra_headers: z.record(z.string(), z.string()).nullish(),
  timeout: z.number().positive().nullish(),
  max_retries: z.number().int().min(0).nullish(),
});

/** The payload of a `run` request. */
export const RunPayload = z.looseObject({
  task_data: z.record(z.string(), z.unknown()),
  client: ClientWire,
  model: z.string().min(1),
  sampling: z.record(z.string(), z.unknown()).nullish(),
});

const CancelPayload = z.looseObject({ request_id: z.string().min(1) });

/** A request the server cannot take (bad frames, payload or method). */
export class RequestError extends Error {
  override name = "RequestError";
}

/** Issues as `path: message`, joined by `; `. */
function describeIssues(error: z.ZodError): string {
  return error.issues.slice(0, 5).map((issue) => {
    const path = issue.path.join(".");
    return path ? `${path}: ${issue.message}` : issue.message;
  }).join("; ");
}

/** A cancelled run's reason. */
class Cancelled extends Error {
  override name = "Cancelled";
}

/**
 * Serve `runner` over ZeroMQ until closed. Loads the `zeromq` addon on first use.
 *
 * @param runner runs one episode per `run` request (see `tasksetRunner`, `datasetRunner`)
 * @param options address, concurrency and key settings
 * @returns the running server; close it when done
 * @throws {Error} when the address cannot be bound or ZeroMQ cannot be loaded
 * @example
 * ```ts
 * await using server = await startZmqEnvServer(runner, { maxConcurrent: 64 });
 * console.log(server.address);
 * ```
 */
export async function startZmqEnvServer(
  runner: EpisodeRunner,
  options: ZmqEnvServerOptions = {},
): Promise<ZmqEnvServer> {
  const maxConcurrent = options.maxConcurrent ?? 32;
  if (!Number.isInteger(maxConcurrent) || maxConcurrent < 1) {
    throw new RangeError(`maxConcurrent must be an integer ≥ 1, got ${maxConcurrent}`);
  }
  const allowKeyVars = new Set(options.allowKeyVars ?? []);
  const warn = options.onWarning ?? ((m: string) => console.warn(`warning: ${m}`));
  const zmq = await loadZmq();
  const router = new zmq.Router({
    mandatory: true,
    linger: 0,
    sendHighWaterMark: 0,
    receiveHighWaterMark: 0,
    ...RECEIVE_OPTIONS,
  });
  const requested = options.address ?? DEFAULT_ZMQ_ADDRESS;
  try {
    await router.bind(requested);
  } catch (error) {
    router.close();
    throw new Error(
      `Cannot bind the ZeroMQ env server to "${requested}": ${(error as Error).message}; ` +
        `choose another address with --zmq (port 0 picks a free one)`,
      { cause: error },
    );
  }
  const address = router.lastEndpoint ?? requested;
  const slots = new Semaphore(maxConcurrent);
  const runs = new Map<string, AbortController>();
  const handlers = new Set<Promise<void>>();
  const closing = new AbortController();
  let queued = 0;

  // One send at a time: replies of concurrent runs are written in the order they finish.
  let sending = Promise.resolve();
  const reply = (identity: Uint8Array, requestId: Uint8Array, response: unknown) => {
    let frame: Uint8Array;
    try {
      frame = pack(response);
    } catch (error) {
      frame = pack({ success: false, error: `EncodeError: ${(error as Error).message}` });
    }
    sending = sending.then(() => router.send([identity, requestId, frame])).catch((error) => {
      if (!router.closed) {
        warn(`could not reply to request "${frameText(requestId)}": ${error.message}`);
      }
    });
    return sending;
  };

  function clientFor(wire: z.infer<typeof ClientWire>): ChatClient {
    const headers = { ...(wire.headers ?? {}), ...(wire.extra_headers ?? {}) };
    const config: ClientConfig = {
      base_url: wire.base_url,
      ...(wire.api_key && { api_key: wire.api_key }),
      ...(!wire.api_key && wire.api_key_var && allowKeyVars.has(wire.api_key_var) &&
        { api_key_var: wire.api_key_var }),
      ...(wire.timeout && { timeout: wire.timeout }),
      ...(typeof wire.max_retries === "number" && { max_retries: wire.max_retries }),
      ...(Object.keys(headers).length > 0 && { extra_headers: headers }),
    };
    return new OpenAIChatClient(config);
  }

  async function run(requestId: string, raw: unknown): Promise<Record<string, unknown>> {
    const parsed = RunPayload.safeParse(raw);
    if (!parsed.success) throw new RequestError(describeIssues(parsed.error));
    if (runs.has(requestId)) {
      throw new RequestError(`request_id "${requestId}" is already running; send a fresh id`);
    }
    const body = parsed.data;
    const samplingArgs: SamplingArgs = {};
    for (const [k, v] of Object.entries(body.sampling ?? {})) {
      if (v !== null && v !== undefined) samplingArgs[k] = v; // verifiers sends unset fields as nil
    }
    const controller = new AbortController();
    const signal = AbortSignal.any([controller.signal, closing.signal]);
    runs.set(requestId, controller);
    try {
      queued++;
      let release: () => void;
      try {
        release = await slots.acquire({ signal });
      } finally {
        queued--;
      }
      try {
        const episode = await runner.run({
          taskData: body.task_data,
          client: clientFor(body.client),
          model: body.model,
          samplingArgs,
          requestId,
        }, signal);
        signal.throwIfAborted();
        return { success: true, error: null, episode };
      } finally {
        release();
      }
    } catch (error) {
      if (signal.aborted) throw new Cancelled("rollout aborted");
      throw error;
    } finally {
      runs.delete(requestId);
    }
  }

  async function handle(frames: Uint8Array[]): Promise<void> {
    const [identity, requestIdFrame, methodFrame, payloadFrame] = frames;
    if (frames.length !== 4) {
      if (frames.length >= 2) {
        await reply(identity, requestIdFrame, {
          success: false,
          error: `RequestError: Expected 3 frames [request_id, method, payload], got ${
            frames.length - 1
          }`,
        });
      }
      return;
    }
    const requestId = frameText(requestIdFrame);
    const method = frameText(methodFrame);
    let response: Record<string, unknown>;
    try {
      let payload: unknown;
      try {
        payload = payloadFrame.length === 0 ? {} : unpack(payloadFrame);
      } catch (error) {
        throw new RequestError(
          `The payload of "${method}" is not msgpack: ${(error as Error).message}`,
        );
      }
      if (method !== "health" && (payload === null || typeof payload !== "object")) {
        throw new RequestError(`The payload of "${method}" must be a map, got ${typeof payload}`);
      }
      switch (method) {
        case "health":
          response = {
            success: true,
            error: null,
            env_id: runner.id,
            in_flight: slots.held,
            queued,
            max_concurrent: maxConcurrent,
            version: VERSION,
          };
          break;
        case "run":
          response = await run(requestId, payload);
          break;
        case "cancel": {
          const parsed = CancelPayload.safeParse(payload);
          if (!parsed.success) throw new RequestError(describeIssues(parsed.error));
          const controller = runs.get(parsed.data.request_id);
          const cancelled = controller !== undefined && !controller.signal.aborted;
          controller?.abort(new Cancelled("rollout aborted"));
          response = { success: true, error: null, cancelled };
          break;
        }
        default:
          throw new RequestError(
            `Unknown method "${method}"; the env server answers "health", "run" and "cancel"`,
          );
      }
    } catch (error) {
      response = { success: false, error: wireError(error) };
    }
    await reply(identity, requestIdFrame, response);
  }

  const loop = (async () => {
    try {
      for await (const frames of messages(router)) {
        const handler = handle(frames).catch((error) =>
          warn(`request failed outside its handler: ${wireError(error)}`)
        );
        handlers.add(handler);
        void handler.finally(() => handlers.delete(handler));
      }
    } catch (error) {
      if (!router.closed) warn(`the ZeroMQ env server stopped receiving: ${wireError(error)}`);
    }
  })();

  let closed: Promise<void> | undefined;
  const close = () => {
    closed ??= (async () => {
      closing.abort(new Cancelled("rollout aborted: the env server is shutting down"));
      // Runs wind down (their sandboxes stop) and reply before the socket goes.
      while (handlers.size > 0) await Promise.all([...handlers]);
      await sending;
      router.close();
      await loop;
      await runner.close?.();
    })();
    return closed;
  };
  options.signal?.addEventListener("abort", () => void close(), { once: true });
  return {
    address,
    get inFlight() {
      return slots.held;
    },
    get queued() {
      return queued;
    },
    close,
    [Symbol.asyncDispose]: close,
  };
}
