/**
 * Start-up: wall time of `vf --help` from a fresh process, `deno run -A cli.ts --help`
 * against the compiled binary `dist/vf --help` (built with `deno task compile` when
 * missing). Both run interleaved, after warm-up runs (page cache and Deno's module cache
 * warm: what a user sees from the second run on); median of `--runs` each. When `hyperfine`
 * is on PATH it measures the same two commands as a cross-check.
 *
 * `deno run -A bench/startup.ts [--runs 10]`
 * @module
 */
import process from "node:process";
import { fileURLToPath } from "node:url";

function flag(name: string, fallback: string): string {
  const args = process.argv.slice(2);
  const i = args.indexOf(`--${name}`);
  return i >= 0 && i + 1 < args.length ? args[i + 1] : fallback;
}

const RUNS = Number(flag("runs", "10"));
const ROOT = fileURLToPath(new URL("..", import.meta.url));
const BINARY = `${ROOT}dist/vf`;

async function exists(path: string): Promise<boolean> {
  return await Deno.stat(path).then(() => true, () => false);
}

async function run(cmd: string, args: string[]): Promise<number> {
  const t0 = performance.now();
  const out = await new Deno.Command(cmd, { args, cwd: ROOT, stdout: "piped", stderr: "piped" })
    .output();
  const ms = performance.now() - t0;
  if (!out.success) {
    throw new Error(
      `${cmd} ${args.join(" ")} exited ${out.code}: ${new TextDecoder().decode(out.stderr)}`,
    );
  }
  return ms;
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
}

if (!(await exists(BINARY))) {
  console.error("dist/vf is missing; building it with `deno task compile`");
  await run(Deno.execPath(), ["task", "compile"]);
}

const commands: Array<[string, string, string[]]> = [
  ["deno run -A cli.ts --help", Deno.execPath(), ["run", "-A", "cli.ts", "--help"]],
  ["dist/vf --help", BINARY, ["--help"]],
];
for (const [, cmd, args] of commands) for (let i = 0; i < 2; i++) await run(cmd, args);
const times: number[][] = commands.map(() => []);
for (let i = 0; i < RUNS; i++) {
  for (const [k, [, cmd, args]] of commands.entries()) times[k].push(await run(cmd, args));
}

const stat = await Deno.stat(BINARY);
const load = Deno.loadavg().map((x) => x.toFixed(1)).join(", ");
const lines = [
  `${navigator.hardwareConcurrency} cores, load average ${load}; Deno ${Deno.version.deno}; ` +
  `dist/vf ${(stat.size / 2 ** 20).toFixed(0)} MiB built ${stat.mtime?.toISOString()}; ` +
  `${RUNS} interleaved runs each after 2 warm-up runs.`,
  "",
  "| command | median ms | min ms | max ms |",
  "| --- | ---: | ---: | ---: |",
];
for (const [k, [name]] of commands.entries()) {
  lines.push(
    `| \`${name}\` | ${median(times[k]).toFixed(0)} | ${Math.min(...times[k]).toFixed(0)} | ${
      Math.max(...times[k]).toFixed(0)
    } |`,
  );
}
lines.push(`| ratio binary / deno run | ${(median(times[1]) / median(times[0])).toFixed(2)} | | |`);

const hyperfine = await new Deno.Command("hyperfine", { args: ["--version"], stdout: "piped" })
  .output().then((o) => o.success, () => false);
if (hyperfine) {
  const json = await Deno.makeTempFile({ suffix: ".json" });
  const out = await new Deno.Command("hyperfine", {
    args: [
      "-N",
      "--warmup",
      "2",
      "--runs",
      String(RUNS),
      "--export-json",
      json,
      ...commands.map(([, cmd, args]) => [cmd, ...args].join(" ")),
    ],
    cwd: ROOT,
    stdout: "null",
    stderr: "piped",
  }).output();
  if (out.success) {
    const results = JSON.parse(await Deno.readTextFile(json)).results as Array<
      { median: number; mean: number; stddev: number }
    >;
    lines.push(
      "",
      "hyperfine cross-check (not interleaved):",
      "",
      "| command | median ms | mean ± σ ms |",
      "| --- | ---: | ---: |",
      ...results.map((r, k) =>
        `| \`${commands[k][0]}\` | ${(r.median * 1000).toFixed(0)} | ${
          (r.mean * 1000).toFixed(0)
        } ± ${(r.stddev * 1000).toFixed(0)} |`
      ),
    );
  }
  await Deno.remove(json).catch(() => {});
}
console.log(lines.join("\n"));
