import assert from "node:assert/strict";

const REGISTRY_URL = new URL("./registry.ts", import.meta.url).href;

/**
 * A process that tracks one runtime (its stop prints "stopped"), is sent SIGHUP, and, if it
 * is still running a second later, untracks it and exits 0 by itself.
 */
const SCRIPT = `
import { trackRuntime, untrackRuntime } from "${REGISTRY_URL}";
const tracked = { type: "test", id: "t", stop: () => { console.log("stopped"); return Promise.resolve(); } };
trackRuntime(tracked);
Deno.kill(Deno.pid, "SIGHUP");
setTimeout(() => { console.log("survived"); untrackRuntime(tracked); }, 1000);
`;

async function hangUp(ignored: boolean): Promise<{ code: number; stdout: string }> {
  // The shell sets SIGHUP's disposition, as nohup does, then becomes deno.
  const args = [
    "-c",
    `${ignored ? "trap '' HUP; " : ""}exec "$0" eval "$1"`,
    Deno.execPath(),
    SCRIPT,
  ];
  const out = await new Deno.Command("sh", { args, stdout: "piped", stderr: "piped" }).output();
  return { code: out.code, stdout: new TextDecoder().decode(out.stdout) };
}

Deno.test("a hangup stops every live runtime and exits 129; under nohup (SIGHUP ignored) it is left ignored", async () => {
  const [hup, nohup] = await Promise.all([hangUp(false), hangUp(true)]);
  assert.deepEqual(hup, { code: 129, stdout: "stopped\n" });
  assert.deepEqual(nohup, { code: 0, stdout: "survived\n" });
});
