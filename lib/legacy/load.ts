/**
 * Loading environments by built-in id or local path. A module must export
 * `loadEnvironment(args)` returning an Environment (sync or async).
 * @module
 */
import { readFile, stat } from "node:fs/promises";
import { isAbsolute, join, resolve } from "node:path";
import { pathToFileURL } from "node:url";
import { ConfigError } from "../errors.ts";
import { describeWhere } from "../util/_user_frame.ts";

/** What an environment module exports. */
export interface EnvironmentModule {
  // deno-lint-ignore no-explicit-any
  loadEnvironment: (args: Record<string, unknown>) => any;
  /** Optional defaults for `vf eval`: `{ num_examples, rollouts_per_example }`. */
  evalDefaults?: { num_examples?: number; rollouts_per_example?: number };
}

/** Built-in environments: id → module (static imports, so a compiled binary embeds them). */
export type Registry = Record<string, () => Promise<EnvironmentModule>>;

function looksLikePath(spec: string): boolean {
  return spec.startsWith(".") || spec.startsWith("/") || spec.endsWith(".ts") ||
    spec.endsWith(".js") || spec.includes("/") || spec.includes("\\");
}

/** Resolve a spec to a module: a built-in id or a local file/folder (folder → `mod.ts`). */
export async function resolveEnvironmentModule(
  spec: string,
  registry: Registry,
  entry: "loadEnvironment" | "loadTaskset" = "loadEnvironment",
): Promise<{ module: EnvironmentModule; id: string; source: string }> {
  const key = spec.replaceAll("_", "-");
  const kind = entry === "loadTaskset" ? "Taskset" : "Environment";
  if (registry[spec] || registry[key]) {
    const load = registry[spec] ?? registry[key];
    return { module: await load(), id: registry[spec] ? spec : key, source: `built-in "${spec}"` };
  }
  if (/^https?:\/\//.test(spec) && "Deno" in globalThis && !("Bun" in globalThis)) {
    // Only code calling loadEnvironment() with a URL gets here (the CLI runs URL environments
    // in a host process, sandboxed or --trust): Deno imports the URL in-process, unpinned.
    let module: EnvironmentModule;
    try {
      module = await import(spec);
    } catch (error) {
      throw new ConfigError(
        `${kind} module "${spec}" failed to load: ${(error as Error).message ?? error}`,
        { cause: error },
      );
    }
    if (typeof (module as unknown as Record<string, unknown>)[entry] !== "function") {
      throw missingEntry(spec, module, entry);
    }
    const base = new URL(spec).pathname.replace(/\/mod\.ts$/, "").split("/").pop()!;
    return { module, id: base.replace(/\.(ts|js)$/, "").replaceAll("_", "-"), source: spec };
  }
  if (/^https?:\/\//.test(spec)) {
    throw new ConfigError(
      `Loading environments from URLs ("${spec}") is not available in this build; use a local path or a built-in id`,
    );
  }
  if (!looksLikePath(spec)) {
    throw new ConfigError(
      `Unknown ${entry === "loadTaskset" ? "taskset" : "environment"} "${spec}"; built-ins: ${
        Object.keys(registry).sort().join(", ")
      }; ` +
        `or give a path to a module exporting ${entry}()`,
    );
  }
  let path = isAbsolute(spec) ? spec : resolve(spec);
  let info;
  try {
    info = await stat(path);
  } catch {
    throw new ConfigError(`${kind} path "${spec}" does not exist`);
  }
  if (info.isDirectory()) {
    const entry = join(path, "mod.ts");
    try {
      await stat(entry);
    } catch {
      throw new ConfigError(`${kind} folder "${spec}" has no mod.ts`);
    }
    path = entry;
  }
  let module: EnvironmentModule;
  try {
    module = await import(pathToFileURL(path).href);
  } catch (error) {
    const named = await kindOfSource(path, entry) ?? kind;
    throw new ConfigError(`${named} module "${spec}" failed to load: ${describeWhere(error)}`, {
      cause: error,
    });
  }
  if (typeof (module as unknown as Record<string, unknown>)[entry] !== "function") {
    throw missingEntry(spec, module, entry);
  }
  const base = path.replace(/\/mod\.ts$/, "").split("/").pop()!.replace(/\.(ts|js)$/, "");
  return { module, id: base.replaceAll("_", "-"), source: path };
}

