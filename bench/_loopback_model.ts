/**
 * A loopback OpenAI-compatible server in a child process that answers every chat completion at
 * once with the same canned reply ("The answer is 4."), for benchmarks that measure the client.
 * @module
 */

const SERVER = `
const body = JSON.stringify({
  id: "c", object: "chat.completion", created: 0, model: "bench",
  choices: [{ index: 0, message: { role: "assistant", content: "The answer is 4." }, finish_reason: "stop" }],
  usage: { prompt_tokens: 12, completion_tokens: 5, total_tokens: 17 },
});
Deno.serve({ port: 0, hostname: "127.0.0.1", onListen: ({ port }) => console.log(port) }, async (req) => {
  await req.arrayBuffer();
  return new Response(body, { headers: { "content-type": "application/json" } });
});
`;

/** Starts the server; `url` is its base URL (`…/v1`), `pid` its process, `kill()` stops it. */
export async function startLoopbackModel(): Promise<
  { url: string; pid: number; kill: () => void }
> {
  const child = new Deno.Command(Deno.execPath(), {
    args: ["eval", SERVER],
    stdout: "piped",
    stderr: "inherit",
  }).spawn();
  const reader = child.stdout.getReader();
  const { value } = await reader.read();
  const port = Number(new TextDecoder().decode(value).trim());
  reader.releaseLock();
  return {
    url: `http://127.0.0.1:${port}/v1`,
    pid: child.pid,
    kill: () => child.kill("SIGTERM"),
  };
}
