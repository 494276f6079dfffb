/**
 * Harbor task folders as a taskset (the format Terminal-Bench and other terminal-agent
 * benchmarks ship): `instruction.md` is the prompt; `task.toml` gives timeouts, cpus, memory
 * and network, and the verifier's env; `environment/Dockerfile` is built into the agent's
 * image (or `[environment] docker_image` names one), and `environment/docker-compose.yaml`
 * adds sidecar services beside it (service `main` is the agent's); `tests/` reaches the sandbox only when
 * grading starts, after the agent is done, as `/tests`, where `test.sh` runs and writes
 * `/logs/verifier/reward.txt` (a number) or `reward.json` (named rewards); `solution/solve.sh`
 * is the gold answer `vf validate` checks.
 *
 * `vf run <folder>` and `vf validate <folder>` take one task folder or a folder of them; TOML
 * `[env.taskset] id = "harbor"` takes `path` and `tasks` (a subset of task names).
 * @module
 */
import { existsSync, readdirSync } from "node:fs";
import { readdir, readFile } from "node:fs/promises";
import { basename, join, resolve } from "node:path";
import process from "node:process";
import { parse as parseToml } from "npm:smol-toml@^1.4.0";
import { ConfigError, TaskError } from "../errors.ts";
import { buildImage, folderEntries } from "../services/build.ts";
import { packTar } from "../../runtimes/_tar.ts";
import {
  readText,
  Task,
  type TaskData,
  type TaskHookContext,
  type TaskScores,
  Taskset,
} from "../tasks/task.ts";
import type { Runtime } from "../../runtimes/runtime.ts";

/** Whether `dir` is a Harbor task folder, or holds some. */
export function isHarborFolder(dir: string): boolean {
  if (!existsSync(dir)) return false;
  if (existsSync(join(dir, "task.toml"))) return true;
  try {
    return readdirSync(dir, { withFileTypes: true }).some((e) =>
      e.isDirectory() && existsSync(join(dir, e.name, "task.toml"))
    );
  } catch {
    return false;
  }
}

const KNOWN: Record<string, string[]> = {
  "": ["version", "metadata", "verifier", "agent", "environment", "solution", "source"],
  verifier: ["timeout_sec", "env", "user"],
  agent: ["timeout_sec", "user"],
  solution: ["env"],
  environment: [
    "build_timeout_sec",
    "docker_image",
    "cpus",
    "memory_mb",
    "memory",
    "storage_mb",
    "storage",
    "allow_internet",
    "gpus",
  ],
};

/**
 * Harbor's defaults where `task.toml` leaves a key out (its `TaskConfig` schema): the verifier
 * and the image build get 600 s; the agent has no limit of its own there.
 */
export const HARBOR_DEFAULTS = { verifierTimeout: 600, buildTimeout: 600 } as const;

/** The settings of one task folder's `task.toml`. */
export interface HarborSettings {
  /** `timeout` in seconds (default {@link HARBOR_DEFAULTS}). */
  verifier: { timeout: number; env: Record<string, string>; user?: string };
  agent: { timeout?: number; user?: string };
  solution: { env: Record<string, string> };
  environment: {
    /** Seconds (default {@link HARBOR_DEFAULTS}). */
    buildTimeout: number;
    image?: string;
    cpus?: number;
    memoryMb?: number;
    internet: boolean;
  };
  /** Keys Harbor has that vf does not read (each is warned about once). */
  unknown: string[];
}

/**
 * A positive number from `task.toml`: a TOML number, or a string that spells one (`"3"`), as
 * Harbor's schema reads it. Missing is undefined.
 * @throws {ConfigError} naming the file and key for anything else
 */
function positive(v: unknown, path: string, key: string): number | undefined {
  if (v === undefined) return undefined;
  const n = typeof v === "number"
    ? v
    : typeof v === "string" && /^\s*(\d+\.?\d*|\.\d+)\s*$/.test(v)
    ? Number(v)
    : NaN;
  if (Number.isFinite(n) && n > 0) return n;
  let shown: string;
  try {
    shown = JSON.stringify(v) ?? String(v);
  } catch {
    shown = String(v);
  }
  const name = key.slice(key.indexOf(".") + 1);
  throw new ConfigError(
    `${path}: ${key}: ${shown.slice(0, 60)} is not a positive number; write one, e.g. ` +
      `${name} = ${name === "cpus" ? 2 : name === "memory_mb" ? 2048 : 600}`,
  );
}

