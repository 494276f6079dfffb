/**
 * Replaying a run from its record: a client that answers every model call of a re-run with
 * the reply the original run got at the same place (the example's prompt, the rollout's index
 * in its group, the turn), so `vf replay` re-runs offline with identical rewards, and
 * `vf rescore` re-applies changed rubrics to the saved completions without calling the model.
 * A call the record does not hold fails the rollout as a model error, never a silent 0.
 * @module
 */
import type { Message, Messages, Response, Usage } from "../types.ts";
import { ModelError } from "../errors.ts";
import { type ChatClient, type ChatRequestOptions, toWireMessages } from "../model/client.ts";
import type { RolloutOutput } from "../state.ts";

/** The re-run asked for a reply the record does not have. */
export class ReplayMissError extends ModelError {}

const keyOf = (messages: Messages) => JSON.stringify(toWireMessages(messages));

/**
 * A whole conversation without its tool-call ids: rollouts that share a prompt get the same
 * first reply back whichever saved it, ids and all, so what follows is told apart by content.
 */
function callKeyOf(messages: Messages): string {
  return JSON.stringify(
    toWireMessages(messages),
    (k, v) => k === "id" || k === "tool_call_id" ? undefined : v,
  );
}

/** Answers from a saved run's outputs instead of an endpoint. */
export class ReplayClient implements ChatClient {
  readonly baseUrl = "replay:";
  readonly headersFromState: Record<string, string> = {};
  /** Replies served, and calls the record could not answer. */
  served = 0;
  missed = 0;
  readonly #replies = new Map<string, { replies: Message[]; usage: Array<Usage | null> }>();
  readonly #prefixLengths = new Set<number>();
  /** Usage by the whole conversation a reply answered: rollouts that share a prompt differ. */
  readonly #usageByCall = new Map<string, Usage>();

  /**
   * From saved rollouts: each its prompt, its completion, and its index in its group (by
   * default the order it was saved in among the rollouts of the same prompt), and where the
   * run kept it, each turn's token usage, served with its reply so the re-run counts the
   * tokens the original spent.
   */
  constructor(
    outputs: Array<
      Pick<RolloutOutput, "prompt" | "completion"> & { index?: number; usage?: Array<Usage | null> }
    >,
  ) {
    const seen = new Map<string, number>();
    for (const o of outputs) {
      const prompt = keyOf(o.prompt);
      // The n-th saved rollout of an example was the n-th of its group.
      const index = o.index ?? seen.get(prompt) ?? 0;
      seen.set(prompt, index + 1);
      this.#replies.set(`${prompt}#${index}`, {
        replies: o.completion.filter((m) => m.role === "assistant"),
        usage: o.usage ?? [],
      });
      let turn = 0;
      o.completion.forEach((m, i) => {
        if (m.role !== "assistant") return;
        const usage = o.usage?.[turn++];
        if (usage) {
          this.#usageByCall.set(callKeyOf([...o.prompt, ...o.completion.slice(0, i)]), usage);
        }
      });
      this.#prefixLengths.add(o.prompt.length);
    }
  }

  getResponse(
    prompt: Messages,
    model: string,
    options: ChatRequestOptions = {},
  ): Promise<Response> {
    const salt = options.cacheSalt ?? "0";
    // The longest start of the conversation that was a saved prompt; what follows is the turns.
    const lengths = [...this.#prefixLengths].filter((n) => n <= prompt.length).sort((a, b) =>
      b - a
    );
    for (const n of lengths) {
      const saved = this.#replies.get(`${keyOf(prompt.slice(0, n))}#${salt}`);
      if (!saved) continue;
      const turn = prompt.slice(n).filter((m) => m.role === "assistant").length;
      const reply = saved.replies[turn];
      if (!reply || reply.role !== "assistant") break;
      this.served++;
      const calls = reply.tool_calls?.length ? reply.tool_calls : null;
      return Promise.resolve({
        id: `replay-${this.served}`,
        created: 0,
        model,
        usage: this.#usageByCall.get(callKeyOf(prompt)) ?? saved.usage[turn] ?? null,
        message: {
          role: "assistant",
          content: reply.content ?? null,
          ...(reply.reasoning_content ? { reasoning_content: reply.reasoning_content } : {}),
          tool_calls: calls,
          finish_reason: calls ? "tool_calls" : "stop",
          is_truncated: false,
        },
      });
    }
    this.missed++;
    return Promise.reject(
      new ReplayMissError(
        "The record has no reply for this call (a prompt, rollout or turn the original run did not have)",
      ),
    );
  }
}
