/**
 * A rollout's toolbox: its toolsets opened as MCP clients (a stdio server started for the
 * rollout, a URL connected, TypeScript tools served in-process over an in-memory transport),
 * their tools listed as `<toolset>_<tool>`, and calls with a per-call time limit. Closed with
 * the rollout.
 * @module
 */
import process from "node:process";
import type { Client } from "npm:@modelcontextprotocol/sdk@^1.32.0/client/index.js";
import { ConfigError, InfraError } from "../errors.ts";
import { fetchEnv } from "../util/_fetch_env.ts";
import type { Tool } from "../types.ts";
import { TOOLSET_NAME, type ToolsetSpec } from "./toolset.ts";
import type { Runtime } from "../../runtimes/runtime.ts";
import { SandboxStdioTransport } from "./sandbox_stdio.ts";
import { LocalStdioTransport } from "./local_stdio.ts";

/** What opening a toolbox needs: the rollout's state, and its sandbox for colocated servers. */
export interface ToolboxContext {
  state: Record<string, unknown>;
  /** The agent's sandbox, where colocated servers run. */
  runtime?: Runtime;
  /** The user colocated servers run as. */
  user?: string;
  signal?: AbortSignal;
}

/** A toolbox's tools and every call made through it, in order (what a replay answers from). */
export interface ToolboxRecord {
  tools: Tool[];
  calls: Array<{ name: string; args: Record<string, unknown>; result: ToolResult }>;
}

/** A tool call's result as the model sees it. */
export interface ToolResult {
  text: string;
  /** The server reported an error (it goes back to the model as the result). */
  isError: boolean;
}

interface Open {
  spec: ToolsetSpec;
  client: Client;
  tools: Tool[];
}

/**
 * Check toolset specs: a valid, unique name each and exactly one source.
 * @throws {ConfigError} naming `field[i]`
 */
export function checkToolsets(specs: ToolsetSpec[], field = "toolsets"): void {
  const seen = new Set<string>();
  specs.forEach((s, i) => {
    const at = `${field}[${i}]`;
    if (typeof s.name !== "string" || !TOOLSET_NAME.test(s.name)) {
      throw new ConfigError(
        `${at}.name: "${s.name}" is not a toolset name (letters, digits and "-"; it prefixes the tools as <name>_<tool>)`,
      );
    }
    if (seen.has(s.name)) {
      throw new ConfigError(
        `${at}.name: two toolsets are named "${s.name}"; tool names would clash`,
      );
    }
    seen.add(s.name);
    const sources = [s.command, s.url, s.tools].filter((x) => x !== undefined).length;
    if (sources !== 1) {
      throw new ConfigError(
        `${at}: give exactly one of command (a stdio MCP server), url (streamable HTTP) or tools`,
      );
    }
    if (s.colocated && s.command === undefined) {
      throw new ConfigError(
        `${at}.colocated: only a command (a stdio MCP server the image can run) runs inside the ` +
          `sandbox; url and TypeScript toolsets run on the evaluator`,
      );
    }
    if (s.colocated && s.shared) {
      throw new ConfigError(
        `${at}: a colocated toolset runs in each rollout's sandbox, so it cannot be shared`,
      );
    }
    if (s.timeout !== undefined && !(s.timeout > 0)) {
      throw new ConfigError(`${at}.timeout: must be a positive number of seconds`);
    }
  });
}

/**
 * Variables a stdio server inherits: the basics, and what fetching its packages needs (a
 * `npx`/`deno run npm:` server behind a TLS-inspecting network needs its CA bundle); never
 * credentials (a proxy's `user:password@` is left out: give it in the toolset's `env`).
 */
function baseEnv(): Record<string, string> {
  const keep = ["PATH", "HOME", "LANG", "TMPDIR", "DENO_DIR", "LOGNAME", "SHELL", "TERM", "USER"];
  return {
    ...Object.fromEntries(keep.flatMap((k) => (process.env[k] ? [[k, process.env[k]!]] : []))),
    ...fetchEnv({ credentials: false }),
  };
}

/** The open toolsets of one rollout. */
export class Toolbox {
  readonly #open: Open[];
  /** Toolsets opened once for the run: offered here, never closed here. */
  readonly #shared: Open[];
  readonly #byName = new Map<string, { open: Open; tool: string }>();

  private constructor(open: Open[], shared: Open[] = []) {
    this.#open = open;
    this.#shared = shared;
    for (const o of [...shared, ...open]) {
      for (const t of o.tools) {
        this.#byName.set(t.name, { open: o, tool: t.name.slice(o.spec.name.length + 1) });
      }
    }
  }