function strMap(v: unknown, at: string): Record<string, string> {
  if (v === undefined) return {};
  if (!v || typeof v !== "object" || Array.isArray(v)) {
    throw new ConfigError(`${at}: expected a table of strings`);
  }
  return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, String(x)]));
}

/**
 * Read a `task.toml`. Keys vf does not know are listed in `unknown` (a warning, not an
 * error); a file that is not TOML is an error naming it.
 * @throws {ConfigError}
 */
export function readHarborSettings(text: string, path: string): HarborSettings {
  let doc: Record<string, unknown>;
  try {
    doc = parseToml(text) as Record<string, unknown>;
  } catch (error) {
    throw new ConfigError(`${path}: not valid TOML: ${(error as Error).message}`);
  }
  const unknown: string[] = [];
  for (const key of Object.keys(doc)) if (!KNOWN[""].includes(key)) unknown.push(key);
  for (const section of ["verifier", "agent", "solution", "environment"]) {
    const table = (doc[section] ?? {}) as Record<string, unknown>;
    for (const key of Object.keys(table)) {
      if (!KNOWN[section].includes(key)) unknown.push(`${section}.${key}`);
    }
  }
  const v = (doc.verifier ?? {}) as Record<string, unknown>;
  const a = (doc.agent ?? {}) as Record<string, unknown>;
  const s = (doc.solution ?? {}) as Record<string, unknown>;
  const e = (doc.environment ?? {}) as Record<string, unknown>;
  const at = (table: Record<string, unknown>, section: string, key: string) =>
    positive(table[key], path, `${section}.${key}`);
  const memory = at(e, "environment", "memory_mb") ??
    (typeof e.memory === "string" && /^\d+[gGmM]$/.test(e.memory)
      ? Number(e.memory.slice(0, -1)) * (/[gG]$/.test(e.memory) ? 1024 : 1)
      : undefined);
  return {
    verifier: {
      timeout: at(v, "verifier", "timeout_sec") ?? HARBOR_DEFAULTS.verifierTimeout,
      env: strMap(v.env, `${path}: verifier.env`),
      user: typeof v.user === "string" ? v.user : undefined,
    },
    agent: {
      timeout: at(a, "agent", "timeout_sec"),
      user: typeof a.user === "string" ? a.user : undefined,
    },
    solution: { env: strMap(s.env, `${path}: solution.env`) },
    environment: {
      buildTimeout: at(e, "environment", "build_timeout_sec") ?? HARBOR_DEFAULTS.buildTimeout,
      image: typeof e.docker_image === "string" ? e.docker_image : undefined,
      cpus: at(e, "environment", "cpus"),
      memoryMb: memory,
      internet: e.allow_internet === true,
    },
    unknown,
  };
}

/** Copy a local folder to `/<name>` in the sandbox, replacing what is there. */
async function stageFolder(runtime: Runtime, dir: string, name: string): Promise<void> {
  const rm = await runtime.run(["rm", "-rf", `/${name}`]);
  if (rm.exit_code !== 0) throw new TaskError(`Cannot clear /${name}: ${rm.stderr.trim()}`);
  const entries = await folderEntries(dir, { prefix: name });
  await runtime.archiveIn("/", packTar([{ name, type: "directory" }, ...entries]));
}

/**
 * Kill whatever the agent left running before the verifier starts: in the agent's own sandbox a
 * leftover process could write the reward file after `test.sh`, or change the tests.
 * @throws {ConfigError} when the runtime cannot (its reward file could not be trusted)
 */
async function killLeftovers(runtime: Runtime, task: string, signal?: AbortSignal): Promise<void> {
  if (!runtime.capabilities.kill_processes || !runtime.killProcesses) {
    throw new ConfigError(
      `Harbor task "${task}": a "${runtime.type}" runtime cannot kill the processes the agent ` +
        `left running (capabilities.kill_processes is false), so a reward file in its sandbox ` +
        `could be the agent's and is not trusted; run Harbor tasks on the docker runtime`,
    );
  }
  await runtime.killProcesses({ signal });
}

