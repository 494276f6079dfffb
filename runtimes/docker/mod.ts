/**
 * The Docker runtime: one container per sandbox, driven through the Engine API
 * ({@linkcode DockerEngine}); never the docker CLI.
 *
 * The container runs `sleep infinity` under Docker's init, with no network unless asked,
 * and labels `vf.managed=1`, `vf.run_id`, `vf.task` so {@linkcode cleanupContainers} can
 * remove leftovers. Commands run as execs; files move through the archive endpoints.
 * @module
 */

import { posix } from "node:path";
import { excludeMatcher, packTar, readTar, TarCollector, type TarEntry } from "../_tar.ts";
import {
  concatBytes,
  decodeChunks,
  describeArgv,
  envList,
  randomHex,
  requireArgv,
  resolveSandboxPath,
  sleep,
  toBytes,
  untilInterrupted,
  within,
} from "../_util.ts";
import {
  SandboxApiError,
  SandboxError,
  SandboxFileNotFoundError,
  SandboxFileTooLargeError,
  SandboxStateError,
  SandboxUnavailableError,
  SandboxUnsupportedError,
} from "../errors.ts";
import { defaultLedger, type Ledger, registerCleaner } from "../ledger.ts";
import { keepReason, ownerFromLabels, ownerLabels, type OwnerPolicy } from "../owner.ts";
import type {
  ArchiveOutOptions,
  DockerRuntimeSpec,
  RunOptions,
  RunResult,
  Runtime,
  RuntimeCapabilities,
  RuntimeProcess,
  RuntimeSnapshot,
} from "../runtime.ts";
import { DockerEngine, isDirectoryMode } from "./engine_api.ts";
import { ExecChannel, runCommand, type SupervisorLauncher, TAR_FAILED } from "../_channel.ts";
import { KILL_BELOW, KILL_TREES, SWEEP } from "../_sweep.ts";
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

export { DockerEngine } from "./engine_api.ts";

/** Label every vf container carries. */
export { MANAGED_LABEL };
/** Room for tar framing (headers, padding, end blocks, record padding) above a byte limit. */
const TAR_SLACK = 64 * 1024;

/** Label of the images {@linkcode DockerRuntime.snapshot} commits. */
export const FORK_LABEL = "vf.fork";
const FORK_REPO = "vf-fork";

/**
 * Guarded commands run under this wrapper: it reports the shell's pid on stderr's first line
 * and execs the command, so the pid is the command's. Exec'd processes are session and
 * process-group leaders (runc calls setsid), so the pid is also the group to kill.
 */
const PID_WRAPPER = 'echo $$ >&2; exec "$@"';

/**
 * Takes the PID wrapper's first stderr line (the command's pid, for killing its process
 * tree) off a command's stderr and passes the rest on. Inactive, it passes everything on.
 */
class PidLine {
  readonly pid: Promise<number | undefined>;
  #report!: (pid: number | undefined) => void;
  #head: Uint8Array | undefined;

