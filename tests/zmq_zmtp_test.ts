/**
 * vf's ZMTP 3.1 sockets (lib/serve/zmtp/) against real libzmq: Debian's pyzmq as the ROUTER a
 * vf DEALER (and ZmqEnvClient) talks to, and as DEALERs talking to a vf ROUTER; multipart
 * messages with empty, short and long frames; routing ids (the peer's Identity and
 * generated ones); a peer that disconnects; and backpressure between two vf sockets.
 */
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { ZmtpDealer, ZmtpRouter } from "../lib/serve/zmtp/socket.ts";
import { ZmtpParser } from "../lib/serve/zmtp/codec.ts";
import { ZmqEnvClient } from "../lib/serve/zmq_client.ts";

const decoder = new TextDecoder();
const text = (b: Uint8Array) => decoder.decode(b);

/** A python3 program, its stdout lines handed over as they come. */
function python(source: string, args: string[]) {
  const child = spawn("/usr/bin/python3", ["-c", source, ...args], {
    stdio: ["pipe", "pipe", "inherit"],
  });
  const lines: string[] = [];
  const waiters: (() => void)[] = [];
  let buffer = "";
  child.stdout!.on("data", (chunk: Uint8Array) => {
    buffer += decoder.decode(chunk);
    let nl;
    while ((nl = buffer.indexOf("\n")) >= 0) {
      lines.push(buffer.slice(0, nl));
      buffer = buffer.slice(nl + 1);
      waiters.splice(0).forEach((w) => w());
    }
  });
  const exited = new Promise<number | null>((resolve) => child.once("exit", resolve));
  return {
    child,
    exited,
    async line(): Promise<string> {
      while (lines.length === 0) {
        const done = await Promise.race([
          new Promise<false>((r) => waiters.push(() => r(false))),
          exited.then(() => true),
        ]);
        if (done && lines.length === 0) throw new Error("python exited before printing");
      }
      return lines.shift()!;
    },
  };
}

const PY_ROUTER = `
import sys, json, zmq
s = zmq.Context().socket(zmq.ROUTER); s.setsockopt(zmq.LINGER, 0)
port = s.bind_to_random_port("tcp://127.0.0.1")
print(port, flush=True)
while True:
    frames = s.recv_multipart()
    ident, body = frames[0], frames[1:]
    if body == [b"bye"]:
        break
    # echo back, with what libzmq saw: the routing id and each frame's length
    s.send_multipart([ident, json.dumps({"id": ident.hex(), "sizes": [len(f) for f in body]}).encode()] + body)
`;

Deno.test("a vf ZMTP DEALER talks to a pyzmq ROUTER: its Identity, multipart with empty, short, long and 5 MiB frames, both ways", async () => {
  const py = python(PY_ROUTER, []);
  const port = Number(await py.line());
  const dealer = new ZmtpDealer({ routingId: "vf-dealer-1" });
  try {
    dealer.connect(`tcp://127.0.0.1:${port}`);
    const big = new Uint8Array(5 * 1024 * 1024).map((_, i) => i % 251);
    const parts = [new Uint8Array(), new Uint8Array(255).fill(7), new Uint8Array(256).fill(8), big];
    await dealer.send(parts);
    await dealer.send(["second", "message"]);
    const [meta, ...echoed] = await dealer.receive();
    const seen = JSON.parse(text(meta));
    assert.equal(Buffer.from(seen.id, "hex").toString(), "vf-dealer-1");
    assert.deepEqual(seen.sizes, [0, 255, 256, big.length]);
    assert.equal(echoed.length, 4);
    assert.deepEqual(echoed.map((p) => p.length), [0, 255, 256, big.length]);
    assert.ok(echoed[3].every((b, i) => b === i % 251), "the long frame came back intact");
    const [meta2, ...second] = await dealer.receive();
    assert.deepEqual(JSON.parse(text(meta2)).sizes, [6, 7]);
    assert.deepEqual(second.map(text), ["second", "message"]);
    await dealer.send(["bye"]);
    assert.equal(await py.exited, 0);
  } finally {
    dealer.close();
    py.child.kill();
  }
});

const PY_DEALERS = `
import sys, json, zmq
ctx = zmq.Context()
a = ctx.socket(zmq.DEALER); a.setsockopt(zmq.LINGER, 0); a.setsockopt(zmq.IDENTITY, b"alice")
b = ctx.socket(zmq.DEALER); b.setsockopt(zmq.LINGER, 0)
a.connect(sys.argv[1]); b.connect(sys.argv[1])
a.send_multipart([b"from", b"alice"]); b.send_multipart([b"from", b"anon", b"x" * 70000])
print(json.dumps([f.decode() for f in a.recv_multipart()]), flush=True)
got = b.recv_multipart()
print(json.dumps([got[0].decode(), len(got[1])]), flush=True)
sys.stdin.readline()
b.close()
print("closed", flush=True)
sys.stdin.readline()
`;

