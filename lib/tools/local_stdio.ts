/**
 * An MCP transport to a stdio server on the evaluator (a toolset's `command`), whose whole
 * process tree ends with it. The server starts in its own session and process group, so a
 * launcher (`sh -c`, `npx`, `uvx`) and whatever it starts can be signalled together. Closing
 * ends its stdin, then sends the group SIGTERM and, after a grace period, SIGKILL; a
 * descendant that left the group (`setsid`, a shell's job control) is signalled by pid. The
 * tree is tagged with a random `VF_TOOLSET_ID` in its environment, so a daemon that left both
 * (double fork, reparented to init) is found by it: every process of vf's user whose initial
 * environment (`/proc/<pid>/environ`) carries the tag is ended with the rest. While
 * it runs it is in the process-wide teardown registry, so every way vf ends (normal end, an
 * error, SIGINT, SIGTERM, `process.exit`) ends it too. It never keeps vf alive by itself.
 * Messages are newline-delimited JSON-RPC, as MCP's stdio transport defines.
 * @module
 */
import { type ChildProcess, spawn } from "node:child_process";
import { readdirSync, readFileSync, statSync } from "node:fs";
import { readdir, readFile, stat } from "node:fs/promises";
import process from "node:process";
import { type Tracked, trackRuntime, untrackRuntime } from "../../runtimes/registry.ts";

// deno-lint-ignore no-explicit-any
type JsonRpcMessage = any;

/** How a local stdio server is started. */
export interface LocalStdioOptions {
  args?: string[];
  /** The server's whole environment (nothing else is inherited). */
  env?: Record<string, string>;
  cwd?: string;
  /** The toolset's name, for the teardown registry and errors. */
  name?: string;
  /** How long each step of the shutdown waits (stdin closed, then SIGTERM). Default 2000 ms. */
  graceMs?: number;
}

/** A line longer than this from the server is an error (the SDK's own limit). */
const MAX_LINE = 10 * 1024 * 1024;