/** Run a script with bash when the image has it, else sh. */
function scriptArgv(path: string): string[] {
  return [
    "sh",
    "-c",
    'if command -v bash >/dev/null 2>&1; then exec bash "$0"; else exec sh "$0"; fi',
    path,
  ];
}

/** One Harbor task folder. */
export class HarborTask extends Task {
  static override NEEDS_CONTAINER = true;
  readonly folder: string;
  readonly settings: HarborSettings;

  readonly #sidecars: Record<string, unknown> | null;

  constructor(
    data: TaskData,
    folder: string,
    settings: HarborSettings,
    sidecars: Record<string, unknown> | null = null,
  ) {
    super(data);
    this.folder = folder;
    this.settings = settings;
    this.#sidecars = sidecars;
  }

  /** The sidecars of `environment/docker-compose.yaml` (services other than `main`). */
  override deploymentSpec(): Record<string, unknown> | null {
    return this.#sidecars;
  }

  /**
   * The verifier. First every process the agent left in the sandbox is killed (a daemon could
   * otherwise rewrite the reward or the tests after the verifier); then `tests/` is copied in
   * as `/tests` (never before: the agent is done), `/logs/verifier` is emptied, `test.sh` runs
   * with the verifier's env under its time limit, and the reward is read from
   * `/logs/verifier/reward.txt` or `reward.json`, which only the verifier can have written. No
   * reward file, or a verifier past its limit, is an error, never a 0.
   * @throws {ConfigError} when the runtime cannot kill the agent's processes
   */
  override async score(ctx: TaskHookContext): Promise<TaskScores> {
    const { runtime, trace } = ctx;
    await killLeftovers(runtime, this.key, ctx.signal);
    await stageFolder(runtime, join(this.folder, "tests"), "tests");
    const prep = await runtime.run([
      "sh",
      "-c",
      "rm -rf /logs/verifier && mkdir -p /logs/verifier",
    ]);
    if (prep.exit_code !== 0) throw new TaskError(`Cannot prepare /logs/verifier: ${prep.stderr}`);
    const r = await runtime.run(scriptArgv("/tests/test.sh"), {
      env: this.settings.verifier.env,
      user: this.settings.verifier.user,
      timeoutMs: this.settings.verifier.timeout * 1000,
      signal: ctx.signal,
    });
    trace.info.verifier = {
      exit_code: r.exit_code,
      output: `${r.stdout}${r.stderr}`.slice(-2000),
    };
    const text = await readText(runtime, "/logs/verifier/reward.txt").catch(() => null);
    if (text !== null) {
      const value = Number(text.trim());
      if (!text.trim() || !Number.isFinite(value)) {
        throw new TaskError(
          `/logs/verifier/reward.txt holds "${text.trim().slice(0, 50)}", not a number`,
        );
      }
      return { reward: value, rewards: { reward: value }, metrics: {}, weights: { reward: 1 } };
    }
    const json = await readText(runtime, "/logs/verifier/reward.json").catch(() => null);
    if (json !== null) {
      let parsed: Record<string, unknown>;
      try {
        parsed = JSON.parse(json);
      } catch {
        throw new TaskError(`/logs/verifier/reward.json is not JSON`);
      }
      const rewards: Record<string, number> = {};
      for (const [k, v] of Object.entries(parsed)) {
        if (typeof v !== "number" || !Number.isFinite(v)) {
          throw new TaskError(`/logs/verifier/reward.json: "${k}" is not a number`);
        }
        rewards[k] = v;
      }
      const total = Object.values(rewards).reduce((a, b) => a + b, 0);
      return { reward: total, rewards, metrics: {}, weights: {} };
    }
    throw new TaskError(
      `The verifier (tests/test.sh, exit ${r.exit_code}) wrote no reward: neither ` +
        `/logs/verifier/reward.txt nor reward.json`,
    );
  }

