/**
 * The client side of the env server (`vf serve`): `ServerEnvironment` drives a served
 * environment like a local one, so `generate`/`evaluate` (and `vf eval --server`) run their
 * rollouts in the server's process while the model endpoint stays the caller's choice.
 *
 * The model endpoint's config, with its API key resolved here, travels in each request's
 * body: use it over loopback, a trusted network, or TLS.
 * @module
 */
import {
  type ChatClient,
  type ClientConfig,
  EndpointUnreachableError,
  resolveApiKey,
} from "../model/client.ts";
import { Dataset } from "../data/dataset.ts";
import type { RolloutOptions } from "../legacy/environment.ts";
import { ENV_SERVER_PROTOCOL, type RolloutsLine, type RunRequest } from "./wire.ts";
import {
  AuthenticationError,
  ConfigError,
  InfraError,
  InvalidModelResponseError,
  ModelError,
  VfError,
} from "../errors.ts";
import type { RolloutOutput } from "../state.ts";
import type { Row, SamplingArgs } from "../types.ts";

/** The env server could not be reached, refused a request, or broke off a stream. */
export class EnvServerError extends VfError {}

/** A `run` was replied `success: false`; `message` is the server's `"<Type>: <message>"`. */
export class EnvServerReplyError extends EnvServerError {
  /** The error type the server named (`Cancelled`, `ConfigError`, `RequestError`, …). */
  readonly type: string;

  constructor(error: string) {
    super(error);
    this.type = /^(\w+):/.exec(error)?.[1] ?? "Error";
  }
}

/** Options of {@link ServerEnvironment.connect}. */
export interface ServerEnvironmentOptions {
  /** Sent as `Authorization: Bearer <token>` when the server was started with one. */
  token?: string;
  /** Timeout of the `/info`, `/dataset` and `/cancel` calls in milliseconds; default 30000. */
  timeoutMs?: number;
  signal?: AbortSignal;
}

/** Options of {@link ServerEnvironment.streamRollouts}. */
export interface StreamRolloutsOptions {
  samplingArgs?: SamplingArgs;
  independentScoring?: boolean;
  stateColumns?: string[];
  /** Aborting sends `POST /cancel` and ends the stream with the signal's reason. */
  signal?: AbortSignal;
  /** Default a random UUID. */
  requestId?: string;
}

/** One finished group as streamed back by the server. */
export interface GroupResult {
  example_id: number;
  outputs: RolloutOutput[];
  retryable: boolean;
}

/**
 * Info the server reports about its environment. A taskset's server reports only
 * `protocol_version`, `version`, `env_id`, `kind: "taskset"` and `max_concurrent`.
 */
export interface ServerInfo {
  protocol_version: number;
  version: string;
  env_id: string;
  /** `"taskset"` when the server serves a taskset's episodes (`run` only); absent otherwise. */
  kind?: "taskset";
  env_args: Record<string, unknown>;
  sampling_args: SamplingArgs;
  pass_threshold: number;
  eval_defaults: { num_examples?: number; rollouts_per_example?: number } | null;
  eval_dataset_size: number;
  max_concurrent: number;
}

/** Errors a served rollout may end with that callers tell apart, by name. */
const ERRORS: Record<string, new (message: string) => Error> = {
  AuthenticationError,
  EndpointUnreachableError,
  ConfigError,
  InfraError,
  InvalidModelResponseError,
  ModelError,
  TypeError,
  RangeError,
};

function reason(error: unknown): string {
  const cause = error instanceof Error ? error.cause : undefined;
  if (cause instanceof Error && cause.message) return cause.message;
  return error instanceof Error ? error.message : String(error);
}

