/**
 * SSH connections shared by every SSH-backed runtime of this process: one connection per
 * host, port, user and identity, reconnected when it drops, with at most `maxSessions`
 * channels open at once. Host keys are checked against known_hosts; ssh2 is loaded on
 * first use.
 * @module
 */

import { Buffer } from "node:buffer";
import { createHash } from "node:crypto";
import { readFile } from "node:fs/promises";
import { homedir } from "node:os";
import { join } from "node:path";
import process from "node:process";
import { hostKeyVerifier, knownHostKeyAlgorithms } from "./known_hosts.ts";
import { SandboxError, SandboxUnavailableError } from "../errors.ts";
import { ExecChannel, type SupervisorLauncher, type SupervisorStream } from "../_channel.ts";
import { shCommand } from "./shell.ts";
import { unrefTimer } from "../../lib/util/_timers.ts";

/** Why an SSH connection could not be made. */
export type SshFailure = "network" | "timeout" | "auth" | "host-key" | "identity";

/** An SSH connection could not be made; `reason` says which step failed. */
export class SshConnectError extends SandboxUnavailableError {
  readonly reason: SshFailure;
  constructor(reason: SshFailure, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.reason = reason;
  }
}

// ---- the slice of ssh2's API used here (the package ships no types) --------------------

interface Ssh2Stream {
  on(event: "data", fn: (chunk: Uint8Array) => void): this;
  on(event: "exit", fn: (code: number | null, signal?: string) => void): this;
  on(event: "close", fn: (code?: number | null, signal?: string) => void): this;
  on(event: "end", fn: () => void): this;
  on(event: "error", fn: (error: Error) => void): this;
  stderr: { on(event: "data", fn: (chunk: Uint8Array) => void): unknown };
  write(data: Uint8Array): boolean;
  end(data?: Uint8Array): void;
  close(): void;
}

export interface Ssh2Stats {
  size: number;
  mode: number;
  isDirectory(): boolean;
}

type SftpCallback<T = void> = (error: (Error & { code?: number }) | undefined, value: T) => void;

export interface Ssh2Sftp {
  stat(path: string, cb: SftpCallback<Ssh2Stats>): void;
  mkdir(path: string, attrs: { mode?: number }, cb: SftpCallback): void;
  readFile(path: string, cb: SftpCallback<Uint8Array>): void;
  writeFile(path: string, data: Uint8Array, options: { mode?: number }, cb: SftpCallback): void;
  chmod(path: string, mode: number, cb: SftpCallback): void;
  on(event: "close", fn: () => void): this;
  end(): void;
}

interface Ssh2AuthAttempt {
  type: "publickey" | "agent";
  username: string;
  key?: string;
  agent?: string;
}

interface Ssh2Client {
  on(event: "ready" | "close" | "end", fn: () => void): this;
  on(event: "error", fn: (error: Error & { level?: string }) => void): this;
  once(event: "ready" | "close", fn: () => void): this;
  once(event: "error", fn: (error: Error & { level?: string }) => void): this;
  connect(config: Record<string, unknown>): void;
  exec(command: string, cb: (error: Error | undefined, stream: Ssh2Stream) => void): void;
  sftp(cb: (error: Error | undefined, sftp: Ssh2Sftp) => void): void;
  end(): void;
  destroy(): void;
  setNoDelay?(noDelay: boolean): void;
}

interface Ssh2Module {
  Client: new () => Ssh2Client;
  utils: {
    parseKey(data: string | Uint8Array, passphrase?: string): unknown;
    generateKeyPairSync(type: "ed25519"): { private: string; public: string };
  };
}

let ssh2Module: Promise<Ssh2Module> | undefined;
/** ssh2, loaded on first use so programs that never use SSH never load it. */
export function loadSsh2(): Promise<Ssh2Module> {
  return (ssh2Module ??= import("npm:ssh2@^1.17.0").then((m) => (m.default ?? m) as Ssh2Module));
}

// ---- connections ----------------------------------------------------------------------

/** Where and as whom to connect. */
export interface SshTarget {
  host: string;
  port: number;
  user: string;
  privateKeyPath?: string;
  privateKey?: string;
  agent?: boolean;
  /** `IdentityFile`s from the ssh configuration, tried instead of the default key files. */
  identityFiles: string[];
  knownHostsPath: string;
  trustOnFirstUse: boolean;
  maxSessions: number;
  connectTimeoutMs: number;
}

const DEFAULT_KEYS = ["id_ed25519", "id_ecdsa", "id_rsa"];

