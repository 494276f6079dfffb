/**
 * Harnesses run the agent for one task rollout. `bash` gives the model a shell (and a file
 * edit tool) inside the agent sandbox; `null` is a plain chat call. Custom harnesses
 * implement {@link Harness} and are passed to the run by object or registered by id.
 * @module
 */
import type { Runtime } from "../../runtimes/runtime.ts";
import type { CallSession, ChatClient, ChatRequestOptions } from "../model/client.ts";
import { CommandTimeoutError, InfraError, TaskError } from "../errors.ts";
import type { StopHook, Task, TaskData } from "./task.ts";
import type { MessageGraph } from "../graph.ts";
import { contentText } from "../messages.ts";
import { noteActivity } from "../util/activity.ts";
import type { Sampler, Toolbox } from "../tools/toolbox.ts";
import type { ContentPart } from "../types.ts";
import type { GatewayRoute } from "../gateway/gateway.ts";
import type { Message, Messages, Response, SamplingArgs, Tool, ToolCall } from "../types.ts";

/** One recorded model call. */
export interface ModelCallRecord {
  turn: number;
  started_at: number;
  duration_ms: number;
  request_messages: number;
  response: Response | null;
  error?: string;
  /** Attempts that failed and were retried before a request that failed at last. */
  retries?: number;
  /** The reply's node in the message graph. */
  node?: number;
  /** A toolset's sampling request (the toolset's name), outside the agent's conversation. */
  sampling?: string;
  /**
   * What the program asked that the model gateway could not give the model: tools it cannot
   * offer (`type` is the tool's), context edits it does not make (`context_management`).
   */
  not_honoured?: { name: string; type: string }[];
}

/** One recorded tool call. */
export interface ToolCallRecord {
  id: string;
  name: string;
  arguments: string;
  output: string;
  exit_code?: number;
  duration_ms: number;
  error?: string;
}

/** What a harness writes as it runs; persisted on the trace. */
export interface HarnessRecorder {
  messages: Messages;
  model_calls: ModelCallRecord[];
  tool_calls: ToolCallRecord[];
  stop_condition: string | null;
  usage: { input_tokens: number; output_tokens: number };
  /** Metrics the harness records as it runs; merged into the trace's metrics. */
  metrics: Record<string, number>;
  /**
   * Every model call's prompt and reply, as a graph: a harness that rewrites `messages`
   * (compaction) forks a branch. Filled by the built-in call path; kept on the trace when it
   * has more than one branch.
   */
  graph?: MessageGraph;
}

/** Everything a harness gets. */
export interface HarnessContext {
  task: Task;
  data: TaskData;
  runtime: Runtime;
  client: ChatClient;
  model: string;
  samplingArgs: SamplingArgs;
  recorder: HarnessRecorder;
  /** Model turns at most; default 30. */
  maxTurns: number;
  /** Token budgets over the rollout: checked before each model call (soft by one call). */
  tokenLimits?: TokenLimits;
  /** Per tool command limit in ms; default 600 000. */
  toolTimeoutMs: number;
  /** The user commands run as (`agent_user`), if any. */
  user?: string;
  /** The rollout's own state, shared with the task's hooks and rewards. */
  state: Record<string, unknown>;
  /** Stop conditions checked before every model call ({@link callModel}). */
  stops?: StopHook[];
  /** The rollout's toolsets (MCP): offered to the model beside the harness's own tools. */
  toolbox?: Toolbox;
  /** How the sandbox reaches the model gateway; given to harnesses with `needsGateway`. */
  gateway?: GatewayRoute;
  /** The rollout's trace id and group, handed to each model call ({@link callModel}). */
  session?: CallSession;
  signal?: AbortSignal;
}

/** Token budgets of a rollout (`[env.<role>] max_input_tokens`, ...). */
export interface TokenLimits {
  max_input_tokens?: number;
  max_output_tokens?: number;
  max_total_tokens?: number;
}

/** The first token budget `usage` has reached, if any. */
export function tokenLimitReached(
  usage: { input_tokens: number; output_tokens: number },
  limits: TokenLimits | undefined,
): keyof TokenLimits | null {
  if (!limits) return null;
  if (limits.max_input_tokens !== undefined && usage.input_tokens >= limits.max_input_tokens) {
    return "max_input_tokens";
  }
  if (limits.max_output_tokens !== undefined && usage.output_tokens >= limits.max_output_tokens) {
    return "max_output_tokens";
  }
  const total = usage.input_tokens + usage.output_tokens;
  if (limits.max_total_tokens !== undefined && total >= limits.max_total_tokens) {
    return "max_total_tokens";
  }
  return null;
}

