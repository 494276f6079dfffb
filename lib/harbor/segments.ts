/**
 * The step sessions of a multi-step Harbor trace: each `[[steps]]` entry is a fresh session of
 * the agent, so `vf export` writes each as its own conversation (as Harbor keeps one trajectory
 * per step), read from `info.harbor.steps[i].messages` (`[from, to)` in the trace's messages).
 * Run files are untrusted: every field is checked.
 * @module
 */

/** One step's session in a trace's messages. */
export interface StepSegment {
  /** 0-based position among the trace's sessions. */
  index: number;
  /** The step's name; null for a session after the last verified step (never verified). */
  name: string | null;
  /** The step's own reward (its verifier's); null when never verified. */
  reward: number | null;
  from: number;
  to: number;
}

function isObj(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

/**
 * The step sessions of a trace whose `info` is `info` and whose messages number `count`: null
 * when it has no step ranges (not a multi-step trace, or one written before they were kept),
 * else every step's range in order and, when messages follow the last one, a session of them
 * with no name. A range out of order or outside the messages is a string saying which.
 */
export function stepSegments(info: unknown, count: number): StepSegment[] | null | string {
  const steps = isObj(info) && isObj(info.harbor) ? info.harbor.steps : undefined;
  if (!Array.isArray(steps) || !steps.length) return null;
  if (!steps.every((s) => isObj(s) && Array.isArray(s.messages))) return null;
  const out: StepSegment[] = [];
  let at = 0;
  for (const [i, s] of (steps as Record<string, unknown>[]).entries()) {
    const where = `info.harbor.steps[${i}]`;
    const [from, to] = s.messages as unknown[];
    if (typeof s.name !== "string") return `${where}.name is not a string`;
    if (typeof s.reward !== "number" || !Number.isFinite(s.reward)) {
      return `${where}.reward is not a number`;
    }
    if (
      !Number.isInteger(from) || !Number.isInteger(to) || from !== at ||
      (to as number) < (from as number) || (to as number) > count
    ) {
      return `${where}.messages ${
        JSON.stringify(s.messages).slice(0, 40)
      } is not [${at}, n] with n up to ${count}`;
    }
    out.push({ index: i, name: s.name, reward: s.reward, from: at, to: to as number });
    at = to as number;
  }
  if (at < count) out.push({ index: out.length, name: null, reward: null, from: at, to: count });
  return out.filter((s) => s.to > s.from);
}
