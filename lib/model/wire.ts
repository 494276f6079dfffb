/**
 * The chat completions wire format as the model client speaks it: vf's messages and sampling
 * args out, a `chat.completion` body (and vLLM's token data) in.
 * @module
 */
import { ConfigError, EmptyModelResponseError, InvalidModelResponseError } from "../errors.ts";
import { contentText, normalizeToolCall } from "../messages.ts";
import type {
  FinishReason,
  Messages,
  Response,
  ResponseTokens,
  SamplingArgs,
  ToolCall,
  Usage,
} from "../types.ts";

/** How a request asks for token data: not at all, when the endpoint has it, or always. */
export type TokenCapture = "off" | "auto" | "required";

/**
 * The token capture a sampling value asks for: `return_token_ids = true` records token data
 * when the endpoint returns it, `"required"` fails the call when it does not.
 * @throws {ConfigError} for any other value
 */
export function tokenCapture(value: unknown): TokenCapture {
  if (value === undefined || value === null || value === false) return "off";
  if (value === true) return "auto";
  if (value === "required") return "required";
  throw new ConfigError(
    `Sampling "return_token_ids" must be true, false or "required", got ${JSON.stringify(value)}`,
  );
}

/**
 * Read vLLM's token data from a chat completions body: `prompt_token_ids` at the top level,
 * `token_ids` on the choice and `logprobs.content[].logprob` (vLLM ≥ 0.10.2 with
 * `return_token_ids` and `logprobs`). Returns what is wrong instead (`has no "<field>"`) when the
 * data is absent or inconsistent.
 */
export function parseResponseTokens(body: unknown): ResponseTokens | { problem: string } {
  const b = (body ?? {}) as Record<string, unknown>;
  const choice = (Array.isArray(b.choices) ? b.choices[0] : undefined) as
    | Record<string, unknown>
    | undefined;
  const promptIds = b.prompt_token_ids;
  if (!isIntArray(promptIds)) return { problem: 'has no "prompt_token_ids"' };
  const completionIds = choice?.token_ids;
  if (!isIntArray(completionIds)) return { problem: 'has no "choices[0].token_ids"' };
  const content = (choice?.logprobs as { content?: unknown } | null | undefined)?.content;
  if (!Array.isArray(content)) return { problem: 'has no "choices[0].logprobs.content"' };
  const logprobs = content.map((c) => Number((c as { logprob?: unknown } | null)?.logprob));
  if (logprobs.length !== completionIds.length || logprobs.some((l) => Number.isNaN(l))) {
    return {
      problem: `has ${logprobs.length} entries in "choices[0].logprobs.content" for ` +
        `${completionIds.length} token ids`,
    };
  }
  return {
    prompt_ids: promptIds,
    prompt_mask: promptIds.map(() => 0),
    completion_ids: completionIds,
    completion_mask: completionIds.map(() => 1),
    completion_logprobs: logprobs,
  };
}

function isIntArray(value: unknown): value is number[] {
  return Array.isArray(value) && value.every((v) => Number.isInteger(v));
}

/** Convert internal messages to the chat completions wire form. */
export function toWireMessages(messages: Messages): Record<string, unknown>[] {
  return messages.map((m) => {
    switch (m.role) {
      case "assistant": {
        const out: Record<string, unknown> = { role: "assistant", content: m.content ?? null };
        if (m.tool_calls && m.tool_calls.length > 0) {
          out.tool_calls = m.tool_calls.map((c) => ({
            id: c.id,
            type: "function",
            function: { name: c.name, arguments: c.arguments },
          }));
        }
        if (m.reasoning_content) out.reasoning_content = m.reasoning_content;
        return out;
      }
      case "tool":
        return { role: "tool", tool_call_id: m.tool_call_id, content: m.content };
      case "text":
        return { role: "user", content: m.content };
      default:
        // A message of just these two keys, in this order, serialises as its wire form does.
        return isRoleAndContent(m) ? m as unknown as Record<string, unknown> : {
          role: m.role,
          content: m.content,
        };
    }
  });
}

/** Whether a message's own keys are exactly `role` then `content` (plain object, no others). */
function isRoleAndContent(m: object): boolean {
  if (Object.getPrototypeOf(m) !== Object.prototype) return false;
  let n = 0;
  for (const key in m) {
    if (key !== (n === 0 ? "role" : n === 1 ? "content" : "")) return false;
    n++;
  }
  return n === 2;
}

/**
 * The sampling key under which a program behind the model gateway asks for reasoning (its
 * Anthropic `thinking` or `output_config.effort`, as an effort). The client sends it as
 * `reasoning_effort` only to an endpoint configured to take it (`[client] reasoning = true`)
 * and only when the run's sampling sets no `reasoning_effort` of its own; else the response
 * lists it as not honoured. Never sent under this name.
 */