  constructor(active: boolean, readonly onStderr: (chunk: Uint8Array) => void) {
    this.pid = new Promise((resolve) => (this.#report = resolve));
    this.#head = active ? new Uint8Array(0) : undefined;
  }

  feed(chunk: Uint8Array): void {
    if (this.#head === undefined) return this.onStderr(chunk);
    const buf = concatBytes([this.#head, chunk]);
    const newline = buf.indexOf(10);
    if (newline < 0) {
      this.#head = buf;
      return;
    }
    this.#head = undefined;
    const value = Number(new TextDecoder().decode(buf.subarray(0, newline)));
    this.#report(Number.isInteger(value) && value > 1 ? value : undefined);
    if (newline + 1 < buf.length) this.onStderr(buf.slice(newline + 1));
  }

  /**
   * The stream ended: no pid will come. Returns what arrived without the newline (the
   * command's own output, when the wrapper never ran), if anything.
   */
  unfinished(): Uint8Array | undefined {
    this.#report(undefined);
    const head = this.#head;
    this.#head = undefined;
    return head?.length ? head : undefined;
  }
}

/** Supervisors of the command channel as attached execs in the container. */
function execLauncher(engine: DockerEngine, containerId: string): SupervisorLauncher {
  return async (script, args, io) => {
    let execId: string;
    try {
      execId = await engine.createExec(containerId, {
        Cmd: ["/bin/sh", "-c", script, "sh", ...args],
        AttachStdin: true,
        AttachStdout: true,
        AttachStderr: true,
        Tty: false,
      });
    } catch {
      return null;
    }
    return await engine.startExec(execId, io, { stdin: "open" });
  };
}

/** Parses `"512m"`, `"2g"`, `"1024k"`, `"1.5g"` or a byte count. */
export function parseMemory(value: string): number {
  const match = /^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$/i.exec(value);
  if (!match) {
    throw new RangeError(`Invalid memory size "${value}"; use bytes or a size like "512m" or "2g"`);
  }
  const power = { "": 0, k: 1, m: 2, g: 3, t: 4 }[match[2].toLowerCase() as "" | "k"]!;
  return Math.floor(Number(match[1]) * 1024 ** power);
}

/** Options of {@linkcode DockerRuntime}'s constructor besides the spec. */
export interface DockerRuntimeOptions {
  /** Run id for the `vf.run_id` label. */
  runId?: string;
  /** Task name or id for the `vf.task` label. */
  task?: string;
  /** Engine client; default {@linkcode DockerEngine.shared}. */
  engine?: DockerEngine;
  /**
   * The sandbox ledger the container is recorded in before it is requested; default the
   * process's (`VF_LEDGER`), `null` for none.
   */
  ledger?: Ledger | null;
}

/**
 * What podman's service writes instead of an exec's output when its attach to a short-lived
 * exec loses the race with the process's exit (containers/podman#3302, #11446).
 */
const PODMAN_ATTACH_LOST =
  /^Error: read unixpacket [^\n]*attach: read: connection reset by peer\n?$/;

/** A Docker container as a {@linkcode Runtime}. */
export class DockerRuntime implements Runtime {
  readonly type = "docker";
  readonly capabilities: RuntimeCapabilities;
  readonly spec: DockerRuntimeSpec;
  #options: DockerRuntimeOptions;
  #id = "";
  #name = "";
  #workdir = "/";
  #life = new Lifecycle(this, "docker");
  #ledger: Ledger | null;
  #recorded = false;
  #labels: Record<string, string> = {};
  /** The persistent command channel; null when it is off, cannot run, or not open yet. */
  #channel: ExecChannel | null = null;
  #channelOpening: Promise<void> | undefined;

  constructor(spec: DockerRuntimeSpec, options: DockerRuntimeOptions = {}) {
    if (!spec.image) throw new TypeError("A docker runtime needs an image");
    this.spec = spec;
    // A sweep spares the container's command only when it is vf's own `sleep infinity`.
    this.capabilities = {
      isolation: true,
      users: true,
      network_control: true,
      kill_processes: spec.command === undefined,
    };
    this.#options = options;
    this.#ledger = options.ledger === undefined ? defaultLedger() : options.ledger;
  }

  /** Looked up per call, so closing the shared client never strands a live runtime. */
  get #engine(): DockerEngine {
    return this.#options.engine ?? DockerEngine.shared();
  }

  /** Container id; `""` before start. */
  get id(): string {
    return this.#id;
  }

  /** Container name (`vf-<hex>`); `""` before start. */
  get name(): string {
    return this.#name;
  }

  /** The working directory commands and relative paths use. */
  get workdir(): string {
    return this.#workdir;
  }

  #short(): string {
    return this.#name || this.#id.slice(0, 12);
  }

  /** Creates and starts the container, pulling the image if it is missing. */
  start(options: { signal?: AbortSignal } = {}): Promise<void> {
    return this.#life.start(() => this.#start(options.signal), () => this.stop());
  }

  async #start(signal: AbortSignal | undefined): Promise<void> {
    signal?.throwIfAborted();
    const engine = this.#engine;
    const spec = this.spec;
    let image = await engine.inspectImage(spec.image);
    if (!image) {
      await engine.pullImage(spec.image, { signal });
      image = await engine.inspectImage(spec.image);
    }
    const imageConfig = (image?.Config ?? {}) as { WorkingDir?: string };
    this.#workdir = posix.resolve("/", spec.workdir ?? (imageConfig.WorkingDir || "/"));
    this.#checkNotStopped();
    signal?.throwIfAborted();

    const labels: Record<string, string> = {
      ...spec.labels,
      ...ownerLabels(),
      ...sandboxLabels(this.#options),
    };
    const hostConfig: Record<string, unknown> = {
      NetworkMode: spec.networkName ?? (spec.network ? "bridge" : "none"),
      Init: true,
    };
    if (spec.mounts?.length) {
      hostConfig.Mounts = spec.mounts.map((m) => ({
        Type: m.type,
        Source: m.source,
        Target: m.target,
        ReadOnly: m.readOnly ?? false,
      }));
    }
    if (spec.cpu !== undefined) hostConfig.NanoCpus = Math.round(spec.cpu * 1e9);
    if (spec.memory !== undefined) hostConfig.Memory = parseMemory(spec.memory);
    const name = `vf-${randomHex(6)}`;
    this.#labels = labels;
    // Ledger first: a creator killed between request and response leaves a findable name.
    await this.#record("requested", engine, name);
    this.#name = name;
    // A service's command replaces the image's CMD and keeps its ENTRYPOINT, as in Compose.
    const run: Record<string, unknown> = spec.command === null
      ? {}
      : spec.command
      ? { Cmd: spec.command }
      : { Entrypoint: [""], Cmd: ["sleep", "infinity"] };
    const seconds = (s: number | undefined) => (s === undefined ? undefined : Math.round(s * 1e9));
    // No signal: a create abandoned mid-request still completes in the engine, after the
    // removal by name has found nothing, and leaves a container nobody removes. It is quick;
    // the abort is honoured right after it, with the id known.
    this.#id = await engine.createContainer({
      Image: spec.image,
      ...run,
      WorkingDir: this.#workdir,
      Env: envList(spec.env),
      User: spec.user,
      Labels: labels,
      HostConfig: hostConfig,
      ...(spec.healthcheck && {
        Healthcheck: {
          Test: spec.healthcheck.test,
          Interval: seconds(spec.healthcheck.interval),
          Timeout: seconds(spec.healthcheck.timeout),
          Retries: spec.healthcheck.retries,
          StartPeriod: seconds(spec.healthcheck.startPeriod),
        },
      }),
      ...(spec.networkName && {
        NetworkingConfig: {
          EndpointsConfig: { [spec.networkName]: { Aliases: spec.aliases ?? [] } },
        },
      }),
    }, { name });
    await this.#record("created", engine, name);
    this.#checkNotStopped();
    signal?.throwIfAborted();
    if ((hostConfig.Memory || hostConfig.NanoCpus) && await engine.isPodman()) {
      // Rootless podman without cgroup v2 delegation creates the container and drops its
      // limits with only a warning in its own log: a sandbox must not run unbounded.
      const made = (await engine.inspectContainer(this.#id))?.HostConfig as
        | { Memory?: number; NanoCpus?: number }
        | undefined;
      if ((hostConfig.Memory && !made?.Memory) || (hostConfig.NanoCpus && !made?.NanoCpus)) {
        throw new SandboxUnsupportedError(
          `The engine at "${engine.endpoint.display}" (podman) dropped the cpu/memory limits of ` +
            `container "${this.#short()}": rootless podman needs cgroup v2 with delegated ` +
            `controllers for limits; run podman as root, delegate cgroup v2, or remove cpu and ` +
            `memory from the runtime table`,
        );
      }
    }
    // On a rollout's own network and asked for network access: the default bridge as well.
    if (spec.networkName && spec.network === true) {
      await engine.connectNetwork("bridge", this.#id);
    }
    for (const extra of spec.extraNetworks ?? []) {
      await engine.connectNetwork(extra.name, this.#id, extra.aliases ?? []);
    }
    await engine.startContainer(this.#id, { signal }).catch((error) => {
      throw rootlessNetworkRefusal(error, engine.endpoint.display, this.#short()) ?? error;
    });
    this.#checkNotStopped();
    // A sandbox (not a service running its own command) gets the persistent command channel,
    // opened beside the start: commands before it is up are execs of their own.
    if (spec.command === undefined && spec.execChannel !== false) {
      const label = `container "${this.#short()}"`;
      this.#channelOpening = ExecChannel.open(execLauncher(engine, this.#id), label).then(
        (channel) => {
          if (this.#life.state === "stopped") channel?.close();
          else this.#channel = channel;
        },
        () => {},
      );
    }
  }

  /**
   * Commits the container to an image labelled `vf.fork=1`, without pausing it (its labels
   * carry the run's, so `vf cleanup` finds what a killed run left).
   */
  async snapshot(options: { signal?: AbortSignal } = {}): Promise<RuntimeSnapshot> {
    const id = this.#requireRunning();
    const engine = this.#engine;
    const image = `${FORK_REPO}:${randomHex(8)}`;
    const [repo, tag] = image.split(":");
    // Not paused: freezing the container while an exec is joining it (the command channel
    // opening beside the start, a command of its own) hangs runc's exec, the freeze never
    // completes and the engine holds the container for good (seen here with cgroup v1). The
    // snapshot is taken after the task's setup, when nothing of it should be writing.
    await this.#channelOpening;
    await engine.commitContainer(id, {
      repo,
      tag,
      labels: { [FORK_LABEL]: "1" },
      pause: false,
      signal: options.signal,
    });
    let removing: Promise<void> | undefined;
    return {
      image,
      remove: () => removing ??= engine.removeImage(image, { force: true }).then(() => {}),
    };
  }

  /** Whether commands go through the persistent channel now (false: one exec each). */
  get channelOpen(): boolean {
    return this.#channel?.alive ?? false;
  }

  /** Waits until the command channel is open, or known not to be; true when it is. */
  async channelReady(): Promise<boolean> {
    await this.#channelOpening;
    return this.channelOpen;
  }

  async #record(
    event: "requested" | "created" | "stopped",
    engine: DockerEngine,
    name: string,
  ): Promise<void> {
    if (!this.#ledger) return;
    await this.#ledger.record({
      event,
      type: "docker",
      key: name,
      id: this.#id || undefined,
      run_id: this.#options.runId,
      labels: event === "requested" ? this.#labels : undefined,
      host: event === "requested" ? engine.hostInfo : undefined,
    });
    if (event === "requested") this.#recorded = true;
  }

  #checkNotStopped(): void {
    this.#life.checkNotStopped();
  }

  #requireRunning(): string {
    return this.#life.require(this.#id, () => `Docker runtime "${this.#short()}" is stopped`);
  }

  #resolve(path: string): string {
    return resolveSandboxPath(this.#workdir, path);
  }

  /**
   * Runs `argv` in the container: through the persistent channel when it is open (and no
   * other user is asked for), else as an exec of its own.
   */
  async run(argv: string[], options: RunOptions = {}): Promise<RunResult> {
    const id = this.#requireRunning();
    requireArgv(argv);
    options.signal?.throwIfAborted();
    const channel = this.#channel;
    if (channel?.alive && options.user === undefined) {
      return await this.#runOnChannel(id, channel, argv, options);
    }
    return await this.#runExec(id, argv, options);
  }

  async #runOnChannel(
    id: string,
    channel: ExecChannel,
    argv: string[],
    options: RunOptions,
  ): Promise<RunResult> {
    const { signal, timeoutMs } = options;
    const started = performance.now();
    const env = Object.entries(options.env ?? {}).map(([k, v]) => `${k}=${v}`);
    const cwd = options.cwd === undefined ? this.#workdir : this.#resolve(options.cwd);
    const stdin = options.stdin === undefined ? undefined : toBytes(options.stdin);
    const ran = await runCommand(
      channel,
      [cwd, stdin ? String(stdin.length) : "-", String(env.length), ...env, ...argv],
      // One command per supervisor: its process tree is everything below the supervisor.
      { stdin, timeoutMs, signal, killBelow: (pid) => this.#killBelow(id, pid) },
    );
    const result = ran.outcome === "done" ? ran.value : undefined;
    if (ran.outcome !== "done") {
      if (ran.outcome === "abort") throw signal!.reason;
      throw commandTimeout(argv, timeoutMs, `in container "${this.#short()}"`);
    }
    if (result!.status === "nocwd") {
      throw missingWorkdir(options.cwd ?? cwd, options.cwd, `in container "${this.#short()}"`);
    }
    return {
      exit_code: Number(result!.status),
      stdout: decodeChunks([result!.stdout]),
      stderr: decodeChunks([result!.stderr]),
      duration_ms: Math.round(performance.now() - started),
    };
  }

  /** Kills every process below `pid` (a supervisor), never `pid` itself; a plain exec. */
  async #killBelow(id: string, pid: number): Promise<void> {
    const execId = await this.#engine.createExec(id, {
      Cmd: ["/bin/sh", "-c", KILL_BELOW, "vf-kill", String(pid)],
      AttachStdout: true,
      AttachStderr: true,
      User: "0",
    });
    const stream = await this.#engine.startExec(execId, { onStdout() {}, onStderr() {} });
    await within(stream.done, 5_000);
    stream.destroy();
  }

  async #runExec(id: string, argv: string[], options: RunOptions): Promise<RunResult> {
    const { signal, timeoutMs } = options;
    const started = performance.now();
    const guarded = timeoutMs !== undefined || signal !== undefined;
    const stdin = options.stdin === undefined ? undefined : toBytes(options.stdin);
    const execId = await this.#createExec(id, {
      Cmd: guarded ? ["/bin/sh", "-c", PID_WRAPPER, "vf", ...argv] : argv,
      AttachStdin: stdin !== undefined,
      AttachStdout: true,
      AttachStderr: true,
      Tty: false,
      Env: envList(options.env),
      WorkingDir: options.cwd === undefined ? undefined : this.#resolve(options.cwd),
      User: options.user,
    });

    const stdout: Uint8Array[] = [];
    const stderr: Uint8Array[] = [];
    const pidLine = new PidLine(guarded, (chunk) => stderr.push(chunk));
    const pid = pidLine.pid;
    const stream = await this.#engine.startExec(execId, {
      onStdout: (chunk) => stdout.push(chunk),
      onStderr: (chunk) => pidLine.feed(chunk),
    }, { stdin });

    const { outcome } = await untilInterrupted(stream.done, { timeoutMs, signal });
    if (outcome !== "done") {
      const known = await within(pid, 2_000);
      if (known !== undefined) await this.#killTree(id, known).catch(() => {});
      await within(stream.done, 2_000);
      stream.destroy();
      if (outcome === "abort") throw signal!.reason;
      throw commandTimeout(argv, timeoutMs, `in container "${this.#short()}"`);
    }
    const unfinished = pidLine.unfinished();
    if (unfinished) stderr.unshift(unfinished);
    let exitCode = await this.#exitCode(execId);
    let out = decodeChunks(stdout);
    let err = decodeChunks(stderr);
    // The OCI runtime could not start the process: Docker reports that on stdout with 126,
    // Podman on stderr ("Error: runc: exec failed: ...") with 127. Normalise to what a shell
    // (and the subprocess runtime) reports.
    const dockerFailure = exitCode === 126 && err === "" &&
      out.startsWith("OCI runtime exec failed");
    const podmanFailure = (exitCode === 126 || exitCode === 127) && out === "" &&
      /^Error: [\w.-]+: exec failed: /.test(err);
    if (out === "" && PODMAN_ATTACH_LOST.test(err)) {
      throw new SandboxError(
        `The engine lost the output of "${describeArgv(argv)}" in container ` +
          `"${this.#short()}": podman's exec attach was reset (${err.trim()}); the command may ` +
          `have run; keep the command channel on (execChannel, the default) with podman`,
      );
    }
    if (dockerFailure || podmanFailure) {
      if (podmanFailure) out = err;
      if (/chdir to cwd/.test(out)) {
        throw new SandboxFileNotFoundError(
          options.cwd ?? this.#workdir,
          `Working directory "${options.cwd}" does not exist in container "${this.#short()}"`,
          { cause: new SandboxError(out.trim()) },
        );
      }
      if (/executable file not found|no such file or directory/.test(out)) {
        exitCode = 127;
        err = `${argv[0]}: command not found\n`;
      } else {
        err = out;
      }
      out = "";
    }
    return {
      exit_code: exitCode,
      stdout: out,
      stderr: err,
      duration_ms: Math.round(performance.now() - started),
    };
  }

  async #createExec(id: string, body: Record<string, unknown>): Promise<string> {
    try {
      return await this.#engine.createExec(id, body);
    } catch (error) {
      if (error instanceof SandboxApiError && (error.status === 404 || error.status === 409)) {
        throw new SandboxUnavailableError(
          `Container "${this.#short()}" is not running; it was removed, stopped or ran out of ` +
            `memory`,
          { cause: error },
        );
      }
      throw error;
    }
  }

  async #exitCode(execId: string): Promise<number> {
    // The stream can close a moment before the engine records the exit code.
    for (let attempt = 0; attempt < 100; attempt++) {
      const info = await this.#engine.inspectExec(execId);
      if (!info.Running && info.ExitCode !== null) return info.ExitCode;
      await sleep(attempt < 10 ? 5 : 20);
    }
    throw new SandboxError(`Exec "${execId.slice(0, 12)}" did not report an exit code`);
  }

  /** A process kept running with its stdin open (see {@link Runtime.spawn}). */
  async spawn(
    argv: string[],
    options: Pick<RunOptions, "env" | "cwd" | "user"> & {
      onStdout: (chunk: Uint8Array) => void;
      onStderr?: (chunk: Uint8Array) => void;
    },
  ): Promise<RuntimeProcess> {
    const id = this.#requireRunning();
    requireArgv(argv);
    const execId = await this.#createExec(id, {
      Cmd: ["/bin/sh", "-c", PID_WRAPPER, "vf", ...argv],
      AttachStdin: true,
      AttachStdout: true,
      AttachStderr: true,
      Tty: false,
      Env: envList(options.env),
      WorkingDir: options.cwd === undefined ? undefined : this.#resolve(options.cwd),
      User: options.user,
    });
    const pidLine = new PidLine(true, (chunk) => options.onStderr?.(chunk));
    const pid = pidLine.pid;
    const stream = await this.#engine.startExec(execId, {
      onStdout: options.onStdout,
      onStderr: (chunk) => pidLine.feed(chunk),
    }, { stdin: "open" });
    stream.done.then(() => pidLine.unfinished());
    let killed: Promise<void> | undefined;
    return {
      write: (data) => stream.write(data),
      exited: stream.done,
      kill: () =>
        killed ??= (async () => {
          stream.end();
          const known = await within(pid, 2_000);
          if (known !== undefined) await this.#killTree(id, known).catch(() => {});
          await within(stream.done, 2_000);
          stream.destroy();
        })(),
    };
  }

  /**
   * Kills every process in the container but Docker's init, the container's command and the
   * command channel's supervisors (see {@link Runtime.killProcesses}); a plain exec as root.
   * @throws {SandboxError} when some survive, or the image has no `/bin/sh` or `/proc`
   */
  async killProcesses(options: { signal?: AbortSignal } = {}): Promise<void> {
    const id = this.#requireRunning();
    if (!this.capabilities.kill_processes) {
      throw new SandboxStateError(
        `Container "${this.#short()}" runs its own command, which a sweep cannot tell apart`,
      );
    }
    // A supervisor still opening would be swept as a stranger: let it finish first.
    await this.#channelOpening;
    const channel = this.#channel;
    const spare = channel?.alive ? channel.pids : [];
    const execId = await this.#createExec(id, {
      Cmd: ["/bin/sh", "-c", SWEEP, "vf-sweep", "sleep", ...spare.map(String)],
      AttachStdout: true,
      AttachStderr: true,
      User: "0",
    });
    const out: Uint8Array[] = [];
    const err: Uint8Array[] = [];
    const stream = await this.#engine.startExec(execId, {
      onStdout: (chunk) => out.push(chunk),
      onStderr: (chunk) => err.push(chunk),
    });
    const where = `in container "${this.#short()}"`;
    await awaitSweep(stream.done, { where, close: () => stream.destroy(), signal: options.signal });
    const said = decodeChunks(out).trim();
    const failure = await sweepFailure(said, {
      where,
      cannotRun: async () =>
        `the sweep could not run (exit ${await this.#exitCode(execId)}: ${
          `${decodeChunks(err)}${said}`.trim().slice(0, 300)
        }); the image needs /bin/sh`,
    });
    if (failure) throw failure;
  }

  async #killTree(id: string, pid: number): Promise<void> {
    const execId = await this.#engine.createExec(id, {
      Cmd: ["/bin/sh", "-c", KILL_TREES, "vf-kill", String(pid)],
      AttachStdout: true,
      AttachStderr: true,
      User: "0",
    });
    const stream = await this.#engine.startExec(execId, { onStdout() {}, onStderr() {} });
    await within(stream.done, 5_000);
    stream.destroy();
  }

  /** A root supervisor may read and write any file, as the archive endpoint does. */
  #fileChannel(): ExecChannel | null {
    const channel = this.#channel;
    return channel?.alive && channel.uid === 0 ? channel : null;
  }

  /**
   * Reads a file, following symlinks: with `cat` through the command channel when it is open,
   * else through the archive endpoint.
   */
  async read(path: string, options: { maxBytes?: number } = {}): Promise<Uint8Array> {
    const id = this.#requireRunning();
    const { maxBytes } = options;
    const channel = this.#fileChannel();
    if (channel) {
      const target = this.#resolve(path);
      const where = `container "${this.#short()}"`;
      // One byte past the limit tells a file that is too large; only then is it measured.
      const r = await channel.request("g", [
        target,
        maxBytes === undefined ? "" : String(maxBytes + 1),
      ], {});
      if (r.status === "missing") {
        throw new SandboxFileNotFoundError(path, `Path "${path}" does not exist in ${where}`);
      }
      if (r.status === "dir") {
        throw new SandboxError(
          `Path "${path}" in ${where} is a directory; read a file or use archiveOut()`,
        );
      }
      if (r.status !== "0") {
        throw new SandboxError(
          `Cannot read "${path}" in ${where}: ${decodeChunks([r.stderr]).trim()}`,
        );
      }
      if (maxBytes !== undefined && r.stdout.length > maxBytes) {
        const size = await this.#runOnChannel(id, channel, ["wc", "-c", target], {});
        const bytes = Number(size.stdout.trim().split(/\s+/)[0]);
        throw new SandboxFileTooLargeError(
          path,
          Number.isFinite(bytes) ? bytes : r.stdout.length,
          maxBytes,
          where,
        );
      }
      return r.stdout;
    }
    let target = this.#resolve(path);
    for (let hops = 0; hops < 16; hops++) {
      const download = await this.#download(id, target, path);
      const stat = download.stat;
      if (stat?.linkTarget) {
        download.cancel();
        target = posix.resolve(posix.dirname(target), stat.linkTarget);
        continue;
      }
      if (stat && isDirectoryMode(stat.mode)) {
        download.cancel();
        throw new SandboxError(
          `Path "${path}" in container "${this.#short()}" is a directory; read a file or use ` +
            `archiveOut()`,
        );
      }
      if (maxBytes !== undefined && stat && stat.size > maxBytes) {
        download.cancel();
        throw new SandboxFileTooLargeError(
          path,
          stat.size,
          maxBytes,
          `container "${this.#short()}"`,
        );
      }
      const chunks: Uint8Array[] = [];
      let total = 0;
      // Tar framing adds headers and padding; anything past this bound is not our file.
      const cap = maxBytes === undefined ? Infinity : maxBytes + 64 * 1024;
      for await (const chunk of download.body) {
        chunks.push(chunk);
        total += chunk.length;
        if (total > cap) {
          download.cancel();
          throw new SandboxFileTooLargeError(
            path,
            total,
            maxBytes!,
            `container "${this.#short()}"`,
          );
        }
      }
      for (const entry of readTar(concatBytes(chunks))) {
        if (entry.typeflag === "0" || entry.typeflag === "7") {
          if (maxBytes !== undefined && entry.size > maxBytes) {
            throw new SandboxFileTooLargeError(
              path,
              entry.size,
              maxBytes,
              `container "${this.#short()}"`,
            );
          }
          return entry.data.slice();
        }
      }
      throw new SandboxError(
        `Path "${path}" in container "${this.#short()}" is not a regular file`,
      );
    }
    throw new SandboxError(`Too many symlinks while reading "${path}" in "${this.#short()}"`);
  }

  /** `getArchive`, with a missing path reported as the caller named it. */
  async #download(id: string, target: string, path: string) {
    try {
      return await this.#engine.getArchive(id, target);
    } catch (error) {
      if (!(error instanceof SandboxFileNotFoundError)) throw error;
      throw new SandboxFileNotFoundError(
        path,
        `Path "${path}" does not exist in container "${this.#short()}"`,
        { cause: error },
      );
    }
  }

  /** Writes a file through the archive endpoint, creating parent directories. */
  async write(
    path: string,
    data: string | Uint8Array,
    options: { mode?: number } = {},
  ): Promise<void> {
    const id = this.#requireRunning();
    const target = this.#resolve(path);
    if (target === "/") throw new TypeError(`Cannot write to "${path}": it is the root directory`);
    const channel = this.#fileChannel();
    if (channel) {
      const bytes = toBytes(data);
      const mode = (options.mode ?? 0o644).toString(8);
      const fresh = (0o666 & ~channel.umask).toString(8);
      const r = await channel.request("w", [target, mode, fresh, String(bytes.length)], {
        data: bytes,
      });
      if (r.status !== "0") {
        throw new SandboxError(
          `Cannot write "${path}" in container "${this.#short()}": ${
            r.status === "unwritable"
              ? "its directory cannot be created or written (a file in the way?)"
              : decodeChunks([r.stderr]).trim() || `status ${r.status}`
          }`,
        );
      }
      return;
    }
    await this.#putInto(id, posix.dirname(target), [{
      name: posix.basename(target),
      type: "file",
      data: toBytes(data),
      mode: options.mode ?? 0o644,
    }]);
  }

  /**
   * A tar of `path`, entries named from its basename (as the Engine API returns it): `tar`
   * through the command channel when it is open and nothing is excluded, else the archive
   * endpoint (which streams, so excluded members are never held).
   */
  async archiveOut(path: string, options: ArchiveOutOptions = {}): Promise<Uint8Array> {
    const id = this.#requireRunning();
    const channel = this.#fileChannel();
    if (channel && !options.exclude?.length) {
      const tar = await this.#archiveOutOnChannel(channel, path, options.maxBytes);
      if (tar) return tar;
    }
    const download = await this.#download(id, this.#resolve(path), path);
    const tar = new TarCollector({
      exclude: options.exclude?.length ? excludeMatcher(options.exclude) : undefined,
      maxBytes: options.maxBytes,
      tooLarge: (bytes) =>
        new SandboxFileTooLargeError(path, bytes, options.maxBytes!, `container ${this.#short()}`),
    });
    try {
      for await (const chunk of download.body) tar.push(chunk);
    } catch (error) {
      download.cancel();
      throw error;
    }
    return tar.finish();
  }

  /**
   * `tar -c` of `path` on a root supervisor; null when the channel cannot (no `tar`, or tar
   * failed): the archive endpoint then answers. At most the limit plus framing ever arrives.
   */
  async #archiveOutOnChannel(
    channel: ExecChannel,
    path: string,
    maxBytes: number | undefined,
  ): Promise<Uint8Array | null> {
    const target = this.#resolve(path);
    if (target === "/") return null;
    const where = `container ${this.#short()}`;
    const cap = maxBytes === undefined ? "" : String(maxBytes + TAR_SLACK);
    const r = await channel.request("a", [posix.dirname(target), posix.basename(target), cap], {});
    if (r.status === "4") {
      throw new SandboxFileNotFoundError(path, `Path "${path}" does not exist in ${where}`);
    }
    const tooLarge = (bytes: number) => new SandboxFileTooLargeError(path, bytes, maxBytes!, where);
    if (cap !== "" && r.stdout.length >= Number(cap)) throw tooLarge(r.stdout.length);
    if (r.status !== "0" || decodeChunks([r.stderr]).includes(TAR_FAILED)) return null;
    const tar = new TarCollector({ maxBytes, tooLarge });
    tar.push(r.stdout);
    return tar.finish();
  }

  /**
   * Extracts `tar` into `dir`, creating it first: `tar -x` through the command channel when
   * it is open (as root, so the archive's owners and modes are kept, as the endpoint keeps
   * them), else the archive endpoint.
   */
  async archiveIn(dir: string, tar: Uint8Array): Promise<void> {
    const id = this.#requireRunning();
    const target = this.#resolve(dir);
    const channel = this.#fileChannel();
    if (channel) {
      const r = await channel.request("x", [target, String(tar.length)], { data: tar });
      if (r.status === "0") return;
      // No tar in the image, or it refused the archive: the endpoint has the last word.
    }
    await this.#putInto(id, target, tar);
  }

  /**
   * Uploads into `dir`, creating it when missing. Entries given as a list are merged with the
   * missing directories into one upload; a ready-made tar needs a second one.
   */
  async #putInto(id: string, dir: string, content: TarEntry[] | Uint8Array): Promise<void> {
    const copyUIDGID = this.spec.user !== undefined;
    const tar = content instanceof Uint8Array ? content : packTar(content);
    try {
      await this.#engine.putArchive(id, dir, tar, { copyUIDGID });
      return;
    } catch (error) {
      if (!(error instanceof SandboxFileNotFoundError)) throw error;
    }
    // `mkdir -p` without an exec: upload the missing directories into the deepest existing one.
    const { base, missing } = await this.#existingAncestor(id, dir);
    const entries: TarEntry[] = missing.map((_, i) => ({
      name: missing.slice(0, i + 1).join("/"),
      type: "directory",
    }));
    if (content instanceof Uint8Array) {
      await this.#engine.putArchive(id, base, packTar(entries), { copyUIDGID });
      await this.#engine.putArchive(id, dir, content, { copyUIDGID });
    } else {
      const prefix = missing.join("/");
      for (const entry of content) entries.push({ ...entry, name: `${prefix}/${entry.name}` });
      await this.#engine.putArchive(id, base, packTar(entries), { copyUIDGID });
    }
  }

  async #existingAncestor(id: string, dir: string): Promise<{ base: string; missing: string[] }> {
    const parts = dir.split("/").filter(Boolean);
    for (let keep = parts.length - 1; keep >= 0; keep--) {
      const base = "/" + parts.slice(0, keep).join("/");
      const stat = await this.#engine.statPath(id, base);
      if (!stat) continue;
      if (!isDirectoryMode(stat.mode) && !stat.linkTarget) {
        throw new SandboxError(
          `Cannot create directory "${dir}" in container "${this.#short()}": "${base}" is not ` +
            `a directory`,
        );
      }
      return { base, missing: parts.slice(keep) };
    }
    return { base: "/", missing: parts };
  }

  /** Removes the container (force). Idempotent. */
  stop(): Promise<void> {
    return this.#life.stop(async () => {
      this.#channel?.close();
      const engine = this.#engine;
      // Without an id the create request may still have reached the engine: remove by name.
      const target = this.#id || this.#name;
      if (target) await engine.removeContainer(target, { force: true });
      // A channel still opening ends with its container (and is closed as it settles).
      await this.#channelOpening;
      if (this.#recorded && this.#name) await this.#record("stopped", engine, this.#name);
    });
  }

  /** Same as {@linkcode stop}. */
  [Symbol.asyncDispose](): Promise<void> {
    return this.stop();
  }
}