/** A module without the function it is loaded for; one exporting the other kind's says so. */
function missingEntry(spec: string, module: unknown, entry: string): ConfigError {
  const exports = module as Record<string, unknown>;
  if (entry === "loadEnvironment" && typeof exports.loadTaskset === "function") {
    return new ConfigError(
      `Module "${spec}" exports loadTaskset(), not loadEnvironment(): it is a taskset; run it with vf run ${spec}`,
    );
  }
  if (entry === "loadTaskset" && typeof exports.loadEnvironment === "function") {
    return new ConfigError(
      `Module "${spec}" exports loadEnvironment(), not loadTaskset(): it is an environment; evaluate it with vf eval ${spec}`,
    );
  }
  return new ConfigError(
    `Module "${spec}" exports neither loadEnvironment() (an environment, for vf eval) nor ` +
      `loadTaskset() (a taskset, for vf run or vf eval)`,
  );
}

/**
 * What a module that did not load is, from its source: one that defines only the other
 * entry's function is of the other kind (vf eval tries an environment first and takes
 * tasksets too), so its error does not call a taskset an environment; null when unsure.
 */
async function kindOfSource(
  path: string,
  entry: "loadEnvironment" | "loadTaskset",
): Promise<"Environment" | "Taskset" | null> {
  const text = await readFile(path, "utf8").catch(() => "");
  const has = (name: string) => new RegExp(`\\b${name}\\b`).test(text);
  const other = entry === "loadTaskset" ? "loadEnvironment" : "loadTaskset";
  if (has(other) && !has(entry)) return other === "loadTaskset" ? "Taskset" : "Environment";
  return null;
}

/** Load and construct an environment. */
export async function loadEnvironment(
  spec: string,
  args: Record<string, unknown>,
  registry: Registry,
  // deno-lint-ignore no-explicit-any
): Promise<{ env: any; module: EnvironmentModule; id: string }> {
  const { module, id, source } = await resolveEnvironmentModule(spec, registry);
  let env;
  try {
    env = await module.loadEnvironment(args);
  } catch (error) {
    if (error instanceof ConfigError) {
      throw new ConfigError(`Environment "${spec}": ${error.message}`, { cause: error });
    }
    throw new ConfigError(`loadEnvironment() of ${source} threw: ${describeWhere(error)}`, {
      cause: error,
    });
  }
  if (!env || typeof env !== "object") {
    throw new ConfigError(
      `loadEnvironment() of ${source} returned ${String(env)}, not an environment`,
    );
  }
  if (!env.envId) env.envId = id;
  if (env.envArgs && Object.keys(env.envArgs).length === 0) env.envArgs = args;
  return { env, module, id };
}

/** Load a taskset by built-in id or local path (a module exporting `loadTaskset(config)`). */
export async function loadTasksetSpec(
  spec: string,
  config: Record<string, unknown>,
  registry: Record<string, () => Promise<{ loadTaskset: (c: Record<string, unknown>) => unknown }>>,
  // deno-lint-ignore no-explicit-any
): Promise<any> {
  const { module, source } = await resolveEnvironmentModule(
    spec,
    registry as unknown as Registry,
    "loadTaskset",
  );
  const load =
    (module as unknown as { loadTaskset: (c: Record<string, unknown>) => unknown }).loadTaskset;
  try {
    return await load(config);
  } catch (error) {
    if (error instanceof ConfigError) throw error;
    throw new ConfigError(`loadTaskset() of ${source} threw: ${describeWhere(error)}`, {
      cause: error,
    });
  }
}
