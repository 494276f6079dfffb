/**
 * Sandbox I/O, recorded and replayed. Every sandbox a task rollout starts is wrapped so that
 * each operation (a command and its result, a file read or written, an archive out or in) is
 * kept in order; the run writes them to `record.jsonl` beside `traces.jsonl`, one line per
 * rollout. `vf replay` then serves a re-run from them: {@link ReplaySandboxSource} hands out
 * sandboxes that answer each operation with the recorded result, checking that the re-run asks
 * the same thing in the same order, so the rewards come out as before with no engine at all.
 * @module
 */
import { Buffer } from "node:buffer";
import type { AcquireOptions, SandboxSource } from "../../runtimes/pool.ts";
import type {
  ArchiveOutOptions,
  RunOptions,
  RunResult,
  Runtime,
  RuntimeCapabilities,
  RuntimeSnapshot,
  RuntimeSpec,
} from "../../runtimes/runtime.ts";
import { CommandTimeoutError, InfraError } from "../errors.ts";
import type { ToolboxRecord } from "../tools/toolbox.ts";
import { readJsonLines } from "../eval/results.ts";
import {
  SandboxFileNotFoundError,
  SandboxFileTooLargeError,
  SandboxUnavailableError,
} from "../../runtimes/errors.ts";

/** One recorded operation. */
export interface SandboxOp {
  op: "run" | "read" | "write" | "archive_out" | "archive_in" | "kill_processes";
  /** What was asked (a command's argv and options; a path). */
  args: unknown;
  /** What came back (bytes as base64), or the error it threw. */
  result?: unknown;
  error?: { name: string; message: string };
}

/** One sandbox's operations, in order. */
export interface SandboxRecord {
  role: "agent" | "grader";
  type: string;
  capabilities: RuntimeCapabilities;
  ops: SandboxOp[];
}

/** Payloads larger than this are not kept (a replay of that rollout then stops there). */
const MAX_PAYLOAD = 1 << 20;

const b64 = (bytes: Uint8Array) => Buffer.from(bytes).toString("base64");
const unb64 = (text: string) => new Uint8Array(Buffer.from(text, "base64"));

function runArgs(argv: string[], o: RunOptions = {}): unknown {
  const { signal: _s, stdin, env, ...rest } = o;
  return {
    argv,
    ...rest,
    // Names only: values may be per-run secrets (a gateway key) that differ in a re-run.
    ...(env ? { env: Object.keys(env).sort() } : {}),
    ...(stdin === undefined ? {} : { stdin: typeof stdin === "string" ? stdin : b64(stdin) }),
  };
}

/** `runtime` with every operation appended to `record`. */
export function recordingRuntime(runtime: Runtime, record: SandboxRecord): Runtime {
  const keep = async <T>(
    op: SandboxOp["op"],
    args: unknown,
    fn: () => Promise<T>,
    out: (v: T) => unknown,
  ) => {
    const entry: SandboxOp = { op, args };
    record.ops.push(entry);
    try {
      const value = await fn();
      entry.result = out(value);
      return value;
    } catch (error) {
      entry.error = { name: (error as Error).name, message: (error as Error).message };
      throw error;
    }
  };
  const wrapped: Runtime = {
    get type() {
      return runtime.type;
    },
    get id() {
      return runtime.id;
    },
    get capabilities() {
      return runtime.capabilities;
    },
    start: (o?: { signal?: AbortSignal }) => runtime.start(o),
    run: (argv: string[], o?: RunOptions) =>
      keep("run", runArgs(argv, o), () => runtime.run(argv, o), (r: RunResult) => r),
    read: (path: string, o?: { maxBytes?: number }) =>
      keep(
        "read",
        { path, ...o },
        () => runtime.read(path, o),
        (b: Uint8Array) => b.length > MAX_PAYLOAD ? { omitted: b.length } : b64(b),
      ),
    write: (path: string, data: string | Uint8Array, o?: { mode?: number }) =>
      keep("write", { path, ...o }, () => runtime.write(path, data, o), () => null),
    archiveOut: (path: string, o?: ArchiveOutOptions) =>
      keep(
        "archive_out",
        { path, ...o },
        () => runtime.archiveOut(path, o),
        (b: Uint8Array) => b.length > MAX_PAYLOAD ? { omitted: b.length } : b64(b),
      ),
    archiveIn: (dir: string, tar: Uint8Array) =>
      keep("archive_in", { dir }, () => runtime.archiveIn(dir, tar), () => null),
    stop: () => runtime.stop(),
    ...(runtime.spawn ? { spawn: runtime.spawn.bind(runtime) } : {}),
    ...(runtime.snapshot ? { snapshot: runtime.snapshot.bind(runtime) } : {}),
    ...(runtime.killProcesses
      ? {
        killProcesses: (o?: { signal?: AbortSignal }) =>
          keep("kill_processes", {}, () => runtime.killProcesses!(o), () => null),
      }
      : {}),
    [Symbol.asyncDispose]: () => runtime.stop(),
  };
  return wrapped;
}

