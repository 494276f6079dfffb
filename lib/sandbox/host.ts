/**
 * The sandboxed environment host. The evaluator starts it as a separate Deno process with
 * narrow permissions (no file, env or subprocess access; network only to declared hosts)
 * and talks to it over stdin/stdout. Untrusted environment code runs here; every model call
 * and sandbox operation it makes is forwarded to the evaluator, which holds the keys and
 * the Docker socket.
 * @module
 */
import { fromBase64, RpcPeer, toBase64 } from "./protocol.ts";
import type { ChatClient, ChatRequestOptions } from "../model/client.ts";
import type {
  RunOptions,
  RunResult,
  Runtime,
  RuntimeCapabilities,
} from "../../runtimes/runtime.ts";
import type { Messages, Response } from "../types.ts";

// deno-lint-ignore no-explicit-any
type Any = any;

// Environment code may print; stdout belongs to the channel.
console.log = console.error;
console.info = console.error;
console.debug = console.error;

const encoder = new TextEncoder();
const stdout = Deno.stdout;
async function writeLine(line: string): Promise<void> {
  const bytes = encoder.encode(line);
  let off = 0;
  while (off < bytes.length) off += await stdout.write(bytes.subarray(off));
}

const PERMISSION_RE =
  /Requires (\w+) access to "?([^",]+)"?, run again with the --allow-(\w+) flag/;

/** Rewrite Deno's permission errors into a message that says how to grant them in vf. */
export function explainPermission(message: string): string {
  const m = PERMISSION_RE.exec(message);
  if (!m) return message;
  const [, kind, target, flag] = m;
  const hint = /docker\.sock/.test(target)
    ? "vf never grants access to the Docker socket; sandboxes are reached through ctx.runtime"
    : ["net", "read", "env"].includes(flag)
    ? `grant it with --allow-${flag}=${target} (TOML: [sandbox] allow_${flag} = ["${target}"])`
    : `vf never grants ${flag} access to sandboxed environments; run trusted code with --trust`;
  return `Permission denied: the sandboxed environment tried to use ${kind} access to "${target}"; ${hint}`;
}

/**
 * A permission denial as data for the rollout's error: which permission, on what target, and
 * the flag that grants it (null where vf never grants it).
 */
export function permissionOf(
  message: string,
): { permission: string; target: string; flag: string | null } | null {
  const m = PERMISSION_RE.exec(message);
  if (!m) return null;
  const [, kind, target, flag] = m;
  const grantable = ["net", "read", "env"].includes(flag) && !/docker\.sock/.test(target);
  return { permission: kind, target, flag: grantable ? `--allow-${flag}=${target}` : null };
}

let env: Any = null;
let taskset: Any = null;
const tasks = new Map<string, Any>();

class ProxyClient implements ChatClient {
  constructor(
    readonly baseUrl: string,
    readonly headersFromState: Record<string, string>,
    readonly clientId: number,
  ) {}
  async getResponse(
    prompt: Messages,
    model: string,
    options: ChatRequestOptions = {},
  ): Promise<Response> {
    return await peer.call<Response>("model.get_response", {
      client: this.clientId,
      prompt,
      model,
      tools: options.tools,
      sampling_args: options.samplingArgs,
      headers: options.headers,
      cache_salt: options.cacheSalt,
    }, { signal: options.signal });
  }
}

class ProxyRuntime implements Runtime {
  constructor(
    readonly rid: number,
    readonly type: string,
    readonly id: string,
    readonly capabilities: RuntimeCapabilities,
  ) {}
  start(): Promise<void> {
    return Promise.reject(new Error("Sandboxed environments cannot start runtimes"));
  }
  async run(argv: string[], options: RunOptions = {}): Promise<RunResult> {
    const { signal, stdin, ...rest } = options;
    return await peer.call<RunResult>("runtime.run", {
      rid: this.rid,
      argv,
      options: {
        ...rest,
        stdin: stdin === undefined
          ? undefined
          : toBase64(typeof stdin === "string" ? encoder.encode(stdin) : stdin),
      },
    }, { signal });
  }
  async read(path: string, options: { maxBytes?: number } = {}): Promise<Uint8Array> {
    return fromBase64(
      await peer.call<string>("runtime.read", { rid: this.rid, path, max_bytes: options.maxBytes }),
    );
  }
  async write(
    path: string,
    data: string | Uint8Array,
    options: { mode?: number } = {},
  ): Promise<void> {
    await peer.call("runtime.write", {
      rid: this.rid,
      path,
      data: toBase64(typeof data === "string" ? encoder.encode(data) : data),
      mode: options.mode,
    });
  }
  async archiveOut(
    path: string,
    options: { maxBytes?: number; exclude?: string[] } = {},
  ): Promise<Uint8Array> {
    return fromBase64(
      await peer.call<string>("runtime.archive_out", {
        rid: this.rid,
        path,
        max_bytes: options.maxBytes,
        exclude: options.exclude,
      }),
    );
  }
  async archiveIn(dir: string, tar: Uint8Array): Promise<void> {
    await peer.call("runtime.archive_in", { rid: this.rid, dir, tar: toBase64(tar) });
  }
  stop(): Promise<void> {
    return Promise.resolve(); // the evaluator owns the sandbox's lifetime
  }
  [Symbol.asyncDispose](): Promise<void> {
    return this.stop();
  }
}

