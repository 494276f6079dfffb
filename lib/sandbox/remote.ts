/**
 * The evaluator's side of sandboxed environments: starts the host under Deno's permission
 * system, pins remote modules in a lock file, and serves the host's model and sandbox
 * requests. `RemoteEnvironment` and `RemoteTaskset` look like local ones to the runner.
 * @module
 */
import { spawn } from "node:child_process";
import { createHash } from "node:crypto";
import { existsSync, statSync } from "node:fs";
import { mkdir, readFile, rename, rm, writeFile } from "node:fs/promises";
import { homedir } from "node:os";
import { delimiter, dirname, join, resolve } from "node:path";
import process from "node:process";
import { fileURLToPath, pathToFileURL } from "node:url";
import type { Runtime } from "../../runtimes/runtime.ts";
import type { ChatClient } from "../model/client.ts";
import { Dataset } from "../data/dataset.ts";
import type { RolloutOptions } from "../legacy/environment.ts";
import { ConfigError, type PermissionDenial, PermissionDeniedError } from "../errors.ts";
import type { RolloutOutput } from "../state.ts";
import {
  Task,
  type TaskData,
  type TaskHookContext,
  type TaskScores,
  Taskset,
} from "../tasks/task.ts";
import type { Row, SamplingArgs } from "../types.ts";
import { fromBase64, RemoteError, RpcPeer, toBase64 } from "./protocol.ts";
import { fetchEnv } from "../util/_fetch_env.ts";
import { terminalLines } from "../util/terminal.ts";

/** What a sandboxed environment may do beyond loading its own modules. */
export interface SandboxPermissions {
  /** Hosts (`host` or `host:port`) it may connect to. */
  allowNet?: string[];
  /** Paths it may read (besides its cache dir). */
  allowRead?: string[];
  /** Environment variable names it may read. */
  allowEnv?: string[];
  /** Extra hosts it may import modules from. */
  allowImport?: string[];
}

/** Options of {@link startSandboxHost}. */
export interface SandboxHostOptions {
  /** The environment module: an http(s) URL or a local path/file URL. */
  spec: string;
  kind: "environment" | "taskset";
  args: Record<string, unknown>;
  permissions?: SandboxPermissions;
  /** Lock file pinning remote modules' content hashes; default `./vf.lock`. */
  lockFile?: string;
  /** Accept changed remote modules (re-pin them). */
  reload?: boolean;
  /** Base of the per-environment cache dirs; default `~/.cache/vf/sandbox`. */
  cacheRoot?: string;
  /** The `deno` executable; default this process under Deno, else `deno` on PATH. */
  denoPath?: string;
  /**
   * `--trust`: the host runs with every permission, this process's environment variables and
   * working directory. Modules are still pinned in the lock file, and model and sandbox calls
   * still go through the evaluator.
   */
  trusted?: boolean;
}

/** Find the Deno executable for the sandbox, or explain how to get one. */
export function findDeno(): string {
  // deno-lint-ignore no-explicit-any
  const g = globalThis as any;
  if (g.Deno?.execPath && !g.Bun) return g.Deno.execPath();
  for (const dir of (process.env.PATH ?? "").split(delimiter)) {
    const candidate = join(dir, "deno");
    if (dir && existsSync(candidate)) return candidate;
  }
  throw new ConfigError(
    'Environments loaded from URLs run under Deno\'s permission sandbox, but no "deno" is on PATH; ' +
      "install it (npm install -g deno) or pass --trust to run the environment unsandboxed",
  );
}

function isUrl(spec: string): boolean {
  return /^https?:\/\//.test(spec);
}

/** The text of the vf.json beside a module (null when there is none), and whether it came from the cache. */
async function readDeclaration(
  spec: string,
  cacheFile: string,
): Promise<{ text: string | null; offline: boolean }> {
  if (isUrl(spec)) {
    let res: Response;
    try {
      res = await fetch(new URL("vf.json", spec), { signal: AbortSignal.timeout(10_000) });
    } catch {
      // Offline: the copy saved when it was pinned (checked against the pin like a fetch).
      return {
        text: existsSync(cacheFile) ? await readFile(cacheFile, "utf8") : null,
        offline: true,
      };
    }
    if (!res.ok) await res.body?.cancel();
    const text = res.ok ? await res.text() : null;
    if (text === null) await rm(cacheFile, { force: true });
    else await writeFile(cacheFile, text);
    return { text, offline: false };
  }
  const path = spec.startsWith("file:") ? fileURLToPath(spec) : spec;
  const file = join(path.endsWith(".ts") || path.endsWith(".js") ? dirname(path) : path, "vf.json");
  return { text: existsSync(file) ? await readFile(file, "utf8") : null, offline: false };
}