export function hostPort(target: { host: string; port: number }): string {
  const host = target.host.includes(":") ? `[${target.host}]` : target.host;
  return `${host}:${target.port}`;
}

/** A counting semaphore. */
class Slots {
  #free: number;
  #waiters: Array<() => void> = [];
  constructor(count: number) {
    this.#free = count;
  }
  async take(): Promise<() => void> {
    if (this.#free > 0) this.#free--;
    else await new Promise<void>((resolve) => this.#waiters.push(resolve));
    let released = false;
    return () => {
      if (released) return;
      released = true;
      const next = this.#waiters.shift();
      if (next) next();
      else this.#free++;
    };
  }
}

/** A running command: its output arrives through the callbacks given to `exec`. */
export interface ExecHandle {
  /** Settles when the channel closes: the exit code, or the signal that ended it. */
  done: Promise<{ code: number | null; signal?: string }>;
  /** Closes the channel without waiting (the remote process is not killed by this). */
  close(): void;
}

/**
 * One SSH connection (ssh2 Client) shared by every runtime with the same host, port, user
 * and identity. It reconnects on the next use after a drop. Channels are limited to the
 * server's MaxSessions: one for SFTP, one kept for killing timed-out commands, the rest for
 * commands.
 */
export class SshConnection {
  readonly key: string;
  readonly target: SshTarget;
  /** Runtimes holding this connection. */
  refs = 0;
  /** TCP connections made so far (1 unless it reconnected). */
  connects = 0;
  #client: Promise<Ssh2Client> | undefined;
  #sftp: Promise<Ssh2Sftp> | undefined;
  #commands: Slots;
  #reserved = new Slots(1);
  #closed = false;
  #channel: Promise<ExecChannel | null> | undefined;

  constructor(key: string, target: SshTarget) {
    this.key = key;
    this.target = target;
    this.#commands = new Slots(Math.max(1, target.maxSessions - 2));
  }

  /** `user@host:port`, for messages. */
  get display(): string {
    return `${this.target.user}@${hostPort(this.target)}`;
  }

  #unavailable(detail: string, cause?: unknown): SandboxUnavailableError {
    return new SandboxUnavailableError(`Cannot use SSH host "${this.display}": ${detail}`, {
      cause,
    });
  }

  #failure(reason: SshFailure, detail: string, cause?: unknown): SshConnectError {
    return new SshConnectError(reason, `Cannot connect to SSH host "${this.display}": ${detail}`, {
      cause,
    });
  }

