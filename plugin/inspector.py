"""A live web inspector for a running :class:`plugin.World` (aiohttp).

    app = make_app(world)                 # an aiohttp.web.Application
    web.run_app(app, port=8765)           # or add it to your own runner

Page ``/``: the NPC list with states, the selected NPC's behavior tree with node statuses
coloured (what each node returned on its last traced tick, live RUNNING nodes in orange), its
blackboard, the recent lines and the engine's metrics; it polls the JSON endpoints below.

JSON: ``/api/world`` (time, context, players, world stats), ``/api/npcs`` (every NPC with its
state), ``/api/npcs/{id}`` (one NPC: blackboard, tree nodes with statuses, Mermaid text),
``/api/lines?limit=N`` (recent lines, newest last), ``/api/metrics`` (world and engine stats).
``/metrics``: the engine's Prometheus metrics, when the generator exposes a registry.

The handlers read the world without locking: run the world's updates on the same event loop
(as ``flashnpc inspect`` does), or pass a ``threading.Lock`` that your game loop holds while
it calls ``world.update``.
"""

from __future__ import annotations

import contextlib
import json
import math
import threading
from dataclasses import asdict
from typing import Any

from aiohttp import web

from behavior_tree.display import STATUS_COLORS, statuses_from_trace, to_mermaid

from .world import World

__all__ = ["make_app", "npc_detail", "npc_summary", "world_summary"]

_TRACE_TICKS = 4


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return repr(value)


def npc_summary(world: World, npc_id: Any) -> dict[str, Any]:
    npc = world.npcs[npc_id]
    return {
        "id": npc.id, "archetype": npc.archetype, "persona": list(npc.persona),
        "state": world.npc_state(npc_id), "tree_state": _jsonable(npc.blackboard.get(world.state_key, None)),
        "position": list(npc.position), "radius": npc.radius, "players_near": list(npc.near),
        "asleep": npc.tree.asleep, "ticks": npc.tree.tick_count, "errors": len(npc.tree.errors),
    }


def npc_detail(world: World, npc_id: Any) -> dict[str, Any]:
    """One NPC for the inspector. Switches tracing on for its tree (the last few ticks), so
    that nodes show what they *returned*, not only the live RUNNING/IDLE statuses."""
    npc = world.npcs[npc_id]
    tree = npc.tree
    trace = tree.trace
    if trace is None:
        trace = tree.enable_trace(max_ticks=_TRACE_TICKS)
    returned = statuses_from_trace(trace.records[-1]) if trace.records else {}
    nodes = []
    parents: list[int] = []
    for node, depth in tree.walk():
        del parents[depth:]
        live = node.status
        shown = live if live.name == "RUNNING" else returned.get(node.uid, live)
        nodes.append({
            "uid": node.uid, "name": node.name, "id": node.id, "kind": node.kind, "depth": depth,
            "parent": parents[-1] if parents else None, "status": shown.name, "live": live.name,
            "color": STATUS_COLORS[shown],
        })
        parents.append(node.uid)
    return {
        **npc_summary(world, npc_id),
        "blackboard": _jsonable(npc.blackboard.as_dict()),
        "tree": {"main": tree.definition.main_tree, "nodes": nodes},
        "mermaid": to_mermaid(tree, statuses=returned),
        "last_errors": [f"{e.node_name}: {e.exception}" for e in tree.errors[-5:]],
    }


def world_summary(world: World) -> dict[str, Any]:
    return {
        "time": world.time, "frame": world.frame, "context": dict(world.context),
        "players": [{"id": p.id, "name": p.name, "position": list(p.position), "reputation": p.reputation}
                    for p in world.players.values()],
        "stats": _jsonable(world.stats()),
    }


