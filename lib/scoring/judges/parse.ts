/**
 * Reading a verdict out of a judge's reply: one choice from a short list
 * ({@link parseJudgeChoice}), or the first JSON object holding a given key
 * ({@link findJsonObject}).
 * @module
 */
import { extractBoxedAnswer } from "../extract.ts";

function escapeRegExp(s: string): string {
  return s.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
}

/**
 * A verdict marker: at the start of a line, a whole verdict word, an optional `IS`, then `:`
 * or `-` (so "Answering this:" or "Verdicts are..." are not markers).
 */
const MARKER =
  /(?:^|\n)\s*(?:FINAL\s+JUDGMENT|FINAL\s+ANSWER|FINAL\s+VERDICT|JUDGMENT|VERDICT|ANSWER)(?![\p{L}\p{N}_])\s*(?:IS(?![\p{L}\p{N}_])\s*)?[:\-]\s*/u;

function pick(text: string, choices: readonly string[]): string | null {
  // Compare upper-cased; a later choice wins over one that differs only in case.
  const byUpper = new Map<string, string>();
  for (const c of choices) byUpper.set(c.toUpperCase(), c);
  const alternatives = choices.map((c) => escapeRegExp(c.toUpperCase())).join("|");
  const pattern = new RegExp(`(?<![\\p{L}\\p{N}_])(?:${alternatives})(?![\\p{L}\\p{N}_])`, "gu");
  const upper = text.toUpperCase();
  const marker = MARKER.exec(upper);
  if (marker) {
    // Only the first marker counts, and only what follows it.
    pattern.lastIndex = marker.index + marker[0].length;
    const m = pattern.exec(upper);
    return m ? byUpper.get(m[0]) ?? null : null;
  }
  let last: string | null = null;
  for (const m of upper.matchAll(pattern)) last = m[0];
  return last === null ? null : byUpper.get(last) ?? null;
}

/**
 * The choice a judge's reply settles on, or null when it settles on none:
 *
 * 1. an empty reply, or one that opens `<think>` and never closes it, has no verdict;
 * 2. only the text after the last `</think>` counts;
 * 3. when the last `\boxed{...}` holds something, only that is read;
 * 4. a verdict marker at the start of a line (`FINAL JUDGMENT`, `FINAL ANSWER`,
 *    `FINAL VERDICT`, `JUDGMENT`, `VERDICT` or `ANSWER` as a whole word, an optional `IS`,
 *    then `:` or `-`): the first choice after the first marker, or none;
 * 5. without a marker, the last choice in the text.
 *
 * Choices match as whole words (letters, digits and `_` may not touch them), ignoring case,
 * tried in the order given; the choice is returned as spelled in `choices`.
 * @example
 * ```ts
 * parseJudgeChoice("<think>A?</think>\nFinal verdict: b", ["A", "B"]); // "B"
 * parseJudgeChoice("I pick A, not B", ["A", "B"]); // "B"
 * ```
 */
export function parseJudgeChoice(
  text: string | null | undefined,
  choices: readonly string[],
): string | null {
  if (!text || choices.length === 0) return null;
  if (text.includes("<think>") && !text.includes("</think>")) return null;
  const close = text.lastIndexOf("</think>");
  const body = (close >= 0 ? text.slice(close + "</think>".length) : text).trim();
  const boxed = extractBoxedAnswer(body, { strict: true }).trim();
  return pick(boxed || body, choices);
}

/**
 * The first balanced JSON object in `text` that parses and has `key`, or null. Strings
 * (with escapes) are skipped while balancing braces, so braces inside them do not count.
 */
export function findJsonObject(text: string, key: string): Record<string, unknown> | null {
  // Every opening brace is tried in turn: an echoed format example that is not JSON, or an
  // object without `key`, is passed over (an object nested inside it may still match).
  for (let start = text.indexOf("{"); start >= 0; start = text.indexOf("{", start + 1)) {
    let depth = 0;
    let inString = false;
    for (let i = start; i < text.length; i++) {
      const ch = text[i];
      if (inString) {
        if (ch === "\\") i++;
        else if (ch === '"') inString = false;
        continue;
      }
      if (ch === '"') inString = true;
      else if (ch === "{") depth++;
      else if (ch === "}" && --depth === 0) {
        try {
          const value = JSON.parse(text.slice(start, i + 1));
          if (value && typeof value === "object" && !Array.isArray(value) && key in value) {
            return value;
          }
        } catch {
          // not JSON: try the next opening brace
        }
        break;
      }
    }
  }
  return null;
}
