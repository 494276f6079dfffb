/**
 * A minimal Docker Engine API client over keep-alive connections (undici), on a unix socket,
 * `tcp://host:port` (TLS with client certificates when `DOCKER_TLS_VERIFY` is set) or
 * `ssh://user@host[:port]` (each connection an SSH channel to the remote engine socket; see
 * `ssh_dial.ts`), from `DOCKER_HOST`. It speaks only the endpoints vf needs and never
 * runs the docker CLI. The API version is negotiated once per engine: the lower of the
 * engine's `ApiVersion` and {@linkcode MAX_API_VERSION}.
 * @module
 */

import type * as Undici from "npm:undici@^8.12.0";

// Loaded on first use: importing undici touches the environment, which sandboxed
// environment code (that imports vf's mod.ts) is not allowed to read.
let undiciModule: Promise<typeof Undici> | undefined;
function undici(): Promise<typeof Undici> {
  return (undiciModule ??= import("npm:undici@^8.12.0"));
}
import { readFile } from "node:fs/promises";
import { homedir } from "node:os";
import { join } from "node:path";
import type { Duplex } from "node:stream";
import process from "node:process";
import { concatBytes } from "../_util.ts";
import {
  SandboxApiError,
  SandboxFileNotFoundError,
  SandboxImageError,
  SandboxUnavailableError,
} from "../errors.ts";
import { DEFAULT_DOCKER_SOCKET, type DockerEndpoint, parseDockerHost } from "./host.ts";
import { SshDialer, type SshDialOptions, sshOptionsFromEnv } from "./ssh_dial.ts";

/** The newest Engine API version this client speaks. */
export const MAX_API_VERSION = "1.43";
/** How to reach the engine besides `DOCKER_HOST`; unset fields come from the environment. */
export interface DockerEngineOptions {
  /**
   * TLS for `tcp://` hosts, verifying the engine against `ca.pem` and presenting `cert.pem` /
   * `key.pem`; default on when `DOCKER_TLS_VERIFY` is set to anything but `""`, `0` or `false`.
   */
  tlsVerify?: boolean;
  /** Folder of `ca.pem`, `cert.pem`, `key.pem`; default `DOCKER_CERT_PATH`, else `~/.docker`. */
  certPath?: string;
  /** SSH settings for `ssh://` hosts (default from the `DOCKER_SSH_*` variables). */
  ssh?: SshDialOptions;
  /** Where `DOCKER_*` settings are read; default `process.env`. */
  env?: Record<string, string | undefined>;
}

function tlsWanted(value: string | undefined): boolean {
  return value !== undefined && !["", "0", "false"].includes(value.toLowerCase());
}

/** Compares dotted API versions numerically. */
export function compareApiVersions(a: string, b: string): number {
  const pa = a.split(".").map(Number);
  const pb = b.split(".").map(Number);
  for (let i = 0; i < Math.max(pa.length, pb.length); i++) {
    const d = (pa[i] ?? 0) - (pb[i] ?? 0);
    if (d !== 0) return d;
  }
  return 0;
}

/** The `X-Docker-Container-Path-Stat` of an archive request. */
export interface PathStat {
  name: string;
  size: number;
  /** Go `os.FileMode` bits: directory is bit 31, symlink bit 27. */
  mode: number;
  mtime: string;
  linkTarget: string;
}

/** True when a {@linkcode PathStat} mode describes a symlink (Go's `os.ModeSymlink`). */
export function isSymlinkMode(mode: number): boolean {
  return Math.floor(mode / 2 ** 27) % 2 === 1;
}

/** True when a {@linkcode PathStat} mode describes a directory. */
export function isDirectoryMode(mode: number): boolean {
  return mode >= 2 ** 31;
}

/** A started exec's demultiplexed output. */
export interface ExecStream {
  /** Resolves when the engine closes the stream (the process exited, or it was cut). */
  readonly done: Promise<void>;
  /** Cuts the stream. */
  destroy(): void;
  /** With `stdin: "open"`: writes to the process's stdin. */
  write(data: Uint8Array): void;
  /** With `stdin: "open"`: closes the process's stdin. */
  end(): void;
  /**
   * Whether the stream keeps the program alive (by default it does): a long-lived helper,
   * such as the command channel's supervisor, is unref'd while idle and ref'd while a request
   * waits on it.
   */
  ref(): void;
  unref(): void;
}

