import asyncio
from tests.responses.scripts import Script, handler, text
from tests.responses.wsutil import Client, connect, create

def test_smoke(live_gateway, upstream, gateway_config):
    gateway_config(llm_api_base=upstream.url, upstream_api="responses")
    upstream.script("/v1/responses", handler(Script([text("Hel", "lo")])))
    async def go():
        ws = await connect(live_gateway.url)
        c = Client(ws)
        await c.send(create(stream_id="a", store=False, generate=False))
        evs = await c.until_terminal()
        print([ (e["type"], e.get("stream_id")) for e in evs])
        rid = evs[0]["response"]["id"]
        await c.send(create(stream_id="a", store=False, previous_response_id=rid, input="again"))
        evs = await c.until_terminal()
        print([ (e["type"], e.get("stream_id")) for e in evs])
        print(evs[-1])
        await c.send("{bad")
        print(await c.recv())
        await ws.close()
    asyncio.run(go())
    print(upstream.requests[-1].json())
