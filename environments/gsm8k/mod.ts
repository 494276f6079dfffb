/**
 * gsm8k: grade-school math word problems, answered in `\boxed{}` and checked for
 * mathematical equivalence. Uses the GSM8K sample bundled with vf (no download).
 * @module
 */
import { BOXED_SYSTEM_PROMPT, loadExampleDataset, MathRubric, SingleTurnEnv } from "../../mod.ts";

/** Defaults `vf eval gsm8k` uses when -n / -r are not given. */
export const evalDefaults = { num_examples: 20, rollouts_per_example: 3 };

/** Build the environment. Args: `num_eval_examples` (default all), `system_prompt`. */
export function loadEnvironment(args: Record<string, unknown> = {}): SingleTurnEnv {
  const n = Number(args.num_eval_examples ?? -1);
  const rubric = new MathRubric();
  return new SingleTurnEnv({
    evalDataset: () =>
      loadExampleDataset("gsm8k-sample", { split: "test", n: n > 0 ? n : undefined }),
    dataset: () => loadExampleDataset("gsm8k-sample", { split: "train" }),
    systemPrompt: typeof args.system_prompt === "string" ? args.system_prompt : BOXED_SYSTEM_PROMPT,
    parser: rubric.parser,
    rubric,
    envId: "gsm8k",
    envArgs: args,
  });
}
