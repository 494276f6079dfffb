/**
 * JudgeRubric: an LLM judge called through the same chat client interface.
 * @module
 */
import type { ChatClient } from "../model/client.ts";
import { responseText } from "../model/client.ts";
import { contentText } from "../messages.ts";
import type { Parser } from "./parser.ts";
import { type RewardFunc, Rubric } from "./rubric.ts";
import { fillTemplate } from "./judges/judge.ts";
import type { State } from "../state.ts";
import type { Messages, SamplingArgs } from "../types.ts";

/**
 * The default judge prompt, asking for a bare "yes" or "no": upstream verifiers' default
 * (`DEFAULT_JUDGE_PROMPT` of its JudgeRubric) word for word, so judge calls compare.
 */
export const DEFAULT_JUDGE_PROMPT =
  `Given a ground truth answer and a response, determine if the response is correct.

Question:
\`\`\`
{question}
\`\`\`

Ground truth answer:
\`\`\`
{answer}
\`\`\`

Response:
\`\`\`
{response}
\`\`\`

Respond either "yes" or "no" only.`;

/** Options of {@link JudgeRubric}. */
export interface JudgeRubricOptions {
  funcs?: RewardFunc[];
  weights?: number[];
  parser?: Parser<unknown>;
  /** The judge endpoint. */
  judgeClient: ChatClient;
  /** Default "gpt-4.1-nano". */
  judgeModel?: string;
  /** Template with `{question}`, `{answer}` and `{response}`. */
  judgePrompt?: string;
  judgeSamplingArgs?: SamplingArgs;
}

/** Arguments of {@link JudgeRubric.judge}. */
export interface JudgeArgs {
  prompt: Messages | string;
  completion: Messages | string;
  answer: string;
  state?: State;
  /** Cancels the judge call; default the state's signal. */
  signal?: AbortSignal;
}

/**
 * A rubric with a `judge` class object: reward functions call
 * `await judge({ prompt, completion, answer, state })` and read the verdict text.
 */
export class JudgeRubric extends Rubric {
  judgeClient: ChatClient;
  judgeModel: string;
  judgePrompt: string;
  judgeSamplingArgs: SamplingArgs;

  constructor(options: JudgeRubricOptions) {
    super({ funcs: options.funcs, weights: options.weights, parser: options.parser });
    this.judgeClient = options.judgeClient;
    this.judgeModel = options.judgeModel ?? "gpt-4.1-nano";
    this.judgePrompt = options.judgePrompt ?? DEFAULT_JUDGE_PROMPT;
    this.judgeSamplingArgs = options.judgeSamplingArgs ?? {};
    this.addClassObject("judge", (args: JudgeArgs) => this.judge(args));
    this.addClassObject("judge_client", this.judgeClient);
    this.addClassObject("judge_model", this.judgeModel);
  }

  /** Ask the judge; verdicts are cached per filled prompt on the state. */
  async judge({ prompt, completion, answer, state, signal }: JudgeArgs): Promise<string> {
    const question = typeof prompt === "string"
      ? prompt
      : contentText(prompt.at(-1)?.content ?? "");
    const response = this.parser.parseAnswer(completion) ?? "";
    const filled = fillTemplate(this.judgePrompt, { question, answer, response });
    const cache = (state?.judge_response ?? {}) as Record<string, string>;
    if (filled in cache) return cache[filled];
    const cut = signal ?? state?.signal;
    let reply;
    try {
      reply = await this.judgeClient.getResponse(
        [{ role: "user", content: filled }],
        this.judgeModel,
        { samplingArgs: this.judgeSamplingArgs, signal: cut },
      );
    } catch (error) {
      // The judge's endpoint failed, not the model judged: the error says so (same class).
      if (error instanceof Error && !cut?.aborted) {
        error.message = `Judge model "${this.judgeModel}" failed: ${error.message}`;
      }
      throw error;
    }
    const verdict = responseText(reply);
    if (state) state.judge_response = { ...cache, [filled]: verdict };
    return verdict;
  }
}
