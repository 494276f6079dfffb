/**
 * Builds the single `vf` binary with Bun's bundler; run by `scripts/compile.ts` as
 * `bun scripts/_bun_build.ts <outfile> [--no-bytecode]` from the project root, after Deno has
 * filled `node_modules`. Bun does not know `npm:` specifiers, so a plugin resolves them to the
 * installed packages (by path, which also keeps Bun from swapping in its `undici` shim). The
 * math worker is a second entrypoint: a compiled binary can only start workers it embeds.
 * @module
 */
import { existsSync, statSync } from "node:fs";
import { dirname, resolve } from "node:path";
import process from "node:process";
import { resolveNpmSpecifier } from "../lib/legacy/_npm_resolve.ts";

interface BuildArtifact {
  path: string;
  kind: string;
}
interface BunBuild {
  build(options: Record<string, unknown>): Promise<
    { success: boolean; logs: unknown[]; outputs: BuildArtifact[] }
  >;
}
interface PluginBuilder {
  onResolve(
    options: { filter: RegExp },
    callback: (
      args: { path: string; importer: string },
    ) => { path: string; external?: boolean } | undefined,
  ): void;
}

const bun = (globalThis as unknown as { Bun?: BunBuild }).Bun;
if (bun === undefined) {
  throw new Error("scripts/_bun_build.ts runs under Bun: bun scripts/_bun_build.ts");
}

const root = resolve(import.meta.dirname!, "..");
const args = process.argv.slice(2);
const outfile = resolve(args.find((a) => !a.startsWith("--")) ?? "dist/vf");

const npmSpecifiers = {
  name: "npm-specifiers",
  setup(build: PluginBuilder) {
    build.onResolve({ filter: /^npm:/ }, ({ path, importer }) => {
      const found = resolveNpmSpecifier(path, root);
      if (found === undefined) {
        throw new Error(
          `Cannot resolve "${path}" imported by ${importer}: not in ${root}/node_modules; run deno install`,
        );
      }
      return { path: found };
    });
    // Deno skips npm build scripts, so optional native addons were never built (ssh2's
    // cpu-features). Left external, they fail to load at run time inside the try/catch
    // their users wrap them in, as under Deno.
    build.onResolve({ filter: /\.node$/ }, ({ path, importer }) => {
      if (existsSync(resolve(dirname(importer), path))) return undefined;
      return { path, external: true };
    });
  },
};

const result = await bun.build({
  entrypoints: [
    resolve(root, "cli.ts"),
    resolve(root, "lib/scoring/_math_worker.ts"),
    resolve(root, "lib/model/_http1_worker.ts"),
  ],
  // Paths inside the binary are relative to the project root: lib/scoring/math_verify.ts starts the
  // worker as `./lib/scoring/_math_worker.ts`, lib/model/http1_thread.ts its own as
  // `./lib/model/_http1_worker.ts`.
  root,
  target: "bun",
  format: "esm",
  // Without splitting, modules reached only through `import()` (vf's whole mod.ts, for local
  // environments) are evaluated at startup: 250 ms instead of 30 ms for `vf --help`.
  splitting: true,
  // Identifiers stay: error classes name themselves with `new.target.name` and rubrics name
  // metrics after their functions, and results record both. Bun 1.4.5 ignores `keepNames`
  // and still renames a top-level name that two modules share (`Foo` → `Foo2`);
  // tests/binary_test.ts checks the names in results.
  minify: { whitespace: true, syntax: true, identifiers: false },
  bytecode: !args.includes("--no-bytecode"),
  plugins: [npmSpecifiers],
  // Like `deno run`, the binary reads no .env or bunfig.toml from the working directory. It
  // does read package.json files: without them a module loaded from disk (a local
  // environment) cannot import packages from a node_modules folder.
  compile: { outfile, autoloadDotenv: false, autoloadBunfig: false, autoloadPackageJson: true },
});
for (const log of result.logs) console.error(log);
if (!result.success) process.exit(1);
console.log(`built ${outfile} (${(statSync(outfile).size / 1e6).toFixed(1)} MB)`);
