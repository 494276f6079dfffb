import assert from "node:assert/strict";
import { readFile } from "node:fs/promises";
import { hostSourceModule } from "../../scripts/gen_host_source.ts";

Deno.test("lib/sandbox/_host_source.ts matches the host's source files (regenerate with scripts/gen_host_source.ts)", async () => {
  const have = await readFile(new URL("./_host_source.ts", import.meta.url), "utf8");
  assert.equal(have, await hostSourceModule());
});
