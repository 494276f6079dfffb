/**
 * An in-memory, immutable table of rows: the small part of Hugging Face `datasets`
 * that environments need (legacy spec §5.9). Every operation returns a new Dataset.
 *
 * ```ts
 * import { Dataset } from "./dataset.ts";
 *
 * const ds = Dataset.fromList([
 *   { question: "What is 2+2?", answer: "4" },
 *   { question: "What is 3*5?", answer: "15" },
 * ]);
 * const prompts = ds.map(({ question }) => ({ prompt: [{ role: "user", content: question }] }));
 * console.log(prompts.columnNames); // ["question", "answer", "prompt"]
 * ```
 * @module
 */

import { mkdir, readFile, rename, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { ConfigError } from "../errors.ts";
import { copyPlain } from "../util/_plain.ts";
import { seededShuffle } from "../random.ts";
import type { Row } from "../types.ts";

/** What a map function may return: columns to merge over the row, or nothing to keep it. */
export type MapResult = Row | void | null | undefined;

/** Options of {@linkcode Dataset.map}. */
export interface MapOptions {
  /**
   * Accepted for parity with HF `num_proc`; a synchronous map runs in this process
   * either way. {@linkcode Dataset.mapAsync} uses it as its concurrency.
   */
  numProc?: number;
  /**
   * Columns dropped from each input row before the function's output is merged in,
   * so an output column of the same name is kept (HF semantics). Default: none.
   */
  removeColumns?: string[];
  /** Only unbatched mapping is supported. Default: `false`. */
  batched?: false;
}

/** Options of {@linkcode Dataset.mapAsync}. */
export interface MapAsyncOptions extends MapOptions {
  /** Cancels the map: no further rows start and the promise rejects. */
  signal?: AbortSignal;
}

/** The version written to `dataset_info.json` by {@linkcode Dataset.save}. */
export const DATASET_FORMAT_VERSION = 1;

/** The file names of a saved dataset directory. */
export const DATASET_DATA_FILE = "data.jsonl";
let rowsOf: (ds: Dataset) => readonly Row[];
let originOf: (ds: Dataset) => Origin | null;
let withOrigin: (ds: Dataset, origin: Origin | null) => Dataset;

/**
 * Where a dataset's rows came from, so an error can name a bad row's file and its place
 * there even after the rows were shuffled, selected or concatenated.
 */
interface Origin {
  /** The sources: file paths or URLs. */
  readonly labels: readonly string[];
  /** Per row, its source in `labels` (-1: none known); null when every row has the first. */
  readonly source: Int32Array | null;
  /** Per row, its index in its source; null when that is the row's own index. */
  readonly index: Int32Array | null;
}

/** The origin of the rows `picked` (indices into the rows `origin` describes). */
function pickOrigin(origin: Origin | null, picked: readonly number[]): Origin | null {
  if (!origin) return null;
  const { source, index } = origin;
  return {
    labels: origin.labels,
    source: source && Int32Array.from(picked, (i) => source[i]),
    index: Int32Array.from(picked, (i) => (index ? index[i] : i)),
  };
}

/**
 * The dataset's rows labelled as coming from `source` (a file path or URL), row `i` being
 * row `i` there; errors about a row then name it as `<source>: row <i>`.
 */
export function withSource(ds: Dataset, source: string): Dataset {
  return withOrigin(ds, { labels: [source], source: null, index: null });
}

/** Where a row came from: its file (or URL) and its index there, counting from 0. */
export interface RowOrigin {
  source: string;
  row: number;
}

/** Where row `i` of `ds` came from, or null when its rows were built in memory. */
export function rowOrigin(ds: Dataset, i: number): RowOrigin | null {
  const origin = originOf(ds);
  if (!origin) return null;
  const s = origin.source ? origin.source[i] : 0;
  if (s === undefined || s < 0) return null;
  return { source: origin.labels[s], row: origin.index ? origin.index[i] : i };
}

/**
 * The dataset's own rows, not copies, for the library's read-only passes over a large
 * dataset (`generate` hands them to environments, whose `initState` copies each one).
 * Callers must not change them.
 */
export function sharedRows(ds: Dataset): readonly Row[] {
  return rowsOf(ds);
}

/** The metadata file of a saved dataset directory. */
export const DATASET_INFO_FILE = "dataset_info.json";

/**
 * An immutable table of plain-object rows. Every row has every column; a row that
 * lacks one gets `null`. Rows handed out (by `toList`, `row`, iteration, `col` and to
 * `map`/`filter` callbacks) are deep copies, so callers may mutate them freely.
 */
export class Dataset implements Iterable<Row> {
  readonly #rows: readonly Row[];
  readonly #columns: readonly string[];
  readonly #origin: Origin | null;

  static {
    rowsOf = (ds) => ds.#rows;
    originOf = (ds) => ds.#origin;
    withOrigin = (ds, origin) => new Dataset(ds.#rows, ds.#columns, origin);
  }

  private constructor(
    rows: readonly Row[],
    columns: readonly string[],
    origin: Origin | null = null,
  ) {
    this.#rows = rows;
    this.#columns = columns;
    this.#origin = origin;
  }

  /**
   * Builds a dataset from rows. Columns are the union of the rows' keys in first-seen
   * order; missing values become `null`. The rows are copied.
   * @throws {TypeError} if a row is not a plain object
   */
  static fromList(rows: Iterable<Row>): Dataset {
    const list = [...rows];
    list.forEach((row, i) => assertRow(row, `row ${i}`));
    return Dataset.#normalised(list.map((row) => ({ ...row })));
  }

  /**
   * Builds a dataset from columns of equal length (HF `from_dict`).
   * @throws {RangeError} if the columns differ in length
   */
  static fromDict(columns: Record<string, readonly unknown[]>): Dataset {
    const names = Object.keys(columns);
    const length = names.length === 0 ? 0 : columns[names[0]].length;
    for (const name of names) {
      if (!Array.isArray(columns[name])) {
        throw new TypeError(`Column "${name}" is not an array`);
      }
      if (columns[name].length !== length) {
        throw new RangeError(
          `Column "${name}" has ${columns[name].length} values, column "${names[0]}" has ${length}`,
        );
      }
    }
    const rows: Row[] = Array.from({ length }, (_, i) => {
      const row: Row = {};
      for (const name of names) row[name] = columns[name][i];
      return row;
    });
    return new Dataset(rows, names);
  }

  /**
   * Stacks datasets row-wise. Columns are the union in first-seen order; a row from a
   * dataset that lacks a column gets `null`.
   */
  static concatenate(datasets: readonly Dataset[]): Dataset {
    const columns = unionColumns(datasets.map((ds) => ds.#columns));
    const rows = datasets.flatMap((ds) => ds.#rows);
    return Dataset.#fromOwnedRows(
      rows,
      columns,
      concatOrigins(datasets.map((ds) => ds.#origin), datasets.map((ds) => ds.#rows.length)),
    );
  }

  /**
   * Loads a directory written by {@linkcode Dataset.save}.
   * @throws {ConfigError} if the directory is missing, malformed or inconsistent
   */
  static async load(dir: string): Promise<Dataset> {
    const infoPath = join(dir, DATASET_INFO_FILE);
    const dataPath = join(dir, DATASET_DATA_FILE);
    let infoText: string;
    try {
      infoText = await readFile(infoPath, "utf8");
    } catch (cause) {
      throw new ConfigError(`Cannot read saved dataset "${dir}": "${infoPath}" is missing`, {
        cause,
      });
    }
    let info: unknown;
    try {
      info = JSON.parse(infoText);
    } catch (cause) {
      throw new ConfigError(`${infoPath}: invalid JSON: ${(cause as Error).message}`, { cause });
    }
    if (!isPlainObject(info) || typeof info.format_version !== "number") {
      throw new ConfigError(`${infoPath}: format_version: expected a number`);
    }
    if (info.format_version > DATASET_FORMAT_VERSION) {
      throw new ConfigError(
        `${infoPath}: format_version: ${info.format_version} is newer than this vf understands (${DATASET_FORMAT_VERSION}); upgrade vf`,
      );
    }
    const columns = info.columns;
    if (!Array.isArray(columns) || !columns.every((c) => typeof c === "string")) {
      throw new ConfigError(`${infoPath}: columns: expected a list of strings`);
    }
    let dataText: string;
    try {
      dataText = await readFile(dataPath, "utf8");
    } catch (cause) {
      throw new ConfigError(`Cannot read saved dataset "${dir}": "${dataPath}" is missing`, {
        cause,
      });
    }
    const rows = parseJsonl(dataText, dataPath);
    if (typeof info.num_rows === "number" && info.num_rows !== rows.length) {
      throw new ConfigError(
        `${dataPath}: has ${rows.length} rows, but ${DATASET_INFO_FILE} says num_rows is ${info.num_rows}`,
      );
    }
    return Dataset.#fromOwnedRows(
      rows,
      unionColumns([columns, ...rows.map(Object.keys)]),
      { labels: [dataPath], source: null, index: null },
    );
  }

  static #normalised(rows: Row[]): Dataset {
    return Dataset.#fromOwnedRows(rows, unionColumns(rows.map(Object.keys)));
  }

  /** Wraps rows this class owns, filling missing columns (in column order) where needed. */
  static #fromOwnedRows(
    rows: readonly Row[],
    columns: readonly string[],
    origin: Origin | null = null,
  ): Dataset {
    const out = rows.map((row) => (hasColumnsInOrder(row, columns) ? row : reorder(row, columns)));
    return new Dataset(out, columns, origin);
  }

  /** The number of rows. */
  get length(): number {
    return this.#rows.length;
  }

  /** The column names, in first-seen order. */
  get columnNames(): string[] {
    return [...this.#columns];
  }

  /** Copies of all rows. */
  toList(): Row[] {
    return this.#rows.map(cloneRow);
  }

  /**
   * The values of one column, in row order.
   * @throws {RangeError} if there is no such column
   */
  col(name: string): unknown[] {
    this.#assertColumns([name]);
    return this.#rows.map((row) => cloneValue(row[name]));
  }

  /**
   * A copy of row `index`.
   * @throws {RangeError} if `index` is out of range
   */
  row(index: number): Row {
    this.#assertIndex(index);
    return cloneRow(this.#rows[index]);
  }

  /** Iterates over copies of the rows. */
  *[Symbol.iterator](): Iterator<Row> {
    for (const row of this.#rows) yield cloneRow(row);
  }

  /**
   * Applies `fn` to every row and merges the object it returns over the row (HF
   * semantics: returned columns are added or replace existing ones; returning nothing
   * keeps the row). For an async `fn` use {@linkcode Dataset.mapAsync}.
   * @throws {TypeError} if `fn` returns a promise or a non-object
   */
  map(fn: (row: Row, index: number) => MapResult, options: MapOptions = {}): Dataset {
    const remove = this.#removals(options);
    const out = this.#rows.map((row, i) => {
      const result = fn(cloneRow(row), i);
      if (isPromiseLike(result)) {
        throw new TypeError("Dataset.map() got a promise from its function; use mapAsync()");
      }
      return mergeResult(row, result, remove, i);
    });
    return this.#mapped(out, remove);
  }

  /**
   * Like {@linkcode Dataset.map} for a function that may be async; up to
   * `options.numProc` calls (default 1) run at once. Rows keep their order. There are
   * no processes: `numProc` is a concurrency hint for I/O-bound functions.
   */
  async mapAsync(
    fn: (row: Row, index: number) => MapResult | Promise<MapResult>,
    options: MapAsyncOptions = {},
  ): Promise<Dataset> {
    const remove = this.#removals(options);
    const concurrency = Math.max(1, Math.floor(options.numProc ?? 1));
    const out: Row[] = new Array(this.#rows.length);
    let next = 0;
    let failed = false;
    const worker = async () => {
      while (!failed && next < this.#rows.length) {
        const i = next++;
        try {
          options.signal?.throwIfAborted();
          out[i] = mergeResult(this.#rows[i], await fn(cloneRow(this.#rows[i]), i), remove, i);
        } catch (error) {
          failed = true; // the first failure rejects; the other workers stop taking rows
          throw error;
        }
      }
    };
    await Promise.all(Array.from({ length: Math.min(concurrency, this.#rows.length) }, worker));
    return this.#mapped(out, remove);
  }

  /** Keeps the rows for which `fn` returns a truthy value. */
  filter(fn: (row: Row, index: number) => unknown): Dataset {
    const kept: number[] = [];
    this.#rows.forEach((row, i) => {
      if (fn(cloneRow(row), i)) kept.push(i);
    });
    return this.#picked(kept);
  }

  /**
   * The rows at `indices`, in that order (repeats allowed).
   * @throws {RangeError} if an index is out of range
   */
  select(indices: Iterable<number>): Dataset {
    const picked: number[] = [];
    for (const i of indices) {
      this.#assertIndex(i);
      picked.push(i);
    }
    return this.#picked(picked);
  }

  /**
   * The first `min(n, length)` rows.
   * @throws {RangeError} if `n` is negative or not an integer
   */
  take(n: number): Dataset {
    if (!Number.isInteger(n) || n < 0) {
      throw new RangeError(`take() needs a non-negative integer, got ${n}`);
    }
    return this.#picked(Array.from({ length: Math.min(n, this.#rows.length) }, (_, i) => i));
  }

  /**
   * A deterministic permutation of the rows for `seed` (a Fisher–Yates shuffle driven
   * by a mulberry32 generator). The same seed always gives the same order here, but
   * the order differs from HF `datasets`/numpy for the same seed.
   * @throws {RangeError} if `seed` is not a non-negative integer
   */
  shuffle(seed: number): Dataset {
    if (!Number.isSafeInteger(seed) || seed < 0) {
      throw new RangeError(`shuffle() needs a non-negative integer seed, got ${seed}`);
    }
    const order = seededShuffle(Array.from({ length: this.#rows.length }, (_, i) => i), seed);
    return this.#picked(order);
  }

  /**
   * The whole dataset `n` times over: `[a, b]` becomes `[a, b, a, b]` for `n = 2`.
   * @throws {RangeError} if `n` is negative or not an integer
   */
  repeat(n: number): Dataset {
    if (!Number.isInteger(n) || n < 0) {
      throw new RangeError(`repeat() needs a non-negative integer, got ${n}`);
    }
    const picked: number[] = [];
    for (let k = 0; k < n; k++) for (let i = 0; i < this.#rows.length; i++) picked.push(i);
    return this.#picked(picked);
  }

  /**
   * Adds a column with one value per row.
   * @throws {RangeError} if the column exists or `values` has the wrong length
   */
  addColumn(name: string, values: readonly unknown[]): Dataset {
    if (this.#columns.includes(name)) {
      throw new RangeError(`Column "${name}" already exists`);
    }
    if (values.length !== this.#rows.length) {
      throw new RangeError(
        `Column "${name}" has ${values.length} values, but the dataset has ${this.#rows.length} rows`,
      );
    }
    const rows = this.#rows.map((row, i) => ({ ...row, [name]: values[i] }));
    return new Dataset(rows, [...this.#columns, name], this.#origin);
  }

  /**
   * Renames one column, keeping its position.
   * @throws {RangeError} if `from` is missing or `to` exists
   */
  renameColumn(from: string, to: string): Dataset {
    return this.renameColumns({ [from]: to });
  }

  /**
   * Renames several columns at once, keeping their positions.
   * @throws {RangeError} if a source is missing or a target collides with another column
   */
  renameColumns(mapping: Record<string, string>): Dataset {
    this.#assertColumns(Object.keys(mapping));
    const columns = this.#columns.map((c) => Object.hasOwn(mapping, c) ? mapping[c] : c);
    const seen = new Set<string>();
    for (const c of columns) {
      if (seen.has(c)) throw new RangeError(`Renaming would create two columns named "${c}"`);
      seen.add(c);
    }
    const rows = this.#rows.map((row) => {
      const out: Row = {};
      this.#columns.forEach((c, k) => (out[columns[k]] = row[c]));
      return out;
    });
    return new Dataset(rows, columns, this.#origin);
  }

  /**
   * Drops columns.
   * @throws {RangeError} if a column is missing
   */
  removeColumns(names: string | readonly string[]): Dataset {
    const drop = new Set(typeof names === "string" ? [names] : names);
    this.#assertColumns([...drop]);
    const columns = this.#columns.filter((c) => !drop.has(c));
    const rows = this.#rows.map((row) => {
      const out: Row = {};
      for (const c of columns) out[c] = row[c];
      return out;
    });
    return new Dataset(rows, columns, this.#origin);
  }

  /**
   * Writes the dataset to `dir` (created if needed) as `data.jsonl` plus
   * `dataset_info.json` (`{format_version, num_rows, columns}`). Values that JSON
   * cannot hold are converted: bigint to number (or string when unsafe), Uint8Array
   * to a list of bytes, Date to its ISO string.
   */
  async save(dir: string): Promise<void> {
    await mkdir(dir, { recursive: true });
    const info = {
      format_version: DATASET_FORMAT_VERSION,
      num_rows: this.#rows.length,
      columns: this.#columns,
    };
    await writeAtomic(join(dir, DATASET_DATA_FILE), toJsonl(this.#rows));
    await writeAtomic(join(dir, DATASET_INFO_FILE), JSON.stringify(info, null, 2) + "\n");
  }

  #removals(options: MapOptions): Set<string> {
    if (options.batched) throw new TypeError("Dataset.map() does not support batched: true");
    const remove = new Set(options.removeColumns ?? []);
    this.#assertColumns([...remove]);
    return remove;
  }

  #mapped(rows: Row[], removed: Set<string>): Dataset {
    const kept = this.#columns.filter((c) => !removed.has(c));
    return Dataset.#fromOwnedRows(
      rows,
      unionColumns([kept, ...rows.map(Object.keys)]),
      this.#origin,
    );
  }

  /** The rows at `picked` (valid indices), keeping where each came from. */
  #picked(picked: readonly number[]): Dataset {
    return new Dataset(
      picked.map((i) => this.#rows[i]),
      this.#columns,
      pickOrigin(this.#origin, picked),
    );
  }

  #assertIndex(index: number): void {
    if (!Number.isInteger(index) || index < 0 || index >= this.#rows.length) {
      throw new RangeError(`Row index ${index} is out of range for ${this.#rows.length} rows`);
    }
  }

  #assertColumns(names: readonly string[]): void {
    for (const name of names) {
      if (!this.#columns.includes(name)) {
        throw new RangeError(
          `Column "${name}" is not in the dataset; columns: ${
            this.#columns.join(", ") || "(none)"
          }`,
        );
      }
    }
  }
}

/** The origin of datasets stacked row-wise (null when none of them has one). */
function concatOrigins(
  origins: readonly (Origin | null)[],
  lengths: readonly number[],
): Origin | null {
  if (origins.every((o) => o === null)) return null;
  const labels: string[] = [];
  const total = lengths.reduce((a, n) => a + n, 0);
  const source = new Int32Array(total);
  const index = new Int32Array(total);
  let at = 0;
  origins.forEach((o, k) => {
    const base = labels.length;
    if (o) labels.push(...o.labels);
    for (let i = 0; i < lengths[k]; i++, at++) {
      const s = o ? (o.source ? o.source[i] : 0) : -1;
      source[at] = s < 0 ? -1 : base + s;
      index[at] = o?.index ? o.index[i] : i;
    }
  });
  return { labels, source, index };
}

/**
 * Parses JSON Lines text into rows; blank lines are skipped.
 * @throws {ConfigError} naming `file` and the line for invalid JSON or a non-object line
 */
export function parseJsonl(text: string, file: string): Row[] {
  const rows: Row[] = [];
  const lines = text.split("\n");
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i].trim();
    if (line === "") continue;
    let value: unknown;
    try {
      value = JSON.parse(line);
    } catch (cause) {
      throw new ConfigError(`${file}: line ${i + 1}: invalid JSON: ${(cause as Error).message}`, {
        cause,
      });
    }
    if (!isPlainObject(value)) {
      throw new ConfigError(`${file}: line ${i + 1}: expected a JSON object, got ${kind(value)}`);
    }
    rows.push(value);
  }
  return rows;
}

/** Serialises rows as JSON Lines (see {@linkcode Dataset.save} for value conversions). */
export function toJsonl(rows: Iterable<Row>): string {
  let out = "";
  for (const row of rows) out += JSON.stringify(row, jsonReplacer) + "\n";
  return out;
}

/** A JSON.stringify replacer for values JSON cannot hold. */
export function jsonReplacer(_key: string, value: unknown): unknown {
  if (typeof value === "bigint") {
    return Number.isSafeInteger(Number(value)) ? Number(value) : value.toString();
  }
  if (value instanceof Uint8Array) return Array.from(value);
  return value;
}

/** True for `{}`-style objects (not arrays, dates, buffers or class instances). */
export function isPlainObject(value: unknown): value is Record<string, unknown> {
  if (typeof value !== "object" || value === null) return false;
  const proto = Object.getPrototypeOf(value);
  return proto === Object.prototype || proto === null;
}

function kind(value: unknown): string {
  if (value === null) return "null";
  if (Array.isArray(value)) return "an array";
  return `a ${typeof value}`;
}

function assertRow(row: unknown, where: string): asserts row is Row {
  if (!isPlainObject(row)) throw new TypeError(`Dataset ${where} is not an object: ${kind(row)}`);
}

function mergeResult(row: Row, result: MapResult, remove: Set<string>, index: number): Row {
  if (result !== undefined && result !== null && !isPlainObject(result)) {
    throw new TypeError(
      `Dataset.map() function returned ${
        kind(result)
      } for row ${index}; return an object or nothing`,
    );
  }
  const out: Row = {};
  for (const key of Object.keys(row)) if (!remove.has(key)) out[key] = row[key];
  return result ? Object.assign(out, result) : out;
}

function unionColumns(lists: Iterable<readonly string[]>): string[] {
  const seen = new Set<string>();
  for (const list of lists) for (const c of list) seen.add(c);
  return [...seen];
}

function hasColumnsInOrder(row: Row, columns: readonly string[]): boolean {
  const keys = Object.keys(row);
  if (keys.length !== columns.length) return false;
  return keys.every((k, i) => k === columns[i]);
}

function reorder(row: Row, columns: readonly string[]): Row {
  const out: Row = {};
  for (const c of columns) out[c] = Object.hasOwn(row, c) ? row[c] : null;
  return out;
}

function cloneRow(row: Row): Row {
  const out: Row = {};
  for (const key of Object.keys(row)) out[key] = cloneValue(row[key]);
  return out;
}

function cloneValue(value: unknown): unknown {
  if (typeof value !== "object" || value === null) return value;
  try {
    return copyPlain(value);
  } catch {
    return value; // holds something uncloneable (a function): share it
  }
}

function isPromiseLike(value: unknown): value is PromiseLike<unknown> {
  return typeof (value as PromiseLike<unknown> | null)?.then === "function";
}

/** Writes through a temporary file and a rename, so readers never see half a file. */
export async function writeAtomic(path: string, data: string | Uint8Array): Promise<void> {
  const tmp = `${path}.tmp-${crypto.randomUUID()}`;
  await writeFile(tmp, data);
  await rename(tmp, path);
}
