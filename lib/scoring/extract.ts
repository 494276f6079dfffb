/**
 * Answer extraction helpers for math-style datasets and parsers, plus the two
 * system prompts that ask a model for a `\boxed{}` answer.
 * @module
 */

/** The marker that opens a boxed answer. */
const BOXED_OPEN = "\\boxed{";

/** The separator gsm8k puts before its final answer. */
const HASH_MARKER = "####";

/**
 * A system prompt asking the model to reason step by step and to put its final
 * answer inside `\boxed{}`.
 */
export const BOXED_SYSTEM_PROMPT: string =
  "Work through the problem step by step, then write your final answer inside \\boxed{}.";

/**
 * Like {@linkcode BOXED_SYSTEM_PROMPT}, but the reasoning goes inside
 * `<think>...</think>` tags before the boxed answer.
 */
export const THINK_BOXED_SYSTEM_PROMPT: string =
  "Work through the problem step by step inside <think>...</think> tags, " +
  "then write your final answer inside \\boxed{}.";

/**
 * Returns the brace-balanced content of the last `\boxed{...}` in `text`.
 *
 * When there is no `\boxed{`, or its braces never balance, the result is the
 * original text, or `""` when `strict` is set (what answer checkers want, so a
 * missing box never matches by accident).
 *
 * @param text The text to search.
 * @param options `strict` (default `false`): return `""` instead of the text when
 *   nothing can be extracted.
 * @returns The boxed content, the original text, or `""`.
 * @example
 * ```ts
 * extractBoxedAnswer("so \\boxed{\\frac{1}{2}}"); // "\\frac{1}{2}"
 * extractBoxedAnswer("no box", { strict: true }); // ""
 * ```
 */
export function extractBoxedAnswer(text: string, options: { strict?: boolean } = {}): string {
  const fallback = options.strict ? "" : text;
  const open = text.lastIndexOf(BOXED_OPEN);
  if (open === -1) return fallback;
  const start = open + BOXED_OPEN.length;
  let depth = 1;
  for (let i = start; i < text.length; i++) {
    const ch = text[i];
    if (ch === "{") depth++;
    else if (ch === "}" && --depth === 0) return text.slice(start, i);
  }
  return fallback;
}

/**
 * Returns the gsm8k-style answer after `####`: the trimmed text between the first
 * `####` and the next one (or the end). Text without `####` is returned unchanged.
 *
 * @example
 * ```ts
 * extractHashAnswer("48 + 24 = 72\n#### 72"); // "72"
 * ```
 */
export function extractHashAnswer(text: string): string {
  if (!text.includes(HASH_MARKER)) return text;
  return text.split(HASH_MARKER)[1].trim();
}
