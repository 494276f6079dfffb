/**
 * A model endpoint in this process, for benchmarks that leave the network out: each call costs
 * the client what any endpoint call does besides the network (the body serialised, one await
 * as for a socket's reply, the canned reply parsed), and answers "The answer is 4.".
 * @module
 */
import { type ChatClient, parseChatCompletion } from "../lib/model/client.ts";
import type { Messages, Response } from "../lib/types.ts";

const CANNED = JSON.stringify({
  id: "c",
  object: "chat.completion",
  created: 0,
  model: "bench",
  choices: [{
    index: 0,
    message: { role: "assistant", content: "The answer is 4." },
    finish_reason: "stop",
  }],
  usage: { prompt_tokens: 12, completion_tokens: 5, total_tokens: 17 },
});

/** One call to the in-process endpoint. */
export async function inProcessCall(prompt: Messages, model: string): Promise<Response> {
  JSON.stringify({ model, messages: prompt });
  await null; // the reply arrives later, as from a socket
  return parseChatCompletion(JSON.parse(CANNED));
}

/** The in-process endpoint as a client `evaluate` calls through. */
export const inProcessModel: ChatClient = {
  baseUrl: "http://in-process/v1",
  headersFromState: {},
  getResponse: (prompt, model) => inProcessCall(prompt, model),
};
