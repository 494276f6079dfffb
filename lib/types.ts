/**
 * Core data types shared by datasets, environments, rubrics and the model client.
 * Field names of anything that is persisted are snake_case, matching verifiers.
 * @module
 */

/** A multimodal content part. Unknown part types pass through untouched. */
export type ContentPart =
  | { type: "text"; text: string }
  | { type: "image_url"; image_url: { url: string } }
  | { type: "input_audio"; input_audio: { data: string; format: string } }
  | { type: string; [key: string]: unknown };

/** Message content: plain text or a list of parts. */
export type Content = string | ContentPart[];

/** A tool call in the provider-agnostic flattened form; `arguments` is JSON text. */
export interface ToolCall {
  id: string;
  name: string;
  arguments: string;
}

/** A system message. */
export interface SystemMessage {
  role: "system";
  content: Content;
  [extra: string]: unknown;
}

/** A user message. */
export interface UserMessage {
  role: "user";
  content: Content;
  [extra: string]: unknown;
}

/** An assistant message, possibly carrying tool calls and reasoning. */
export interface AssistantMessage {
  role: "assistant";
  content?: Content | null;
  reasoning_content?: string | null;
  tool_calls?: ToolCall[] | null;
  [extra: string]: unknown;
}

/** The result of one tool call. */
export interface ToolMessage {
  role: "tool";
  tool_call_id: string;
  content: Content;
  [extra: string]: unknown;
}

/** A raw completion-style prompt; chat clients send it as a user message. */
export interface TextMessage {
  role: "text";
  content: string;
  [extra: string]: unknown;
}

/** Any chat message. */
export type Message = SystemMessage | UserMessage | AssistantMessage | ToolMessage | TextMessage;

/** A list of chat messages. */
export type Messages = Message[];

/** A JSON Schema object describing tool parameters. */
export type JsonSchema = Record<string, unknown>;

/** A tool definition as shown to the model (provider-agnostic). */
export interface Tool {
  name: string;
  description: string;
  parameters: JsonSchema;
  strict?: boolean | null;
  [extra: string]: unknown;
}

/** Token usage of one response. */
export interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
  reasoning_tokens: number;
  total_tokens: number;
}

/** Why the model stopped. */
export type FinishReason = "stop" | "length" | "tool_calls" | null;

/** The assistant message of a response plus its finish reason. */
export interface ResponseMessage extends AssistantMessage {
  finish_reason: FinishReason;
  is_truncated: boolean;
}

/**
 * The tokens of one model call, as a vLLM endpoint returns them when asked
 * (`return_token_ids` and `logprobs`): the rendered prompt, the sampled completion, one
 * logprob per sampled token, and the loss masks (0 for every prompt token, 1 for every sampled
 * one). Field names match verifiers'.
 */
export interface ResponseTokens {
  prompt_ids: number[];
  prompt_mask: number[];
  completion_ids: number[];
  completion_mask: number[];
  completion_logprobs: number[];
}

/** A model response, normalised across providers. */
export interface Response {
  id: string;
  created: number;
  model: string;
  usage: Usage | null;
  message: ResponseMessage;
  /** Token data, when it was asked for (`return_token_ids`) and the endpoint returned it. */
  tokens?: ResponseTokens | null;
  /** Attempts of this request that failed (429, 5xx, timeout) and were retried; absent for none. */
  retries?: number;
  /**
   * The output-token cap sent in place of the one asked for: clamped to the endpoint's
   * `max_output_tokens`, or lowered to what fits after the endpoint refused it and named its
   * limit (`endpoint_limit`, one retry). Absent when the cap went as asked.
   */
  output_cap?: { requested: number; sent: number; reason: "max_output_tokens" | "endpoint_limit" };
  /** What the request asked that the client did not send (see ModelCallRecord.not_honoured). */
  not_honoured?: { name: string; type: string }[];
}

/** One model turn of a rollout. */
export interface TrajectoryStep {
  prompt: Messages;
  completion: Messages;
  response: Response;
  reward: number | null;
  advantage: number | null;
  is_truncated: boolean;
  trajectory_id: string;
  extras: Record<string, unknown>;
}

/** A plain dataset row. */
export type Row = Record<string, unknown>;

/** One dataset row as handed to a rollout. */
export interface RolloutInput {
  prompt: Messages;
  example_id: number;
  task: string;
  answer?: string;
  info?: Record<string, unknown> | string;
  [extra: string]: unknown;
}

/** Sampling arguments passed through to the chat completions request. */
export type SamplingArgs = Record<string, unknown>;
