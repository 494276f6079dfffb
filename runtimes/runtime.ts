/**
 * The Runtime interface every sandbox backend implements, and the plain runtime specs.
 *
 * Paths given to `read`, `write`, `archiveOut` and `archiveIn` are sandbox paths: absolute,
 * or relative to the runtime's working directory. Backends implement this interface;
 * `create.ts` builds one from a spec.
 * @module
 */

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

/** Options of {@linkcode Runtime.archiveOut}. */
export interface ArchiveOutOptions {
  /** Refuse an archive whose kept entries pass this many bytes. */
  maxBytes?: number;
  /**
   * Globs of entries to leave out, relative to the archived path, matched at any depth as tar
   * does (`node_modules`, `*.log`, `cache/**`); their bytes are never held.
   */
  exclude?: string[];
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
  /**
   * {@linkcode Runtime.killProcesses} ends every process in the sandbox but the runtime's own
   * (its init and main process, the command channel), so nothing a finished agent left running
   * can act after it. Absent means false.
   */
  kill_processes?: boolean;
}

/**
 * What a runtime of a spec can do, known from the spec alone (`traitsOf` in `config.ts`),
 * before anything starts: callers decide from these, never from `type`. A started runtime's
 * `capabilities` agree with them (`isolation`, `network_control`, `kill_processes`, and
 * `users` where it is not decided by the login).
 */
export interface RuntimeTraits {
  /** A sandbox of its own: may be a fresh, isolated grading sandbox (`capabilities.isolation`). */
  isolation: boolean;
  /**
   * Whether `RunOptions.user` is honoured: always, never, or when the login may switch users
   * (root, or passwordless sudo), which the started runtime's `capabilities.users` tells.
   */
  users: "always" | "never" | "if-privileged";
  /** Network access is off unless the spec asks for it (`capabilities.network_control`). */
  networkControl: boolean;
  /** `killProcesses()` is offered (`capabilities.kill_processes`). */
  killProcesses: boolean;
  /** `snapshot()` is offered: a fork group's members can start from a leader's sandbox. */
  snapshots: boolean;
  /**
   * It can join a network of its own (a rollout's), with the task's services and the gateway
   * relay beside it, each of them a sandbox of the same type.
   */
  ownNetwork: boolean;
  /** It joined such a network (an enclosure's): it is made for one rollout, never pooled. */
  enclosed: boolean;
  /** A network policy (allow/block) can be enforced on it, through the egress proxy. */
  egress: boolean;
  /** Compose services can run beside it. */
  services: boolean;
  /**
   * How a program inside reaches the evaluator's model gateway: through a relay on its own
   * network, on the host's loopback, or not at all.
   */
  gateway: "network" | "loopback" | null;
  /** Its files can be collected as artifacts and copied into another sandbox. */
  artifacts: boolean;
  /**
   * Its sandboxes start from images of the evaluator's Docker engine (`DOCKER_HOST`), so an
   * image vf builds there (a harness's program baked into the task's image) can be started.
   * Absent means false.
   */
  imageBuilds?: boolean;
  /** Its commands run on the evaluator's own host, unconfined. */
  onHost: boolean;
  /** It holds a dedicated host, which serves one sandbox at a time. */
  dedicated: boolean;
  /** What it is, for messages: `"docker runtime"`, `"ssh runtime on a shared host"`. */
  label: string;
}

/**
 * What a task asks of the sandbox a runtime config is turned into (`specOf` in `config.ts`):
 * its fields are the task's, under what the config sets itself.
 */
export interface TaskNeeds {
  /** The task's key, for messages. */
  task: string;
  /** The sandbox's role, put on its labels and named in messages. */
  role: "agent" | "grader";
  /** Whether the task needs a container (`Task.NEEDS_CONTAINER`, or an image). */
  container: boolean;
  /** The task's image, workdir, resources and network access. */
  image?: string;
  workdir?: string;
  resources?: { cpu?: number; memory?: number | string };
  network?: boolean | { allow?: string[]; block?: string[] };
  /** The task's environment, under the config's `env`. */
  env?: Record<string, string>;
  /** Environment over the config's `env` (scoring-only variables). */
  extraEnv?: Record<string, string>;
}

/** A sandbox that runs commands and holds files. Stop it, or `await using` it. */
/** A process kept running in a sandbox, its stdin open (an MCP server over stdio). */
export interface RuntimeProcess {
  /** Writes to its stdin. */
  write(data: Uint8Array): void;
  /** Resolves when it has exited (or its stream was cut). */
  readonly exited: Promise<void>;
  /** Ends it: stdin closed, its process tree killed. Idempotent. */
  kill(): Promise<void>;
}

/** A sandbox's filesystem saved after its setup, for sandboxes that start from it (fork-per-group). */
export interface RuntimeSnapshot {
  /** The image a sandbox of the same spec starts from instead of its own. */
  image: string;
  /** Deletes the snapshot once no sandbox started from it is left. Idempotent. */
  remove(): Promise<void>;
}

