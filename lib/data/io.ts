/**
 * Reading and writing datasets as files: JSON Lines, JSON, CSV, Parquet, and the
 * directory layout of {@linkcode Dataset.save}.
 *
 * ```ts
 * import { loadDataset, saveDataset } from "./io.ts";
 *
 * const ds = await loadDataset("questions.csv");
 * await saveDataset(ds, "questions.parquet");
 * ```
 * @module
 */

import { mkdir, readFile, stat } from "node:fs/promises";
import { dirname, extname } from "node:path";
import { fileURLToPath } from "node:url";
// deno-lint-ignore no-import-prefix
import { parquetMetadata, parquetReadObjects, parquetSchema } from "npm:hyparquet@^1.31.0";
// deno-lint-ignore no-import-prefix
import { parquetWriteBuffer } from "npm:hyparquet-writer@^0.17.0";
import {
  Dataset,
  DATASET_INFO_FILE,
  isPlainObject,
  jsonReplacer,
  parseJsonl,
  toJsonl,
  withSource,
  writeAtomic,
} from "./dataset.ts";
import { ConfigError } from "../errors.ts";
import type { Row } from "../types.ts";

/** A file format a dataset can be read from or written to. */
export type DatasetFormat = "jsonl" | "json" | "csv" | "parquet";

/** The formats, each with the extensions that select it. */
const EXTENSIONS: Record<string, DatasetFormat> = {
  ".jsonl": "jsonl",
  ".ndjson": "jsonl",
  ".json": "json",
  ".csv": "csv",
  ".parquet": "parquet",
};

/** Options of {@linkcode loadDataset} and {@linkcode datasetFromBytes}. */
export interface ReadDatasetOptions {
  /** The file format. Default: taken from the file extension. */
  format?: DatasetFormat;
  /** JSON only: the key of the top-level object that holds the rows. Default: inferred. */
  field?: string;
  /** CSV only: the field separator, one character. Default: `","`. */
  delimiter?: string;
}

/**
 * The format a path's extension selects, or `undefined` for an unknown extension.
 */
export function formatFromPath(path: string): DatasetFormat | undefined {
  return EXTENSIONS[extname(path).toLowerCase()];
}

/**
 * Loads a dataset from a file or from a directory written by `Dataset.save()`.
 *
 * By extension: `.jsonl` (one object per line), `.json` (an array of rows, an object
 * holding such an array such as `{"data": [...]}`, an object of equal-length columns, or
 * JSON Lines), `.csv` (RFC 4180 with a header row; values stay strings) and `.parquet`
 * (INT64 values become numbers when they are safe integers, else stay bigint).
 *
 * @param source a path or a `file:` URL
 * @throws {ConfigError} naming the file (and the line, for JSONL and CSV) when it is
 *   missing, of an unknown format, or malformed
 */
export async function loadDataset(
  source: string | URL,
  options: ReadDatasetOptions = {},
): Promise<Dataset> {
  const path = source instanceof URL || source.startsWith("file:") ? fileURLToPath(source) : source;
  let isDir: boolean;
  try {
    isDir = (await stat(path)).isDirectory();
  } catch (cause) {
    throw new ConfigError(`Cannot read dataset "${path}": no such file or directory`, { cause });
  }
  if (isDir) {
    try {
      await stat(`${path}/${DATASET_INFO_FILE}`);
    } catch (cause) {
      throw new ConfigError(
        `Cannot read dataset "${path}": a directory must be one written by Dataset.save() (with ${DATASET_INFO_FILE})`,
        { cause },
      );
    }
    return await Dataset.load(path);
  }
  const format = options.format ?? formatFromPath(path);
  if (format === undefined) {
    throw new ConfigError(
      `Cannot read dataset "${path}": unknown extension "${extname(path)}"; use one of ${
        Object.keys(EXTENSIONS).join(", ")
      } or pass format`,
    );
  }
  const bytes = await readFile(path);
  return await datasetFromBytes(bytes, { ...options, format, name: path });
}