/** A recorded error as the class it was thrown as, so callers that tell them apart still can. */
function revive(e: { name: string; message: string }, args: unknown): Error {
  const path = String((args as { path?: string })?.path ?? "");
  switch (e.name) {
    case "SandboxFileNotFoundError":
      return new SandboxFileNotFoundError(path, e.message);
    case "SandboxFileTooLargeError": {
      const error = new SandboxFileTooLargeError(path, 0, 0, "");
      error.message = e.message;
      return error;
    }
    case "SandboxUnavailableError":
      return new SandboxUnavailableError(e.message);
    case "CommandTimeoutError":
      return new CommandTimeoutError(e.message);
    default: {
      const error = new Error(e.message);
      error.name = e.name;
      return error;
    }
  }
}

/** The re-run did something the record does not have. */
export class ReplayDivergedError extends InfraError {}

/** A sandbox that answers from a record. */
class ReplayRuntime implements Runtime {
  readonly id: string;
  #next = 0;

  constructor(readonly record: SandboxRecord, readonly where: string) {
    this.id = `replay-${where}`;
  }

  get type(): string {
    return this.record.type;
  }

  get capabilities(): RuntimeCapabilities {
    return this.record.capabilities;
  }

  start(): Promise<void> {
    return Promise.resolve();
  }

  #take(op: SandboxOp["op"], args: unknown): SandboxOp {
    const entry = this.record.ops[this.#next];
    const same = entry && entry.op === op && JSON.stringify(entry.args) === JSON.stringify(args);
    if (!same) {
      throw new ReplayDivergedError(
        `Replay of ${this.where} diverged at operation ${this.#next + 1}: the re-run asked ` +
          `${op} ${JSON.stringify(args).slice(0, 200)}, the record has ${
            entry ? `${entry.op} ${JSON.stringify(entry.args).slice(0, 200)}` : "nothing more"
          }`,
      );
    }
    this.#next++;
    if (entry.error) throw revive(entry.error, args);
    return entry;
  }

