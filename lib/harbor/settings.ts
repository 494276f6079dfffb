/**
 * A Harbor `task.toml` (schema 1.0 through 1.3) read into typed settings. Every key Harbor
 * defines is either read with Harbor's meaning or refused with the file and key: a setting vf
 * cannot honour never turns into a warning that changes what is graded.
 * @module
 */
import { parse as parseToml } from "npm:smol-toml@^1.4.0";
import { ConfigError } from "../errors.ts";

/**
 * Harbor's defaults where `task.toml` leaves a key out (its `TaskConfig` schema): the verifier
 * and the image build get 600 s; the agent has no limit of its own there.
 */
export const HARBOR_DEFAULTS = { verifierTimeout: 600, buildTimeout: 600 } as const;

/** Harbor's network modes: `public` (open), `no-network`, `allowlist` (only `allowed_hosts`). */
export type HarborNetworkMode = "public" | "no-network" | "allowlist";

/** One phase's network: its mode, and the hosts an allowlist lets through. */
export interface HarborNetwork {
  mode: HarborNetworkMode;
  hosts: string[];
}

/** A sandbox Harbor starts: the agent's `[environment]`, or `[verifier.environment]`. */
export interface HarborEnvironment {
  /** Seconds (default {@link HARBOR_DEFAULTS}). */
  buildTimeout: number;
  image?: string;
  cpus?: number;
  memoryMb?: number;
  /** The working directory of the agent and of the gold answer. */
  workdir?: string;
  /** The baseline network, from `network_mode` or `allow_internet` (vf's default: none). */
  network: HarborNetwork;
  /** Whether the task said so (else vf's default applies). */
  networkGiven: boolean;
}

/** A verifier: the task's `[verifier]`, or a step's over it. */
export interface HarborVerifier {
  /** Seconds (default {@link HARBOR_DEFAULTS}). */
  timeout: number;
  env: Record<string, string>;
  user?: string;
  /** `shared`: the agent's sandbox; `separate`: a fresh one from `tests/`. */
  mode: "shared" | "separate";
  /** `[verifier].network_mode`: the verify phase's override of the baseline. */
  network?: HarborNetwork;
  /** `[verifier.environment]`: the separate verifier's sandbox. */
  environment: HarborEnvironment;
}

/** The agent: the task's `[agent]`, or a step's over it. */
export interface HarborAgent {
  timeout?: number;
  setupTimeout?: number;
  user?: string;
  /** `[agent].network_mode`: the agent phase's override of the baseline. */
  network?: HarborNetwork;
}

/** One `[[steps]]` entry. */
export interface HarborStep {
  name: string;
  /**
   * `min_reward`, per reward key (a number is the `reward` key's): a key below its threshold,
   * or missing from the step's rewards, stops the trial after this step.
   */
  minReward?: Record<string, number>;
  agent: HarborAgent;
  verifier: HarborVerifier;
  artifacts: string[];
}

/** The settings of one task folder's `task.toml`. */
export interface HarborSettings {
  /** `schema_version` (or the older `version`). */
  schemaVersion?: string;
  /** `[task]`: name, description, authors, keywords. */
  task: Record<string, unknown>;
  /** `[metadata]`, arbitrary. */
  metadata: Record<string, unknown>;
  verifier: HarborVerifier;
  agent: HarborAgent;
  solution: { env: Record<string, string> };
  environment: HarborEnvironment;
  /** Paths copied out of the agent's sandbox (and into a separate verifier's). */
  artifacts: string[];
  steps: HarborStep[];
  /** How step rewards roll up: `mean` (Harbor's default) or `final`. */
  rewardStrategy: "mean" | "final";
  /** Always empty: a key vf does not know is an error (kept for callers that list it). */
  unknown: string[];
}

type Table = Record<string, unknown>;

const TOP = [
  "schema_version",
  "version",
  "task",
  "metadata",
  "source",
  "verifier",
  "agent",
  "environment",
  "solution",
  "artifacts",
  "steps",
  "multi_step_reward_strategy",
  "multi_step_reward_mode",
];
const ENV_KEYS = [
  "build_timeout_sec",
  "docker_image",
  "cpus",
  "memory_mb",
  "memory",
  "storage_mb",
  "storage",
  "allow_internet",
  "network_mode",
  "allowed_hosts",
  "gpus",
  "gpu_types",
  "workdir",
  "os",
];
/** Harbor keys vf has no way to honour, and why (each refused with its file and key). */
const REFUSED: Record<string, string> = {
  "environment.mcp_servers": "vf gives Harbor tasks no MCP servers of their own",
  "environment.skills_dir": "vf copies no skills directory into the agent's sandbox",
  "environment.healthcheck": "vf runs no healthcheck before the agent starts",
  "environment.tpus": "vf cannot give a sandbox TPUs",
};

