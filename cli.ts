#!/usr/bin/env -S deno run -A
/**
 * The `vf` command line: a dispatcher of the commands in `lib/cli/` (one file each).
 * @module
 */
import process from "node:process";
import { BUILTINS } from "./environments/mod.ts";
import { setAppHandlesSignals, stopAllRuntimes } from "./runtimes/registry.ts";
import { ConfigError, describeError } from "./lib/errors.ts";
import { VERSION } from "./lib/version.ts";
import { terminalLines, terminalText } from "./lib/util/terminal.ts";
import { cmdCache } from "./lib/cli/cache.ts";
import { cmdCleanup } from "./lib/cli/cleanup.ts";
import { cmdCompare } from "./lib/cli/compare.ts";
import { cmdDemo } from "./lib/cli/demo.ts";
import { cmdEval } from "./lib/cli/eval.ts";
import { cmdExport, cmdImport } from "./lib/cli/exchange.ts";
import { cmdCtl } from "./lib/cli/ctl.ts";
import { cmdInit } from "./lib/cli/init.ts";
import { cmdReplay } from "./lib/cli/replay.ts";
import { cmdRun } from "./lib/cli/run.ts";
import { cmdServe } from "./lib/cli/serve.ts";
import { cmdValidate } from "./lib/cli/validate.ts";
import { cmdView } from "./lib/cli/view.ts";
import { registerBunImports } from "./lib/legacy/_bun_imports.ts";
import * as vf from "./mod.ts";

const HELP = `vf ${VERSION}: build, share and run LLM evaluation environments

Usage:
  vf eval <env> [options]        evaluate a model on an environment
  vf eval @ <config.toml> [opts] evaluate from a TOML config (flags override it)
  vf run <taskset> [options]     run an agent on sandboxed tasks (see vf run --help)
  vf validate <taskset> [-n N]   check gold answers score 1.0 and untouched workspaces 0.0
  vf cleanup [--run ID] [--older-than 1h] [--force] [--images]  remove sandboxes of ended runs
  vf view [outputs-dir] [--port N]  browse runs in a local web page
  vf replay <run-dir>            re-run a vf eval run offline from its record (same rewards)
  vf rescore <run-dir>           re-apply the current rubric to a run's saved completions
  vf cache stats|clear           the model-call cache (vf eval/run --cache)
  vf compare <runA> <runB> [--fail-if-worse D]  paired per-example comparison of two runs
  vf export --format atif <run-dir>      write a run's rollouts as ATIF trajectories
  vf export --format messages|sharegpt <run-dir> [--success]  fine-tuning JSONL of a run
  vf import --format harbor <job-dir>    read a Harbor job's trials into vf's run layout
  vf ctl [run_id] status|pause [--now]|resume|requeue|set K=N|list  steer a vf eval/run
  vf init <name> [--kind taskset|environment]  scaffold an environment package
  vf demo [env]                  evaluate a built-in environment against vf's scripted
                                 local demo model (no API key, no network)
  vf serve <env> [--port 8123]   serve an environment over HTTP to trainers and evaluators
                                 (vf eval <env> --server <url>; see vf serve --help)
  vf --help | vf <command> --help
  vf --version

Environments: ${Object.keys(BUILTINS).join(", ")}, or a path to a module exporting
loadEnvironment(args) (a folder means its mod.ts).
`;

/** Run the CLI; returns the exit code. */
export async function main(argv: string[]): Promise<number> {
  const [command, ...rest] = argv;
  try {
    switch (command) {
      case undefined:
      case "-h":
      case "--help":
      case "help":
        process.stdout.write(HELP);
        return 0;
      case "-V":
      case "--version":
      case "version":
        process.stdout.write(`vf ${VERSION}\n`);
        return 0;
      case "eval":
        return await cmdEval(rest);
      case "demo":
        return await cmdDemo(rest);
      case "run":
        return await cmdRun(rest);
      case "validate":
        return await cmdValidate(rest);
      case "cleanup":
        return await cmdCleanup(rest);
      case "init":
        return await cmdInit(rest);
      case "serve":
        return await cmdServe(rest);
      case "cache":
        return await cmdCache(rest);
      case "compare":
        return await cmdCompare(rest);
      case "view":
        return await cmdView(rest);
      case "replay":
        return await cmdReplay(rest, "replay");
      case "rescore":
        return await cmdReplay(rest, "rescore");
      case "export":
        return await cmdExport(rest);
      case "import":
        return await cmdImport(rest);
      case "ctl":
        return await cmdCtl(rest);
      default:
        process.stderr.write(`error: unknown command "${terminalText(command)}"; run vf --help\n`);
        return 2;
    }
  } catch (error) {
    const verbose = argv.includes("-v") || argv.includes("--verbose");
    // A message may quote a run's files or a sandbox's output: no terminal escapes.
    process.stderr.write(
      `error: ${
        terminalLines(error instanceof ConfigError ? error.message : describeError(error))
      }\n`,
    );
    if (verbose && error instanceof Error && error.stack) {
      process.stderr.write(terminalLines(error.stack) + "\n");
    }
    return 1;
  }
}

/**
 * Warnings and errors quote what vf was given (a Harbor task folder's name, a program's tool
 * name, a key of a downloaded config): a terminal gets them as text, never as escapes.
 */
function inertConsole(): void {
  for (const name of ["warn", "error"] as const) {
    const print = console[name].bind(console);
    console[name] = (...args: unknown[]) =>
      print(
        ...args.map((a) =>
          typeof a === "string"
            ? terminalLines(a)
            : a instanceof Error
            ? terminalLines(a.stack ?? String(a))
            : a
        ),
      );
  }
}

if (import.meta.main) {
  inertConsole();
  // The CLI handles SIGINT/SIGTERM: it aborts the run, keeps finished results and stops
  // its sandboxes; the runtime registry still cleans up at exit.
  setAppHandlesSignals(true);
  // Under Bun (the compiled binary), environments loaded from disk that import vf's mod.ts
  // get this program's copy: one set of classes.
  registerBunImports(vf);
  const code = await main(process.argv.slice(2));
  await stopAllRuntimes({ timeoutMs: 15_000 });
  process.exit(code);
}
