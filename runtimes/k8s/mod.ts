/**
 * The Kubernetes runtime: one pod per sandbox, created through the API server (no kubectl).
 *
 * - The pod runs `sleep infinity` in a container named `sandbox`, never restarts, is deleted
 *   with no grace period, carries labels `vf.managed=1`, `vf.run_id`, `vf.task`, `vf.pod` and
 *   the creating process in annotations, so `vf cleanup` finds leftovers by label selector.
 * - Commands run over the exec subresource's WebSocket channel protocol, v5 where the server
 *   offers it (stdin can then be closed), else v4 (stdin is then counted into a temp file by
 *   a small shell prefix, since v4 cannot signal its end). A POSIX shell wrapper gives every
 *   `RunOptions` semantic exec lacks: working directory, environment, user (runuser when the
 *   pod runs as root), and the pid that timeouts and aborts kill the process tree of.
 * - Files move as tar (and cat) over exec.
 * - Unless the spec asks for network, a NetworkPolicy selecting only this pod denies all
 *   egress and ingress; it is created before the pod and deleted after it. Enforcement is the
 *   cluster's CNI's: on a cluster whose CNI ignores NetworkPolicy the pod keeps its network.
 * - An image that cannot be pulled (ErrImagePull, ImagePullBackOff) fails the start as a
 *   {@linkcode SandboxImageError}, an infrastructure error, without waiting out the timeout.
 * @module
 */

import { posix } from "node:path";
import { collectTarOutput, excludeMatcher, TarCollector } from "../_tar.ts";
import {
  concatBytes,
  decodeChunks,
  randomHex,
  requireArgv,
  resolveSandboxPath,
  sleep,
  toBytes,
  untilInterrupted,
  within,
} from "../_util.ts";
import {
  SandboxError,
  SandboxFileNotFoundError,
  SandboxFileTooLargeError,
  SandboxImageError,
  SandboxUnavailableError,
  SandboxUnsupportedError,
} from "../errors.ts";
import { defaultLedger, type Ledger, type LiveSandbox, registerCleaner } from "../ledger.ts";
import { keepReason, ownerFromLabels, ownerLabels, type OwnerPolicy } from "../owner.ts";
import type {
  ArchiveOutOptions,
  KubernetesRuntimeSpec,
  RunOptions,
  RunResult,
  Runtime,
  RuntimeCapabilities,
  RuntimeProcess,
} from "../runtime.ts";
import { parseMemory } from "../docker/mod.ts";
import { ENV_NAME, PREPARE, READ_FILE, RUN_WRAPPER, WRITE_FILE } from "../ssh/shell.ts";
import { tarSideExcludes } from "../ssh/runtime.ts";
import { KILL_TREES, SWEEP } from "../_sweep.ts";
import {
  awaitSweep,
  commandTimeout,
  leftoverSelector,
  Lifecycle,
  MANAGED_LABEL,
  missingWorkdir,
  sandboxLabels,
  sweepFailure,
} from "../lifecycle.ts";
import { KubeApiError, KubeClient, type KubeStatus, loadKubeTarget } from "./api.ts";
import type { WebSocketConnection } from "./websocket.ts";

export { KubeApiError, KubeClient, loadKubeTarget } from "./api.ts";
export type { KubeTarget, KubeTargetOptions } from "./api.ts";

/** The sandbox container's name in every pod. */
export const CONTAINER = "sandbox";

const CONTROL = 0x1f;
const V5 = "v5.channel.k8s.io";
/** The most bytes of stdin sent in one WebSocket message. */
const STDIN_CHUNK = 256 * 1024;

/**
 * v4 cannot close stdin: this prefix reads exactly $1 bytes of it into a temp file, then runs
 * the rest of argv with that file as its stdin.
 */
const COUNTED_STDIN =
  `f=$(mktemp) || exit 125; head -c "$1" >"$f"; exec 0<"$f"; rm -f "$f"; shift; exec "$@"`;

/** Label values: at most 63 characters of `[A-Za-z0-9._-]`, alphanumeric at both ends. */
export function labelValue(value: string): string {
  const cleaned = value.replace(/[^A-Za-z0-9._-]+/g, "-").slice(0, 63);
  return cleaned.replace(/^[^A-Za-z0-9]+|[^A-Za-z0-9]+$/g, "");
}

/** Shared clients, one per kubeconfig/context (their connections are kept alive). */
const clients = new Map<string, Promise<KubeClient>>();

