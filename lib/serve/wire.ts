/**
 * What the env server's two transports (HTTP, `server.ts`; ZeroMQ, `zmq.ts`) and their
 * clients share on the wire: the `run` payload (verifiers' trainer wire, which HTTP's
 * `POST /run` takes too), the errors a request ends with and how a wire spells them, and
 * schema issues as text. Light on purpose: the clients import it without the servers.
 * @module
 */
// deno-lint-ignore no-import-prefix
import { z } from "npm:zod@^4.6.0";
import { ClientSection, describeIssues } from "../config.ts";
import type { SamplingArgs } from "../types.ts";

/** The version of the HTTP request and response shapes; `/info` reports it. */
export const ENV_SERVER_PROTOCOL = 1;

/**
 * The forms of verifiers' ZeroMQ wire, named by the month upstream's serve module took them
 * up (nothing on the wire tells them apart):
 * - `2026-09` (the default): replies are `[request_id, kind, data]`, kind `delta` (a run's
 *   episode as it grows, `delta.ts`) or `reply` (the last frame of every request); `info`.
 * - `2026-08`: replies are `[request_id, data]`, a run's whole episode in its one reply.
 */
export const ZMQ_WIRES = ["2026-09", "2026-08"] as const;
/** One form of the ZeroMQ wire (see {@link ZMQ_WIRES}). */
export type ZmqWire = (typeof ZMQ_WIRES)[number];
/** The form spoken unless asked otherwise. */
export const DEFAULT_ZMQ_WIRE: ZmqWire = "2026-09";

/** A cancelled request's reason: the client cancelled it, went away, or the server is closing. */
export class Cancelled extends Error {
  override name = "Cancelled";
}

/** A request the server cannot take (bad frames, payload, method, or an id already running). */
export class RequestError extends Error {
  override name = "RequestError";
}

/** The model endpoint the server calls for a run (verifiers' `ClientConfig`, snake_case). */
export interface RunClientConfig {
  base_url: string;
  /** The key itself; sent over the wire, so only to a server you trust. */
  api_key?: string;
  /** A variable the server reads the key from (only if it allows it: `--allow-key-var`). */
  api_key_var?: string;
  headers?: Record<string, string>;
  timeout?: number;
  max_retries?: number;
  /** The endpoint's output-token limit: a larger cap in the run's sampling is clamped to it. */
  max_output_tokens?: number;
  /** The endpoint's model takes `reasoning_effort`: a gateway program's thinking is sent. */
  reasoning?: boolean;
}

/** One `run` request, as a client builds it. */
export interface RunRequest {
  /** The task's data (the taskset's TaskData, or a legacy environment's row fields). */
  taskData: Record<string, unknown>;
  client: RunClientConfig;
  model: string;
  sampling?: SamplingArgs;
}

/** `client` of a `run` payload; loose, and nil fields as unset, as verifiers sends them. */
export const RunClientWire = z.looseObject({
  base_url: z.string().regex(/^https?:\/\/\S+$/, "must be an http(s) URL"),
  api_key: z.string().nullish(),
  api_key_var: z.string().nullish(),
  headers: z.record(z.string(), z.string()).nullish(),
  extra_headers: z.record(z.string(), z.string()).nullish(),
  timeout: z.number().positive().nullish(),
  max_retries: z.number().int().min(0).nullish(),
  // As `[client]` and a role's own endpoint take them, checked by the same schema.
  max_output_tokens: ClientSection.shape.max_output_tokens.unwrap().nullish(),
  reasoning: ClientSection.shape.reasoning.unwrap().nullish(),
});

/** The payload of a `run` request. */
export const RunPayload = z.looseObject({
  task_data: z.record(z.string(), z.unknown()),
  client: RunClientWire,
  model: z.string().min(1),
  sampling: z.record(z.string(), z.unknown()).nullish(),
});

/** The payload of a `cancel` request. */
export const CancelPayload = z.looseObject({ request_id: z.string().min(1) });

/** The one formatter of schema issues, which wire input shares with config files. */
export { describeIssues };

/** An error's name (`"Error"` for a thrown non-Error). */
export function errorName(error: unknown): string {
  return error instanceof Error ? error.name : "Error";
}

/** An error's message. */
export function errorMessage(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

/** `"<Type>: <message>"`, the `run` reply's form of an error. */
export function wireError(error: unknown): string {
  if (error instanceof Error) return `${error.name}: ${error.message}`;
  return `Error: ${String(error)}`;
}

/** One line of an HTTP `/rollouts` stream. */
export type RolloutsLine =
  | { type: "group"; example_id: number; outputs: unknown[]; retryable: boolean }
  | { type: "done"; count: number }
  | { type: "error"; error: string; message: string; cancelled?: boolean }
  | { type: "heartbeat" };