export const PROGRAM_REASONING_EFFORT = "program_reasoning_effort";

/**
 * The output-token cap that fits, read from an endpoint's refusal of `sent`: vLLM's
 * "maximum context length is L tokens and your request has P input tokens" and OpenAI's (and
 * older vLLM's) "maximum context length is L tokens. However, you requested … (P in the
 * messages, …)" give L − P; OpenAI's "supports at most N completion tokens" and the plain
 * "max_tokens must be at most N" / "<= N" give N. Null when the text names no limit, or when
 * none below `sent` is left (the prompt alone fills the context).
 */
export function fittingOutputCap(errorText: string, sent: number): number | null {
  const text = errorText.toLowerCase();
  let fit: number | null = null;
  const context =
    /maximum context length is (\d+) tokens,? and your request has (\d+) input tokens/.exec(text) ??
      /maximum context length is (\d+) tokens\. however, you requested \d+ tokens \((\d+) in the messages/
        .exec(text);
  if (context) fit = Number(context[1]) - Number(context[2]);
  else {
    const most = /supports at most (\d+) completion tokens/.exec(text) ??
      (/max_(?:completion_)?tokens|max_output_tokens/.test(text)
        ? /(?:must be at most|must be less than or equal to|<=)\s*(\d+)/.exec(text)
        : null);
    if (most) fit = Number(most[1]);
  }
  return fit !== null && Number.isInteger(fit) && fit > 0 && fit < sent ? fit : null;
}

/** Normalise sampling args: `max_tokens` → `max_completion_tokens`, nulls dropped. */
export function normalizeSamplingArgs(args: SamplingArgs = {}): SamplingArgs {
  const out: SamplingArgs = {};
  for (const [k, v] of Object.entries(args)) {
    if (v === null || v === undefined) continue;
    if (k === "max_tokens") {
      if (args.max_completion_tokens === undefined) out.max_completion_tokens = v;
      continue;
    }
    if (k === "extra_body" && typeof v === "object") {
      Object.assign(out, v);
      continue;
    }
    out[k] = v;
  }
  return out;
}

/** Parse a chat completions body into a normalised {@link Response}. */
export function parseChatCompletion(body: unknown): Response {
  if (body === null || typeof body !== "object") {
    throw new EmptyModelResponseError("Model returned an empty response");
  }
  const b = body as Record<string, unknown>;
  const choices = b.choices;
  if (!Array.isArray(choices)) {
    throw new EmptyModelResponseError("Model response has no choices");
  }
  if (choices.length !== 1) {
    throw new InvalidModelResponseError(`Model response has ${choices.length} choices, expected 1`);
  }
  const choice = choices[0] as Record<string, unknown>;
  const msg = (choice.message ?? {}) as Record<string, unknown>;
  const content = typeof msg.content === "string" ? msg.content : null;
  const reasoning = [msg.reasoning, msg.reasoning_content, msg.reasoning_details].find((r) =>
    typeof r === "string"
  ) as string | undefined;
  const toolCalls: ToolCall[] = [];
  if (Array.isArray(msg.tool_calls)) {
    for (const raw of msg.tool_calls) {
      try {
        toolCalls.push(normalizeToolCall(raw));
      } catch { /* unparseable tool calls are dropped */ }
    }
  }
  if (!content && toolCalls.length === 0 && !reasoning) {
    throw new EmptyModelResponseError(
      "Model returned a message with no content, no tool calls and no reasoning",
    );
  }
  const fr = choice.finish_reason;
  const finish: FinishReason = fr === "stop" || fr === "length" || fr === "tool_calls" ? fr : null;
  const u = (b.usage ?? null) as Record<string, number> | null;
  let usage: Usage | null = null;
  if (u) {
    const prompt = Number(u.prompt_tokens ?? u.input_tokens ?? 0);
    const completion = Number(u.completion_tokens ?? u.output_tokens ?? 0);
    usage = {
      prompt_tokens: prompt,
      completion_tokens: completion,
      reasoning_tokens: 0,
      total_tokens: Number(u.total_tokens ?? prompt + completion),
    };
  }
  return {
    id: String(b.id ?? ""),
    created: Number(b.created ?? 0),
    model: String(b.model ?? ""),
    usage,
    message: {
      role: "assistant",
      content,
      ...(reasoning ? { reasoning_content: reasoning } : {}),
      tool_calls: toolCalls.length > 0 ? toolCalls : null,
      finish_reason: finish,
      is_truncated: finish === "length",
    },
  };
}

/** Text of the first choice; used by judges. */
export function responseText(response: Response): string {
  return contentText(response.message.content ?? "");
}
