/**
 * The SSH scale run of `bench/scale.ts` at a reduced size: 100 sandboxes held live at once
 * over 4 real sshd test hosts (network namespaces), each running a five-turn bash agent
 * against the loopback model. Every rollout must be scored once and nothing may leak: no
 * workdir on any host, no live ledger entry, no open SSH connection. Timings are the
 * benchmark's to report, never asserted here.
 */

import assert from "node:assert/strict";
import { describeScale, runSshScale } from "../bench/_ssh_scale.ts";
import { startSshdHosts } from "./_sshd_hosts.ts";

Deno.test("scale: 100 ssh sandboxes live at once over 4 hosts, every rollout scored, nothing leaked or lost", async () => {
  const hosts = await startSshdHosts(4);
  const dir = await Deno.makeTempDir({ prefix: "vf_scale_" });
  try {
    const result = await runSshScale({ sandboxes: 100, hosts, dir, modelDelayMs: 100 });
    console.log(describeScale(result));
    assert.equal(result.peakLive, 100, describeScale(result));
    assert.equal(result.errors, 0, describeScale(result));
    assert.equal(result.meanReward, 1, describeScale(result));
    assert.deepEqual(result.leaked, { workdirs: 0, ledger: 0, connections: 0 });
    assert.equal(result.lost, 0);
    // One shared connection per host, however many sandboxes it holds.
    assert.deepEqual(result.connectionsPerHost, [1, 1, 1, 1]);
  } finally {
    for (const host of hosts) await host.close();
    await Deno.remove(dir, { recursive: true });
  }
});
