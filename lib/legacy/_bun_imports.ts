/**
 * Under Bun (the `vf` binary from `deno task compile`), lets an environment module loaded
 * from disk import what it imports under Deno:
 *
 * - vf's own `mod.ts` (in a folder whose deno.json is `@vf/vf`), as the built-in environments
 *   do with `../../mod.ts`, gets the copy this program runs: one set of classes, and no
 *   `node_modules` needed;
 * - `npm:zod@4…` gets the zod vf uses (tool schemas pass between the two); any other
 *   `npm:pkg@range/subpath` resolves in the `node_modules` folders above the importing file.
 *
 * Bun's runtime plugins see an `npm:x` import only through the `npm` namespace (as `x`).
 * `cli.ts` registers these rules at start-up under Bun, handing over its own copy of vf's
 * `mod.ts` (this module cannot import it: `mod.ts` re-exports the loader that environments
 * are imported through).
 * @module
 */
import { existsSync, readFileSync } from "node:fs";
import { dirname, isAbsolute, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import * as zod from "npm:zod@^4.6.0";
import { parseNpmSpecifier, resolveNpmSpecifier } from "./_npm_resolve.ts";

type Resolved = { path: string; namespace?: string } | undefined;
interface PluginBuilder {
  onResolve(
    options: { filter: RegExp; namespace?: string },
    callback: (args: { path: string; importer: string }) => Resolved,
  ): void;
  onLoad(
    options: { filter: RegExp; namespace: string },
    callback: (args: { path: string }) => { exports: Record<string, unknown>; loader: "object" },
  ): void;
}
interface BunPlugins {
  plugin(plugin: { name: string; setup(build: PluginBuilder): void }): void;
}

const EMBEDDED = "vf-embedded";
const modules: Record<string, Record<string, unknown>> = { zod };
let registered = false;

/** The directory of an importer, which Bun gives as a path (or, rarely, a file URL). */
function importerDir(importer: string): string {
  return dirname(importer.startsWith("file:") ? fileURLToPath(importer) : importer);
}

/** Whether `dir` is a vf checkout or copy: its deno.json names the `@vf/vf` package. */
function isVfRoot(dir: string): boolean {
  const config = join(dir, "deno.json");
  if (!existsSync(config)) return false;
  try {
    return JSON.parse(readFileSync(config, "utf8")).name === "@vf/vf";
  } catch {
    return false;
  }
}

function resolveNpm(specifier: string, importer: string): Resolved {
  const { name, range, subpath } = parseNpmSpecifier(specifier);
  const major = /^[\^~=v]*(\d+)/.exec(range)?.[1];
  if (name === "zod" && subpath === "" && (!major || major === "4")) {
    return { path: "zod", namespace: EMBEDDED };
  }
  const dir = importerDir(importer);
  const path = resolveNpmSpecifier(specifier, dir);
  if (path === undefined) {
    throw new Error(
      `Cannot find package "npm:${specifier}" imported from ${importer}: the vf binary embeds ` +
        `only vf and zod; install it in a node_modules folder above the module ` +
        `(e.g. deno install with "nodeModulesDir": "auto")`,
    );
  }
  return { path };
}

/**
 * Registers the import rules once; does nothing when not running under Bun.
 * @param vf the namespace of vf's own `mod.ts`, served to environments that import it
 */
export function registerBunImports(vf: Record<string, unknown>): void {
  const bun = (globalThis as unknown as { Bun?: BunPlugins }).Bun;
  if (registered || bun === undefined) return;
  registered = true;
  modules.vf = vf;
  bun.plugin({
    name: "vf-imports",
    setup(build) {
      build.onResolve(
        { filter: /.*/, namespace: "npm" },
        ({ path, importer }) => resolveNpm(path, importer),
      );
      build.onResolve({ filter: /(^|[/\\])mod\.ts$/ }, ({ path, importer }) => {
        if (!importer) return undefined;
        const target = path.startsWith("file:")
          ? fileURLToPath(path)
          : isAbsolute(path)
          ? path
          : resolve(importerDir(importer), path);
        return isVfRoot(dirname(target)) ? { path: "vf", namespace: EMBEDDED } : undefined;
      });
      build.onLoad({ filter: /.*/, namespace: EMBEDDED }, ({ path }) => ({
        exports: modules[path],
        loader: "object",
      }));
    },
  });
}