/** A task's stop condition threw: the task's failure (phase `stop`), never the agent's. */
export class StopHookError extends TaskError {}

/**
 * A stop condition fired before a model call: the rollout ends cleanly (`stop_condition` is
 * the stop's name) and is still finalized and scored. The built-in harnesses end their loop
 * on it; a custom harness may let it propagate.
 */
export class StopFired extends Error {
  constructor(readonly condition: string) {
    super(`Stop condition "${condition}" fired`);
    this.name = "StopFired";
  }
}

/**
 * A harness: runs the agent loop for one rollout. `maxTurns` counts model calls over the
 * whole rollout, across every segment of an interaction.
 */
export interface Harness {
  readonly id: string;
  /** Whether the agent executes code in the sandbox (bash does, null does not). */
  readonly executesCode: boolean;
  /** Whether {@link Harness.resume} continues a finished segment (needed by interactions). */
  readonly supportsResume?: boolean;
  /**
   * Whether the agent runs inside the sandbox and calls the model itself: the rollout then
   * gives the sandbox a route to the model gateway ({@link HarnessContext.gateway}).
   */
  readonly needsGateway?: boolean;
  /**
   * The image the agent's sandbox starts from instead of the task's `image` (its program
   * baked in once for every rollout), asked before the sandbox starts on runtimes whose
   * traits have `imageBuilds`; `image` itself when there is nothing to bake.
   */
  bakeImage?(image: string, options: { signal?: AbortSignal }): Promise<string>;
  /** The first segment: start from the task's prompt and run until the agent answers. */
  run(ctx: HarnessContext): Promise<void>;
  /** A later segment: `messages` (the user's turn) were appended; run until the agent answers. */
  resume?(ctx: HarnessContext, messages: Messages): Promise<void>;
  /**
   * The harness's own metrics, recorded after the task's finalize while the agent's sandbox
   * is still up.
   */
  metrics?(ctx: HarnessContext): Promise<Record<string, number>> | Record<string, number>;
}

const MAX_TOOL_OUTPUT = 16_000;

const BASH_PREAMBLE =
  `You are an autonomous agent working in a Linux sandbox. Use the bash tool to run shell ` +
  `commands and the edit tool to change files. Work step by step; when the task is done, ` +
  `reply with a short summary and no tool calls.`;

const BASH_TOOL: Tool = {
  name: "bash",
  description: "Run a shell command in the sandbox and return its exit code, stdout and stderr.",
  parameters: {
    type: "object",
    properties: { command: { type: "string", description: "The command, run with sh -c" } },
    required: ["command"],
    additionalProperties: false,
  },
};

const EDIT_TOOL: Tool = {
  name: "edit",
  description:
    "Replace exactly one occurrence of old_str with new_str in a file. With an empty old_str, create or overwrite the file with new_str.",
  parameters: {
    type: "object",
    properties: {
      path: { type: "string" },
      old_str: { type: "string" },
      new_str: { type: "string" },
    },
    required: ["path", "old_str", "new_str"],
    additionalProperties: false,
  },
};

function clip(text: string): string {
  return text.length > MAX_TOOL_OUTPUT
    ? `${text.slice(0, MAX_TOOL_OUTPUT / 2)}\n…[${text.length - MAX_TOOL_OUTPUT} chars cut]…\n${
      text.slice(-MAX_TOOL_OUTPUT / 2)
    }`
    : text;
}

/** The conversation a harness starts from. */
export function initialMessages(data: TaskData, preamble?: string): Messages {
  const out: Message[] = [];
  const system = [preamble, data.system_prompt].filter(Boolean).join("\n\n");
  if (system) out.push({ role: "system", content: system });
  if (typeof data.prompt === "string") out.push({ role: "user", content: data.prompt });
  else if (data.prompt) out.push(...structuredClone(data.prompt));
  return out;
}

/**
 * One model call of a harness: sends `ctx.recorder.messages` with `tools`, records the call
 * (timing, usage, retries, its place in the message graph) and returns the response. Custom
 * harnesses use it so their calls land on the trace like the built-ins'. The task's stop
 * conditions are checked first.
 * @throws {StopFired} when a stop condition ends the rollout instead
 */
