/**
 * Loading a dataset split from the Hugging Face Hub: list the repo's files, pick the
 * Parquet/JSONL/JSON/CSV files of one config and split, download them and stack them.
 *
 * ```ts
 * import { loadHubDataset } from "./hub.ts";
 *
 * const test = await loadHubDataset("openai/gsm8k", { config: "main", split: "test" });
 * console.log(test.length, test.columnNames); // 1319 ["question", "answer"]
 * ```
 * @module
 */

import { mkdir, readFile } from "node:fs/promises";
import { extname, join } from "node:path";
// deno-lint-ignore no-import-prefix
import { downloadFile, HubApiError, listFiles } from "npm:@huggingface/hub@^2.17.0";
import { Dataset, writeAtomic } from "./dataset.ts";
import { type DatasetFormat, datasetFromBytes, formatFromPath } from "./io.ts";
import { ConfigError } from "../errors.ts";

/** The public Hub. */
export const DEFAULT_HUB_URL = "https://huggingface.co";

/** The branch where the Hub's dataset viewer keeps a Parquet copy of every dataset. */
export const PARQUET_CONVERSION_REVISION = "refs/convert/parquet";

/** Options of {@linkcode loadHubDataset}. */
export interface LoadHubDatasetOptions {
  /**
   * The config (subset), e.g. `"main"` for `openai/gsm8k`. Default: `"default"` (files
   * under `data/` or at the top level) when present, else the only config.
   */
  config?: string;
  /** The split. Default: `"train"` when present, else the only split. */
  split?: string;
  /**
   * A branch, tag or commit. Default: `"main"`, falling back to
   * {@linkcode PARQUET_CONVERSION_REVISION} when `main` holds no data files.
   */
  revision?: string;
  /** The Hub's base URL. Default: {@linkcode DEFAULT_HUB_URL}. */
  hubUrl?: string;
  /** A token (`hf_…`) for gated or private datasets. Default: none. */
  accessToken?: string;
  /** The fetch to use. Default: the global `fetch`. */
  fetch?: typeof fetch;
  /**
   * A directory where downloaded files are kept by content hash, so loading again
   * only lists the repo. Default: no cache.
   */
  cacheDir?: string;
  /** Cancels listing and downloads. */
  signal?: AbortSignal;
}

/** One data file of a repo, with the config and split its path implies. */
interface HubDataFile {
  path: string;
  format: DatasetFormat;
  config: string;
  split: string;
  /** The content hash when the listing gave one (LFS sha256, else the git oid). */
  hash?: string;
}

/** Files that are metadata, not rows, even though their extension matches. */
const IGNORED_FILES = new Set([
  "dataset_info.json",
  "dataset_infos.json",
  "dataset_dict.json",
  "state.json",
]);

/** The split names HF infers from file names, and the words that map to each. */
const SPLIT_KEYWORDS: Record<string, string> = {
  train: "train",
  training: "train",
  validation: "validation",
  valid: "validation",
  val: "validation",
  dev: "validation",
  test: "test",
  testing: "test",
  eval: "test",
  evaluation: "test",
};

/** How many files download at once. */
const DOWNLOAD_CONCURRENCY = 4;

/**
 * Loads one split of a dataset repo on the Hugging Face Hub.
 *
 * Understands the layouts the Hub itself writes: `data/<split>-NNNNN-of-NNNNN.parquet`
 * (config `default`), `<config>/<split>-NNNNN-of-NNNNN.parquet`, the Parquet conversion
 * branch `refs/convert/parquet` (`<config>/<split>/NNNN.parquet`), and plain files such
 * as `train.jsonl` or `data/test.csv` whose names contain a split word. Shards are
 * concatenated in path order; when a split has Parquet files, other formats are
 * ignored. `configs:` declared in a README's YAML header are not read.
 *
 * @param repo the dataset id, `owner/name`
 * @throws {ConfigError} when the Hub cannot be reached, the repo is missing or needs a
 *   token, or the config or split does not exist (the message lists the ones that do)
 */
