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

Deno.test("a process dying of an exception or a rejection nothing caught still runs every live runtime's last synchronous cleanup; one a handler prevents is left alone", async () => {
  const crash = async (how: string, prevent = false) => {
    const script = `
import { trackRuntime } from "${REGISTRY_URL}";
${prevent ? `globalThis.addEventListener("unhandledrejection", (e) => e.preventDefault());` : ""}
trackRuntime({ type: "test", id: "t", stop: () => Promise.resolve(), stopSync: () => console.log("swept") });
setTimeout(() => { ${how}; }, 10);
${prevent ? `setTimeout(() => { console.log("alive"); Deno.exit(0); }, 300);` : ""}
`;
    const out = await new Deno.Command(Deno.execPath(), {
      args: ["eval", script],
      stdout: "piped",
      stderr: "null",
    }).output();
    return { code: out.code, stdout: new TextDecoder().decode(out.stdout) };
  };
  const [thrown, rejected, prevented] = await Promise.all([
    crash(`throw new Error("boom")`),
    crash(`Promise.reject(new Error("boom"))`),
    crash(`Promise.reject(new Error("boom"))`, true),
  ]);
  assert.deepEqual(thrown, { code: 1, stdout: "swept\n" });
  assert.deepEqual(rejected, { code: 1, stdout: "swept\n" });
  // Handled, so the process goes on with its runtime untouched.
  assert.deepEqual(prevented, { code: 0, stdout: "alive\n" });
});
