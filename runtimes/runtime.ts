/**
 * The Runtime interface every sandbox backend implements, the plain runtime specs, and
 * {@linkcode createRuntime}, which builds a runtime from a spec.
 *
 * Paths given to `read`, `write`, `archiveOut` and `archiveIn` are sandbox paths: absolute,
 * or relative to the runtime's working directory.
 * @module
 */

import { ConfigError } from "../lib/errors.ts";
import { DockerRuntime } from "./docker/mod.ts";
import { PrimeRuntime, type PrimeRuntimeSpec } from "./prime.ts";
import { SshRuntime, type SshRuntimeSpec } from "./ssh.ts";
import { SubprocessRuntime } from "./subprocess.ts";

export type { PrimeRuntimeSpec, SshRuntimeSpec };

/** Options of {@linkcode Runtime.run}. */
export interface RunOptions {
  /** Extra environment variables, merged over the runtime's. */
  env?: Record<string, string>;
  /** Working directory (a sandbox path); default the runtime's workdir. */
  cwd?: string;
  /** User to run as (name or uid); needs `capabilities.users`. */
  user?: string;
  /** Kill the command's whole process tree and throw `CommandTimeoutError` after this long. */
  timeoutMs?: number;
  /** Written to the command's standard input, which is then closed. */
  stdin?: string | Uint8Array;
  /** Aborting kills the command's process tree and rejects with the signal's reason. */
  signal?: AbortSignal;
}

/** What a command did. A non-zero `exit_code` is a result, not an error. */
export interface RunResult {
  exit_code: number;
  stdout: string;
  stderr: string;
  duration_ms: number;
}

/** Optional abilities, declared as data so callers ask instead of checking `type`. */
export interface RuntimeCapabilities {
  /** A real sandbox: may be used for isolated grading and artifact collection. */
  isolation: boolean;
  /** `RunOptions.user` is honoured. */
  users: boolean;
  /** Network access is off unless the spec asks for it. */
  network_control: boolean;
}

/** A sandbox that runs commands and holds files. Stop it, or `await using` it. */
export interface Runtime extends AsyncDisposable {
  /** `"docker"`, `"subprocess"`, ... */
  readonly type: string;
  /** Container id, temp dir, ...; `""` before start. */
  readonly id: string;
  readonly capabilities: RuntimeCapabilities;
  /** Creates and starts the sandbox. */
  start(options?: { signal?: AbortSignal }): Promise<void>;
  /** Runs `argv` (no shell) and collects its output; a non-zero exit is a result. */
  run(argv: string[], options?: RunOptions): Promise<RunResult>;
  /**
   * Reads a file.
   * @throws {SandboxFileNotFoundError} when it does not exist
   * @throws {SandboxFileTooLargeError} when it is larger than `maxBytes`
   */
  read(path: string, options?: { maxBytes?: number }): Promise<Uint8Array>;
  /** Writes a file, creating its parent directories; `mode` default 0o644. */
  write(path: string, data: string | Uint8Array, options?: { mode?: number }): Promise<void>;
  /** A tar of `path` (file or directory); entries are named from its basename. */
  archiveOut(path: string): Promise<Uint8Array>;
  /** Extracts a tar into `dir`, creating `dir` first. `archiveIn(dirname(p), archiveOut(p))` restores `p`. */
  archiveIn(dir: string, tar: Uint8Array): Promise<void>;
  /** Removes the sandbox. Idempotent. */
  stop(): Promise<void>;
}

/** A Docker container runtime. */
export interface DockerRuntimeSpec {
  type: "docker";
  /** Image reference; pulled through the Engine API when missing. */
  image: string;
  /** CPU limit in cores. */
  cpu?: number;
  /** Memory limit: bytes or `"512m"`, `"2g"`. */
  memory?: string;
  /** Working directory, created at start; default the image's. */
  workdir?: string;
  /** Environment of the container. */
  env?: Record<string, string>;
  /** Network access (bridge); default false (no network). */
  network?: boolean;
  /** Extra container labels. */
  labels?: Record<string, string>;
  /** Default user of commands; default the image's. */
  user?: string;
}

/** A local temp directory and host processes: no isolation, for development. */
export interface SubprocessRuntimeSpec {
  type: "subprocess";
  /** Sandbox path of the working directory inside the temp dir; default `/`. */
  workdir?: string;
  /** Environment added to the scrubbed host environment. */
  env?: Record<string, string>;
}

/** A runtime spec, tagged by `type`. */
export type RuntimeSpec =
  | DockerRuntimeSpec
  | SubprocessRuntimeSpec
  | SshRuntimeSpec
  | PrimeRuntimeSpec;

/** The runtime types {@linkcode createRuntime} knows. */
export const RUNTIME_TYPES = ["docker", "subprocess", "ssh", "prime"] as const;

/**
 * Builds a runtime (not started) from its spec.
 * @param spec the runtime spec
 * @param options.runId run id, put on container labels
 * @param options.task task name or id, put on container labels
 * @throws {ConfigError} for an unknown `type`
 */
export function createRuntime(
  spec: RuntimeSpec,
  options: { runId?: string; task?: string } = {},
): Runtime {
  switch (spec.type) {
    case "docker":
      return new DockerRuntime(spec, options);
    case "subprocess":
      return new SubprocessRuntime(spec, options);
    case "ssh":
      return new SshRuntime(spec, options);
    case "prime":
      return new PrimeRuntime(spec, options);
    default: {
      const type = (spec as { type?: unknown }).type;
      throw new ConfigError(
        `Unknown runtime type "${String(type)}"; known types: ` +
          RUNTIME_TYPES.map((t) => `"${t}"`).join(", "),
      );
    }
  }
}
