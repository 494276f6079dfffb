/**
 * The ssh runtime's command channel against an SSH session per command, measured in the same
 * run on one test sshd host (a network namespace on this machine, from tests/_sshd_hosts.ts;
 * needs root): median round trip of `echo` through each.
 *
 *   deno run -A bench/ssh_channel.ts [iterations=40]
 * @module
 */
import { sshSpecFor, startSshdHost } from "../tests/_sshd_hosts.ts";
import { SshRuntime } from "../runtimes/ssh/mod.ts";

const iterations = Number(Deno.args[0] ?? 40);
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

const host = await startSshdHost();
const rows: string[] = [];
const results: Record<string, number> = {};
try {
  for (const execChannel of [true, false]) {
    const rt = new SshRuntime(sshSpecFor(host, { execChannel }));
    await rt.start();
    try {
      const times: number[] = [];
      for (let i = 0; i < iterations + 5; i++) {
        const t = performance.now();
        await rt.run(["echo", "hi"]);
        if (i >= 5) times.push(performance.now() - t); // the first ones open the supervisors
      }
      results[execChannel ? "channel" : "session"] = median(times);
    } finally {
      await rt.stop();
    }
  }
  rows.push(
    `| \`echo hi\` | ${results.session.toFixed(1)} | ${results.channel.toFixed(1)} | ${
      (results.session / results.channel).toFixed(1)
    }x |`,
  );
  console.log(
    `ssh runtime, one sshd test host, medians of ${iterations}; load average ${
      Deno.loadavg().map((x) => x.toFixed(1)).join(", ")
    }\n`,
  );
  console.log("| op | a session each (ms) | channel (ms) | ratio |");
  console.log("| --- | ---: | ---: | ---: |");
  for (const row of rows) console.log(row);
} finally {
  await host.close();
}
