"""Several models served side by side: the base model and a studio's fine-tunes, one
:class:`runtime.serving.dialogue_service.DialogueService` each, behind one session table.

::

    router = ModelRouter.load({"base": None, "pirate": "runs/pirate_port"}, engine="torch",
                              capacity=CapacityRule(min_hit_rate=0.6, fallback_model="base"))
    await router.start()
    sid = router.open_session("smuggler", state="alert", model="pirate", essential=False)
    line = await router.request_line(sid, "greet")    # line.served_by: "pirate", "base" or "authored"
    await router.close()

**Models.** Each name maps to an exported model directory (None: the shipped model) and gets
its own service: its own engine (weights, tokenizer, word masks, prefix block cache), its own
authored lines (a fine-tune's ``fallbacks.json`` has its new archetypes; a line for the
request's intent, :class:`runtime.client.fallback.FallbackBook`), its own breaker,
queue and deadlines. What is shared: the settings every service is loaded with, one session
id space, one ``/metrics`` page and one health report. A fine-tune's adapters are merged into
its weights (``flashnpc finetune``), so two models share no tensors.

**Sessions** name their model at open (default ``base``; an unknown name is a ValueError
listing the known ones, :class:`UnknownModel`); every request of the session goes to that
model's service. ``essential`` (default True) marks whether the capacity rule may move it.

**The capacity rule** (:class:`CapacityRule`, the design's: shed the light work when the cache
stops paying). For each model, its prefix-cache hit rate over a sliding window
(:class:`runtime.serving.dialogue_service.PrefixHitWindow`: prefix tokens found / looked up
over the lookups of the last ``window_s`` seconds, judged only once the window holds
``min_requests`` lookups). While that rate is under ``min_hit_rate`` (default 0.6; 0
disables the rule) the model is *shedding*: a request of a **non-essential** session is
served by ``fallback_model`` when one is configured, is not the session's own model, knows the
session's archetype, persona, state and context (a fine-tune's new archetype is unknown to
the base), and is not busy; otherwise the session's own model answers with an authored line
(``fallback_reason`` ``capacity``) without running. Essential sessions always get their own
model. Shed requests no longer reach the model, so its window then holds only the essential
ones; when no request at all reaches it for ``window_s``, the window empties, the rate is
unknown again and non-essential requests probe the model anew.

The prefix cache is the PyTorch engine's block cache (``engine="torch"``, the GPU default).
The onnxruntime engine (the CPU default) has none: its window stays empty, its rate unknown,
and the rule never sheds on it.

Every :class:`DialogueLine` the router returns has ``served_by``: the name of the model that
produced the text, or ``"authored"`` for any authored line (the rule's, or a model's own
fallback: ``fallback_reason`` says which).

Metrics (:meth:`exposition`): every service's registry with the ``model_name`` label set to
the model's served name, plus ``flashnpc_served_lines_total{model_name, served_by}`` (lines
for the sessions of ``model_name``, by what produced them),
``flashnpc_capacity_shedding{model_name}`` (1 while shedding) and
``flashnpc_prefix_cache_window_hit_ratio{model_name}`` (the window's rate, once known).
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from runtime.serving.dialogue_service import (
    Busy,
    DialogueLine,
    DialogueService,
    PrefixHitWindow,
    Session,
    SessionNotFound,
    StartClose,
)

__all__ = ["AUTHORED", "BASE", "MODEL_FILES", "CapacityRule", "ModelRouter", "UnknownModel",
           "check_model_dir", "parse_model_specs"]

BASE = "base"
AUTHORED = "authored"
#: the files of an exported model directory (``flashnpc export onnx`` / ``flashnpc finetune``)
MODEL_FILES = ("model.int4.onnx", "config.json", "tokenizer.json")
_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")


class UnknownModel(ValueError):
    """A session named a model this server does not serve."""


@dataclass(frozen=True)
class CapacityRule:
    """When to shed non-essential sessions (see the module docstring). ``min_hit_rate`` in
    0..1 (0: never); ``fallback_model``: a loaded model's name, or None for authored lines."""

    min_hit_rate: float = 0.6
    window_s: float = 30.0
    min_requests: int = 20
    fallback_model: str | None = None

    def __post_init__(self) -> None:
        if not 0.0 <= self.min_hit_rate <= 1.0:
            raise ValueError(f"capacity hit rate must be in 0..1, got {self.min_hit_rate!r}")
        if not self.window_s > 0 or self.min_requests < 1:
            raise ValueError(f"capacity window: need window_s > 0 and min_requests >= 1, got "
                             f"{self.window_s!r}, {self.min_requests!r}")

    def check_models(self, models: Sequence[str]) -> None:
        """ValueError unless ``fallback_model`` is None or one of ``models``."""
        if self.fallback_model is not None and self.fallback_model not in models:
            raise ValueError(f"--fallback-model {self.fallback_model}: not a loaded model "
                             f"(models: {', '.join(models)})")


