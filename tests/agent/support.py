"""Helpers for tests that run a real agent in-process."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import jsonschema
from referencing import Registry, Resource

from edgeheal import config
from edgeheal.agent import http_server as http
from edgeheal.agent.supervisor import Agent
from edgeheal.base import compat
from edgeheal.checks import Check

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"


def _registry() -> Registry:
    resources = []
    for path in SCHEMAS.glob("*.schema.json"):
        doc = json.loads(path.read_text())
        resources.append((doc["$id"].split("/")[-1], Resource.from_contents(doc)))
        resources.append((doc["$id"], Resource.from_contents(doc)))
    return Registry().with_resources(resources)


def validate(instance: Any, schema: str) -> None:
    doc = json.loads((SCHEMAS / schema).read_text())
    jsonschema.Draft202012Validator(
        doc, registry=_registry(), format_checker=jsonschema.FormatChecker(),
    ).validate(instance)





class Running:
    def __init__(self, agent: Agent, base: str, session: aiohttp.ClientSession) -> None:
        self.agent, self.base, self.session = agent, base, session

    async def get(self, path: str) -> tuple[int, Any]:
        async with self.session.get(self.base + path) as resp:
            if resp.content_type == "application/json":
                return resp.status, await resp.json()
            return resp.status, await resp.text()


@asynccontextmanager
async def running_agent(tmp_path: Path, checks: list[Check], toml: str = "",
                        **kw: Any) -> AsyncIterator[Running]:
    cfg = config.loads_generic(f'[agent]\nstate_dir = "{tmp_path}/state"\nnode_name = "edge-test"\n'
                       f'check_interval = "0.2s"\n[http]\nlisten = ["127.0.0.1:0"]\n{toml}')
    agent = Agent(cfg, checks=checks, **kw)
    task = asyncio.create_task(agent.run(), name="test.agent")
    try:
        async with compat.timeout(10):
            while agent.http_runner is None or not http.bound_ports(agent.http_runner):
                if task.done():
                    task.result()
                await asyncio.sleep(0.01)
        port = http.bound_ports(agent.http_runner)[0]
        async with aiohttp.ClientSession() as session:
            yield Running(agent, f"http://127.0.0.1:{port}", session)
    finally:
        agent.stop_event.set()
        async with compat.timeout(6):
            await task