/** What a vf.json declares. */
function declaredPermissions(text: string | null): SandboxPermissions {
  if (text === null) return {};
  try {
    const p = JSON.parse(text)?.permissions ?? {};
    return { allowNet: p.net ?? [], allowImport: p.import ?? [], allowEnv: [], allowRead: [] };
  } catch {
    return {};
  }
}

/**
 * Pins a URL environment's vf.json (what it may reach) in the lock file beside its modules,
 * as a `remote` entry Deno keeps: the sha256 of its text, or "absent". A declaration that
 * differs from the pin is refused unless `--reload`; the first run pins it before the host
 * starts (so the host's own lock writes keep the entry).
 */
async function pinDeclaration(
  lockFile: string,
  moduleUrl: string,
  declaration: { text: string | null; offline: boolean },
  spec: string,
): Promise<void> {
  const { text } = declaration;
  const key = new URL("vf.json", moduleUrl).href;
  const digest = text === null ? "absent" : createHash("sha256").update(text).digest("hex");
  const lock = existsSync(lockFile)
    ? JSON.parse(await readFile(lockFile, "utf8"))
    : { version: "5", remote: {} };
  lock.remote ??= {};
  const pinned = lock.remote[key];
  if (pinned === digest) return;
  if (declaration.offline && pinned !== undefined) {
    throw new ConfigError(
      `Cannot fetch "${key}" (offline) and no copy of the pinned version is cached; run once ` +
        `online to check it against "${lockFile}"`,
    );
  }
  if (pinned !== undefined) {
    const d = declaredPermissions(text);
    const now = text === null
      ? "it was removed"
      : `it now declares net: [${(d.allowNet ?? []).join(", ")}], import: [${
        (d.allowImport ?? []).join(", ")
      }]`;
    const what = pinned === "absent" ? "was added" : text === null ? "was removed" : "changed";
    throw new ConfigError(
      `The permissions of environment "${spec}" changed since they were pinned in ` +
        `"${lockFile}": "${key}" ${what} (${now}); re-run with --reload to accept them`,
    );
  }
  lock.remote[key] = digest;
  await mkdir(dirname(lockFile), { recursive: true });
  await writeLock(lockFile, lock);
}

/** The module URL of a spec: URLs as given; a local file or folder (folder → its mod.ts). */
function localModuleUrl(spec: string): string {
  if (isUrl(spec)) return spec;
  if (/^[\w-]+$/.test(spec)) {
    // A built-in id: its module in vf's environments/ folder.
    const builtin = new URL(
      `../../environments/${spec.replaceAll("-", "_")}/mod.ts`,
      import.meta.url,
    );
    if (existsSync(builtin)) return builtin.href;
  }
  let path = spec.startsWith("file:") ? fileURLToPath(spec) : resolve(spec);
  if (existsSync(path) && statSync(path).isDirectory()) path = join(path, "mod.ts");
  if (!existsSync(path)) throw new ConfigError(`Environment path "${spec}" does not exist`);
  return pathToFileURL(path).href;
}

function hostPort(url: string): string {
  const u = new URL(url);
  return u.port ? `${u.hostname}:${u.port}` : u.hostname;
}

/**
 * Writes the lock file through a temp file and a rename: another vf in the same folder (or its
 * sandbox's deno, reading `--lock`) never sees it empty or half written.
 */
async function writeLock(lockFile: string, lock: unknown): Promise<void> {
  const tmp = `${lockFile}.${process.pid}.${crypto.randomUUID().slice(0, 8)}.tmp`;
  await writeFile(tmp, JSON.stringify(lock, null, 2) + "\n");
  await rename(tmp, lockFile);
}

/** Drop pinned entries of one origin so a `--reload` can re-pin them. */
async function unpin(lockFile: string, origin: string): Promise<void> {
  if (!existsSync(lockFile)) return;
  const lock = JSON.parse(await readFile(lockFile, "utf8"));
  for (const key of Object.keys(lock.remote ?? {})) {
    if (key.startsWith(`${origin}/`)) delete lock.remote[key];
  }
  await writeLock(lockFile, lock);
}

/**
 * The host's entry file. From source it is `host.ts` beside this module; a compiled binary
 * has no source files, so it writes the embedded copy into the cache first.
 */