  /** The gold answer: `solution/` copied in as `/solution`, then `solve.sh` runs. */
  override async validate({ runtime, signal }: TaskHookContext): Promise<boolean> {
    const dir = join(this.folder, "solution");
    if (!existsSync(join(dir, "solve.sh"))) {
      throw new ConfigError(`${this.folder}: solution/solve.sh is missing; vf validate needs it`);
    }
    await stageFolder(runtime, dir, "solution");
    const r = await runtime.run(scriptArgv("/solution/solve.sh"), {
      env: this.settings.solution.env,
      signal,
    });
    if (r.exit_code !== 0) {
      throw new TaskError(
        `solution/solve.sh exited ${r.exit_code}: ${`${r.stdout}${r.stderr}`.slice(-500)}`,
      );
    }
    return true;
  }
}

const warned = new Set<string>();

/**
 * Load one Harbor task folder: read it, build its image (or use `docker_image`).
 * @throws {ConfigError} naming the path when something required is missing
 */
export async function loadHarborTask(folder: string): Promise<HarborTask> {
  const name = basename(folder);
  const instructionPath = join(folder, "instruction.md");
  if (!existsSync(instructionPath)) {
    throw new ConfigError(`${instructionPath}: missing; a Harbor task needs its instruction`);
  }
  const tomlPath = join(folder, "task.toml");
  const settings = readHarborSettings(await readFile(tomlPath, "utf8"), tomlPath);
  for (const key of settings.unknown) {
    const note = `${tomlPath}: "${key}" is not read by vf (ignored)`;
    if (!warned.has(note)) {
      warned.add(note);
      console.warn(note);
    }
  }
  if (!existsSync(join(folder, "tests", "test.sh"))) {
    throw new ConfigError(`${join(folder, "tests", "test.sh")}: missing; the verifier runs it`);
  }
  const envDir = join(folder, "environment");
  const compose = await readHarborCompose(envDir);
  let image = compose?.main.image ?? settings.environment.image;
  if (!image) {
    const context = compose?.main.build ?? envDir;
    if (!existsSync(join(context, "Dockerfile"))) {
      throw new ConfigError(
        `${join(context, "Dockerfile")}: missing, and task.toml names no docker_image`,
      );
    }
    image = await buildImage(`harbor-${name}`, context, {
      signal: AbortSignal.timeout(settings.environment.buildTimeout * 1000),
    });
  }
  const instruction = await readFile(instructionPath, "utf8");
  const memory = settings.environment.memoryMb;
  return new HarborTask(
    {
      id: name,
      prompt: instruction,
      image,
      network: settings.environment.internet,
      agent_user: settings.agent.user,
      resources: {
        cpu: settings.environment.cpus,
        memory: memory ? `${memory}m` : undefined,
      },
      timeout: {
        agent: settings.agent.timeout,
        // The verifier's own limit, and a minute for the sweep, staging and the reward.
        scoring: settings.verifier.timeout + 60,
      },
      scoring: { mode: "shared" },
      ...(compose && Object.keys(compose.main.env).length ? { env: compose.main.env } : {}),
    },
    resolve(folder),
    settings,
    compose?.sidecars ?? null,
  );
}

/** What a Harbor task's `environment/docker-compose.yaml` says. */
interface HarborCompose {
  /** Overrides of the agent's service `main`: its image or build folder, its environment. */
  main: { image?: string; build?: string; env: Record<string, string> };
  /** The other services, as a Compose document for the rollout (null: none). */
  sidecars: Record<string, unknown> | null;
}

const MAIN_KEYS = ["image", "build", "environment", "depends_on"];

/**
 * Read `environment/docker-compose.yaml` (or `.yml`) when there is one. As in Harbor, it is
 * laid over the task's base: service `main` is the agent's sandbox (its image from
 * `${MAIN_IMAGE_NAME}`, the Dockerfile, unless it names another), every other service a
 * sidecar on the rollout's network. `${VAR}` and `${VAR:-default}` are filled from the
 * environment.
 * @throws {ConfigError} naming the file and key
 */
