/**
 * `deno task compile [outfile]`: builds the single `vf` binary (default `dist/vf`) with
 * `bun build --compile`, which works offline (`deno compile` downloads its runtime; see the
 * `compile:deno` task). Steps: `deno install` fills `node_modules` (`"nodeModulesDir": "manual"`); a Bun
 * is found on PATH or installed from npm into `.tools/bun` (never a project dependency);
 * Bun runs `scripts/_bun_build.ts`, which maps `npm:` specifiers to `node_modules`.
 * @module
 */
import { existsSync } from "node:fs";
import { rename, rm, stat } from "node:fs/promises";
import { join, resolve } from "node:path";

const ROOT = resolve(import.meta.dirname!, "..");
/** The Bun release line the binary is built and tested with. */
const BUN_RANGE = "1.4.x";
const LOCAL_BUN = join(ROOT, ".tools/bun/node_modules/.bin/bun");

async function run(cmd: string, args: string[], what: string): Promise<string> {
  let out: Deno.CommandOutput;
  try {
    out = await new Deno.Command(cmd, { args, cwd: ROOT, stdout: "piped", stderr: "inherit" })
      .output();
  } catch (error) {
    throw new Error(`Cannot ${what}: "${cmd}" did not start (${(error as Error).message})`);
  }
  const stdout = new TextDecoder().decode(out.stdout);
  if (!out.success) {
    throw new Error(
      `Cannot ${what}: "${cmd} ${args.join(" ")}" exited with ${out.code}\n${stdout}`,
    );
  }
  return stdout;
}

/** The version `bun --version` prints, or undefined when it does not run. */
async function bunVersion(bun: string): Promise<string | undefined> {
  try {
    const out = await new Deno.Command(bun, {
      args: ["--version"],
      stdout: "piped",
      stderr: "null",
    })
      .output();
    return out.success ? new TextDecoder().decode(out.stdout).trim() : undefined;
  } catch {
    return undefined;
  }
}

/** `bun` from PATH when it is 1.4 or newer, else the one in `.tools/bun` (installed if needed). */
async function findBun(): Promise<string> {
  const onPath = await bunVersion("bun");
  const [major, minor] = (onPath ?? "0.0").split(".").map(Number);
  if (major > 1 || (major === 1 && minor >= 4)) return "bun";
  if (await bunVersion(LOCAL_BUN) === undefined) {
    console.error(`installing bun@${BUN_RANGE} into .tools/bun (npm)`);
    await run(
      "npm",
      [
        "install",
        "--prefix",
        join(ROOT, ".tools/bun"),
        "--no-audit",
        "--no-fund",
        `bun@${BUN_RANGE}`,
      ],
      `install bun@${BUN_RANGE}; install npm, or put bun 1.4+ on PATH`,
    );
  }
  if (await bunVersion(LOCAL_BUN) !== undefined) return LOCAL_BUN;
  // The package's postinstall moves the platform binary into place; where npm did not run it,
  // the binary is still in the platform package.
  const oven = join(ROOT, ".tools/bun/node_modules/@oven");
  for (const entry of existsSync(oven) ? Deno.readDirSync(oven) : []) {
    const bun = join(oven, entry.name, "bin/bun");
    if (await bunVersion(bun) !== undefined) return bun;
  }
  throw new Error(`Cannot run "${LOCAL_BUN}" after npm installed it; put bun 1.4+ on PATH`);
}

/** Builds the binary; returns its path. */
export async function compile(outfile = join(ROOT, "dist/vf")): Promise<string> {
  const start = performance.now();
  // The binary embeds the sandbox host's source (it has no files on disk to run).
  await run(
    Deno.execPath(),
    ["run", "-A", join(ROOT, "scripts/gen_host_source.ts")],
    "embed the sandbox host",
  );
  // Fills node_modules (nodeModulesDir "manual": only deno install writes it) with every
  // package the binary imports.
  await run(Deno.execPath(), [
    "install",
    "--quiet",
    "--entrypoint",
    "cli.ts",
    "lib/scoring/_math_worker.ts",
    "lib/model/_http1_worker.ts",
  ], "fill node_modules");
  const bun = await findBun();
  console.error(`bundling with bun ${await bunVersion(bun)}`);
  // Built beside the target and renamed: a run that is interrupted, or a test suite building
  // at the same time, never leaves a half-written binary at `outfile`.
  const partial = `${outfile}.${Deno.pid}.tmp`;
  try {
    await run(bun, [join(ROOT, "scripts/_bun_build.ts"), partial], "build the binary");
    await rename(partial, outfile);
  } finally {
    await rm(partial, { force: true });
  }
  const { size } = await stat(outfile);
  const seconds = ((performance.now() - start) / 1000).toFixed(1);
  console.log(`built ${outfile}: ${(size / 1e6).toFixed(1)} MB in ${seconds} s`);
  return outfile;
}

if (import.meta.main) {
  const outfile = Deno.args[0];
  if (outfile === "--help" || outfile === "-h") {
    console.log("Usage: deno task compile [outfile]   (default dist/vf)");
  } else {
    try {
      await compile(outfile === undefined ? undefined : resolve(outfile));
    } catch (error) {
      console.error((error as Error).message);
      Deno.exit(1);
    }
  }
}