function isTable(v: unknown): v is Table {
  return typeof v === "object" && v !== null && !Array.isArray(v) && !(v instanceof Date);
}

function shown(v: unknown): string {
  try {
    return (JSON.stringify(v) ?? String(v)).slice(0, 60);
  } catch {
    return String(v).slice(0, 60);
  }
}

/** Reads one `task.toml`'s values, each error naming the file and the key's dotted path. */
class Reader {
  constructor(readonly path: string) {}

  fail(key: string, message: string): never {
    throw new ConfigError(`${this.path}: ${key}: ${message}`);
  }

  table(v: unknown, key: string): Table {
    if (v === undefined) return {};
    if (!isTable(v)) this.fail(key, `${shown(v)} is not a table`);
    return v;
  }

  /** Refuse keys outside `known` (Harbor's keys vf cannot honour say why). */
  keys(table: Table, at: string, known: string[]): void {
    for (const key of Object.keys(table)) {
      if (known.includes(key)) continue;
      const full = at ? `${at}.${key}` : key;
      const why = REFUSED[full.replace(/^steps\[\d+\]\.verifier\./, "verifier.")];
      this.fail(
        full,
        why
          ? `vf cannot honour it (${why}); remove it to run the task without it`
          : `not a Harbor task.toml key vf knows; remove it or check its spelling`,
      );
    }
  }

  /**
   * A positive number: a TOML number, or a string that spells one in decimal (`"3"`, `" 7.5 "`,
   * `"1e3"`), as Harbor's float fields read it; `"inf"`, `"nan"` and the rest are refused.
   */
  positive(v: unknown, key: string): number | undefined {
    if (v === undefined) return undefined;
    const n = typeof v === "number"
      ? v
      : typeof v === "string" && /^\s*\+?(\d+\.?\d*|\.\d+)(e[+-]?\d+)?\s*$/i.test(v)
      ? Number(v)
      : NaN;
    if (Number.isFinite(n) && n > 0) return n;
    const name = key.slice(key.lastIndexOf(".") + 1);
    return this.fail(
      key,
      `${shown(v)} is not a positive number; write one, e.g. ` +
        `${name} = ${name === "cpus" ? 2 : name === "memory_mb" ? 2048 : 600}`,
    );
  }

  number(v: unknown, key: string): number | undefined {
    if (v === undefined) return undefined;
    if (typeof v === "number" && Number.isFinite(v)) return v;
    return this.fail(key, `${shown(v)} is not a number`);
  }

  /** `min_reward`: a number (the `reward` key's threshold) or a table of them by reward key. */
  minReward(v: unknown, key: string): Record<string, number> | undefined {
    if (v === undefined) return undefined;
    if (typeof v === "number") return { reward: this.number(v, key)! };
    if (!isTable(v)) {
      return this.fail(
        key,
        `${shown(v)} is not a number or a table of reward keys (min_reward = 1.0, or ` +
          `min_reward = { correctness = 0.8 })`,
      );
    }
    return Object.fromEntries(
      Object.entries(v).map(([k, n]) => [k, this.number(n, `${key}.${k}`)!]),
    );
  }

  string(v: unknown, key: string): string | undefined {
    if (v === undefined) return undefined;
    if (typeof v === "string" && v !== "") return v;
    return this.fail(key, `${shown(v)} is not a non-empty string`);
  }

  strings(v: unknown, key: string): string[] {
    if (v === undefined) return [];
    if (Array.isArray(v) && v.every((x) => typeof x === "string" && x !== "")) return v;
    return this.fail(key, `${shown(v)} is not a list of strings`);
  }

  strMap(v: unknown, key: string): Record<string, string> {
    return Object.fromEntries(
      Object.entries(this.table(v, key)).map(([k, x]) => [k, String(x)]),
    );
  }

