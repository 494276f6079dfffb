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
import { ConfigError } from "../../lib/errors.ts";
import { expandHome, randomHex, sleep } from "../_util.ts";
import { Lifecycle } from "../lifecycle.ts";
import { SandboxError, SandboxUnavailableError } from "../errors.ts";
import { type LiveSandbox, recordSandbox, registerCleaner } from "../ledger.ts";
import type {
  ArchiveOutOptions,
  PrimeRuntimeSpec,
  RunOptions,
  RunResult,
  Runtime,
  RuntimeCapabilities,
} from "../runtime.ts";
import { loadSsh2, SshConnectError } from "../ssh/connection.ts";
import { SshRuntime } from "../ssh/runtime.ts";
import { FAILED, listPrimeSandboxes, MAX_SESSION_TTL_S, PrimeApi } from "./api.ts";

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
  #life = new Lifecycle(this, "prime");

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
    return this.#life.start(() => this.#start(options.signal), () => this.stop());
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
    this.#life.checkNotStopped();
  }

  #requireRunning(): SshRuntime {
    return this.#life.require(this.#ssh, () => `Prime runtime "${this.#id}" is stopped`);
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
  async archiveOut(path: string, options?: ArchiveOutOptions): Promise<Uint8Array> {
    return await this.#requireRunning().archiveOut(path, options);
  }

  /** Extracts a tar into `dir`. */
  async archiveIn(dir: string, tar: Uint8Array): Promise<void> {
    return await this.#requireRunning().archiveIn(dir, tar);
  }

  /** Closes SSH and deletes the sandbox (retrying transient API errors). Idempotent. */
  stop(): Promise<void> {
    return this.#life.stop(async () => {
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
    });
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