/**
 * Parses a dataset held in memory (what {@linkcode loadDataset} does after reading
 * the file).
 * @param data the file's bytes, or its text for the text formats
 * @throws {ConfigError} naming `options.name` when the data is malformed
 */
export async function datasetFromBytes(
  data: Uint8Array | string,
  options: ReadDatasetOptions & { format: DatasetFormat; name?: string },
): Promise<Dataset> {
  const name = options.name ?? `(${options.format} data)`;
  const ds = await parseData(data, name, options);
  // Named data keeps its name, so an error about a row says which file and row it is.
  return options.name ? withSource(ds, options.name) : ds;
}

async function parseData(
  data: Uint8Array | string,
  name: string,
  options: ReadDatasetOptions & { format: DatasetFormat },
): Promise<Dataset> {
  if (options.format === "parquet") {
    if (typeof data === "string") throw new TypeError("Parquet data must be bytes, not text");
    return await parseParquet(data, name);
  }
  const text = typeof data === "string" ? data : new TextDecoder().decode(data);
  switch (options.format) {
    case "jsonl":
      return Dataset.fromList(parseJsonl(stripBom(text), name));
    case "json":
      return parseJson(stripBom(text), name, options.field);
    case "csv":
      return parseCsv(text, name, options.delimiter ?? ",");
    default:
      throw new ConfigError(`${name}: unknown dataset format "${options.format}"`);
  }
}

/** Options of {@linkcode saveDataset}. */
export interface SaveDatasetOptions {
  /** The file format. Default: taken from the extension; no extension saves a directory. */
  format?: DatasetFormat | "dir";
}

/**
 * Writes a dataset to `path`, choosing the format by extension (`.jsonl`, `.json`,
 * `.csv`, `.parquet`); a path without an extension becomes a `Dataset.save()`
 * directory. Parent directories are created. CSV cells that are not strings are
 * written as JSON (`null` as an empty cell).
 * @throws {ConfigError} for an unknown extension
 */
export async function saveDataset(
  dataset: Dataset,
  path: string,
  options: SaveDatasetOptions = {},
): Promise<void> {
  const format = options.format ?? (extname(path) === "" ? "dir" : formatFromPath(path));
  if (format === "dir") return await dataset.save(path);
  if (format === undefined) {
    throw new ConfigError(
      `Cannot save dataset to "${path}": unknown extension "${extname(path)}"; use one of ${
        Object.keys(EXTENSIONS).join(", ")
      }, or no extension for a directory`,
    );
  }
  await mkdir(dirname(path), { recursive: true });
  switch (format) {
    case "jsonl":
      return await writeAtomic(path, toJsonl(dataset));
    case "json":
      return await writeAtomic(path, JSON.stringify(dataset.toList(), jsonReplacer, 2) + "\n");
    case "csv":
      return await writeAtomic(path, toCsv(dataset));
    case "parquet":
      return await writeAtomic(path, toParquet(dataset));
  }
}

function stripBom(text: string): string {
  return text.charCodeAt(0) === 0xfeff ? text.slice(1) : text;
}

function parseJson(text: string, name: string, field: string | undefined): Dataset {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (cause) {
    // HF's json loader also takes JSON Lines in a .json file
    const firstLine = text.trimStart().split("\n", 1)[0];
    if (text.trim().includes("\n") && isJsonObject(firstLine)) {
      return Dataset.fromList(parseJsonl(text, name));
    }
    throw new ConfigError(`${name}: invalid JSON: ${(cause as Error).message}`, { cause });
  }
  if (field !== undefined) {
    if (!isPlainObject(value) || !Object.hasOwn(value, field)) {
      throw new ConfigError(`${name}: field "${field}" is not a key of the top-level object`);
    }
    return jsonTable(value[field], `${name}: ${field}`);
  }
  if (Array.isArray(value)) return jsonTable(value, name);
  if (isPlainObject(value)) {
    const entries = Object.entries(value);
    const rowLists = entries.filter(([, v]) =>
      Array.isArray(v) && v.length > 0 && v.every(isPlainObject)
    );
    if (entries.length === 1 && rowLists.length === 1) return jsonTable(rowLists[0][1], name);
    const lengths = new Set(entries.map(([, v]) => (Array.isArray(v) ? v.length : -1)));
    if (entries.length > 0 && !lengths.has(-1) && lengths.size === 1) {
      return Dataset.fromDict(value as Record<string, unknown[]>);
    }
    if (rowLists.length === 1) return jsonTable(rowLists[0][1], `${name}: ${rowLists[0][0]}`);
  }
  throw new ConfigError(
    `${name}: expected an array of rows, an object holding one (such as {"data": [...]}), or an object of equal-length columns; pass field to choose a key`,
  );
}