/** Which leftover containers {@linkcode cleanupContainers} removes. */
export interface CleanupFilter {
  /** Only containers of this run (label `vf.run_id`). */
  runId?: string;
  /** Only containers created at least this long ago. */
  olderThanMs?: number;
  /**
   * Check owners (`vf cleanup`): containers of a run that is still going, and those whose
   * owner cannot be checked (unless `olderThanMs` is given), are kept. Default: no check.
   */
  owners?: OwnerPolicy;
  /** Told of each container kept by the owner check, with why. */
  onKept?: (id: string, reason: string) => void;
}

/**
 * Removes containers labelled `vf.managed=1` (force), optionally only those of one run or
 * older than an age. Returns the removed container ids.
 * @param filter which containers
 * @param options.engine engine client; default {@linkcode DockerEngine.shared}
 */
export async function cleanupContainers(
  filter: CleanupFilter = {},
  options: { engine?: DockerEngine } = {},
): Promise<string[]> {
  const engine = options.engine ?? DockerEngine.shared();
  const labels = leftoverSelector(filter.runId);
  const containers = await engine.listContainers({ all: true, labels });
  const cutoff = filter.olderThanMs === undefined ? Infinity : Date.now() - filter.olderThanMs;
  const doomed = containers.filter((c) => {
    const created = Number(c.Created) * 1000;
    if (created > cutoff) return false;
    if (!filter.owners) return true;
    const labels = (c.Labels ?? {}) as Record<string, string>;
    const reason = keepReason(ownerFromLabels(labels), created, filter.owners);
    if (reason !== undefined) filter.onKept?.(String(c.Id), reason);
    return reason === undefined;
  });
  const removed: string[] = [];
  await Promise.all(doomed.map(async (c) => {
    const id = String(c.Id);
    if (await engine.removeContainer(id, { force: true })) removed.push(id);
  }));
  // Rollout networks (services) go once nothing is on them; one still in use stays.
  const networks = await engine.listNetworks({ labels }).catch(() => []);
  await Promise.all(networks.map(async (n) => {
    const created = Date.parse(String(n.Created));
    if (Number.isFinite(created) && created > cutoff) return;
    if (filter.owners) {
      const reason = keepReason(
        ownerFromLabels((n.Labels ?? {}) as Record<string, string>),
        created,
        filter.owners,
      );
      if (reason !== undefined) return;
    }
    await engine.removeNetwork(String(n.Id)).catch(() => {});
  }));
  // Group snapshots (fork_group) once no container runs from them.
  const images = await engine.listImages({ label: [...labels, `${FORK_LABEL}=1`] }).catch(
    () => [],
  );
  await Promise.all(images.map(async (image) => {
    const created = Number((image as { Created?: number }).Created) * 1000;
    if (Number.isFinite(created) && created > cutoff) return;
    if (filter.owners && keepReason(ownerFromLabels(image.Labels ?? {}), created, filter.owners)) {
      return;
    }
    await engine.removeImage(image.Id, { force: true }).catch(() => {});
  }));
  // Services' named volumes likewise, once no container holds them.
  const volumes = await engine.listVolumes({ labels }).catch(() => []);
  await Promise.all(volumes.map(async (v) => {
    const created = Date.parse(String(v.CreatedAt));
    if (Number.isFinite(created) && created > cutoff) return;
    if (filter.owners && keepReason(ownerFromLabels(v.Labels ?? {}), created, filter.owners)) {
      return;
    }
    await engine.removeVolume(v.Name).catch(() => {});
  }));
  return removed;
}