/** The endpoint config to forward for `client`, with the API key resolved on this side. */
export function forwardableConfig(client: ChatClient): ClientConfig {
  // Through wrappers (the cost meter, the cache) to the client that holds the endpoint.
  let inner: ChatClient | undefined = client;
  let config: ClientConfig | undefined;
  while (inner && !(config = (inner as { config?: ClientConfig }).config)) {
    inner = (inner as { inner?: ChatClient }).inner;
  }
  if (!config) {
    throw new ConfigError(
      `The model client for "${client.baseUrl}" has no endpoint config to send to the env server; ` +
        `use one OpenAIChatClient (a single -b endpoint, not a registry alias with several replicas)`,
    );
  }
  const { api_key_var: _var, ...rest } = config;
  return { ...rest, api_key: resolveApiKey(config) };
}

/**
 * An environment served by `vf serve`, usable wherever `generate`/`evaluate` take an
 * environment.
 *
 * @example
 * ```ts
 * const env = await ServerEnvironment.connect("http://127.0.0.1:8123");
 * const client = new OpenAIChatClient({ base_url: "http://127.0.0.1:8000/v1" });
 * const { metadata } = await evaluate(env, client, "my-model", { numExamples: 10 });
 * ```
 */
export class ServerEnvironment {
  readonly url: string;
  readonly info: ServerInfo;
  envId: string;
  envArgs: Record<string, unknown>;
  samplingArgs: SamplingArgs;
  passThreshold: number;
  evalDefaults: { num_examples?: number; rollouts_per_example?: number } | null;
  #headers: Record<string, string>;
  #timeoutMs: number;

  private constructor(url: string, info: ServerInfo, options: ServerEnvironmentOptions) {
    this.url = url;
    this.info = info;
    this.envId = info.env_id;
    this.envArgs = info.env_args ?? {};
    this.samplingArgs = info.sampling_args ?? {};
    this.passThreshold = info.pass_threshold ?? 0.5;
    this.evalDefaults = info.eval_defaults ?? null;
    this.#headers = options.token ? { authorization: `Bearer ${options.token}` } : {};
    this.#timeoutMs = options.timeoutMs ?? 30_000;
  }

  /**
   * Connect to an env server and read its `/info`.
   * @throws {EnvServerError} when the server cannot be reached or speaks another protocol
   */
  static async connect(
    url: string,
    options: ServerEnvironmentOptions = {},
  ): Promise<ServerEnvironment> {
    const base = url.replace(/\/+$/, "");
    if (!/^https?:\/\//.test(base)) {
      throw new ConfigError(`Env server URL "${url}" must start with http:// or https://`);
    }
    const probe = new ServerEnvironment(base, { env_id: "" } as ServerInfo, options);
    const info = await probe.#call<ServerInfo>("GET", "/info", undefined, options.signal);
    if (info.protocol_version !== ENV_SERVER_PROTOCOL) {
      throw new EnvServerError(
        `The env server at "${base}" speaks protocol ${info.protocol_version}, this vf speaks ` +
          `${ENV_SERVER_PROTOCOL}; run the same vf version on both sides`,
      );
    }
    return new ServerEnvironment(base, info, options);
  }

