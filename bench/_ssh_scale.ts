/**
 * The SSH scale run shared by `bench/scale.ts` (1,000 sandboxes) and its reduced form in the
 * test suite (`tests/scale_test.ts`): `sandboxes` rollouts at once, each in its own ssh
 * sandbox (a fresh `/tmp/vf-*` workdir) on one of the test hosts (real sshd servers in
 * network namespaces, `tests/_sshd_hosts.ts`), each running a multi-command bash agent
 * against a scripted model on loopback. The model holds its first answers until every
 * sandbox is live, then takes `modelDelayMs` per reply, so all of them are held at once.
 *
 * It measures event-loop lag (a 20 ms timer's lateness), RSS against the number of live
 * sandboxes, established connections per host at peak, wall time, and then counts what
 * leaked (workdirs left on the hosts, ledger entries still live, SSH connections still open)
 * and what was lost (rollouts without exactly one trace in traces.jsonl).
 * @module
 */

import { join } from "node:path";
import process from "node:process";
import { OpenAIChatClient } from "../lib/model/client.ts";
import { getHarness } from "../lib/tasks/harness_registry.ts";
import { readText, reward, Task, type TaskHookContext, Taskset } from "../mod.ts";
import { runTaskset } from "../lib/agents/run.ts";
import { createRuntime } from "../runtimes/create.ts";
import { Ledger, setDefaultLedger } from "../runtimes/ledger.ts";
import type { Runtime, SshRuntimeSpec } from "../runtimes/runtime.ts";
import type { SandboxSource } from "../runtimes/pool.ts";
import { sshConnections, sshConnectionsClosed } from "../runtimes/ssh/mod.ts";
import { startModelServer, textReply, toolCallReply } from "../tests/model_server.ts";
import { type SshdHost, sshSpecFor } from "../tests/_sshd_hosts.ts";

/** The agent's commands: look at the input three ways, then write the sum. */
const COMMANDS = [
  "cat input.txt",
  "wc -l input.txt",
  "sort -n input.txt | tail -n 1",
  "awk '{ s += $1 } END { print s }' input.txt > answer.txt",
];

class ScaleTask extends Task {
  get numbers(): number[] {
    return this.data.numbers as number[];
  }

  override async setup({ runtime }: TaskHookContext): Promise<void> {
    await runtime.write("input.txt", this.numbers.join("\n") + "\n");
  }

  correct = reward(async ({ runtime }) => {
    const answer = await readText(runtime, "answer.txt", 1024);
    return answer.trim() === String(this.numbers.reduce((a, b) => a + b, 0)) ? 1 : 0;
  });
}

class ScaleTaskset extends Taskset<ScaleTask> {
  constructor(readonly count: number) {
    super({});
  }
  get id(): string {
    return "ssh-scale";
  }
  *load(): Iterable<ScaleTask> {
    for (let i = 0; i < this.count; i++) {
      yield new ScaleTask({
        id: `scale-${i}`,
        prompt: "Sum the integers in input.txt and write the sum to answer.txt.",
        scoring: { mode: "shared" },
        numbers: [i, i + 1, i + 2],
      });
    }
  }
}

/** What to run. */
export interface SshScaleOptions {
  /** Rollouts, all at once: the number of live sandboxes at peak. */
  sandboxes: number;
  hosts: SshdHost[];
  /** Each model reply takes this long; default 300 ms. */
  modelDelayMs?: number;
  /** Channels per SSH connection the hosts allow (their `MaxSessions`); default 10. */
  maxSessions?: number;
  /** Where traces and the ledger go. */
  dir: string;
}

/** What a run measured. */
export interface SshScaleResult {
  sandboxes: number;
  hosts: number;
  seconds: number;
  lagP50Ms: number;
  lagP99Ms: number;
  lagMaxMs: number;
  peakLive: number;
  rssBaseMiB: number;
  rssPeakMiB: number;
  /** (RSS at peak live − RSS before) / peak live. */
  rssPerSandboxKiB: number;
  /** Established connections to each host's sshd when the most sandboxes were live. */
  connectionsPerHost: number[];
  errors: number;
  meanReward: number;
  leaked: { workdirs: number; ledger: number; connections: number };
  lost: number;
}

function percentile(values: number[], p: number): number {
  if (!values.length) return NaN;
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))];
}