  /** `network_mode` (with `allowed_hosts`) of a phase; undefined when the phase sets none. */
  network(t: Table, at: string): HarborNetwork | undefined {
    const mode = t.network_mode;
    const hosts = this.strings(t.allowed_hosts, `${at}.allowed_hosts`);
    if (mode === undefined) {
      if (hosts.length) {
        this.fail(`${at}.allowed_hosts`, `needs network_mode = "allowlist" beside it`);
      }
      return undefined;
    }
    if (mode !== "public" && mode !== "no-network" && mode !== "allowlist") {
      this.fail(
        `${at}.network_mode`,
        `${shown(mode)} is not one of "public", "no-network", "allowlist"`,
      );
    }
    if (mode === "allowlist" && !hosts.length) {
      this.fail(`${at}.allowed_hosts`, `network_mode = "allowlist" needs the hosts it allows`);
    }
    if (mode !== "allowlist" && hosts.length) {
      this.fail(`${at}.allowed_hosts`, `only an "allowlist" network_mode takes hosts`);
    }
    return { mode, hosts };
  }

  environment(t: Table, at: string, base?: HarborEnvironment): HarborEnvironment {
    this.keys(t, at, ENV_KEYS);
    const os = this.string(t.os, `${at}.os`);
    if (os !== undefined && os !== "linux") {
      this.fail(`${at}.os`, `vf runs linux sandboxes only, not ${shown(os)}`);
    }
    const gpus = this.number(t.gpus, `${at}.gpus`);
    if (gpus) this.fail(`${at}.gpus`, `vf cannot give a sandbox GPUs; remove it or set 0`);
    if (t.gpu_types !== undefined && !gpus) this.strings(t.gpu_types, `${at}.gpu_types`);
    const memory = this.positive(t.memory_mb, `${at}.memory_mb`) ?? this.size(t.memory, at);
    if (t.storage_mb !== undefined) this.positive(t.storage_mb, `${at}.storage_mb`);
    if (t.storage !== undefined) this.size(t.storage, at, "storage");
    const workdir = this.string(t.workdir, `${at}.workdir`);
    if (workdir !== undefined && !workdir.startsWith("/")) {
      this.fail(`${at}.workdir`, `${shown(workdir)} is not an absolute path`);
    }
    let network = this.network(t, at);
    if (t.allow_internet !== undefined) {
      if (typeof t.allow_internet !== "boolean") {
        this.fail(`${at}.allow_internet`, `${shown(t.allow_internet)} is not true or false`);
      }
      const legacy: HarborNetwork = { mode: t.allow_internet ? "public" : "no-network", hosts: [] };
      if (network && network.mode !== legacy.mode) {
        this.fail(`${at}.allow_internet`, `contradicts network_mode = "${network.mode}"`);
      }
      network ??= legacy;
    }
    return {
      buildTimeout: this.positive(t.build_timeout_sec, `${at}.build_timeout_sec`) ??
        base?.buildTimeout ?? HARBOR_DEFAULTS.buildTimeout,
      image: this.string(t.docker_image, `${at}.docker_image`) ?? base?.image,
      cpus: this.positive(t.cpus, `${at}.cpus`) ?? base?.cpus,
      memoryMb: memory ?? base?.memoryMb,
      workdir: workdir ?? base?.workdir,
      network: network ?? base?.network ?? { mode: "no-network", hosts: [] },
      networkGiven: network !== undefined || (base?.networkGiven ?? false),
    };
  }

  /** `memory = "4G"` / `storage = "10G"` in megabytes. */
  size(v: unknown, at: string, name = "memory"): number | undefined {
    if (v === undefined) return undefined;
    if (typeof v === "string" && /^\d+(\.\d+)?[gGmM]$/.test(v)) {
      return Number(v.slice(0, -1)) * (/[gG]$/.test(v) ? 1024 : 1);
    }
    return this.fail(`${at}.${name}`, `${shown(v)} is not a size such as "4G" or "512M"`);
  }

  agent(t: Table, at: string, base?: HarborAgent): HarborAgent {
    this.keys(t, at, ["timeout_sec", "setup_timeout_sec", "user", "network_mode", "allowed_hosts"]);
    return {
      timeout: this.positive(t.timeout_sec, `${at}.timeout_sec`) ?? base?.timeout,
      setupTimeout: this.positive(t.setup_timeout_sec, `${at}.setup_timeout_sec`) ??
        base?.setupTimeout,
      user: this.string(t.user, `${at}.user`) ?? base?.user,
      network: this.network(t, at) ?? base?.network,
    };
  }