def make_app(world: World, *, lock: threading.Lock | None = None) -> web.Application:
    """The inspector as an aiohttp application over ``world`` (see the module docstring)."""
    guard = lock if lock is not None else contextlib.nullcontext()

    def reply(data: Any) -> web.Response:
        return web.json_response(data, dumps=lambda d: json.dumps(d, default=repr))

    async def index(_: web.Request) -> web.Response:
        return web.Response(text=PAGE, content_type="text/html")

    async def api_world(_: web.Request) -> web.Response:
        with guard:
            return reply(world_summary(world))

    async def api_npcs(_: web.Request) -> web.Response:
        with guard:
            return reply([npc_summary(world, i) for i in world.npcs])

    async def api_npc(request: web.Request) -> web.Response:
        key = request.match_info["npc_id"]
        with guard:
            npc_id = key if key in world.npcs else _int_or(key)
            if npc_id not in world.npcs:
                raise web.HTTPNotFound(text=json.dumps({"error": f"no NPC with id {key!r}"}),
                                       content_type="application/json")
            return reply(npc_detail(world, npc_id))

    async def api_lines(request: web.Request) -> web.Response:
        try:
            limit = int(request.query.get("limit", "50"))
        except ValueError:
            raise web.HTTPBadRequest(text='{"error": "limit must be an integer"}',
                                     content_type="application/json") from None
        with guard:
            recent = list(world.recent_lines)[-max(0, limit):] if limit > 0 else []
            return reply([asdict(e) for e in recent])

    async def api_metrics(_: web.Request) -> web.Response:
        with guard:
            engine = world.generator.stats() if hasattr(world.generator, "stats") else {}
            return reply({"world": _jsonable(world.stats()), "engine": _jsonable(engine)})

    async def prometheus(_: web.Request) -> web.Response:
        registry = getattr(world.generator, "metrics_registry", None)
        if registry is None:
            raise web.HTTPNotFound(text="the generator exposes no metrics registry")
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return web.Response(body=generate_latest(registry),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/", index)
    app.router.add_get("/api/world", api_world)
    app.router.add_get("/api/npcs", api_npcs)
    app.router.add_get("/api/npcs/{npc_id}", api_npc)
    app.router.add_get("/api/lines", api_lines)
    app.router.add_get("/api/metrics", api_metrics)
    app.router.add_get("/metrics", prometheus)
    return app


def _int_or(key: str) -> Any:
    try:
        return int(key)
    except ValueError:
        return key


PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>FlashNPC inspector</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
 *{box-sizing:border-box} html{color-scheme:dark}
 body{font:14px system-ui,sans-serif;margin:0;background:#1e2228;color:#e6e6e6}
 header{padding:8px 14px;background:#2b313a;display:flex;flex-wrap:wrap;gap:8px 22px;align-items:baseline}
 h1{font-size:17px;margin:0} h2{font-size:14px;margin:12px 0 6px;color:#9fb3c8} h2:first-child{margin-top:2px}
 .chip{display:inline-block;margin-right:6px;padding:1px 8px;border-radius:9px;background:#3a4350;font-size:12px}
 .chip b{color:#9fb3c8;font-weight:normal}
 main{display:grid;grid-template-columns:minmax(210px,24%) minmax(0,1fr) minmax(240px,30%);gap:12px;
  padding:12px;height:calc(100vh - 40px)}
 section{background:#262b33;border-radius:6px;padding:8px 10px;overflow:auto;min-height:0}
 @media (max-width:1100px){main{grid-template-columns:minmax(250px,34%) minmax(0,1fr);height:auto}
  section{max-height:80vh} #recent{grid-column:1/-1}}
 @media (max-width:700px){main{grid-template-columns:1fr}}
 #npcs td{white-space:nowrap}
 table{border-collapse:collapse;width:100%} td,th{padding:3px 5px;text-align:left} th{color:#9aa5b1;font-weight:600}
 tr.npc{cursor:pointer} tr.npc:hover,tr.sel{background:#3a4350}
 .st{padding:1px 6px;border-radius:8px;color:#111;font-size:12px}
 .row{display:flex;align-items:center;gap:6px;margin:2px 0;white-space:nowrap}
 .node{display:inline-block;padding:2px 8px;border-radius:4px;color:#111;border:1px solid #0006}
 .kind{font-size:11px;color:#333} .line{margin:4px 0;padding:4px 6px;background:#2f3640;border-radius:4px}
 .meta{color:#9aa5b1;font-size:12px} pre{white-space:pre-wrap;font-size:12px;margin:0}
 .legend{margin-top:6px;color:#9aa5b1;font-size:12px;line-height:1.5}
 dl{display:grid;grid-template-columns:max-content 1fr;gap:2px 10px;margin:0;font-size:13px}
 dt{color:#9aa5b1} dd{margin:0;font-variant-numeric:tabular-nums}
 .near{color:#77dd77} .empty{color:#9aa5b1;font-style:italic}
</style></head><body>
<header><h1>FlashNPC inspector</h1><span id="clock"></span><span id="ctx"></span></header>
<main>
 <section><h2>NPCs</h2><table id="npcs"></table>
  <div class="legend"><span class="near">&#9679;</span> a player is near &nbsp; <span class="meta">zz</span> tree asleep
   (ticked again when a key it read changes or its timer ends)</div>
  <h2>players</h2><div id="players"></div>
  <h2>metrics</h2><dl id="metrics"></dl></section>
 <section><h2 id="title">behavior tree</h2><div id="tree"></div><h2>blackboard</h2><pre id="bb"></pre></section>
 <section id="recent"><h2>recent lines <span class="meta">(newest first)</span></h2><div id="lines"></div></section>
</main>
<script>
const STATE_COLORS={patrol:'#8ecae6',idle:'#d9d9d9',alert:'#ffb347',combat:'#ff6961',flee:'#f4a6d7',
 rest:'#b8b8ff',working:'#b5e48c',friendly:'#77dd77'};
let selected=null;
const esc=s=>String(s).replace(/[&<>"]/g,c=>({'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;'}[c]));
const num=v=>v==null?'-':Number(v).toFixed(1),pct=v=>v==null?'-':(100*v).toFixed(0)+'%';
const counts=o=>{const e=Object.entries(o||{}).filter(([,n])=>n);return e.length?e.map(([k,n])=>k+' '+n).join(', '):'none';};
const fmtv=v=>v===''||v==null?'-':typeof v==='object'?JSON.stringify(v):v;
async function get(u){const r=await fetch(u);if(!r.ok)throw new Error(u+': '+r.status);return r.json();}
async function refresh(){
 try{
  const w=await get('/api/world');
  document.getElementById('clock').textContent='t = '+w.time.toFixed(1)+' s, frame '+w.frame;
  document.getElementById('ctx').innerHTML=Object.entries(w.context).map(([k,v])=>
   `<span class="chip"><b>${esc(k.replace(/_/g,' '))}</b> ${esc(v)}</span>`).join('');
  document.getElementById('players').innerHTML=w.players.length?'<table><tr><th>player</th><th>at</th><th>reputation</th></tr>'+
   w.players.map(p=>`<tr><td>${esc(p.name)}</td><td>${p.position.map(x=>Number(x).toFixed(0)).join(', ')}</td>`+
   `<td>${esc(fmtv(p.reputation))}</td></tr>`).join('')+'</table>':'<span class="empty">no players</span>';
  const npcs=await get('/api/npcs');
  if(selected===null&&npcs.length)selected=npcs[0].id;
  document.getElementById('npcs').innerHTML='<tr><th>NPC</th><th>archetype</th><th>state</th></tr>'+
   npcs.map(n=>`<tr class="npc${n.id===selected?' sel':''}" data-id="${esc(n.id)}"><td>${esc(n.id)}</td>`+
   `<td>${esc(n.archetype)}</td><td><span class="st" style="background:${STATE_COLORS[n.state]||'#ddd'}">`+
   `${esc(n.state)}</span>${n.players_near.length?' <span class="near" title="a player is near">&#9679;</span>':''}`+
   `${n.asleep?' <span class="meta" title="tree asleep">zz</span>':''}</td></tr>`).join('');
  for(const tr of document.querySelectorAll('tr.npc'))tr.onclick=()=>{selected=tr.dataset.id;refresh();};
  if(selected!==null){
   const d=await get('/api/npcs/'+encodeURIComponent(selected));
   document.getElementById('title').textContent='behavior tree of '+d.id+' ('+d.archetype+', '+d.tree.main+')';
   document.getElementById('tree').innerHTML=d.tree.nodes.map(n=>`<div class="row" style="margin-left:${n.depth*18}px">`+
    `<span class="node" style="background:${n.color}" title="${esc(n.status)}">${esc(n.name)}`+
    `${n.name!==n.id?' <span class="kind">'+esc(n.id)+'</span>':''}</span><span class="meta">${esc(n.status)}</span></div>`).join('');
   document.getElementById('bb').textContent=Object.entries(d.blackboard).map(([k,v])=>k+': '+fmtv(v)).join('\\n');
  }
  const lines=await get('/api/lines?limit=30');
  document.getElementById('lines').innerHTML=lines.length?lines.reverse().map(l=>`<div class="line"><b>${esc(l.npc_id)}</b> `+
   `<span class="meta">t ${Number(l.time).toFixed(1)} s · ${esc(l.state)}, ${esc(l.intent)} · ${l.latency_ms.toFixed(0)} ms`+
   `${l.fallback?' · fallback'+(l.fallback_reason?' ('+esc(l.fallback_reason)+')':''):''}</span>`+
   `<br>${esc(l.text)}</div>`).join(''):'<span class="empty">no lines yet: walk a player up to an NPC</span>';
  const m=await get('/api/metrics');
  const e=m.engine||{},s=m.world,pc=e.prefix_cache||{};
  const rows=[['lines',s.lines],['fallbacks',s.fallbacks],['in flight / queued',s.in_flight+' / '+s.queued],
   ['latency p50 / p99',num(s.latency_ms_p50)+' / '+num(s.latency_ms_p99)+' ms'],
   ['stale lines dropped',s.dropped_stale],['regenerated',s.regenerated],
   ['tree ticks',s.tree_ticks],['trees asleep',s.trees_sleeping],
   ['engine lines',e.lines==null?'-':e.lines],['prefix-cache hits',pct(pc.hit_rate)],
   ['fallback reasons',counts(e.fallback_reasons)],
   ['active parameters',e.active_params_pct==null?'-':Number(e.active_params_pct).toFixed(1)+'%']];
  document.getElementById('metrics').innerHTML=rows.map(([k,v])=>`<dt>${esc(k)}</dt><dd>${esc(v)}</dd>`).join('');
 }catch(err){document.getElementById('clock').textContent='disconnected: '+err.message;}
}
refresh();setInterval(refresh,700);
</script></body></html>
"""
