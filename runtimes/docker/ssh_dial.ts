/**
 * The Docker Engine API over SSH (`DOCKER_HOST=ssh://user@host[:port]`): one SSH connection
 * per engine, and one SSH channel per HTTP connection of the keep-alive pool. A channel is a
 * `direct-streamlocal@openssh.com` forward to the remote engine socket (needs
 * `AllowStreamLocalForwarding` on the server, OpenSSH's default) or, when the server refuses
 * that, an exec of `docker system dial-stdio` (needs the docker CLI on the remote host).
 *
 * Identity: `DOCKER_SSH_KEY` (a private key file; `DOCKER_SSH_PASSPHRASE` when encrypted),
 * else the first of `~/.ssh/id_ed25519`, `id_ecdsa`, `id_rsa`, plus the agent at
 * `SSH_AUTH_SOCK` when set. Host keys are checked against `DOCKER_SSH_KNOWN_HOSTS` (default
 * `~/.ssh/known_hosts`); `DOCKER_SSH_HOST_KEY_CHECKING=accept-new` records the key of a host
 * seen for the first time, `no` turns checking off. `DOCKER_SSH_SOCKET` names the remote
 * socket (default `/var/run/docker.sock`); `DOCKER_SSH_MODE` forces `streamlocal` or
 * `dial-stdio` (default `auto`).
 * @module
 */

import { readFile } from "node:fs/promises";
import { homedir } from "node:os";
import { join } from "node:path";
import type { Duplex } from "node:stream";
import {
  type HostKeyChecking,
  hostKeyVerifier,
  knownHostKeyAlgorithms,
} from "../ssh/known_hosts.ts";
import { SandboxUnavailableError } from "../errors.ts";

/** The parts of an `ssh://` DOCKER_HOST. */
export interface SshTarget {
  user: string;
  host: string;
  port: number;
}

/** How to reach a Docker engine over SSH; unset fields come from the `DOCKER_SSH_*` variables. */
export interface SshDialOptions {
  /** Private key file. */
  identityFile?: string;
  /** Passphrase of an encrypted private key. */
  passphrase?: string;
  /** known_hosts file; default `~/.ssh/known_hosts`. */
  knownHostsFile?: string;
  /** Default `yes`: only keys already in known_hosts. */
  hostKeyChecking?: HostKeyChecking;
  /** The engine socket on the remote host; default `/var/run/docker.sock`. */
  remoteSocket?: string;
  /** Channel kind; default `auto` (stream-local forward, else `docker system dial-stdio`). */
  mode?: "auto" | "streamlocal" | "dial-stdio";
  /** SSH agent socket; default `SSH_AUTH_SOCK`. */
  agent?: string;
  /** Give up connecting after this long; default 20 s. */
  readyTimeoutMs?: number;
}

/** Parses `ssh://[user@]host[:port]`. */
export function parseSshTarget(value: string, defaultUser: string): SshTarget {
  const match = /^ssh:\/\/(?:([^@/]+)@)?(\[[^\]]+\]|[^:/]+)(?::(\d+))?\/?$/.exec(value);
  if (!match) {
    throw new SandboxUnavailableError(
      `Unsupported DOCKER_HOST "${value}"; use ssh://user@host or ssh://user@host:port`,
    );
  }
  return {
    user: match[1] ?? defaultUser,
    host: match[2].replace(/^\[|\]$/g, ""),
    port: match[3] ? Number(match[3]) : 22,
  };
}