def check_model_dir(path: str | Path, what: str) -> Path:
    """``path`` if it is an exported model directory, else ValueError naming ``what`` and the
    missing file."""
    p = Path(path)
    if not p.is_dir():
        raise ValueError(f"{what}: {p} is not a directory")
    missing = [f for f in MODEL_FILES if not (p / f).is_file()]
    if missing:
        raise ValueError(f"{what}: {p} is not an exported model directory (missing "
                         f"{', '.join(missing)}; `flashnpc export onnx` and `flashnpc finetune` write one)")
    return p


def parse_model_specs(specs: Sequence[str], base_dir: str | Path | None = None) -> dict[str, Path | None]:
    """``--model NAME=DIR`` values (repeatable) plus the base model (``base_dir``, None: the
    shipped one) as ``{name: directory}``, base first. Names are 1..64 characters of lower-case
    letters, digits, ``_ . -`` starting with a letter or digit; ``base`` is the base model's.
    A bad spec, a name given twice or a directory that is not an exported model is a
    ValueError naming the spec."""
    models: dict[str, Path | None] = {
        BASE: None if base_dir is None else check_model_dir(base_dir, "--model-dir")}
    for spec in specs:
        name, sep, directory = spec.partition("=")
        if not sep or not name or not directory:
            raise ValueError(f"--model {spec}: expected NAME=DIR (e.g. pirate=runs/pirate_port)")
        if not _NAME.match(name):
            raise ValueError(f"--model {spec}: the name {name!r} must be 1..64 lower-case letters, digits, "
                             f"'_', '.' or '-', starting with a letter or digit")
        if name in models:
            raise ValueError(f"--model {spec}: the name {name!r} is given twice"
                             + (" ('base' is the --model-dir / shipped model)" if name == BASE else ""))
        models[name] = check_model_dir(directory, f"--model {spec}")
    return models


@dataclass
class _Route:
    model: str
    essential: bool
    session: Session