export async function callModel(
  ctx: HarnessContext,
  turn: number,
  tools: Tool[],
  options: {
    /** Gets the reply piece by piece as the endpoint streams it (see ChatRequestOptions). */
    onDelta?: ChatRequestOptions["onDelta"];
    /** Recorded on the call: what the gateway could not give the model. */
    notHonoured?: { name: string; type: string }[];
  } = {},
): Promise<Response> {
  const limit = tokenLimitReached(ctx.recorder.usage, ctx.tokenLimits);
  if (limit) {
    ctx.recorder.graph?.commitPrompt(ctx.recorder.messages);
    ctx.recorder.stop_condition = limit;
    throw new StopFired(limit);
  }
  for (const s of ctx.stops ?? []) {
    let fired: boolean;
    try {
      fired = await s.fn({
        data: ctx.data,
        messages: ctx.recorder.messages,
        turn,
        usage: ctx.recorder.usage,
        state: ctx.state,
      });
    } catch (error) {
      throw new StopHookError(
        `Stop condition "${s.name}" failed: ${(error as Error).message ?? error}`,
        { cause: error },
      );
    }
    if (fired) {
      ctx.recorder.graph?.commitPrompt(ctx.recorder.messages);
      ctx.recorder.stop_condition = s.name;
      throw new StopFired(s.name);
    }
  }
  const started = Date.now();
  const record: ModelCallRecord = {
    turn,
    started_at: started / 1000,
    duration_ms: 0,
    request_messages: ctx.recorder.messages.length,
    response: null,
  };
  if (options.notHonoured?.length) record.not_honoured = options.notHonoured;
  ctx.recorder.model_calls.push(record);
  noteActivity("model call");
  try {
    const response = await ctx.client.getResponse(ctx.recorder.messages, ctx.model, {
      tools,
      samplingArgs: ctx.samplingArgs,
      signal: ctx.signal,
      ...(ctx.session ? { session: ctx.session } : {}),
      ...(options.onDelta ? { onDelta: options.onDelta } : {}),
    });
    record.response = response;
    noteActivity("model reply");
    if (response.not_honoured?.length) {
      record.not_honoured = [...(record.not_honoured ?? []), ...response.not_honoured];
    }
    if (ctx.recorder.graph) {
      record.node = ctx.recorder.graph.commit(
        ctx.recorder.messages,
        assistantMessage(response),
        response.tokens,
      );
      // The graph keeps the call's tokens once; a copy per call would grow with every turn.
      if (response.tokens) record.response = { ...response, tokens: undefined };
    }
    if (response.usage) {
      ctx.recorder.usage.input_tokens += response.usage.prompt_tokens;
      ctx.recorder.usage.output_tokens += response.usage.completion_tokens;
    }
    return response;
  } catch (error) {
    record.error = String(error);
    const retries = (error as { retries?: number }).retries;
    if (retries) record.retries = retries;
    throw error;
  } finally {
    record.duration_ms = Date.now() - started;
  }
}

/** The assistant message to append for a response (finish details dropped). */
export function assistantMessage(response: Response): Message {
  const { finish_reason: _f, is_truncated: _t, ...msg } = response.message;
  if (!msg.tool_calls) delete msg.tool_calls;
  return { ...msg, role: "assistant" };
}