/** The `DOCKER_SSH_*` settings of an environment. */
export function sshOptionsFromEnv(env: Record<string, string | undefined>): SshDialOptions {
  const checking = env.DOCKER_SSH_HOST_KEY_CHECKING;
  if (checking !== undefined && !["yes", "accept-new", "no"].includes(checking)) {
    throw new SandboxUnavailableError(
      `DOCKER_SSH_HOST_KEY_CHECKING "${checking}" must be "yes", "accept-new" or "no"`,
    );
  }
  const mode = env.DOCKER_SSH_MODE;
  if (mode !== undefined && !["auto", "streamlocal", "dial-stdio"].includes(mode)) {
    throw new SandboxUnavailableError(
      `DOCKER_SSH_MODE "${mode}" must be "auto", "streamlocal" or "dial-stdio"`,
    );
  }
  return {
    identityFile: env.DOCKER_SSH_KEY || undefined,
    passphrase: env.DOCKER_SSH_PASSPHRASE || undefined,
    knownHostsFile: env.DOCKER_SSH_KNOWN_HOSTS || undefined,
    hostKeyChecking: checking as HostKeyChecking | undefined,
    remoteSocket: env.DOCKER_SSH_SOCKET || undefined,
    mode: mode as SshDialOptions["mode"],
    agent: env.SSH_AUTH_SOCK || undefined,
  };
}

// The slice of ssh2's API used here (the package ships no types).
interface Ssh2Channel extends Duplex {
  stderr?: { resume(): void };
}
interface Ssh2Client {
  on(event: "ready" | "close" | "end", fn: () => void): this;
  on(event: "error", fn: (error: Error & { level?: string }) => void): this;
  once(event: "ready" | "close", fn: () => void): this;
  once(event: "error", fn: (error: Error & { level?: string }) => void): this;
  connect(config: Record<string, unknown>): void;
  end(): void;
  openssh_forwardOutStreamLocal(
    path: string,
    cb: (error: Error | undefined, stream: Ssh2Channel) => void,
  ): void;
  exec(command: string, cb: (error: Error | undefined, stream: Ssh2Channel) => void): void;
}

let ssh2Module: Promise<{ Client: new () => Ssh2Client }> | undefined;
function ssh2(): Promise<{ Client: new () => Ssh2Client }> {
  // Loaded on first use, like undici: sandboxed environment code never pays for it.
  return (ssh2Module ??= import("npm:ssh2@^1.17.0").then((m) =>
    (m.default ?? m) as { Client: new () => Ssh2Client }
  ));
}

const DEFAULT_KEYS = ["id_ed25519", "id_ecdsa", "id_rsa"];

/** Opens channels to a remote Docker engine over one shared SSH connection. */
export class SshDialer {
  readonly target: SshTarget;
  readonly #options: SshDialOptions;
  #client: Promise<Ssh2Client> | undefined;
  #mode: "streamlocal" | "dial-stdio" | undefined;
  #closed = false;

  constructor(target: SshTarget, options: SshDialOptions = {}) {
    this.target = target;
    this.#options = options;
    if (options.mode && options.mode !== "auto") this.#mode = options.mode;
  }

  /** `ssh://user@host:port`, for messages. */
  get display(): string {
    const { user, host, port } = this.target;
    return `ssh://${user}@${host.includes(":") ? `[${host}]` : host}${
      port === 22 ? "" : `:${port}`
    }`;
  }

  /** The channel kind in use, once known. */
  get mode(): "streamlocal" | "dial-stdio" | undefined {
    return this.#mode;
  }