class ModelRouter(StartClose):
    """Sessions routed to one of several :class:`DialogueService`\\ s; see the module docstring.

    It has the service methods the dialogue server uses (``start``, ``close``,
    ``open_session``, ``session``, ``update_state``, ``close_session``, ``request_line``,
    ``health``, ``exposition``, ``retry_after_ms``, ``num_sessions``)."""

    def __init__(self, services: Mapping[str, DialogueService], *, capacity: CapacityRule | None = None) -> None:
        if BASE not in services:
            raise ValueError(f"ModelRouter: one model must be named {BASE!r}, got {sorted(services)}")
        self.services = dict(services)
        self.capacity = capacity or CapacityRule()
        self.capacity.check_models(list(self.services))
        for svc in self.services.values():
            svc.prefix_window = PrefixHitWindow(window_s=self.capacity.window_s,
                                                min_requests=self.capacity.min_requests)
        self._routes: dict[str, _Route] = {}
        self._ids = itertools.count(1)
        self.registry = CollectorRegistry(auto_describe=False)
        self._served = Counter("flashnpc_served_lines", "Lines for a model's sessions, by what produced them.",
                               ["model_name", "served_by"], registry=self.registry)
        self._shedding = Gauge("flashnpc_capacity_shedding",
                               "1 while the capacity rule sheds a model's non-essential sessions.",
                               ["model_name"], registry=self.registry)
        self._window = Gauge("flashnpc_prefix_cache_window_hit_ratio",
                             "A model's prefix-cache hit rate (0-1) over the capacity rule's window.",
                             ["model_name"], registry=self.registry)
        for name in self.services:
            self._shedding.labels(name)
            self._served.labels(name, name)
            self._served.labels(name, AUTHORED)
        self.registry.register(_Relabelled(self.services))

    @classmethod
    def load(cls, models: Mapping[str, str | Path | None], *, capacity: CapacityRule | None = None,
             **options: Any) -> ModelRouter:
        """One :meth:`DialogueService.load` per model (``{name: directory}``, None: the shipped
        model), all with the same ``options``, each named by its model (the metrics' label)."""
        return cls({name: DialogueService.load(path, name=name, **options) for name, path in models.items()},
                   capacity=capacity)

    @property
    def models(self) -> list[str]:
        return list(self.services)

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        for svc in self.services.values():
            await svc.start()

    async def close(self) -> None:
        for svc in self.services.values():
            await svc.close()

    # ------------------------------------------------------------ sessions

    def open_session(self, npc: str, *, state: str, persona: Sequence[str] = (),
                     context: Mapping[str, str] | None = None, npc_id: Any = None, player_id: Any = None,
                     session_id: str | None = None, model: str = BASE, essential: bool = True) -> str:
        """Open a session on ``model`` (see :meth:`DialogueService.open_session`); an unknown
        model is :class:`UnknownModel` naming the known ones."""
        svc = self.services.get(model)
        if svc is None:
            raise UnknownModel(f"unknown model {model!r} (models: {', '.join(self.services)})")
        sid = session_id if session_id is not None else f"s{next(self._ids)}"  # one id space
        if sid in self._routes:
            raise ValueError(f"session id {sid!r} is already open")
        svc.open_session(npc, state=state, persona=persona, context=context, npc_id=npc_id,
                         player_id=player_id, session_id=sid)
        self._routes[sid] = _Route(model, bool(essential), svc.session(sid))
        return sid

    def session(self, session_id: str) -> Session:
        """The open session (:class:`SessionNotFound` if none)."""
        return self._route(session_id).session

    def model_of(self, session_id: str) -> str:
        """The name of the model the session opened on."""
        return self._route(session_id).model

    def update_state(self, session_id: str, *, state: str | None = None, context: Mapping[str, str] | None = None,
                     persona: Sequence[str] | None = None) -> Session:
        """:meth:`DialogueService.update_state` on the session's model."""
        route = self._route(session_id)
        return self.services[route.model].update_state(session_id, state=state, context=context, persona=persona)

    def close_session(self, session_id: str) -> None:
        """Close the session; its requests still running on the fallback model end too."""
        route = self._route(session_id)
        del self._routes[session_id]
        for name, svc in self.services.items():
            if name != route.model:
                svc.cancel_requests(route.session)
        self.services[route.model].close_session(session_id)

    @property
    def num_sessions(self) -> int:
        return len(self._routes)

    def _route(self, session_id: str) -> _Route:
        try:
            return self._routes[session_id]
        except KeyError:
            raise SessionNotFound(f"no open dialogue session {session_id!r}") from None

    # ------------------------------------------------------------ requests

    def shedding(self, model: str) -> bool:
        """Is the capacity rule shedding ``model``'s non-essential sessions now?"""
        if self.capacity.min_hit_rate <= 0:
            return False
        rate = self.services[model].prefix_window.rate()
        return rate is not None and rate < self.capacity.min_hit_rate

    async def request_line(self, session_id: str, intent: str, **options: Any) -> DialogueLine:
        """A line for the session (``options``: those of :meth:`DialogueService.request_line`),
        from its model, or, for a non-essential session while its model is shedding, from the
        fallback model or authored; ``served_by`` says which. Raises what the session's own
        model raises (:class:`Busy`, ValueError, :class:`SessionNotFound`)."""
        route = self._route(session_id)
        own = self.services[route.model]
        line: DialogueLine | None = None
        if not route.essential and self.shedding(route.model):
            fb = self.capacity.fallback_model
            if fb is not None and fb != route.model:
                try:
                    line = await self.services[fb].request_line(route.session, intent, **options)
                except (ValueError, Busy):  # it does not know the session's values, or is full
                    line = None
            if line is None:
                line = await own.request_line(session_id, intent, authored="capacity", **options)
            else:
                line = dataclasses.replace(line, served_by=fb)
        else:
            line = await own.request_line(session_id, intent, **options)
            line = dataclasses.replace(line, served_by=route.model)
        if line.fallback:
            line = dataclasses.replace(line, served_by=AUTHORED)
        self._served.labels(route.model, line.served_by).inc()
        return line

    def retry_after_ms(self, session_id: str | None = None) -> int:
        """The session's model's :meth:`DialogueService.retry_after_ms` (None: the base's)."""
        model = BASE if session_id is None or session_id not in self._routes else self._routes[session_id].model
        return self.services[model].retry_after_ms()

    # ------------------------------------------------------------ health and metrics

    def health(self) -> dict[str, Any]:
        """``models``: each model's :meth:`DialogueService.health` plus ``shedding``; the other
        fields are the base model's (what a one-model server reports), except ``status``
        (``degraded`` while any model's breaker is not closed) and ``sessions`` (all models)."""
        models = {name: {**svc.health(), "shedding": self.shedding(name)} for name, svc in self.services.items()}
        degraded = any(h["status"] != "ok" for h in models.values())
        return {**models[BASE], "status": "degraded" if degraded else "ok", "sessions": len(self._routes),
                "models": models, "capacity": dataclasses.asdict(self.capacity)}

    def exposition(self) -> bytes:
        """Every model's metrics and the router's, as one Prometheus text page."""
        for name, svc in self.services.items():
            self._shedding.labels(name).set(1 if self.shedding(name) else 0)
            rate = svc.prefix_window.rate()
            if rate is not None:
                self._window.labels(name).set(rate)
            svc.refresh_gauges()
        return generate_latest(self.registry)


class _Relabelled(Collector):
    """The services' metric families merged by name, each sample's ``model_name`` label set to
    its service's served name (so a service made under another name still reads right)."""

    def __init__(self, services: Mapping[str, DialogueService]) -> None:
        self.services = services

    def collect(self) -> Iterator[Metric]:
        merged: dict[str, Metric] = {}
        for name, svc in self.services.items():
            for fam in svc.registry.collect():
                have = merged.get(fam.name)
                if have is None:
                    have = merged[fam.name] = Metric(fam.name, fam.documentation, fam.type, fam.unit)
                have.samples.extend(s._replace(labels={**s.labels, "model_name": name})
                                    if "model_name" in s.labels else s for s in fam.samples)
        yield from merged.values()