async function hostEntry(cacheRoot: string): Promise<string> {
  const here = new URL("./host.ts", import.meta.url);
  if (here.protocol === "file:" && existsSync(fileURLToPath(here))) return fileURLToPath(here);
  const { HOST_SOURCE } = await import("./_host_source.ts");
  const digest = createHash("sha256").update(JSON.stringify(HOST_SOURCE)).digest("hex").slice(
    0,
    12,
  );
  const dir = join(cacheRoot, `host-${digest}`);
  await mkdir(dir, { recursive: true });
  for (const [name, text] of Object.entries(HOST_SOURCE)) {
    const path = join(dir, name);
    if (!existsSync(path)) await writeFile(path, text);
  }
  return join(dir, "host.ts");
}

/** A running sandbox host. */
export class SandboxHost {
  readonly peer: RpcPeer;
  readonly #child: ReturnType<typeof spawn>;
  readonly #clients = new Map<number, ChatClient>();
  readonly #runtimes = new Map<number, Runtime>();
  readonly #runtimeIds = new WeakMap<Runtime, number>();
  #nextId = 1;
  #stderr = "";
  readonly done: Promise<void>;

  constructor(child: ReturnType<typeof spawn>) {
    this.#child = child;
    this.peer = new RpcPeer(
      (line) =>
        new Promise((resolve, reject) =>
          child.stdin!.write(line, (e) => (e ? reject(e) : resolve()))
        ),
      (method, params, signal) => this.#serve(method, params as Record<string, unknown>, signal),
    );
    // What the environment's code prints reaches the terminal as text only: an escape sequence
    // from untrusted code could rewrite the lines above it, retitle the window or set the
    // clipboard. A streaming decoder keeps a character split across chunks whole.
    const decoder = new TextDecoder();
    child.stderr!.on("data", (d: Uint8Array) => {
      const text = decoder.decode(d, { stream: true });
      this.#stderr = (this.#stderr + text).slice(-4000);
      process.stderr.write(terminalLines(text).replace(/^(?=.)/gm, "[sandbox] "));
    });
    this.done = this.peer.pump(
      child.stdout as unknown as AsyncIterable<Uint8Array>,
      () => {
        const integrity = /Integrity check failed[\s\S]*?Specifier: (\S+)/.exec(this.#stderr);
        if (integrity) return new ConfigError(`Integrity check failed for "${integrity[1]}"`);
        const tail = this.#stderr.trim().split("\n").slice(-3).join(" ");
        return new ConfigError(`The sandboxed environment host exited: ${tail || "no output"}`);
      },
    );
  }

  /** Register a client for the host's model calls. */
  registerClient(client: ChatClient): number {
    const id = this.#nextId++;
    this.#clients.set(id, client);
    return id;
  }

  /** A handle for a live runtime the host may operate on. */
  runtimeHandle(runtime: Runtime): Record<string, unknown> {
    let rid = this.#runtimeIds.get(runtime);
    if (rid === undefined) {
      rid = this.#nextId++;
      this.#runtimeIds.set(runtime, rid);
      this.#runtimes.set(rid, runtime);
    }
    return { rid, type: runtime.type, id: runtime.id, capabilities: runtime.capabilities };
  }

  async #serve(method: string, p: Record<string, unknown>, signal: AbortSignal): Promise<unknown> {
    if (method === "model.get_response") {
      const client = this.#clients.get(Number(p.client));
      if (!client) throw new Error("Unknown client");
      return await client.getResponse(p.prompt as never, String(p.model), {
        tools: p.tools as never,
        samplingArgs: p.sampling_args as SamplingArgs,
        headers: p.headers as Record<string, string>,
        ...(typeof p.cache_salt === "string" ? { cacheSalt: p.cache_salt } : {}),
        signal,
      });
    }
    const runtime = this.#runtimes.get(Number(p.rid));
    if (!runtime) throw new Error(`Unknown runtime ${p.rid}`);
    switch (method) {
      case "runtime.run": {
        const o = (p.options ?? {}) as Record<string, unknown>;
        return await runtime.run(p.argv as string[], {
          ...o,
          stdin: typeof o.stdin === "string" ? fromBase64(o.stdin) : undefined,
          signal,
        });
      }
      case "runtime.read":
        return toBase64(
          await runtime.read(String(p.path), { maxBytes: p.max_bytes as number | undefined }),
        );
      case "runtime.write":
        await runtime.write(String(p.path), fromBase64(String(p.data)), {
          mode: p.mode as number | undefined,
        });
        return null;
      case "runtime.archive_out":
        return toBase64(
          await runtime.archiveOut(String(p.path), {
            maxBytes: p.max_bytes as number | undefined,
            exclude: Array.isArray(p.exclude) ? p.exclude.map(String) : undefined,
          }),
        );
      case "runtime.archive_in":
        await runtime.archiveIn(String(p.dir), fromBase64(String(p.tar)));
        return null;
      default:
        throw new Error(`Unknown method "${method}"`);
    }
  }

