/**
 * 1,000 concurrent ssh sandboxes from one evaluator: `bench/_ssh_scale.ts` over real sshd
 * test hosts in network namespaces (needs root, as `tests/setup.sh` prepares), run twice in
 * one process, at a quarter of the size (the baseline) and at full size, so the RSS per live
 * sandbox of the two can be compared (memory linear in live sandboxes: the ratio stays near
 * 1).
 *
 * The test hosts share this machine's cores with the evaluator, and each command forks a
 * shell on a host; unpinned, the hosts' load shows up as the evaluator's event-loop lag. So
 * on a machine with two cores or more the sshd hosts are pinned to the last core and the
 * evaluator to the others (`taskset`), and the lag measured is the evaluator's own. `nopin`
 * as the third argument leaves everything unpinned.
 *
 *   deno run -A bench/scale.ts [sandboxes=1000] [hosts=10] [pin|nopin]
 */

import { cpus } from "node:os";
import { describeScale, runSshScale, type SshScaleResult } from "./_ssh_scale.ts";
import { startSshdHosts } from "../tests/_sshd_hosts.ts";

const sandboxes = Number(Deno.args[0] ?? 1000);
const hostCount = Number(Deno.args[1] ?? 10);
const pin = Deno.args[2] !== "nopin" && cpus().length >= 2;

async function run(cmd: string, args: string[]): Promise<string> {
  const out = await new Deno.Command(cmd, { args, stdout: "piped", stderr: "null" }).output();
  return new TextDecoder().decode(out.stdout);
}

const hosts = await startSshdHosts(hostCount);
const dir = await Deno.makeTempDir({ prefix: "vf_scale_" });
const results: SshScaleResult[] = [];
try {
  if (pin) {
    const last = cpus().length - 1;
    const pids = (await run("pgrep", ["-f", "sshd -f /run/vf-test-host"])).split("\n")
      .filter(Boolean);
    for (const pid of pids) await run("taskset", ["-a", "-p", "-c", String(last), pid]);
    await run("taskset", ["-a", "-p", "-c", `0-${Math.max(0, last - 1)}`, String(Deno.pid)]);
    console.log(`pinned ${pids.length} sshd hosts to core ${last}, the evaluator to the rest`);
  }
  for (const n of [Math.max(1, Math.floor(sandboxes / 4)), sandboxes]) {
    const result = await runSshScale({ sandboxes: n, hosts, dir });
    console.log(describeScale(result));
    results.push(result);
  }
} finally {
  for (const host of hosts) await host.close();
  await Deno.remove(dir, { recursive: true });
}
const [small, full] = results;
console.log(
  `RSS per live sandbox at ${full.sandboxes} / at ${small.sandboxes}: ` +
    `x${(full.rssPerSandboxKiB / small.rssPerSandboxKiB).toFixed(2)}; ` +
    `lag p99 ${full.lagP99Ms.toFixed(1)} ms (target < 100); leaked ${
      full.leaked.workdirs + full.leaked.ledger + full.leaked.connections
    }, lost ${full.lost} (targets 0)`,
);