  #unreachable(error: unknown): EnvServerError {
    return new EnvServerError(
      `Cannot reach the env server at "${this.url}": ${reason(error)}; ` +
        `check the URL (--server) and that "vf serve" is running`,
      { cause: error },
    );
  }

  async #fetch(path: string, init: RequestInit, signal: AbortSignal): Promise<Response> {
    let res: Response;
    try {
      res = await fetch(`${this.url}${path}`, {
        ...init,
        headers: { "content-type": "application/json", ...this.#headers, ...init.headers },
        signal,
      });
    } catch (error) {
      if (
        signal.aborted &&
        !(signal.reason instanceof DOMException && signal.reason.name === "TimeoutError")
      ) {
        throw signal.reason;
      }
      throw this.#unreachable(error);
    }
    if (!res.ok) {
      const text = await res.text().catch(() => "");
      let message = text.slice(0, 500);
      try {
        message = JSON.parse(text).error ?? message;
      } catch { /* not JSON */ }
      throw new EnvServerError(
        `The env server at "${this.url}" answered ${path} with HTTP ${res.status}: ${message}`,
      );
    }
    return res;
  }

  async #call<T>(method: string, path: string, body?: unknown, outer?: AbortSignal): Promise<T> {
    const timeout = AbortSignal.timeout(this.#timeoutMs);
    const signal = outer ? AbortSignal.any([outer, timeout]) : timeout;
    const res = await this.#fetch(path, {
      method,
      body: body === undefined ? undefined : JSON.stringify(body),
    }, signal);
    try {
      return await res.json() as T;
    } catch (error) {
      throw this.#unreachable(error);
    }
  }

  /** Formatted evaluation rows: a shuffled copy when `seed` is given, then the first `n`. */
  async getEvalDataset(n = -1, seed?: number | null): Promise<Dataset> {
    const { rows } = await this.#call<{ rows: Row[] }>("POST", "/dataset", {
      n,
      seed: seed ?? null,
    });
    return Dataset.fromList(rows);
  }

  /** The server's load: `{ ok, env_id, in_flight, queued, max_concurrent, requests, version }`. */
  async health(signal?: AbortSignal): Promise<Record<string, unknown>> {
    return await this.#call("GET", "/health", undefined, signal);
  }

  /**
   * Run rollouts for `inputs` (one or more groups by `example_id`) on the server, yielding
   * each group as it finishes.
   * @throws {EnvServerError} when the server is unreachable, refuses the request or breaks off
   * @throws the rollout's fatal error (e.g. `AuthenticationError`) when the server reports one
   */
  async *streamRollouts(
    inputs: Row[],
    client: ClientConfig,
    model: string,
    options: StreamRolloutsOptions = {},
  ): AsyncGenerator<GroupResult> {
    const requestId = options.requestId ?? crypto.randomUUID();
    const outer = options.signal;
    outer?.throwIfAborted();
    const controller = new AbortController();
    const onAbort = () => {
      // Tell the server first, so its rollouts stop even if the connection lingers.
      void this.#call("POST", "/cancel", { request_id: requestId }).catch(() => {});
      controller.abort(outer!.reason);
    };
    outer?.addEventListener("abort", onAbort, { once: true });
    let finished = false;
    try {
      const res = await this.#fetch("/rollouts", {
        method: "POST",
        body: JSON.stringify({
          request_id: requestId,
          inputs,
          model,
          client,
          sampling_args: options.samplingArgs ?? {},
          independent_scoring: options.independentScoring ?? false,
          state_columns: options.stateColumns ?? [],
        }),
      }, controller.signal);
      const decoder = new TextDecoder();
      let buffer = "";
      let last: Error | null = null;
      const reader = res.body!.getReader();
      try {
        // Read to the end even after the last line, so the connection can be reused.
        while (true) {
          let chunk: ReadableStreamReadResult<Uint8Array>;
          try {
            chunk = await reader.read();
          } catch (error) {
            if (outer?.aborted) throw outer.reason;
            throw new EnvServerError(
              `The env server at "${this.url}" broke off request "${requestId}": ${reason(error)}`,
              { cause: error },
            );
          }
          if (chunk.done) break;
          buffer += decoder.decode(chunk.value, { stream: true });
          let newline: number;
          while ((newline = buffer.indexOf("\n")) >= 0) {
            const text = buffer.slice(0, newline);
            buffer = buffer.slice(newline + 1);
            if (!text.trim() || finished) continue;
            const line = JSON.parse(text) as RolloutsLine;
            if (line.type === "group") {
              yield {
                example_id: line.example_id,
                outputs: line.outputs as RolloutOutput[],
                retryable: line.retryable,
              };
            } else if (line.type === "done") {
              finished = true;
            } else if (line.type === "error") {
              finished = true;
              const Known = ERRORS[line.error];
              last = Known ? new Known(line.message) : new EnvServerError(
                `The env server at "${this.url}" failed request "${requestId}": ${line.error}: ${line.message}`,
              );
            }
          }
        }
      } finally {
        reader.releaseLock();
      }
      if (outer?.aborted) throw outer.reason;
      if (last) throw last;
      if (finished) return;
      throw new EnvServerError(
        `The env server at "${this.url}" ended request "${requestId}" before it finished; it may have restarted`,
      );
    } finally {
      outer?.removeEventListener("abort", onAbort);
      // Leaving early (a consumer's break or an error) must not leave rollouts running.
      if (!finished && !controller.signal.aborted) {
        void this.#call("POST", "/cancel", { request_id: requestId }).catch(() => {});
        controller.abort(new EnvServerError("The stream was closed by the caller"));
      }
    }
  }

  /**
   * Run one episode on the server (`POST /run`): of the served taskset, or one rollout of the
   * legacy environment on the row `taskData` maps to. Aborting `signal` sends `/cancel` for
   * it; the run then rejects with the server's `Cancelled` error.
   *
   * @param request the task data, the model endpoint the server calls, model and sampling
   * @param options `signal` cancels the run; `requestId` (default a random UUID) names it
   *   for `/cancel`
   * @returns the episode record (for a legacy environment, its one trace is the rollout's
   *   results row)
   * @throws {EnvServerReplyError} when the server replies `success: false`
   * @throws {EnvServerError} when the server is unreachable or refuses the request
   * @example
   * ```ts
   * const env = await ServerEnvironment.connect("http://127.0.0.1:8123");
   * const episode = await env.run({
   *   taskData: { prompt: "Say hi", expected: "hi" },
   *   client: { base_url: "http://127.0.0.1:8000/v1" },
   *   model: "my-policy",
   * });
   * ```
   */
  async run<E = Record<string, unknown>>(
    request: RunRequest,
    options: { signal?: AbortSignal; requestId?: string } = {},
  ): Promise<E> {
    const outer = options.signal;
    outer?.throwIfAborted();
    const requestId = options.requestId ?? crypto.randomUUID();
    const onAbort = () =>
      void this.#call("POST", "/cancel", { request_id: requestId }).catch(() => {});
    outer?.addEventListener("abort", onAbort, { once: true });
    try {
      // No timeout: an episode takes as long as it takes; cancelling is the signal's.
      const res = await this.#fetch("/run", {
        method: "POST",
        body: JSON.stringify({
          request_id: requestId,
          task_data: request.taskData,
          client: request.client,
          model: request.model,
          sampling: request.sampling ?? {},
        }),
      }, new AbortController().signal);
      let reply: { success?: boolean; error?: unknown; episode?: unknown };
      try {
        reply = await res.json();
      } catch (error) {
        throw this.#unreachable(error);
      }
      if (reply.success !== true) {
        throw new EnvServerReplyError(String(reply.error ?? "Error: run failed"));
      }
      return reply.episode as E;
    } finally {
      outer?.removeEventListener("abort", onAbort);
    }
  }

  /** Run one group on the server: what `generate` calls. */
  async runGroupOutputs(
    inputs: Row[],
    client: ChatClient,
    model: string,
    options: RolloutOptions & { independentScoring?: boolean; stateColumns?: string[] } = {},
  ): Promise<{ outputs: RolloutOutput[]; retryable: boolean }> {
    const outputs: RolloutOutput[] = [];
    let retryable = false;
    for await (
      const group of this.streamRollouts(inputs, forwardableConfig(client), model, {
        samplingArgs: options.samplingArgs,
        independentScoring: options.independentScoring,
        stateColumns: options.stateColumns,
        signal: options.signal,
      })
    ) {
      outputs.push(...group.outputs);
      retryable ||= group.retryable;
    }
    return { outputs, retryable };
  }

  /** Settings are applied where the environment is loaded: on `vf serve`. */
  setKwargs(_kwargs: Record<string, unknown>): void {
    throw new ConfigError(
      "--extra-env-kwargs and --timeout apply where the environment is loaded; pass them to vf serve",
    );
  }

  /** Nothing to release: the server owns the environment. */
  async teardown(): Promise<void> {}
}