/** Callbacks for {@linkcode DockerEngine.startExec}. */
export interface ExecHandlers {
  onStdout(chunk: Uint8Array): void;
  onStderr(chunk: Uint8Array): void;
}

/** A response body streamed from the engine. */
export interface ArchiveDownload {
  stat: PathStat | undefined;
  body: AsyncIterable<Uint8Array>;
  /** Discards the rest of the body. */
  cancel(): void;
}

const CONNECT_ERRORS = new Set([
  "ECONNREFUSED",
  "ENOENT",
  "EACCES",
  "ECONNRESET",
  "EPIPE",
  "ETIMEDOUT",
  "EHOSTUNREACH",
  "UND_ERR_SOCKET",
  "UND_ERR_CONNECT_TIMEOUT",
]);

function errorCode(error: unknown): string | undefined {
  let current: unknown = error;
  for (let i = 0; i < 5 && current instanceof Error; i++) {
    const code = (current as { code?: unknown }).code;
    if (typeof code === "string" && (CONNECT_ERRORS.has(code) || isTlsCode(code))) return code;
    current = current.cause;
  }
  return undefined;
}

/** Certificate and handshake failures (node's `ERR_TLS_*` and OpenSSL's verify codes). */
function isTlsCode(code: string): boolean {
  return /^(ERR_TLS_|ERR_SSL_|CERT_|UNABLE_TO_|DEPTH_ZERO_|SELF_SIGNED_)/.test(code);
}

type Query = Record<string, string | number | boolean | undefined>;

interface RequestOptions {
  query?: Query;
  json?: unknown;
  body?: Uint8Array;
  contentType?: string;
  signal?: AbortSignal;
}

function queryString(query: Query | undefined): string {
  if (!query) return "";
  const params = new URLSearchParams();
  for (const [k, v] of Object.entries(query)) if (v !== undefined) params.set(k, String(v));
  const text = params.toString();
  return text ? `?${text}` : "";
}

/**
 * A client for one Docker engine. Share one per engine ({@linkcode DockerEngine.shared}): it
 * holds a keep-alive connection pool.
 */
export class DockerEngine {
  /** Where the engine listens. */
  readonly endpoint: DockerEndpoint;
  /** The `DOCKER_HOST` value this client was made for (`""`: the default socket). */
  readonly host: string;
  readonly #options: DockerEngineOptions;
  readonly #env: Record<string, string | undefined>;
  #agentPromise: Promise<Undici.Agent> | undefined;
  #dialer: SshDialer | undefined;
  #prefix: Promise<string> | undefined;
  #podman: Promise<boolean> | undefined;
  static #shared = new Map<string, DockerEngine>();

  /**
   * @param host a `DOCKER_HOST` value; default `DOCKER_HOST` or the default socket
   * @param options TLS and SSH settings (default from the environment)
   */
  constructor(host?: string, options: DockerEngineOptions = {}) {
    this.#options = options;
    this.#env = options.env ?? process.env;
    const tls = options.tlsVerify ?? tlsWanted(this.#env.DOCKER_TLS_VERIFY);
    this.host = host ?? this.#env.DOCKER_HOST ?? "";
    this.endpoint = parseDockerHost(this.host, { tls });
  }

  /** How to reach this engine again (what the sandbox ledger records; no secrets). */
  get hostInfo(): Record<string, unknown> {
    const info: Record<string, unknown> = {
      docker_host: this.host || `unix://${DEFAULT_DOCKER_SOCKET}`,
    };
    if (this.endpoint.tls) Object.assign(info, { tls_verify: true, cert_path: this.certPath });
    return info;
  }

  /** The certificate folder used for TLS. */
  get certPath(): string {
    return this.#options.certPath ?? (this.#env.DOCKER_CERT_PATH || join(homedir(), ".docker"));
  }

  async #tlsFiles(): Promise<{ ca: string; cert: string; key: string }> {
    const dir = this.certPath;
    const read = async (name: string) => {
      try {
        return await readFile(join(dir, name), "utf8");
      } catch (error) {
        throw new SandboxUnavailableError(
          `Cannot use TLS for the Docker engine at "${this.endpoint.display}": cannot read ` +
            `"${join(dir, name)}"; set DOCKER_CERT_PATH to the folder of ca.pem, cert.pem ` +
            `and key.pem`,
          { cause: error },
        );
      }
    };
    const [ca, cert, key] = await Promise.all([
      read("ca.pem"),
      read("cert.pem"),
      read("key.pem"),
    ]);
    return { ca, cert, key };
  }

