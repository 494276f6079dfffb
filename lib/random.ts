/**
 * Seeded randomness: the same seed gives the same sequence in every runtime, so shuffles
 * and generated data are reproducible (orders differ from Python's for the same seed).
 * @module
 */

/** mulberry32: a small, fast 32-bit PRNG. Returns a function yielding floats in [0, 1). */
export function mulberry32(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** Folds a safe integer into 32 bits so seeds above 2^32 still differ. */
function foldSeed(seed: number): number {
  const low = seed % 0x1_0000_0000;
  const high = Math.floor(seed / 0x1_0000_0000);
  return (low ^ Math.imul(high, 0x9e3779b1)) >>> 0;
}

/**
 * A shuffled copy of `items` (Fisher–Yates driven by mulberry32).
 * @throws {RangeError} if `seed` is not a non-negative safe integer
 */
export function seededShuffle<T>(items: readonly T[], seed: number): T[] {
  if (!Number.isSafeInteger(seed) || seed < 0) {
    throw new RangeError(`shuffle needs a non-negative integer seed, got ${seed}`);
  }
  const out = [...items];
  const random = mulberry32(foldSeed(seed));
  for (let i = out.length - 1; i > 0; i--) {
    const j = Math.floor(random() * (i + 1));
    [out[i], out[j]] = [out[j], out[i]];
  }
  return out;
}