/** A tool-calling loop: `tools` are executed by `execute`; stops when the model answers without tools. */
async function toolLoop(
  ctx: HarnessContext,
  tools: Tool[],
  execute: (
    call: ToolCall,
    args: Record<string, unknown>,
  ) => Promise<{ output: string; exit_code?: number; error?: string; parts?: ContentPart[] }>,
): Promise<void> {
  for (let turn = ctx.recorder.model_calls.length; turn < ctx.maxTurns; turn++) {
    ctx.signal?.throwIfAborted();
    let response: Response;
    try {
      response = await callModel(ctx, turn, tools);
    } catch (error) {
      if (error instanceof StopFired) return;
      throw error;
    }
    ctx.recorder.messages.push(assistantMessage(response));
    const calls = response.message.tool_calls ?? [];
    if (calls.length === 0) {
      ctx.recorder.stop_condition = "no_tools_called";
      return;
    }
    for (const call of calls) {
      const started = Date.now();
      const rec: ToolCallRecord = {
        id: call.id,
        name: call.name,
        arguments: call.arguments,
        output: "",
        duration_ms: 0,
      };
      let args: Record<string, unknown> | null = null;
      let parts: ContentPart[] | undefined;
      try {
        const parsed = JSON.parse(call.arguments || "{}");
        if (typeof parsed !== "object" || parsed === null || Array.isArray(parsed)) {
          throw new SyntaxError("arguments must be a JSON object");
        }
        args = parsed;
      } catch (error) {
        rec.error = `Invalid arguments: ${(error as Error).message}`;
        rec.output = `Error: ${rec.error}`;
      }
      if (args) {
        try {
          noteActivity(`tool ${call.name}`);
          const result = ctx.toolbox?.has(call.name)
            ? await callToolbox(ctx, call.name, args)
            : await execute(call, args);
          rec.output = clip(result.output);
          parts = result.parts;
          rec.exit_code = result.exit_code;
          if (result.error) rec.error = result.error;
        } catch (error) {
          if (ctx.signal?.aborted) throw error;
          if (error instanceof CommandTimeoutError) {
            rec.error = error.message;
            rec.output = `Error: command timed out after ${ctx.toolTimeoutMs / 1000}s`;
          } else if (error instanceof ToolInputError) {
            rec.error = error.message;
            rec.output = `Error: ${error.message}`;
          } else {
            throw error; // sandbox failures end the rollout as infrastructure errors
          }
        }
      }
      rec.duration_ms = Date.now() - started;
      ctx.recorder.tool_calls.push(rec);
      ctx.recorder.messages.push({
        role: "tool",
        tool_call_id: call.id,
        content: parts ?? rec.output,
      });
    }
  }
  ctx.recorder.stop_condition = "max_turns_reached";
}

/** A tool input the model got wrong; reported back to the model. */
class ToolInputError extends Error {}

/**
 * A toolset tool's call: its result, or its error, goes back to the model; so does a call
 * past its time limit. A server that is gone is infrastructure and ends the rollout.
 */
async function callToolbox(
  ctx: HarnessContext,
  name: string,
  args: Record<string, unknown>,
): Promise<{ output: string; exit_code?: number; error?: string; parts?: ContentPart[] }> {
  try {
    const r = await ctx.toolbox!.call(name, args, {
      signal: ctx.signal,
      sample: rolloutSampler(ctx),
    });
    if (r.isError) return { output: `Error: ${r.text}`, error: r.text };
    return r.parts ? { output: r.text, parts: r.parts } : { output: r.text };
  } catch (error) {
    if (ctx.signal?.aborted) throw error;
    const message = (error as Error).message ?? String(error);
    if (/timed out|timeout/i.test(message)) {
      return { output: `Error: the tool call timed out (${message})`, error: message };
    }
    if (/connection closed|not connected/i.test(message)) {
      throw new InfraError(`Toolset of "${name}" is gone: ${message}`, { cause: error });
    }
    return { output: `Error: ${message}`, error: message };
  }
}

/** The bash harness: `bash` and `edit` tools executed in the agent sandbox. */
export class BashHarness implements Harness {
  readonly id = "bash";
  readonly executesCode = true;
  readonly supportsResume = true;
  readonly edit: boolean;

  constructor(options: { edit?: boolean } = {}) {
    this.edit = options.edit ?? true;
  }

  async run(ctx: HarnessContext): Promise<void> {
    ctx.recorder.messages.push(...initialMessages(ctx.data, BASH_PREAMBLE));
    await this.#loop(ctx);
  }

  async resume(ctx: HarnessContext, messages: Messages): Promise<void> {
    ctx.recorder.messages.push(...structuredClone(messages));
    await this.#loop(ctx);
  }

