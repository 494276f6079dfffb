/**
 * The subprocess runtime: a temp directory on this machine as the "sandbox" and host
 * processes as its commands. It isolates nothing (`capabilities.isolation` is false); use
 * it to develop environments without Docker.
 *
 * Paths: the temp dir stands for the sandbox's `/`. Sandbox paths given to `read`, `write`,
 * `archiveOut`, `archiveIn` and `cwd` are resolved against the workdir (default `/`, i.e.
 * the temp dir itself), so `/workspace/x` maps to `<tmp>/workspace/x` and `x` to
 * `<tmp>/<workdir>/x`. Commands see real host paths: they start in the mapped workdir, so
 * relative paths agree, but an absolute path inside a command is the host's.
 *
 * Environment: commands inherit only PATH, LANG, TERM and TZ from this process (never a
 * variable whose name looks like a credential: KEY, TOKEN, SECRET, PASSWORD, CREDENTIAL,
 * AUTH), HOME is the temp dir, and the spec's and the call's `env` are added as given.
 * @module
 */

import { excludeMatcher, TarCollector } from "./_tar.ts";
import { type ChildProcess, spawn } from "node:child_process";
import { chmod, mkdir, readFile, realpath, rm, stat, writeFile } from "node:fs/promises";
import { rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { basename, dirname, join } from "node:path";
import process from "node:process";
import { CommandTimeoutError } from "../lib/errors.ts";
import {
  decodeChunks,
  describeArgv,
  MAX_TIMER_MS,
  randomHex,
  requireArgv,
  resolveSandboxPath,
  toBytes,
  within,
} from "./_util.ts";
import { type LiveSandbox, recordSandbox, registerCleaner } from "./ledger.ts";
import {
  SandboxError,
  SandboxFileNotFoundError,
  SandboxFileTooLargeError,
  SandboxStateError,
  SandboxUnsupportedError,
} from "./errors.ts";
import { trackRuntime, untrackRuntime } from "./registry.ts";
import type {
  ArchiveOutOptions,
  RunOptions,
  RunResult,
  Runtime,
  RuntimeCapabilities,
  SubprocessRuntimeSpec,
} from "./runtime.ts";

/** Variables inherited from this process (after the credential filter). */
export const INHERITED_ENV = ["PATH", "LANG", "TERM", "TZ"] as const;
/** Names that are never inherited. */
export const SECRET_ENV_PATTERN = /KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL|AUTH/i;

/**
 * The environment of a subprocess command: the inherited allow-list minus credentials,
 * HOME set to `home`, then each of `extra` merged in order.
 */
export function scrubbedEnv(
  home: string,
  ...extra: Array<Record<string, string> | undefined>
): Record<string, string> {
  const env: Record<string, string> = {};
  for (const name of INHERITED_ENV) {
    const value = process.env[name];
    if (value !== undefined && !SECRET_ENV_PATTERN.test(name)) env[name] = value;
  }
  env.HOME = home;
  for (const more of extra) Object.assign(env, more);
  return env;
}

type State = "new" | "running" | "stopped";

/** A temp directory and host processes as a {@linkcode Runtime}. */
export class SubprocessRuntime implements Runtime {
  readonly type = "subprocess";
  readonly capabilities: RuntimeCapabilities = {
    isolation: false,
    users: false,
    network_control: false,
  };
  readonly spec: SubprocessRuntimeSpec;
  #root = "";
  #workdir: string;
  #state: State = "new";
  #starting: Promise<void> | undefined;
  #stopping: Promise<void> | undefined;
  /** Process groups started by run(); killed on stop. */
  #groups = new Set<number>();

  readonly #runId: string | undefined;

  constructor(
    spec: SubprocessRuntimeSpec = { type: "subprocess" },
    options: { runId?: string } = {},
  ) {
    this.spec = spec;
    this.#runId = options.runId;
    this.#workdir = resolveSandboxPath("/", spec.workdir ?? "/");
  }

  /** The temp dir; `""` before start. */
  get id(): string {
    return this.#root;
  }

  /** The sandbox path of the working directory. */
  get workdir(): string {
    return this.#workdir;
  }

  /** The host path a sandbox path maps to. */
  hostPath(path: string): string {
    this.#requireRunning();
    return join(this.#root, resolveSandboxPath(this.#workdir, path));
  }

  /** Creates the temp dir and the workdir inside it. */
  start(_options: { signal?: AbortSignal } = {}): Promise<void> {
    if (this.#state === "stopped") {
      return Promise.reject(new SandboxStateError("Cannot start a stopped subprocess runtime"));
    }
    this.#starting ??= (async () => {
      trackRuntime(this);
      try {
        // The name is chosen first so the ledger knows it before it exists (vf cleanup
        // removes it if this process dies without stopping).
        const root = join(await realpath(tmpdir()), `vf-subprocess-${randomHex(6)}`);
        await recordSandbox({ event: "requested", ...this.#ledgerRecord(root) });
        await mkdir(root, { mode: 0o700 });
        this.#root = root;
        await recordSandbox({ event: "created", ...this.#ledgerRecord(root) });
        await mkdir(join(this.#root, this.#workdir), { recursive: true });
      } catch (error) {
        this.#state = "stopped";
        untrackRuntime(this);
        if (this.#root) await rm(this.#root, { recursive: true, force: true });
        throw new SandboxError(`Cannot create the subprocess runtime's workspace: ${error}`, {
          cause: error,
        });
      }
      if (this.#state === "stopped") {
        throw new SandboxStateError("The subprocess runtime was stopped while it was starting");
      }
      this.#state = "running";
    })();
    return this.#starting;
  }

  #requireRunning(): void {
    if (this.#state === "running") return;
    if (this.#state === "stopped") {
      throw new SandboxStateError(`Subprocess runtime "${this.#root}" is stopped`);
    }
    throw new SandboxStateError("The subprocess runtime is not started; call start() first");
  }

  /** Runs `argv` as a host process in its own process group. */
  async run(argv: string[], options: RunOptions = {}): Promise<RunResult> {
    this.#requireRunning();
    requireArgv(argv);
    if (options.user !== undefined) {
      throw new SandboxUnsupportedError(
        `The subprocess runtime cannot run commands as user "${options.user}"; use a docker ` +
          `runtime (capabilities.users is false)`,
      );
    }
    const { signal, timeoutMs } = options;
    signal?.throwIfAborted();
    const started = performance.now();
    const cwd = this.hostPath(options.cwd ?? ".");
    if (!(await stat(cwd).then((s) => s.isDirectory(), () => false))) {
      throw new SandboxFileNotFoundError(
        options.cwd ?? ".",
        `Working directory "${options.cwd}" does not exist in subprocess runtime "${this.#root}"`,
      );
    }
    const stdin = options.stdin === undefined ? undefined : toBytes(options.stdin);
    const child = spawn(argv[0], argv.slice(1), {
      cwd,
      env: scrubbedEnv(this.#root, this.spec.env, options.env),
      detached: true, // own session and process group, so the whole tree can be killed
      stdio: [stdin === undefined ? "ignore" : "pipe", "pipe", "pipe"],
    });
    const stdout: Uint8Array[] = [];
    const stderr: Uint8Array[] = [];
    child.stdout!.on("data", (chunk: Uint8Array) => stdout.push(chunk));
    child.stderr!.on("data", (chunk: Uint8Array) => stderr.push(chunk));
    if (child.pid !== undefined) this.#groups.add(child.pid);
    if (stdin !== undefined) {
      child.stdin!.on("error", () => {}); // the command may exit without reading
      child.stdin!.end(stdin);
    }

    const exited = waitForExit(child);
    let timer: ReturnType<typeof setTimeout> | undefined;
    let onAbort: (() => void) | undefined;
    const interrupted = new Promise<"timeout" | "abort">((resolve) => {
      if (timeoutMs !== undefined && timeoutMs <= MAX_TIMER_MS) {
        timer = setTimeout(() => resolve("timeout"), timeoutMs);
      }
      if (signal) {
        onAbort = () => resolve("abort");
        signal.addEventListener("abort", onAbort, { once: true });
      }
    });
    const outcome = await Promise.race([exited, interrupted]);
    clearTimeout(timer);
    if (onAbort) signal?.removeEventListener("abort", onAbort);

    if (outcome === "timeout" || outcome === "abort") {
      killGroup(child.pid);
      await within(exited, 2_000);
      child.stdout!.destroy();
      child.stderr!.destroy();
      if (outcome === "abort") throw signal!.reason;
      throw new CommandTimeoutError(
        `Command "${describeArgv(argv)}" did not finish within ${timeoutMs} ms in subprocess ` +
          `runtime "${this.#root}"; its process group was killed (raise timeoutMs if it needs ` +
          `longer)`,
        { cause: new DOMException(`Timed out after ${timeoutMs} ms`, "TimeoutError") },
      );
    }
    if (outcome.error) {
      const code = (outcome.error as { code?: string }).code;
      if (code === "ENOENT" || code === "EACCES") {
        // As a shell reports it: a result, not an infrastructure failure.
        return {
          exit_code: code === "ENOENT" ? 127 : 126,
          stdout: "",
          stderr: `${argv[0]}: ${code === "ENOENT" ? "command not found" : "permission denied"}\n`,
          duration_ms: Math.round(performance.now() - started),
        };
      }
      throw new SandboxError(`Cannot run "${describeArgv(argv)}": ${outcome.error}`, {
        cause: outcome.error,
      });
    }
    return {
      exit_code: outcome.code,
      stdout: decodeChunks(stdout),
      stderr: decodeChunks(stderr),
      duration_ms: Math.round(performance.now() - started),
    };
  }

  /** Reads a file of the workspace. */
  async read(path: string, options: { maxBytes?: number } = {}): Promise<Uint8Array> {
    const real = this.hostPath(path);
    const info = await stat(real).catch((error) => {
      if (error?.code === "ENOENT" || error?.code === "ENOTDIR") {
        throw new SandboxFileNotFoundError(
          path,
          `Path "${path}" does not exist in subprocess runtime "${this.#root}"`,
          { cause: error },
        );
      }
      throw new SandboxError(`Cannot read "${path}": ${error}`, { cause: error });
    });
    if (info.isDirectory()) {
      throw new SandboxError(
        `Path "${path}" in subprocess runtime "${this.#root}" is a directory; read a file or ` +
          `use archiveOut()`,
      );
    }
    if (options.maxBytes !== undefined && info.size > options.maxBytes) {
      throw new SandboxFileTooLargeError(
        path,
        info.size,
        options.maxBytes,
        `subprocess runtime "${this.#root}"`,
      );
    }
    const data = await readFile(real);
    return new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
  }

  /** Writes a file of the workspace, creating parent directories. */
  async write(
    path: string,
    data: string | Uint8Array,
    options: { mode?: number } = {},
  ): Promise<void> {
    const real = this.hostPath(path);
    await mkdir(dirname(real), { recursive: true });
    const mode = options.mode ?? 0o644;
    await writeFile(real, toBytes(data), { mode });
    await chmod(real, mode);
  }

  /** A tar of `path` (host `tar`), entries named from its basename. */
  async archiveOut(path: string, options: ArchiveOutOptions = {}): Promise<Uint8Array> {
    const real = this.hostPath(path);
    await stat(real).catch((error) => {
      throw new SandboxFileNotFoundError(
        path,
        `Path "${path}" does not exist in subprocess runtime "${this.#root}"`,
        { cause: error },
      );
    });
    const parent = dirname(real);
    const name = real === this.#root ? "." : basename(real);
    const tar = new TarCollector({
      exclude: options.exclude?.length ? excludeMatcher(options.exclude) : undefined,
      maxBytes: options.maxBytes,
      tooLarge: (bytes) =>
        new SandboxFileTooLargeError(
          path,
          bytes,
          options.maxBytes!,
          `subprocess runtime "${this.#root}"`,
        ),
    });
    tar.push(await hostTar(["-C", parent, "-cf", "-", name], undefined));
    return tar.finish();
  }

  /** Extracts `tar` into `dir` (host `tar`), creating it first. */
  async archiveIn(dir: string, tar: Uint8Array): Promise<void> {
    const real = this.hostPath(dir);
    await mkdir(real, { recursive: true });
    await hostTar(["-C", real, "--no-same-owner", "-xf", "-"], tar);
  }

  /** Kills the process groups it started and removes the temp dir. Idempotent. */
  stop(): Promise<void> {
    if (this.#stopping) return this.#stopping;
    this.#state = "stopped";
    this.#stopping = (async () => {
      await this.#starting?.catch(() => {});
      for (const pid of this.#groups) killGroup(pid);
      this.#groups.clear();
      if (this.#root) {
        await rm(this.#root, { recursive: true, force: true });
        await recordSandbox({ event: "stopped", ...this.#ledgerRecord(this.#root) }).catch(
          () => {},
        );
      }
    })().finally(() => untrackRuntime(this));
    return this.#stopping;
  }

  #ledgerRecord(root: string) {
    return { type: "subprocess", key: root, id: root, run_id: this.#runId, host: { path: root } };
  }

  /** Synchronous cleanup for process exit. */
  stopSync(): void {
    for (const pid of this.#groups) killGroup(pid);
    this.#groups.clear();
    if (this.#root) rmSync(this.#root, { recursive: true, force: true });
  }

  /** Same as {@linkcode stop}. */
  [Symbol.asyncDispose](): Promise<void> {
    return this.stop();
  }
}

type Exit = { code: number; error?: undefined } | { code: -1; error: Error };

/**
 * Resolves when the process has exited and its stdout/stderr are drained, or `graceMs` after
 * it exited when background children still hold the pipes (Docker's exec does the same).
 */
function waitForExit(child: ChildProcess, graceMs = 2_000): Promise<Exit> {
  return new Promise((resolve) => {
    let timer: ReturnType<typeof setTimeout> | undefined;
    let done = false;
    const finish = (exit: Exit) => {
      done = true;
      clearTimeout(timer);
      resolve(exit);
    };
    const codeOf = (code: number | null, signal: string | null) =>
      code ?? (signal ? 128 + signalNumber(signal) : 1);
    child.once("error", (error) => finish({ code: -1, error }));
    child.once("exit", (code, signal) => {
      if (done) return;
      timer = setTimeout(() => {
        child.stdout?.destroy();
        child.stderr?.destroy();
        finish({ code: codeOf(code, signal) });
      }, graceMs);
    });
    child.once("close", (code, signal) => finish({ code: codeOf(code, signal) }));
  });
}

function signalNumber(signal: string): number {
  const table: Record<string, number> = {
    SIGHUP: 1,
    SIGINT: 2,
    SIGQUIT: 3,
    SIGABRT: 6,
    SIGKILL: 9,
    SIGSEGV: 11,
    SIGPIPE: 13,
    SIGALRM: 14,
    SIGTERM: 15,
  };
  return table[signal] ?? 0;
}

function killGroup(pid: number | undefined): void {
  if (pid === undefined) return;
  try {
    process.kill(-pid, "SIGKILL");
  } catch {
    // already gone
  }
}

async function hostTar(args: string[], input: Uint8Array | undefined): Promise<Uint8Array> {
  const child = spawn("tar", args, {
    stdio: [input === undefined ? "ignore" : "pipe", "pipe", "pipe"],
    env: { PATH: process.env.PATH ?? "/usr/bin:/bin", LANG: "C" },
  });
  const out: Uint8Array[] = [];
  const err: Uint8Array[] = [];
  child.stdout!.on("data", (c: Uint8Array) => out.push(c));
  child.stderr!.on("data", (c: Uint8Array) => err.push(c));
  if (input !== undefined) {
    child.stdin!.on("error", () => {});
    child.stdin!.end(input);
  }
  const result = await waitForExit(child);
  if (result.error || result.code !== 0) {
    const detail = result.error ? String(result.error) : decodeChunks(err).trim();
    throw new SandboxError(`Host tar ${args.join(" ")} failed: ${detail}`, { cause: result.error });
  }
  const total = out.reduce((n, c) => n + c.length, 0);
  const bytes = new Uint8Array(total);
  let offset = 0;
  for (const c of out) {
    bytes.set(c, offset);
    offset += c.length;
  }
  return bytes;
}

/** Removes temp dirs of subprocess runtimes whose evaluator died (`vf cleanup`). */
async function cleanupSubprocessLedger(sandboxes: LiveSandbox[]) {
  const removed: string[] = [];
  const gone: string[] = [];
  const failed: Array<{ key: string; error: string }> = [];
  const base = await realpath(tmpdir()).catch(() => tmpdir());
  for (const sb of sandboxes) {
    const path = String((sb.host as Record<string, unknown> | undefined)?.path ?? sb.key);
    if (!path.startsWith(join(base, "vf-subprocess-"))) {
      failed.push({ key: sb.key, error: `not a vf subprocess workspace: "${path}"` });
      continue;
    }
    try {
      await stat(path);
    } catch {
      gone.push(sb.key);
      continue;
    }
    try {
      await rm(path, { recursive: true, force: true });
      removed.push(sb.key);
    } catch (error) {
      failed.push({ key: sb.key, error: String(error) });
    }
  }
  return { removed, gone, failed };
}

registerCleaner("subprocess", cleanupSubprocessLedger);
