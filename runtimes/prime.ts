/**
 * The Prime runtime: a Prime Intellect sandbox created through Prime's public HTTP API
 * (`https://api.primeintellect.ai/api/v1/sandbox`, bearer key from `PRIME_API_KEY`), driven
 * over SSH by an internal {@linkcode SshRuntime}, and deleted on stop.
 *
 * Lifecycle:
 * 1. `POST /api/v1/sandbox` with the image, resources, labels (`vf.managed=1`,
 *    `vf.run_id=<id>`, `vf.task=<task>`, plus the spec's) and `timeout_minutes`, the
 *    provider-side time to live that removes the sandbox even when vf dies without stopping
 *    it. The request carries an idempotency key, so retrying it never creates two.
 * 2. `GET /api/v1/sandbox/{id}` with bounded exponential backoff until `RUNNING`
 *    (`ERROR`, `TERMINATED`, `TIMEOUT` fail at once). Past `readyTimeoutMs` the sandbox is
 *    deleted and start fails with `SandboxUnavailableError`.
 * 3. `POST /api/v1/sandbox/{id}/ssh-session` opens an SSH endpoint; the public half of an
 *    ephemeral ed25519 key (or of `ssh.privateKeyPath`) is authorized at the session's
 *    gateway (`POST {gateway_url}/{user_ns}/{job_id}/authorize`), and the SSH runtime logs in
 *    as the session id.
 * 4. `DELETE /api/v1/sandbox/{id}` on stop, retried on transient errors; 404 means gone.
 *
 * The endpoints and fields follow Prime's API reference (docs.primeintellect.ai,
 * "Sandbox" section) and its Python SDK `prime-sandboxes`. Prime's SDK refuses SSH sessions
 * for VM sandboxes ("not yet supported"), so `vm` defaults to false (a container sandbox)
 * unless a GPU is asked for (Prime runs GPUs only in VMs); a VM sandbox works once the
 * platform opens SSH sessions to VMs.
 * @module
 */

import { Buffer } from "node:buffer";
import { readFile } from "node:fs/promises";
import process from "node:process";
import { ConfigError } from "../lib/errors.ts";
import { expandHome, randomHex, sleep, StartOnce } from "./_util.ts";
import {
  SandboxApiError,
  SandboxError,
  SandboxStateError,
  SandboxUnavailableError,
} from "./errors.ts";
import { untrackRuntime } from "./registry.ts";
import { type LiveSandbox, recordSandbox, registerCleaner } from "./ledger.ts";
import type { RunOptions, RunResult, Runtime, RuntimeCapabilities } from "./runtime.ts";
import { loadSsh2, SshConnectError, SshRuntime } from "./ssh.ts";

/** Prime's public API. */
export const PRIME_API_BASE = "https://api.primeintellect.ai";

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

/** A sandbox as Prime's API reports it (the fields vf uses). */
export interface PrimeSandbox {
  id: string;
  name: string;
  status: string;
  labels: string[];
  createdAt?: string;
  errorType?: string | null;
  errorMessage?: string | null;
  pendingImageBuildId?: string | null;
}

/** What `POST /sandbox/{id}/ssh-session` answers. */
interface SshSession {
  session_id: string;
  sandbox_id: string;
  host: string;
  port: number;
  gateway_url: string;
  user_ns: string;
  job_id: string;
  token: string;
  ttl_seconds: number;
}

/** How to reach Prime's API. */
export interface PrimeApiOptions {
  /** Default `https://api.primeintellect.ai`. */
  apiBase?: string;
  /** Environment variable holding the key; default `PRIME_API_KEY`. */
  apiKeyVar?: string;
  /** Team; default `PRIME_TEAM_ID` when set. */
  teamId?: string;
}

const FAILED = new Set(["ERROR", "TERMINATED", "TIMEOUT"]);
const MAX_SESSION_TTL_S = 3600;

/** A small client for the parts of Prime's sandbox API vf uses. */
export class PrimeApi {
  readonly base: string;
  readonly keyVar: string;
  readonly teamId: string | undefined;

