import assert from "node:assert/strict";
import { bridgeAddress, dockerNetworkAddresses, evaluatorHost } from "./network.ts";
import { DockerEngine } from "../../runtimes/docker/engine_api.ts";

Deno.test("the evaluator's address on the default bridge is docker0's, whether or not the engine names its gateway", async () => {
  // The fallback reads the host's interfaces: loopback always has one, an unknown name none.
  assert.equal(bridgeAddress("lo"), "127.0.0.1");
  assert.equal(bridgeAddress("vf-no-such-interface"), undefined);
  assert.equal(bridgeAddress(undefined), undefined);
  try {
    const bridge = await DockerEngine.shared().inspectNetwork("bridge") as {
      Options?: Record<string, string>;
    };
    const name = bridge.Options?.["com.docker.network.bridge.name"] ?? "docker0";
    assert.equal(await evaluatorHost(), bridgeAddress(name));
  } finally {
    await DockerEngine.closeShared();
  }
});

Deno.test("dockerNetworkAddresses() lists every network's gateway and subnet on this machine, host-less internal ones included", async () => {
  const engine = DockerEngine.shared();
  const name = `vf-test-addr-${crypto.randomUUID().slice(0, 8)}`;
  const id = await engine.createNetwork({
    Name: name,
    Driver: "bridge",
    Internal: true,
    CheckDuplicate: true,
    Options: { "com.docker.network.bridge.inhibit_ipv4": "true" },
  });
  try {
    const inspected = await engine.inspectNetwork(id) as {
      IPAM: { Config: Array<{ Gateway: string; Subnet: string }> };
    };
    const { Gateway: gateway, Subnet: subnet } = inspected.IPAM.Config[0];
    const addresses = await dockerNetworkAddresses();
    assert.ok(addresses.includes(gateway), `${gateway} in ${addresses}`);
    // Other rollouts' containers live in the subnet: the proxy refuses all of it.
    assert.match(subnet, /\/\d+$/);
    assert.ok(addresses.includes(subnet), `${subnet} in ${addresses}`);
    assert.ok(addresses.includes(await evaluatorHost()), "the default bridge's address");
  } finally {
    await engine.removeNetwork(id);
    await DockerEngine.closeShared();
  }
});
