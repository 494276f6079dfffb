/**
 * MathRubric: symbolic/numeric answer equivalence, bounded by a timeout.
 * @module
 */
import { extractBoxedAnswer } from "./extract.ts";
import { closeMathWorkers, verifyMath } from "./math_verify.ts";
import { MaybeThinkParser, type Parser } from "./parser.ts";
import { type RewardFunc, Rubric } from "./rubric.ts";

/** Options of {@link MathRubric}. */
export interface MathRubricOptions {
  /** Extra reward functions after `correct_answer`. */
  funcs?: RewardFunc[];
  weights?: number[];
  /** Default: MaybeThinkParser extracting the last `\boxed{}` strictly. */
  parser?: Parser<unknown>;
  /** Per-answer verification timeout in seconds; default 5. */
  timeoutSeconds?: number;
  /** Longer answers score 0 without verification; default 50 000. */
  maxVerifyChars?: number;
}

/** Scores 1.0 when the parsed answer is mathematically equivalent to the reference. */
export class MathRubric extends Rubric {
  constructor(options: MathRubricOptions = {}) {
    super({
      funcs: options.funcs,
      weights: options.weights,
      parser: options.parser ?? new MaybeThinkParser({
        extractFn: (t: string) => extractBoxedAnswer(t, { strict: true }),
      }),
    });
    const timeoutMs = (options.timeoutSeconds ?? 5) * 1000;
    const maxChars = options.maxVerifyChars ?? 50_000;
    const correctAnswer: RewardFunc = async ({ completion, answer, parser }) => {
      const response = parser.parseAnswer(completion) ?? "";
      if (!response) return 0;
      return (await verifyMath(answer, response, { timeoutMs, maxChars })) ? 1 : 0;
    };
    this.entries.unshift({ name: "correct_answer", weight: 1, fn: correctAnswer, group: false });
    this.addTeardown(() => closeMathWorkers(), { name: "close_math_workers" });
  }
}