  constructor(options: PrimeApiOptions = {}) {
    this.base = (options.apiBase ?? PRIME_API_BASE).replace(/\/+$/, "").replace(/\/api\/v1$/, "");
    this.keyVar = options.apiKeyVar ?? "PRIME_API_KEY";
    this.teamId = options.teamId ?? (process.env.PRIME_TEAM_ID || undefined);
  }

  #key(): string {
    const key = process.env[this.keyVar];
    if (!key) {
      throw new ConfigError(
        `The Prime API key is not set: set ${this.keyVar} to a key from ` +
          `https://app.primeintellect.ai/dashboard/tokens`,
      );
    }
    return key;
  }

  /**
   * One API call with retries of transient failures (network errors, 408, 429, 5xx).
   * @returns the JSON body, or undefined for 404 when `allow404`
   */
  async request<T>(
    method: string,
    path: string,
    options: { body?: unknown; query?: URLSearchParams; allow404?: boolean; attempts?: number } =
      {},
  ): Promise<T | undefined> {
    const key = this.#key();
    const url = `${this.base}/api/v1${path}${options.query ? `?${options.query}` : ""}`;
    const attempts = options.attempts ?? 5;
    let lastError: unknown;
    for (let attempt = 1; attempt <= attempts; attempt++) {
      let response: Response;
      try {
        response = await fetch(url, {
          method,
          headers: {
            Authorization: `Bearer ${key}`,
            "Content-Type": "application/json",
            "User-Agent": "vf",
          },
          body: options.body === undefined ? undefined : JSON.stringify(options.body),
          signal: AbortSignal.timeout(30_000),
        });
      } catch (error) {
        lastError = new SandboxUnavailableError(
          `Cannot reach the Prime API at "${this.base}": ${(error as Error).message}; check ` +
            `the network or apiBase`,
          { cause: error },
        );
        if (attempt < attempts) await sleep(backoff(attempt));
        continue;
      }
      const text = await response.text();
      if (response.ok) return (text ? JSON.parse(text) : {}) as T;
      if (response.status === 404 && options.allow404) return undefined;
      const detail = errorDetail(text);
      const what = `${method} ${path}`;
      if (response.status === 401 || response.status === 403) {
        throw new SandboxApiError(
          response.status,
          `The Prime API rejected the key in ${this.keyVar} (HTTP ${response.status} on ${what}` +
            `${detail ? `: ${detail}` : ""}); check the key and its permissions at ` +
            `https://app.primeintellect.ai/dashboard/tokens`,
        );
      }
      if (response.status === 402) {
        throw new SandboxApiError(
          402,
          `The Prime API asks for payment (HTTP 402 on ${what}); check billing at ` +
            `https://app.primeintellect.ai/dashboard/billing`,
        );
      }
      lastError = new SandboxApiError(
        response.status,
        `The Prime API answered HTTP ${response.status} to ${what}${detail ? `: ${detail}` : ""}`,
      );
      const transient = response.status === 408 || response.status === 429 ||
        response.status >= 500;
      if (!transient || attempt === attempts) throw lastError;
      const retryAfter = Number(response.headers.get("retry-after"));
      await sleep(
        Number.isFinite(retryAfter) && retryAfter > 0
          ? Math.min(retryAfter * 1000, 30_000)
          : backoff(attempt),
      );
    }
    throw lastError;
  }

  /** `POST /sandbox`. */
  async create(body: Record<string, unknown>): Promise<PrimeSandbox> {
    if (this.teamId && body.team_id === undefined) body = { ...body, team_id: this.teamId };
    return (await this.request<PrimeSandbox>("POST", "/sandbox", { body }))!;
  }

  /** `GET /sandbox/{id}`; undefined when it does not exist. */
  async get(id: string): Promise<PrimeSandbox | undefined> {
    return await this.request<PrimeSandbox>("GET", `/sandbox/${encodeURIComponent(id)}`, {
      allow404: true,
    });
  }

  /** `DELETE /sandbox/{id}`; false when it was already gone. */
  async delete(id: string): Promise<boolean> {
    const result = await this.request("DELETE", `/sandbox/${encodeURIComponent(id)}`, {
      allow404: true,
      attempts: 6,
    });
    return result !== undefined;
  }

  /** `GET /sandbox`, every page, with all of `labels`. */
  async list(options: { labels?: string[]; activeOnly?: boolean } = {}): Promise<PrimeSandbox[]> {
    const out: PrimeSandbox[] = [];
    for (let page = 1; page <= 1000; page++) {
      const query = new URLSearchParams({ page: String(page), per_page: "100" });
      for (const label of options.labels ?? []) query.append("labels", label);
      if (options.activeOnly !== false) query.set("is_active", "true");
      if (this.teamId) query.set("team_id", this.teamId);
      const body = (await this.request<{ sandboxes: PrimeSandbox[]; hasNext?: boolean }>(
        "GET",
        "/sandbox",
        { query },
      ))!;
      out.push(...(body.sandboxes ?? []));
      if (!body.hasNext) break;
    }
    return out;
  }

  /** `POST /sandbox/{id}/ssh-session`. */
  async sshSession(id: string, ttlSeconds: number): Promise<SshSession> {
    return (await this.request<SshSession>(
      "POST",
      `/sandbox/${encodeURIComponent(id)}/ssh-session`,
      { body: { ttl_seconds: ttlSeconds } },
    ))!;
  }

  /** Authorizes `publicKey` for an SSH session at the session's gateway. */
  async authorizeKey(session: SshSession, publicKey: string): Promise<void> {
    const url = `${session.gateway_url.replace(/\/+$/, "")}/${session.user_ns}/${session.job_id}` +
      `/authorize`;
    let lastError: unknown;
    for (let attempt = 1; attempt <= 5; attempt++) {
      try {
        const response = await fetch(url, {
          method: "POST",
          headers: { Authorization: `Bearer ${session.token}`, "Content-Type": "application/json" },
          body: JSON.stringify({
            session_id: session.session_id,
            public_key: publicKey,
            ttl_seconds: session.ttl_seconds,
          }),
          signal: AbortSignal.timeout(30_000),
        });
        const text = await response.text();
        if (response.ok) return;
        lastError = new SandboxApiError(
          response.status,
          `Prime's SSH gateway refused the session key (HTTP ${response.status}` +
            `${errorDetail(text) ? `: ${errorDetail(text)}` : ""})`,
        );
        if (response.status < 500 && response.status !== 429) throw lastError;
      } catch (error) {
        if (error instanceof SandboxApiError && error.status < 500 && error.status !== 429) {
          throw error;
        }
        lastError = error instanceof SandboxError ? error : new SandboxUnavailableError(
          `Cannot reach Prime's SSH gateway: ${(error as Error).message}`,
          { cause: error },
        );
      }
      await sleep(backoff(attempt));
    }
    throw lastError;
  }
}

