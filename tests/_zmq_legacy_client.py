#!/usr/bin/env python3
"""The trainer side of tests/zmq_serve_test.ts for a legacy environment (gsm8k): Debian's
python3-zmq and python3-msgpack driving `vf serve gsm8k --zmq` through
examples/zmq_trainer.py's DEALER client, as prime-rl drives any env server. Prints one JSON
object with every reply the test asserts on.

Usage: _zmq_legacy_client.py <address> <model base_url>
"""

import asyncio
import json
import os
import sys
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
from zmq_trainer import EnvClient  # noqa: E402


async def main() -> None:
    address, base_url = sys.argv[1:3]
    env = EnvClient(address, "2026-08")
    out: dict = {}
    client = {"base_url": base_url, "api_key_var": "PRIME_API_KEY", "headers": {}}
    sampling = {"temperature": 1.0, "top_p": None, "max_tokens": None}

    def run(data: dict, request_id: str | None = None):
        return env.request("run", {"task_data": data, "client": client, "model": "m",
                                   "sampling": sampling}, request_id=request_id)

    try:
        await env.wait_for_server(timeout=60)
        out["health"] = await env.request("health", {})

        # 8 rows at once, half right: the model answers 18 to everything.
        out["runs"] = await asyncio.gather(*(
            run({"prompt": f"What is 9 + {9 + i % 2}?", "answer": str(18 + i % 2), "idx": i,
                 "info": None})
            for i in range(8)))

        # Cancel a run whose model call hangs, once the server has it in flight.
        run_id = uuid.uuid4().hex
        pending = asyncio.create_task(run({"prompt": "HANG", "answer": "1"}, run_id))
        while (await env.request("health", {})).get("in_flight") != 1:
            await asyncio.sleep(0.05)
        out["cancel"] = await env.request("cancel", {"request_id": run_id})
        out["cancelled_run"] = await pending

        out["bad_task_data"] = await run({"answer": "1"})
        out["health_after"] = await env.request("health", {})
    finally:
        env.close()
    print(json.dumps(out))


asyncio.run(main())
