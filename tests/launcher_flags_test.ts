/**
 * The V8 flags vf runs with: `deno task vf` (and `demo`), the `compile:deno` binary and the
 * launcher scripts/install.sh writes all give V8 a young generation of 64 MiB semi-spaces
 * (docs/benchmarks.md: at hundreds of rollouts in flight the default one is collected so
 * often that copying the live rollouts is a tenth of the run's CPU). The task's own command
 * line is run on a probe that reports V8's heap limit, which the flag raises.
 * @module
 */
import assert from "node:assert/strict";
import { join } from "node:path";

const ROOT = new URL("..", import.meta.url).pathname;
const FLAG = "--v8-flags=--max-semi-space-size=64";
const PROBE = 'import v8 from "node:v8"; console.log(v8.getHeapStatistics().heap_size_limit);';

async function tasks(): Promise<Record<string, string>> {
  return JSON.parse(await Deno.readTextFile(join(ROOT, "deno.json"))).tasks;
}

/** V8's heap limit in a `deno` started with `args` before the probe script. */
async function heapLimit(args: string[], probe: string): Promise<number> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: [...args, probe],
    stdout: "piped",
    stderr: "piped",
  }).output();
  const text = new TextDecoder().decode(out.stdout).trim();
  assert.ok(out.success, new TextDecoder().decode(out.stderr));
  return Number(text);
}

Deno.test("deno task vf runs cli.ts with 64 MiB semi-spaces: the task's command line raises V8's heap limit by the young generation's growth", async () => {
  const vf = (await tasks()).vf;
  // "deno install -q && deno run -A <flags> cli.ts": the run's arguments, cli.ts swapped for a probe.
  const run = vf.split("&&").at(-1)!.trim().split(/\s+/);
  assert.equal(run[0], "deno");
  assert.equal(run.at(-1), "cli.ts");
  assert.ok(run.includes(FLAG), vf);
  const dir = await Deno.makeTempDir({ prefix: "vf_launcher_" });
  try {
    const probe = join(dir, "probe.ts");
    await Deno.writeTextFile(probe, PROBE);
    const withTask = await heapLimit(run.slice(1, -1), probe);
    const plain = await heapLimit(["run", "-A"], probe);
    // Two semi-spaces of 64 MiB instead of 16: 96 MiB more young generation.
    assert.equal((withTask - plain) / 2 ** 20, 96, `task ${withTask}, plain ${plain}`);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("deno task demo, compile:deno and the installed launcher pass the same V8 flags as deno task vf", async () => {
  const t = await tasks();
  assert.ok(t.demo.includes(`deno run -A ${FLAG} cli.ts demo`), t.demo);
  // deno compile bakes the flags into the binary.
  assert.ok(t["compile:deno"].includes(`deno compile -A ${FLAG} `), t["compile:deno"]);
  const install = await Deno.readTextFile(join(ROOT, "scripts/install.sh"));
  assert.match(install, new RegExp(`printf 'exec %s run -A ${FLAG} %s "\\$@"`));
});
