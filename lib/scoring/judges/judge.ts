/**
 * The judge base: a prompt template filled in one pass, one chat call per attempt to the
 * judge's own endpoint, the reply parsed into a verdict, and every reply recorded on the
 * trace (`trace.info.judge`), parsed or not. A reply with no verdict is retried
 * (`max_retries`, default 2) and then fails the scoring, never scoring 0.
 * @module
 */
import { responseText } from "../../model/client.ts";
import type { ChatClient } from "../../model/client.ts";
import { JudgeVerdictError } from "../../errors.ts";
import { renderTranscript } from "../../messages.ts";
import type { Messages, SamplingArgs } from "../../types.ts";

/** One judge reply, as recorded on the trace. */
export interface JudgeRecord {
  /** The judge's name (its reward key). */
  judge: string;
  model: string;
  /** 0 for the first attempt. */
  attempt: number;
  text: string;
  /** The parsed verdict; null when parsing failed (see `error`). */
  parsed: unknown;
  usage: { input_tokens: number; output_tokens: number };
  error?: string;
}

/** What a judge reads and writes of a trace: its conversation, `info` (replies) and metrics. */
export interface JudgedTrace {
  info: Record<string, unknown>;
  messages: Messages;
  /** Where a judge records metrics (the rubric judge's `<judge>/<criterion>`). */
  metrics?: Record<string, number>;
}

/** The judge's own endpoint. */
export interface JudgeEndpoint {
  client: ChatClient;
  model: string;
  samplingArgs?: SamplingArgs;
}

/** Settings every judge takes (`[[env.judges]]` entries, after validation). */
export interface JudgeSettings {
  id: string;
  /** The reward key; default the id. */
  name?: string;
  /** Weight of the judge's reward in the total; default 1. */
  weight?: number;
  /** Retries of a reply without a verdict; default 2. */
  max_retries?: number;
  /** Replaces the judge's template. */
  prompt?: string;
}

/**
 * Fill `{field}` placeholders in one pass: only the names in `fields`; every other brace is
 * left as written, and text that a value brings in is never filled again.
 */
export function fillTemplate(template: string, fields: Record<string, string>): string {
  return template.replace(
    /\{([A-Za-z_][A-Za-z0-9_]*)\}/g,
    (match, name: string) => (Object.hasOwn(fields, name) ? fields[name] : match),
  );
}

/** The text a judge reads of a trace: the last reply, or the whole transcript. */
export function viewOf(trace: JudgedTrace, view: "last_reply" | "full_trace"): string {
  if (view === "full_trace") return renderTranscript(trace.messages);
  const last = [...trace.messages].reverse().find((m) => m.role === "assistant");
  const content = last?.content;
  if (typeof content === "string") return content.trim();
  if (Array.isArray(content)) {
    return content.map((p) => (p as { text?: string }).text ?? "").join("").trim();
  }
  return "";
}

/** A judge class's reward key: `MyCodeJudge` is `my_code`; `judge` when nothing is left. */
function classKey(className: string): string {
  const base = className.replace(/Judge$/, "");
  return base.replace(/(?<!^)(?=[A-Z])/g, "_").toLowerCase() || "judge";
}

/** A judge: subclasses give the template, how a reply parses, and how a trace scores. */
export abstract class Judge<P = unknown> {
  readonly settings: JudgeSettings;
  readonly endpoint: JudgeEndpoint;
  /** The template; `{field}` placeholders are filled by {@link Judge.buildMessages}. */
  readonly template: string;

  constructor(settings: JudgeSettings, endpoint: JudgeEndpoint, template: string) {
    this.settings = settings;
    this.endpoint = endpoint;
    this.template = settings.prompt ?? template;
  }

  /**
   * The reward key: `name`, else the id, else the class name in snake_case without its
   * `Judge` suffix (`CorrectnessJudge` is `correctness`), else `judge`.
   */
  get name(): string {
    return this.settings.name || this.settings.id || classKey(this.constructor.name);
  }

  get weight(): number {
    return this.settings.weight ?? 1;
  }

  /** The judge's prompt as one user message. */
  buildMessages(fields: Record<string, string>): Messages {
    return [{ role: "user", content: fillTemplate(this.template, fields) }];
  }

  /** Read a verdict out of a reply; throw {@link JudgeVerdictError} when there is none. */
  abstract parse(text: string): P;

  /** Score one trace: a number, or several named scores (each weighted by the judge's weight). */
  abstract score(
    data: Record<string, unknown>,
    trace: JudgedTrace,
    signal?: AbortSignal,
  ): Promise<number | Record<string, number>>;

  /**
   * One call to the judge's endpoint, parsed; the reply is recorded on `trace` either way.
   * @throws {JudgeVerdictError} when the reply has no verdict
   */
  async complete(
    messages: Messages,
    options: {
      trace?: JudgedTrace;
      parse?: (text: string) => P;
      samplingArgs?: SamplingArgs;
      attempt?: number;
      signal?: AbortSignal;
    } = {},
  ): Promise<{ text: string; parsed: P }> {
    const { client, model } = this.endpoint;
    const response = await client.getResponse(messages, model, {
      samplingArgs: { ...(this.endpoint.samplingArgs ?? {}), ...(options.samplingArgs ?? {}) },
      signal: options.signal,
    });
    const text = responseText(response);
    const record: JudgeRecord = {
      judge: this.name,
      model,
      attempt: options.attempt ?? 0,
      text,
      parsed: null,
      usage: {
        input_tokens: response.usage?.prompt_tokens ?? 0,
        output_tokens: response.usage?.completion_tokens ?? 0,
      },
    };
    if (options.trace) {
      const list = (options.trace.info.judge ??= []) as JudgeRecord[];
      list.push(record);
    }
    try {
      const parsed = (options.parse ?? ((t) => this.parse(t)))(text);
      record.parsed = parsed as unknown;
      return { text, parsed };
    } catch (error) {
      record.error = error instanceof Error ? error.message : String(error);
      throw error;
    }
  }

  /**
   * Build the prompt from `fields`, call, parse; a reply without a verdict is asked again up
   * to `max_retries` times.
   * @throws {JudgeVerdictError} when no attempt gave a verdict
   */
  async evaluate(
    fields: Record<string, string>,
    options: {
      trace?: JudgedTrace;
      parse?: (text: string) => P;
      samplingArgs?: SamplingArgs;
      signal?: AbortSignal;
    } = {},
  ): Promise<P> {
    const messages = this.buildMessages(fields);
    const retries = this.settings.max_retries ?? 2;
    let last: unknown;
    for (let attempt = 0; attempt <= retries; attempt++) {
      try {
        return (await this.complete(messages, { ...options, attempt })).parsed;
      } catch (error) {
        if (!(error instanceof JudgeVerdictError)) throw error;
        last = error;
      }
    }
    throw new JudgeVerdictError(
      `Judge "${this.name}" gave no verdict in ${retries + 1} attempt${retries ? "s" : ""}: ${
        (last as Error).message
      }`,
      { cause: last },
    );
  }
}

/** Token totals of the judge replies recorded on a trace. */
export function judgeUsage(
  info: Record<string, unknown>,
): { input_tokens: number; output_tokens: number } | null {
  const list = info.judge as JudgeRecord[] | undefined;
  if (!Array.isArray(list) || list.length === 0) return null;
  return list.reduce(
    (a, r) => ({
      input_tokens: a.input_tokens + (r.usage?.input_tokens ?? 0),
      output_tokens: a.output_tokens + (r.usage?.output_tokens ?? 0),
    }),
    { input_tokens: 0, output_tokens: 0 },
  );
}