  /**
   * Stop the host process: it exits when its input ends; environment code may ignore SIGTERM
   * (no permission is needed) or block its event loop, so SIGKILL follows a grace period.
   */
  async close(): Promise<void> {
    const child = this.#child;
    const exited = child.exitCode !== null || child.signalCode !== null
      ? Promise.resolve()
      : new Promise<void>((resolve) => child.once("exit", () => resolve()));
    child.stdin?.end();
    child.kill("SIGTERM");
    let timer: ReturnType<typeof setTimeout> | undefined;
    const late = await Promise.race([
      exited.then(() => false),
      new Promise<boolean>((resolve) => (timer = setTimeout(() => resolve(true), 2000))),
    ]);
    clearTimeout(timer);
    if (late) child.kill("SIGKILL");
    await this.done.catch(() => {});
  }
}

/** Start a sandboxed host and load the environment or taskset in it. */
export async function startSandboxHost(
  options: SandboxHostOptions,
): Promise<{ host: SandboxHost; info: Record<string, unknown> }> {
  const deno = options.denoPath ?? findDeno();
  const url = localModuleUrl(options.spec);
  const cacheRoot = options.cacheRoot ?? join(homedir(), ".cache", "vf", "sandbox");
  const cacheDir = join(cacheRoot, createHash("sha256").update(url).digest("hex").slice(0, 16));
  await mkdir(cacheDir, { recursive: true });
  const lockFile = options.lockFile ?? join(process.cwd(), "vf.lock");
  const origin = isUrl(url) ? new URL(url).origin : null;
  if (options.reload && origin) await unpin(lockFile, origin);
  const declaration = await readDeclaration(url, join(cacheDir, "vf.json"));
  // What a URL environment may reach is pinned with its modules: a vf.json added or changed
  // after the first run cannot widen it without --reload.
  if (origin) await pinDeclaration(lockFile, url, declaration, options.spec);
  const declared = declaredPermissions(declaration.text);
  for (const host of [...(declared.allowNet ?? []), ...(declared.allowImport ?? [])]) {
    // A declaration is the environment's own claim: only plain hosts, never ranges or wildcards.
    if (!/^[A-Za-z0-9.-]+(:\d+)?$/.test(host) || /^0\.0\.0\.0(:|$)/.test(host)) {
      throw new ConfigError(
        `Environment "${options.spec}" declares network access to "${host}" in vf.json; only plain ` +
          `host or host:port entries are accepted there (grant wider access yourself with --allow-net)`,
      );
    }
  }
  if (declared.allowNet?.length && !options.trusted) {
    process.stderr.write(
      `Sandboxed environment may connect to: ${
        declared.allowNet.join(", ")
      } (declared in vf.json)\n`,
    );
  }
  const perms: Required<SandboxPermissions> = {
    allowNet: [...(declared.allowNet ?? []), ...(options.permissions?.allowNet ?? [])],
    allowRead: [...(options.permissions?.allowRead ?? [])],
    allowEnv: [...(options.permissions?.allowEnv ?? [])],
    allowImport: [...(declared.allowImport ?? []), ...(options.permissions?.allowImport ?? [])],
  };
  const reads = [cacheDir, ...perms.allowRead];
  if (!isUrl(url)) {
    // A local module under --sandbox: it may read its own folder to load its files.
    const path = fileURLToPath(url);
    reads.push(path.endsWith(".ts") || path.endsWith(".js") ? dirname(path) : path);
    // It imports vf by file URL: let it load vf's own modules (public code, no data).
    const vfRoot = fileURLToPath(new URL("../../", import.meta.url));
    reads.push(join(vfRoot, "mod.ts"), join(vfRoot, "lib"), join(vfRoot, "runtimes"));
  }
  const importHosts = [...(origin ? [hostPort(url)] : []), ...perms.allowImport];
  const hostPath = await hostEntry(cacheRoot);

  const launch = async (reloadOrigin: boolean) => {
    const permissionFlags = options.trusted ? ["--allow-all"] : [
      `--allow-read=${reads.join(",")}`,
      `--allow-write=${cacheDir}`,
      ...(importHosts.length ? [`--allow-import=${importHosts.join(",")}`] : []),
      ...(perms.allowNet.length ? [`--allow-net=${perms.allowNet.join(",")}`] : []),
      ...(perms.allowEnv.length ? [`--allow-env=${perms.allowEnv.join(",")}`] : []),
    ];
    const args = [
      "run",
      "--quiet",
      "--no-prompt",
      "--no-config",
      `--lock=${lockFile}`,
      ...permissionFlags,
      ...(reloadOrigin && origin ? [`--reload=${origin}`] : []),
      hostPath,
    ];
    const childEnv: Record<string, string> = options.trusted
      ? { ...process.env as Record<string, string>, NO_COLOR: "1" }
      : {
        HOME: cacheDir,
        NO_COLOR: "1",
        DENO_DIR: process.env.DENO_DIR ?? join(homedir(), ".cache", "deno"),
        PATH: process.env.PATH ?? "/usr/bin:/bin",
      };
    // Deno itself needs these to fetch modules; the environment's code cannot read them
    // (no --allow-env), and no credentials are passed.
    Object.assign(childEnv, fetchEnv());
    const child = spawn(deno, args, {
      cwd: options.trusted ? process.cwd() : cacheDir,
      env: childEnv,
      stdio: ["pipe", "pipe", "pipe"],
    });
    const host = new SandboxHost(child);
    try {
      const info = await host.peer.call<Record<string, unknown>>("load", {
        url,
        kind: options.kind,
        args: options.args,
        id: url.replace(/\/mod\.ts$/, "").split("/").pop(),
      });
      return { host, info };
    } catch (error) {
      await host.close();
      throw error;
    }
  };

  try {
    // Re-fetch the environment's own modules so a changed module is caught against the lock.
    return await launch(true);
  } catch (error) {
    const message = error instanceof Error ? error.message : String(error);
    if (/integrity check failed/i.test(message)) {
      const which = /for "([^"]+)"/.exec(message)?.[1] ?? options.spec;
      throw new ConfigError(
        `Remote module "${which}" changed since it was pinned in "${lockFile}"; ` +
          `re-run with --reload to accept the new version`,
      );
    }
    if (
      origin &&
      /error sending request|connection refused|dns error|failed to fetch|tcp connect/i.test(
        message,
      )
    ) {
      // Offline: run from the pinned cache.
      try {
        return await launch(false);
      } catch (second) {
        throw new ConfigError(
          `Cannot load environment "${options.spec}": ${
            second instanceof Error ? second.message : second
          }`,
        );
      }
    }
    if (error instanceof RemoteError) {
      if (error.name === "TasksetNotEnvironmentError") {
        throw new TasksetNotEnvironmentError(
          `Environment "${options.spec}" failed to load in the sandbox: ${message}`,
        );
      }
      throw new ConfigError(
        `${
          options.kind === "taskset" ? "Taskset" : "Environment"
        } "${options.spec}" failed to load in the sandbox: ${message}`,
      );
    }
    throw error;
  }
}

