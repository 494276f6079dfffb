/**
 * The zeromq addon under Deno: what its polled receive costs. A Deno process serving the
 * ZeroMQ wire (`startZmqEnvServer`, a runner that answers at once) is driven by Debian's
 * pyzmq (libzmq's own blocking wait, no polling on that side):
 *
 * - `health` round trips back to back (the socket is hot, the poll loop spins at 0 ms);
 * - `health` round trips after 250 ms of silence (the loop has backed off to 10 ms);
 * - the server's CPU time during 3 s of idleness, against the same 3 s with no socket open.
 *
 * Prints a markdown table; the ratios are what to compare.
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

const baselineCpu = await cpuMsDuring(3000);
const server = await startZmqEnvServer({
  id: "bench",
  run: () => Promise.resolve({}),
}, { address: "tcp://127.0.0.1:0" });
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
const f = (x: number) => x.toFixed(3);
console.log(`| measure | value |`);
console.log(`| --- | --- |`);
console.log(
  `| round trip, hot socket (median / p90 ms) | ${f(pct(hot, 0.5))} / ${f(pct(hot, 0.9))} |`,
);
console.log(
  `| round trip after 250 ms idle (median / p90 ms) | ${f(pct(cold, 0.5))} / ${
    f(pct(cold, 0.9))
  } |`,
);
console.log(`| idle / hot round trip (median) | ${(pct(cold, 0.5) / pct(hot, 0.5)).toFixed(1)}× |`);
console.log(`| server CPU over 3 s idle, no socket (ms) | ${f(baselineCpu)} |`);
console.log(`| server CPU over 3 s idle, socket polled (ms) | ${f(idleCpu)} |`);
console.log(
  `| polled idle CPU per second / one hot round trip | ${
    (idleCpu / 3 / pct(hot, 0.5)).toFixed(1)
  } round trips' worth |`,
);
