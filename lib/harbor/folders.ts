/**
 * Which folders are Harbor task folders, and which of a folder of them to take (names, globs,
 * the first n).
 * @module
 */
import { existsSync, readdirSync } from "node:fs";
import { readdir } from "node:fs/promises";
import { basename, join, resolve } from "node:path";
import { ConfigError } from "../errors.ts";

/** Whether `dir` is a Harbor task folder, or holds some. */
export function isHarborFolder(dir: string): boolean {
  if (!existsSync(dir)) return false;
  if (existsSync(join(dir, "task.toml"))) return true;
  try {
    return readdirSync(dir, { withFileTypes: true }).some((e) =>
      e.isDirectory() && existsSync(join(dir, e.name, "task.toml"))
    );
  } catch {
    return false;
  }
}

/** A glob (`*`, `?`, `[...]`) as a whole-name regular expression. */
function globRegExp(glob: string): RegExp {
  let out = "";
  for (let i = 0; i < glob.length; i++) {
    const c = glob[i];
    if (c === "*") out += ".*";
    else if (c === "?") out += ".";
    else if (c === "[") {
      const end = glob.indexOf("]", i + 1);
      if (end < 0) out += "\\[";
      else {
        const body = glob.slice(i + 1, end).replace(/^!/, "^").replace(/\\/g, "\\\\");
        out += `[${body}]`;
        i = end;
      }
    } else out += c.replace(/[.+^${}()|\\\]]/g, "\\$&");
  }
  return new RegExp(`^${out}$`);
}

function globList(v: unknown, key: string): RegExp[] {
  if (v === undefined) return [];
  const list = typeof v === "string" ? [v] : v;
  if (!Array.isArray(list) || !list.every((x) => typeof x === "string" && x)) {
    throw new ConfigError(`env.taskset.${key}: give a glob or a list of globs of task names`);
  }
  return list.map(globRegExp);
}

/** Which task folders of a folder of them to take. */
export interface HarborSelection {
  /** Exactly these names (each must exist). */
  names?: string[];
  /** Globs of names to take (default all). */
  include?: string[] | string;
  /** Globs of names to leave out. */
  exclude?: string[] | string;
  /** The first n of what is left, by name; default all. */
  n?: number | string;
}

/**
 * The task folders under `path`: itself when it is one, else its subfolders that are (by
 * name), narrowed by `names`, `include` and `exclude` globs, then the first `n`.
 * @throws {ConfigError} when nothing is there, or a named task is not
 */
export async function harborFolders(
  path: string,
  selection: string[] | HarborSelection = {},
): Promise<string[]> {
  const { names, include, exclude, n } = Array.isArray(selection)
    ? { names: selection } as HarborSelection
    : selection;
  const root = resolve(path);
  let folders: string[];
  if (existsSync(join(root, "task.toml"))) folders = [root];
  else {
    folders = [];
    for (
      const entry of (await readdir(root, { withFileTypes: true })).sort((a, b) =>
        a.name < b.name ? -1 : 1
      )
    ) {
      if (entry.isDirectory() && existsSync(join(root, entry.name, "task.toml"))) {
        folders.push(join(root, entry.name));
      }
    }
  }
  if (folders.length === 0) {
    throw new ConfigError(`${path}: no Harbor task folder (with task.toml) here`);
  }
  if (names?.length) {
    const missing = names.filter((n) => !folders.some((f) => basename(f) === n));
    if (missing.length) {
      throw new ConfigError(
        `${path}: no Harbor task named ${missing.map((m) => `"${m}"`).join(", ")}`,
      );
    }
    folders = folders.filter((f) => names.includes(basename(f)));
  }
  const inc = globList(include, "include");
  const exc = globList(exclude, "exclude");
  folders = folders.filter((f) => {
    const name = basename(f);
    return (!inc.length || inc.some((g) => g.test(name))) && !exc.some((g) => g.test(name));
  });
  if (n !== undefined) {
    // From the command line a number arrives as its text.
    const count: unknown = typeof n === "string" && /^\d+$/.test(n) ? Number(n) : n;
    if (typeof count !== "number" || !Number.isInteger(count) || count < 1) {
      throw new ConfigError(`env.taskset.n_tasks: ${JSON.stringify(n)} is not a positive integer`);
    }
    folders = folders.slice(0, count);
  }
  if (folders.length === 0) {
    throw new ConfigError(`${path}: env.taskset.include/exclude leave no Harbor task`);
  }
  return folders;
}