/** Runs one scale run and measures it; throws only when the run itself could not happen. */
export async function runSshScale(options: SshScaleOptions): Promise<SshScaleResult> {
  const { sandboxes, hosts } = options;
  const delay = options.modelDelayMs ?? 300;
  // The model answers nobody until every sandbox is live, so the run holds all of them at
  // once whatever the machine's pace (a cap keeps a run that cannot get there from hanging).
  let allLive!: () => void;
  const everyoneLive = new Promise<void>((resolve) => (allLive = resolve));
  let capTimer: ReturnType<typeof setTimeout> | undefined;
  const capped = new Promise<void>((resolve) => (capTimer = setTimeout(resolve, 600_000)));
  const server = await startModelServer({
    record: false,
    responder: async ({ body }) => {
      await Promise.race([everyoneLive, capped]);
      await new Promise((r) => setTimeout(r, delay));
      const done = body.messages.filter((m) => m.role === "tool").length;
      return done < COMMANDS.length
        ? toolCallReply("bash", { command: COMMANDS[done] })
        : textReply("done");
    },
  });
  const client = new OpenAIChatClient({ base_url: server.url, api_key: "scale" });
  const runId = `ssh-scale-${crypto.randomUUID().slice(0, 6)}`;
  const runDir = join(options.dir, runId);
  const ledger = new Ledger(join(options.dir, `${runId}.ledger.jsonl`));
  setDefaultLedger(ledger);

  // Sandboxes spread round-robin over the hosts; live ones counted as they start and stop.
  let next = 0;
  let live = 0;
  let peakLive = 0;
  const source: SandboxSource = {
    async acquire(spec, o) {
      const host = hosts[next++ % hosts.length];
      const sshSpec: SshRuntimeSpec = {
        ...(spec as SshRuntimeSpec),
        ...sshSpecFor(host, { sshConfigPath: null, maxSessions: options.maxSessions }),
      };
      const rt: Runtime = createRuntime(sshSpec, { runId, task: o?.task });
      await rt.start({ signal: o?.signal });
      live++;
      peakLive = Math.max(peakLive, live);
      if (live === sandboxes) allLive();
      const stop = rt.stop.bind(rt);
      let stopped = false;
      rt.stop = () => {
        if (!stopped) {
          stopped = true;
          live--;
        }
        return stop();
      };
      return rt;
    },
    close: () => Promise.resolve(),
  };

  // Event-loop lag: how late a 20 ms interval fires.
  const lags: number[] = [];
  let last = performance.now();
  const lagTimer = setInterval(() => {
    const now = performance.now();
    lags.push(Math.max(0, now - last - 20));
    last = now;
  }, 20);
  const rssBase = process.memoryUsage().rss;
  let rssAtPeak = rssBase;
  let rssPeak = rssBase;
  let connectionsPerHost: number[] = [];
  let sampledAt = 0;
  let sampling = true;
  const sampler = (async () => {
    while (sampling) {
      const rss = process.memoryUsage().rss;
      rssPeak = Math.max(rssPeak, rss);
      if (live >= peakLive && live > 0) rssAtPeak = Math.max(rssAtPeak, rss);
      if (live > sampledAt && live >= Math.floor(sandboxes * 0.9)) {
        sampledAt = live;
        connectionsPerHost = await Promise.all(hosts.map((h) => h.connectionCount()));
      }
      await new Promise((r) => setTimeout(r, 100));
    }
  })();

  const started = performance.now();
  let summary;
  try {
    ({ summary } = await runTaskset({
      taskset: new ScaleTaskset(sandboxes),
      policy: {
        runtime: { type: "ssh", host: "spread" },
        harness: getHarness("bash"),
        sandboxes: source,
      },
      client,
      model: "scripted",
      rolloutsPerTask: 1,
      maxConcurrent: sandboxes,
      runDir,
      runId,
    }));
  } finally {
    sampling = false;
    await sampler;
    clearInterval(lagTimer);
    clearTimeout(capTimer);
    await server.close();
  }
  const seconds = (performance.now() - started) / 1000;

  // Lost: every rollout has exactly one trace on disk.
  const text = await Deno.readTextFile(join(runDir, "traces.jsonl")).catch(() => "");
  const traces = text.split("\n").filter(Boolean).map((l) => JSON.parse(l));
  const keys = new Map<string, number>();
  for (const t of traces) keys.set(t.task.key, (keys.get(t.task.key) ?? 0) + 1);
  let lost = 0;
  for (let i = 0; i < sandboxes; i++) if (keys.get(`scale-${i}`) !== 1) lost++;

  // Leaked: workdirs on the hosts, live ledger entries, SSH connections still open.
  const counts = await Promise.all(hosts.map(async (h) => {
    const out = await h.exec(["sh", "-c", "ls -d /tmp/vf-* 2>/dev/null | wc -l"]);
    return Number(out.stdout.trim()) || 0;
  }));
  const workdirs = counts.reduce((a, b) => a + b, 0);
  const ledgerLive = (await ledger.live({ runId })).length;
  await sshConnectionsClosed();
  const connections = sshConnections().length;
  setDefaultLedger(null);

  return {
    sandboxes,
    hosts: hosts.length,
    seconds,
    lagP50Ms: percentile(lags, 0.5),
    lagP99Ms: percentile(lags, 0.99),
    lagMaxMs: Math.max(0, ...lags),
    peakLive,
    rssBaseMiB: rssBase / 2 ** 20,
    rssPeakMiB: rssPeak / 2 ** 20,
    rssPerSandboxKiB: peakLive ? (rssAtPeak - rssBase) / peakLive / 1024 : NaN,
    connectionsPerHost,
    errors: summary.num_errors,
    meanReward: summary.avg_reward ?? NaN,
    leaked: { workdirs, ledger: ledgerLive, connections },
    lost,
  };
}

/** One line per measure, for the bench's output. */
export function describeScale(r: SshScaleResult): string {
  return [
    `${r.sandboxes} ssh sandboxes over ${r.hosts} hosts: ${r.seconds.toFixed(1)} s, ` +
    `peak live ${r.peakLive}, errors ${r.errors}, mean reward ${r.meanReward.toFixed(3)}`,
    `  event-loop lag p50 ${r.lagP50Ms.toFixed(1)} ms, p99 ${r.lagP99Ms.toFixed(1)} ms, ` +
    `max ${r.lagMaxMs.toFixed(0)} ms`,
    `  RSS ${r.rssBaseMiB.toFixed(0)} → peak ${r.rssPeakMiB.toFixed(0)} MiB, ` +
    `${r.rssPerSandboxKiB.toFixed(0)} KiB per live sandbox`,
    `  connections per host at peak: ${r.connectionsPerHost.join(", ") || "not sampled"}`,
    `  leaked: ${r.leaked.workdirs} workdirs, ${r.leaked.ledger} ledger entries, ` +
    `${r.leaked.connections} connections; lost: ${r.lost}`,
  ].join("\n");
}