/**
 * A module loaded as an environment is a taskset (it exports `loadTaskset()` and no
 * `loadEnvironment()`): `vf eval` runs it as `vf run` would.
 */
export class TasksetNotEnvironmentError extends ConfigError {}

/** A sandboxed environment, driven like a local one by `generate`/`evaluate`. */
export class RemoteEnvironment {
  envId: string;
  envArgs: Record<string, unknown>;
  samplingArgs: SamplingArgs;
  passThreshold: number;
  evalDefaults: { num_examples?: number; rollouts_per_example?: number } | null;
  readonly host: SandboxHost;
  #clientIds = new WeakMap<ChatClient, number>();

  constructor(host: SandboxHost, info: Record<string, unknown>) {
    this.host = host;
    this.envId = String(info.env_id ?? "");
    this.envArgs = (info.env_args ?? {}) as Record<string, unknown>;
    this.samplingArgs = (info.sampling_args ?? {}) as SamplingArgs;
    this.passThreshold = Number(info.pass_threshold ?? 0.5);
    this.evalDefaults = (info.eval_defaults ?? null) as RemoteEnvironment["evalDefaults"];
  }

  async getEvalDataset(n = -1, seed?: number | null): Promise<Dataset> {
    return Dataset.fromList(
      await this.host.peer.call<Row[]>("env.eval_dataset", { n, seed: seed ?? null }),
    );
  }