  verifier(t: Table, at: string, base?: HarborVerifier): HarborVerifier {
    this.keys(t, at, [
      "timeout_sec",
      "env",
      "user",
      "environment_mode",
      "network_mode",
      "allowed_hosts",
      "environment",
    ]);
    const mode = t.environment_mode ?? base?.mode ?? "shared";
    if (mode !== "shared" && mode !== "separate") {
      this.fail(`${at}.environment_mode`, `${shown(mode)} is not "shared" or "separate"`);
    }
    const environment = this.environment(
      this.table(t.environment, `${at}.environment`),
      `${at}.environment`,
      base?.environment,
    );
    if (t.environment !== undefined && mode !== "separate") {
      this.fail(
        `${at}.environment`,
        `configures a separate verifier; set environment_mode = "separate"`,
      );
    }
    return {
      timeout: this.positive(t.timeout_sec, `${at}.timeout_sec`) ?? base?.timeout ??
        HARBOR_DEFAULTS.verifierTimeout,
      env: { ...(base?.env ?? {}), ...this.strMap(t.env, `${at}.env`) },
      user: this.string(t.user, `${at}.user`) ?? base?.user,
      mode,
      network: this.network(t, at) ?? base?.network,
      environment,
    };
  }

  artifacts(v: unknown, key: string): string[] {
    if (v === undefined) return [];
    if (!Array.isArray(v)) return this.fail(key, `${shown(v)} is not a list of paths`);
    return v.map((item, i) => {
      if (typeof item === "string" && item.startsWith("/")) return item;
      if (isTable(item)) {
        this.keys(item, `${key}[${i}]`, ["source", "destination"]);
        const source = this.string(item.source, `${key}[${i}].source`);
        if (!source?.startsWith("/")) this.fail(`${key}[${i}].source`, `give an absolute path`);
        if (item.destination !== undefined && item.destination !== source) {
          this.fail(
            `${key}[${i}].destination`,
            `vf restores an artifact where it was found; a different destination is not supported`,
          );
        }
        return source;
      }
      return this.fail(`${key}[${i}]`, `${shown(item)} is not an absolute path`);
    });
  }
}

/**
 * Read a `task.toml`. A key vf does not know, or one it cannot honour, is an error naming the
 * file and key; so is a file that is not TOML.
 * @throws {ConfigError}
 */
export function readHarborSettings(text: string, path: string): HarborSettings {
  let doc: Table;
  try {
    doc = parseToml(text) as Table;
  } catch (error) {
    throw new ConfigError(`${path}: not valid TOML: ${(error as Error).message}`);
  }
  const r = new Reader(path);
  r.keys(doc, "", TOP);
  const schemaVersion = r.string(doc.schema_version, "schema_version") ??
    r.string(doc.version, "version");
  const environment = r.environment(r.table(doc.environment, "environment"), "environment");
  const agent = r.agent(r.table(doc.agent, "agent"), "agent");
  const verifier = r.verifier(r.table(doc.verifier, "verifier"), "verifier");
  const solution = r.table(doc.solution, "solution");
  r.keys(solution, "solution", ["env"]);
  const strategy = doc.multi_step_reward_strategy ?? "mean";
  if (strategy !== "mean" && strategy !== "final") {
    r.fail("multi_step_reward_strategy", `${shown(strategy)} is not "mean" or "final"`);
  }
  if (doc.steps !== undefined && !Array.isArray(doc.steps)) {
    r.fail("steps", `write each step as a [[steps]] table`);
  }
  const steps = ((doc.steps ?? []) as unknown[]).map((raw, i): HarborStep => {
    const at = `steps[${i}]`;
    const t = r.table(raw, at);
    r.keys(t, at, ["name", "min_reward", "agent", "verifier", "artifacts"]);
    const name = r.string(t.name, `${at}.name`) ?? r.fail(`${at}.name`, "missing; name the step");
    if (!/^[A-Za-z0-9._-]+$/.test(name)) {
      r.fail(`${at}.name`, `${shown(name)} is not a folder name under steps/`);
    }
    return {
      name,
      minReward: r.minReward(t.min_reward, `${at}.min_reward`),
      agent: r.agent(r.table(t.agent, `${at}.agent`), `${at}.agent`, agent),
      verifier: r.verifier(r.table(t.verifier, `${at}.verifier`), `${at}.verifier`, verifier),
      artifacts: r.artifacts(t.artifacts, `${at}.artifacts`),
    };
  });
  const names = steps.map((s) => s.name);
  const twice = names.find((n, i) => names.indexOf(n) !== i);
  if (twice) r.fail("steps", `two steps are named "${twice}"`);
  return {
    schemaVersion,
    task: r.table(doc.task, "task"),
    metadata: r.table(doc.metadata, "metadata"),
    verifier,
    agent,
    solution: { env: r.strMap(solution.env, "solution.env") },
    environment,
    artifacts: r.artifacts(doc.artifacts, "artifacts"),
    steps,
    rewardStrategy: strategy as "mean" | "final",
    unknown: [],
  };
}