/**
 * Removes the ledger's live Docker sandboxes (by container id, else name) on the engine each
 * was created on. Registered as the ledger cleaner of type `docker`.
 */
export async function cleanupDockerLedger(
  sandboxes: Array<{ key: string; id?: string; host?: Record<string, unknown> }>,
): Promise<{ removed: string[]; gone: string[]; failed: Array<{ key: string; error: string }> }> {
  const engines = new Map<string, DockerEngine>();
  const engineFor = (host: Record<string, unknown> | undefined) => {
    const dockerHost = typeof host?.docker_host === "string" ? host.docker_host : "";
    const tls = host?.tls_verify === true;
    const certPath = typeof host?.cert_path === "string" ? host.cert_path : undefined;
    const key = JSON.stringify([dockerHost, tls, certPath ?? ""]);
    let engine = engines.get(key);
    if (!engine) {
      engine = new DockerEngine(dockerHost || undefined, { tlsVerify: tls, certPath });
      // A sandbox recorded without a host lives on whatever DOCKER_HOST names now.
      engines.set(key, engine);
    }
    return engine;
  };
  const removed: string[] = [];
  const gone: string[] = [];
  const failed: Array<{ key: string; error: string }> = [];
  try {
    await Promise.all(sandboxes.map(async (s) => {
      try {
        const existed = await engineFor(s.host).removeContainer(s.id || s.key, { force: true });
        (existed ? removed : gone).push(s.key);
      } catch (error) {
        failed.push({ key: s.key, error: error instanceof Error ? error.message : String(error) });
      }
    }));
  } finally {
    await Promise.all([...engines.values()].map((e) => e.close()));
  }
  return { removed, gone, failed };
}

