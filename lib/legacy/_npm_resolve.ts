/**
 * Resolves Deno's `npm:pkg@range/subpath` specifiers to files in `node_modules` for Bun, which
 * does not know them: used by the bundler plugin that builds the `vf` binary
 * (`scripts/_bun_build.ts`) and by the binary itself for environment modules loaded from disk
 * (`lib/legacy/_bun_imports.ts`). Runs only under Bun.
 * @module
 */
import { existsSync } from "node:fs";
import { dirname, isAbsolute, join } from "node:path";

/** The parts of an `npm:` specifier. */
export interface NpmSpecifier {
  /** Package name, with its scope: `zod`, `@huggingface/hub`. */
  name: string;
  /** Version range as written, `""` when none: `^4.6.0`. */
  range: string;
  /** Path inside the package with its leading slash, `""` for the package itself. */
  subpath: string;
}

/** Splits `npm:name@range/subpath` (the `npm:` prefix and a leading `/` are optional). */
export function parseNpmSpecifier(specifier: string): NpmSpecifier {
  const m = /^(?:npm:)?\/?((?:@[^/@]+\/)?[^/@]+)(?:@([^/]*))?(\/.*)?$/.exec(specifier);
  if (!m) throw new TypeError(`Invalid npm specifier "${specifier}"`);
  return { name: m[1], range: m[2] ?? "", subpath: m[3] ?? "" };
}

interface BunResolver {
  resolveSync(specifier: string, from: string): string;
}

/**
 * The file `specifier` names, found in the `node_modules` folders at or above `fromDir` with
 * Bun's resolver (so `exports` conditions are honoured), or `undefined` when the package is
 * not installed there.
 */
export function resolveNpmSpecifier(specifier: string, fromDir: string): string | undefined {
  const bun = (globalThis as unknown as { Bun: BunResolver }).Bun;
  const { name, subpath } = parseNpmSpecifier(specifier);
  try {
    const path = bun.resolveSync(name + subpath, fromDir);
    if (isAbsolute(path)) return path;
  } catch {
    // Not installed here, or a subpath the package does not export: try by folder below.
  }
  // Bun answers some bare names (`undici`, `ws`) with its own built-in shims, which lack what
  // vf needs (undici's `socketPath`): naming the installed folder by path gets the real package.
  for (let dir = fromDir;; dir = dirname(dir)) {
    const folder = join(dir, "node_modules", name);
    if (existsSync(folder)) {
      try {
        return bun.resolveSync(folder + subpath, dir);
      } catch {
        return undefined;
      }
    }
    if (dirname(dir) === dir) return undefined;
  }
}