function clientFor(spec: KubernetesRuntimeSpec): Promise<KubeClient> {
  const key = JSON.stringify([spec.kubeconfig ?? "", spec.context ?? "", spec.inCluster ?? ""]);
  let client = clients.get(key);
  if (!client) {
    client = loadKubeTarget({
      kubeconfig: spec.kubeconfig,
      context: spec.context,
      inCluster: spec.inCluster,
    }).then((target) => new KubeClient(target));
    client.catch(() => clients.delete(key));
    clients.set(key, client);
  }
  return client;
}

/** Closes the shared API clients' kept-alive connections (tests, and a program's end). */
export async function closeKubeClients(): Promise<void> {
  const all = [...clients.values()];
  clients.clear();
  for (const c of all) (await c.catch(() => undefined))?.close();
}

/** An exec session in progress. */
interface ExecSession {
  /** The exit code; rejects when the session broke without one. */
  done: Promise<number>;
  write(data: Uint8Array): void;
  /** Closes stdin (v5); a no-op on v4. */
  endStdin(): void;
  close(): void;
}

/** Options of {@linkcode KubernetesRuntime}'s constructor besides the spec. */
export interface KubernetesRuntimeOptions {
  runId?: string;
  task?: string;
  /** Ledger; default the process's, `null` for none. */
  ledger?: Ledger | null;
}

/**
 * A Kubernetes pod as a {@linkcode Runtime}.
 *
 * @example
 * ```ts
 * await using rt = new KubernetesRuntime({
 *   type: "kubernetes",
 *   image: "python:3.11-slim",
 *   namespace: "evals",
 *   cpu: 1,
 *   memory: "1g",
 * });
 * await rt.start();
 * const { stdout } = await rt.run(["python3", "-c", "print(6*7)"], { timeoutMs: 10_000 });
 * ```
 */
export class KubernetesRuntime implements Runtime {
  readonly type = "kubernetes";
  readonly capabilities: RuntimeCapabilities = {
    isolation: true,
    users: false,
    network_control: true,
    kill_processes: true,
  };
  readonly spec: KubernetesRuntimeSpec;
  #options: KubernetesRuntimeOptions;
  #client: KubeClient | undefined;
  #namespace = "";
  #name = "";
  #workdir = "/";
  #switch: "runuser" | "sudo" | "none" = "none";
  #life = new Lifecycle(this, "kubernetes");
  #ledger: Ledger | null;
  #created = { pod: false, policy: false };
  /** Process groups of commands still running; the pod's deletion ends them anyway. */
  #groups = new Set<number>();

  constructor(spec: KubernetesRuntimeSpec, options: KubernetesRuntimeOptions = {}) {
    if (!spec.image) throw new TypeError("A kubernetes runtime needs an image");
    for (const name of Object.keys(spec.env ?? {})) {
      if (!ENV_NAME.test(name)) throw new TypeError(`Invalid environment variable name "${name}"`);
    }
    this.spec = spec;
    this.#options = options;
    this.#ledger = options.ledger === undefined ? defaultLedger() : options.ledger;
  }

  /** The pod's name; `""` before start. */
  get id(): string {
    return this.#name;
  }

  /** The namespace the pod lives in; `""` before start. */
  get namespace(): string {
    return this.#namespace;
  }

  get workdir(): string {
    return this.#workdir;
  }