function backoff(attempt: number): number {
  const base = Math.min(500 * 2 ** (attempt - 1), 8_000);
  return base * (0.75 + Math.random() * 0.5);
}

function errorDetail(text: string): string {
  try {
    const body = JSON.parse(text);
    const detail = body?.detail ?? body?.message ?? body?.error;
    if (typeof detail === "string") return detail;
    if (detail !== undefined) return JSON.stringify(detail).slice(0, 300);
  } catch {
    // not JSON
  }
  return text.trim().slice(0, 300);
}

function labelList(labels: PrimeRuntimeSpec["labels"]): string[] {
  if (!labels) return [];
  if (Array.isArray(labels)) return labels.map(String);
  return Object.entries(labels).map(([k, v]) => `${k}=${v}`);
}

/** Parses `"H100_80GB"`, `"H100_80GB:2"`. */
function parseGpu(gpu: string | undefined): { type?: string; count: number } {
  if (!gpu) return { count: 0 };
  const [type, count] = gpu.split(":");
  const n = count === undefined ? 1 : Number(count);
  if (!type || !Number.isInteger(n) || n < 1) {
    throw new ConfigError(`Invalid gpu "${gpu}"; use a type like "H100_80GB" or "H100_80GB:2"`);
  }
  return { type, count: n };
}

