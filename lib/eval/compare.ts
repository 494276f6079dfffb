/**
 * Paired comparison of two runs over the examples both scored: per example the mean reward of
 * each run, the mean of the differences, and a percentile bootstrap confidence interval over
 * examples (seeded, so the same runs always give the same interval).
 * @module
 */
import { mulberry32 } from "../random.ts";

/** Scored rewards per example (by a stable key) of one run. */
export type RewardsByExample = Map<string, number[]>;

/** What {@link pairedComparison} finds. */
export interface PairedComparison {
  /** Examples scored in both runs. */
  paired: number;
  /** Examples scored in only one of them (left out). */
  onlyA: number;
  onlyB: number;
  meanA: number;
  meanB: number;
  /** Mean of B − A over paired examples. */
  delta: number;
  /** The bootstrap interval of `delta`. */
  ci: [number, number];
  confidence: number;
  /** Examples where B's mean is above, below or equal to A's. */
  better: number;
  worse: number;
  ties: number;
  /** The per-example differences, largest drop first. */
  perExample: Array<{ example: string; a: number; b: number; delta: number }>;
}

const mean = (xs: number[]) => xs.reduce((s, x) => s + x, 0) / xs.length;

/**
 * Compare run B against run A, paired by example.
 * @throws {RangeError} when no example was scored in both
 */
export function pairedComparison(
  a: RewardsByExample,
  b: RewardsByExample,
  options: { resamples?: number; confidence?: number; seed?: number } = {},
): PairedComparison {
  const confidence = options.confidence ?? 0.95;
  const keys = [...a.keys()].filter((k) => b.has(k)).sort();
  if (keys.length === 0) throw new RangeError("the two runs have no scored example in common");
  const perExample = keys.map((example) => {
    const ma = mean(a.get(example)!);
    const mb = mean(b.get(example)!);
    return { example, a: ma, b: mb, delta: mb - ma };
  });
  const deltas = perExample.map((p) => p.delta);
  const random = mulberry32(options.seed ?? 0);
  const resamples = options.resamples ?? 10_000;
  const means = new Float64Array(resamples);
  for (let r = 0; r < resamples; r++) {
    let sum = 0;
    for (let i = 0; i < deltas.length; i++) sum += deltas[Math.floor(random() * deltas.length)];
    means[r] = sum / deltas.length;
  }
  means.sort();
  const tail = (1 - confidence) / 2;
  const at = (q: number) => means[Math.min(resamples - 1, Math.max(0, Math.floor(q * resamples)))];
  const eps = 1e-12;
  return {
    paired: keys.length,
    onlyA: [...a.keys()].filter((k) => !b.has(k)).length,
    onlyB: [...b.keys()].filter((k) => !a.has(k)).length,
    meanA: mean(perExample.map((p) => p.a)),
    meanB: mean(perExample.map((p) => p.b)),
    delta: mean(deltas),
    ci: [at(tail), at(1 - tail)],
    confidence,
    better: deltas.filter((d) => d > eps).length,
    worse: deltas.filter((d) => d < -eps).length,
    ties: deltas.filter((d) => Math.abs(d) <= eps).length,
    perExample: perExample.sort((x, y) => x.delta - y.delta),
  };
}
