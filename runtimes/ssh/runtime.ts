/**
 * The SSH runtime: any host reachable over SSH (a VM, an HPC login node) as a sandbox.
 * Commands run as execs and files move through SFTP, over one connection per host and
 * identity shared by every runtime of this process (reconnected when it drops).
 *
 * Isolation: a shared SSH host is not a sandbox. Commands run as the login user next to
 * everything else on the host, so `capabilities.isolation` is false unless the spec says
 * the host is dedicated to this rollout (`dedicated: true`, e.g. a VM created for it).
 * `capabilities.users` is true when commands can switch users: `runuser` when the login is
 * root, else passwordless `sudo -n`. The runtime never controls the network.
 *
 * Every command starts with `VF_SANDBOX_ID=<id>` in its environment. On a dedicated host the
 * processes that carry it are swept (stopped, then killed) by `killProcesses()` and before the
 * host is handed to the next sandbox, so a daemon an agent left (`setsid`, a double fork) does
 * not live on into an isolated grader's sandbox. Not by user: the login is often root, and a
 * host's other processes (sshd, its services) run as the same user. A process that clears its
 * environment (`env -i`) escapes the sweep.
 *
 * Workspace: by default each runtime creates a fresh `/tmp/vf-<hex>` on start and removes it
 * on stop; a `workdir` given in the spec is created when missing and left in place.
 *
 * Host keys are checked against `knownHostsPath` (default `~/.ssh/known_hosts`); an unknown
 * host is refused with its fingerprint unless `trustOnFirstUse` is set, which records it.
 * @module
 */

import { Buffer } from "node:buffer";
import { readFileSync } from "node:fs";
import { homedir, userInfo } from "node:os";
import { join, posix } from "node:path";
import process from "node:process";
import { ConfigError } from "../../lib/errors.ts";
import { resolveSshHost, type SshHostConfig } from "./ssh_config.ts";
import { claimHost, dedicatedHostHolder, type HostClaim } from "./host_claims.ts";
import {
  concatBytes,
  decodeChunks,
  expandHome,
  randomHex,
  requireArgv,
  resolveSandboxPath,
  toBytes,
  untilInterrupted,
  within,
} from "../_util.ts";
import { type ExecChannel, runCommand } from "../_channel.ts";
import {
  SandboxError,
  SandboxFileNotFoundError,
  SandboxFileTooLargeError,
  SandboxStateError,
  SandboxUnavailableError,
  SandboxUnsupportedError,
} from "../errors.ts";
import { type LiveSandbox, recordSandbox, registerCleaner } from "../ledger.ts";
import type {
  ArchiveOutOptions,
  RunOptions,
  RunResult,
  Runtime,
  RuntimeCapabilities,
  RuntimeSpec,
  SshRuntimeSpec,
} from "../runtime.ts";
import {
  acquire,
  hostPort,
  release,
  type Ssh2Sftp,
  type Ssh2Stats,
  type SshConnection,
  type SshTarget,
} from "./connection.ts";
import { collectTarOutput, excludeMatcher, TarCollector } from "../_tar.ts";
import { CONTROL, ENV_NAME, PREPARE, RUN_WRAPPER, shCommand, shellQuote } from "./shell.ts";
import { KILL_BELOW, KILL_TREES, SWEEP_TAGGED } from "../_sweep.ts";
import {
  commandTimeout,
  Lifecycle,
  missingWorkdir,
  SWEEP_TIMEOUT_MS,
  sweepFailure,
} from "../lifecycle.ts";

/**
 * Workdirs waiting to be removed, per connection. Sandboxes on one host tend to stop
 * together (a run's end, a wave of rollouts); one `rm` per sandbox then queues hundreds of
 * execs behind the connection's few channels (the 1,000-sandbox run left 174 workdirs when
 * those queues outlasted the cleanup deadline). So removals are batched: while one `rm` runs
 * on a connection, the workdirs of sandboxes stopping meanwhile gather for the next one.
 */
const pendingRemovals = new WeakMap<SshConnection, { dirs: string[]; done: Promise<boolean> }>();
const running = new WeakMap<SshConnection, Promise<unknown>>();