/** Options of {@linkcode PrimeRuntime}'s constructor besides the spec. */
export interface PrimeRuntimeOptions {
  /** Run id for the `vf.run_id` label. */
  runId?: string;
  /** Task name or id for the `vf.task` label. */
  task?: string;
}

/**
 * A Prime sandbox as a {@linkcode Runtime}.
 *
 * @example
 * ```ts
 * // PRIME_API_KEY must be set.
 * await using rt = new PrimeRuntime(
 *   { type: "prime", image: "python:3.11-slim", cpu: 2, memory: 4, ttlMinutes: 30 },
 *   { runId: "run-1", task: "task-7" },
 * );
 * await rt.start(); // creates, waits until RUNNING, connects over SSH
 * await rt.write("main.py", "print(6 * 7)\n");
 * console.log((await rt.run(["python3", "main.py"])).stdout); // "42\n"
 * ```
 * @throws {ConfigError} from the constructor for an invalid spec, and from start() when the
 *   API key variable is not set
 * @throws {SandboxApiError} from start() when the API refuses the request (401, 402, 422, ...)
 * @throws {SandboxUnavailableError} from start() when the sandbox fails or is not ready in time
 */
export class PrimeRuntime implements Runtime {
  readonly type = "prime";
  readonly capabilities: RuntimeCapabilities = {
    isolation: true,
    users: false,
    network_control: false,
  };
  readonly spec: PrimeRuntimeSpec;
  readonly api: PrimeApi;
  #options: PrimeRuntimeOptions;
  #id = "";
  #name = "";
  #ssh: SshRuntime | undefined;
  #life = new StartOnce();
  #stopping: Promise<void> | undefined;

  constructor(spec: PrimeRuntimeSpec, options: PrimeRuntimeOptions = {}) {
    const ttl = spec.ttlMinutes ?? 60;
    if (!Number.isInteger(ttl) || ttl < 1 || ttl > 1440) {
      throw new ConfigError(`Invalid ttlMinutes ${ttl}; Prime allows 1 to 1440 minutes`);
    }
    if (parseGpu(spec.gpu).count > 0 && spec.vm === false) {
      throw new ConfigError(`Prime runs GPUs only in VM sandboxes; drop vm: false or the gpu`);
    }
    this.spec = spec;
    this.#options = options;
    this.api = new PrimeApi({
      apiBase: spec.apiBase,
      apiKeyVar: spec.apiKeyVar,
      teamId: spec.teamId,
    });
  }

  /** The Prime sandbox id; `""` before it is created. */
  get id(): string {
    return this.#id;
  }

  /** The sandbox name (`vf-<hex>`), chosen before the create request. */
  get name(): string {
    return this.#name;
  }

  /** The working directory on the sandbox, once started. */
  get workdir(): string {
    return this.#ssh?.workdir ?? this.spec.workdir ?? "";
  }

  /** The SSH runtime commands go through, once started. */
  get ssh(): SshRuntime | undefined {
    return this.#ssh;
  }

  /** Creates the sandbox, waits until it runs, and connects over SSH. */
  start(options: { signal?: AbortSignal } = {}): Promise<void> {
    return this.#life.start(this, "prime", () => this.#start(options.signal), () => this.stop());
  }

