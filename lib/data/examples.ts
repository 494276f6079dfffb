/**
 * Built-in example datasets that work offline (legacy spec §5.7). The data is bundled
 * as a TypeScript module, so a compiled binary carries it.
 *
 * ```ts
 * import { loadExampleDataset } from "./examples.ts";
 *
 * const ds = loadExampleDataset("gsm8k-sample", { n: 5, seed: 0 });
 * console.log(ds.row(0)); // { question: "…", answer: "18" }
 * ```
 * @module
 */

import { GSM8K_TEST_SAMPLE, GSM8K_TRAIN_SAMPLE } from "./gsm8k_sample.ts";
import { Dataset } from "./dataset.ts";
import { ConfigError } from "../errors.ts";

/** The names {@linkcode loadExampleDataset} knows. */
export const EXAMPLE_DATASET_NAMES = ["gsm8k-sample", "gsm8k"] as const;

/** A name {@linkcode loadExampleDataset} knows. */
export type ExampleDatasetName = (typeof EXAMPLE_DATASET_NAMES)[number];

/** Options of {@linkcode loadExampleDataset}. */
export interface LoadExampleDatasetOptions {
  /** The split. Default: `"test"` (the gsm8k default upstream). */
  split?: "train" | "test";
  /** When above 0, keep this many rows, picked after a shuffle with `seed`. Default: all. */
  n?: number;
  /** The shuffle seed used when `n` is given. Default: `0`. */
  seed?: number;
}

/**
 * Loads a bundled example dataset with exactly the columns `question` and `answer`.
 *
 * - `gsm8k-sample`: the first 50 test rows and the first 20 train rows of GSM8K
 *   (OpenAI, MIT licence); `answer` is the final answer after `####`, as in upstream
 *   `load_example_dataset("gsm8k")`.
 * - `gsm8k`: the same sample. Upstream downloads the full `openai/gsm8k` here; vf
 *   bundles only the sample because the Hub may be unreachable. For the whole set use
 *   `loadHubDataset("openai/gsm8k", { config: "main", split })` and map the answers.
 *
 * When `n > 0` the rows are shuffled with `seed` and the first `n` kept, before the
 * answers are extracted (the order differs from Python's for the same seed).
 *
 * @throws {ConfigError} for an unknown name (listing the known ones) or split
 */
export function loadExampleDataset(
  name: ExampleDatasetName | (string & Record<never, never>),
  options: LoadExampleDatasetOptions = {},
): Dataset {
  if (!(EXAMPLE_DATASET_NAMES as readonly string[]).includes(name)) {
    throw new ConfigError(
      `Unknown example dataset "${name}"; known: ${EXAMPLE_DATASET_NAMES.join(", ")}`,
    );
  }
  const split = options.split ?? "test";
  const rows = split === "test"
    ? GSM8K_TEST_SAMPLE
    : split === "train"
    ? GSM8K_TRAIN_SAMPLE
    : undefined;
  if (rows === undefined) {
    throw new ConfigError(`Example dataset "${name}" has no split "${split}"; splits: train, test`);
  }
  let ds = Dataset.fromList(rows.map((row) => ({ ...row })));
  const n = options.n ?? -1;
  if (n > 0) ds = ds.shuffle(options.seed ?? 0).take(n);
  return ds.map(({ question, answer }) => ({
    question,
    answer: extractHashAnswer(String(answer)),
  }), { removeColumns: ds.columnNames });
}

/** The stripped text between the first `####` and the next (or the end); else the text. */
function extractHashAnswer(text: string): string {
  if (!text.includes("####")) return text;
  return text.split("####")[1].trim();
}
