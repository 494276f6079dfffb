/**
 * Group advantages: each rollout's reward minus the mean reward of its group (the rollouts of
 * one `example_id`), optionally divided by the group's standard deviation, as GRPO-style
 * trainers use them.
 * @module
 */

/** Options of {@link groupAdvantages}. */
export interface AdvantageOptions {
  /** Divide by the group's (population) standard deviation; default false. */
  normalizeStd?: boolean;
  /** Added to the standard deviation before dividing, so a uniform group gives 0; default 1e-6. */
  epsilon?: number;
}

/**
 * The advantage of each reward in one group. A null reward (a rollout that errored and was
 * never scored) is left out of the mean and the deviation and gets a null advantage.
 *
 * @param rewards the group's rewards, in rollout order
 * @param options.normalizeStd divide by the standard deviation; default false
 * @param options.epsilon added to the deviation before dividing; default 1e-6
 * @returns one advantage per reward
 * @example
 * ```ts
 * groupAdvantages([1, 0, 0, 1]); // [0.5, -0.5, -0.5, 0.5]
 * groupAdvantages([1, 0, null]); // [0.5, -0.5, null]
 * ```
 */
export function groupAdvantages(
  rewards: Array<number | null>,
  options: AdvantageOptions = {},
): Array<number | null> {
  // Loops instead of filter/reduce/map: `generate` calls this once per group, and the three
  // arrays and closures were most of half a KB for a group of one.
  let scored = 0;
  let sum = 0;
  for (const r of rewards) {
    if (r === null) continue;
    scored++;
    sum += r;
  }
  const out = new Array<number | null>(rewards.length);
  if (scored === 0) return out.fill(null);
  const mean = sum / scored;
  let scale = 1;
  if (options.normalizeStd) {
    let squares = 0;
    for (const r of rewards) if (r !== null) squares += (r - mean) ** 2;
    scale = Math.sqrt(squares / scored) + (options.epsilon ?? 1e-6);
  }
  for (let i = 0; i < rewards.length; i++) {
    const r = rewards[i];
    out[i] = r === null ? null : (r - mean) / scale;
  }
  return out;
}
