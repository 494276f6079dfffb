/**
 * The ZeroMQ transports under Deno, side by side in one run: the zeromq addon (libzmq, its
 * receive polled) and vf's ZMTP on node:net (`--zmq-impl zmtp`, the default). A Deno process
 * serving the ZeroMQ wire (`startZmqEnvServer`, a runner that answers at once) is driven by
 * Debian's pyzmq (libzmq's own blocking wait, no polling on that side):
 *
 * - `health` round trips back to back (the socket is hot, the poll loop spins at 0 ms);
 * - `health` round trips after 250 ms of silence (the loop has backed off to 10 ms);
 * - the server's CPU time during 3 s of idleness, against the same 3 s with no socket open.
 *
 * Prints a markdown table, one column per transport; the ratios are what to compare.
 *
 * Usage: deno run -A bench/zmq_idle.ts [round trips]
 * @module
 */
import { startZmqEnvServer } from "../lib/serve/zmq.ts";

const N = Number(Deno.args[0] ?? 200);
const PY = `
import sys, time, uuid, json, zmq, msgpack
addr, n = sys.argv[1], int(sys.argv[2])
s = zmq.Context().socket(zmq.DEALER); s.setsockopt(zmq.LINGER, 0); s.connect(addr)
def rtt():
    t = time.perf_counter(); s.send_multipart([uuid.uuid4().hex.encode(), b"health", msgpack.packb({})])
    s.recv_multipart(); return (time.perf_counter() - t) * 1000
for _ in range(20): rtt()
hot = sorted(rtt() for _ in range(n))
cold = []
for _ in range(max(10, n // 10)):
    time.sleep(0.25); cold.append(rtt())
cold.sort()
print(json.dumps({"hot": hot, "cold": cold}))
`;

function cpuMsDuring(ms: number): Promise<number> {
  const start = process.cpuUsage();
  return new Promise((resolve) =>
    setTimeout(() => {
      const d = process.cpuUsage(start);
      resolve((d.user + d.system) / 1000);
    }, ms)
  );
}

const pct = (xs: number[], p: number) => xs[Math.min(xs.length - 1, Math.floor(xs.length * p))];

type Impl = "addon" | "zmtp";

async function measure(impl: Impl) {
  const server = await startZmqEnvServer({
    id: "bench",
    run: () => Promise.resolve({}),
  }, { address: "tcp://127.0.0.1:0", impl });
  const idleCpu = await cpuMsDuring(3000);
  const out = await new Deno.Command("/usr/bin/python3", {
    args: ["-c", PY, server.address, String(N)],
    stdout: "piped",
  }).output();
  await server.close();
  const { hot, cold } = JSON.parse(new TextDecoder().decode(out.stdout)) as {
    hot: number[];
    cold: number[];
  };
  return { hot, cold, idleCpu };
}

const baselineCpu = await cpuMsDuring(3000);
const addon = await measure("addon");
const zmtp = await measure("zmtp");
const f = (x: number) => x.toFixed(3);
const row = (name: string, a: number, z: number) =>
  console.log(`| ${name} | ${f(a)} | ${f(z)} | ${(a / z).toFixed(1)}× |`);
console.log(`| measure | addon (libzmq, polled) | zmtp (node:net) | addon / zmtp |`);
console.log(`| --- | --- | --- | --- |`);
row("round trip, hot socket, median (ms)", pct(addon.hot, 0.5), pct(zmtp.hot, 0.5));
row("round trip, hot socket, p90 (ms)", pct(addon.hot, 0.9), pct(zmtp.hot, 0.9));
row("round trip after 250 ms idle, median (ms)", pct(addon.cold, 0.5), pct(zmtp.cold, 0.5));
row("round trip after 250 ms idle, p90 (ms)", pct(addon.cold, 0.9), pct(zmtp.cold, 0.9));
row("server CPU over 3 s idle (ms)", addon.idleCpu, zmtp.idleCpu);
console.log(`\nserver CPU over 3 s idle with no socket open: ${f(baselineCpu)} ms`);