registerCleaner("docker", cleanupDockerLedger);

/**
 * Rootless podman networks a container (`network = true`) through slirp4netns and a network
 * namespace of its own, and slirp4netns needs /dev/net/tun. Where the podman user may not open
 * it, the first start fails naming it and every later one fails to mount that namespace: no
 * start can succeed, so the sandbox is refused (`SandboxUnsupportedError`), not retried.
 */
function rootlessNetworkRefusal(
  error: unknown,
  endpoint: string,
  container: string,
): SandboxUnsupportedError | undefined {
  if (!(error instanceof SandboxApiError)) return undefined;
  const said = error.message.replace(/^[^]*?HTTP \d+: /, "").split(/\n|\\n/)[0];
  // Debian's podman only recommends slirp4netns: without it no rootless container has a network.
  if (/"?slirp4netns"?: executable file not found/.test(error.message)) {
    return new SandboxUnsupportedError(
      `The engine at "${endpoint}" (rootless podman) cannot give container "${container}" the ` +
        `network it asked for (network = true): rootless podman networks containers through ` +
        `slirp4netns, which is not installed (podman: ${said}); install it (Debian: apt-get ` +
        `install slirp4netns), run podman as root, or set network = false in the runtime table`,
      { cause: error },
    );
  }
  const tun = /slirp4netns/.test(error.message) && /\/dev\/net\/tun/.test(error.message);
  if (!tun && !/for rootless netns/.test(error.message)) return undefined;
  return new SandboxUnsupportedError(
    `The engine at "${endpoint}" (rootless podman) cannot give container "${container}" the ` +
      `network it asked for (network = true): rootless podman networks containers through ` +
      `slirp4netns, which needs /dev/net/tun open to the podman user, and ${
        tun ? "it is not" : "its network namespace could not be set up"
      } (podman: ${said}); run podman as root, let that user open /dev/net/tun, or set ` +
      `network = false in the runtime table`,
    { cause: error },
  );
}
