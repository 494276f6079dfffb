/**
 * Hooks plugged in from the task config: `[env.taskset.task.rewards.<name>]` (and `metrics`,
 * `stops`) with `fn = "path/to/hooks.ts:function"`, `weight`, `priority`, `offline`. They
 * merge by name with the task's own (see `Task.scoreHooks`); this module loads the functions
 * and checks the entries, with errors naming the field.
 * @module
 */
import { isAbsolute, resolve } from "node:path";
import { pathToFileURL } from "node:url";
import { ConfigError } from "../errors.ts";

const KINDS = ["rewards", "metrics", "stops"] as const;

/**
 * The task config with every plugged `fn` loaded: `"file.ts:name"` becomes that function.
 * Paths are relative to `baseDir`.
 * @throws {ConfigError} naming `env.taskset.task.<kind>.<name>.<field>`
 */
export async function loadPluggedHooks(
  taskConfig: Record<string, unknown>,
  baseDir: string,
): Promise<Record<string, unknown>> {
  const out: Record<string, unknown> = { ...taskConfig };
  for (const kind of KINDS) {
    const table = taskConfig[kind];
    if (table === undefined) continue;
    const field = `env.taskset.task.${kind}`;
    if (!table || typeof table !== "object" || Array.isArray(table)) {
      throw new ConfigError(`${field}: expected a table of hooks by name`);
    }
    const loaded: Record<string, unknown> = {};
    for (const [name, raw] of Object.entries(table as Record<string, unknown>)) {
      const at = `${field}.${name}`;
      if (!raw || typeof raw !== "object") throw new ConfigError(`${at}: expected a table`);
      const entry = { ...(raw as Record<string, unknown>) };
      const unknown = Object.keys(entry).filter((k) =>
        !["fn", "weight", "priority", "offline"].includes(k)
      );
      if (unknown.length) {
        throw new ConfigError(
          `${at}: unknown key${unknown.length > 1 ? "s" : ""} ${
            unknown.map((k) => `"${k}"`).join(", ")
          }`,
        );
      }
      if (entry.weight !== undefined) {
        if (kind !== "rewards") throw new ConfigError(`${at}.weight: only rewards have weights`);
        if (typeof entry.weight !== "number" || !Number.isFinite(entry.weight)) {
          throw new ConfigError(`${at}.weight: must be a finite number`);
        }
      }
      if (entry.priority !== undefined && !Number.isFinite(entry.priority)) {
        throw new ConfigError(`${at}.priority: must be a finite number`);
      }
      if (typeof entry.fn === "string") {
        entry.fn = await loadFunction(entry.fn, baseDir, `${at}.fn`);
      } else if (entry.fn !== undefined && typeof entry.fn !== "function") {
        throw new ConfigError(`${at}.fn: expected "path/to/file.ts:function"`);
      }
      loaded[name] = entry;
    }
    out[kind] = loaded;
  }
  return out;
}

async function loadFunction(spec: string, baseDir: string, at: string): Promise<unknown> {
  const colon = spec.lastIndexOf(":");
  if (colon <= 0 || colon === spec.length - 1) {
    throw new ConfigError(`${at}: "${spec}" is not "path/to/file.ts:function"`);
  }
  const file = spec.slice(0, colon);
  const name = spec.slice(colon + 1);
  const path = isAbsolute(file) ? file : resolve(baseDir, file);
  let module: Record<string, unknown>;
  try {
    module = await import(pathToFileURL(path).href);
  } catch (error) {
    throw new ConfigError(`${at}: cannot load "${file}": ${(error as Error).message}`, {
      cause: error,
    });
  }
  if (typeof module[name] !== "function") {
    throw new ConfigError(`${at}: "${file}" exports no function "${name}"`);
  }
  return module[name];
}
