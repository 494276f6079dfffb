// Helper of runtime_conformance_test.ts: starts a docker and a subprocess runtime, reports
// their ids on stdout, then either waits to be signalled (`wait`) or simply ends without
// stopping them (`exit`). The registry must clean both up either way.
import { createRuntime } from "../runtimes/mod.ts";

const docker = createRuntime({ type: "docker", image: "busybox" }, { runId: "signal-test" });
const sub = createRuntime({ type: "subprocess" });
await Promise.all([docker.start(), sub.start()]);
console.log(JSON.stringify({ container: docker.id, dir: sub.id }));
if (Deno.args[0] !== "exit") setTimeout(() => {}, 60_000); // keep running until signalled
