/**
 * Images built from a folder with a Dockerfile through the Engine API (`POST /build`): the
 * folder goes to the engine as a tar, the image is tagged by the content's hash, and a tag
 * already present is not built again.
 * @module
 */
import { createHash } from "node:crypto";
import { lstat, mkdir, open, readdir, readFile, realpath, stat } from "node:fs/promises";
import { homedir } from "node:os";
import { join, relative, sep } from "node:path";
import process from "node:process";
import { DockerEngine } from "../../runtimes/docker/engine_api.ts";
import { excludeMatcher, packTar, type TarEntry } from "../../runtimes/_tar.ts";
import { ConfigError } from "../errors.ts";

/**
 * The `.dockerignore` of a context as a predicate on `/`-separated paths relative to it:
 * patterns are anchored at the context's root, `**` spans folders, `!` re-includes, the last
 * matching line wins, `#` starts a comment. The Dockerfile and `.dockerignore` always go.
 */
export async function dockerignore(dir: string): Promise<(path: string) => boolean> {
  const text = await readFile(join(dir, ".dockerignore"), "utf8").catch(() => "");
  const rules = text.split("\n").map((l) => l.trim()).filter((l) => l && !l.startsWith("#"))
    .map((line) => {
      const negate = line.startsWith("!");
      const pattern = line.replace(/^!/, "").replace(/^\.?\//, "").replace(/\/$/, "");
      return { negate, match: excludeMatcher([`/${pattern}`]) };
    });
  return (path) => {
    if (path === "Dockerfile" || path === ".dockerignore") return false;
    let ignored = false;
    for (const r of rules) if (r.match(path)) ignored = !r.negate;
    return ignored;
  };
}

/** Whether `path` is `root` or below it (both real paths). */
function inside(root: string, path: string): boolean {
  return path === root || path.startsWith(root.endsWith(sep) ? root : root + sep);
}

/**
 * The files under `dir` as tar entries, sorted and with a fixed mtime, so the same folder
 * gives the same archive; names are relative to `dir` (under `prefix/` when given), `.git`
 * and what `ignore` accepts are left out. Symlinks are followed only while they stay within
 * `root` (default `dir`), and `dir` itself must be there: a task folder cannot reach the
 * evaluator's other files (`tests/key -> ~/.ssh/id_rsa`). A folder met twice (a link loop)
 * is walked once.
 * @throws {ConfigError} naming a path that leaves `root` through a symlink
 */
export async function folderEntries(
  dir: string,
  options: { prefix?: string; ignore?: (path: string) => boolean; root?: string } = {},
): Promise<TarEntry[]> {
  const out: TarEntry[] = [];
  const root = await realpath(options.root ?? dir);
  const escape = (path: string, real: string) =>
    new ConfigError(
      `"${path}" leads outside "${options.root ?? dir}" through a symlink (to "${real}"); ` +
        `copy the file into the task folder instead`,
    );
  const realDir = await realpath(dir);
  if (!inside(root, realDir)) throw escape(dir, realDir);
  const walked = new Set<string>([realDir]);
  const walk = async (path: string) => {
    for (const name of (await readdir(path)).sort()) {
      if (name === ".git") continue;
      const full = join(path, name);
      const rel = relative(dir, full).split("\\").join("/");
      if (options.ignore?.(rel)) continue;
      if ((await lstat(full)).isSymbolicLink()) {
        const real = await realpath(full).catch(() => null);
        if (real === null) continue; // a dangling link: nothing to copy
        if (!inside(root, real)) throw escape(full, real);
      }
      const info = await stat(full);
      const entryName = options.prefix ? `${options.prefix}/${rel}` : rel;
      if (info.isDirectory()) {
        const real = await realpath(full);
        if (walked.has(real)) continue;
        walked.add(real);
        out.push({ name: entryName, type: "directory", mode: info.mode & 0o777, mtime: 0 });
        await walk(full);
      } else if (info.isFile()) {
        out.push({
          name: entryName,
          type: "file",
          data: new Uint8Array(await readFile(full)),
          mode: info.mode & 0o777,
          mtime: 0,
        });
      }
    }
  };
  await walk(dir);
  return out;
}

/**
 * Build the image of a folder (its `Dockerfile`, or `dockerfile`) unless an image of the
 * same content is already there; returns its tag, `vf-build-<name>:<content hash>`.
 * @throws {SandboxImageError} when the build fails (with its last output)
 */
export async function buildImage(
  name: string,
  context: string,
  options: {
    dockerfile?: string;
    signal?: AbortSignal;
    /** Where the build log goes; default {@link buildLogDir}. */
    logDir?: string;
    /** The folder symlinks in the context may lead to; default the context itself. */
    root?: string;
  } = {},
): Promise<string> {
  const entries = await folderEntries(context, {
    ignore: await dockerignore(context),
    root: options.root,
  });
  const hash = createHash("sha256");
  hash.update(options.dockerfile ?? "Dockerfile");
  for (const e of entries) {
    hash.update(`${e.type}\0${e.name}\0${e.mode}\0`);
    if (e.data) hash.update(e.data);
  }
  const tag = `vf-build-${name.toLowerCase().replace(/[^a-z0-9_.-]/g, "-")}:${
    hash.digest("hex").slice(0, 16)
  }`;
  const engine = DockerEngine.shared();
  if (await engine.inspectImage(tag)) return tag;
  // The build's output goes to a log file as it arrives; progress gets a line at each end.
  const logDir = options.logDir ?? buildLogDir();
  await mkdir(logDir, { recursive: true });
  const logPath = join(logDir, `${tag.replace(/[:/]/g, "-")}.log`);
  const log = await open(logPath, "w");
  const started = performance.now();
  process.stderr.write(`building image ${tag} (log: ${logPath})\n`);
  let writes = Promise.resolve();
  try {
    await engine.buildImage(packTar(entries), {
      tag,
      dockerfile: options.dockerfile,
      labels: { "vf.managed": "1" },
      signal: options.signal,
      onLog: (line) => {
        writes = writes.then(() => log.write(`${line}\n`)).then(() => {});
      },
    });
  } catch (error) {
    if (error instanceof Error && !options.signal?.aborted) {
      error.message += `\n(full build log: ${logPath})`;
    }
    throw error;
  } finally {
    await writes.catch(() => {});
    await log.close();
  }
  process.stderr.write(
    `built image ${tag} in ${((performance.now() - started) / 1000).toFixed(1)}s\n`,
  );
  return tag;
}

/** Where build logs go: `$VF_BUILD_LOGS`, else `~/.cache/vf/builds` (or under `$XDG_CACHE_HOME`). */
export function buildLogDir(env: Record<string, string | undefined> = process.env): string {
  if (env.VF_BUILD_LOGS) return env.VF_BUILD_LOGS;
  return join(env.XDG_CACHE_HOME || join(env.HOME || homedir(), ".cache"), "vf", "builds");
}

/**
 * Remove the dangling images vf's builds left (an older build whose tag moved on); images
 * that still have a tag, or that a container uses, stay.
 * @returns the removed image ids
 */
export async function removeDanglingBuilds(): Promise<string[]> {
  const engine = DockerEngine.shared();
  const images = await engine.listImages({ dangling: ["true"], label: ["vf.managed=1"] });
  const removed: string[] = [];
  for (const image of images) {
    // In use by a container (even a stopped one): the engine refuses, and it stays.
    if (await engine.removeImage(image.Id).catch(() => false)) removed.push(image.Id);
  }
  return removed;
}
