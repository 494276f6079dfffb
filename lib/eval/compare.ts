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

/** Distinct values up to which a draw is placed by counts instead of read from an array. */
const FEW_VALUES = 16;
/** Elements up to which the sorted values are read directly (they fit in the cache). */
const IN_CACHE = 1 << 16;

/**
 * `resamples` means of `xs` resampled with replacement: each draw is `floor(random() * n)`,
 * an index into `xs` sorted ascending. With more than 64k elements and few distinct values (rewards of 0 and 1 give three
 * differences) the index is placed among the values' counts, so nothing of size n is read per
 * draw: a million doubles drawn at random miss the cache on most draws, and the cost per draw
 * grew with the run.
 */
export function bootstrapMeans(
  xs: readonly number[],
  resamples: number,
  random: () => number,
): Float64Array {
  const n = xs.length;
  const means = new Float64Array(resamples);
  const sorted = Float64Array.from(xs).sort();
  // The distinct values and, for each, how many elements are ≤ it (the end of its run).
  const values: number[] = [];
  const ends: number[] = []; // filled as ints: n is far below 2³¹
  for (let i = 0; i < n && values.length <= FEW_VALUES; i++) {
    if (i === 0 || !Object.is(sorted[i], sorted[i - 1])) values.push(sorted[i]), ends.push(i);
    ends[ends.length - 1] = i + 1;
  }
  // Up to 64k doubles stay in the cache, where reading one is as fast as placing a draw.
  if (values.length <= FEW_VALUES && n > IN_CACHE) {
    const last = values.length - 1;
    /** The run a draw's index falls in. */
    const runOf = (at: number) => {
      // The runs ending at or before `at`, without a branch per run (a random draw would
      // mispredict most of them): (at - end) >>> 31 is 1 while at < end.
      let j = last;
      for (let k = 0; k < last; k++) j -= (at - ends[k]) >>> 31;
      return j;
    };
    // A draw u in [b / B, (b + 1) / B) has its index in [b·n / B, (b + 1)·n / B]: where that
    // whole range (one index of margin for rounding) is one run, bucket b names the run, so
    // nearly every draw is one look-up in a table that stays in the cache; the few buckets
    // that straddle two runs (-1) place the index itself.
    const B = 4096;
    const bucket = new Int8Array(B);
    for (let b = 0; b < B; b++) {
      const lo = runOf(Math.floor((b * n) / B));
      const hi = runOf(Math.min(n - 1, Math.ceil(((b + 1) * n) / B)));
      bucket[b] = lo === hi ? lo : -1;
    }
    for (let r = 0; r < resamples; r++) {
      let sum = 0;
      for (let i = 0; i < n; i++) {
        const u = random();
        const j = bucket[(u * B) | 0];
        sum += values[j >= 0 ? j : runOf(Math.floor(u * n))];
      }
      means[r] = sum / n;
    }
    return means;
  }
  for (let r = 0; r < resamples; r++) {
    let sum = 0;
    for (let i = 0; i < n; i++) sum += sorted[Math.floor(random() * n)];
    means[r] = sum / n;
  }
  return means;
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
  const means = bootstrapMeans(deltas, resamples, random);
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
