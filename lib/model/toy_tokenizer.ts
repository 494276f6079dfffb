/**
 * The model server's toy byte-level tokenizer: every token is one UTF-8 byte but for a few
 * special ones, and its chat template keeps every earlier turn's tokens as an exact prefix of
 * the next prompt, as a real one does.
 * @module
 */
import { type ChatCompletionBody, contentText, type WireMessage } from "./server_wire.ts";

/** Special tokens of the toy tokenizer; every other token is one UTF-8 byte (0–255). */
export const TOY_TOKENS = {
  system: 256,
  user: 257,
  assistant: 258,
  tool: 259,
  end: 260,
  tools: 261,
} as const;

const encoder = new TextEncoder();

/** What the toy chat template renders of a message: its text, then each tool call. */
function templateBody(message: WireMessage): string {
  let text = contentText(message.content);
  for (const call of message.tool_calls ?? []) {
    text += `<tool_call>${call.function?.name ?? ""} ${call.function?.arguments ?? ""}</tool_call>`;
  }
  return text;
}

/** The toy tokenizer's ids of a message as it stands in a prompt (role, body, end). */
export function messageTokens(message: WireMessage): number[] {
  const role = TOY_TOKENS[message.role as "system" | "user" | "assistant" | "tool"] ??
    TOY_TOKENS.user;
  return [role, ...encoder.encode(templateBody(message)), TOY_TOKENS.end];
}

/**
 * The prompt's token ids under the toy chat template: the tool names (when tools are given),
 * each message, then the generation prompt (the assistant role token). The completion of a
 * reply is its body and the end token, so prompt + completion is a prefix of the next prompt.
 */
export function toyPromptTokens(body: ChatCompletionBody): number[] {
  const out: number[] = [];
  const tools = (body.tools ?? []).map((t) => t.function?.name ?? "");
  if (tools.length > 0) out.push(TOY_TOKENS.tools, ...encoder.encode(tools.join(",")));
  for (const m of body.messages) out.push(...messageTokens(m));
  out.push(TOY_TOKENS.assistant);
  return out;
}

/** A deterministic logprob for the token `id` at completion position `i`, in (-1, 0). */
export function toyLogprob(id: number, i: number): number {
  return -(((id * 31 + i * 7) % 97) + 1) / 100;
}
