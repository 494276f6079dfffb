/**
 * Tool-calling environments. Tools carry an explicit JSON Schema or a zod schema; tool
 * errors go back to the model as tool messages unless listed in `stopErrors`.
 * @module
 */
import { z } from "npm:zod@^4.6.0";
import { describeIssues } from "../config.ts";
import { ConfigError, ToolCallError, ToolParseError } from "../errors.ts";
import { MultiTurnEnv, type MultiTurnEnvOptions } from "./multi_turn.ts";
import { Rubric } from "../scoring/rubric.ts";
import type { State } from "../state.ts";
import type { ContentPart, JsonSchema, Messages, Tool, ToolMessage } from "../types.ts";
import { noteActivity } from "../util/activity.ts";

/** What a tool function returns: text, content parts, or anything JSON-serialisable. */
export type ToolResult = unknown;

/** A tool: its definition as the model sees it, plus the function that runs it. */
export interface ToolSpec {
  name: string;
  description: string;
  parameters: JsonSchema;
  // deno-lint-ignore no-explicit-any
  fn: (args: any) => ToolResult | Promise<ToolResult>;
  /** When given (zod tools), arguments are validated before the call. */
  validate?: (args: unknown) => unknown;
}

/** Options of {@link defineTool}. */
export interface DefineToolOptions<A> {
  name: string;
  description?: string;
  /** A JSON Schema object, or a zod object schema (converted and used to validate). */
  parameters: JsonSchema | z.ZodType<A>;
  fn: (args: A) => ToolResult | Promise<ToolResult>;
}

function isZod(value: unknown): value is z.ZodType {
  return typeof value === "object" && value !== null && "_zod" in value;
}

/** Define a tool from a JSON Schema or a zod schema. */
export function defineTool<A = Record<string, unknown>>(options: DefineToolOptions<A>): ToolSpec {
  if (isZod(options.parameters)) {
    const schema = options.parameters;
    const json = z.toJSONSchema(schema) as JsonSchema;
    delete json.$schema;
    return {
      name: options.name,
      description: options.description ?? "",
      parameters: json,
      fn: options.fn,
      validate: (args) => {
        const r = schema.safeParse(args);
        if (!r.success) {
          throw new TypeError(
            `Invalid arguments for "${options.name}": ${describeIssues(r.error)}`,
          );
        }
        return r.data;
      },
    };
  }
  return {
    name: options.name,
    description: options.description ?? "",
    parameters: options.parameters as JsonSchema,
    fn: options.fn as ToolSpec["fn"],
  };
}

/** The definition part of a tool spec. */
export function toolDef(spec: ToolSpec): Tool {
  return { name: spec.name, description: spec.description, parameters: spec.parameters };
}

/** Turn a tool's return value into tool-message content. */
export function toolContent(value: ToolResult): string | ContentPart[] {
  if (typeof value === "string") return value;
  if (
    Array.isArray(value) &&
    value.every((p) =>
      typeof p === "object" && p !== null && (p.type === "text" || p.type === "image_url")
    )
  ) {
    return value as ContentPart[];
  }
  if (value === undefined) return "";
  try {
    return JSON.stringify(value);
  } catch {
    return String(value);
  }
}

/** Options of {@link ToolEnv}. */
export interface ToolEnvOptions extends MultiTurnEnvOptions {
  tools?: ToolSpec[];
  /** How a tool error is shown to the model; default `String(error)`. */
  errorFormatter?: (error: unknown) => string;
  /** Error classes that stop the rollout instead of going back to the model. */
  // deno-lint-ignore no-explicit-any
  stopErrors?: Array<new (...args: any[]) => Error>;
}

/** A multi-turn environment whose model calls tools until it answers in plain text. */
export class ToolEnv extends MultiTurnEnv {
  tools: ToolSpec[] = [];
  toolMap: Map<string, ToolSpec> = new Map();
  errorFormatter: (error: unknown) => string;
  // deno-lint-ignore no-explicit-any
  stopErrors: Array<new (...args: any[]) => Error>;
  #monitor: Rubric;