  async #auth(): Promise<Ssh2AuthAttempt[]> {
    const { utils } = await loadSsh2();
    const t = this.target;
    const attempts: Ssh2AuthAttempt[] = [];
    const addKey = (text: string, source: string) => {
      const parsed = utils.parseKey(text);
      if (parsed instanceof Error) {
        const encrypted = /encrypted|passphrase/i.test(parsed.message);
        throw this.#failure(
          "identity",
          encrypted
            ? `the private key ${source} is encrypted; load it into an ssh-agent and set agent: true`
            : `the private key ${source} cannot be parsed: ${parsed.message}`,
          parsed,
        );
      }
      attempts.push({ type: "publickey", username: t.user, key: text });
    };
    if (t.privateKey) addKey(t.privateKey, "given to the runtime");
    if (t.privateKeyPath) {
      let text: string;
      try {
        text = await readFile(t.privateKeyPath, "utf8");
      } catch (error) {
        throw this.#failure(
          "identity",
          `cannot read privateKeyPath "${t.privateKeyPath}": ${(error as Error).message}`,
          error,
        );
      }
      addKey(text, `"${t.privateKeyPath}"`);
    }
    const sock = process.env.SSH_AUTH_SOCK;
    if (t.agent) {
      if (!sock) {
        throw this.#failure(
          "identity",
          "agent is true but SSH_AUTH_SOCK is not set; start ssh-agent",
        );
      }
      attempts.push({ type: "agent", username: t.user, agent: sock });
    }
    if (!attempts.length) {
      // Like ssh: the agent when there is one, then the configured or default key files.
      if (sock) attempts.push({ type: "agent", username: t.user, agent: sock });
      const files = t.identityFiles.length
        ? t.identityFiles
        : DEFAULT_KEYS.map((name) => join(homedir(), ".ssh", name));
      for (const file of files) {
        const text = await readFile(file, "utf8").catch(() => "");
        if (text && !(utils.parseKey(text) instanceof Error)) {
          attempts.push({ type: "publickey", username: t.user, key: text });
        }
      }
    }
    if (!attempts.length) {
      throw this.#failure(
        "identity",
        t.identityFiles.length
          ? `no usable SSH identity: the IdentityFile ${
            t.identityFiles.map((f) => `"${f}"`).join(", ")
          } from the ssh configuration cannot be read or parsed (an encrypted key needs an ` +
            "ssh-agent and agent: true)"
          : "no SSH identity; set privateKeyPath, set agent: true with an ssh-agent running, or " +
            "add ~/.ssh/id_ed25519",
      );
    }
    return attempts;
  }

  /** Whether a connection is up or being made. */
  get connected(): boolean {
    return this.#client !== undefined;
  }

  /** The connected client, connecting (again) when needed. */
  client(): Promise<Ssh2Client> {
    if (this.#closed) return Promise.reject(this.#unavailable("the connection was closed"));
    if (this.#client) return this.#client;
    const promise: Promise<Ssh2Client> = this.#connect(() => {
      if (this.#client !== promise) return;
      this.#client = undefined;
      this.#sftp = undefined;
    });
    this.#client = promise;
    promise.catch(() => {
      if (this.#client === promise) this.#client = undefined;
    });
    return promise;
  }

  async #connect(onGone: () => void): Promise<Ssh2Client> {
    const { Client } = await loadSsh2();
    const t = this.target;
    const attempts = await this.#auth();
    const verifier = hostKeyVerifier(t.host, t.port, {
      knownHostsFile: t.knownHostsPath,
      checking: t.trustOnFirstUse ? "accept-new" : "yes",
      acceptNewHint: "set trustOnFirstUse: true in the runtime spec",
    });
    const serverHostKey = await knownHostKeyAlgorithms(t.knownHostsPath, t.host, t.port);
    const client = new Client();
    this.connects++;
    await new Promise<void>((resolve, reject) => {
      let settled = false;
      client.on("close", onGone);
      client.on("end", onGone);
      client.once("ready", () => {
        settled = true;
        // Small request/response packets: Nagle's algorithm would hold each one back.
        client.setNoDelay?.(true);
        resolve();
      });
      // Always listening: ssh2 may emit more than one error, and an unheard one would throw.
      client.on("error", (error) => {
        onGone();
        if (settled) return;
        settled = true;
        reject(this.#connectError(error, verifier.rejection(), attempts));
      });
      let next = 0;
      client.connect({
        host: t.host,
        port: t.port,
        username: t.user,
        // Methods in order; ssh2 calls this again after each failure.
        authHandler: (
          _methods: unknown,
          _partial: unknown,
          callback: (next: Ssh2AuthAttempt | false) => void,
        ) => callback(attempts[next++] ?? false),
        hostVerifier: (key: Uint8Array, done: (ok: boolean) => void) => verifier.verify(key, done),
        algorithms: serverHostKey ? { serverHostKey } : undefined,
        readyTimeout: t.connectTimeoutMs,
        keepaliveInterval: 15_000,
        keepaliveCountMax: 4,
      });
    });
    return client;
  }

  #connectError(
    error: Error & { level?: string; code?: string },
    refused: string | undefined,
    attempts: Ssh2AuthAttempt[],
  ): SshConnectError {
    const t = this.target;
    if (refused) return this.#failure("host-key", refused, error);
    if (error.level === "client-authentication") {
      const tried = [...new Set(attempts.map((a) => a.type === "agent" ? "the agent" : "a key"))]
        .join(" and ");
      return this.#failure(
        "auth",
        `authentication as "${t.user}" failed (tried ${tried}); check privateKeyPath or the ` +
          `agent, and that the key is in the host's authorized_keys for "${t.user}"`,
        error,
      );
    }
    if (error.level === "client-timeout") {
      return this.#failure(
        "timeout",
        `no SSH handshake within ${t.connectTimeoutMs} ms; check that the host is up and sshd ` +
          `listens on port ${t.port}`,
        error,
      );
    }
    return this.#failure(
      "network",
      `cannot connect (${error.code ?? error.message}); check that the host is up and sshd ` +
        `listens on port ${t.port}`,
      error,
    );
  }

  /** The SFTP session of the current connection. */
  sftp(): Promise<Ssh2Sftp> {
    if (this.#sftp) return this.#sftp;
    const promise = (async () => {
      const client = await this.client();
      return await new Promise<Ssh2Sftp>((resolve, reject) => {
        client.sftp((error, sftp) => {
          if (error) {
            reject(this.#unavailable(`cannot open SFTP: ${error.message}`, error));
            return;
          }
          sftp.on("close", () => {
            if (this.#sftp === promise) this.#sftp = undefined;
          });
          resolve(sftp);
        });
      });
    })();
    this.#sftp = promise;
    promise.catch(() => {
      if (this.#sftp === promise) this.#sftp = undefined;
    });
    return promise;
  }

  /**
   * Runs `command` (a shell command line) on a new channel.
   * @param io.reserved use the channel kept for kills, so it never waits behind commands
   */
  async exec(
    command: string,
    io: {
      stdin?: Uint8Array;
      onStdout(chunk: Uint8Array): void;
      onStderr(chunk: Uint8Array): void;
      reserved?: boolean;
    },
  ): Promise<ExecHandle> {
    const release = await (io.reserved ? this.#reserved : this.#commands).take();
    type Exit = { code: number | null; signal?: string };
    let stream: Ssh2Stream;
    let giveUp: ReturnType<typeof setTimeout> | undefined;
    let done!: Promise<Exit>;
    try {
      const client = await this.client();
      // sshd frees a session a moment after the client sees its channel close, so a channel
      // opened right after another closed can be refused ("open failed") though our count
      // says it is free: such refusals are retried briefly before giving up.
      for (let attempt = 0;; attempt++) {
        try {
          stream = await this.#open(client, command, io, release, () => giveUp, (d) => done = d);
          break;
        } catch (error) {
          if (attempt >= 7 || !/Channel open failure/i.test((error as Error).message)) throw error;
          await new Promise((r) => setTimeout(r, 25 * 2 ** attempt));
        }
      }
    } catch (error) {
      release();
      if (error instanceof SandboxError) throw error;
      throw this.#unavailable(`cannot start a command: ${(error as Error).message}`, error);
    }
    done.catch(() => {});
    if (io.stdin !== undefined && io.stdin.length) stream.end(Buffer.from(io.stdin));
    else stream.end();
    return {
      done,
      close: () => {
        try {
          stream.close();
        } catch {
          // already closed
        }
        // sshd confirms the close only once the command has exited; if it never does (a
        // process that could not be killed), stop counting the channel against our limit.
        if (!closed) giveUp ??= unrefTimer(setTimeout(release, 10_000));
      },
    };
  }

  /**
   * The command channel of this connection: supervisors shared by every sandbox on it (each
   * request names its own directory, environment and user), opened on first use and again
   * after a drop; null when the host cannot run one. They hold at most all but two of the
   * command slots, so plain execs (archives, workdir setup) always find one.
   */
  channel(): Promise<ExecChannel | null> {
    const current = this.#channel;
    if (current) {
      return current.then((c) => {
        if (c === null || c.alive || this.#channel !== current) return c;
        // A supervisor died (its connection dropped, or a command killed it): the others
        // finish what they run for other sandboxes, and new requests go to a new channel.
        c.retire();
        this.#channel = undefined;
        return this.channel();
      });
    }
    // Too few sessions to keep two free for plain execs (archives, workdir setup): no channel.
    if (this.#closed || this.target.maxSessions < 5) return Promise.resolve(null);
    const launch: SupervisorLauncher = (script, args, io) => this.#attach(script, args, io);
    const opening = ExecChannel.open(launch, `SSH host "${this.display}"`, {
      max: this.target.maxSessions - 4,
      // Supervisors are shared by sandboxes: each command gets a session of its own.
      isolate: true,
    }).catch(() => null);
    this.#channel = opening;
    return opening;
  }

  /** `/bin/sh -c <script>` on a channel held for as long as it runs (a command slot). */
  async #attach(
    script: string,
    args: string[],
    io: { onStdout(chunk: Uint8Array): void; onStderr(chunk: Uint8Array): void },
  ): Promise<SupervisorStream | null> {
    const release = await this.#commands.take();
    let stream: Ssh2Stream;
    try {
      const client = await this.client();
      // As for exec(): sshd may refuse a channel opened right after another closed.
      for (let attempt = 0;; attempt++) {
        try {
          stream = await new Promise<Ssh2Stream>((resolve, reject) => {
            client.exec(
              shCommand(script, args),
              (error, s) => (error ? reject(error) : resolve(s)),
            );
          });
          break;
        } catch (error) {
          if (attempt >= 7 || !/Channel open failure/i.test((error as Error).message)) throw error;
          await new Promise((r) => setTimeout(r, 25 * 2 ** attempt));
        }
      }
    } catch {
      release();
      return null;
    }
    let giveUp: ReturnType<typeof setTimeout> | undefined;
    let closed = false;
    const done = new Promise<void>((resolve) => {
      stream.on("data", io.onStdout);
      stream.stderr.on("data", io.onStderr);
      stream.on("error", () => {});
      stream.on("close", () => {
        closed = true;
        clearTimeout(giveUp);
        release();
        resolve();
      });
    });
    return {
      done,
      write: (data) => void stream.write(Buffer.from(data)),
      end: () => stream.end(),
      destroy: () => {
        try {
          stream.close();
        } catch {
          // already closed
        }
        // As for exec(): sshd confirms the close once the supervisor has exited; if it never
        // does, stop counting its channel against our limit after a while.
        if (!closed) giveUp ??= unrefTimer(setTimeout(release, 10_000));
      },
    };
  }

  /** Opens one exec channel and wires its output and exit status. */
  #open(
    client: Ssh2Client,
    command: string,
    io: { onStdout(chunk: Uint8Array): void; onStderr(chunk: Uint8Array): void },
    release: () => void,
    giveUp: () => ReturnType<typeof setTimeout> | undefined,
    setDone: (done: Promise<{ code: number | null; signal?: string }>) => void,
  ): Promise<Ssh2Stream> {
    type Exit = { code: number | null; signal?: string };
    return new Promise<Ssh2Stream>((resolve, reject) => {
      client.exec(command, (error, s) => {
        if (error) return reject(error);
        // Listen before anything else runs: a quick command's exit status can arrive in
        // the same read as the exec's confirmation, and ssh2 emits it at once.
        const done = new Promise<Exit>((resolveDone, rejectDone) => {
          let exit: Exit | undefined;
          s.on("data", io.onStdout);
          s.stderr.on("data", io.onStderr);
          s.on("exit", (code, signal) => (exit = { code, signal }));
          s.on("error", () => {}); // reported through close without an exit status
          s.on("close", (code?: number | null, signal?: string) => {
            clearTimeout(giveUp());
            release();
            // ssh2 repeats the exit status on close.
            if (!exit && (typeof code === "number" || signal)) {
              exit = { code: code ?? null, signal };
            }
            if (exit) resolveDone(exit);
            else {rejectDone(
                this.#unavailable("the connection closed before the command finished"),
              );}
          });
        });
        setDone(done);
        resolve(s);
      });
    });
  }

  /** Closes the connection for good; resolves once the socket is closed (at most 5 s). */
  close(): Promise<void> {
    this.#closed = true;
    const channel = this.#channel;
    this.#channel = undefined;
    channel?.then((c) => c?.close());
    const client = this.#client;
    this.#client = undefined;
    this.#sftp = undefined;
    if (!client) return Promise.resolve();
    const closed = client.then(
      (c) =>
        new Promise<void>((resolve) => {
          const timer = setTimeout(() => {
            c.destroy();
            resolve();
          }, 5_000);
          c.once("close", () => {
            clearTimeout(timer);
            resolve();
          });
          c.end();
        }),
      () => {},
    );
    closing.add(closed);
    closed.finally(() => closing.delete(closed));
    return closed;
  }
}

const pool = new Map<string, SshConnection>();
/** Connections being closed; {@linkcode closeSshConnections} waits for them. */
const closing = new Set<Promise<void>>();

function poolKey(t: SshTarget): string {
  const identity = createHash("sha256")
    .update(
      JSON.stringify([t.privateKeyPath, t.privateKey, t.agent, t.identityFiles, t.knownHostsPath]),
    )
    .digest("hex").slice(0, 16);
  return `${t.user}@${hostPort(t)}#${identity}`;
}

export function acquire(target: SshTarget): SshConnection {
  const key = poolKey(target);
  let connection = pool.get(key);
  if (!connection) {
    connection = new SshConnection(key, target);
    pool.set(key, connection);
  }
  connection.refs++;
  return connection;
}

export function release(connection: SshConnection): void {
  connection.refs--;
  if (connection.refs > 0) return;
  if (pool.get(connection.key) === connection) pool.delete(connection.key);
  connection.close();
}

/** The SSH connections of this process that runtimes hold now. */
export function sshConnections(): SshConnection[] {
  return [...pool.values()];
}

/**
 * Waits until the connections released by stopped runtimes have closed their sockets
 * (closing is asynchronous: the server is told goodbye first).
 */
export async function sshConnectionsClosed(): Promise<void> {
  while (closing.size) await Promise.all([...closing]);
}