  #bytes(entry: SandboxOp): Uint8Array {
    if (typeof entry.result !== "string") {
      throw new ReplayDivergedError(
        `Replay of ${this.where}: the recorded payload was too large to keep`,
      );
    }
    return unb64(entry.result);
  }

  run(argv: string[], options?: RunOptions): Promise<RunResult> {
    try {
      return Promise.resolve(this.#take("run", runArgs(argv, options)).result as RunResult);
    } catch (error) {
      return Promise.reject(error);
    }
  }

  read(path: string, options?: { maxBytes?: number }): Promise<Uint8Array> {
    try {
      return Promise.resolve(this.#bytes(this.#take("read", { path, ...options })));
    } catch (error) {
      return Promise.reject(error);
    }
  }

  write(path: string, _data: string | Uint8Array, options?: { mode?: number }): Promise<void> {
    try {
      this.#take("write", { path, ...options });
      return Promise.resolve();
    } catch (error) {
      return Promise.reject(error);
    }
  }

  archiveOut(path: string, options?: ArchiveOutOptions): Promise<Uint8Array> {
    try {
      return Promise.resolve(this.#bytes(this.#take("archive_out", { path, ...options })));
    } catch (error) {
      return Promise.reject(error);
    }
  }

  archiveIn(dir: string, _tar: Uint8Array): Promise<void> {
    try {
      this.#take("archive_in", { dir });
      return Promise.resolve();
    } catch (error) {
      return Promise.reject(error);
    }
  }

  killProcesses(): Promise<void> {
    try {
      this.#take("kill_processes", {});
      return Promise.resolve();
    } catch (error) {
      return Promise.reject(error);
    }
  }

  /** fork_group replays too: a member answers from its own record, so the snapshot is a name. */
  snapshot(): Promise<RuntimeSnapshot> {
    return Promise.resolve({ image: "vf-replay", remove: () => Promise.resolve() });
  }

  stop(): Promise<void> {
    return Promise.resolve();
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.stop();
  }
}

/** One rollout's line of `record.jsonl`. */
export interface RolloutRecord {
  format_version: 1;
  trace_id: string;
  task: string;
  rollout_index: number;
  role: string;
  sandboxes: SandboxRecord[];
  /** Its toolsets' tools and calls, when it had any. */
  tools?: ToolboxRecord | null;
}

/** What is wrong with a line of `record.jsonl` read back (null: nothing); every field is hostile. */
function recordProblem(v: Record<string, unknown>): string | null {
  if (v.format_version !== 1) return `format_version ${JSON.stringify(v.format_version)} is not 1`;
  if (typeof v.task !== "string") return `"task" is not a string`;
  if (!Number.isInteger(v.rollout_index) || (v.rollout_index as number) < 0) {
    return `"rollout_index" is not a whole number`;
  }
  const sandboxes = v.sandboxes;
  if (!Array.isArray(sandboxes)) return `"sandboxes" is not a list`;
  for (const [i, s] of sandboxes.entries()) {
    const ok = s !== null && typeof s === "object" && (s.role === "agent" || s.role === "grader") &&
      typeof s.type === "string" && s.capabilities !== null && typeof s.capabilities === "object" &&
      Array.isArray(s.ops) &&
      s.ops.every((o: unknown) => o !== null && typeof (o as SandboxOp).op === "string");
    if (!ok) return `"sandboxes[${i}]" is not a sandbox record (role, type, capabilities, ops)`;
  }
  if (v.tools != null && (typeof v.tools !== "object" || Array.isArray(v.tools))) {
    return `"tools" is not an object`;
  }
  return null;
}

/**
 * A run's `record.jsonl`. A line that is not a whole record (the torn last line of a run that
 * was killed mid-write, an edit) is skipped with a warning naming the file and line, as the
 * readers of `results.jsonl` and `traces.jsonl` do: a record is written before its trace, so
 * a torn one belongs to a rollout whose trace was never written, and the rest replay whole.
 */
export async function loadRecords(path: string): Promise<RolloutRecord[]> {
  return await readJsonLines<RolloutRecord>(path, { check: recordProblem });
}

/**
 * Sandboxes for a replay: the n-th sandbox a rollout asks for (by task, rollout index and
 * role) answers from the n-th one it recorded.
 */
export class ReplaySandboxSource implements SandboxSource {
  readonly replaying = true;
  readonly #records = new Map<string, SandboxRecord[]>();
  readonly #tools = new Map<string, ToolboxRecord>();
  readonly #taken = new Map<string, number>();

  constructor(records: RolloutRecord[]) {
    for (const r of records) {
      // A later attempt of the same rollout replaces an earlier one.
      this.#records.set(`${r.task}#${r.rollout_index}`, r.sandboxes);
      if (r.tools) this.#tools.set(`${r.task}#${r.rollout_index}`, r.tools);
    }
  }

  /** The rollout's recorded toolset calls, if it had toolsets. */
  recordedTools(task: string, rollout: number): ToolboxRecord | null {
    return this.#tools.get(`${task}#${rollout}`) ?? null;
  }

  acquire(_spec: RuntimeSpec, options: AcquireOptions = {}): Promise<Runtime> {
    const key = `${options.task}#${options.rollout ?? 0}`;
    const all = this.#records.get(key) ?? [];
    const role = options.role ?? "agent";
    const slot = `${key}#${role}`;
    const n = this.#taken.get(slot) ?? 0;
    this.#taken.set(slot, n + 1);
    const record = all.filter((s) => s.role === role)[n];
    if (!record) {
      return Promise.reject(
        new ReplayDivergedError(
          `The record has no ${role} sandbox #${n + 1} for task "${options.task}" rollout ${
            options.rollout ?? 0
          }`,
        ),
      );
    }
    return Promise.resolve(
      new ReplayRuntime(
        record,
        `task "${options.task}" rollout ${options.rollout ?? 0} ${role} sandbox`,
      ),
    );
  }

  close(): Promise<void> {
    return Promise.resolve();
  }
}