  #label(): string {
    return `pod "${this.#namespace}/${this.#name}"`;
  }

  start(options: { signal?: AbortSignal } = {}): Promise<void> {
    return this.#life.start(
      () => this.#start(options.signal),
      () => this.stop(),
    );
  }

  async #start(signal: AbortSignal | undefined): Promise<void> {
    signal?.throwIfAborted();
    const client = await clientFor(this.spec);
    this.#client = client;
    this.#namespace = this.spec.namespace ?? client.target.namespace;
    this.#workdir = posix.resolve("/", this.spec.workdir ?? "/");
    const name = `vf-${randomHex(6)}`;
    const labels: Record<string, string> = {};
    for (const [k, v] of Object.entries(this.spec.labels ?? {})) labels[k] = labelValue(v);
    Object.assign(labels, sandboxLabels(this.#options, labelValue));
    labels["vf.pod"] = name;
    // The full run id and task (label values are shortened) go in annotations.
    const { [MANAGED_LABEL]: _managed, ...named } = sandboxLabels(this.#options);
    const annotations = { ...ownerLabels(), ...named };
    await this.#record("requested", name, labels);
    this.#name = name;
    const base = `/api/v1/namespaces/${this.#namespace}`;
    if (this.spec.network !== true) {
      await client.request(
        "POST",
        `/apis/networking.k8s.io/v1/namespaces/${this.#namespace}/networkpolicies`,
        {
          apiVersion: "networking.k8s.io/v1",
          kind: "NetworkPolicy",
          metadata: { name, labels, annotations },
          spec: {
            podSelector: { matchLabels: { "vf.pod": name } },
            policyTypes: ["Ingress", "Egress"],
            ingress: [],
            egress: [],
          },
        },
        { signal },
      );
      this.#created.policy = true;
    }
    this.#checkNotStopped();
    const resources: Record<string, string> = {};
    if (this.spec.cpu !== undefined) resources.cpu = String(this.spec.cpu);
    if (this.spec.memory !== undefined) resources.memory = String(parseMemory(this.spec.memory));
    const container: Record<string, unknown> = {
      name: CONTAINER,
      image: this.spec.image,
      command: ["sleep", "infinity"],
      workingDir: this.spec.workdir ? this.#workdir : undefined,
      env: Object.entries(this.spec.env ?? {}).map(([k, v]) => ({ name: k, value: v })),
      ...(Object.keys(resources).length && {
        resources: { requests: resources, limits: resources },
      }),
      ...(this.spec.imagePullPolicy && { imagePullPolicy: this.spec.imagePullPolicy }),
    };
    await client.request("POST", `${base}/pods`, {
      apiVersion: "v1",
      kind: "Pod",
      metadata: { name, labels, annotations },
      spec: {
        containers: [container],
        restartPolicy: "Never",
        terminationGracePeriodSeconds: 0,
        automountServiceAccountToken: false,
        enableServiceLinks: false,
        ...(this.spec.serviceAccountName && { serviceAccountName: this.spec.serviceAccountName }),
        ...(this.spec.nodeSelector && { nodeSelector: this.spec.nodeSelector }),
        ...(this.spec.tolerations && { tolerations: this.spec.tolerations }),
        ...(this.spec.runtimeClassName && { runtimeClassName: this.spec.runtimeClassName }),
      },
    }, { signal });
    this.#created.pod = true;
    await this.#record("created", name);
    await this.#waitRunning(signal);
    this.#checkNotStopped();
    const prepared = await this.#capture(["/bin/sh", "-c", PREPARE, "vf", this.#workdir, "ensure"]);
    if (prepared.code !== 0) {
      throw new SandboxError(
        `Cannot create working directory "${this.#workdir}" in ${this.#label()}: ` +
          (decodeChunks([prepared.stderr]).trim() || `exit ${prepared.code}`),
      );
    }
    const sw = decodeChunks([prepared.stdout]).trim().split(" ")[1];
    this.#switch = sw === "runuser" || sw === "sudo" ? sw : "none";
    this.capabilities.users = this.#switch !== "none";
    this.#checkNotStopped();
  }

  /** Polls the pod until its container runs; pull failures and dead pods end it early. */
  async #waitRunning(signal: AbortSignal | undefined): Promise<void> {
    const deadline = Date.now() + (this.spec.startTimeoutMs ?? 300_000);
    let delay = 100;
    let last = "Pending";
    while (true) {
      signal?.throwIfAborted();
      this.#checkNotStopped();
      const pod = await this.#client!.request<PodObject>(
        "GET",
        `/api/v1/namespaces/${this.#namespace}/pods/${this.#name}`,
        undefined,
        { allow404: true, signal },
      );
      if (!pod) {
        throw new SandboxUnavailableError(`${this.#label()} disappeared while it was starting`);
      }
      const phase = pod.status?.phase ?? "Pending";
      const state = pod.status?.containerStatuses?.find((c) => c.name === CONTAINER)?.state;
      if (phase === "Running" && state?.running) return;
      const waiting = state?.waiting;
      if (
        waiting?.reason && /ErrImagePull|ImagePullBackOff|InvalidImageName/.test(waiting.reason)
      ) {
        throw new SandboxImageError(
          this.spec.image,
          `${this.#label()} cannot pull image "${this.spec.image}" (${waiting.reason}` +
            `${waiting.message ? `: ${waiting.message}` : ""}); check the image name and that ` +
            `the cluster's nodes can reach its registry (imagePullSecrets)`,
        );
      }
      if (
        waiting?.reason && /CreateContainer(Config)?Error|RunContainerError/.test(waiting.reason)
      ) {
        throw new SandboxUnavailableError(
          `${this.#label()} cannot start its container (${waiting.reason}: ${
            waiting.message ?? ""
          })`,
        );
      }
      if (phase === "Failed" || phase === "Succeeded" || state?.terminated) {
        throw new SandboxUnavailableError(
          `${this.#label()} ended while starting (${phase}${
            state?.terminated?.reason ? `, ${state.terminated.reason}` : ""
          })`,
        );
      }
      const unschedulable = pod.status?.conditions?.find((c) =>
        c.type === "PodScheduled" && c.status === "False"
      );
      last = waiting?.reason ?? unschedulable?.message ?? phase;
      if (Date.now() > deadline) {
        throw new SandboxUnavailableError(
          `${this.#label()} did not start within ${
            Math.round((this.spec.startTimeoutMs ?? 300_000) / 1000)
          } s (last: ${last}); raise startTimeoutMs or check the cluster's capacity`,
        );
      }
      await sleep(delay);
      delay = Math.min(1_000, delay * 1.5);
    }
  }

  async #record(event: "requested" | "created" | "stopped", name: string, labels?: object) {
    if (!this.#ledger) return;
    const client = this.#client!;
    await this.#ledger.record({
      event,
      type: "kubernetes",
      key: `${client.target.server}/${this.#namespace}/${name}`,
      id: name,
      run_id: this.#options.runId,
      labels: labels as Record<string, string> | undefined,
      host: event === "requested"
        ? {
          server: client.target.server,
          namespace: this.#namespace,
          kubeconfig: this.spec.kubeconfig,
          context: this.spec.context,
          in_cluster: this.spec.inCluster,
          policy: this.spec.network !== true,
        }
        : undefined,
    });
  }

  #checkNotStopped(): void {
    this.#life.checkNotStopped();
  }

  #requireRunning(): KubeClient {
    return this.#life.require(this.#client, () => `Kubernetes runtime ${this.#label()} is stopped`);
  }

  #resolve(path: string): string {
    return resolveSandboxPath(this.#workdir, path);
  }

  /**
   * Runs `command` over exec. `stdin` bytes are sent and stdin closed; `"open"` keeps it open
   * for {@linkcode ExecSession.write}; undefined attaches none.
   */
  async #exec(
    command: string[],
    io: {
      stdin?: Uint8Array | "open";
      onStdout: (chunk: Uint8Array) => void;
      onStderr: (chunk: Uint8Array) => void;
      signal?: AbortSignal;
    },
  ): Promise<ExecSession> {
    const client = this.#client!;
    const stdin = io.stdin;
    // Bytes over v4 (or before the protocol is known): count them in with the prefix.
    const counted = stdin instanceof Uint8Array && client.execProtocol !== V5;
    const argv = counted
      ? ["/bin/sh", "-c", COUNTED_STDIN, "vf", String(stdin.length), ...command]
      : command;
    let status: KubeStatus | undefined;
    const statusChunks: Uint8Array[] = [];
    let ws: WebSocketConnection;
    try {
      ws = await client.exec(this.#namespace, this.#name, CONTAINER, argv, {
        stdin: stdin !== undefined,
        signal: io.signal,
        onMessage: (data) => {
          if (data.length < 2) return; // the empty frame each stream opens with
          const payload = data.subarray(1);
          if (data[0] === 1) io.onStdout(payload);
          else if (data[0] === 2) io.onStderr(payload);
          else if (data[0] === 3) statusChunks.push(payload.slice());
        },
      });
    } catch (error) {
      if (error instanceof KubeApiError && (error.status === 404 || error.status === 400)) {
        throw new SandboxUnavailableError(
          `${this.#label()} is not running; it was deleted, evicted or ran out of memory`,
          { cause: error },
        );
      }
      throw error;
    }
    const v5 = ws.protocol === V5;
    const send = (channel: number, data: Uint8Array) => {
      for (let i = 0; i < data.length || i === 0; i += STDIN_CHUNK) {
        const part = data.subarray(i, i + STDIN_CHUNK);
        const message = new Uint8Array(part.length + 1);
        message[0] = channel;
        message.set(part, 1);
        ws.send(message);
        if (data.length === 0) break;
      }
    };
    const endStdin = () => {
      if (v5) ws.send(new Uint8Array([255, 0]));
    };
    if (stdin instanceof Uint8Array) {
      if (stdin.length) send(0, stdin);
      if (!counted) endStdin();
    }
    const done = ws.closed.then(() => {
      if (statusChunks.length) {
        try {
          status = JSON.parse(decodeChunks(statusChunks));
        } catch { /* broken status */ }
      }
      if (!status) {
        throw new SandboxUnavailableError(
          `The exec session in ${this.#label()} ended without an exit status; the pod may ` +
            `have been deleted or evicted`,
        );
      }
      if (status.status === "Success") return 0;
      const code = status.details?.causes?.find((c) => c.reason === "ExitCode")?.message;
      if (status.reason === "NonZeroExitCode" && code !== undefined) return Number(code);
      throw new SandboxError(`Exec in ${this.#label()} failed: ${status.message ?? "no message"}`);
    });
    return {
      done,
      write: (data) => send(0, data),
      endStdin,
      close: () => ws.destroy(),
    };
  }

  /** Runs a helper command and collects its output. */
  async #capture(
    command: string[],
    stdin?: Uint8Array,
  ): Promise<{ code: number; stdout: Uint8Array; stderr: Uint8Array }> {
    const out: Uint8Array[] = [];
    const err: Uint8Array[] = [];
    const session = await this.#exec(command, {
      stdin,
      onStdout: (c) => out.push(c),
      onStderr: (c) => err.push(c),
    });
    const code = await session.done;
    return { code, stdout: concatBytes(out), stderr: concatBytes(err) };
  }

  /** The wrapped argv of a command: working directory, user, environment, pid report. */
  #wrap(argv: string[], options: Pick<RunOptions, "env" | "cwd" | "user">): string[] {
    const inner: string[] = [];
    if (options.user !== undefined) {
      if (this.#switch === "none") {
        throw new SandboxUnsupportedError(
          `${this.#label()} cannot run commands as user "${options.user}": its image's user is ` +
            `not root with runuser, nor has passwordless sudo (capabilities.users is false)`,
        );
      }
      inner.push(
        ...(this.#switch === "runuser"
          ? ["runuser", "-u", options.user, "--"]
          : ["sudo", "-n", "-u", options.user, "--"]),
      );
    }
    const env = options.env ?? {};
    for (const name of Object.keys(env)) {
      if (!ENV_NAME.test(name)) throw new TypeError(`Invalid environment variable name "${name}"`);
    }
    const pairs = Object.entries(env).map(([k, v]) => `${k}=${v}`);
    if (pairs.length) inner.push("env", ...pairs);
    inner.push(...argv);
    const cwd = this.#resolve(options.cwd ?? ".");
    return ["/bin/sh", "-c", RUN_WRAPPER, "vf", cwd, ...inner];
  }

  /** Runs `argv` in the pod's container (no shell around it). */
  async run(argv: string[], options: RunOptions = {}): Promise<RunResult> {
    this.#requireRunning();
    requireArgv(argv);
    const { signal, timeoutMs } = options;
    signal?.throwIfAborted();
    const started = performance.now();
    const command = this.#wrap(argv, options);
    const stdout: Uint8Array[] = [];
    const stderr: Uint8Array[] = [];
    const control = new ControlLine((chunk) => stderr.push(chunk));
    const session = await this.#exec(command, {
      stdin: options.stdin === undefined ? undefined : toBytes(options.stdin),
      onStdout: (chunk) => stdout.push(chunk),
      onStderr: (chunk) => control.feed(chunk),
    });
    control.pid.then((p) => p !== undefined && this.#groups.add(p));

    const { outcome, value: exitCode } = await untilInterrupted(session.done, {
      timeoutMs,
      signal,
    });
    if (outcome === "done") control.end();
    const group = await within(control.pid, 5_000);
    if (group !== undefined) this.#groups.delete(group);
    if (outcome !== "done") {
      if (group !== undefined) await this.#killGroups([group]).catch(() => {});
      await within(session.done.catch(() => {}), 2_000);
      session.close();
      if (outcome === "abort") throw signal!.reason;
      throw commandTimeout(argv, timeoutMs, `in ${this.#label()}`);
    }
    if (control.value === "nocwd") {
      throw missingWorkdir(options.cwd ?? this.#workdir, options.cwd, `in ${this.#label()}`);
    }
    return {
      exit_code: exitCode!,
      stdout: decodeChunks(stdout),
      stderr: decodeChunks(stderr),
      duration_ms: Math.round(performance.now() - started),
    };
  }

  async #killGroups(groups: number[]): Promise<void> {
    const session = await this.#exec(["/bin/sh", "-c", KILL_TREES, "vf", ...groups.map(String)], {
      onStdout() {},
      onStderr() {},
    });
    await within(session.done.catch(() => {}), 5_000);
    session.close();
  }

  /**
   * Kills every process in the pod's container but its command (`sleep infinity`, PID 1, or
   * the child of an init there) and the sweep itself (see {@link Runtime.killProcesses}).
   * @throws {SandboxError} when some survive (a process of another user than the container's),
   *   or the image has no `/bin/sh` or `/proc`
   */
  async killProcesses(options: { signal?: AbortSignal } = {}): Promise<void> {
    this.#requireRunning();
    const out: Uint8Array[] = [];
    const err: Uint8Array[] = [];
    const session = await this.#exec(["/bin/sh", "-c", SWEEP, "vf-sweep", "sleep"], {
      onStdout: (chunk) => out.push(chunk),
      onStderr: (chunk) => err.push(chunk),
    });
    const where = `in ${this.#label()}`;
    const exit = await awaitSweep(session.done, {
      where,
      close: () => session.close(),
      signal: options.signal,
    });
    this.#groups.clear();
    const said = decodeChunks(out).trim();
    const failure = await sweepFailure(said, {
      where,
      survivors: " (the container's user may not signal them)",
      cannotRun: () =>
        `the sweep could not run (exit ${exit}: ${
          `${decodeChunks(err)}${said}`.trim().slice(0, 300)
        }); the image needs /bin/sh`,
    });
    if (failure) throw failure;
  }

  /** A process kept running with its stdin open (see {@link Runtime.spawn}). */
  async spawn(
    argv: string[],
    options: Pick<RunOptions, "env" | "cwd" | "user"> & {
      onStdout: (chunk: Uint8Array) => void;
      onStderr?: (chunk: Uint8Array) => void;
    },
  ): Promise<RuntimeProcess> {
    this.#requireRunning();
    requireArgv(argv);
    const control = new ControlLine((chunk) => options.onStderr?.(chunk));
    const session = await this.#exec(this.#wrap(argv, options), {
      stdin: "open",
      onStdout: options.onStdout,
      onStderr: (chunk) => control.feed(chunk),
    });
    const exited = session.done.then(() => {}, () => {}).finally(() => control.end());
    let killed: Promise<void> | undefined;
    return {
      write: (data) => session.write(data),
      exited,
      kill: () =>
        killed ??= (async () => {
          session.endStdin();
          const pid = await within(control.pid, 2_000);
          if (pid !== undefined) await this.#killGroups([pid]).catch(() => {});
          await within(exited, 2_000);
          session.close();
        })(),
    };
  }

  /** Reads a file with `cat` over exec, after checking its size. */
  async read(path: string, options: { maxBytes?: number } = {}): Promise<Uint8Array> {
    this.#requireRunning();
    const target = this.#resolve(path);
    const { maxBytes } = options;
    const { code, stdout, stderr } = await this.#capture([
      "/bin/sh",
      "-c",
      READ_FILE,
      "vf",
      target,
      maxBytes === undefined ? "" : String(maxBytes),
    ]);
    if (code === 0) {
      if (maxBytes !== undefined && stdout.length > maxBytes) {
        throw new SandboxFileTooLargeError(path, stdout.length, maxBytes, this.#label());
      }
      return stdout;
    }
    const said = decodeChunks([stderr]);
    const control = said.startsWith("\x1fvf:") ? said.slice(4).split("\n")[0] : "";
    if (control === "missing") {
      throw new SandboxFileNotFoundError(path, `Path "${path}" does not exist in ${this.#label()}`);
    }
    if (control === "dir") {
      throw new SandboxError(
        `Path "${path}" in ${this.#label()} is a directory; read a file or use archiveOut()`,
      );
    }
    const big = /^big (\d+)$/.exec(control);
    if (big) throw new SandboxFileTooLargeError(path, Number(big[1]), maxBytes!, this.#label());
    throw new SandboxError(`Cannot read "${path}" in ${this.#label()}: ${said.trim()}`);
  }

  /** Writes a file with `cat` over exec, creating parent directories. */
  async write(
    path: string,
    data: string | Uint8Array,
    options: { mode?: number } = {},
  ): Promise<void> {
    this.#requireRunning();
    const target = this.#resolve(path);
    if (target === "/") throw new TypeError(`Cannot write to "${path}": it is the root directory`);
    const mode = (options.mode ?? 0o644).toString(8);
    const { code, stderr } = await this.#capture(
      ["/bin/sh", "-c", WRITE_FILE, "vf", target, mode],
      toBytes(data),
    );
    if (code !== 0) {
      throw new SandboxError(
        `Cannot write "${path}" in ${this.#label()}: ${decodeChunks([stderr]).trim()}`,
      );
    }
  }

  /** A tar of `path` made by the container's `tar`, streamed and bounded as it arrives. */
  async archiveOut(path: string, options: ArchiveOutOptions = {}): Promise<Uint8Array> {
    this.#requireRunning();
    const target = this.#resolve(path);
    const parent = target === "/" ? "/" : posix.dirname(target);
    const name = target === "/" ? "." : posix.basename(target);
    // Exclusions go to tar when it knows --exclude (busybox's may not), so those files are
    // never read; the collector applies every pattern again on arrival either way.
    const pushed = tarSideExcludes(options.exclude ?? [], name);
    const tar = new TarCollector({
      exclude: options.exclude?.length ? excludeMatcher(options.exclude) : undefined,
      maxBytes: options.maxBytes,
      tooLarge: (bytes) =>
        new SandboxFileTooLargeError(path, bytes, options.maxBytes!, this.#label()),
    });
    const script = `[ -e "$1/$2" ] || { printf '\\037vf:missing\\n' >&2; exit 1; }
d="$1" n="$2"; shift 2
case "$(tar --help 2>&1)" in *exclude*) ;; *) set -- ;; esac
exec tar -C "$d" -cf - "$@" "$n"`;
    const { exit: code, stderr: err } = await collectTarOutput(tar, (io) =>
      this.#exec(
        ["/bin/sh", "-c", script, "vf", parent, name, ...pushed.map((p) => `--exclude=${p}`)],
        io,
      ));
    const said = decodeChunks(err);
    if (said.startsWith("\x1fvf:missing")) {
      throw new SandboxFileNotFoundError(path, `Path "${path}" does not exist in ${this.#label()}`);
    }
    if (code !== 0) {
      throw new SandboxError(`tar of "${path}" failed in ${this.#label()}: ${said.trim()}`);
    }
    return tar.finish();
  }

  /** Extracts `tar` into `dir` with the container's `tar`, creating `dir` first. */
  async archiveIn(dir: string, tar: Uint8Array): Promise<void> {
    this.#requireRunning();
    const target = this.#resolve(dir);
    const { code, stderr } = await this.#capture(
      ["/bin/sh", "-c", 'mkdir -p -- "$1" && exec tar -C "$1" -x -o -f -', "vf", target],
      tar,
    );
    if (code !== 0) {
      throw new SandboxError(
        `Extracting into "${dir}" failed in ${this.#label()}: ${decodeChunks([stderr]).trim()}`,
      );
    }
  }

  /** Deletes the pod (no grace period) and its NetworkPolicy. Idempotent. */
  stop(): Promise<void> {
    return this.#life.stop(async () => {
      const client = this.#client;
      if (!client || !this.#name) return;
      const removed = await deletePodAndPolicy(client, this.#namespace, this.#name, {
        pod: this.#created.pod,
        policy: this.#created.policy,
      }).then(() => true, () => false);
      // Not removed (the API went away): the ledger keeps it live for `vf cleanup`.
      if (removed) await this.#record("stopped", this.#name).catch(() => {});
    });
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.stop();
  }
}