function jsonTable(value: unknown, where: string): Dataset {
  if (isPlainObject(value)) {
    try {
      return Dataset.fromDict(value as Record<string, unknown[]>);
    } catch (cause) {
      throw new ConfigError(`${where}: ${(cause as Error).message}`, { cause });
    }
  }
  if (!Array.isArray(value)) throw new ConfigError(`${where}: expected an array of rows`);
  const bad = value.findIndex((row) => !isPlainObject(row));
  if (bad >= 0) throw new ConfigError(`${where}: item ${bad} is not an object`);
  return Dataset.fromList(value as Row[]);
}

function isJsonObject(text: string): boolean {
  try {
    return isPlainObject(JSON.parse(text));
  } catch {
    return false;
  }
}

/** An RFC 4180 reader: quoted fields may hold delimiters, `""` and line breaks. */
function parseCsv(input: string, name: string, delimiter: string): Dataset {
  if (delimiter.length !== 1 || delimiter === '"' || delimiter === "\n" || delimiter === "\r") {
    throw new ConfigError(`${name}: delimiter must be one character other than a quote or newline`);
  }
  const text = stripBom(input);
  const records: { fields: string[]; line: number }[] = [];
  let fields: string[] = [];
  let field = "";
  let line = 1;
  let recordLine = 1;
  let inQuotes = false;
  let quotedLine = 1;
  let atFieldStart = true;
  let afterQuote = false;
  let recordQuoted = false;

  const endField = () => {
    fields.push(field);
    field = "";
    atFieldStart = true;
    afterQuote = false;
  };
  const endRecord = () => {
    endField();
    const blank = fields.length === 1 && fields[0] === "" && !recordQuoted;
    if (!blank) records.push({ fields, line: recordLine });
    fields = [];
    recordQuoted = false;
  };

  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (inQuotes) {
      if (c === '"') {
        if (text[i + 1] === '"') {
          field += '"';
          i++;
        } else {
          inQuotes = false;
          afterQuote = true;
        }
      } else {
        if (c === "\n" || (c === "\r" && text[i + 1] !== "\n")) line++;
        field += c;
      }
    } else if (c === '"' && atFieldStart) {
      inQuotes = true;
      recordQuoted = true;
      atFieldStart = false;
      quotedLine = line;
    } else if (c === delimiter) {
      endField();
    } else if (c === "\n" || c === "\r") {
      if (c === "\r" && text[i + 1] === "\n") i++;
      endRecord();
      line++;
      recordLine = line;
    } else if (afterQuote) {
      throw new ConfigError(`${name}: line ${line}: unexpected character after a closing quote`);
    } else {
      field += c;
      atFieldStart = false;
    }
  }
  if (inQuotes) {
    throw new ConfigError(`${name}: line ${quotedLine}: a quoted field is never closed`);
  }
  if (!atFieldStart || fields.length > 0 || afterQuote) endRecord();

  if (records.length === 0) return Dataset.fromList([]);
  const [header, ...body] = records;
  const seen = new Set<string>();
  for (const column of header.fields) {
    if (seen.has(column)) {
      throw new ConfigError(
        `${name}: line ${header.line}: column "${column}" appears twice in the header`,
      );
    }
    seen.add(column);
  }
  const columns: Record<string, string[]> = {};
  for (const column of header.fields) columns[column] = [];
  for (const { fields, line } of body) {
    if (fields.length !== header.fields.length) {
      throw new ConfigError(
        `${name}: line ${line}: has ${fields.length} fields, the header has ${header.fields.length}`,
      );
    }
    header.fields.forEach((column, k) => columns[column].push(fields[k]));
  }
  return Dataset.fromDict(columns);
}