export interface Runtime extends AsyncDisposable {
  /** `"docker"`, `"subprocess"`, ... */
  readonly type: string;
  /** Container id, temp dir, ...; `""` before start. */
  readonly id: string;
  readonly capabilities: RuntimeCapabilities;
  /**
   * Creates and starts the sandbox. `onQueue` is told when the start waits for something
   * another sandbox holds (a live slot, a dedicated host) and when it has it, so a caller
   * timing the start can stop its clock meanwhile.
   */
  start(options?: { signal?: AbortSignal; onQueue?: (waiting: boolean) => void }): Promise<void>;
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
  /**
   * A tar of `path` (file or directory); entries are named from its basename.
   * @throws {SandboxFileNotFoundError} when it does not exist
   * @throws {SandboxFileTooLargeError} when the kept entries pass `maxBytes`: checked while the
   *   archive arrives, so no more than about `maxBytes` is ever held
   */
  archiveOut(path: string, options?: ArchiveOutOptions): Promise<Uint8Array>;
  /** Extracts a tar into `dir`, creating `dir` first. `archiveIn(dirname(p), archiveOut(p))` restores `p`. */
  archiveIn(dir: string, tar: Uint8Array): Promise<void>;
  /** Removes the sandbox. Idempotent. */
  stop(): Promise<void>;
  /**
   * Starts `argv` and keeps it running with its stdin open; `onStdout`/`onStderr` get its
   * output as it comes. Runtimes that cannot hold a process open leave this out.
   */
  spawn?(
    argv: string[],
    options: Pick<RunOptions, "env" | "cwd" | "user"> & {
      onStdout: (chunk: Uint8Array) => void;
      onStderr?: (chunk: Uint8Array) => void;
    },
  ): Promise<RuntimeProcess>;
  /**
   * Kills every process in the sandbox except the runtime's own (init, the main process, the
   * command channel's supervisors) and returns once they are gone: what an agent left running
   * (a daemon, a detached exec) cannot act after it. Declared by `capabilities.kill_processes`;
   * runtimes that cannot leave this out.
   */
  killProcesses?(options?: { signal?: AbortSignal }): Promise<void>;
  /**
   * Saves the sandbox's filesystem (not its processes or mounts): a sandbox of the same spec
   * with `image` set to the snapshot's starts where this one is now. Runtimes that cannot
   * leave this out.
   */
  snapshot?(options?: { signal?: AbortSignal }): Promise<RuntimeSnapshot>;
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
  /**
   * A user-defined network to join instead (a rollout's services network): the container
   * reaches what is on it by name, and nothing else unless that network reaches further.
   */
  networkName?: string;
  /** DNS names of the container on `networkName`. */
  aliases?: string[];
  /** More networks the container joins before it starts, each with its DNS names. */
  extraNetworks?: Array<{ name: string; aliases?: string[] }>;
  /** Volumes and bind mounts (a service's Compose `volumes`). */
  mounts?: Array<{ type: "volume" | "bind"; source: string; target: string; readOnly?: boolean }>;
  /**
   * What the container runs: by default `sleep infinity` (a sandbox commands are executed
   * in); `null` runs the image's own entrypoint and command; a list replaces the image's
   * command and keeps its entrypoint, as Compose's `command` does (a service).
   */
  command?: string[] | null;
  /** A health check (a service): `test` as Compose writes it, durations in seconds. */
  healthcheck?: {
    test: string[];
    interval?: number;
    timeout?: number;
    retries?: number;
    startPeriod?: number;
  };
  /** Extra container labels. */
  labels?: Record<string, string>;
  /** Default user of commands; default the image's. */
  user?: string;
  /**
   * Run commands (and small file reads and writes) through one long-lived shell in the
   * sandbox instead of an exec each; default true. Off, or where the image has no `/bin/sh`
   * and writable `/tmp`, every command is an exec of its own.
   */
  execChannel?: boolean;
}

/** A local temp directory and host processes: no isolation, for development. */
export interface SubprocessRuntimeSpec {
  type: "subprocess";
  /** Sandbox path of the working directory inside the temp dir; default `/`. */
  workdir?: string;
  /** Environment added to the scrubbed host environment. */
  env?: Record<string, string>;
}