/** The wrapper's first stderr line: the command's pid, or `nocwd`. */
class ControlLine {
  readonly pid: Promise<number | undefined>;
  value: string | undefined;
  #report!: (pid: number | undefined) => void;
  #head: Uint8Array | undefined = new Uint8Array(0);

  constructor(readonly onStderr: (chunk: Uint8Array) => void) {
    this.pid = new Promise((resolve) => (this.#report = resolve));
  }

  feed(chunk: Uint8Array): void {
    if (this.#head === undefined) return this.onStderr(chunk);
    const buf = concatBytes([this.#head, chunk]);
    if (buf[0] !== CONTROL) {
      this.#head = undefined;
      this.#report(undefined);
      return this.onStderr(buf);
    }
    const newline = buf.indexOf(10);
    if (newline < 0) {
      this.#head = buf;
      return;
    }
    this.#head = undefined;
    this.value = new TextDecoder().decode(buf.subarray(4, newline)); // after "\x1fvf:"
    const n = Number(this.value);
    this.#report(Number.isInteger(n) && n > 1 ? n : undefined);
    if (newline + 1 < buf.length) this.onStderr(buf.slice(newline + 1));
  }

  /** The stream ended: no control line will come. */
  end(): void {
    this.#report(undefined);
    const head = this.#head;
    this.#head = undefined;
    if (head?.length) this.onStderr(head);
  }
}

interface PodObject {
  metadata?: {
    name?: string;
    labels?: Record<string, string>;
    annotations?: Record<string, string>;
    creationTimestamp?: string;
  };
  status?: {
    phase?: string;
    conditions?: Array<{ type?: string; status?: string; message?: string }>;
    containerStatuses?: Array<{
      name?: string;
      state?: {
        running?: unknown;
        waiting?: { reason?: string; message?: string };
        terminated?: { reason?: string };
      };
    }>;
  };
}

async function deletePodAndPolicy(
  client: KubeClient,
  namespace: string,
  name: string,
  which: { pod: boolean; policy: boolean },
): Promise<void> {
  const options = { allow404: true };
  if (which.pod) {
    await client.request(
      "DELETE",
      `/api/v1/namespaces/${namespace}/pods/${name}?gracePeriodSeconds=0`,
      undefined,
      options,
    );
  }
  if (which.policy) {
    await client.request(
      "DELETE",
      `/apis/networking.k8s.io/v1/namespaces/${namespace}/networkpolicies/${name}`,
      undefined,
      options,
    );
  }
}

/** Which pods {@linkcode cleanupPods} removes. */
export interface KubeCleanupFilter {
  kubeconfig?: string;
  context?: string;
  inCluster?: boolean;
  /** Default the context's namespace. */
  namespace?: string;
  /** Only this run's pods (label `vf.run_id`). */
  runId?: string;
  olderThanMs?: number;
  /** Owner checks as `vf cleanup` does them; default none (remove every match). */
  owners?: OwnerPolicy;
  onKept?: (name: string, reason: string) => void;
}

/**
 * Deletes pods labelled `vf.managed=1` (and their NetworkPolicies) by label selector.
 * Returns the names removed.
 */
export async function cleanupPods(filter: KubeCleanupFilter = {}): Promise<string[]> {
  const client = new KubeClient(
    await loadKubeTarget({
      kubeconfig: filter.kubeconfig,
      context: filter.context,
      inCluster: filter.inCluster,
    }),
  );
  try {
    const namespace = filter.namespace ?? client.target.namespace;
    const selector = leftoverSelector(filter.runId, labelValue);
    const query = `labelSelector=${encodeURIComponent(selector.join(","))}`;
    const cutoff = filter.olderThanMs === undefined ? Infinity : Date.now() - filter.olderThanMs;
    const keep = (item: PodObject) => {
      const created = Date.parse(item.metadata?.creationTimestamp ?? "") || 0;
      if (created > cutoff) return true;
      if (!filter.owners) return false;
      const reason = keepReason(
        ownerFromLabels(item.metadata?.annotations),
        created,
        filter.owners,
      );
      if (reason !== undefined) filter.onKept?.(item.metadata?.name ?? "", reason);
      return reason !== undefined;
    };
    const pods = await client.request<{ items?: PodObject[] }>(
      "GET",
      `/api/v1/namespaces/${namespace}/pods?${query}`,
    );
    const policies = await client.request<{ items?: PodObject[] }>(
      "GET",
      `/apis/networking.k8s.io/v1/namespaces/${namespace}/networkpolicies?${query}`,
    );
    const removed: string[] = [];
    await Promise.all(
      (pods?.items ?? []).filter((p) => !keep(p)).map(async (p) => {
        const name = p.metadata!.name!;
        await deletePodAndPolicy(client, namespace, name, { pod: true, policy: false });
        removed.push(name);
      }),
    );
    const livePods = new Set(
      (pods?.items ?? []).map((p) => p.metadata?.name).filter((n) => !removed.includes(n!)),
    );
    await Promise.all((policies?.items ?? []).map(async (p) => {
      const name = p.metadata?.name;
      if (name && !livePods.has(name)) {
        await deletePodAndPolicy(client, namespace, name, { pod: false, policy: true });
      }
    }));
    return removed;
  } finally {
    client.close();
  }
}

/** Removes the ledger's live pods on the cluster each was created on (`vf cleanup`). */
async function cleanupKubernetesLedger(sandboxes: LiveSandbox[]) {
  const removed: string[] = [];
  const failed: Array<{ key: string; error: string }> = [];
  const clientsByConfig = new Map<string, KubeClient>();
  try {
    for (const sb of sandboxes) {
      const h = (sb.host ?? {}) as Record<string, unknown>;
      try {
        const key = JSON.stringify([h.kubeconfig ?? "", h.context ?? "", h.in_cluster ?? ""]);
        let client = clientsByConfig.get(key);
        if (!client) {
          client = new KubeClient(
            await loadKubeTarget({
              kubeconfig: h.kubeconfig as string | undefined,
              context: h.context as string | undefined,
              inCluster: h.in_cluster as boolean | undefined,
            }),
          );
          clientsByConfig.set(key, client);
        }
        await deletePodAndPolicy(client, String(h.namespace), String(sb.id), {
          pod: true,
          policy: h.policy !== false,
        });
        removed.push(sb.key);
      } catch (error) {
        failed.push({ key: sb.key, error: (error as Error).message });
      }
    }
  } finally {
    for (const c of clientsByConfig.values()) c.close();
  }
  return { removed, failed };
}

registerCleaner("kubernetes", cleanupKubernetesLedger);

export type { KubernetesRuntimeSpec } from "../runtime.ts";