/** Removes `dir` on the connection's host in the next batch; true when it is gone. */
function removeWorkdir(connection: SshConnection, dir: string): Promise<boolean> {
  const waiting = pendingRemovals.get(connection);
  if (waiting && waiting.dirs.length < 500) {
    waiting.dirs.push(dir);
    return waiting.done;
  }
  const batch = { dirs: [dir], done: Promise.resolve(false) };
  pendingRemovals.set(connection, batch);
  const before = running.get(connection) ?? Promise.resolve();
  batch.done = before.then(async () => {
    // This batch runs now: later removals start the next one.
    if (pendingRemovals.get(connection) === batch) pendingRemovals.delete(connection);
    const out: Uint8Array[] = [];
    const handle = await connection.exec(shCommand('exec rm -rf -- "$@"', batch.dirs), {
      onStdout: (c) => out.push(c),
      onStderr: (c) => out.push(c),
    });
    const exit = await handle.done;
    return exit.code === 0;
  }).catch(() => false);
  running.set(connection, batch.done);
  return batch.done;
}

/** Options of {@linkcode SshRuntime}'s constructor besides the spec. */
export interface SshRuntimeOptions {
  /** Run id (informational; SSH hosts carry no labels). */
  runId?: string;
  /** Task name or id (informational). */
  task?: string;
  /** A private key given as text instead of `privateKeyPath` (e.g. an ephemeral key). */
  privateKey?: string;
  /** What to call the sandbox in messages; default `SSH host "user@host:port"`. */
  label?: string;
  /** The host is deleted after stop (a VM made for this runtime): skip the remote cleanup. */
  disposable?: boolean;
}

/**
 * A host reached over SSH as a {@linkcode Runtime}.
 *
 * @example
 * ```ts
 * await using rt = new SshRuntime({
 *   type: "ssh",
 *   host: "login.cluster.example",
 *   user: "me",
 *   privateKeyPath: "/home/me/.ssh/id_ed25519",
 * });
 * await rt.start(); // connects (checking known_hosts) and creates /tmp/vf-<hex>
 * const { exit_code, stdout } = await rt.run(["uname", "-a"], { timeoutMs: 10_000 });
 * ```
 * @throws {SshConnectError} from start() and later calls when the host cannot be reached,
 *   refuses the key, or its host key is unknown or changed (a `SandboxUnavailableError`)
 */
export class SshRuntime implements Runtime {
  readonly type: string = "ssh";
  readonly capabilities: RuntimeCapabilities;
  readonly spec: SshRuntimeSpec;
  #options: SshRuntimeOptions;
  #target: SshTarget;
  #connection: SshConnection | undefined;
  #id = "";
  #workdir: string;
  #ownsWorkdir: boolean;
  /** The workdir was prepared (and, when owned, created) on the host. */
  #created = false;
  /** The command that creates the workdir was sent and never answered: it may exist. */
  #preparing = false;
  #switch: "runuser" | "sudo" | "none" = "none";
  #uid = -1;
  #life = new Lifecycle(this, "ssh");
  /** Process groups of commands still running; killed on stop. */
  #groups = new Set<number>();
  /** Supervisors running this sandbox's commands on the connection's channel. */
  #below = new Set<number>();
  /** Why the ssh configuration says this host cannot be reached directly. */
  #proxy: string | undefined;
  /** This sandbox's claim on its dedicated host, held from before it touches the host until stopped. */
  #claim: HostClaim | undefined;
  /** Aborted by stop(): a start still waiting for its dedicated host gives up. */
  #halt = new AbortController();

