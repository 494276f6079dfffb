/**
 * The gateway's model routes: the three dialects a program may speak (chat completions,
 * Anthropic Messages, Responses), chosen by the route it posts to, and the relay of one call
 * through the rollout's session, answered whole or streamed in the dialect as the upstream
 * model produces it.
 * @module
 */
import type net from "node:net";
import type { Buffer } from "node:buffer";
import { createHash } from "node:crypto";
import type { Response } from "../types.ts";
import type { ResponseDelta } from "../model/client.ts";
import {
  type ChatCall,
  chatCompletionBody,
  chatStreamWriter,
  errorBody,
  GatewayRefusal,
  parseChatRequest,
  type StreamWriter,
} from "./chat.ts";
import {
  anthropicError,
  messagesBody,
  messagesStreamWriter,
  parseMessagesRequest,
} from "./anthropic.ts";
import { parseResponsesRequest, responsesBody, responsesStreamWriter } from "./responses.ts";
import { EventStream, type Head, parseJson, replyJson } from "./_http.ts";
import type { GatewaySession } from "./session.ts";

/** One wire format a program may speak: chosen by the route it posts to. */
export interface Dialect {
  parse(body: unknown): ChatCall;
  body(responses: Response[], model: string, call: ChatCall): Record<string, unknown>;
  writer(model: string, call: ChatCall): StreamWriter;
  error(message: string, status: number): Record<string, unknown>;
}

const CHAT: Dialect = {
  parse: parseChatRequest,
  body: (rs, model) => chatCompletionBody(rs, model),
  writer: (model, call) => chatStreamWriter(model, call.includeUsage),
  error: errorBody,
};
const ANTHROPIC: Dialect = {
  parse: parseMessagesRequest,
  body: ([r], model) => messagesBody(r, model),
  writer: (model) => messagesStreamWriter(model),
  error: anthropicError,
};
const RESPONSES: Dialect = {
  parse: parseResponsesRequest,
  body: ([r], model, call) => responsesBody(r, model, call.customTools),
  writer: (model, call) => responsesStreamWriter(model, call.customTools),
  error: errorBody,
};
/** The model routes, by path. */
export const DIALECTS: Record<string, Dialect> = {
  "/v1/chat/completions": CHAT,
  "/chat/completions": CHAT,
  "/v1/messages": ANTHROPIC,
  "/v1/responses": RESPONSES,
  "/responses": RESPONSES,
};

/** The dialect errors on `path` are shaped in: Anthropic's under `/v1/messages`, else OpenAI's. */
export function errorDialect(path: string): Dialect {
  return DIALECTS[path] ?? (path.startsWith("/v1/messages") ? ANTHROPIC : CHAT);
}

const warnedTools = new Set<string>();
/** Warn once per process about each thing the gateway cannot give the model. */
function warnNotHonoured(route: string, items: { name: string; type: string }[]): void {
  for (const { name, type } of items) {
    const key = `${type}\0${name}`;
    if (warnedTools.has(key)) continue;
    warnedTools.add(key);
    console.warn(
      type === "context_management"
        ? `vf gateway: "${route}" asks for context_management edit "${name}", which the gateway does not make; recorded on the trace as not_honoured`
        : `vf gateway: the program's tool "${name}" (type "${type}") on "${route}" cannot be offered to the model and is left out; recorded on the trace as not_honoured`,
    );
  }
}

/** Options of {@link relayModelCall}. */
export interface RelayOptions {
  /** The rollout the call belongs to. */
  session: GatewaySession;
  /** The dialect of the route the call was posted to. */
  dialect: Dialect;
  head: Head;
  /** The route's path (without the query). */
  path: string;
  /** The whole request body. */
  body: Buffer;
  /** A stream sends a `: keep-alive` comment after this long without an event. */
  keepAliveMs: number;
}

/** A model call in its dialect: answered whole, or streamed as the upstream model replies. */
export async function relayModelCall(socket: net.Socket, options: RelayOptions): Promise<void> {
  const { session, dialect, head, path, body, keepAliveMs } = options;
  let stream: EventStream | null = null;
  let writer: StreamWriter | null = null;
  try {
    const call = dialect.parse(parseJson(body));
    if (call.notHonoured?.length) warnNotHonoured(path, call.notHonoured);
    const digest = createHash("sha256").update(body).digest("hex");
    const retry = Number(head.headers.get("x-stainless-retry-count") ?? 0) > 0;
    const n = call.n ?? 1;
    writer = call.stream ? dialect.writer(session.model, call) : null;
    if (writer) stream = new EventStream(socket, keepAliveMs);
    const responses: Response[] = [];
    for (let i = 0; i < n; i++) {
      const w = writer;
      const onDelta = w && stream
        ? (delta: ResponseDelta) => stream!.write(w.delta(delta, i))
        : undefined;
      try {
        // Each choice is its own call; only the first carries what was not honoured.
        const one = i === 0 ? call : { ...call, notHonoured: [] };
        responses.push(
          await session.chat(one, n > 1 ? `${digest}:${i}` : digest, retry, onDelta),
        );
      } catch (error) {
        if (error instanceof GatewayRefusal) throw error;
        throw new GatewayRefusal(502, `the model call failed: ${(error as Error).message}`);
      }
    }
    if (writer && stream) return stream.end(writer.finish(responses));
    return replyJson(
      socket,
      200,
      dialect.body(responses, responses[0].model || session.model, call),
    );
  } catch (error) {
    if (!(error instanceof GatewayRefusal)) {
      stream?.stop();
      throw error;
    }
    if (stream?.started && writer) {
      return stream.end(writer.error(error.message, error.status));
    }
    stream?.stop();
    return replyJson(socket, error.status, dialect.error(error.message, error.status));
  }
}
