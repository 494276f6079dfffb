/**
 * A rollout's toolbox: its toolsets opened as MCP clients (a stdio server started for the
 * rollout, a URL connected with its headers and OAuth, TypeScript tools served in-process over
 * an in-memory transport), their tools listed as `<toolset>_<tool>`, and calls with a per-call
 * time limit. The client declares roots (the sandbox's workdir), elicitation (answered by the
 * toolset's policy) and, in a rollout, sampling (answered through the rollout's model by the
 * caller's sampler). Closed with the rollout.
 * @module
 */
import process from "node:process";
import { pathToFileURL } from "node:url";
import type { Client } from "npm:@modelcontextprotocol/sdk@^1.32.0/client/index.js";
import { ConfigError, InfraError } from "../errors.ts";
import { fetchEnv } from "../util/_fetch_env.ts";
import type { ContentPart, Messages, Tool } from "../types.ts";
import { TOOLSET_NAME, type ToolsetSpec } from "./toolset.ts";
import { renderContent } from "./content.ts";
import type { Runtime } from "../../runtimes/runtime.ts";
import { SandboxStdioTransport } from "./sandbox_stdio.ts";
import { LocalStdioTransport } from "./local_stdio.ts";
import { AuthCodeProvider, authCodeTransport, checkOAuth } from "./oauth.ts";
import { authWait, closeHttp, httpOptions } from "./url_toolset.ts";

/** What opening a toolbox needs: the rollout's state, and its sandbox for colocated servers. */
export interface ToolboxContext {
  state: Record<string, unknown>;
  /** The agent's sandbox, where colocated servers run. */
  runtime?: Runtime;
  /** The user colocated servers run as. */
  user?: string;
  /**
   * Folders offered as the client's roots (`roots/list`) to colocated servers: the sandbox's
   * workdir. A stdio server on the evaluator is offered its `cwd`, a URL server none.
   */
  roots?: string[];
  /**
   * Declare the sampling capability: the calls come with a sampler ({@link CallOptions}),
   * as a rollout's harness gives. Default false.
   */
  sampling?: boolean;
  /**
   * The run the toolbox belongs to (its run id): toolboxes of one run share a URL toolset's
   * OAuth authorization and tokens, those of another run never do. Without one, toolboxes
   * opened without a run share them.
   */
  run?: string;
  signal?: AbortSignal;
}

/** A server's `sampling/createMessage` request, in vf's terms. */
export interface SamplingRequest {
  /** The toolset asking. */
  toolset: string;
  messages: Messages;
  maxTokens: number;
  temperature?: number;
  stopSequences?: string[];
  signal?: AbortSignal;
}

/** What answers a server's sampling request: the model's reply. */
export type Sampler = (
  request: SamplingRequest,
) => Promise<{ text: string; model: string; stopReason: "endTurn" | "maxTokens" }>;

/** Options of one {@link Toolbox.call}. */
export interface CallOptions {
  /** Ends the call (a `notifications/cancelled` is sent only for a call still running). */
  signal?: AbortSignal;
  /** Answers the server's sampling requests made while this call runs. */
  sample?: Sampler;
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
  /** The result as text and image parts, when it carries images the model takes. */
  parts?: ContentPart[];
}

