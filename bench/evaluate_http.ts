/**
 * `evaluate` against the bare HTTP/1.1-pool loop it is measured by, the stricter way: one
 * process, one environment, a loopback model server in a child process, and the bare loop (as
 * it is, and with the 600 s deadline the model client gives every request) and `evaluate`
 * (outputs kept; `keepOutputs: false` as `vf eval` runs it; that with the pool on the calling
 * thread instead of its own; and that with `vf ctl`'s control as the gate, steering and
 * progress, as `vf eval` adds it) alternating, so the machine's speed swings reach every
 * variant alike. Prints the fastest and the median run of each, the ratio to the bare loop, and heap allocated per rollout (`total_allocated_bytes`,
 * independent of the machine's speed), and this process's CPU time per rollout (user + system,
 * its GC threads included: less swayed than wall time by other processes on a loaded machine,
 * though the model server's CPU is not in it; the model client's HTTP/1.1 worker thread is in it
 * too), and the main thread's own CPU time per rollout (from `/proc`, in 10 ms ticks: what the
 * thread that runs rollouts spends), the model server's CPU time per rollout and the share of
 * the machine's CPU that stayed idle (on a machine whose cores the server shares, `evaluate` is
 * bound by all the CPU a rollout takes over the cores and by how busy it keeps them; the bare
 * loop by its one thread). With `--peak`, each variant also runs once in a fresh process of its
 * own and reports that process's peak RSS. The last line, `evaluate/bare = X`, is
 * the median ratio for `vf eval`'s variant (the goal: ≥ 0.6).
 *
 * It measures `evaluate` as `vf` runs it: with the V8 flags of `deno task vf` (deno.json), so it
 * starts itself again under them when started without (`--as-vf` marks that run).
 *
 *   deno run -A bench/evaluate_http.ts [rollouts=20000] [repeats=6] [--peak]
 * @module
 */
import v8 from "node:v8";
import process from "node:process";
import { evaluate, OpenAIChatClient, Rubric, SingleTurnEnv } from "../mod.ts";
import { http1Request } from "../lib/model/http1.ts";
import { RunControl } from "../lib/eval/control.ts";
import { startLoopbackModel } from "./_loopback_model.ts";

/** The `--v8-flags=…` arguments of `deno task vf`, which the measured process runs with. */
async function launcherFlags(): Promise<string[]> {
  const deno = JSON.parse(await Deno.readTextFile(new URL("../deno.json", import.meta.url)));
  return String(deno.tasks.vf).split(/\s+/).filter((a) => a.startsWith("--v8-flags="));
}

if (!Deno.args.includes("--as-vf") && Deno.args[0] !== "--child") {
  const flags = await launcherFlags();
  const { code } = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", ...flags, new URL(import.meta.url).pathname, ...Deno.args, "--as-vf"],
    stdout: "inherit",
    stderr: "inherit",
  }).output();
  Deno.exit(code);
}

// A child (`--child <variant> <url> <rollouts>`) runs one variant once for its peak RSS.
const child = Deno.args[0] === "--child" ? Deno.args.slice(1) : null;
const args = child ? [child[2]] : Deno.args.filter((a) => !a.startsWith("--"));
const n = Number(args[0] ?? 20_000);
const repeats = Number(args[1] ?? 6);
const CONCURRENCY = 256;
/** The model client's default request timeout (`[client] timeout = 600`). */
const CLIENT_TIMEOUT_MS = 600_000;
const question = (i: number) => `What is 2+2? (#${i})`;

/** Bytes the heap has allocated so far (Deno's V8 reports it; the Node typings do not list it). */
const allocated = () =>
  (v8.getHeapStatistics() as { total_allocated_bytes?: number }).total_allocated_bytes ?? 0;

interface Run {
  wallUs: number;
  bytes: number;
  /** This process's CPU time (user + system) per rollout, µs. */
  cpuUs: number;
  /** The main thread's CPU time per rollout, µs. */
  mainUs: number;
  /** The model server's CPU time per rollout, µs. */
  serverUs: number;
  /** The share of the machine's CPU time that was idle, %. */
  idlePct: number;
}

/** CPU time (user + system) so far of the process or thread whose stat file is `path`, µs
 * (Linux's /proc, in clock ticks of 10 ms). */
function cpuUsOf(path: string): number {
  const stat = Deno.readTextFileSync(path);
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  return (Number(fields[11]) + Number(fields[12])) * 10_000;
}

