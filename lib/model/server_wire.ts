/**
 * The scripted model server's wire: a chat completions request as it arrives, and the
 * replies a responder can script for it (a completion, an HTTP error, a raw body, a hang).
 * @module
 */

/** A content part of a message as sent on the wire. */
export interface WireContentPart {
  type: string;
  text?: string;
  [key: string]: unknown;
}

/** A tool call inside an assistant message as sent on the wire. */
export interface WireToolCall {
  id: string;
  type: "function";
  function: { name: string; arguments: string };
}

/** A chat message as sent on the wire (OpenAI chat completions format). */
export interface WireMessage {
  role: string;
  content?: string | WireContentPart[] | null;
  tool_calls?: WireToolCall[] | null;
  tool_call_id?: string;
  [key: string]: unknown;
}

/** A tool definition as sent on the wire. */
export interface WireTool {
  type?: string;
  function?: { name: string; description?: string; parameters?: unknown; [key: string]: unknown };
  [key: string]: unknown;
}

/** The JSON body of a `POST /v1/chat/completions` request. */
export interface ChatCompletionBody {
  model: string;
  messages: WireMessage[];
  tools?: WireTool[];
  stream?: boolean;
  [key: string]: unknown;
}

/** One chat completions request as received by the server. */
export interface ChatRequest {
  /** The parsed JSON body. */
  body: ChatCompletionBody;
  /** The request headers, with lower-case names. */
  headers: Record<string, string>;
  /** When a streamed reply's last byte was handed to the connection (ms since the epoch). */
  finishedAt?: number;
}

/** A normal completion. */
export interface CompletionReply {
  /** The assistant text; defaults to `null` when there are tool calls, else `""`. */
  content?: string | null;
  /** Tool calls; an object `arguments` is sent as JSON text, a string as is (even if invalid). */
  tool_calls?: Array<{ id?: string; name: string; arguments: string | object }>;
  reasoning_content?: string;
  /** Defaults to `"tool_calls"` when tool calls are present, else `"stop"`. */
  finish_reason?: string;
  /** Defaults to ceil(characters / 4) of the prompt's and of the reply's text. */
  usage?: { prompt_tokens: number; completion_tokens: number };
  /** Wait this long before answering. */
  delay_ms?: number;
  /** When the request streams: wait this long before each chunk after the first. */
  chunk_delay_ms?: number;
}

/** An HTTP error. A string `body` is wrapped as `{ error: { message, type, code } }`. */
export interface ErrorReply {
  status: number;
  /** The response body; defaults to an OpenAI-style error naming the status. */
  body?: unknown;
  delay_ms?: number;
  headers?: Record<string, string>;
}

/** This exact body, sent with content-type `application/json` (for malformed JSON tests). */
export interface RawReply {
  raw: string;
  /** Defaults to 200. */
  status?: number;
  delay_ms?: number;
}

/** Never answer, until the client aborts or the server closes. */
export interface HangReply {
  hang: true;
}

/** What a responder returns for one request. */
export type Reply = CompletionReply | ErrorReply | RawReply | HangReply;

/** What a responder learns besides the request. */
export interface ResponderContext {
  /** The 0-based count of requests handed to the responder before this one (its position in
   * {@link ModelServer.requests}). */
  index: number;
}

/** Decides the reply to one chat completions request. */
export type Responder = (
  request: ChatRequest,
  ctx: ResponderContext,
) => Reply | Promise<Reply>;

/** An OpenAI-style error body. */
export function errorBody(message: string, type: string, code: string | null = null) {
  return { error: { message, type, param: null, code } };
}

/** The text of a message's content: the string, or its text parts joined by newlines. */
export function contentText(content: WireMessage["content"] | undefined): string {
  if (typeof content === "string") return content;
  if (!Array.isArray(content)) return "";
  return content
    .filter((part) => typeof part?.text === "string")
    .map((part) => part.text)
    .join("\n");
}