  constructor(spec: SshRuntimeSpec, options: SshRuntimeOptions = {}) {
    if (!spec.host) throw new TypeError("An ssh runtime needs a host");
    for (const name of Object.keys(spec.env ?? {})) {
      if (!ENV_NAME.test(name)) throw new TypeError(`Invalid environment variable name "${name}"`);
    }
    this.spec = spec;
    this.#options = options;
    const config = readSshConfig(spec);
    if (config?.proxy) this.#proxy = config.proxy;
    this.#target = {
      host: config?.hostName ?? spec.host,
      port: spec.port ?? config?.port ?? 22,
      user: spec.user ?? config?.user ?? localUser(),
      privateKeyPath: expandHome(spec.privateKeyPath),
      privateKey: options.privateKey,
      agent: spec.agent,
      identityFiles: config?.identityFiles ?? [],
      knownHostsPath: expandHome(spec.knownHostsPath) ?? config?.knownHostsFile ??
        join(homedir(), ".ssh", "known_hosts"),
      trustOnFirstUse: spec.trustOnFirstUse ?? false,
      maxSessions: spec.maxSessions ?? 10,
      connectTimeoutMs: spec.connectTimeoutMs ?? 20_000,
    };
    this.#ownsWorkdir = spec.workdir === undefined;
    this.#workdir = spec.workdir === undefined ? "" : posix.resolve("/", spec.workdir);
    this.capabilities = {
      isolation: spec.dedicated === true,
      users: false,
      network_control: false,
      kill_processes: spec.dedicated === true,
    };
  }

  /** `vf-<hex>`; `""` before start. */
  get id(): string {
    return this.#id;
  }

  /** The working directory on the host; `""` before start when it is the default. */
  get workdir(): string {
    return this.#workdir;
  }

  /** `user@host:port`. */
  get address(): string {
    return `${this.#target.user}@${hostPort(this.#target)}`;
  }

  /** The shared connection, while started. */
  get connection(): SshConnection | undefined {
    return this.#connection;
  }

  #label(): string {
    return this.#options.label ?? `SSH host "${this.address}"`;
  }

  /**
   * Connects, prepares the working directory and learns whether commands can switch users.
   * On a dedicated host it first waits until no other sandbox of this process holds the host
   * (`onQueue` is told while it waits).
   */
  start(
    options: { signal?: AbortSignal; onQueue?: (waiting: boolean) => void } = {},
  ): Promise<void> {
    return this.#life.start(
      () => this.#start(options.signal, options.onQueue),
      () => this.stop(),
    );
  }

  async #start(
    signal: AbortSignal | undefined,
    onQueue: ((waiting: boolean) => void) | undefined,
  ): Promise<void> {
    signal?.throwIfAborted();
    if (this.#proxy) {
      throw new SandboxUnsupportedError(
        `SSH host "${this.spec.host}" is reached through "${this.#proxy}" in ` +
          `"${sshConfigPathOf(this.spec)}"; the ssh runtime connects directly: give an address ` +
          "it can reach as host, or run vf on a machine that reaches the host",
      );
    }
    this.#id = `vf-${randomHex(6)}`;
    if (this.spec.dedicated && !this.#options.disposable) {
      // A host made for this runtime alone (a Prime VM) is nobody else's to claim.
      const halt = signal ? AbortSignal.any([signal, this.#halt.signal]) : this.#halt.signal;
      this.#claim = await claimHost(this.address, this.#id, { signal: halt, onQueue });
      this.#checkNotStopped();
    }
    if (this.#ownsWorkdir) this.#workdir = `/tmp/${this.#id}`;
    if (this.#ledgered()) await recordSandbox({ event: "requested", ...this.#ledgerRecord() });
    this.#connection = acquire(this.#target);
    await this.#connection.client();
    this.#checkNotStopped();
    signal?.throwIfAborted();
    this.#preparing = true;
    const { code, exited, stdout, stderr } = await this.#capture(
      shCommand(PREPARE, [this.#workdir, this.#ownsWorkdir ? "new" : "ensure"]),
    );
    if (!exited) {
      // Cut off before it answered: the workdir may exist all the same (still `preparing`).
      throw new SandboxUnavailableError(
        `The connection to ${this.#label()} closed while working directory "${this.#workdir}" ` +
          "was being created",
      );
    }
    // It answered: the workdir is made (below) or was not (a failure is never ours to remove).
    this.#preparing = false;
    if (code !== 0) {
      throw new SandboxError(
        `Cannot create working directory "${this.#workdir}" on ${this.#label()}: ` +
          `${new TextDecoder().decode(stderr).trim() || `exit ${code}`}`,
      );
    }
    this.#created = true;
    if (this.#ledgered()) await recordSandbox({ event: "created", ...this.#ledgerRecord() });
    const [uid, sw] = new TextDecoder().decode(stdout).trim().split(" ");
    this.#uid = Number(uid);
    this.#switch = sw === "runuser" || sw === "sudo" ? sw : "none";
    this.capabilities.users = this.#switch !== "none";
    this.#checkNotStopped();
  }

  #checkNotStopped(): void {
    this.#life.checkNotStopped();
  }

  #requireRunning(): SshConnection {
    return this.#life.require(
      this.#connection,
      () => `SSH runtime "${this.#id}" on ${this.#label()} is stopped`,
    );
  }

  #resolve(path: string): string {
    return resolveSandboxPath(this.#workdir, path);
  }

  /** Runs a helper command line and collects its output as bytes. */
  async #capture(
    command: string,
    stdin?: Uint8Array,
  ): Promise<{ code: number; exited: boolean; stdout: Uint8Array; stderr: Uint8Array }> {
    const connection = this.#connection!;
    const out: Uint8Array[] = [];
    const err: Uint8Array[] = [];
    const handle = await connection.exec(command, {
      stdin,
      onStdout: (c) => out.push(c),
      onStderr: (c) => err.push(c),
    });
    const exit = await handle.done;
    return {
      code: exit.code ?? 128,
      // false: the channel closed without an exit status (the connection went), so what the
      // command did is not known
      exited: exit.code !== null,
      stdout: concatBytes(out),
      stderr: concatBytes(err),
    };
  }

  /** Runs `argv` on the host in the working directory (no shell around it). */
  async run(argv: string[], options: RunOptions = {}): Promise<RunResult> {
    const connection = this.#requireRunning();
    requireArgv(argv);
    const { signal, timeoutMs } = options;
    signal?.throwIfAborted();
    const started = performance.now();
    const cwd = this.#resolve(options.cwd ?? ".");
    const env = { ...this.spec.env, ...options.env, VF_SANDBOX_ID: this.#id };
    for (const name of Object.keys(env)) {
      if (!ENV_NAME.test(name)) throw new TypeError(`Invalid environment variable name "${name}"`);
    }
    const inner: string[] = [];
    if (options.user !== undefined) {
      if (this.#switch === "none") {
        throw new SandboxUnsupportedError(
          `${this.#label()} cannot run commands as user "${options.user}": the login user is ` +
            `not root and has no passwordless sudo (capabilities.users is false)`,
        );
      }
      inner.push(
        ...(this.#switch === "runuser"
          ? ["runuser", "-u", options.user, "--"]
          : ["sudo", "-n", "-u", options.user, "--"]),
      );
    }
    const pairs = Object.entries(env).map(([k, v]) => `${k}=${v}`);
    if (pairs.length) inner.push("env", ...pairs);
    inner.push(...argv);
    const channel = this.spec.execChannel === false ? null : await connection.channel();
    if (channel?.alive) return await this.#runOnChannel(channel, argv, cwd, inner, options);

    const stdout: Uint8Array[] = [];
    const stderr: Uint8Array[] = [];
    let head: Uint8Array | undefined = new Uint8Array(0);
    let control: string | undefined;
    let reportPid!: (pid: number | undefined) => void;
    const pid = new Promise<number | undefined>((resolve) => (reportPid = resolve));
    const handle = await connection.exec(shCommand(RUN_WRAPPER, [cwd, ...inner]), {
      stdin: options.stdin === undefined ? undefined : toBytes(options.stdin),
      onStdout: (chunk) => stdout.push(chunk),
      onStderr: (chunk) => {
        if (head === undefined) {
          stderr.push(chunk);
          return;
        }
        const buf = concatBytes([head, chunk]);
        if (buf[0] !== CONTROL) {
          head = undefined;
          stderr.push(buf);
          reportPid(undefined);
          return;
        }
        const newline = buf.indexOf(10);
        if (newline < 0) {
          head = buf;
          return;
        }
        head = undefined;
        control = new TextDecoder().decode(buf.subarray(4, newline)); // after "\x1fvf:"
        const value = Number(control);
        reportPid(Number.isInteger(value) && value > 1 ? value : undefined);
        if (newline + 1 < buf.length) stderr.push(buf.slice(newline + 1));
      },
    });
    pid.then((p) => p !== undefined && this.#groups.add(p));

    const { outcome, value: exit } = await untilInterrupted(handle.done, { timeoutMs, signal });
    // A command that was interrupted may not have reported its pid yet: wait for it, or it
    // would outlive the timeout unkilled.
    if (outcome === "done") reportPid(undefined);
    const group = await within(pid, 5_000);

    if (outcome !== "done") {
      if (group !== undefined) await this.#killGroups([group]).catch(() => {});
      await within(handle.done.catch(() => {}), 2_000);
      handle.close();
      if (group !== undefined) this.#groups.delete(group);
      if (outcome === "abort") throw signal!.reason;
      throw commandTimeout(argv, timeoutMs, `on ${this.#label()}`);
    }
    if (group !== undefined) this.#groups.delete(group);
    if (control === "nocwd") {
      throw missingWorkdir(options.cwd ?? cwd, options.cwd ?? cwd, `on ${this.#label()}`);
    }
    if (head !== undefined && head.length) stderr.unshift(head);
    return {
      exit_code: exit!.code ?? 128 + signalNumber(exit!.signal),
      stdout: decodeChunks(stdout),
      stderr: decodeChunks(stderr),
      duration_ms: Math.round(performance.now() - started),
    };
  }

  /**
   * Runs `inner` (user switch, env and argv) on a supervisor of the connection's channel:
   * one line and one fork and exec on the host, instead of a session, a login shell and the
   * wrapper. A timed-out or aborted command's process tree is everything below its
   * supervisor, which runs one command at a time.
   */
  async #runOnChannel(
    channel: ExecChannel,
    argv: string[],
    cwd: string,
    inner: string[],
    options: RunOptions,
  ): Promise<RunResult> {
    const { signal, timeoutMs } = options;
    const started = performance.now();
    const stdin = options.stdin === undefined ? undefined : toBytes(options.stdin);
    const ran = await runCommand(
      channel,
      [cwd, stdin ? String(stdin.length) : "-", "0", ...inner],
      {
        stdin,
        timeoutMs,
        signal,
        killBelow: (pid) => this.#kill(KILL_BELOW, [pid]),
        // A stopping sandbox kills below the supervisors still running its commands.
        onSupervisor: (pid, running) => running ? this.#below.add(pid) : this.#below.delete(pid),
      },
    );
    if (ran.outcome !== "done") {
      if (ran.outcome === "abort") throw signal!.reason;
      throw commandTimeout(argv, timeoutMs, `on ${this.#label()}`);
    }
    const result = ran.value;
    if (result.status === "nocwd") {
      throw missingWorkdir(options.cwd ?? cwd, options.cwd ?? cwd, `on ${this.#label()}`);
    }
    return {
      exit_code: Number(result.status),
      stdout: decodeChunks([result.stdout]),
      stderr: decodeChunks([result.stderr]),
      duration_ms: Math.round(performance.now() - started),
    };
  }

  /** Kills process trees through a second channel (kept free for this). */
  /**
   * Kills every process of this sandbox on a dedicated host, those that left its commands'
   * trees included (see the module doc); the command channel's supervisors stay.
   * @throws {SandboxStateError} on a shared host, where other users' processes could carry
   * anything
   * @throws {SandboxError} when some survive, or the host has no `/proc`
   */
  async killProcesses(options: { signal?: AbortSignal } = {}): Promise<void> {
    this.#requireRunning();
    if (!this.capabilities.kill_processes) {
      throw new SandboxStateError(
        `${this.#label()} is shared (not dedicated): vf does not sweep processes there`,
      );
    }
    options.signal?.throwIfAborted();
    const said = await this.#sweep();
    const failure = await sweepFailure(said, {
      where: `on ${this.#label()}`,
      cannotRun: () => `the sweep could not run (${said.slice(0, 300)})`,
    });
    if (failure) throw failure;
  }

  /** Runs {@link SWEEP_TAGGED} for this sandbox (as root when sudo can); returns what it said. */
  async #sweep(): Promise<string> {
    const tag = `VF_SANDBOX_ID=${this.#id}`;
    let command = shCommand(SWEEP_TAGGED, [tag]);
    if (this.#switch === "sudo" && this.#uid !== 0) {
      command = `exec sudo -n /bin/sh -c ${shellQuote(SWEEP_TAGGED)} vf ${shellQuote(tag)}`;
    }
    const { code, stdout, stderr } = await within(
      this.#capture(command),
      SWEEP_TIMEOUT_MS,
    ) ?? { code: 124, stdout: new Uint8Array(), stderr: new TextEncoder().encode("timed out") };
    const said = new TextDecoder().decode(stdout).trim();
    return code === 0 ? said : `exit ${code}: ${new TextDecoder().decode(stderr).trim()}`;
  }

  #killGroups(groups: number[]): Promise<void> {
    return this.#kill(KILL_TREES, groups);
  }

  /** Runs a kill script (`KILL_TREES`, `KILL_BELOW`) over the pids, with sudo when needed. */
  async #kill(script: string, pids: number[]): Promise<void> {
    const connection = this.#connection;
    if (!connection || pids.length === 0) return;
    const args = pids.map(String);
    let command = shCommand(script, args);
    if (this.#switch === "sudo" && this.#uid !== 0) {
      command = `exec sudo -n /bin/sh -c ${shellQuote(script)} vf ${args.join(" ")}`;
    }
    const handle = await connection.exec(command, {
      onStdout() {},
      onStderr() {},
      reserved: true,
    });
    await within(handle.done.catch(() => {}), 5_000);
    handle.close();
  }

  async #sftp(): Promise<Ssh2Sftp> {
    return await this.#requireRunning().sftp();
  }

  #sftpError(error: Error & { code?: number }, op: string, path: string): SandboxError {
    if (error instanceof SandboxError) return error;
    if (error.code === 2) {
      return new SandboxFileNotFoundError(
        path,
        `Path "${path}" does not exist on ${this.#label()}`,
        { cause: error },
      );
    }
    if (typeof error.code !== "number") {
      // SFTP status errors carry a numeric code; anything else is the session going away.
      return new SandboxUnavailableError(
        `Lost the SFTP session to ${this.#label()}: ${error.message}`,
        { cause: error },
      );
    }
    return new SandboxError(`Cannot ${op} "${path}" on ${this.#label()}: ${error.message}`, {
      cause: error,
    });
  }

  async #stat(sftp: Ssh2Sftp, target: string): Promise<Ssh2Stats | undefined> {
    return await new Promise((resolve, reject) => {
      sftp.stat(target, (error, stats) => {
        if (!error) resolve(stats);
        else if (error.code === 2) resolve(undefined);
        else reject(error);
      });
    });
  }

  /** Reads a file through SFTP (following symlinks). */
  async read(path: string, options: { maxBytes?: number } = {}): Promise<Uint8Array> {
    const sftp = await this.#sftp();
    const target = this.#resolve(path);
    try {
      const stats = await this.#stat(sftp, target);
      if (!stats) {
        throw new SandboxFileNotFoundError(
          path,
          `Path "${path}" does not exist on ${this.#label()}`,
        );
      }
      if (stats.isDirectory()) {
        throw new SandboxError(
          `Path "${path}" on ${this.#label()} is a directory; read a file or use archiveOut()`,
        );
      }
      const { maxBytes } = options;
      if (maxBytes !== undefined && stats.size > maxBytes) {
        throw new SandboxFileTooLargeError(path, stats.size, maxBytes, this.#label());
      }
      const data = await new Promise<Uint8Array>((resolve, reject) => {
        sftp.readFile(target, (error, value) => error ? reject(error) : resolve(value));
      });
      if (maxBytes !== undefined && data.length > maxBytes) {
        throw new SandboxFileTooLargeError(path, data.length, maxBytes, this.#label());
      }
      return new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
    } catch (error) {
      throw this.#sftpError(error as Error, "read", path);
    }
  }

  /** Writes a file through SFTP, creating parent directories. */
  async write(
    path: string,
    data: string | Uint8Array,
    options: { mode?: number } = {},
  ): Promise<void> {
    const sftp = await this.#sftp();
    const target = this.#resolve(path);
    if (target === "/") throw new TypeError(`Cannot write to "${path}": it is the root directory`);
    const mode = options.mode ?? 0o644;
    try {
      await this.#mkdirp(sftp, posix.dirname(target));
      const bytes = toBytes(data);
      // ssh2 writes anything that is not a Buffer as text.
      const buffer = Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
      await new Promise<void>((resolve, reject) => {
        sftp.writeFile(target, buffer, { mode }, (error) => error ? reject(error) : resolve());
      });
      // The mode given at open applies only to new files (and the umask applies to it).
      await new Promise<void>((resolve, reject) => {
        sftp.chmod(target, mode, (error) => error ? reject(error) : resolve());
      });
    } catch (error) {
      throw this.#sftpError(error as Error, "write", path);
    }
  }

  async #mkdirp(sftp: Ssh2Sftp, dir: string): Promise<void> {
    const stats = await this.#stat(sftp, dir);
    if (stats) {
      if (!stats.isDirectory()) {
        throw new SandboxError(
          `Cannot create directory "${dir}" on ${this.#label()}: it exists and is not a directory`,
        );
      }
      return;
    }
    if (dir !== "/") await this.#mkdirp(sftp, posix.dirname(dir));
    await new Promise<void>((resolve, reject) => {
      sftp.mkdir(dir, { mode: 0o755 }, async (error) => {
        if (!error) return resolve();
        // Created meanwhile by a concurrent write: fine.
        const now = await this.#stat(sftp, dir).catch(() => undefined);
        if (now?.isDirectory()) resolve();
        else reject(error);
      });
    });
  }

  /** A tar of `path` made by the host's `tar`, entries named from its basename. */
  async archiveOut(path: string, options: ArchiveOutOptions = {}): Promise<Uint8Array> {
    const sftp = await this.#sftp();
    const target = this.#resolve(path);
    const stats = await this.#stat(sftp, target).catch((e) => {
      throw this.#sftpError(e, "archive", path);
    });
    if (!stats) {
      throw new SandboxFileNotFoundError(path, `Path "${path}" does not exist on ${this.#label()}`);
    }
    const parent = target === "/" ? "/" : posix.dirname(target);
    const name = target === "/" ? "." : posix.basename(target);
    // Exclusions go to the host's tar where its matching is the same as vf's, so excluded
    // files are never read or sent; the collector applies every pattern again on arrival.
    // It also drops anything past maxBytes without holding it; passing the limit closes the
    // channel, which ends tar.
    const pushed = tarSideExcludes(options.exclude ?? [], name);
    const tar = new TarCollector({
      exclude: options.exclude?.length ? excludeMatcher(options.exclude) : undefined,
      maxBytes: options.maxBytes,
      tooLarge: (bytes) =>
        new SandboxFileTooLargeError(path, bytes, options.maxBytes!, this.#label()),
    });
    const connection = this.#requireRunning();
    const { exit, stderr: err } = await collectTarOutput(tar, (io) =>
      connection.exec(
        shCommand('d="$1" n="$2"; shift 2; exec tar -C "$d" -cf - "$@" "$n"', [
          parent,
          name,
          ...pushed.map((p) => `--exclude=${p}`),
        ]),
        io,
      ));
    if (exit?.code !== 0) {
      throw new SandboxError(
        `tar of "${path}" failed on ${this.#label()}: ${
          new TextDecoder().decode(concatBytes(err)).trim()
        }`,
      );
    }
    return tar.finish();
  }

  /**
   * Extracts `tar` into `dir` with the host's `tar`, creating `dir` first, files owned by the
   * login user: through a supervisor of the connection's channel, else (or when that fails) in
   * a session of its own, which says why.
   */
  async archiveIn(dir: string, tar: Uint8Array): Promise<void> {
    const connection = this.#requireRunning();
    const target = this.#resolve(dir);
    const channel = this.spec.execChannel === false ? null : await connection.channel();
    if (channel?.alive) {
      const r = await channel.request("x", [target, String(tar.length), "own"], { data: tar })
        .catch(() => null);
      if (r?.status === "0") return;
    }
    const { code, stderr } = await this.#capture(
      shCommand('mkdir -p -- "$1" && exec tar -C "$1" -x -o -f -', [target]),
      tar,
    );
    if (code !== 0) {
      throw new SandboxError(
        `Extracting into "${dir}" failed on ${this.#label()}: ` +
          new TextDecoder().decode(stderr).trim(),
      );
    }
  }

  /** Kills the commands still running, removes the default workdir, releases the connection. */
  stop(): Promise<void> {
    return this.#life.stop(async () => {
      const connection = this.#connection;
      if (!connection) return;
      try {
        await within(this.#cleanupRemote(), 60_000);
      } finally {
        this.#connection = undefined;
        release(connection);
      }
    }, {
      halt: () =>
        this.#halt.abort(
          new SandboxStateError("The ssh runtime was stopped while it was starting"),
        ),
      release: () => {
        // Only now, its commands killed and its workdir removed, may the next sandbox have the
        // host.
        this.#claim?.release();
        this.#claim = undefined;
      },
    });
  }

  async #cleanupRemote(): Promise<void> {
    const groups = [...this.#groups];
    this.#groups.clear();
    if (groups.length) await this.#killGroups(groups).catch(() => {});
    const below = [...this.#below];
    this.#below.clear();
    if (below.length) await this.#kill(KILL_BELOW, below).catch(() => {});
    if (this.#options.disposable) return;
    // The next sandbox on a dedicated host finds nothing of this one running.
    if (this.spec.dedicated && this.#id) await this.#sweep().catch(() => {});
    // A workdir whose creation was cut off (the connection dropped before the reply) may
    // exist all the same: it is removed like a created one, or stays live in the ledger.
    const made = this.#created || this.#preparing;
    if (made && this.#ownsWorkdir && this.#workdir.startsWith("/tmp/vf-")) {
      const removed = await removeWorkdir(this.#connection!, this.#workdir);
      // The host went away (sshd killed, network down): the workdir stays live in the ledger,
      // so `vf cleanup` removes it once this run has ended, instead of it leaking unrecorded.
      if (!removed) return;
    }
    if (this.#ledgered()) {
      await recordSandbox({ event: "stopped", ...this.#ledgerRecord() }).catch(() => {});
    }
  }

  /** Only a per-rollout temp workdir is a sandbox worth recording (and removing later). */
  #ledgered(): boolean {
    return this.#ownsWorkdir && !this.#options.disposable && this.#id !== "";
  }

  #ledgerRecord() {
    return {
      type: "ssh",
      key: `${this.#target.host}:${this.#target.port}:${this.#workdir}`,
      id: this.#id,
      run_id: this.#options.runId,
      host: {
        host: this.#target.host,
        port: this.#target.port,
        user: this.#target.user,
        private_key_path: this.#target.privateKeyPath,
        known_hosts_path: this.#target.knownHostsPath,
        workdir: this.#workdir,
      },
    };
  }

  /** Same as {@linkcode stop}. */
  [Symbol.asyncDispose](): Promise<void> {
    return this.stop();
  }
}

/**
 * The id of the sandbox of this process that holds the dedicated host `spec` names, if any:
 * a sandbox started on that host now waits until it has stopped. A caller about to start one
 * while keeping that sandbox up until the new one is done would wait forever, so it refuses.
 */
export function dedicatedHolderOf(spec: RuntimeSpec): string | undefined {
  if (spec.type !== "ssh" || !spec.dedicated) return undefined;
  return dedicatedHostHolder(new SshRuntime(spec).address);
}

/**
 * The exclude patterns the host's tar matches exactly as {@linkcode excludeMatcher} does: a
 * name, or `*` followed by a name (`node_modules`, `*.pyc`), with no `/`, `?` or brackets
 * (tar's `*` and `?` also match `/`). Patterns that would match the archived entry itself
 * stay on this side (tar would drop the whole archive; vf matches below the entry).
 */
export function tarSideExcludes(patterns: string[], entry: string): string[] {
  return patterns.filter((p) => /^\*?[^*?[\]/\\]+$/.test(p) && !excludeMatcher([p])(entry));
}

function sshConfigPathOf(spec: SshRuntimeSpec): string | null {
  if (spec.sshConfigPath === undefined) return join(homedir(), ".ssh", "config");
  return spec.sshConfigPath === null ? null : expandHome(spec.sshConfigPath);
}

/** What the ssh configuration says about `spec.host`; null without a configuration file. */
function readSshConfig(spec: SshRuntimeSpec): SshHostConfig | null {
  const path = sshConfigPathOf(spec);
  if (path === null) return null;
  let text: string;
  try {
    text = readFileSync(path, "utf8");
  } catch (error) {
    const missing = (error as { code?: string }).code === "ENOENT";
    if (missing && spec.sshConfigPath === undefined) return null; // no ~/.ssh/config: fine
    throw new ConfigError(`Cannot read sshConfigPath "${path}": ${(error as Error).message}`);
  }
  try {
    return resolveSshHost(text, spec.host, { home: homedir(), localUser: localUser() });
  } catch (error) {
    throw new ConfigError(`${path}: ${(error as Error).message}`);
  }
}

function localUser(): string {
  try {
    return userInfo().username;
  } catch {
    return process.env.USER ?? "root";
  }
}

function signalNumber(signal: string | undefined): number {
  const table: Record<string, number> = {
    HUP: 1,
    INT: 2,
    QUIT: 3,
    ABRT: 6,
    KILL: 9,
    SEGV: 11,
    PIPE: 13,
    ALRM: 14,
    TERM: 15,
  };
  return table[(signal ?? "").replace(/^SIG/, "")] ?? 0;
}

/** Removes leftover per-rollout workdirs recorded in the ledger (`vf cleanup`). */
async function cleanupSshLedger(sandboxes: LiveSandbox[]) {
  const removed: string[] = [];
  const failed: Array<{ key: string; error: string }> = [];
  for (const sb of sandboxes) {
    const h = (sb.host ?? {}) as Record<string, unknown>;
    const dir = String(h.workdir ?? "");
    if (!dir.startsWith("/tmp/vf-")) {
      failed.push({ key: sb.key, error: `not a vf temp workdir: "${dir}"` });
      continue;
    }
    const rt = new SshRuntime({
      type: "ssh",
      host: String(h.host),
      port: Number(h.port ?? 22),
      user: h.user as string | undefined,
      privateKeyPath: h.private_key_path as string | undefined,
      knownHostsPath: h.known_hosts_path as string | undefined,
      workdir: "/",
    }, { disposable: true });
    try {
      await rt.start();
      const r = await rt.run(["rm", "-rf", "--", dir]);
      if (r.exit_code === 0) removed.push(sb.key);
      else failed.push({ key: sb.key, error: r.stderr.trim() });
    } catch (error) {
      failed.push({ key: sb.key, error: (error as Error).message });
    } finally {
      await rt.stop().catch(() => {});
    }
  }
  return { removed, failed };
}

registerCleaner("ssh", cleanupSshLedger);
