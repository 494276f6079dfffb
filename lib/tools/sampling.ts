/**
 * A toolset's sampling requests answered through the rollout's model: each is a model call of
 * the rollout, recorded on the trace with the toolset's name under `sampling` (beside the
 * agent's own calls, outside its conversation), its tokens counted in the rollout's usage.
 * @module
 */
import type { HarnessContext, ModelCallRecord } from "../tasks/harness.ts";
import { contentText } from "../messages.ts";
import type { Sampler } from "./toolbox.ts";

/** The sampler of a harness's rollout: its client, model and sampling arguments. */
export function rolloutSampler(ctx: HarnessContext): Sampler {
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