  /**
   * A rollout's view of this (run-wide) toolbox plus its own toolsets: the shared ones stay
   * open when the rollout's toolbox closes.
   * @throws {ConfigError} when a toolset name is both shared and the rollout's own
   */
  async with(
    specs: ToolsetSpec[],
    ctx: ToolboxContext,
  ): Promise<Toolbox> {
    const shared = [...this.#shared, ...this.#open];
    const clash = specs.find((s) => shared.some((o) => o.spec.name === s.name));
    if (clash) {
      throw new ConfigError(
        `Toolset "${clash.name}" is both shared by the run and the rollout's own; rename one`,
      );
    }
    const own = specs.length ? await Toolbox.open(specs, ctx) : null;
    return new Toolbox(own ? own.#open : [], shared);
  }

  /**
   * Open every toolset (concurrently). A server that does not start or list its tools is an
   * infrastructure error naming it; whatever did open is closed again.
   * @throws {InfraError}
   */
  static async open(
    specs: ToolsetSpec[],
    ctx: ToolboxContext,
  ): Promise<Toolbox> {
    checkToolsets(specs);
    const opened: Open[] = [];
    // Loaded on first use: importing vf (e.g. in the permission sandbox) must not load the SDK,
    // whose stdio client reads the environment when it is evaluated.
    const { Client } = await import("npm:@modelcontextprotocol/sdk@^1.32.0/client/index.js");
    const results = await Promise.allSettled(specs.map(async (spec) => {
      const client = new Client({ name: "vf", version: "1" });
      try {
        await connect(client, spec, ctx);
        const listed: Array<{ name: string; description?: string; inputSchema?: unknown }> = [];
        let cursor: string | undefined;
        do {
          const page = await client.listTools(cursor ? { cursor } : undefined, {
            signal: ctx.signal,
            timeout: (spec.timeout ?? 60) * 1000,
          });
          listed.push(...page.tools);
          cursor = page.nextCursor;
        } while (cursor);
        const tools = listed.map((
          t: { name: string; description?: string; inputSchema?: unknown },
        ): Tool => ({
          name: `${spec.name}_${t.name}`,
          description: t.description ?? "",
          parameters: (t.inputSchema ?? { type: "object", properties: {} }) as Tool["parameters"],
        }));
        opened.push({ spec, client, tools });
      } catch (error) {
        await client.close().catch(() => {});
        throw new InfraError(
          `Toolset "${spec.name}" did not start or list its tools: ${(error as Error).message}`,
          { cause: error },
        );
      }
    }));
    const failed = results.find((r) => r.status === "rejected") as
      | PromiseRejectedResult
      | undefined;
    if (failed) {
      await Promise.all(opened.map((o) => o.client.close().catch(() => {})));
      throw failed.reason;
    }
    // Keep the declared order.
    opened.sort((a, b) => specs.indexOf(a.spec) - specs.indexOf(b.spec));
    return new Toolbox(opened);
  }

  /** The tools, named `<toolset>_<tool>`, as the model is offered them. */
  get tools(): Tool[] {
    return [...this.#shared, ...this.#open].flatMap((o) => o.tools);
  }

  /** Whether `name` is one of the toolbox's tools. */
  has(name: string): boolean {
    return this.#byName.has(name);
  }

  /**
   * Call a tool by its offered name. A server error comes back as `isError`; a call past its
   * time limit throws.
   */
  async call(
    name: string,
    args: Record<string, unknown>,
    signal?: AbortSignal,
  ): Promise<ToolResult> {
    const found = this.#byName.get(name);
    if (!found) throw new ConfigError(`Unknown tool "${name}"`);
    const timeout = (found.open.spec.timeout ?? 60) * 1000;
    const result = await found.open.client.callTool(
      { name: found.tool, arguments: args },
      undefined,
      { signal, timeout },
    );
    const content = (result.content ?? []) as Array<{ type: string; text?: string }>;
    const text = content.map((c) => (c.type === "text" ? c.text ?? "" : `[${c.type}]`)).join("\n");
    const out = { text, isError: result.isError === true };
    if (this.record?.tools.some((t) => t.name === name)) {
      this.record.calls.push({ name, args, result: out });
    }
    return out;
  }

  /** Where this toolbox's calls are kept for a replay (set by the rollout). */
  record: ToolboxRecord | null = null;

  /**
   * The tools served by other processes (stdio commands, URLs): what a replay answers from
   * its record. TypeScript tools run in this process and run again in a replay.
   */
  get externalTools(): Tool[] {
    return [...this.#shared, ...this.#open].filter((o) => o.spec.tools === undefined)
      .flatMap((o) => o.tools);
  }

  /**
   * A toolbox that answers from a record: its tools are the recorded ones, and each call gets
   * the recorded result of the same call, in order.
   * @throws {InfraError} (from `call`) when the re-run calls something else
   */
  static fromRecord(record: ToolboxRecord): Toolbox {
    let next = 0;
    const spec = { name: "replay" } as ToolsetSpec;
    const client = {
      callTool: ({ name, arguments: args }: { name: string; arguments: unknown }) => {
        const entry = record.calls[next];
        const full = entry?.name;
        if (
          !entry || !full.endsWith(`_${name}`) ||
          JSON.stringify(entry.args) !== JSON.stringify(args)
        ) {
          return Promise.reject(
            new InfraError(
              `Replay of the toolsets diverged at call ${next + 1}: the re-run called ${name} ` +
                `${JSON.stringify(args).slice(0, 200)}, the record has ${
                  entry
                    ? `${entry.name} ${JSON.stringify(entry.args).slice(0, 200)}`
                    : "nothing more"
                }`,
            ),
          );
        }
        next++;
        return Promise.resolve({
          content: [{ type: "text", text: entry.result.text }],
          isError: entry.result.isError,
        });
      },
      close: () => Promise.resolve(),
    } as unknown as Client;
    // Each recorded tool keeps its full name: the toolset part is everything before the last
    // `<server>_` split the live toolbox made, so one synthetic toolset per server name.
    const byServer = new Map<string, Tool[]>();
    for (const t of record.tools) {
      const server = t.name.slice(0, t.name.indexOf("_"));
      byServer.set(server, [...(byServer.get(server) ?? []), t]);
    }
    const opens = [...byServer].map(([server, tools]) => ({
      spec: { ...spec, name: server },
      client,
      tools,
    }));
    return new Toolbox(opens);
  }

  /** Close this toolbox's own toolsets (stops stdio servers); shared ones stay. Idempotent. */
  async close(): Promise<void> {
    await Promise.all(this.#open.splice(0).map((o) => o.client.close().catch(() => {})));
  }
}

async function connect(client: Client, spec: ToolsetSpec, ctx: ToolboxContext) {
  const state = ctx.state;
  // The handshake ends with the rollout; a launcher may fetch packages first, so it gets at
  // least the SDK's 60 s whatever the per-call limit.
  const handshake = { signal: ctx.signal, timeout: Math.max(60, spec.timeout ?? 60) * 1000 };
  if (spec.command !== undefined && spec.colocated) {
    if (!ctx.runtime) {
      throw new ConfigError(
        `Toolset "${spec.name}" is colocated, but there is no sandbox to run it in`,
      );
    }
    const transport = new SandboxStdioTransport(ctx.runtime, [spec.command, ...(spec.args ?? [])], {
      env: spec.env,
      cwd: spec.cwd,
      user: ctx.user,
    });
    try {
      await client.connect(transport, handshake);
    } catch (error) {
      const stderr = transport.stderr.trim();
      throw stderr ? new Error(`${(error as Error).message} (server stderr: ${stderr})`) : error;
    }
    return;
  }
  if (spec.command !== undefined) {
    const transport = new LocalStdioTransport(spec.command, {
      args: spec.args ?? [],
      env: { ...baseEnv(), ...(spec.env ?? {}) },
      cwd: spec.cwd,
      name: spec.name,
    });
    try {
      await client.connect(transport, handshake);
    } catch (error) {
      const stderr = transport.stderr.trim();
      throw stderr ? new Error(`${(error as Error).message} (server stderr: ${stderr})`) : error;
    }
    return;
  }
  if (spec.url !== undefined) {
    const { StreamableHTTPClientTransport } = await import(
      "npm:@modelcontextprotocol/sdk@^1.32.0/client/streamableHttp.js"
    );
    await client.connect(new StreamableHTTPClientTransport(new URL(spec.url)), handshake);
    return;
  }
  const [{ McpServer }, { InMemoryTransport }] = await Promise.all([
    import("npm:@modelcontextprotocol/sdk@^1.32.0/server/mcp.js"),
    import("npm:@modelcontextprotocol/sdk@^1.32.0/inMemory.js"),
  ]);
  const server = new McpServer({ name: spec.name, version: "1" });
  for (const [name, def] of Object.entries(spec.tools ?? {})) {
    server.registerTool(
      name,
      { description: def.description, inputSchema: def.parameters },
      async (args: Record<string, unknown>, extra: { signal?: AbortSignal }) => {
        try {
          const out = await def.run(args, { state, signal: extra.signal });
          return {
            content: [{
              type: "text" as const,
              text: typeof out === "string" ? out : JSON.stringify(out),
            }],
          };
        } catch (error) {
          return {
            isError: true,
            content: [{
              type: "text" as const,
              text: `Error: ${(error as Error).message ?? error}`,
            }],
          };
        }
      },
    );
  }
  const [clientSide, serverSide] = InMemoryTransport.createLinkedPair();
  await server.connect(serverSide);
  await client.connect(clientSide);
}
