/**
 * The env server's core, under both transports (HTTP: `server.ts`, ZeroMQ: `zmq.ts`): what
 * is served, the requests running (their ids and cancellation), the one limit on work in
 * flight, and the `run` request itself. A core serves a legacy environment (its groups and
 * rows for HTTP's `/rollouts` and `/dataset`, and one rollout per `run` through
 * `datasetRunner`) or a taskset's episodes (`tasksetRunner`: `run` only). One core can sit
 * under both transports at once, so `-c` bounds the work of both.
 *
 * @example
 * ```ts
 * await using core = new EnvServerCore(env, { maxConcurrent: 16 });
 * const http = await startEnvServer(core, { port: 8123 });
 * const zmq = await startZmqEnvServer(core, { address: "tcp://127.0.0.1:5000" });
 * ```
 * @module
 */
import { type ChatClient, type ClientConfig, OpenAIChatClient } from "../model/client.ts";
import type { EnvironmentHandle } from "../eval/evaluate.ts";
import type { Message, Messages, Response, SamplingArgs } from "../types.ts";
import { datasetRunner, type EpisodeRunner } from "./episode_runner.ts";
import { Cancelled, describeIssues, RequestError, RunPayload } from "./wire.ts";
// deno-lint-ignore no-import-prefix
import type { z } from "npm:zod@^4.6.0";

/** Counts work in flight and hands out slots first come, first served. */
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

/** What a core serves: a legacy environment, or a runner of episodes (a taskset's). */
export type EnvServerTarget =
  | EnvironmentHandle & {
    systemPrompt?: string | null;
    fewShot?: Message[] | null;
  }
  | EpisodeRunner;

/** Options of {@link EnvServerCore}. */
export interface EnvServerCoreOptions {
  /** Groups (HTTP `/rollouts`) and runs (`run`) at once across all requests; default 32. */
  maxConcurrent?: number;
  /** Variables a request may name in `client.api_key_var` to use this server's key. */
  allowKeyVars?: string[];
  /** The id reported to clients; default the environment's `envId` or the runner's `id`. */
  envId?: string;
}

/** Told about a run's model calls as they go: what {@link EnvServerCore.run} streams from. */
export interface ModelCallObserver {
  /** A request is about to go out with `prompt`, for the rollout whose trace id is `session`. */
  request(prompt: Messages, session?: string): void;
  /** Its reply landed (epoch seconds). */
  commit(prompt: Messages, response: Response, started: number, ended: number): void;
  /** The run's task was built: its key and hash (before any model call). */
  task?(task: { key: string; hash: string }): void;
}

/** `client` watched by `observer`: each call reported as it goes out and as it lands. */
function observed(client: ChatClient, observer: ModelCallObserver): ChatClient {
  const wrapped: ChatClient & { readonly config?: Readonly<ClientConfig> } = {
    get baseUrl() {
      return client.baseUrl;
    },
    get headersFromState() {
      return client.headersFromState;
    },
    // The endpoint's config, for code that forwards it (the model gateway).
    get config() {
      return (client as { config?: Readonly<ClientConfig> }).config;
    },
    async getResponse(prompt, model, options) {
      const started = Date.now() / 1000;
      observer.request(prompt, options?.session?.traceId);
      const response = await client.getResponse(prompt, model, options);
      observer.commit(prompt, response, started, Date.now() / 1000);
      return response;
    },
  };
  return wrapped;
}

/** One request the core is running. */
export interface ServerRequest {
  readonly id: string;
  /** Aborts when the request is cancelled or the core shuts down. */
  readonly signal: AbortSignal;
  /** Abort this request's work with `reason` (the first reason wins). */
  abort(reason: unknown): void;
  /** The request is over: its id is free again. Idempotent. */
  end(): void;
}

/**
 * The requests, limit and runner of one served environment or taskset, shared by the
 * transports over it.
 */
export class EnvServerCore implements AsyncDisposable {
  /** The id reported to clients. */
  readonly id: string;
  /** The legacy environment served, or null for a taskset (which serves `run` only). */
  readonly environment: EnvironmentHandle | null;
  /** What a `run` request runs. */
  readonly runner: EpisodeRunner;
  readonly maxConcurrent: number;
  #slots: Slots;
  #allowKeyVars: Set<string>;
  #requests = new Map<string, AbortController>();
  #closing = new AbortController();
  #drained: PromiseWithResolvers<void> | null = null;
  #closed: Promise<void> | undefined;

  /**
   * @param served a loaded legacy environment, or an episode runner (`tasksetRunner`)
   * @param options the limit, the key variables requests may name, and the id
   * @throws {RangeError} when `maxConcurrent` is not an integer ≥ 1
   */
  constructor(served: EnvServerTarget, options: EnvServerCoreOptions = {}) {
    const maxConcurrent = options.maxConcurrent ?? 32;
    if (!Number.isInteger(maxConcurrent) || maxConcurrent < 1) {
      throw new RangeError(`maxConcurrent must be an integer ≥ 1, got ${maxConcurrent}`);
    }
    this.maxConcurrent = maxConcurrent;
    this.#slots = new Slots(maxConcurrent);
    this.#allowKeyVars = new Set(options.allowKeyVars ?? []);
    if (typeof (served as EnvironmentHandle).runGroupOutputs === "function") {
      const env = served as EnvironmentHandle;
      this.environment = env;
      this.id = options.envId ?? env.envId;
      this.runner = datasetRunner(env, { envId: this.id });
    } else {
      this.environment = null;
      this.runner = served as EpisodeRunner;
      this.id = options.envId ?? this.runner.id;
    }
  }

  /** Groups and runs holding a slot now. */
  get inFlight(): number {
    return this.#slots.inFlight;
  }