async function readHarborCompose(envDir: string): Promise<HarborCompose | null> {
  const path = ["docker-compose.yaml", "docker-compose.yml"].map((f) => join(envDir, f))
    .find((p) => existsSync(p));
  if (!path) return null;
  const text = (await readFile(path, "utf8")).replace(
    /\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}/g,
    (_m, name: string, fallback: string | undefined) =>
      name === "MAIN_IMAGE_NAME" ? _m : process.env[name] ?? fallback ?? "",
  );
  let doc: Record<string, unknown>;
  try {
    const { parse: parseYaml } = await import("npm:yaml@^2.9.1");
    doc = parseYaml(text) ?? {};
  } catch (error) {
    throw new ConfigError(`${path}: not valid YAML: ${(error as Error).message}`);
  }
  const services = { ...(doc.services ?? {}) as Record<string, Record<string, unknown>> };
  const raw = services.main ?? {};
  delete services.main;
  for (const key of Object.keys(raw)) {
    if (!MAIN_KEYS.includes(key)) {
      const note = `${path}: services.main.${key} is not read by vf (ignored)`;
      if (!warned.has(note)) {
        warned.add(note);
        console.warn(note);
      }
    }
  }
  const main: HarborCompose["main"] = { env: {} };
  if (typeof raw.image === "string" && raw.image !== "${MAIN_IMAGE_NAME}") main.image = raw.image;
  if (raw.build !== undefined) {
    const context = typeof raw.build === "string"
      ? raw.build
      : (raw.build as Record<string, unknown>)?.context;
    if (typeof context !== "string") {
      throw new ConfigError(`${path}: services.main.build: give the folder to build from`);
    }
    main.build = resolve(envDir, context);
  }
  if (Array.isArray(raw.environment)) {
    for (const item of raw.environment.map(String)) {
      const eq = item.indexOf("=");
      if (eq > 0) main.env[item.slice(0, eq)] = item.slice(eq + 1);
    }
  } else if (raw.environment && typeof raw.environment === "object") {
    for (const [k, v] of Object.entries(raw.environment)) main.env[k] = v === null ? "" : String(v);
  }
  // The sidecars start before the agent anyway; a dependency on main would never be met.
  for (const s of Object.values(services)) {
    const d = s?.depends_on;
    if (Array.isArray(d)) s.depends_on = d.filter((n) => n !== "main");
    else if (d && typeof d === "object") delete (d as Record<string, unknown>).main;
  }
  const sidecars = Object.keys(services).length
    ? { ...doc, services, "x-vf-dir": envDir, "x-vf-source": path }
    : null;
  return { main, sidecars };
}

/** The task folders under `path`: itself when it is one, else its subfolders that are. */
export async function harborFolders(path: string, names?: string[]): Promise<string[]> {
  const root = resolve(path);
  let folders: string[];
  if (existsSync(join(root, "task.toml"))) folders = [root];
  else {
    folders = [];
    for (
      const entry of (await readdir(root, { withFileTypes: true })).sort((a, b) =>
        a.name < b.name ? -1 : 1
      )
    ) {
      if (entry.isDirectory() && existsSync(join(root, entry.name, "task.toml"))) {
        folders.push(join(root, entry.name));
      }
    }
  }
  if (folders.length === 0) {
    throw new ConfigError(`${path}: no Harbor task folder (with task.toml) here`);
  }
  if (names?.length) {
    const missing = names.filter((n) => !folders.some((f) => basename(f) === n));
    if (missing.length) {
      throw new ConfigError(
        `${path}: no Harbor task named ${missing.map((m) => `"${m}"`).join(", ")}`,
      );
    }
    folders = folders.filter((f) => names.includes(basename(f)));
  }
  return folders;
}

/** Harbor task folders as a taskset. */
export class HarborTaskset extends Taskset<HarborTask> {
  /** The folder's name. */
  get id(): string {
    return basename(resolve(String(this.config.path ?? ".")));
  }

  async load(): Promise<HarborTask[]> {
    const path = this.config.path;
    if (typeof path !== "string" || !path) {
      throw new ConfigError(`env.taskset.path: the Harbor task folder (or a folder of them)`);
    }
    const names = this.config.tasks as string[] | undefined;
    const folders = await harborFolders(path, names);
    const tasks: HarborTask[] = [];
    for (const folder of folders) tasks.push(await loadHarborTask(folder));
    return tasks;
  }
}

/** Entry point: `[env.taskset] id = "harbor"` with `path` and `tasks`. */
export function loadTaskset(config: Record<string, unknown>): HarborTaskset {
  return new HarborTaskset(config);
}