  #fail(detail: string, cause?: unknown): SandboxUnavailableError {
    return new SandboxUnavailableError(
      `Cannot reach the Docker engine at "${this.display}": ${detail}`,
      { cause },
    );
  }

  async #privateKey(): Promise<string | undefined> {
    const explicit = this.#options.identityFile;
    if (explicit) {
      try {
        return await readFile(explicit, "utf8");
      } catch (error) {
        throw this.#fail(`cannot read DOCKER_SSH_KEY "${explicit}": ${error}`, error);
      }
    }
    for (const name of DEFAULT_KEYS) {
      const text = await readFile(join(homedir(), ".ssh", name), "utf8").catch(() => undefined);
      if (text) return text;
    }
    return undefined;
  }

  #connect(): Promise<Ssh2Client> {
    const current = this.#client;
    if (current) return current;
    const promise = (async () => {
      const { Client } = await ssh2();
      const privateKey = await this.#privateKey();
      const agent = this.#options.agent;
      if (!privateKey && !agent) {
        throw this.#fail(
          "no SSH identity; set DOCKER_SSH_KEY to a private key file, add ~/.ssh/id_ed25519 " +
            "or start an ssh-agent (SSH_AUTH_SOCK)",
        );
      }
      const knownHostsFile = this.#options.knownHostsFile ??
        join(homedir(), ".ssh", "known_hosts");
      const checking = this.#options.hostKeyChecking ?? "yes";
      const verifier = hostKeyVerifier(this.target.host, this.target.port, {
        knownHostsFile,
        checking,
        acceptNewHint: "set DOCKER_SSH_HOST_KEY_CHECKING=accept-new",
      });
      // Ask for a key type known_hosts has, as OpenSSH does, so a second key is no mismatch.
      const serverHostKey = checking === "no"
        ? undefined
        : await knownHostKeyAlgorithms(knownHostsFile, this.target.host, this.target.port);
      const client = new Client();
      await new Promise<void>((resolve, reject) => {
        client.once("ready", () => resolve());
        client.once("error", (error) => {
          const refused = verifier.rejection();
          if (refused) reject(this.#fail(refused, error));
          else if (error.level === "client-authentication") {
            reject(this.#fail(`user "${this.target.user}" was not accepted (${error.message})`));
          } else reject(this.#fail(error.message, error));
        });
        client.connect({
          host: this.target.host,
          port: this.target.port,
          username: this.target.user,
          privateKey,
          passphrase: this.#options.passphrase,
          agent,
          hostVerifier: (key: Uint8Array, done: (ok: boolean) => void) =>
            verifier.verify(key, done),
          algorithms: serverHostKey ? { serverHostKey } : undefined,
          readyTimeout: this.#options.readyTimeoutMs ?? 20_000,
          keepaliveInterval: 15_000,
        });
      });
      const forget = () => {
        if (this.#client === promise) this.#client = undefined;
      };
      client.on("error", forget);
      client.on("close", forget);
      client.on("end", forget);
      return client;
    })();
    this.#client = promise;
    promise.catch(() => {
      if (this.#client === promise) this.#client = undefined;
    });
    return promise;
  }

  /** A new channel to the remote engine, ready to carry one HTTP connection. */
  async dial(): Promise<Duplex> {
    if (this.#closed) throw this.#fail("the connection was closed");
    const client = await this.#connect();
    const socket = this.#options.remoteSocket ?? "/var/run/docker.sock";
    if (this.#mode !== "dial-stdio") {
      try {
        const channel = await new Promise<Ssh2Channel>((resolve, reject) => {
          try {
            client.openssh_forwardOutStreamLocal(
              socket,
              (error, stream) => error ? reject(error) : resolve(stream),
            );
          } catch (error) {
            reject(error);
          }
        });
        this.#mode = "streamlocal";
        return adaptChannel(channel);
      } catch (error) {
        if (this.#mode === "streamlocal") {
          throw this.#fail(`cannot forward to "${socket}": ${(error as Error).message}`, error);
        }
        this.#mode = "dial-stdio";
      }
    }
    try {
      const channel = await new Promise<Ssh2Channel>((resolve, reject) => {
        client.exec(
          "docker system dial-stdio",
          (error, stream) => error ? reject(error) : resolve(stream),
        );
      });
      channel.stderr?.resume();
      return adaptChannel(channel);
    } catch (error) {
      throw this.#fail(
        `the server refused a stream-local forward to "${socket}" (AllowStreamLocalForwarding) ` +
          `and "docker system dial-stdio" failed: ${(error as Error).message}`,
        error,
      );
    }
  }

  /** Ends the SSH connection. */
  async close(): Promise<void> {
    this.#closed = true;
    const client = this.#client;
    this.#client = undefined;
    if (!client) return;
    try {
      (await client).end();
    } catch {
      // it never connected
    }
  }
}

/** The socket methods undici may call that a channel lacks. */
function adaptChannel(channel: Ssh2Channel): Duplex {
  const socket = channel as Duplex & Record<string, unknown>;
  for (const name of ["setKeepAlive", "setNoDelay", "setTimeout", "ref", "unref"]) {
    if (typeof socket[name] !== "function") socket[name] = () => socket;
  }
  return socket;
}
