/**
 * A process that opens a URL toolset (the URL is its argument), calls its `ping`, closes the
 * toolbox and then just ends: tests/mcp_http_close_test.ts checks that it exits by itself.
 */
import { Toolbox } from "../lib/tools/toolbox.ts";

const box = await Toolbox.open([{ name: "s", url: Deno.args[0] }], { state: {} });
console.log(`s_ping: ${(await box.call("s_ping", {})).text}`);
await box.close();
console.log("closed");