export async function loadHubDataset(
  repo: string,
  options: LoadHubDatasetOptions = {},
): Promise<Dataset> {
  const name = repo.replace(/^datasets\//, "");
  if (!/^[\w.-]+(\/[\w.-]+)?$/.test(name)) {
    throw new ConfigError(`Invalid Hugging Face dataset id "${repo}"; expected "owner/name"`);
  }
  if (options.accessToken !== undefined && !options.accessToken.startsWith("hf_")) {
    throw new ConfigError('Invalid Hugging Face access token: it must start with "hf_"');
  }
  const hubUrl = (options.hubUrl ?? DEFAULT_HUB_URL).replace(/\/+$/, "");
  const ctx: HubContext = {
    name,
    hubUrl,
    accessToken: options.accessToken,
    fetch: guardedFetch(options.fetch ?? globalThis.fetch, options.signal),
  };
  try {
    let revision = options.revision ?? "main";
    let files = await listDataFiles(ctx, revision);
    if (files.length === 0 && options.revision === undefined) {
      const converted = await listDataFiles(ctx, PARQUET_CONVERSION_REVISION).catch((error) => {
        if (error instanceof HubApiError && error.statusCode === 404) return [];
        throw error;
      });
      if (converted.length > 0) {
        revision = PARQUET_CONVERSION_REVISION;
        files = converted;
      }
    }
    if (files.length === 0) {
      throw new ConfigError(
        `Dataset "${name}" on the Hugging Face Hub has no Parquet, JSONL, JSON or CSV files at revision "${revision}"`,
      );
    }
    const chosen = chooseFiles(name, files, options.config, options.split);
    const parts = await mapLimit(
      chosen,
      DOWNLOAD_CONCURRENCY,
      (file) => fetchPart(ctx, revision, file, options.cacheDir),
    );
    return Dataset.concatenate(parts);
  } catch (error) {
    throw explain(error, ctx);
  }
}

interface HubContext {
  name: string;
  hubUrl: string;
  accessToken?: string;
  fetch: typeof fetch;
}

/** Marks a request that never got an HTTP response. */
class UnreachableError extends Error {}

/** Adds the signal, and tells "no response at all" apart from HTTP errors. */
function guardedFetch(base: typeof fetch, signal: AbortSignal | undefined): typeof fetch {
  return async (input, init) => {
    signal?.throwIfAborted();
    try {
      return await base(input, signal ? { ...init, signal } : init);
    } catch (cause) {
      if (signal?.aborted) throw cause;
      throw new UnreachableError(String(input), { cause });
    }
  };
}

function explain(error: unknown, ctx: HubContext): unknown {
  if (error instanceof ConfigError) return error;
  if (error instanceof UnreachableError) {
    const reason = error.cause instanceof Error ? error.cause.message : String(error.cause);
    return new ConfigError(
      `Cannot reach the Hugging Face Hub at "${ctx.hubUrl}"; check the network or proxy, or set hubUrl to a mirror (${reason})`,
      { cause: error.cause },
    );
  }
  if (error instanceof HubApiError) {
    if (error.statusCode === 401 || error.statusCode === 403) {
      return new ConfigError(
        `Dataset "${ctx.name}" on the Hugging Face Hub at "${ctx.hubUrl}" refused access (HTTP ${error.statusCode}); pass an accessToken for a gated or private dataset`,
        { cause: error },
      );
    }
    if (error.statusCode === 404) {
      return new ConfigError(
        `Dataset "${ctx.name}" was not found on the Hugging Face Hub at "${ctx.hubUrl}"; check the id and revision`,
        { cause: error },
      );
    }
    return new ConfigError(
      `The Hugging Face Hub at "${ctx.hubUrl}" failed for dataset "${ctx.name}" (HTTP ${error.statusCode}): ${error.message}`,
      { cause: error },
    );
  }
  return error;
}

async function listDataFiles(ctx: HubContext, revision: string): Promise<HubDataFile[]> {
  const files: HubDataFile[] = [];
  const entries = listFiles({
    repo: { type: "dataset", name: ctx.name },
    recursive: true,
    // listFiles puts the revision into the path as is; "refs/convert/parquet" must be one segment
    revision: encodeURIComponent(revision),
    hubUrl: ctx.hubUrl,
    accessToken: ctx.accessToken,
    fetch: ctx.fetch,
  });
  for await (const entry of entries) {
    if (entry.type !== "file") continue;
    const file = describeFile(entry.path);
    if (file) files.push({ ...file, hash: entry.lfs?.oid ?? entry.oid });
  }
  return files.sort((a, b) => (a.path < b.path ? -1 : a.path > b.path ? 1 : 0));
}

/** The config and split a data file's path implies, or null for a non-data file. */
function describeFile(path: string): Omit<HubDataFile, "hash"> | null {
  const format = formatFromPath(path);
  const segments = path.split("/");
  const base = segments[segments.length - 1];
  if (!format || IGNORED_FILES.has(base)) return null;
  if (segments.some((s) => s.startsWith(".") || s.startsWith("_"))) return null;
  const top = segments.length === 1 || segments[0] === "data";
  const config = top ? "default" : segments[0];
  const rest = segments.length === 1 ? segments : segments.slice(1);
  const split = rest.length >= 2 ? rest[0] : splitFromName(base);
  return { path, format, config, split };
}

/** `train-00000-of-00002.parquet` → `train`; `dev.jsonl` → `validation`; else `train`. */
function splitFromName(fileName: string): string {
  const stem = fileName.slice(0, fileName.length - extname(fileName).length);
  const sharded = /^(.+?)-\d{5}-of-\d{5}$/.exec(stem);
  if (sharded) return sharded[1];
  for (const token of stem.toLowerCase().split(/[-._ 0-9]+/)) {
    if (Object.hasOwn(SPLIT_KEYWORDS, token)) return SPLIT_KEYWORDS[token];
  }
  return "train";
}

function chooseFiles(
  name: string,
  files: HubDataFile[],
  config: string | undefined,
  split: string | undefined,
): HubDataFile[] {
  const configs = unique(files.map((f) => f.config));
  let chosenConfig: string;
  if (config !== undefined) {
    if (!configs.includes(config)) {
      throw new ConfigError(
        `Dataset "${name}" has no config "${config}"; available configs: ${configs.join(", ")}`,
      );
    }
    chosenConfig = config;
  } else if (configs.includes("default")) {
    chosenConfig = "default";
  } else if (configs.length === 1) {
    chosenConfig = configs[0];
  } else {
    throw new ConfigError(
      `Dataset "${name}" has several configs; pass config, one of: ${configs.join(", ")}`,
    );
  }
  const inConfig = files.filter((f) => f.config === chosenConfig);
  const splits = unique(inConfig.map((f) => f.split));
  let chosenSplit: string;
  if (split !== undefined) {
    const match = [split, `partial-${split}`].find((s) => splits.includes(s));
    if (match === undefined) {
      throw new ConfigError(
        `Dataset "${name}" (config "${chosenConfig}") has no split "${split}"; available splits: ${
          splits.join(", ")
        }`,
      );
    }
    chosenSplit = match;
  } else if (splits.includes("train") || splits.length === 1) {
    chosenSplit = splits.includes("train") ? "train" : splits[0];
  } else {
    throw new ConfigError(
      `Dataset "${name}" (config "${chosenConfig}") has several splits; pass split, one of: ${
        splits.join(", ")
      }`,
    );
  }
  const chosen = inConfig.filter((f) => f.split === chosenSplit);
  const parquet = chosen.filter((f) => f.format === "parquet");
  return parquet.length > 0 ? parquet : chosen;
}

async function fetchPart(
  ctx: HubContext,
  revision: string,
  file: HubDataFile,
  cacheDir: string | undefined,
): Promise<Dataset> {
  const label = `hf://datasets/${ctx.name}@${revision}/${file.path}`;
  const cachePath = cacheDir && file.hash
    ? join(cacheDir, "datasets", ...ctx.name.split("/"), "blobs", file.hash + extname(file.path))
    : undefined;
  let bytes: Uint8Array | undefined;
  if (cachePath) bytes = await readFile(cachePath).catch(() => undefined);
  if (!bytes) {
    const blob = await downloadFile({
      repo: { type: "dataset", name: ctx.name },
      path: file.path,
      revision,
      hubUrl: ctx.hubUrl,
      accessToken: ctx.accessToken,
      fetch: ctx.fetch,
      xet: false, // plain resolve URLs work for every file and need no Xet client
    });
    if (!blob) throw new ConfigError(`${label}: listed by the Hub, but the download found no file`);
    bytes = new Uint8Array(await blob.arrayBuffer());
    if (cachePath) {
      await mkdir(join(cachePath, ".."), { recursive: true });
      await writeAtomic(cachePath, bytes);
    }
  }
  return await datasetFromBytes(bytes, { format: file.format, name: label });
}

function unique(values: string[]): string[] {
  return [...new Set(values)];
}

/** Maps with at most `limit` calls in flight; results keep the input order. */
async function mapLimit<T, R>(
  items: T[],
  limit: number,
  fn: (item: T) => Promise<R>,
): Promise<R[]> {
  const out: R[] = new Array(items.length);
  let next = 0;
  let failed = false;
  const worker = async () => {
    while (!failed && next < items.length) {
      const i = next++;
      try {
        out[i] = await fn(items[i]);
      } catch (error) {
        failed = true;
        throw error;
      }
    }
  };
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, worker));
  return out;
}