  constructor(options: ToolEnvOptions = {}) {
    const tools = options.tools ?? [];
    tools.forEach((t, i) => checkToolSpec(t, `tools[${i}]`));
    super({
      maxTurns: 10,
      ...options,
      toolDefs: [...(options.toolDefs ?? []), ...tools.map(toolDef)],
    });
    this.errorFormatter = options.errorFormatter ??
      ((e) => (e instanceof Error ? e.message : String(e)));
    this.stopErrors = options.stopErrors ?? [];
    this.#monitor = new Rubric({ parser: this.parser });
    this.#monitor.addMetric(({ completion }) => countToolCalls(completion), 0, "total_tool_calls");
    this.addRubric(this.#monitor);
    for (const t of tools) this.#register(t);
    this.addStopCondition("no_tools_called", (s) => noToolsCalled(s));
  }

  #register(tool: ToolSpec): void {
    this.tools.push(tool);
    this.toolMap.set(tool.name, tool);
    this.#monitor.addMetric(
      ({ completion }) => countToolCalls(completion, tool.name),
      0,
      `${tool.name}_calls`,
    );
  }

  /** Add a tool (definition, function and its call-count metric). */
  addTool(tool: ToolSpec): void {
    checkToolSpec(tool, "addTool()");
    this.toolDefs.push(toolDef(tool));
    this.#register(tool);
  }

  /** Remove a tool by name. */
  removeTool(name: string): void {
    this.tools = this.tools.filter((t) => t.name !== name);
    this.toolMap.delete(name);
    this.toolDefs = this.toolDefs.filter((t) => t.name !== name);
    this.#monitor.entries = this.#monitor.entries.filter((e) => e.name !== `${name}_calls`);
  }

  /** Call a tool by name; throws for unknown tools and tool failures. */
  async callTool(name: string, args: Record<string, unknown>, _state: State): Promise<ToolResult> {
    const tool = this.toolMap.get(name);
    if (!tool) {
      throw new RangeError(
        `Unknown tool "${name}"; available: ${[...this.toolMap.keys()].join(", ") || "none"}`,
      );
    }
    const checked = tool.validate ? tool.validate(args) : args;
    return await tool.fn(checked);
  }

  /** Hook for StatefulToolEnv: adjust parsed arguments before the call. */
  updateToolArgs(
    _name: string,
    args: Record<string, unknown>,
    _messages: Messages,
    _state: State,
  ): Record<string, unknown> | Promise<Record<string, unknown>> {
    return args;
  }

  #isStopError(error: unknown): boolean {
    return this.stopErrors.some((cls) => error instanceof cls);
  }

  async envResponse(messages: Messages, state: State): Promise<Messages> {
    const last = messages[messages.length - 1];
    if (last?.role !== "assistant" || !last.tool_calls?.length) return [];
    const out: ToolMessage[] = [];
    for (const call of last.tool_calls) {
      let args: Record<string, unknown>;
      try {
        const parsed = JSON.parse(call.arguments || "{}");
        if (typeof parsed !== "object" || parsed === null || Array.isArray(parsed)) {
          throw new SyntaxError(`Tool arguments must be a JSON object, got ${call.arguments}`);
        }
        args = parsed;
      } catch (error) {
        if (this.#isStopError(error)) {
          throw new ToolParseError(`Cannot parse arguments of "${call.name}"`, { cause: error });
        }
        out.push({ role: "tool", tool_call_id: call.id, content: this.errorFormatter(error) });
        continue;
      }
      args = await this.updateToolArgs(call.name, args, messages, state);
      try {
        noteActivity(`tool ${call.name}`);
        const result = await this.callTool(call.name, args, state);
        out.push({ role: "tool", tool_call_id: call.id, content: toolContent(result) });
      } catch (error) {
        if (this.#isStopError(error)) {
          throw new ToolCallError(`Tool "${call.name}" failed`, { cause: error });
        }
        out.push({ role: "tool", tool_call_id: call.id, content: this.errorFormatter(error) });
      }
    }
    return out;
  }
}