function runtimeOf(p: Any): ProxyRuntime {
  return new ProxyRuntime(p.rid, p.type, p.id, p.capabilities);
}

function taskOf(key: string): Any {
  const task = tasks.get(key);
  if (!task) throw new Error(`Unknown task "${key}"`);
  return task;
}

function plainData(data: unknown): unknown {
  return JSON.parse(JSON.stringify(data ?? null));
}

async function handle(method: string, p: Any, signal: AbortSignal): Promise<unknown> {
  switch (method) {
    case "load": {
      const module = await import(p.url);
      if (p.kind === "environment") {
        if (typeof module.loadEnvironment !== "function") {
          if (typeof module.loadTaskset === "function") {
            // Named so the evaluator can tell it apart and run the module as a taskset.
            const error = new TypeError(
              `Module "${p.url}" exports loadTaskset(), not loadEnvironment(): it is a taskset; run it with vf run ${p.url}`,
            );
            error.name = "TasksetNotEnvironmentError";
            throw error;
          }
          throw new TypeError(
            `Environment module "${p.url}" does not export a loadEnvironment() function`,
          );
        }
        env = await module.loadEnvironment(p.args ?? {});
        if (!env.envId) env.envId = p.id;
        return {
          env_id: env.envId,
          env_args: env.envArgs ?? p.args ?? {},
          sampling_args: env.samplingArgs ?? {},
          pass_threshold: env.passThreshold ?? 0.5,
          eval_defaults: module.evalDefaults ?? null,
        };
      }
      if (typeof module.loadTaskset !== "function") {
        throw new TypeError(`Taskset module "${p.url}" does not export a loadTaskset() function`);
      }
      taskset = await module.loadTaskset(p.args ?? {});
      return { id: taskset.id };
    }
    case "env.eval_dataset": {
      const ds = await env.getEvalDataset(p.n ?? -1, p.seed ?? null);
      return ds.toList();
    }
    case "env.run_group": {
      const client = new ProxyClient(
        p.client.base_url,
        p.client.headers_from_state ?? {},
        p.client.id,
      );
      const result = await env.runGroupOutputs(p.inputs, client, p.model, {
        signal,
        samplingArgs: p.sampling_args,
        independentScoring: p.independent_scoring,
        stateColumns: p.state_columns,
      });
      for (const o of result.outputs) {
        if (!o.error?.message) continue;
        // A denial is recorded as such: typed on the rollout, not only in the message.
        const denied = permissionOf(o.error.message);
        o.error.message = explainPermission(o.error.message);
        if (denied) o.error.permission_denied = denied;
      }
      return plainData(result);
    }
    case "env.teardown":
      await env?.teardown?.();
      return null;
    case "taskset.list": {
      const list = await taskset.tasks(p.limit ?? -1);
      tasks.clear();
      return list.map((t: Any) => {
        tasks.set(t.key, t);
        return {
          key: t.key,
          hash: t.hash,
          data: plainData(t.data),
          needs_container: t.needsContainer,
          runtime_env: t.runtimeEnv?.() ?? {},
        };
      });
    }
    case "task.hook": {
      const task = taskOf(p.key);
      const trace = { info: p.info ?? {}, messages: p.messages ?? [], artifacts: new Map() };
      const ctx = { runtime: runtimeOf(p.runtime), task, data: task.data, trace };
      const result = await task[p.hook](ctx);
      return { result: result ?? null, info: plainData(trace.info) };
    }
    case "task.score": {
      const task = taskOf(p.key);
      const trace = { info: p.info ?? {}, messages: p.messages ?? [], artifacts: new Map() };
      const scores = await task.score({
        runtime: runtimeOf(p.runtime),
        task,
        data: task.data,
        trace,
      });
      return { scores, info: plainData(trace.info) };
    }
    default:
      throw new Error(`Unknown method "${method}"`);
  }
}

const peer = new RpcPeer(writeLine, async (method, params, signal) => {
  try {
    return await handle(method, params, signal);
  } catch (error) {
    const e = error instanceof Error ? error : new Error(String(error));
    const wrapped: Error & { data?: unknown } = new Error(explainPermission(e.message));
    wrapped.name = e.name;
    // A denial travels as data too, so the evaluator records it typed on the trace.
    const denied = permissionOf(e.message);
    if (denied) wrapped.data = { permission_denied: denied };
    throw wrapped;
  }
});

await peer.pump(Deno.stdin.readable, () => new Error("Evaluator closed the channel"));
// The evaluator is gone or done with us: whatever the environment left running (timers,
// servers, signal listeners) must not keep this process alive.
Deno.exit(0);
