import assert from "node:assert/strict";
import { compareApiVersions, DockerEngine, MAX_API_VERSION, splitImage } from "./engine_api.ts";
import { parseDockerHost } from "./host.ts";
import { parseMemory } from "./mod.ts";

Deno.test("parseDockerHost() understands unix sockets, tcp://host:port with or without TLS, and ssh://", () => {
  assert.deepEqual(parseDockerHost(undefined), {
    socketPath: "/var/run/docker.sock",
    origin: "http://localhost",
    display: "/var/run/docker.sock",
  });
  assert.equal(parseDockerHost("unix:///tmp/d.sock").socketPath, "/tmp/d.sock");
  assert.deepEqual(parseDockerHost("tcp://127.0.0.1:2375"), {
    origin: "http://127.0.0.1:2375",
    display: "tcp://127.0.0.1:2375",
  });
  assert.deepEqual(parseDockerHost("tcp://127.0.0.1:2376", { tls: true }), {
    origin: "https://127.0.0.1:2376",
    display: "tcp://127.0.0.1:2376",
    tls: true,
  });
  assert.deepEqual(parseDockerHost("ssh://me@host:2222"), {
    origin: "http://localhost",
    display: "ssh://me@host:2222",
    ssh: { user: "me", host: "host", port: 2222 },
  });
  assert.equal(parseDockerHost("ssh://me@host").ssh?.port, 22);
  assert.throws(
    () => parseDockerHost("ftp://me@host"),
    /Unsupported DOCKER_HOST "ftp:\/\/me@host"/,
  );
});

Deno.test("compareApiVersions() compares numerically", () => {
  assert.ok(compareApiVersions("1.41", "1.43") < 0);
  assert.ok(compareApiVersions("1.9", "1.41") < 0);
  assert.equal(compareApiVersions("1.43", "1.43"), 0);
});

Deno.test("splitImage() separates repository and tag", () => {
  assert.deepEqual(splitImage("busybox"), { repo: "busybox", tag: "latest" });
  assert.deepEqual(splitImage("python:3.11-slim"), { repo: "python", tag: "3.11-slim" });
  assert.deepEqual(splitImage("localhost:5000/x/y"), { repo: "localhost:5000/x/y", tag: "latest" });
  assert.deepEqual(splitImage("r/x@sha256:ab"), { repo: "r/x", tag: "sha256:ab" });
});

Deno.test("parseMemory() reads docker-style sizes", () => {
  assert.equal(parseMemory("512m"), 512 * 1024 ** 2);
  assert.equal(parseMemory("2g"), 2 * 1024 ** 3);
  assert.equal(parseMemory("1.5G"), 1.5 * 1024 ** 3);
  assert.equal(parseMemory("1048576"), 1048576);
  assert.throws(() => parseMemory("lots"), RangeError);
});

Deno.test("DockerEngine negotiates min(engine API, our max) with the real engine", async () => {
  const engine = new DockerEngine();
  try {
    const engineVersion = String((await engine.version()).ApiVersion);
    const expected = compareApiVersions(engineVersion, MAX_API_VERSION) < 0
      ? engineVersion
      : MAX_API_VERSION;
    assert.equal(await engine.apiPrefix(), `/v${expected}`);
    assert.equal(await engine.ping(), true);
  } finally {
    await engine.close();
  }
});
