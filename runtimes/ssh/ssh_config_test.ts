import assert from "node:assert/strict";
import { hostMatches, resolveSshHost } from "./ssh_config.ts";

const ctx = { home: "/home/ann", localUser: "ann" };

Deno.test("hostMatches() handles *, ? and negated patterns case-insensitively", () => {
  assert.equal(hostMatches(["gpu-*"], "GPU-7"), true);
  assert.equal(hostMatches(["gpu-?"], "gpu-12"), false);
  assert.equal(hostMatches(["*.lab", "!bad.lab"], "ok.lab"), true);
  assert.equal(hostMatches(["*.lab", "!bad.lab"], "bad.lab"), false);
  assert.equal(hostMatches(["!bad.lab"], "ok.lab"), false); // a negation alone never matches
  assert.equal(hostMatches(["a.b"], "axb"), false); // dots are literal
});

Deno.test("resolveSshHost() takes the first value per keyword across matching blocks", () => {
  const text = `
# comment
Host box
  HostName 10.0.0.5
  User=alice
  Port 2200

Host *
  User nobody
  Port 22
  HostName ignored.example
`;
  const c = resolveSshHost(text, "box", ctx);
  assert.equal(c.hostName, "10.0.0.5");
  assert.equal(c.user, "alice");
  assert.equal(c.port, 2200);
  assert.deepEqual(c.lines, [3, 8]);
  const other = resolveSshHost(text, "elsewhere", ctx);
  assert.equal(other.user, "nobody");
  assert.equal(other.hostName, "ignored.example");
});

Deno.test("resolveSshHost() accumulates IdentityFile and expands ~ and % tokens", () => {
  const text = `
Host box
  HostName %h.internal
  User bob
  IdentityFile ~/.ssh/id_box
  IdentityFile "/keys/%r@%h with space"
Host *
  IdentityFile %d/.ssh/%u_default
  UserKnownHostsFile ~/.ssh/known_hosts_lab
`;
  const c = resolveSshHost(text, "box", ctx);
  assert.equal(c.hostName, "box.internal");
  assert.deepEqual(c.identityFiles, [
    "/home/ann/.ssh/id_box",
    "/keys/bob@box.internal with space",
    "/home/ann/.ssh/ann_default",
  ]);
  assert.equal(c.knownHostsFile, "/home/ann/.ssh/known_hosts_lab");
});

Deno.test("resolveSshHost() skips Match blocks and reports ProxyJump or ProxyCommand", () => {
  const text = `
Match host box exec "false"
  User matched
Host box
  ProxyJump bastion.example
Host other
  ProxyCommand ssh -W %h:%p gateway
Host direct
  ProxyJump none
`;
  const box = resolveSshHost(text, "box", ctx);
  assert.equal(box.user, undefined);
  assert.equal(box.proxy, "ProxyJump bastion.example");
  assert.equal(resolveSshHost(text, "other", ctx).proxy, "ProxyCommand ssh -W %h:%p gateway");
  assert.equal(resolveSshHost(text, "direct", ctx).proxy, undefined);
});

Deno.test("resolveSshHost() returns nothing for a host no block names, and rejects a bad Port", () => {
  const none = resolveSshHost("Host a\n  User x\n", "b", ctx);
  assert.deepEqual(none, { identityFiles: [], lines: [] });
  assert.throws(
    () => resolveSshHost("Host a\n  Port ssh\n", "a", ctx),
    /Port "ssh" for host "a" is not a port number/,
  );
});