  /** The keep-alive connection pool, created on first use. */
  #agent(): Promise<Undici.Agent> {
    const promise = this.#agentPromise ??= (async () => {
      const u = await undici();
      const common = { keepAliveTimeout: 30_000, keepAliveMaxTimeout: 120_000 };
      const { socketPath, ssh, tls } = this.endpoint;
      if (socketPath) return new u.Agent({ ...common, connect: { socketPath } });
      if (tls) return new u.Agent({ ...common, connect: await this.#tlsFiles() });
      if (ssh) {
        const dialer = this.#dialer ??= new SshDialer(ssh, {
          ...sshOptionsFromEnv(this.#env),
          ...this.#options.ssh,
        });
        return new u.Agent({
          ...common,
          connect: (
            _opts: unknown,
            callback: (error: Error | null, socket: Duplex | null) => void,
          ) => {
            dialer.dial().then(
              (socket) => callback(null, socket),
              (error) => callback(error, null),
            );
          },
        } as unknown as Undici.Agent.Options);
      }
      return new u.Agent(common);
    })();
    promise.catch(() => {
      if (this.#agentPromise === promise) this.#agentPromise = undefined;
    });
    return promise;
  }

  /** The process-wide client for `host` (default `DOCKER_HOST` or the default socket). */
  static shared(host?: string): DockerEngine {
    const env = process.env;
    const key = [
      host ?? env.DOCKER_HOST ?? "",
      env.DOCKER_TLS_VERIFY ?? "",
      env.DOCKER_CERT_PATH ?? "",
    ].join("\0");
    let engine = DockerEngine.#shared.get(key);
    if (!engine) {
      engine = new DockerEngine(host);
      DockerEngine.#shared.set(key, engine);
    }
    return engine;
  }

  /** Closes every shared client's connections (tests and short scripts call this at the end). */
  static async closeShared(): Promise<void> {
    const engines = [...DockerEngine.#shared.values()];
    DockerEngine.#shared.clear();
    await Promise.all(engines.map((e) => e.close()));
  }

  /** Closes this client's connections. */
  async close(): Promise<void> {
    const agent = this.#agentPromise;
    this.#agentPromise = undefined;
    if (agent) await (await agent.catch(() => undefined))?.close();
    const dialer = this.#dialer;
    this.#dialer = undefined;
    await dialer?.close();
  }

  #unreachable(error: unknown): SandboxUnavailableError {
    if (error instanceof SandboxUnavailableError) return error;
    if (this.endpoint.tls) {
      // A refused client certificate shows up as a closed socket (TLS 1.3), so name both.
      return new SandboxUnavailableError(
        `Cannot reach the Docker engine at "${this.endpoint.display}" over TLS: ${
          (error as Error)?.message ?? error
        }; check that the engine listens there and trusts the certificates in ` +
          `"${this.certPath}" (DOCKER_CERT_PATH)`,
        { cause: error },
      );
    }
    return new SandboxUnavailableError(
      `Cannot reach the Docker engine at "${this.endpoint.display}"; start dockerd or set DOCKER_HOST`,
      { cause: error },
    );
  }

  /** The `/v1.xx` prefix, negotiated once. */
  apiPrefix(): Promise<string> {
    this.#prefix ??= (async () => {
      const version = await this.#raw("GET", "/version");
      const engineVersion = String((version as { ApiVersion?: string }).ApiVersion ?? "1.24");
      const use = compareApiVersions(engineVersion, MAX_API_VERSION) < 0
        ? engineVersion
        : MAX_API_VERSION;
      return `/v${use}`;
    })();
    this.#prefix.catch(() => (this.#prefix = undefined));
    return this.#prefix;
  }

  async #raw(method: string, path: string): Promise<unknown> {
    let response;
    try {
      response = await (await undici()).request(this.endpoint.origin + path, {
        method,
        dispatcher: await this.#agent(),
      });
    } catch (error) {
      throw this.#unreachable(error);
    }
    const text = await response.body.text();
    if (response.statusCode >= 300) {
      throw new SandboxApiError(
        response.statusCode,
        `Docker engine at "${this.endpoint.display}" answered ${method} ${path} with ` +
          `HTTP ${response.statusCode}: ${text.trim()}`,
      );
    }
    return text ? JSON.parse(text) : undefined;
  }

  async #request(
    method: string,
    path: string,
    options: RequestOptions = {},
  ) {
    const prefix = await this.apiPrefix();
    const headers: Record<string, string> = {};
    let body: string | Uint8Array | undefined;
    if (options.json !== undefined) {
      headers["content-type"] = "application/json";
      body = JSON.stringify(options.json);
    } else if (options.body !== undefined) {
      headers["content-type"] = options.contentType ?? "application/x-tar";
      body = options.body;
    }
    try {
      return await (await undici()).request(
        this.endpoint.origin + prefix + path + queryString(options.query),
        {
          method,
          headers,
          body,
          dispatcher: await this.#agent(),
          signal: options.signal,
        },
      );
    } catch (error) {
      if (options.signal?.aborted) throw options.signal.reason;
      if (errorCode(error) || error instanceof SandboxUnavailableError) {
        throw this.#unreachable(error);
      }
      throw new SandboxApiError(0, `Docker request ${method} ${path} failed: ${error}`, {
        cause: error,
      });
    }
  }

  async #json<T>(
    method: string,
    path: string,
    options: RequestOptions & { allow404?: boolean } = {},
  ): Promise<T | undefined> {
    const response = await this.#request(method, path, options);
    const text = await response.body.text();
    if (response.statusCode === 404 && options.allow404) return undefined;
    if (response.statusCode >= 300) throw this.#apiError(method, path, response.statusCode, text);
    // Podman answers some actions (a network connect) with a plain-text "OK", not JSON.
    const json = /json/i.test(String(response.headers["content-type"] ?? "")) ||
      /^\s*[[{]/.test(text);
    return (text && json ? JSON.parse(text) : undefined) as T;
  }

  #apiError(method: string, path: string, status: number, text: string): SandboxApiError {
    let message = text.trim();
    try {
      message = JSON.parse(text).message ?? message;
    } catch {
      // not JSON: keep the text
    }
    return new SandboxApiError(
      status,
      `Docker engine answered ${method} ${path.split("?")[0]} with HTTP ${status}: ${message}`,
    );
  }

  /** `GET /_ping`: true when the engine answers. */
  async ping(): Promise<boolean> {
    try {
      const response = await (await undici()).request(`${this.endpoint.origin}/_ping`, {
        dispatcher: await this.#agent(),
      });
      await response.body.dump();
      return response.statusCode === 200;
    } catch {
      return false;
    }
  }

  /** `GET /version`. */
  version(): Promise<Record<string, unknown>> {
    return this.#raw("GET", "/version") as Promise<Record<string, unknown>>;
  }

  /** True when the engine is podman's service (its `/version` names a "Podman Engine"). */
  isPodman(): Promise<boolean> {
    this.#podman ??= this.version().then((v) =>
      Array.isArray(v.Components) &&
      v.Components.some((c: { Name?: unknown }) => /podman/i.test(String(c?.Name)))
    );
    this.#podman.catch(() => (this.#podman = undefined));
    return this.#podman;
  }

  // -- containers ------------------------------------------------------------------------

  /** `POST /containers/create`; returns the id. */
  async createContainer(
    body: Record<string, unknown>,
    options: { name?: string; signal?: AbortSignal } = {},
  ): Promise<string> {
    const result = await this.#json<{ Id: string }>("POST", "/containers/create", {
      query: { name: options.name },
      json: body,
      signal: options.signal,
    });
    return result!.Id;
  }

  /** `POST /containers/{id}/start`. */
  async startContainer(id: string, options: { signal?: AbortSignal } = {}): Promise<void> {
    await this.#json("POST", `/containers/${id}/start`, { signal: options.signal });
  }

  /**
   * `POST /commit`: an image of the container's filesystem (paused while it is taken, unless
   * `pause` is false), its config that of the container plus `labels`. Returns the image id.
   */
  async commitContainer(
    id: string,
    options: {
      repo: string;
      tag: string;
      labels?: Record<string, string>;
      /** Freeze the container while it is committed (the engine's default). */
      pause?: boolean;
      signal?: AbortSignal;
    },
  ): Promise<string> {
    const result = await this.#json<{ Id: string }>("POST", "/commit", {
      query: { container: id, repo: options.repo, tag: options.tag, pause: options.pause ?? true },
      json: { Labels: options.labels ?? {} },
      signal: options.signal,
    });
    return result!.Id;
  }

  /** `GET /containers/{id}/json`; undefined when there is no such container. */
  inspectContainer(id: string): Promise<Record<string, unknown> | undefined> {
    return this.#json("GET", `/containers/${id}/json`, { allow404: true });
  }

  /** `POST /containers/{id}/kill`. */
  async killContainer(id: string, signal = "SIGKILL"): Promise<void> {
    await this.#json("POST", `/containers/${id}/kill`, { query: { signal } });
  }

  /** `DELETE /containers/{id}?force=1&v=1`; false when it was already gone. */
  async removeContainer(id: string, options: { force?: boolean } = {}): Promise<boolean> {
    const response = await this.#request("DELETE", `/containers/${id}`, {
      query: { force: options.force ?? true, v: true },
    });
    const text = await response.body.text();
    if (response.statusCode === 404) return false;
    // 409 "removal already in progress" counts as gone.
    if (response.statusCode === 409 && /already in progress/.test(text)) return true;
    if (response.statusCode >= 300) {
      throw this.#apiError("DELETE", `/containers/${id}`, response.statusCode, text);
    }
    return true;
  }

  /** `GET /containers/json?all=1&filters=...`. */
  async listContainers(
    options: { all?: boolean; labels?: string[] } = {},
  ): Promise<Array<Record<string, unknown>>> {
    const filters = options.labels?.length ? JSON.stringify({ label: options.labels }) : undefined;
    return (await this.#json<Array<Record<string, unknown>>>("GET", "/containers/json", {
      query: { all: options.all ?? true, filters },
    }))!;
  }

  // -- networks --------------------------------------------------------------------------

  /** `POST /networks/create`; returns the id. */
  async createNetwork(body: Record<string, unknown>): Promise<string> {
    const result = await this.#json<{ Id: string }>("POST", "/networks/create", { json: body });
    return result!.Id;
  }

  /** `DELETE /networks/{id}`; false when it was already gone. */
  async removeNetwork(id: string): Promise<boolean> {
    const response = await this.#request("DELETE", `/networks/${id}`);
    const text = await response.body.text();
    if (response.statusCode === 404) return false;
    if (response.statusCode >= 300) {
      throw this.#apiError("DELETE", `/networks/${id}`, response.statusCode, text);
    }
    return true;
  }

  /** `GET /networks/{id}`; undefined when it does not exist. */
  async inspectNetwork(id: string): Promise<Record<string, unknown> | undefined> {
    const response = await this.#request("GET", `/networks/${id}`);
    const text = await response.body.text();
    if (response.statusCode === 404) return undefined;
    if (response.statusCode >= 300) {
      throw this.#apiError("GET", `/networks/${id}`, response.statusCode, text);
    }
    return JSON.parse(text);
  }

  /** `POST /networks/{id}/connect`: attach a container, reachable there by `aliases`. */
  async connectNetwork(id: string, container: string, aliases: string[] = []): Promise<void> {
    await this.#json("POST", `/networks/${id}/connect`, {
      json: { Container: container, EndpointConfig: { Aliases: aliases } },
    });
  }

  /** `GET /networks?filters=...`. */
  async listNetworks(
    options: { labels?: string[] } = {},
  ): Promise<Array<Record<string, unknown>>> {
    const filters = options.labels?.length ? JSON.stringify({ label: options.labels }) : undefined;
    return (await this.#json<Array<Record<string, unknown>>>("GET", "/networks", {
      query: { filters },
    }))!;
  }

  // -- volumes ---------------------------------------------------------------------------

  /** `POST /volumes/create`; returns the name. */
  async createVolume(body: { Name: string; Labels?: Record<string, string> }): Promise<string> {
    const result = await this.#json<{ Name: string }>("POST", "/volumes/create", { json: body });
    return result!.Name;
  }

  /** `DELETE /volumes/{name}`; false when it was already gone. */
  async removeVolume(name: string): Promise<boolean> {
    const response = await this.#request("DELETE", `/volumes/${encodeURIComponent(name)}`);
    const text = await response.body.text();
    if (response.statusCode === 404) return false;
    if (response.statusCode >= 300) {
      throw this.#apiError("DELETE", `/volumes/${name}`, response.statusCode, text);
    }
    return true;
  }

  /** `GET /volumes?filters=...`. */
  async listVolumes(
    options: { labels?: string[] } = {},
  ): Promise<Array<{ Name: string; CreatedAt?: string; Labels?: Record<string, string> }>> {
    const filters = options.labels?.length ? JSON.stringify({ label: options.labels }) : undefined;
    const result = await this.#json<{ Volumes?: Array<{ Name: string }> | null }>(
      "GET",
      "/volumes",
      { query: { filters } },
    );
    return result?.Volumes ?? [];
  }

  // -- exec ------------------------------------------------------------------------------

  /** `POST /containers/{id}/exec`; returns the exec id. */
  async createExec(containerId: string, body: Record<string, unknown>): Promise<string> {
    const result = await this.#json<{ Id: string }>("POST", `/containers/${containerId}/exec`, {
      json: body,
    });
    return result!.Id;
  }

  /**
   * `POST /exec/{id}/start` attached (`Detach:false, Tty:false`) on an upgraded connection.
   * Demultiplexes the 8-byte-header stream into the handlers; writes `stdin` and half-closes
   * when given (the exec must have been created with `AttachStdin`).
   */
  async startExec(
    execId: string,
    handlers: ExecHandlers,
    /** All of stdin at once, or `"open"` to write it as the process runs. */
    options: { stdin?: Uint8Array | "open" } = {},
  ): Promise<ExecStream> {
    const prefix = await this.apiPrefix();
    let socket: Duplex;
    try {
      const result = await (await undici()).upgrade(
        `${this.endpoint.origin}${prefix}/exec/${execId}/start`,
        {
          method: "POST",
          protocol: "tcp",
          headers: { "content-type": "application/json" },
          body: JSON.stringify({ Detach: false, Tty: false }),
          dispatcher: await this.#agent(),
        } as Parameters<typeof Undici.upgrade>[1],
      );
      socket = result.socket;
    } catch (error) {
      if (errorCode(error) || error instanceof SandboxUnavailableError) {
        throw this.#unreachable(error);
      }
      throw new SandboxApiError(0, `Cannot start exec "${execId}": ${error}`, { cause: error });
    }
    let pending: Uint8Array = new Uint8Array(0);
    socket.on("data", (chunk: Uint8Array) => {
      pending = pending.length ? concatBytes([pending, chunk]) : chunk;
      let offset = 0;
      while (pending.length - offset >= 8) {
        const size = ((pending[offset + 4] << 24) >>> 0) + (pending[offset + 5] << 16) +
          (pending[offset + 6] << 8) + pending[offset + 7];
        if (pending.length - offset - 8 < size) break;
        const frame = pending.subarray(offset + 8, offset + 8 + size);
        if (pending[offset] === 2) handlers.onStderr(frame);
        else handlers.onStdout(frame);
        offset += 8 + size;
      }
      pending = offset === pending.length ? new Uint8Array(0) : pending.slice(offset);
    });
    const done = new Promise<void>((resolve) => {
      socket.once("close", () => resolve());
      socket.once("end", () => resolve());
      socket.once("error", () => resolve());
    });
    if (options.stdin instanceof Uint8Array) socket.end(options.stdin);
    return {
      done,
      destroy: () => socket.destroy(),
      write: (data) => void socket.write(data),
      end: () => void socket.end(),
      ref: () => (socket as Duplex & { ref?: () => void }).ref?.(),
      unref: () => (socket as Duplex & { unref?: () => void }).unref?.(),
    };
  }

  /** `GET /exec/{id}/json`. */
  async inspectExec(
    execId: string,
  ): Promise<{ ExitCode: number | null; Running: boolean; Pid: number }> {
    return (await this.#json("GET", `/exec/${execId}/json`))!;
  }

  // -- archive ---------------------------------------------------------------------------

  #notFound(containerId: string, path: string, status: number, text: string): Error {
    if (/No such container/i.test(text)) {
      return new SandboxUnavailableError(
        `Container "${containerId.slice(0, 12)}" no longer exists; it was removed or stopped`,
      );
    }
    return new SandboxFileNotFoundError(
      path,
      `Path "${path}" does not exist in container "${containerId.slice(0, 12)}"`,
      { cause: this.#apiError("GET", "/archive", status, text) },
    );
  }

  /** `HEAD /containers/{id}/archive?path=`; undefined when the path does not exist. */
  async statPath(containerId: string, path: string): Promise<PathStat | undefined> {
    const response = await this.#request("HEAD", `/containers/${containerId}/archive`, {
      query: { path },
    });
    await response.body.dump();
    if (response.statusCode === 404) {
      const info = await this.inspectContainer(containerId);
      if (!info) throw this.#notFound(containerId, path, 404, "No such container");
      return undefined;
    }
    if (response.statusCode >= 300) {
      throw this.#apiError("HEAD", "/archive", response.statusCode, "");
    }
    return decodeStat(response.headers["x-docker-container-path-stat"]);
  }

  /**
   * `GET /containers/{id}/archive?path=`: a tar of the path, streamed. Missing path →
   * `SandboxFileNotFoundError`; missing container → `SandboxUnavailableError`.
   */
  async getArchive(
    containerId: string,
    path: string,
    options: { signal?: AbortSignal } = {},
  ): Promise<ArchiveDownload> {
    const response = await this.#request("GET", `/containers/${containerId}/archive`, {
      query: { path },
      signal: options.signal,
    });
    if (response.statusCode >= 300) {
      const text = await response.body.text();
      if (response.statusCode === 404) throw this.#notFound(containerId, path, 404, text);
      throw this.#apiError("GET", "/archive", response.statusCode, text);
    }
    return {
      stat: decodeStat(response.headers["x-docker-container-path-stat"]),
      body: response.body as AsyncIterable<Uint8Array>,
      cancel: () => {
        response.body.on("error", () => {}); // destroying mid-body reports an abort
        response.body.destroy();
      },
    };
  }

  /**
   * `PUT /containers/{id}/archive?path=`: extracts `tar` into the existing directory `path`.
   * Missing directory → `SandboxFileNotFoundError`.
   */
  async putArchive(
    containerId: string,
    path: string,
    tar: Uint8Array,
    options: { copyUIDGID?: boolean } = {},
  ): Promise<void> {
    const response = await this.#request("PUT", `/containers/${containerId}/archive`, {
      query: { path, noOverwriteDirNonDir: true, copyUIDGID: options.copyUIDGID || undefined },
      body: tar,
    });
    const text = await response.body.text();
    if (response.statusCode === 404) throw this.#notFound(containerId, path, 404, text);
    if (response.statusCode >= 300) {
      throw this.#apiError("PUT", "/archive", response.statusCode, text);
    }
  }

  // -- images ----------------------------------------------------------------------------

  /**
   * `POST /build`: builds an image from a tar of its context and tags it `tag`, waiting for
   * the build to end. Returns the image id.
   * @throws {SandboxImageError} naming the tag and the build's last output when it fails
   */
  async buildImage(
    context: Uint8Array,
    options: {
      tag: string;
      dockerfile?: string;
      labels?: Record<string, string>;
      signal?: AbortSignal;
      /** Each line of the build's output as it arrives. */
      onLog?: (line: string) => void;
    },
  ): Promise<string> {
    const response = await this.#request("POST", "/build", {
      query: {
        t: options.tag,
        dockerfile: options.dockerfile ?? "Dockerfile",
        rm: true,
        forcerm: true,
        labels: options.labels ? JSON.stringify(options.labels) : undefined,
      },
      body: context,
      contentType: "application/x-tar",
      signal: options.signal,
    });
    const failed = (detail: string) =>
      new SandboxImageError(options.tag, `Building image "${options.tag}" failed: ${detail}`);
    if (response.statusCode >= 300) {
      const text = await response.body.text();
      let message = text.trim();
      try {
        message = JSON.parse(text).message ?? message;
      } catch {
        // keep the text
      }
      throw failed(message);
    }
    // The output streams as JSON lines: pass each on as it comes, keep the tail for errors.
    const output: string[] = [];
    let id = "";
    let error = "";
    let pending = "";
    const decoder = new TextDecoder();
    const take = (line: string) => {
      if (!line.trim()) return;
      let event: { stream?: string; error?: string; aux?: { ID?: string } };
      try {
        event = JSON.parse(line);
      } catch {
        return;
      }
      if (event.stream) {
        output.push(event.stream);
        if (output.length > 200) output.splice(0, output.length - 200);
        for (const l of event.stream.replace(/\n$/, "").split("\n")) options.onLog?.(l);
      }
      if (event.aux?.ID) id = event.aux.ID;
      if (event.error && !error) {
        error = event.error.trim();
        options.onLog?.(`error: ${error}`);
      }
    };
    for await (const chunk of response.body) {
      pending += decoder.decode(chunk as Uint8Array, { stream: true });
      const lines = pending.split("\n");
      pending = lines.pop() ?? "";
      for (const line of lines) take(line);
    }
    take(pending);
    if (error) {
      throw failed(`${error}\n${output.join("").trim().split("\n").slice(-10).join("\n")}`);
    }
    return id || options.tag;
  }

  /** `GET /images/json?filters=...` (`dangling`, `label`). */
  async listImages(
    filters: Record<string, string[]> = {},
  ): Promise<Array<{ Id: string; RepoTags?: string[] | null; Labels?: Record<string, string> }>> {
    return (await this.#json<Array<{ Id: string }>>("GET", "/images/json", {
      query: { filters: JSON.stringify(filters) },
    }))!;
  }

  /** `DELETE /images/{id}` (`force` also untags an image with several tags); false when it was already gone. */
  async removeImage(id: string, options: { force?: boolean } = {}): Promise<boolean> {
    const response = await this.#request("DELETE", `/images/${encodeURIComponent(id)}`, {
      query: options.force ? { force: true } : undefined,
    });
    const text = await response.body.text();
    if (response.statusCode === 404) return false;
    if (response.statusCode >= 300) {
      throw this.#apiError("DELETE", `/images/${id}`, response.statusCode, text);
    }
    return true;
  }

  /** `GET /images/{name}/json`; undefined when the image is not present. */
  inspectImage(image: string): Promise<Record<string, unknown> | undefined> {
    return this.#json("GET", `/images/${encodeURIComponent(image)}/json`, { allow404: true });
  }

  /**
   * `POST /images/create?fromImage=`: pulls an image, waiting for the progress stream to end.
   * @throws {SandboxImageError} when the engine cannot pull it
   */
  async pullImage(image: string, options: { signal?: AbortSignal } = {}): Promise<void> {
    const { repo, tag } = splitImage(image);
    const cannot = (detail: string, cause?: unknown) =>
      new SandboxImageError(
        image,
        `Image "${image}" is not present and cannot be pulled: ${detail}; build or load it locally`,
        { cause },
      );
    let response;
    try {
      response = await this.#request("POST", "/images/create", {
        query: { fromImage: repo, tag },
        signal: options.signal,
      });
    } catch (error) {
      if (error instanceof SandboxUnavailableError || options.signal?.aborted) throw error;
      throw cannot(String(error), error);
    }
    const text = await response.body.text();
    if (response.statusCode >= 300) {
      let message = text.trim();
      try {
        message = JSON.parse(text).message ?? message;
      } catch {
        // keep the text
      }
      throw cannot(message);
    }
    for (const line of text.split("\n")) {
      if (!line.trim()) continue;
      try {
        const event = JSON.parse(line);
        if (event.error) throw cannot(String(event.error));
      } catch (error) {
        if (error instanceof SandboxImageError) throw error;
      }
    }
  }
}

/** Splits `repo[:tag][@digest]` into the `fromImage`/`tag` query values. */
export function splitImage(image: string): { repo: string; tag: string } {
  if (image.includes("@")) {
    const [repo, digest] = image.split("@", 2);
    return { repo, tag: digest };
  }
  const slash = image.lastIndexOf("/");
  const colon = image.lastIndexOf(":");
  if (colon > slash) return { repo: image.slice(0, colon), tag: image.slice(colon + 1) };
  return { repo: image, tag: "latest" };
}

function decodeStat(value: string | string[] | undefined): PathStat | undefined {
  if (typeof value !== "string" || !value) return undefined;
  try {
    const json = new TextDecoder().decode(Uint8Array.from(atob(value), (c) => c.charCodeAt(0)));
    const stat = JSON.parse(json) as PathStat;
    // Podman fills `linkTarget` with the resolved path of every entry, links or not; only a
    // symlink (mode bit 27, as Docker sets it) has a target to follow.
    if (!isSymlinkMode(stat.mode)) stat.linkTarget = "";
    return stat;
  } catch {
    return undefined;
  }
}