  async #loop(ctx: HarnessContext): Promise<void> {
    const tools = [
      ...(this.edit ? [BASH_TOOL, EDIT_TOOL] : [BASH_TOOL]),
      ...(ctx.toolbox?.tools ?? []),
    ];
    const cwd = ctx.data.workdir;
    await toolLoop(ctx, tools, async (call, args) => {
      if (call.name === "bash") {
        if (typeof args.command !== "string") {
          throw new ToolInputError('"command" must be a string');
        }
        const r = await ctx.runtime.run(["sh", "-c", args.command], {
          user: ctx.user,
          cwd,
          timeoutMs: ctx.toolTimeoutMs,
          signal: ctx.signal,
        });
        const parts = [`exit code: ${r.exit_code}`];
        if (r.stdout) parts.push(`stdout:\n${r.stdout}`);
        if (r.stderr) parts.push(`stderr:\n${r.stderr}`);
        return { output: parts.join("\n"), exit_code: r.exit_code };
      }
      if (call.name === "edit" && this.edit) {
        const { path, old_str, new_str } = args;
        if (
          typeof path !== "string" || typeof old_str !== "string" || typeof new_str !== "string"
        ) {
          throw new ToolInputError("path, old_str and new_str must be strings");
        }
        let next = new_str;
        if (old_str !== "") {
          // Read as the agent user so the agent cannot edit files it could not read.
          const r = await ctx.runtime.run(["cat", path], { user: ctx.user, cwd });
          if (r.exit_code !== 0) {
            throw new ToolInputError(`cannot read "${path}": ${r.stderr.trim()}`);
          }
          const count = r.stdout.split(old_str).length - 1;
          if (count !== 1) {
            throw new ToolInputError(`old_str occurs ${count} times in "${path}", expected once`);
          }
          next = r.stdout.replace(old_str, new_str);
        }
        const w = await ctx.runtime.run([
          "sh",
          "-c",
          'mkdir -p "$(dirname "$1")" && cat > "$1"',
          "sh",
          path,
        ], {
          user: ctx.user,
          cwd,
          stdin: next,
        });
        if (w.exit_code !== 0) {
          throw new ToolInputError(`cannot write "${path}": ${w.stderr.trim()}`);
        }
        return { output: `edited ${path}` };
      }
      throw new ToolInputError(
        `unknown tool "${call.name}"; available: ${tools.map((t) => t.name).join(", ")}`,
      );
    });
  }
}

/** The null harness: one chat call, no tools. */
export class NullHarness implements Harness {
  readonly id = "null";
  readonly executesCode = false;
  readonly supportsResume = true;

  async run(ctx: HarnessContext): Promise<void> {
    ctx.recorder.messages.push(...initialMessages(ctx.data));
    await this.#answer(ctx);
  }

  async resume(ctx: HarnessContext, messages: Messages): Promise<void> {
    ctx.recorder.messages.push(...structuredClone(messages));
    await this.#answer(ctx);
  }

  async #answer(ctx: HarnessContext): Promise<void> {
    const tools = ctx.toolbox?.tools ?? [];
    if (tools.length) {
      // Only toolset tools: the same loop as bash, with nothing of its own to run.
      await toolLoop(ctx, tools, (call) => {
        throw new ToolInputError(
          `unknown tool "${call.name}"; available: ${tools.map((t) => t.name).join(", ")}`,
        );
      });
      return;
    }
    const turn = ctx.recorder.model_calls.length;
    if (turn >= ctx.maxTurns) {
      ctx.recorder.stop_condition = "max_turns_reached";
      return;
    }
    let response: Response;
    try {
      response = await callModel(ctx, turn, []);
    } catch (error) {
      if (error instanceof StopFired) return;
      throw error;
    }
    ctx.recorder.messages.push(assistantMessage(response));
    ctx.recorder.stop_condition = "no_tools_called";
  }
}

/**
 * A toolset's sampling requests answered through the rollout's model: each is a model call of
 * the rollout, recorded on the trace with the toolset's name under `sampling` (beside the
 * agent's own calls, outside its conversation), its tokens counted in the rollout's usage.
 */
function rolloutSampler(ctx: HarnessContext): Sampler {
  return async (request) => {
    const started = Date.now();
    const record: ModelCallRecord = {
      turn: ctx.recorder.model_calls.length,
      started_at: started / 1000,
      duration_ms: 0,
      request_messages: request.messages.length,
      response: null,
      sampling: request.toolset,
    };
    ctx.recorder.model_calls.push(record);
    const signal = ctx.signal && request.signal
      ? AbortSignal.any([ctx.signal, request.signal])
      : ctx.signal ?? request.signal;
    try {
      const response = await ctx.client.getResponse(request.messages, ctx.model, {
        samplingArgs: {
          ...ctx.samplingArgs,
          max_tokens: request.maxTokens,
          ...(request.temperature !== undefined ? { temperature: request.temperature } : {}),
          ...(request.stopSequences?.length ? { stop: request.stopSequences } : {}),
        },
        signal,
      });
      record.response = response;
      if (response.usage) {
        ctx.recorder.usage.input_tokens += response.usage.prompt_tokens;
        ctx.recorder.usage.output_tokens += response.usage.completion_tokens;
      }
      return {
        text: contentText(response.message.content ?? ""),
        model: response.model || ctx.model,
        stopReason: response.message.finish_reason === "length" ? "maxTokens" : "endTurn",
      };
    } catch (error) {
      record.error = String(error);
      throw error;
    } finally {
      record.duration_ms = Date.now() - started;
    }
  };
}