  async runGroupOutputs(
    inputs: Row[],
    client: ChatClient,
    model: string,
    options: RolloutOptions & { independentScoring?: boolean; stateColumns?: string[] } = {},
  ): Promise<{ outputs: RolloutOutput[]; retryable: boolean }> {
    let id = this.#clientIds.get(client);
    if (id === undefined) {
      id = this.host.registerClient(client);
      this.#clientIds.set(client, id);
    }
    options.signal?.throwIfAborted();
    return await this.host.peer.call("env.run_group", {
      inputs,
      model,
      client: { id, base_url: client.baseUrl, headers_from_state: client.headersFromState },
      sampling_args: options.samplingArgs ?? {},
      independent_scoring: options.independentScoring ?? false,
      state_columns: options.stateColumns ?? [],
    }, { signal: options.signal });
  }

  setKwargs(_kwargs: Record<string, unknown>): void {
    throw new ConfigError(
      "--extra-env-kwargs and --timeout are not supported for sandboxed environments",
    );
  }

  async teardown(): Promise<void> {
    await this.host.peer.call("env.teardown").catch(() => {});
    await this.host.close();
  }
}

interface RemoteTaskInfo {
  key: string;
  hash: string;
  data: TaskData;
  needs_container: boolean;
  runtime_env: Record<string, string>;
}

/** A task whose hooks run in the sandboxed host, operating on evaluator-owned runtimes. */
export class RemoteTask extends Task {
  readonly #host: SandboxHost;
  readonly #info: RemoteTaskInfo;

  constructor(host: SandboxHost, info: RemoteTaskInfo) {
    super(info.data);
    this.#host = host;
    this.#info = info;
  }

  override get key(): string {
    return this.#info.key;
  }

  override get hash(): string {
    return this.#info.hash;
  }

  override get needsContainer(): boolean {
    return this.#info.needs_container;
  }

  override runtimeEnv(): Record<string, string> {
    return { ...this.#info.runtime_env };
  }

  /** A call into the sandbox; a permission denial there becomes a typed error here. */
  async #call<T>(method: string, params: Record<string, unknown>): Promise<T> {
    try {
      return await this.#host.peer.call<T>(method, params);
    } catch (error) {
      const denied = error instanceof RemoteError
        ? error.data?.permission_denied as PermissionDenial | undefined
        : undefined;
      if (denied) {
        throw new PermissionDeniedError((error as Error).message, denied, { cause: error });
      }
      throw error;
    }
  }

  async #hook(hook: string, ctx: TaskHookContext): Promise<unknown> {
    const r = await this.#call<{ result: unknown; info: Record<string, unknown> }>(
      "task.hook",
      {
        key: this.key,
        hook,
        runtime: this.#host.runtimeHandle(ctx.runtime),
        info: ctx.trace.info,
        messages: ctx.trace.messages,
      },
    );
    Object.assign(ctx.trace.info, r.info);
    return r.result;
  }

  override async setup(ctx: TaskHookContext): Promise<void> {
    await this.#hook("setup", ctx);
  }

  override async finalize(ctx: TaskHookContext): Promise<void> {
    await this.#hook("finalize", ctx);
  }

  override async stageVerifier(ctx: TaskHookContext): Promise<void> {
    await this.#hook("stageVerifier", ctx);
  }

  override async validate(ctx: TaskHookContext): Promise<boolean | void> {
    return (await this.#hook("validate", ctx)) as boolean | undefined;
  }

  override async score(ctx: TaskHookContext): Promise<TaskScores> {
    const r = await this.#call<{ scores: TaskScores; info: Record<string, unknown> }>(
      "task.score",
      {
        key: this.key,
        runtime: this.#host.runtimeHandle(ctx.runtime),
        info: ctx.trace.info,
        messages: ctx.trace.messages,
      },
    );
    Object.assign(ctx.trace.info, r.info);
    return r.scores;
  }
}

/** A sandboxed taskset. */
export class RemoteTaskset extends Taskset<RemoteTask> {
  readonly #id: string;
  readonly host: SandboxHost;

  constructor(host: SandboxHost, info: Record<string, unknown>) {
    super({});
    this.host = host;
    this.#id = String(info.id ?? "remote");
  }

  get id(): string {
    return this.#id;
  }

  async load(): Promise<RemoteTask[]> {
    const list = await this.host.peer.call<RemoteTaskInfo[]>("taskset.list", { limit: -1 });
    return list.map((info) => new RemoteTask(this.host, info));
  }

  async close(): Promise<void> {
    await this.host.close();
  }
}