/** The main thread's CPU time so far, µs. */
const mainThreadUs = () => cpuUsOf(`/proc/self/task/${Deno.pid}/stat`);

/** The model server's pid, once it runs. */
let serverPid = 0;
const serverUs = () => serverPid ? cpuUsOf(`/proc/${serverPid}/stat`) : 0;

/** The machine's idle and total CPU time so far, in ticks (the first line of /proc/stat). */
function machineTicks(): { idle: number; total: number } {
  const fields = Deno.readTextFileSync("/proc/stat").split("\n")[0].trim().split(/\s+/).slice(1)
    .map(Number);
  return { idle: fields[3] + fields[4], total: fields.reduce((a, b) => a + b, 0) };
}

async function timed(count: number, work: () => Promise<void>): Promise<Run> {
  const a0 = allocated();
  const c0 = process.cpuUsage();
  const m0 = mainThreadUs();
  const s0 = serverUs();
  const k0 = machineTicks();
  const t0 = performance.now();
  await work();
  const wallUs = (1e3 * (performance.now() - t0)) / count;
  const cpu = process.cpuUsage(c0);
  const k1 = machineTicks();
  return {
    wallUs,
    bytes: (allocated() - a0) / count,
    cpuUs: (cpu.user + cpu.system) / count,
    mainUs: (mainThreadUs() - m0) / count,
    serverUs: (serverUs() - s0) / count,
    idlePct: (100 * (k1.idle - k0.idle)) / Math.max(1, k1.total - k0.total),
  };
}

function makeEnv(): SingleTurnEnv {
  return new SingleTurnEnv({
    evalDataset: Array.from({ length: n }, (_, i) => ({ question: question(i), answer: "4" })),
    systemPrompt: "Answer briefly.",
    rubric: new Rubric({
      funcs: [
        ({ completion, answer, parser }) => (parser.parseAnswer(completion) ?? "").includes(answer),
      ],
    }),
  });
}

