import assert from "node:assert/strict";
import { isReservedAddress, OwnAddresses } from "./own_host.ts";

Deno.test("own host: cloud metadata outside link-local (Alibaba's, AWS's IPv6) is reserved in any spelling", () => {
  for (
    const ip of [
      "100.100.100.200",
      "::ffff:100.100.100.200",
      "::ffff:6464:64c8",
      "fd00:ec2::254",
      "FD00:EC2:0:0:0:0:0:254",
      "[fd00:0ec2::0254]",
    ]
  ) {
    assert.ok(isReservedAddress(ip), ip);
  }
  for (const ip of ["100.100.100.201", "fd00:ec2::253", "100.64.0.1"]) {
    assert.ok(!isReservedAddress(ip), ip);
  }
});

Deno.test("own host: a subnet from the extra source covers every address in it, in any spelling, and nothing outside", async () => {
  const own = new OwnAddresses({
    extra: () => Promise.resolve(["172.31.0.1", "172.31.0.0/16", "fd12:3456::/64", "bad/99"]),
  });
  for (
    const ip of [
      "172.31.0.1",
      "172.31.5.9",
      "172.31.255.255",
      "::ffff:172.31.5.9",
      "::ffff:ac1f:509",
      "fd12:3456::7",
      "fd12:3456:0:0:ffff::1",
    ]
  ) {
    assert.ok(await own.has(ip), ip);
  }
  for (const ip of ["172.32.0.1", "172.30.255.255", "fd12:3456:0:1::1", "8.8.8.8"]) {
    assert.ok(!(await own.has(ip)), ip);
  }
});