/**
 * Refuse what is not a tool spec (OpenAI's `{type: "function", function}` shape, no name,
 * no function) naming where it was given; warn about a tool with no description, which the
 * model cannot read to decide when to call it.
 * @throws {ConfigError} for a spec that cannot be a tool
 */
function checkToolSpec(tool: unknown, where: string): void {
  const t = tool as Record<string, unknown> | null;
  if (typeof t !== "object" || t === null) {
    throw new ConfigError(`${where} must be a tool made by defineTool(), got ${String(t)}`);
  }
  if (t.type === "function" && typeof t.function === "object") {
    throw new ConfigError(
      `${where} uses the OpenAI {type: "function", function: {...}} shape; give ` +
        `defineTool({ name, description, parameters, fn }) instead`,
    );
  }
  if (typeof t.name !== "string" || t.name === "") {
    throw new ConfigError(`${where}.name must be a non-empty string`);
  }
  if (typeof t.fn !== "function") {
    throw new ConfigError(
      `${where} ("${t.name}") has no fn; give the function that runs the tool`,
    );
  }
  if (typeof t.description !== "string" || t.description.trim() === "") {
    console.warn(
      `Tool "${t.name}" has no description; the model sees only its name and parameters ` +
        `(give defineTool a description)`,
    );
  }
}

function noToolsCalled(state: State): boolean {
  if (state.trajectory.length === 0) return false;
  const last = state.trajectory[state.trajectory.length - 1].completion.at(-1);
  return last?.role === "assistant" && !(last.tool_calls && last.tool_calls.length > 0);
}

function countToolCalls(completion: Messages, name?: string): number {
  let n = 0;
  for (const m of completion) {
    if (m.role !== "assistant" || !m.tool_calls) continue;
    n += name ? m.tool_calls.filter((c) => c.name === name).length : m.tool_calls.length;
  }
  return n;
}

/** Remove hidden arguments from a schema (and `$defs` only they used). */
export function pruneSchema(schema: JsonSchema, skip: string[]): JsonSchema {
  const out = structuredClone(schema) as Record<string, unknown>;
  const props = { ...(out.properties as Record<string, Record<string, unknown>> ?? {}) };
  const defs = out.$defs as Record<string, unknown> | undefined;
  const refs: string[] = [];
  for (const name of skip) {
    const ref = props[name]?.$ref;
    delete props[name];
    if (typeof ref === "string") refs.push(ref);
  }
  out.properties = props;
  if (Array.isArray(out.required)) out.required = out.required.filter((r) => !skip.includes(r));
  // A definition is dropped only when nothing left in the schema still refers to it.
  for (const ref of refs) {
    const key = ref.split("/").pop()!;
    if (!defs || !(key in defs)) continue;
    const { [key]: _dropped, ...others } = defs;
    if (!JSON.stringify({ ...out, $defs: others }).includes(JSON.stringify(ref))) delete defs[key];
  }
  if (defs && Object.keys(defs).length === 0) delete out.$defs;
  return out;
}

/** Tools with hidden arguments injected from the rollout state by `updateToolArgs`. */
export abstract class StatefulToolEnv extends ToolEnv {
  skippedArgs: Map<string, string[]> = new Map();

  /** Add a tool whose `argsToSkip` are hidden from the model and filled by `updateToolArgs`. */
  override addTool(tool: ToolSpec, options: { argsToSkip?: string[] } = {}): void {
    const skip = options.argsToSkip ?? [];
    const shown: ToolSpec = { ...tool, parameters: pruneSchema(tool.parameters, skip) };
    // Validation runs on the full arguments, after injection.
    this.skippedArgs.set(tool.name, skip);
    super.addTool(shown);
  }

  abstract override updateToolArgs(
    name: string,
    args: Record<string, unknown>,
    messages: Messages,
    state: State,
  ): Record<string, unknown> | Promise<Record<string, unknown>>;
}