  async #start(signal: AbortSignal | undefined): Promise<void> {
    signal?.throwIfAborted();
    const spec = this.spec;
    const started = Date.now();
    const deadline = started + (spec.readyTimeoutMs ?? 600_000);
    const gpu = parseGpu(spec.gpu);
    const labels = ["vf.managed=1"];
    if (this.#options.runId) labels.push(`vf.run_id=${this.#options.runId}`);
    if (this.#options.task) labels.push(`vf.task=${this.#options.task}`);
    labels.push(...labelList(spec.labels));
    this.#name = `vf-${randomHex(6)}`;
    const body: Record<string, unknown> = {
      name: this.#name,
      docker_image: spec.image ?? "python:3.11-slim",
      start_command: "tail -f /dev/null",
      cpu_cores: spec.cpu ?? 1,
      memory_gb: spec.memory ?? 2,
      disk_size_gb: spec.disk ?? 10,
      gpu_count: gpu.count,
      vm: spec.vm ?? gpu.count > 0,
      timeout_minutes: spec.ttlMinutes ?? 60,
      labels,
      // The same key on every retry: the platform creates at most one sandbox for it.
      idempotency_key: randomHex(16),
    };
    if (gpu.type) body.gpu_type = gpu.type;
    if (spec.region) body.region = spec.region;
    const record = () => ({
      type: "prime",
      key: this.#name,
      id: this.#id || undefined,
      run_id: this.#options.runId,
      host: { api_base: this.api.base, api_key_var: this.api.keyVar },
    });
    await recordSandbox({ event: "requested", ...record() });
    const created = await this.api.create(body);
    this.#id = created.id;
    await recordSandbox({ event: "created", ...record() });
    this.#checkNotStopped();

    // Wait for RUNNING: bounded exponential backoff.
    let status = created.status;
    for (let poll = 0; status !== "RUNNING"; poll++) {
      signal?.throwIfAborted();
      this.#checkNotStopped();
      if (FAILED.has(status)) {
        throw new SandboxUnavailableError(
          `Prime sandbox "${this.#id}" failed to start: status ${status}` +
            `${created.errorType ? ` (${created.errorType})` : ""}`,
        );
      }
      const remaining = deadline - Date.now();
      if (remaining <= 0) {
        throw new SandboxUnavailableError(
          `Prime sandbox "${this.#id}" was not running after ` +
            `${Math.round((Date.now() - started) / 1000)} s (last status ${status}); it was ` +
            `deleted. Raise readyTimeoutMs (a first use of an image can take about 10 minutes ` +
            `to build) or retry later`,
        );
      }
      await sleep(Math.min(pollDelay(poll), remaining));
      const current = await this.api.get(this.#id);
      if (!current) {
        throw new SandboxUnavailableError(
          `Prime sandbox "${this.#id}" disappeared while starting (it was deleted elsewhere)`,
        );
      }
      status = current.status;
      if (FAILED.has(status)) {
        throw new SandboxUnavailableError(
          `Prime sandbox "${this.#id}" failed to start: status ${status}` +
            `${current.errorType ? ` (${current.errorType})` : ""}` +
            `${current.errorMessage ? `: ${current.errorMessage}` : ""}`,
        );
      }
    }
    this.#checkNotStopped();
    await this.#connect(deadline, signal);
  }

  /** Opens an SSH session, authorizes a key and starts the SSH runtime, retrying until `deadline`. */
  async #connect(deadline: number, signal: AbortSignal | undefined): Promise<void> {
    const spec = this.spec;
    const { utils } = await loadSsh2();
    let privateKey: string;
    let publicKey: string;
    if (spec.ssh?.privateKeyPath) {
      privateKey = await readFile(expandHome(spec.ssh.privateKeyPath), "utf8").catch((error) => {
        throw new SandboxUnavailableError(
          `Cannot read ssh.privateKeyPath "${spec.ssh!.privateKeyPath}": ${error.message}`,
          { cause: error },
        );
      });
      const parsed = utils.parseKey(privateKey) as
        | Error
        | { type: string; getPublicSSH(): Uint8Array };
      if (parsed instanceof Error) {
        throw new SandboxUnavailableError(
          `Cannot use ssh.privateKeyPath "${spec.ssh.privateKeyPath}": ${parsed.message}`,
        );
      }
      publicKey = `${parsed.type} ${Buffer.from(parsed.getPublicSSH()).toString("base64")}`;
    } else {
      const pair = utils.generateKeyPairSync("ed25519");
      privateKey = pair.private;
      publicKey = pair.public.trim();
    }
    const ttlSeconds = Math.min(MAX_SESSION_TTL_S, (spec.ttlMinutes ?? 60) * 60);
    let lastError: unknown;
    for (let attempt = 0;; attempt++) {
      this.#checkNotStopped();
      signal?.throwIfAborted();
      const session = await this.api.sshSession(this.#id, ttlSeconds);
      await this.api.authorizeKey(session, publicKey);
      const ssh = new SshRuntime({
        type: "ssh",
        host: session.host,
        port: session.port,
        user: spec.ssh?.user ?? session.session_id,
        knownHostsPath: spec.ssh?.knownHostsPath,
        trustOnFirstUse: spec.ssh?.trustOnFirstUse,
        workdir: spec.workdir,
        env: spec.env,
        dedicated: true,
        connectTimeoutMs: Math.max(1_000, Math.min(20_000, deadline - Date.now())),
      }, {
        runId: this.#options.runId,
        task: this.#options.task,
        privateKey,
        label: `Prime sandbox "${this.#id}"`,
        disposable: true,
      });
      try {
        await ssh.start({ signal });
        this.#ssh = ssh;
        this.capabilities.users = ssh.capabilities.users;
        return;
      } catch (error) {
        lastError = error;
        // The endpoint may take a moment to accept connections; keys and host keys do not
        // fix themselves.
        const retry = error instanceof SshConnectError &&
          (error.reason === "network" || error.reason === "timeout");
        if (!retry || Date.now() + 1_000 >= deadline) break;
        await sleep(Math.min(pollDelay(attempt), Math.max(0, deadline - Date.now())));
      }
    }
    throw lastError;
  }

  #checkNotStopped(): void {
    if (this.#life.state === "stopped") {
      throw new SandboxStateError("The prime runtime was stopped while it was starting");
    }
  }

  #requireRunning(): SshRuntime {
    if (this.#life.state === "running" && this.#ssh) return this.#ssh;
    if (this.#life.state === "stopped") {
      throw new SandboxStateError(`Prime runtime "${this.#id}" is stopped`);
    }
    throw new SandboxStateError("The prime runtime is not started; call start() first");
  }

  /** Runs `argv` in the sandbox over SSH. */
  async run(argv: string[], options?: RunOptions): Promise<RunResult> {
    return await this.#requireRunning().run(argv, options);
  }

  /** Reads a file over SFTP. */
  async read(path: string, options?: { maxBytes?: number }): Promise<Uint8Array> {
    return await this.#requireRunning().read(path, options);
  }

  /** Writes a file over SFTP. */
  async write(
    path: string,
    data: string | Uint8Array,
    options?: { mode?: number },
  ): Promise<void> {
    return await this.#requireRunning().write(path, data, options);
  }

  /** A tar of `path`. */
  async archiveOut(path: string): Promise<Uint8Array> {
    return await this.#requireRunning().archiveOut(path);
  }

  /** Extracts a tar into `dir`. */
  async archiveIn(dir: string, tar: Uint8Array): Promise<void> {
    return await this.#requireRunning().archiveIn(dir, tar);
  }

  /** Closes SSH and deletes the sandbox (retrying transient API errors). Idempotent. */
  stop(): Promise<void> {
    if (this.#stopping) return this.#stopping;
    const wasStarting = this.#life.state === "starting";
    this.#life.state = "stopped";
    this.#stopping = (async () => {
      if (wasStarting) await this.#life.launch?.catch(() => {});
      await this.#ssh?.stop().catch(() => {});
      if (!this.#id) return;
      try {
        await this.api.delete(this.#id);
        await recordSandbox({ event: "stopped", type: "prime", key: this.#name, id: this.#id })
          .catch(() => {});
      } catch (error) {
        throw new SandboxError(
          `Cannot delete Prime sandbox "${this.#id}": ${(error as Error).message}; its ` +
            `${this.spec.ttlMinutes ?? 60}-minute time to live removes it, or run vf cleanup`,
          { cause: error },
        );
      }
    })().finally(() => untrackRuntime(this));
    return this.#stopping;
  }

  /** Same as {@linkcode stop}. */
  [Symbol.asyncDispose](): Promise<void> {
    return this.stop();
  }
}

function pollDelay(poll: number): number {
  const base = Math.min(500 * 1.5 ** poll, 5_000);
  return base * (0.8 + Math.random() * 0.4);
}

/** Which Prime sandboxes {@linkcode listPrimeSandboxes} and {@linkcode cleanupPrime} select. */
export interface PrimeCleanupFilter {
  /** Only sandboxes of this run (label `vf.run_id`). */
  runId?: string;
  /** Only sandboxes created at least this long ago. */
  olderThanMs?: number;
  /** More labels every selected sandbox must have. */
  labels?: string[];
}

/**
 * Active Prime sandboxes labelled `vf.managed=1` (and the filter's labels).
 * @param filter which sandboxes
 * @param options how to reach the API
 */
export async function listPrimeSandboxes(
  filter: PrimeCleanupFilter = {},
  options: PrimeApiOptions = {},
): Promise<PrimeSandbox[]> {
  const labels = ["vf.managed=1", ...(filter.labels ?? [])];
  if (filter.runId) labels.push(`vf.run_id=${filter.runId}`);
  const sandboxes = await new PrimeApi(options).list({ labels });
  const cutoff = filter.olderThanMs === undefined ? Infinity : Date.now() - filter.olderThanMs;
  return sandboxes.filter((s) =>
    labels.every((l) => (s.labels ?? []).includes(l)) && s.status !== "TERMINATED" &&
    (cutoff === Infinity || (s.createdAt !== undefined && Date.parse(s.createdAt) <= cutoff))
  );
}

/**
 * Deletes the Prime sandboxes {@linkcode listPrimeSandboxes} selects. Returns their ids.
 * @param filter which sandboxes
 * @param options how to reach the API
 * @returns the ids of the deleted sandboxes
 * @throws {SandboxApiError} when the API refuses the key or keeps failing
 * @example
 * ```ts
 * const removed = await cleanupPrime({ runId: "run-1", olderThanMs: 30 * 60_000 });
 * ```
 */
export async function cleanupPrime(
  filter: PrimeCleanupFilter = {},
  options: PrimeApiOptions = {},
): Promise<string[]> {
  const api = new PrimeApi(options);
  const doomed = await listPrimeSandboxes(filter, options);
  const removed: string[] = [];
  await Promise.all(doomed.map(async (s) => {
    if (await api.delete(s.id)) removed.push(s.id);
  }));
  return removed;
}

/** Deletes leftover Prime sandboxes recorded in the ledger (`vf cleanup`). */
async function cleanupPrimeLedger(sandboxes: LiveSandbox[]) {
  const removed: string[] = [];
  const gone: string[] = [];
  const failed: Array<{ key: string; error: string }> = [];
  for (const sb of sandboxes) {
    const h = (sb.host ?? {}) as Record<string, unknown>;
    const api = new PrimeApi({
      apiBase: h.api_base as string | undefined,
      apiKeyVar: h.api_key_var as string | undefined,
    });
    try {
      let id = sb.id;
      if (!id) {
        // Requested but never confirmed: find it by the name chosen before the request.
        const all = await listPrimeSandboxes({ runId: sb.run_id }, {
          apiBase: h.api_base as string | undefined,
          apiKeyVar: h.api_key_var as string | undefined,
        });
        id = all.find((s) => s.name === sb.key)?.id;
        if (!id) {
          gone.push(sb.key);
          continue;
        }
      }
      if (await api.delete(id)) removed.push(sb.key);
      else gone.push(sb.key);
    } catch (error) {
      failed.push({ key: sb.key, error: (error as Error).message });
    }
  }
  return { removed, gone, failed };
}

registerCleaner("prime", cleanupPrimeLedger);