async function runEvaluate(
  env: SingleTurnEnv,
  url: string,
  keepOutputs: boolean,
  count = n,
  steered = false,
  transport: "auto" | "http1" = "auto",
): Promise<Run> {
  const client = new OpenAIChatClient({ base_url: url, max_retries: 0, transport });
  const dir = await Deno.makeTempDir({ prefix: "vf-bench-http-" });
  // What `vf eval` adds: `vf ctl`'s control as the run's gate, steering and progress (its
  // socket is not served here).
  const control = steered
    ? new RunControl("bench", { maxConcurrent: CONCURRENCY, total: count })
    : null;
  try {
    return await timed(count, async () => {
      const result = await evaluate(env, client, "bench", {
        maxConcurrent: CONCURRENCY,
        resultsDir: dir,
        keepOutputs,
        numExamples: count,
        ...(control
          ? {
            gate: control,
            steering: control,
            onProgress: (p) => control.progress(p),
            metadataLive: () => control.metadata(),
          }
          : {}),
      });
      if (result.metadata.avg_reward !== 1) throw new Error("unexpected reward");
    });
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

/** The bare loop; with `timeoutMs`, each request carries the deadline the model client gives it. */
async function runBare(url: string, count = n, timeoutMs?: number): Promise<Run> {
  const endpoint = new URL(`${url}/chat/completions`);
  const headers = { "content-type": "application/json", authorization: "Bearer x" };
  const bodies = Array.from({ length: count }, (_, i) =>
    JSON.stringify({
      model: "bench",
      messages: [{ role: "system", content: "Answer briefly." }, {
        role: "user",
        content: question(i),
      }],
    }));
  let next = 0;
  return await timed(count, async () => {
    await Promise.all(Array.from({ length: CONCURRENCY }, async () => {
      while (next < count) {
        const res = await http1Request({
          method: "POST",
          url: endpoint,
          headers,
          body: bodies[next++],
          timeoutMs,
        });
        if (!Array.isArray(JSON.parse(res.text).choices)) throw new Error("no choices");
      }
    }));
  });
}

if (child) {
  const [variant, url] = child;
  const env = makeEnv();
  if (variant === "bare") await runBare(url);
  else await runEvaluate(env, url, variant === "kept");
  const hwm = Number(/VmHWM:\s+(\d+)/.exec(await Deno.readTextFile("/proc/self/status"))![1]);
  console.log((hwm / 1024).toFixed(0));
  Deno.exit(0);
}

const { url, pid, kill } = await startLoopbackModel();
serverPid = pid;
try {
  const env = makeEnv();
  // Warm-up: compilation and heap growth, as early in any long run.
  await runBare(url, Math.min(n, 5_000));
  await runEvaluate(env, url, false, Math.min(n, 5_000));
  const runs: Record<string, Run[]> = {
    bare: [],
    timed: [],
    kept: [],
    flat: [],
    here: [],
    steered: [],
  };
  for (let r = 0; r < repeats; r++) {
    runs.bare.push(await runBare(url));
    runs.timed.push(await runBare(url, n, CLIENT_TIMEOUT_MS));
    runs.kept.push(await runEvaluate(env, url, true));
    runs.flat.push(await runEvaluate(env, url, false));
    runs.here.push(await runEvaluate(env, url, false, n, false, "http1"));
    runs.steered.push(await runEvaluate(env, url, false, n, true));
  }
  const sorted = (xs: number[]) => [...xs].sort((a, b) => a - b);
  const best = (k: string) => sorted(runs[k].map((x) => x.wallUs))[0];
  const median = (k: string) => sorted(runs[k].map((x) => x.wallUs))[Math.floor(repeats / 2)];
  const cpu = (k: string) => sorted(runs[k].map((x) => x.cpuUs))[Math.floor(repeats / 2)];
  const mid = (k: string, f: (x: Run) => number) => sorted(runs[k].map(f))[Math.floor(repeats / 2)];
  const main = (k: string) => mid(k, (x) => x.mainUs);
  console.log(
    `${n} single-turn rollouts at concurrency ${CONCURRENCY}, ${repeats} runs of each in turn; ` +
      `load average ${Deno.loadavg().map((x) => x.toFixed(1)).join(", ")}; V8 flags of ` +
      `deno task vf: ${(await launcherFlags()).join(" ") || "none"}\n`,
  );
  console.log(
    "| variant | fastest µs per rollout | median µs | bare / variant (fastest) | bare / variant (median) | median CPU µs per rollout | bare / variant (CPU) | main thread CPU µs | model server CPU µs | machine idle % | KB allocated per rollout |",
  );
  console.log("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
  const names: Record<string, string> = {
    bare: "bare HTTP/1.1-pool loop",
    timed: "the same with the model client's 600 s deadline on each request",
    kept: "`evaluate`, outputs kept (default)",
    flat: "`evaluate`, `keepOutputs: false` (vf eval)",
    here: 'the same with the pool on the calling thread (`[client] transport = "http1"`)',
    steered: "the same with `vf ctl`'s control, as `vf eval` steers it",
  };
  for (const k of ["bare", "timed", "kept", "flat", "here", "steered"]) {
    const kb = runs[k].at(-1)!.bytes / 1024;
    console.log(
      `| ${names[k]} | ${best(k).toFixed(1)} | ${median(k).toFixed(1)} | ${
        (best("bare") / best(k)).toFixed(2)
      } | ${(median("bare") / median(k)).toFixed(2)} | ${cpu(k).toFixed(1)} | ${
        (cpu("bare") / cpu(k)).toFixed(2)
      } | ${main(k).toFixed(1)} | ${mid(k, (x) => x.serverUs).toFixed(1)} | ${
        mid(k, (x) => x.idlePct).toFixed(0)
      } | ${kb.toFixed(1)} |`,
    );
  }
  console.log(
    `\nevaluate/bare = ${(median("bare") / median("flat")).toFixed(2)} (median of ${repeats}, ` +
      `keepOutputs: false as vf eval runs it; outputs kept ${
        (median("bare") / median("kept")).toFixed(2)
      }; pool on the calling thread ${
        (median("bare") / median("here")).toFixed(2)
      }; with vf ctl's control ${(median("bare") / median("steered")).toFixed(2)}; CPU ${
        (cpu("bare") / cpu("flat")).toFixed(2)
      }; load ${Deno.loadavg()[0].toFixed(1)})`,
  );
  if (Deno.args.includes("--peak")) {
    console.log("\nPeak RSS of one run in a fresh process (MiB):");
    for (const k of ["bare", "kept", "flat"]) {
      const out = await new Deno.Command(Deno.execPath(), {
        args: [
          "run",
          "-A",
          ...(await launcherFlags()),
          new URL(import.meta.url).pathname,
          "--child",
          k,
          url,
          String(n),
        ],
        stdout: "piped",
        stderr: "inherit",
      }).output();
      console.log(`  ${names[k]}: ${new TextDecoder().decode(out.stdout).trim()}`);
    }
  }
} finally {
  kill();
}
