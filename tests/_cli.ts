/**
 * `deno` and the vf CLI as child processes of a test: a clean environment
 * (tests/_child_env.ts), stdin closed, stderr piped, the output collected as text.
 *
 * ```ts
 * await using tmp = await tempDir("vf_example_");
 * const res = await runCli(["--version"], { cwd: tmp.path, registry: false });
 * assert.equal(res.code, 0, transcript(res));
 * ```
 * @module
 */
import { fileURLToPath } from "node:url";
import { childEnv, type ChildEnvOptions } from "./_child_env.ts";

/** The CLI's entry point in this checkout. */
export const CLI = fileURLToPath(new URL("../cli.ts", import.meta.url));

/** vf's `mod.ts` as a URL: what the packages tests write for the CLI import. */
export const MOD_URL = new URL("../mod.ts", import.meta.url).href;

/** How a child ended and what it printed. */
export interface CliResult {
  code: number;
  stdout: string;
  stderr: string;
}

/** A child `deno`; what it inherits from this process is set by {@link ChildEnvOptions}. */
export interface DenoOptions extends ChildEnvOptions {
  /** The child's working directory. */
  cwd: string;
  /** Variables set in the child; they win over inherited ones. Default none. */
  env?: Record<string, string>;
  /** `"null"` discards the child's stdout. Default `"piped"`. */
  stdout?: "piped" | "null";
}

/** A child `deno run -A … cli.ts`. */
export interface CliOptions extends DenoOptions {
  /** Flags for `deno run`, placed before the CLI's path (e.g. `--lock=…`). Default none. */
  denoFlags?: string[];
}

/** `deno <args>`, ready to `.spawn()` or `.output()`. */
export function denoCommand(args: string[], options: DenoOptions): Deno.Command {
  return new Deno.Command(Deno.execPath(), {
    args,
    cwd: options.cwd,
    env: childEnv(options.env, options),
    clearEnv: true,
    stdin: "null",
    stdout: options.stdout ?? "piped",
    stderr: "piped",
  });
}

/** `deno run -A <denoFlags> cli.ts <args>`, ready to `.spawn()` or `.output()`. */
export function cliCommand(args: string[], options: CliOptions): Deno.Command {
  return denoCommand(["run", "-A", ...(options.denoFlags ?? []), CLI, ...args], options);
}

const decoder = new TextDecoder();

/** Runs a command (or waits for a spawned child) to the end; its stdout must be piped. */
export async function collect(child: Deno.Command | Deno.ChildProcess): Promise<CliResult> {
  const out = await child.output();
  return { code: out.code, stdout: decoder.decode(out.stdout), stderr: decoder.decode(out.stderr) };
}

/** Runs `deno <args>` to the end. */
export function runDeno(args: string[], options: DenoOptions): Promise<CliResult> {
  return collect(denoCommand(args, options));
}

/** Runs `vf <args>` (the CLI from source) to the end. */
export function runCli(args: string[], options: CliOptions): Promise<CliResult> {
  return collect(cliCommand(args, options));
}

/** The exit code and everything a child printed, for assertion messages. */
export function transcript(res: CliResult): string {
  return `exit ${res.code}\n--- stdout\n${res.stdout}\n--- stderr\n${res.stderr}`;
}

/** A temp dir removed with all its content on dispose (`await using`). */
export interface TempDir extends AsyncDisposable {
  path: string;
}

/** Makes a temp dir whose name starts with `prefix`. */
export async function tempDir(prefix: string): Promise<TempDir> {
  const path = await Deno.makeTempDir({ prefix });
  return { path, [Symbol.asyncDispose]: () => Deno.remove(path, { recursive: true }) };
}