function toCsv(dataset: Dataset): string {
  const columns = dataset.columnNames;
  const lines = [columns.map(csvCell).join(",")];
  for (const row of dataset) lines.push(columns.map((c) => csvCell(row[c])).join(","));
  return lines.join("\n") + "\n";
}

function csvCell(value: unknown): string {
  const text = value === null || value === undefined
    ? ""
    : typeof value === "string"
    ? value
    : JSON.stringify(value, jsonReplacer);
  return /[",\r\n]/.test(text) ? `"${text.replaceAll('"', '""')}"` : text;
}

async function parseParquet(bytes: Uint8Array, name: string): Promise<Dataset> {
  const file = bytes.buffer.slice(
    bytes.byteOffset,
    bytes.byteOffset + bytes.byteLength,
  ) as ArrayBuffer;
  let rows: Record<string, unknown>[];
  let columns: string[];
  try {
    const metadata = parquetMetadata(file);
    columns = parquetSchema(metadata).children.map((child) => child.element.name);
    rows = await parquetReadObjects({ file, metadata });
  } catch (cause) {
    throw new ConfigError(`${name}: not a readable Parquet file: ${(cause as Error).message}`, {
      cause,
    });
  }
  const data: Record<string, unknown[]> = {};
  for (const column of columns) data[column] = rows.map((row) => fromParquetValue(row[column]));
  return Dataset.fromDict(data);
}

/** INT64 arrives as bigint; make it a number wherever that loses nothing. */
function fromParquetValue(value: unknown): unknown {
  if (typeof value === "bigint") {
    return value >= BigInt(Number.MIN_SAFE_INTEGER) && value <= BigInt(Number.MAX_SAFE_INTEGER)
      ? Number(value)
      : value;
  }
  if (Array.isArray(value)) return value.map(fromParquetValue);
  if (isPlainObject(value)) {
    const out: Row = {};
    for (const [k, v] of Object.entries(value)) out[k] = fromParquetValue(v);
    return out;
  }
  return value;
}

type ParquetColumn = Parameters<typeof parquetWriteBuffer>[0]["columnData"][number];

function toParquet(dataset: Dataset): Uint8Array {
  const columnData = dataset.columnNames.map((name) => parquetColumn(name, dataset.col(name)));
  return new Uint8Array(parquetWriteBuffer({ columnData }));
}

/** Picks one Parquet type per column; anything mixed or nested is stored as JSON. */
function parquetColumn(name: string, values: unknown[]): ParquetColumn {
  const present = values.filter((v) => v !== null && v !== undefined);
  const all = (test: (v: unknown) => boolean) => present.every(test);
  const nulls = (map: (v: unknown) => unknown) =>
    values.map((v) => (v === null || v === undefined ? null : map(v)));
  if (present.length === 0) return { name, data: nulls(String), type: "STRING", nullable: true };
  if (all((v) => typeof v === "string")) return { name, data: nulls(String), type: "STRING" };
  if (all((v) => typeof v === "boolean")) return { name, data: nulls(Boolean), type: "BOOLEAN" };
  if (all((v) => typeof v === "number" && Number.isInteger(v) && Math.abs(v) < 2 ** 31)) {
    return { name, data: nulls(Number), type: "INT32" };
  }
  if (all((v) => typeof v === "bigint" || (typeof v === "number" && Number.isSafeInteger(v)))) {
    return { name, data: nulls((v) => BigInt(v as number | bigint)), type: "INT64" };
  }
  if (all((v) => typeof v === "number")) return { name, data: nulls(Number), type: "DOUBLE" };
  if (all((v) => v instanceof Date)) return { name, data: nulls((v) => v), type: "TIMESTAMP" };
  if (all((v) => v instanceof Uint8Array)) {
    return {
      name,
      data: nulls((v) => v),
      type: "BYTE_ARRAY",
    };
  }
  return {
    name,
    data: nulls((v) => JSON.parse(JSON.stringify(v, jsonReplacer))),
    type: "JSON",
  };
}
