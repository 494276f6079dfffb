/**
 * `vf cache stats|clear`: the model-call cache's size, or empty it.
 * @module
 */
import process from "node:process";
import { existsSync } from "node:fs";
import { ConfigError } from "../errors.ts";
import { terminalText } from "../util/terminal.ts";
import { defaultCachePath, ModelCache } from "../model/cache.ts";
import { parseArgs } from "./args.ts";

const CACHE_HELP = `vf cache stats|clear [--path <db>]

The model-call cache (vf eval/run --cache, or [client] cache = true): stats prints its entries,
size and entries per model; clear empties it. The database is --path, else $VF_CACHE_DB, else
~/.cache/vf/model-cache.sqlite.
`;

export async function cmdCache(argv: string[]): Promise<number> {
  const flags = parseArgs(argv);
  if (flags.help || flags.h) {
    process.stdout.write(CACHE_HELP);
    return 0;
  }
  const action = String(flags._[0] ?? "");
  if (action !== "stats" && action !== "clear") {
    throw new ConfigError(`vf cache needs stats or clear; usage: ${CACHE_HELP.split("\n")[0]}`);
  }
  const path = typeof flags.path === "string" ? flags.path : defaultCachePath();
  if (!existsSync(path)) {
    process.stdout.write(`no model cache at ${terminalText(path)}\n`);
    return 0;
  }
  const cache = await ModelCache.open(path);
  if (!cache) return 1;
  try {
    if (action === "clear") {
      process.stdout.write(
        `removed ${cache.clear()} cached responses from ${terminalText(path)}\n`,
      );
      return 0;
    }
    const s = cache.stats();
    process.stdout.write(
      `${terminalText(path)}: ${s.entries} cached response${s.entries === 1 ? "" : "s"}, ${
        (s.bytes / 1024).toFixed(1)
      } KiB\n`,
    );
    for (const [model, n] of Object.entries(s.models).sort((a, b) => b[1] - a[1])) {
      process.stdout.write(`  ${terminalText(model)}: ${n}\n`);
    }
    return 0;
  } finally {
    cache.close();
  }
}