  /** Groups and runs waiting for a slot. */
  get queued(): number {
    return this.#slots.queued;
  }

  /** Requests running now. */
  get requests(): number {
    return this.#requests.size;
  }

  /** Aborted once the core shuts down: no new work is taken. */
  get closing(): AbortSignal {
    return this.#closing.signal;
  }

  /** Whether a request may name `name` in `client.api_key_var`. */
  allowsKeyVar(name: string): boolean {
    return this.#allowKeyVars.has(name);
  }

  /** Whether request `id` is running. */
  has(id: string): boolean {
    return this.#requests.has(id);
  }

  /**
   * Start request `id`: its signal aborts when it is cancelled or the core shuts down.
   * @throws {RequestError} when a request of that id is running
   */
  open(id: string): ServerRequest {
    if (this.#requests.has(id)) {
      throw new RequestError(`request_id "${id}" is already running; send a fresh id`);
    }
    const controller = new AbortController();
    this.#requests.set(id, controller);
    let ended = false;
    return {
      id,
      signal: AbortSignal.any([controller.signal, this.#closing.signal]),
      abort: (reason) => controller.abort(reason),
      end: () => {
        if (ended) return;
        ended = true;
        this.#requests.delete(id);
        if (this.#requests.size === 0) this.#drained?.resolve();
      },
    };
  }

  /**
   * Cancel request `id` with `reason`.
   * @returns whether it was running (and not cancelled already)
   */
  cancel(id: string, reason: Cancelled): boolean {
    const controller = this.#requests.get(id);
    if (!controller || controller.signal.aborted) return false;
    controller.abort(reason);
    return true;
  }

  /** Run `work` in one of the limit's slots, waiting for one in arrival order. */
  async withSlot<T>(signal: AbortSignal, work: () => Promise<T>): Promise<T> {
    await this.#slots.acquire(signal);
    try {
      return await work();
    } finally {
      this.#slots.release();
    }
  }

  /**
   * The model client of a `run` request's `client`, keys read only from allowed variables.
   * Its calls carry `X-Session-ID: <trace id>`, as verifiers' served rollouts' calls do.
   */
  #runClient(wire: z.infer<typeof RunPayload>["client"]): ChatClient {
    const headers = { ...(wire.headers ?? {}), ...(wire.extra_headers ?? {}) };
    const config: ClientConfig = {
      base_url: wire.base_url,
      session_header: true,
      ...(wire.api_key && { api_key: wire.api_key }),
      ...(!wire.api_key && wire.api_key_var && this.#allowKeyVars.has(wire.api_key_var) &&
        { api_key_var: wire.api_key_var }),
      ...(wire.timeout && { timeout: wire.timeout }),
      ...(typeof wire.max_retries === "number" && { max_retries: wire.max_retries }),
      ...(Object.keys(headers).length > 0 && { extra_headers: headers }),
      ...(typeof wire.max_output_tokens === "number" &&
        { max_output_tokens: wire.max_output_tokens }),
      ...(typeof wire.reasoning === "boolean" && { reasoning: wire.reasoning }),
    };
    return new OpenAIChatClient(config);
  }

  /**
   * Run one `run` request (`{ task_data, client, model, sampling }`): one episode of the
   * served taskset, or one rollout of the legacy environment, in a slot.
   *
   * @param id the request's id, for `cancel`
   * @param payload the request's payload as decoded from the wire
   * @param options `signal`: aborting it cancels the run (a client that went away);
   *   `observer`: told about each model call of the run as it goes
   * @returns the episode record
   * @throws {RequestError} for a payload that does not fit, or an id already running
   * @throws {Cancelled} `rollout aborted` when the run was cancelled or the core shut down
   * @throws what the runner throws for task data it cannot run (a `ConfigError`)
   */
  async run(
    id: string,
    payload: unknown,
    options: { signal?: AbortSignal; observer?: ModelCallObserver } = {},
  ): Promise<Record<string, unknown>> {
    const parsed = RunPayload.safeParse(payload);
    if (!parsed.success) throw new RequestError(describeIssues(parsed.error));
    const body = parsed.data;
    const samplingArgs: SamplingArgs = {};
    for (const [k, v] of Object.entries(body.sampling ?? {})) {
      if (v !== null && v !== undefined) samplingArgs[k] = v; // verifiers sends unset fields as nil
    }
    const request = this.open(id);
    const onAbort = () => request.abort(new Cancelled("rollout aborted"));
    options.signal?.addEventListener("abort", onAbort, { once: true });
    try {
      const episode = await this.withSlot(request.signal, () =>
        this.runner.run({
          taskData: body.task_data,
          client: options.observer
            ? observed(this.#runClient(body.client), options.observer)
            : this.#runClient(body.client),
          model: body.model,
          samplingArgs,
          requestId: id,
          ...(options.observer?.task && { onTask: options.observer.task.bind(options.observer) }),
        }, request.signal));
      request.signal.throwIfAborted();
      return episode;
    } catch (error) {
      if (request.signal.aborted) throw new Cancelled("rollout aborted");
      throw error;
    } finally {
      options.signal?.removeEventListener("abort", onAbort);
      request.end();
    }
  }

  /**
   * Cancel every request with `reason` and wait until each has ended; new work is refused
   * from now on.
   */
  async cancelAll(reason: Cancelled): Promise<void> {
    if (!this.#closing.signal.aborted) this.#closing.abort(reason);
    if (this.#requests.size === 0) return;
    this.#drained ??= Promise.withResolvers<void>();
    await this.#drained.promise;
  }

  /** Cancel every request, wait for them, then release what the runner holds. Idempotent. */
  close(): Promise<void> {
    this.#closed ??= (async () => {
      await this.cancelAll(new Cancelled("The env server is shutting down"));
      await this.runner.close?.();
    })();
    return this.#closed;
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}
