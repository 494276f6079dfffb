/**
 * The exit status of a finished run. A run whose every rollout errored failed: it exits 1,
 * never 0 with a reward of 0. When only some errored the run succeeded, unless
 * `max_error_rate` (`--max-error-rate 0.1`) is set and more than that fraction errored.
 * @module
 */

/** Exit 1 with `message` when the errors break the rule; exit 0 otherwise. */
export function runOutcome(
  errors: number,
  total: number,
  maxErrorRate?: number,
): { code: number; message?: string } {
  if (total === 0) return { code: 0 };
  if (errors === total) {
    return {
      code: 1,
      message: `every rollout errored (${errors} of ${total})`,
    };
  }
  if (maxErrorRate !== undefined && errors / total > maxErrorRate) {
    const pct = (100 * errors / total).toFixed(1);
    return {
      code: 1,
      message: `${errors} of ${total} rollouts errored (${pct}%), more than max_error_rate ` +
        `${maxErrorRate}`,
    };
  }
  return { code: 0 };
}