/** A host reached over SSH. */
export interface SshRuntimeSpec {
  type: "ssh";
  /** Host name or address. */
  host: string;
  /** Default 22. */
  port?: number;
  /** Login user; default the local user name. */
  user?: string;
  /** Private key file (unencrypted; use the agent for encrypted keys). */
  privateKeyPath?: string;
  /** Authenticate through the agent at `SSH_AUTH_SOCK`. */
  agent?: boolean;
  /** known_hosts file; default `~/.ssh/known_hosts`. */
  knownHostsPath?: string;
  /** Accept and record the key of a host known_hosts does not know yet; default false. */
  trustOnFirstUse?: boolean;
  /** Working directory; default a fresh `/tmp/vf-<hex>` per runtime, removed on stop. */
  workdir?: string;
  /** Environment of every command. */
  env?: Record<string, string>;
  /** The host is used by this runtime alone (e.g. a VM made for it); sets `capabilities.isolation`. */
  dedicated?: boolean;
  /** The server's `MaxSessions` (channels per connection); default 10, OpenSSH's default. */
  maxSessions?: number;
  /** Give up connecting after this long; default 20 s. */
  connectTimeoutMs?: number;
  /**
   * OpenSSH client configuration to read for `host` (`HostName`, `User`, `Port`,
   * `IdentityFile`, `UserKnownHostsFile`); default `~/.ssh/config` when it exists, `null` to
   * read none. Fields set in this spec win over the file.
   */
  sshConfigPath?: string | null;
  /**
   * Commands go through long-lived shells on the connection (shared by its sandboxes)
   * instead of a new SSH session each; default true. Off, or where the host's `/bin/sh`
   * cannot run one, every command is an exec of its own.
   */
  execChannel?: boolean;
}

/** A Prime Intellect sandbox reached over SSH. */
export interface PrimeRuntimeSpec {
  type: "prime";
  /** Container image; default `python:3.11-slim`. */
  image?: string;
  /** GPU type, optionally with a count: `"H100_80GB"`, `"A100_80GB:2"`; default none. */
  gpu?: string;
  /** CPU cores; default 1. */
  cpu?: number;
  /** Memory in GB; default 2. */
  memory?: number;
  /** Disk in GB; default 10. */
  disk?: number;
  /** Provider-side lifetime in minutes (1 to 1440); default 60. */
  ttlMinutes?: number;
  /** Extra labels, as `key=value` pairs or plain strings. */
  labels?: Record<string, string> | string[];
  /** A micro-VM instead of a container; default true only with a GPU (see the module notes). */
  vm?: boolean;
  /** Region, e.g. `us`; default the provider's. */
  region?: string;
  /** Team to bill; default `PRIME_TEAM_ID` when set. */
  teamId?: string;
  /** Working directory; default a fresh `/tmp/vf-<hex>`. */
  workdir?: string;
  /** Environment of every command (sent over SSH, not stored on the sandbox). */
  env?: Record<string, string>;
  /** API base URL; default `https://api.primeintellect.ai`. */
  apiBase?: string;
  /** Environment variable holding the API key; default `PRIME_API_KEY`. */
  apiKeyVar?: string;
  /** Give up waiting for the sandbox (and its SSH endpoint) after this long; default 10 min. */
  readyTimeoutMs?: number;
  /** SSH settings; by default an ephemeral key and the session's user. */
  ssh?: {
    user?: string;
    privateKeyPath?: string;
    knownHostsPath?: string;
    trustOnFirstUse?: boolean;
  };
}

/** A pod on a Kubernetes cluster, created through its API server. */
export interface KubernetesRuntimeSpec {
  type: "kubernetes";
  /** Container image. */
  image: string;
  /** Namespace of the pod; default the context's (or the service account's). */
  namespace?: string;
  /** kubeconfig file; default `$KUBECONFIG`, then `~/.kube/config`. */
  kubeconfig?: string;
  /** Context in the kubeconfig; default its `current-context`. */
  context?: string;
  /** Use the pod's service account (vf running in the cluster); default when no kubeconfig exists and `KUBERNETES_SERVICE_HOST` is set. */
  inCluster?: boolean;
  /** CPU cores, requested and limited. */
  cpu?: number;
  /** Memory, requested and limited: bytes or `"512m"`, `"2g"`. */
  memory?: string;
  /** Node labels the pod must be scheduled on. */
  nodeSelector?: Record<string, string>;
  /** Tolerations, as the Pod API spells them. */
  tolerations?: Array<Record<string, unknown>>;
  /** RuntimeClass (e.g. `gvisor`, `kata`). */
  runtimeClassName?: string;
  /** Service account of the pod (its token is never mounted). */
  serviceAccountName?: string;
  imagePullPolicy?: "Always" | "IfNotPresent" | "Never";
  /** Extra pod labels (values are cleaned to the label syntax). */
  labels?: Record<string, string>;
  /** Working directory, created at start; default `/`. */
  workdir?: string;
  /** Environment of the container. */
  env?: Record<string, string>;
  /** Network access; default false: a NetworkPolicy denies the pod all traffic. */
  network?: boolean;
  /** Give up when the pod is not running after this long; default 5 min. */
  startTimeoutMs?: number;
}

/** A runtime spec, tagged by `type`. */
export type RuntimeSpec =
  | DockerRuntimeSpec
  | SubprocessRuntimeSpec
  | SshRuntimeSpec
  | PrimeRuntimeSpec
  | KubernetesRuntimeSpec;