interface Open {
  spec: ToolsetSpec;
  client: Client;
  /** Closes the client and what its transport holds (a URL's session and connections). */
  close: () => Promise<void>;
  tools: Tool[];
  /** Calls running now, latest last: a sampling request goes to the latest one's sampler. */
  running: CallOptions[];
  /** A replay's answer to a call, instead of the client. */
  replay?: (tool: string, args: Record<string, unknown>) => ToolResult;
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
    if ((s.headers !== undefined || s.oauth !== undefined) && s.url === undefined) {
      throw new ConfigError(
        `${at}.${s.headers !== undefined ? "headers" : "oauth"}: only a url toolset sends ` +
          `HTTP headers or does OAuth; give a stdio server its secrets in env`,
      );
    }
    if (s.oauth) checkOAuth(s.oauth, `${at}.oauth`);
    const e = s.elicitation;
    if (
      e !== undefined && e !== "decline" && e !== "cancel" &&
      !(typeof e === "object" && e && typeof e.accept === "object" && e.accept &&
        !Array.isArray(e.accept))
    ) {
      throw new ConfigError(
        `${at}.elicitation: expected "decline", "cancel" or { accept = { ... } } (the answer)`,
      );
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
    const [{ Client }, types] = await Promise.all([
      import("npm:@modelcontextprotocol/sdk@^1.32.0/client/index.js"),
      import("npm:@modelcontextprotocol/sdk@^1.32.0/types.js"),
    ]);
    const results = await Promise.allSettled(specs.map(async (spec) => {
      const client = new Client({ name: "vf", version: "1" }, {
        capabilities: {
          roots: { listChanged: false },
          elicitation: { form: { applyDefaults: true } },
          ...(ctx.sampling ? { sampling: {} } : {}),
        },
      });
      const running: CallOptions[] = [];
      answerServer(client, types, spec, ctx, running);
      let close = () => client.close();
      try {
        const connected = await connect(client, spec, ctx, (c) => close = c);
        const listed: Array<{ name: string; description?: string; inputSchema?: unknown }> = [];
        try {
          let cursor: string | undefined;
          do {
            using own = scoped(ctx.signal);
            const page = await client.listTools(cursor ? { cursor } : undefined, {
              signal: own.signal,
              timeout: ((spec.timeout ?? 60) + authWait(spec)) * 1000,
            });
            listed.push(...page.tools);
            cursor = page.nextCursor;
          } while (cursor);
        } finally {
          connected?.();
        }
        const tools = listed.map((
          t: { name: string; description?: string; inputSchema?: unknown },
        ): Tool => ({
          name: `${spec.name}_${t.name}`,
          description: t.description ?? "",
          parameters: (t.inputSchema ?? { type: "object", properties: {} }) as Tool["parameters"],
        }));
        opened.push({ spec, client, close, tools, running });
      } catch (error) {
        await close().catch(() => {});
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
      await Promise.all(opened.map((o) => o.close().catch(() => {})));
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
    options?: AbortSignal | CallOptions,
  ): Promise<ToolResult> {
    const found = this.#byName.get(name);
    if (!found) throw new ConfigError(`Unknown tool "${name}"`);
    const opts: CallOptions = options instanceof AbortSignal ? { signal: options } : options ?? {};
    const open = found.open;
    let out: ToolResult;
    if (open.replay) out = open.replay(found.tool, args);
    else {
      const timeout = (open.spec.timeout ?? 60) * 1000;
      // A signal of the call's own: the SDK never removes the listener it adds, so the
      // rollout's signal, aborted at teardown, would cancel every call that already finished.
      using own = scoped(opts.signal);
      open.running.push(opts);
      try {
        const result = await open.client.callTool(
          { name: found.tool, arguments: args },
          undefined,
          { signal: own.signal, timeout },
        );
        out = {
          ...renderContent(result, open.spec.images === true),
          isError: result.isError === true,
        };
      } finally {
        open.running.splice(open.running.indexOf(opts), 1);
      }
    }
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
    const replay = (server: string) => (tool: string, args: Record<string, unknown>) => {
      const entry = record.calls[next];
      const name = `${server}_${tool}`;
      if (!entry || entry.name !== name || JSON.stringify(entry.args) !== JSON.stringify(args)) {
        throw new InfraError(
          `Replay of the toolsets diverged at call ${next + 1}: the re-run called ${name} ` +
            `${JSON.stringify(args).slice(0, 200)}, the record has ${
              entry ? `${entry.name} ${JSON.stringify(entry.args).slice(0, 200)}` : "nothing more"
            }`,
        );
      }
      next++;
      return structuredClone(entry.result);
    };
    const client = { close: () => Promise.resolve() } as unknown as Client;
    // Each recorded tool keeps its full name: the toolset part is everything before the last
    // `<server>_` split the live toolbox made, so one synthetic toolset per server name.
    const byServer = new Map<string, Tool[]>();
    for (const t of record.tools) {
      const server = t.name.slice(0, t.name.indexOf("_"));
      byServer.set(server, [...(byServer.get(server) ?? []), t]);
    }
    const opens = [...byServer].map(([server, tools]): Open => ({
      spec: { name: server },
      client,
      close: () => Promise.resolve(),
      tools,
      running: [],
      replay: replay(server),
    }));
    return new Toolbox(opens);
  }

  /** Close this toolbox's own toolsets (stops stdio servers); shared ones stay. Idempotent. */
  async close(): Promise<void> {
    await Promise.all(this.#open.splice(0).map((o) => o.close().catch(() => {})));
  }
}

/**
 * A signal of one request's own, following `outer` until disposed. The SDK never removes the
 * abort listener it adds to a request's signal, so a long-lived signal (the rollout's), aborted
 * at teardown, would send `notifications/cancelled` for every request that already finished.
 */
function scoped(outer: AbortSignal | undefined): { signal: AbortSignal } & Disposable {
  const own = new AbortController();
  const abort = () => own.abort(outer?.reason);
  if (outer?.aborted) abort();
  else outer?.addEventListener("abort", abort, { once: true });
  return {
    signal: own.signal,
    [Symbol.dispose]: () => outer?.removeEventListener("abort", abort),
  };
}

type Types = typeof import("npm:@modelcontextprotocol/sdk@^1.32.0/types.js");

/** One MCP sampling message's content as vf content. */
function samplingContent(content: unknown): ContentPart[] {
  const blocks = (Array.isArray(content) ? content : [content]) as Array<
    { type?: string; text?: string; data?: string; mimeType?: string }
  >;
  return blocks.map((b): ContentPart =>
    b?.type === "image" && b.data
      ? { type: "image_url", image_url: { url: `data:${b.mimeType};base64,${b.data}` } }
      : { type: "text", text: b?.type === "text" ? b.text ?? "" : `[${b?.type}]` }
  );
}

/**
 * The client's answers to the server's own requests: its roots, elicitation by the toolset's
 * policy, and sampling through the sampler of the call running (the latest, when several do).
 */
function answerServer(
  client: Client,
  types: Types,
  spec: ToolsetSpec,
  ctx: ToolboxContext,
  running: CallOptions[],
): void {
  // The sandbox's folders mean something only to a server inside it; one on the evaluator is
  // offered its own folder (a sandbox path there could name an unrelated folder of this host).
  const roots = spec.colocated
    ? ctx.roots ?? []
    : spec.command !== undefined && spec.cwd
    ? [spec.cwd]
    : [];
  client.setRequestHandler(types.ListRootsRequestSchema, () => ({
    roots: roots.map((path) => ({ uri: pathToFileURL(path).href, name: path })),
  }));
  client.setRequestHandler(types.ElicitRequestSchema, () => {
    const policy = spec.elicitation ?? "decline";
    return typeof policy === "object"
      ? { action: "accept" as const, content: structuredClone(policy.accept) as never }
      : { action: policy };
  });
  if (!ctx.sampling) return;
  // The fields read here (the SDK has validated the request against its schema).
  type CreateMessage = {
    params: {
      messages: Array<{ role: string; content: unknown }>;
      systemPrompt?: string;
      maxTokens: number;
      temperature?: number;
      stopSequences?: string[];
    };
  };
  client.setRequestHandler(types.CreateMessageRequestSchema, async (
    request: CreateMessage,
    extra: { signal: AbortSignal },
  ) => {
    const sample = running.findLast((c) => c.sample)?.sample;
    if (!sample) {
      throw new types.McpError(
        types.ErrorCode.InvalidRequest,
        `Toolset "${spec.name}" asked for sampling outside a tool call; there is no model to ask`,
      );
    }
    const p = request.params;
    const messages: Messages = [];
    if (p.systemPrompt) messages.push({ role: "system", content: p.systemPrompt });
    for (const m of p.messages) {
      const parts = samplingContent(m.content);
      const content = parts.every((x) => x.type === "text")
        ? parts.map((x) => (x as { text: string }).text).join("\n")
        : parts;
      messages.push(
        m.role === "assistant"
          ? { role: "assistant", content: content as string }
          : { role: "user", content },
      );
    }
    const reply = await sample({
      toolset: spec.name,
      messages,
      maxTokens: p.maxTokens,
      temperature: p.temperature,
      stopSequences: p.stopSequences,
      signal: extra.signal,
    });
    return {
      role: "assistant" as const,
      content: { type: "text" as const, text: reply.text },
      model: reply.model,
      stopReason: reply.stopReason,
    };
  });
}

/**
 * Connect; a returned function is to be called once the tools are listed. `setClose` is given
 * the toolset's closing where it needs more than the client's.
 */
async function connect(
  client: Client,
  spec: ToolsetSpec,
  ctx: ToolboxContext,
  setClose: (close: () => Promise<void>) => void,
): Promise<(() => void) | void> {
  const state = ctx.state;
  // The handshake ends with the rollout; a launcher may fetch packages first, so it gets at
  // least the SDK's 60 s whatever the per-call limit.
  using own = scoped(ctx.signal);
  // An authorization a person completes is waited for on top.
  const handshake = {
    signal: own.signal,
    timeout: (Math.max(60, spec.timeout ?? 60) + authWait(spec)) * 1000,
  };
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
    const options = await httpOptions(spec, ctx.run);
    // The toolset's own connections (its OAuth requests through the SDK included), closed
    // with it.
    const http = Deno.createHttpClient({});
    const own: typeof fetch = (input, init) => fetch(input, { ...init, client: http });
    const provider = options.authProvider;
    if (!(provider instanceof AuthCodeProvider)) {
      const transport = new StreamableHTTPClientTransport(new URL(spec.url), {
        ...options,
        fetch: own,
      });
      setClose(closeHttp(client, transport, http));
      await client.connect(transport, handshake);
      return;
    }
    // Rollouts connecting at once take turns: the first authorizes, the others use its token.
    const release = await provider.acquire();
    try {
      const transport = await authCodeTransport(new URL(spec.url), {
        ...options,
        authProvider: provider,
        fetch: own,
      });
      setClose(closeHttp(client, transport, http));
      await client.connect(transport, handshake);
    } catch (error) {
      release();
      throw error;
    }
    return release;
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