/** The MCP SDK's `Transport`, over a local process group. */
export class LocalStdioTransport {
  onmessage?: (message: JsonRpcMessage) => void;
  onerror?: (error: Error) => void;
  onclose?: () => void;
  #child: ChildProcess | null = null;
  #exited: Promise<void> = Promise.resolve();
  #started: Promise<void> | undefined;
  #closing: Promise<void> | undefined;
  #tracked: Tracked | undefined;
  #buffer = "";
  #stderr = "";
  readonly #decoder = new TextDecoder();
  readonly #errDecoder = new TextDecoder();
  /** `VF_TOOLSET_ID=<nonce>`, as it appears in the tree's environments. */
  readonly #tag = `VF_TOOLSET_ID=${
    [...crypto.getRandomValues(new Uint8Array(16))]
      .map((b) => b.toString(16).padStart(2, "0")).join("")
  }`;

  constructor(readonly command: string, readonly options: LocalStdioOptions = {}) {}

  /** The server's pid (its process group's id); undefined before start. */
  get pid(): number | undefined {
    return this.#child?.pid;
  }

  /** What the server last wrote to stderr (for errors). */
  get stderr(): string {
    return this.#stderr;
  }

  start(): Promise<void> {
    if (this.#child) return Promise.reject(new Error("the stdio transport is already started"));
    const [key, value] = this.#tag.split("=");
    const child = spawn(this.command, this.options.args ?? [], {
      env: { ...(this.options.env ?? process.env), [key]: value },
      cwd: this.options.cwd,
      // Its own session and process group: the tree is signalled as one, and a Ctrl-C meant
      // for vf reaches vf alone (vf then ends the tree itself).
      detached: true,
      stdio: ["pipe", "pipe", "pipe"],
    });
    this.#child = child;
    this.#exited = new Promise((resolve) => {
      child.once("exit", () => resolve());
      child.once("error", () => resolve());
    });
    child.stdin!.on("error", (error) => this.onerror?.(error));
    child.stdout!.on("data", (chunk: Uint8Array) => this.#read(chunk));
    child.stdout!.on("error", (error) => this.onerror?.(error));
    child.stderr!.on("data", (chunk: Uint8Array) => {
      this.#stderr = (this.#stderr + this.#errDecoder.decode(chunk, { stream: true }))
        .slice(-2000);
    });
    child.stderr!.on("error", () => {});
    return this.#started = new Promise((resolve, reject) => {
      child.once("error", (error) => {
        if (!this.#tracked) {
          this.#child = null;
          reject(new Error(`cannot start "${this.command}": ${error.message}`, { cause: error }));
        } else this.onerror?.(error);
      });
      child.once("spawn", () => {
        const pgid = child.pid!;
        this.#tracked = {
          type: "toolset",
          id: `${this.options.name ?? this.command} (pid ${pgid})`,
          stop: () => this.close(),
          stopSync: () => {
            const all = scanSync();
            signalTree(pgid, [...below(pgid, all), ...taggedSync(all, this.#tag)], "SIGKILL");
          },
        };
        trackRuntime(this.#tracked);
        // Only the requests waiting on it (each with its own timer) keep vf alive, not the
        // server: a program that forgot to close it still ends, and the registry ends the tree.
        child.unref();
        for (const stream of [child.stdin, child.stdout, child.stderr]) {
          (stream as unknown as { unref?: () => void } | null)?.unref?.();
        }
        child.once("exit", () => {
          // The client forgets a transport whose server exited, so the rest of the tree
          // (its group, its strays) is ended here and now, not at vf's exit.
          this.close().catch(() => {});
          this.onclose?.();
        });
        resolve();
      });
    });
  }

  #read(chunk: Uint8Array): void {
    this.#buffer += this.#decoder.decode(chunk, { stream: true });
    let newline: number;
    while ((newline = this.#buffer.indexOf("\n")) >= 0) {
      const line = this.#buffer.slice(0, newline).replace(/\r$/, "");
      this.#buffer = this.#buffer.slice(newline + 1);
      if (!line.trim()) continue;
      let message: JsonRpcMessage;
      try {
        message = JSON.parse(line);
      } catch (error) {
        this.onerror?.(
          new Error(`the server wrote a line that is not JSON: ${line.slice(0, 200)}`, {
            cause: error,
          }),
        );
        continue;
      }
      this.onmessage?.(message);
    }
    if (this.#buffer.length > MAX_LINE) {
      this.#buffer = "";
      this.onerror?.(new Error(`the server wrote a line longer than ${MAX_LINE} bytes`));
      this.close().catch(() => {});
    }
  }

  send(message: JsonRpcMessage): Promise<void> {
    const stdin = this.#child?.stdin;
    if (!stdin || this.#closing || !stdin.writable) {
      return Promise.reject(
        new Error(`not connected${this.#stderr ? `: ${this.#stderr.trim()}` : ""}`),
      );
    }
    return new Promise((resolve, reject) => {
      stdin.write(JSON.stringify(message) + "\n", (error) => (error ? reject(error) : resolve()));
    });
  }

  /** Ends the server and everything it started (see the module doc). Idempotent. */
  close(): Promise<void> {
    this.#closing ??= this.#shutdown();
    return this.#closing;
  }

  async #shutdown(): Promise<void> {
    await this.#started?.catch(() => {});
    const child = this.#child;
    const pgid = child?.pid;
    if (!child || pgid === undefined || !this.#tracked) return;
    const grace = this.options.graceMs ?? 2000;
    // Taken while the server still lives: a descendant that left the group is found through it,
    // one that left the tree too by its tag.
    const all = await scan();
    const strays = [...below(pgid, all), ...await tagged(all, this.#tag)];
    try {
      child.stdin?.end();
    } catch {
      // already closed
    }
    // A well-behaved server exits when its input ends; its group may still hold children.
    await within(this.#exited, grace);
    signalTree(pgid, strays, "SIGTERM");
    if (!(await treeGone(pgid, strays, grace))) signalTree(pgid, strays, "SIGKILL");
    // Whatever carries the tag now (started since the first look, or by a daemon that kept
    // forking), pass after pass until none is left.
    for (let pass = 0; pass < 50; pass++) {
      const left = (await tagged(await scan(), this.#tag)).filter(stillRunning);
      if (left.length === 0) break;
      signalTree(pgid, left, "SIGKILL");
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    await within(this.#exited, grace);
    child.stdout?.destroy();
    child.stderr?.destroy();
    child.stdin?.destroy();
    untrackRuntime(this.#tracked);
  }
}

/** A process as seen once: its pid and start time (so a reused pid is never signalled). */
interface Seen {
  pid: number;
  start: string;
}

interface ProcStat {
  pid: number;
  ppid: number;
  start: string;
  state: string;
}

function parseStat(pid: number, text: string): ProcStat {
  // After "pid (comm) ": state ppid pgrp session ... starttime is the 20th field.
  const fields = text.slice(text.lastIndexOf(")") + 2).split(" ");
  return { pid, state: fields[0], ppid: Number(fields[1]), start: fields[19] };
}

function statOf(pid: number): ProcStat | undefined {
  try {
    return parseStat(pid, readFileSync(`/proc/${pid}/stat`, "utf8"));
  } catch {
    return undefined;
  }
}

function pidsIn(names: string[]): number[] {
  return names.filter((name) => /^\d+$/.test(name)).map(Number);
}

/** Every process now (Linux `/proc`; none where it is missing), without blocking. */
async function scan(): Promise<ProcStat[]> {
  const names = await readdir("/proc").catch(() => [] as string[]);
  const stats = await Promise.all(
    pidsIn(names).map((pid) =>
      readFile(`/proc/${pid}/stat`, "utf8").then((text) => parseStat(pid, text), () => undefined)
    ),
  );
  return stats.filter((s) => s !== undefined);
}

function scanSync(): ProcStat[] {
  let names: string[];
  try {
    names = readdirSync("/proc");
  } catch {
    return [];
  }
  return pidsIn(names).map(statOf).filter((s) => s !== undefined);
}

/** The processes below `root` among `all`. */
function below(root: number, all: ProcStat[]): Seen[] {
  const children = new Map<number, ProcStat[]>();
  for (const stat of all) {
    const siblings = children.get(stat.ppid);
    if (siblings) siblings.push(stat);
    else children.set(stat.ppid, [stat]);
  }
  const found: Seen[] = [];
  const queue = [root];
  while (queue.length) {
    for (const child of children.get(queue.shift()!) ?? []) {
      found.push({ pid: child.pid, start: child.start });
      queue.push(child.pid);
    }
  }
  return found;
}

// Asked when a sweep runs, never at import: a sandboxed environment imports this module
// (through mod.ts) without the sys permission that getuid needs.
let uid: number | undefined | null = null;
const ownUid = (): number | undefined => (uid === null ? (uid = process.getuid?.()) : uid);

/** Whether `environ` (NUL-separated) holds `tag` as one of its entries. */
function carries(environ: string, tag: string): boolean {
  return environ.startsWith(`${tag}\0`) || environ.includes(`\0${tag}\0`) ||
    environ === tag || environ.endsWith(`\0${tag}`);
}

/** The processes among `all` of vf's user whose environment carries `tag` (vf excluded). */
async function tagged(all: ProcStat[], tag: string): Promise<Seen[]> {
  const found = await Promise.all(all.map(async (p) => {
    if (p.pid === process.pid) return undefined;
    try {
      if (ownUid() !== undefined && (await stat(`/proc/${p.pid}`)).uid !== ownUid()) {
        return undefined;
      }
      const environ = await readFile(`/proc/${p.pid}/environ`, "latin1");
      return carries(environ, tag) ? { pid: p.pid, start: p.start } : undefined;
    } catch {
      return undefined; // gone, or not readable (another user's)
    }
  }));
  return found.filter((p) => p !== undefined);
}

function taggedSync(all: ProcStat[], tag: string): Seen[] {
  const found: Seen[] = [];
  for (const p of all) {
    if (p.pid === process.pid) continue;
    try {
      if (ownUid() !== undefined && statSync(`/proc/${p.pid}`).uid !== ownUid()) continue;
      if (carries(readFileSync(`/proc/${p.pid}/environ`, "latin1"), tag)) {
        found.push({ pid: p.pid, start: p.start });
      }
    } catch {
      // gone, or not readable
    }
  }
  return found;
}

/** Whether `p` is still the process that was seen (and not a zombie). */
function stillRunning(p: Seen): boolean {
  const stat = statOf(p.pid);
  return stat !== undefined && stat.start === p.start && stat.state !== "Z";
}

function signalTree(pgid: number, strays: Seen[], signal: "SIGTERM" | "SIGKILL"): void {
  try {
    process.kill(-pgid, signal);
  } catch {
    // the group is empty
  }
  for (const p of strays) {
    if (!stillRunning(p)) continue;
    try {
      process.kill(p.pid, signal);
    } catch {
      // gone meanwhile
    }
  }
}

function groupAlive(pgid: number): boolean {
  try {
    process.kill(-pgid, 0);
    return true;
  } catch (error) {
    return (error as { code?: string }).code === "EPERM";
  }
}

/** Polls until the group is empty and every stray gone, for at most `ms`. */
async function treeGone(pgid: number, strays: Seen[], ms: number): Promise<boolean> {
  const deadline = performance.now() + ms;
  while (groupAlive(pgid) || strays.some(stillRunning)) {
    if (performance.now() >= deadline) return false;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  return true;
}

async function within(promise: Promise<void>, ms: number): Promise<void> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  await Promise.race([promise, new Promise((resolve) => (timer = setTimeout(resolve, ms)))]);
  clearTimeout(timer);
}
