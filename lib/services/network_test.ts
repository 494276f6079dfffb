import assert from "node:assert/strict";
import { bridgeAddress, evaluatorHost } from "./network.ts";
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
