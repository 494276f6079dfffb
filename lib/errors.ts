/**
 * The domain errors callers handle. A `VfError` raised inside a rollout is recorded on
 * the rollout's state and the run goes on; anything else is a programmer error.
 * @module
 */

/** Base class of every domain error; keeps the original failure as `cause`. */
export class VfError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
  }
}

/** The model endpoint failed or answered with something unusable. */
export class ModelError extends VfError {}
/** The model answered, but the response is malformed. Retryable. */
export class InvalidModelResponseError extends ModelError {}
/** The model answered with no content, no tool calls and no reasoning. Retryable. */
export class EmptyModelResponseError extends InvalidModelResponseError {}
/** The endpoint rejected the key (HTTP 401/403). Not captured: it ends the run. */
export class AuthenticationError extends ModelError {}
/** The prompt is longer than the model's context; ends the rollout as truncated. */
export class OverlongPromptError extends VfError {}
/** A tool could not be called. */
export class ToolError extends VfError {}
/** Tool-call arguments were not valid JSON (only raised for `stopErrors`). */
export class ToolParseError extends ToolError {}
/** A tool threw (only raised for `stopErrors`). */
export class ToolCallError extends ToolError {}
/** Infrastructure failed: never scored as reward 0, retried in a fresh sandbox. */
export class InfraError extends VfError {}
/** A sandbox could not be created, reached or used. */
export class SandboxError extends InfraError {}
/** A sandbox command ran past its timeout; its process tree was killed. */
export class CommandTimeoutError extends VfError {}
/** A user-written config, dataset or environment module is invalid. */
export class ConfigError extends VfError {}
/** A task hook or harness failed. */
export class TaskError extends VfError {}
/**
 * A judge's replies held no usable verdict, even after its retries (an agentic judge's run
 * gave none): the rollout was not scored (an error, never a 0), and the failure is the
 * judge's (phase `judge`).
 */
export class JudgeVerdictError extends VfError {}
/**
 * An Env's own control flow failed (its `setup`, `run` or `finalize` threw, a timeout of the
 * episode): the episode is recorded as failed, its traces are kept, and nothing in it is
 * scored 0.
 */
export class EnvError extends VfError {}
/**
 * A rubric function threw or returned something that is not a number. The rollout was not
 * really scored: it is recorded as an error and left out of averages and pass@k.
 */
export class RewardError extends VfError {}

/** Which permission a sandboxed environment was denied, and the flag that grants it. */
export interface PermissionDenial {
  /** Deno's name for it: `net`, `read`, `write`, `env`, `run`, ... */
  permission: string;
  /** The host, path or variable asked for. */
  target: string;
  /** The vf flag that grants it, or null where vf never grants it (the Docker socket, run). */
  flag: string | null;
}

/** Sandboxed environment code was denied a permission; recorded as `error.permission_denied`. */
export class PermissionDeniedError extends VfError {
  readonly permission_denied: PermissionDenial;
  constructor(message: string, denial: PermissionDenial, options?: { cause?: unknown }) {
    super(message, options);
    this.permission_denied = denial;
  }
}

/** Errors along the `cause` chain, outermost first. */
export function errorChain(error: unknown): unknown[] {
  const chain: unknown[] = [];
  let current: unknown = error;
  while (current !== undefined && current !== null && chain.length < 20) {
    chain.push(current);
    current = current instanceof Error ? current.cause : undefined;
  }
  return chain;
}

/** Class names along the cause chain joined with ` -> `. */
export function errorChainStr(error: unknown): string {
  return errorChain(error).map((e) => (e instanceof Error ? e.name : typeof e)).join(" -> ");
}

/** `Name(message)` along the cause chain joined with ` -> `. */
export function errorChainRepr(error: unknown): string {
  return errorChain(error)
    .map((e) => (e instanceof Error ? `${e.name}(${JSON.stringify(e.message)})` : String(e)))
    .join(" -> ");
}

/** The serialised form of an error as stored on a rollout. */
export interface SerializedError {
  error: string;
  message: string;
  error_chain_repr: string;
  error_chain_str: string;
  /** Set when a permission denial anywhere along the cause chain was the failure. */
  permission_denied?: PermissionDenial;
}

/** Serialise an error for results.jsonl / traces.jsonl. */
export function serializeError(error: unknown): SerializedError {
  const denied = errorChain(error).find((e) => e instanceof PermissionDeniedError) as
    | PermissionDeniedError
    | undefined;
  return {
    error: error instanceof Error ? error.name : "Error",
    message: error instanceof Error ? error.message : String(error),
    error_chain_repr: errorChainRepr(error),
    error_chain_str: errorChainStr(error),
    ...(denied ? { permission_denied: denied.permission_denied } : {}),
  };
}

/** A short human-readable description, used in logs and summaries. */
export function describeError(error: unknown): string {
  if (error instanceof Error) return `${error.name}: ${error.message}`;
  return String(error);
}