Deno.test("a vf ZMTP ROUTER serves pyzmq DEALERs: the peer's Identity or a generated id in front, replies routed by it, a gone peer unreachable", async () => {
  const router = new ZmtpRouter();
  await router.bind("tcp://127.0.0.1:0");
  assert.match(router.lastEndpoint!, /^tcp:\/\/127\.0\.0\.1:\d+$/);
  const py = python(PY_DEALERS, [router.lastEndpoint!]);
  try {
    const byFrom = new Map<string, Uint8Array[]>();
    for (let i = 0; i < 2; i++) {
      const frames = await router.receive();
      byFrom.set(text(frames[2]), frames);
    }
    const alice = byFrom.get("alice")!;
    assert.equal(text(alice[0]), "alice");
    const anon = byFrom.get("anon")!;
    assert.equal(anon[0].length, 5, "a generated routing id is 5 bytes");
    assert.equal(anon[0][0], 0, "and starts with a zero byte");
    assert.equal(anon[3].length, 70000);
    await router.send([anon[0], "to anon", new Uint8Array(300)]);
    await router.send([alice[0], "to", "alice"]);
    assert.deepEqual(JSON.parse(await py.line()), ["to", "alice"]);
    assert.deepEqual(JSON.parse(await py.line()), ["to anon", 300]);
    py.child.stdin!.write("\n");
    assert.equal(await py.line(), "closed");
    // The peer's disconnect reaches the ROUTER, which then refuses to route to it.
    const deadline = Date.now() + 30_000;
    let error: unknown;
    while (Date.now() < deadline) {
      error = await router.send([anon[0], "late"]).then(() => null, (e) => e);
      if (error) break;
      await new Promise((r) => setTimeout(r, 50));
    }
    assert.equal((error as { code?: string })?.code, "EHOSTUNREACH");
    await assert.rejects(router.send([new Uint8Array([1, 2, 3]), "x"]), /Host unreachable/);
    await router.send([alice[0], "still", "here"]);
  } finally {
    py.child.stdin!.end();
    router.close();
    py.child.kill();
    await py.exited;
  }
});

Deno.test("ZmqEnvClient on ZMTP against a pyzmq ROUTER speaking the current wire: health, and a run's deltas then its reply", async () => {
  const source = `
import sys, zmq, msgpack
s = zmq.Context().socket(zmq.ROUTER); s.setsockopt(zmq.LINGER, 0)
print(s.bind_to_random_port("tcp://127.0.0.1"), flush=True)
for _ in range(2):
    ident, rid, method, payload = s.recv_multipart()
    if method == b"health":
        s.send_multipart([ident, rid, b"reply", msgpack.packb({"success": True, "error": None, "env_id": "py"})])
    else:
        s.send_multipart([ident, rid, b"delta", msgpack.packb({"trace": "t1", "open": {"version": 1, "id": "t1", "verifiers": "x", "task": {}}})])
        s.send_multipart([ident, rid, b"reply", msgpack.packb({"success": True, "error": None, "head": {"task": msgpack.unpackb(payload)["task_data"]}, "traces": [{"id": "t1", "nodes": 0, "calls": 0}]})])
`;
  const py = python(source, []);
  const port = Number(await py.line());
  const client = await ZmqEnvClient.connect(`tcp://127.0.0.1:${port}`);
  try {
    await client.waitForServer({ timeoutMs: 60_000, intervalMs: 200 });
    const deltas: unknown[] = [];
    const episode = await client.run<Record<string, unknown>>({
      taskData: { n: 1 },
      client: { base_url: "http://127.0.0.1:1/v1" },
      model: "m",
    }, { onDelta: (d) => deltas.push(d) });
    assert.equal(deltas.length, 1);
    assert.deepEqual(episode.task, { n: 1 });
    assert.equal((episode.traces as { id: string }[])[0].id, "t1");
  } finally {
    await client.close();
    py.child.kill();
    await py.exited;
  }
});

Deno.test("ZMTP backpressure: a ROUTER that does not read holds its DEALER's sends back, then gets every byte in order", async () => {
  const router = new ZmtpRouter();
  await router.bind("tcp://127.0.0.1:0");
  const dealer = new ZmtpDealer();
  dealer.connect(router.lastEndpoint!);
  try {
    const n = 96;
    const chunk = (i: number) => new Uint8Array(1024 * 1024).fill(i);
    let resolved = 0;
    const sends = Array.from(
      { length: n },
      (_, i) => dealer.send([chunk(i)]).then(() => resolved++),
    );
    await new Promise((r) => setTimeout(r, 1000));
    assert.ok(resolved < n, `all ${n} MiB were taken while nothing read them`);
    for (let i = 0; i < n; i++) {
      const [, body] = await router.receive();
      assert.equal(body.length, 1024 * 1024);
      assert.equal(body[0], i % 256);
      assert.equal(body[body.length - 1], i % 256);
    }
    await Promise.all(sends);
    assert.equal(resolved, n);
  } finally {
    dealer.close();
    router.close();
  }
});

Deno.test("ZmtpParser refuses a peer that is not ZMTP 3 and reads frames split at every byte", () => {
  assert.throws(() => new ZmtpParser().push(new Uint8Array(64)), /no ZMTP signature/);
  const old = new Uint8Array(64);
  old[0] = 0xff;
  old[9] = 0x7f;
  old[10] = 2;
  assert.throws(() => new ZmtpParser().push(old), /ZMTP 2\.0; ZMTP 3\.0 or later/);
  const greet = new Uint8Array(64);
  greet.set([0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0x7f, 3, 1, ...new TextEncoder().encode("NULL")]);
  // a command (READY, no metadata), then a two-part message: "ab" MORE, then 300 bytes (long)
  const long = new Uint8Array(9 + 300);
  long.set([0x02, 0, 0, 0, 0, 0, 0, 1, 44]);
  const bytes = new Uint8Array([
    ...greet,
    0x04,
    6,
    5,
    ...new TextEncoder().encode("READY"),
    0x01,
    2,
    97,
    98,
    ...long,
  ]);
  const parser = new ZmtpParser();
  const seen = [];
  for (const b of bytes) seen.push(...parser.push(Uint8Array.of(b)));
  assert.deepEqual(seen.map((s) => s.type), ["greeting", "command", "message"]);
  const message = seen[2] as { parts: Uint8Array[] };
  assert.deepEqual(message.parts.map((p) => p.length), [2, 300]);
  assert.throws(
    () => new ZmtpParser(100).push(new Uint8Array([...greet, ...long])),
    /over the limit of 100 bytes/,
  );
});
