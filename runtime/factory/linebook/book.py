"""The line book itself: its catalogue, fragments and patterns read and cross-checked, the
expansion into training lines, and its outputs (fallback cells, signatures, voice markers,
vocabulary).
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace

import yaml

from runtime.client.fallback import ANY_INTENT
from runtime.factory.linebook.lint import (
    _SLOT_GLUED_RE,
    _check_known,
    _normalize,
    _unknown,
    lint_line,
    repeated_word,
    sentences,
)
from runtime.factory.linebook.reader import _Raw, _Reader
from runtime.factory.linebook.templates import (
    _NO_SOURCES,
    _collect,
    _Drawn,
    _literal_text,
    _parse_template,
    _part_positions,
    _Pattern,
    _Source,
    _Template,
)
from runtime.factory.linebook.types import (
    _COMMON,
    _PART_GROUPS,
    _SLOT_RE,
    BUILTIN_GROUPS,
    FALLBACK_MAX_WORDS,
    TONES,
    VOICE_MARKER_MIN_TEMPLATES,
    Example,
    LineBookError,
    LintProblem,
    Split,
    _Where,
    _words,
)
from runtime.factory.text_metrics import SignatureIndex
from runtime.tokenizer import check_request


class LineBook:
    """A validated line book. Build it with :func:`load_line_book`."""

    archetypes: list[str]
    persona_traits: list[str]
    states: list[str]
    intents: list[str]
    context: dict[str, list[str]]
    slots: list[str]
    banned_words: list[str]

    def __init__(self, raw: _Raw) -> None:
        self._sources: list[_Source] = []
        self._read_lists(raw)
        self._read_catalog(raw)
        self._read_fragments(raw)
        self._check_references()
        self._check_implies()
        self._fit_cache: dict[tuple[int, str, str, str | None], list[_Source]] = {}
        self._examples: list[Example] | None = None
        self._signatures: dict[str, list[str]] | None = None
        self._signature_hits: SignatureIndex | None = None  # lines_for's index of the signatures
        self._markers: tuple[int, dict[str, list[str]]] | None = None
        self._vocabulary: list[str] | None = None

    # -------------------------------------------------------------- reading

    def _entries(self, raw: _Raw, section: str) -> list[tuple[_Reader, str, yaml.Node, yaml.Node]]:
        return raw.sections.get(section, [])

    def _require(self, raw: _Raw, section: str, file_hint: str) -> None:
        if not raw.sections.get(section) and not raw.lists.get(section):
            raise LineBookError(file_hint, 1, section, "required section is missing")

    def _template(self, rd: _Reader, node: yaml.Node, field: str) -> _Source:
        text = rd.string(node, field)
        where = rd.where(node, field)
        template = _parse_template(text, where)
        literal = _literal_text(text).lower()
        for word in self.banned_words:
            if re.search(r"(?<![A-Za-z])" + re.escape(word) + r"(?![A-Za-z])", literal):
                raise where.error(f"banned word {word!r} in {text!r}")
        slots: set[str] = set()
        refs: set[str] = set()
        _collect(template, slots, refs)
        for slot in sorted(slots):
            if slot not in self.slots:
                raise where.error(f"unknown slot {{{slot}}}; known slots: {self.slots}")
        glued = _SLOT_GLUED_RE.search(text)
        if glued:
            raise where.error(
                f"{glued.group(0)!r} in {text!r}: a possessive or contraction glued to a slot; the game "
                f"fills {{{glued.group(1)}}} with its own text, which can end in 's' or be a phrase "
                f"(\"the fields's\"): rephrase it (\"{{{glued.group(1)}}} is ...\", \"the way to {{{glued.group(1)}}}\")")
        src = _Source(template, where, frozenset(slots), frozenset(refs))
        self._sources.append(src)
        return src

    def _templates(self, rd: _Reader, node: yaml.Node, field: str, marks: str = "") -> list[_Source]:
        """A list of templates. ``marks``: which writer's marks its entries may carry (an entry
        is then a string or a mapping ``{text, not_with, only_with[, at]}``): ``""`` none,
        ``"fit"`` ``not_with`` / ``only_with``, ``"part"`` those and ``at``."""
        items = rd.seq(node, field)
        if not items:
            raise rd.fail(node, field, "needs at least one line")
        return [self._marked(rd, item, f"{field}[{i}]", marks) for i, item in enumerate(items)]

    def _marked(self, rd: _Reader, node: yaml.Node, field: str, marks: str) -> _Source:
        """One list entry: a template, or a mapping of its ``text`` and the writer's marks
        (docs/linebook.md, "Where a fragment fits"), each checked where it is written."""
        if not isinstance(node, yaml.MappingNode):
            return self._template(rd, node, field)
        if not marks:
            raise rd.fail(node, field, "expected a string (not_with / only_with / at marks are for fragments "
                          "composed beside a reply: persona moods, context fragments, archetype tags and "
                          "voice groups, own lines, leads and codas)")
        known = ("text", "not_with", "only_with", "at") if marks == "part" else ("text", "not_with", "only_with")
        fields = {k: (knode, v) for k, knode, v in rd.mapping(node, field)}
        for k, (knode, _v) in fields.items():
            if k not in known:
                hint = ("; 'at' is for fragments drawn as a whole part of a line (persona moods, context "
                        "fragments, tags, own lines)") if k == "at" else ""
                raise rd.fail(knode, f"{field}.{k}", f"unknown field; known: {', '.join(known)}{hint}")
        if "text" not in fields:
            raise rd.fail(node, f"{field}.text", "required field is missing")
        src = self._template(rd, fields["text"][1], field)
        at = None
        if "at" in fields:
            at = rd.string(fields["at"][1], f"{field}.at")
            if at not in ("start", "end"):
                raise rd.fail(fields["at"][1], f"{field}.at", f"unknown position {at!r}; known: start, end")
        marked = replace(src, at=at, **self._fit_marks(rd, fields, field))
        self._sources[-1] = marked
        return marked

    def _fit_marks(self, rd: _Reader, fields: dict[str, tuple[yaml.Node, yaml.Node]], field: str
                   ) -> dict[str, frozenset[str]]:
        """The ``not_with`` / ``only_with`` marks among ``fields`` as :class:`_Source` fields
        (``never``, ``only_intents``, ``only_states``), each name checked where it is written."""
        named: dict[str, list[str]] = {}
        for key in ("not_with", "only_with"):
            if key not in fields:
                continue
            names = rd.names(fields[key][1], f"{field}.{key}")
            if not names:
                raise rd.fail(fields[key][1], f"{field}.{key}", "needs at least one intent or state")
            for i, name in enumerate(names):
                item, f = rd.seq(fields[key][1], field)[i], f"{field}.{key}[{i}]"
                if name in self.intents and name in self.states:
                    raise rd.fail(item, f, f"{name!r} is both an intent and a state: the mark is ambiguous")
                if name not in self.intents and name not in self.states:
                    raise rd.fail(item, f, _unknown("intent or state", name, [*self.intents, *self.states]))
            named[key] = names
        both = set(named.get("not_with", ())) & set(named.get("only_with", ()))
        if both:
            raise rd.fail(fields["only_with"][1], f"{field}.only_with", f"{sorted(both)[0]!r} is also in not_with")
        only = set(named.get("only_with", ()))
        return {"never": frozenset(named.get("not_with", ())), "only_intents": frozenset(only & set(self.intents)),
                "only_states": frozenset(only & set(self.states))}

    def _read_lists(self, raw: _Raw) -> None:
        self._first_file = next(
            (rd.file for entries in raw.sections.values() for rd, *_ in entries),
            next((rd.file for items in raw.lists.values() for rd, _ in items), "<linebook>"),
        )
        self.slots = []
        self._slot_where: dict[str, _Where] = {}
        for rd, node in raw.lists.get("slots", []):
            for i, item in enumerate(rd.seq(node, "slots")):
                name = rd.name(item, f"slots[{i}]")
                if name in self.slots:
                    raise rd.fail(item, f"slots[{i}]", f"duplicate slot {name!r}")
                self.slots.append(name)
        self.slot_defaults: dict[str, str] = {}
        for rd, name, key, value in raw.sections.get("slot_defaults", []):
            f = f"slot_defaults.{name}"
            if name not in self.slots:
                raise rd.fail(key, f, _unknown("slot", name, self.slots))
            text = rd.string(value, f).strip()
            if not text or re.search(r"[\[\]{}()|]", text):
                raise rd.fail(value, f, "needs plain text (no markup)")
            self.slot_defaults[name] = text
        self.banned_words = []
        for rd, node in raw.lists.get("banned_words", []):
            for i, item in enumerate(rd.seq(node, "banned_words")):
                word = rd.string(item, f"banned_words[{i}]").strip().lower()
                if word not in self.banned_words:
                    self.banned_words.append(word)

    def _read_catalog(self, raw: _Raw) -> None:
        for section in ("archetypes", "persona_traits", "states", "intents", "context"):
            self._require(raw, section, self._first_file)
        # persona traits
        self.persona_traits = []
        self._trait_excludes: dict[str, set[str]] = {}
        self._trait_nodes: dict[str, tuple[_Reader, yaml.Node, str]] = {}
        for rd, name, key, value in self._entries(raw, "persona_traits"):
            f = f"persona_traits.{name}"
            rd.name(key, f)
            self.persona_traits.append(name)
            self._trait_nodes[name] = (rd, value, f)
        # states
        self.states = []
        self._state_tone: dict[str, str] = {}
        self._state_slots: dict[str, set[str]] = {}
        self._state_nodes: dict[str, tuple[_Reader, yaml.Node, str]] = {}
        for rd, name, key, value in self._entries(raw, "states"):
            f = f"states.{name}"
            rd.name(key, f)
            self.states.append(name)
            self._state_nodes[name] = (rd, value, f)
            tone = "calm"
            slots: set[str] = set()
            for k, knode, v in rd.mapping(value, f):
                if k == "tone":
                    tone = rd.string(v, f"{f}.tone")
                    if tone not in TONES:
                        raise rd.fail(
                            v, f"{f}.tone", f"unknown tone {tone!r}; known: {list(TONES)}"
                        )
                elif k == "slots":
                    slots = set(self._slot_names(rd, v, f"{f}.slots"))
                elif k not in ("leads", "codas", "description"):
                    raise rd.fail(
                        knode,
                        f"{f}.{k}",
                        "unknown field; known: description, tone, slots, leads, codas",
                    )
            self._state_tone[name] = tone
            self._state_slots[name] = slots
        # intents
        self.intents = []
        self._intent_slots: dict[str, set[str]] = {}
        for rd, name, key, value in self._entries(raw, "intents"):
            f = f"intents.{name}"
            rd.name(key, f)
            self.intents.append(name)
            slots = set()
            for k, knode, v in rd.mapping(value, f):
                if k == "slots":
                    slots = set(self._slot_names(rd, v, f"{f}.slots"))
                elif k != "description":
                    raise rd.fail(knode, f"{f}.{k}", "unknown field; known: description, slots")
            self._intent_slots[name] = slots
        # context slots and values
        self.context = {}
        self._context_nodes: dict[str, tuple[_Reader, yaml.Node, str]] = {}
        for rd, slot, key, value in self._entries(raw, "context"):
            f = f"context.{slot}"
            rd.name(key, f)
            if slot in self.slots:
                raise rd.fail(
                    key, f, "a context slot must not share its name with a free-text slot"
                )
            values: list[str] = []
            for vname, vkey, _vnode in rd.mapping(value, f):
                rd.name(vkey, f"{f}.{vname}")
                values.append(vname)
            if not values:
                raise rd.fail(value, f, "needs at least one value")
            self.context[slot] = values
            self._context_nodes[slot] = (rd, value, f)
        # archetypes
        self.archetypes = []
        self._arch_nodes: dict[str, tuple[_Reader, yaml.Node, str]] = {}
        self._arch_slots: dict[str, set[str]] = {}
        for rd, name, key, value in self._entries(raw, "archetypes"):
            f = f"archetypes.{name}"
            rd.name(key, f)
            self.archetypes.append(name)
            self._arch_nodes[name] = (rd, value, f)
        for label, names in (
            ("archetypes", self.archetypes),
            ("persona_traits", self.persona_traits),
            ("states", self.states),
            ("intents", self.intents),
        ):
            if not names:
                raise LineBookError(self._first_file, 1, label, "needs at least one entry")
        clash = set(BUILTIN_GROUPS) | set(self.context)
        for name in self.persona_traits:
            rd, value, f = self._trait_nodes[name]
            excludes: set[str] = set()
            for k, knode, v in rd.mapping(value, f):
                if k == "excludes":
                    for i, item in enumerate(rd.seq(v, f"{f}.excludes")):
                        other = rd.name(item, f"{f}.excludes[{i}]")
                        if other not in self.persona_traits:
                            raise rd.fail(
                                item,
                                f"{f}.excludes[{i}]",
                                _unknown("persona trait", other, self.persona_traits),
                            )
                        excludes.add(other)
                elif k not in ("description", *TONES):
                    raise rd.fail(
                        knode,
                        f"{f}.{k}",
                        "unknown field; known: description, excludes, calm, urgent",
                    )
            self._trait_excludes[name] = excludes
        for name in self.persona_traits:
            for other in self._trait_excludes[name]:
                self._trait_excludes[other].add(name)
        self._clash = clash

    def _nested(self, raw: _Raw, section: str, outer: tuple[str, list[str]], inner: tuple[str, list[str]]
                ) -> Iterator[tuple[_Reader, str, str, yaml.Node, yaml.Node, str]]:
        """``section.<outer>.<inner>`` entries (replies: state -> intent, own lines: archetype ->
        state) as ``(reader, outer, inner, inner key node, value node, field)``, each name
        checked against its known values."""
        (outer_kind, outer_known), (inner_kind, inner_known) = outer, inner
        for rd, name, key, value in self._entries(raw, section):
            f = f"{section}.{name}"
            if name not in outer_known:
                raise rd.fail(key, f, _unknown(outer_kind, name, outer_known))
            for sub, skey, snode in rd.mapping(value, f):
                if sub not in inner_known:
                    raise rd.fail(skey, f"{f}.{sub}", _unknown(inner_kind, sub, inner_known))
                yield rd, name, sub, skey, snode, f"{f}.{sub}"

    def _slot_names(self, rd: _Reader, node: yaml.Node, field: str) -> list[str]:
        names = rd.names(node, field)
        for i, name in enumerate(names):
            if name not in self.slots:
                raise rd.fail(
                    rd.seq(node, field)[i], f"{field}[{i}]", _unknown("slot", name, self.slots)
                )
        return names

    def _tone_lists(
        self, rd: _Reader, node: yaml.Node, field: str, slots: set[str]
    ) -> dict[str, list[_Source]]:
        out: dict[str, list[_Source]] = {t: [] for t in TONES}
        for k, _knode, v in rd.mapping(node, field):
            if k in TONES:
                out[k] = self._templates(rd, v, f"{field}.{k}", marks="part")
                self._check_slots(out[k], slots)
        return out

    def _check_slots(self, sources: list[_Source], allowed: set[str]) -> None:
        for src in sources:
            extra = src.slots - allowed
            if extra:
                raise src.where.error(
                    f"slot {{{sorted(extra)[0]}}} is not allowed here; allowed: {sorted(allowed)}"
                )

    def _read_fragments(self, raw: _Raw) -> None:
        """Every section of templates and settings, in the order they depend on each other."""
        self._read_moods()
        self._read_leads()
        self._read_context_fragments()
        self._read_archetype_voices()
        self._read_phrases(raw)
        self._read_own_lines(raw)
        self._read_whole_replies(raw)
        self._read_replies(raw)
        self._read_compose(raw)
        self._read_expansion(raw)
        self._read_heldout_pairs(raw)
        self._read_fallbacks(raw)

    def _read_moods(self) -> None:
        """Persona moods."""
        self._moods: dict[str, dict[str, list[_Source]]] = {}
        for name in self.persona_traits:
            rd, value, f = self._trait_nodes[name]
            self._moods[name] = self._tone_lists(rd, value, f, set())

    def _read_leads(self) -> None:
        """State leads."""
        self._leads: dict[str, list[_Source]] = {}
        self._codas: dict[str, list[_Source]] = {}
        for name in self.states:
            rd, value, f = self._state_nodes[name]
            leads = [v for k, _kn, v in rd.mapping(value, f) if k == "leads"]
            if not leads:
                raise rd.fail(value, f"{f}.leads", "required field is missing")
            self._leads[name] = self._templates(rd, leads[0], f"{f}.leads", marks="fit")
            self._check_slots(self._leads[name], self._state_slots[name])
            codas = [v for k, _kn, v in rd.mapping(value, f) if k == "codas"]
            self._codas[name] = self._templates(rd, codas[0], f"{f}.codas", marks="fit") if codas else []
            self._check_slots(self._codas[name], self._state_slots[name])

    def _read_context_fragments(self) -> None:
        """Context fragments."""
        self._ctx_frags: dict[tuple[str, str], dict[str, list[_Source]]] = {}
        self._implies: dict[tuple[str, str], list[str]] = {}
        for slot in self.context:
            rd, node, f = self._context_nodes[slot]
            for vname, _vkey, vnode in rd.mapping(node, f):
                vf = f"{f}.{vname}"
                if isinstance(vnode, yaml.ScalarNode) and vnode.tag.endswith(":null"):
                    self._ctx_frags[(slot, vname)] = {t: [] for t in TONES}
                    self._implies[(slot, vname)] = []
                    continue
                implies: list[str] = []
                for k, knode, v in rd.mapping(vnode, vf):
                    if k == "implies":
                        implies = [" ".join(_words(rd.string(item, f"{vf}.implies[{i}]")))
                                   for i, item in enumerate(rd.seq(v, f"{vf}.implies"))]
                        if not all(implies):
                            raise rd.fail(v, f"{vf}.implies", "an entry has no words")
                    elif k not in (*TONES, "description"):
                        raise rd.fail(
                            knode, f"{vf}.{k}", "unknown field; known: description, implies, calm, urgent"
                        )
                self._implies[(slot, vname)] = implies
                self._ctx_frags[(slot, vname)] = self._tone_lists(rd, vnode, vf, set())

    def _read_archetype_voices(self) -> None:
        """Archetypes: slots, voice groups, tags."""
        self._voice: dict[str, dict[str, list[_Source]]] = {}
        self._voice_where: dict[str, _Where] = {}
        self._tags: dict[str, dict[str, list[_Source]]] = {}
        for name in self.archetypes:
            rd, value, f = self._arch_nodes[name]
            self._voice_where[name] = rd.where(value, f)
            fields = {k: (knode, v) for k, knode, v in rd.mapping(value, f)}
            for k, (knode, _v) in fields.items():
                if k not in ("description", "slots", "voice", "tags"):
                    raise rd.fail(
                        knode, f"{f}.{k}", "unknown field; known: description, slots, voice, tags"
                    )
            slots = (
                set(self._slot_names(rd, fields["slots"][1], f"{f}.slots"))
                if "slots" in fields
                else set()
            )
            self._arch_slots[name] = slots
            if "voice" not in fields:
                raise rd.fail(value, f"{f}.voice", "required field is missing")
            voice: dict[str, list[_Source]] = {}
            for group, gkey, gnode in rd.mapping(fields["voice"][1], f"{f}.voice"):
                gf = f"{f}.voice.{group}"
                rd.name(gkey, gf)
                if group in self._clash:
                    raise rd.fail(gkey, gf, f"{group!r} is a reserved group name")
                voice[group] = self._templates(rd, gnode, gf, marks="fit")
                self._check_slots(voice[group], slots)
            self._voice[name] = voice
            if "tags" in fields:
                for k, knode, _v in rd.mapping(fields["tags"][1], f"{f}.tags"):
                    if k not in TONES:
                        raise rd.fail(knode, f"{f}.tags.{k}", "unknown field; known: calm, urgent")
                self._tags[name] = self._tone_lists(rd, fields["tags"][1], f"{f}.tags", slots)
            else:
                self._tags[name] = {t: [] for t in TONES}

    def _read_phrases(self, raw: _Raw) -> None:
        """Shared phrase groups: [name] usable in any template."""
        self._phrases: dict[str, list[_Source]] = {}
        for rd, name, key, value in self._entries(raw, "phrases"):
            f = f"phrases.{name}"
            rd.name(key, f)
            if name in self._clash:
                raise rd.fail(key, f, f"{name!r} is a reserved group name")
            clash = [a for a in self.archetypes if name in self._voice[a]]
            if clash:
                raise rd.fail(key, f, f"{name!r} is also a voice group of archetype {clash[0]!r}")
            srcs = self._templates(rd, value, f)
            self._check_slots(srcs, set())
            self._phrases[name] = srcs

    def _read_own_lines(self, raw: _Raw) -> None:
        """Own lines: archetype -> state -> templates in that archetype's voice."""
        self._own: dict[tuple[str, str], list[_Source]] = {}
        # an own line answers no particular intent, so it may use the slots every intent allows
        every_intent = set.intersection(*(set(v) for v in self._intent_slots.values()))
        for rd, arch, state, _skey, snode, f in self._nested(raw, "own_lines", ("archetype", self.archetypes),
                                                             ("state", self.states)):
            srcs = self._templates(rd, snode, f, marks="part")
            self._check_slots(srcs, self._state_slots[state] | self._arch_slots[arch] | every_intent)
            for src in srcs:
                bad = src.refs - set(self._voice[arch])
                if bad:
                    raise src.where.error(
                        f"own lines may only use the archetype's voice groups; [{sorted(bad)[0]}] is not one")
            self._own[(arch, state)] = srcs

    def _read_whole_replies(self, raw: _Raw) -> None:
        """Whole replies: archetype / persona trait -> state -> intent -> templates."""
        every_voice = set.intersection(*(set(self._voice[a]) for a in self.archetypes))
        self._own_replies = self._read_cells(raw, "own_replies", ("archetype", self.archetypes),
                                             lambda arch: set(self._voice[arch]), lambda arch: self._arch_slots[arch])
        self._trait_replies = self._read_cells(raw, "trait_replies", ("persona trait", self.persona_traits),
                                               lambda _trait: every_voice, lambda _trait: set())

    def _read_replies(self, raw: _Raw) -> None:
        """Replies: state -> intent -> templates."""
        self._replies: dict[tuple[str, str], list[_Source]] = {}
        for rd, state, intent, ikey, inode, f in self._nested(raw, "replies", ("state", self.states),
                                                              ("intent", self.intents)):
            if (state, intent) in self._replies:
                raise rd.fail(ikey, f, "duplicate replies for this state and intent")
            srcs = self._templates(rd, inode, f)
            self._check_slots(srcs, self._state_slots[state] | self._intent_slots[intent])
            self._replies[(state, intent)] = srcs
        for state in self.states:
            for intent in self.intents:
                if (state, intent) not in self._replies:
                    raise LineBookError(
                        self._first_file,
                        1,
                        f"replies.{state}.{intent}",
                        "no replies for this state and intent",
                    )

    def _read_compose(self, raw: _Raw) -> None:
        """Compose patterns."""
        self._patterns: list[_Pattern] = []
        for rd, node in raw.lists.get("compose", []):
            for i, item in enumerate(rd.seq(node, "compose")):
                f = f"compose[{i}]"
                fields = {k: (knode, v) for k, knode, v in rd.mapping(item, f)}
                for k, (knode, _v) in fields.items():
                    if k not in ("pattern", "weight", "tones", "not_with", "only_with", "max_sentences"):
                        raise rd.fail(
                            knode, f"{f}.{k}",
                            "unknown field; known: pattern, weight, tones, not_with, only_with, max_sentences"
                        )
                if "pattern" not in fields:
                    raise rd.fail(item, f"{f}.pattern", "required field is missing")
                src = self._template(rd, fields["pattern"][1], f"{f}.pattern")
                if src.slots:
                    raise src.where.error("a compose pattern may not use slots")
                if not src.refs & {"lead", "coda", "reply", "own", "own_reply", "trait_reply"}:
                    raise src.where.error("a compose pattern must use [lead], [coda], [reply], [own], "
                                          "[own_reply] or [trait_reply]")
                weight = (
                    rd.integer(fields["weight"][1], f"{f}.weight", 1, 1000)
                    if "weight" in fields
                    else 1
                )
                tones: tuple[str, ...] = TONES
                if "tones" in fields:
                    tones = tuple(rd.names(fields["tones"][1], f"{f}.tones"))
                    for t in tones:
                        if t not in TONES:
                            raise rd.fail(
                                fields["tones"][1],
                                f"{f}.tones",
                                f"unknown tone {t!r}; known: {list(TONES)}",
                            )
                fit = replace(src, **self._fit_marks(rd, fields, f))
                max_sentences = (rd.integer(fields["max_sentences"][1], f"{f}.max_sentences", 1, 100)
                                 if "max_sentences" in fields else None)
                self._patterns.append(_Pattern(src.template, weight, tones, src.where, src.refs,
                                               _part_positions(src.template), fit, max_sentences))
        if not self._patterns:
            raise LineBookError(self._first_file, 1, "compose", "required section is missing")
        for tone in TONES:
            if not any(tone in p.tones for p in self._patterns):
                raise LineBookError(self._first_file, 1, "compose", f"no pattern for tone {tone!r}")
        for state in self.states:
            for intent in self.intents:
                if not any(self._state_tone[state] in p.tones and p.fit is not None and p.fit.fits(state, intent, None)
                           for p in self._patterns):
                    where = next(p.where for p in self._patterns if p.fit is not None and p.fit.never | p.fit.only_intents
                                 | p.fit.only_states)
                    raise where.error(f"no compose pattern may be drawn for state {state!r} and intent {intent!r} "
                                      "(not_with / only_with exclude every one for its tone)")

    def _read_expansion(self, raw: _Raw) -> None:
        """Expansion settings."""
        self.per_condition = 100
        self.max_words = 24
        self.min_words = 3
        self.seed = 0
        for rd, key_name, key, value in self._entries(raw, "expansion"):
            f = f"expansion.{key_name}"
            if key_name == "per_condition":
                self.per_condition = rd.integer(value, f, 1, 100000)
            elif key_name == "max_words":
                self.max_words = rd.integer(value, f, 1, 200)
            elif key_name == "min_words":
                self.min_words = rd.integer(value, f, 1, 200)
            elif key_name == "seed":
                self.seed = rd.integer(value, f, 0, 2**31)
            else:
                raise rd.fail(
                    key, f, "unknown field; known: per_condition, max_words, min_words, seed"
                )

    def _read_heldout_pairs(self, raw: _Raw) -> None:
        """Held-out pairs."""
        self.heldout_pairs: list[tuple[str, str]] = []
        for rd, node in raw.lists.get("heldout_pairs", []):
            for i, item in enumerate(rd.seq(node, "heldout_pairs")):
                f = f"heldout_pairs[{i}]"
                pair = rd.seq(item, f)
                if len(pair) != 2:
                    raise rd.fail(item, f, "expected [archetype, state]")
                arch, state = rd.name(pair[0], f), rd.name(pair[1], f)
                if arch not in self.archetypes:
                    raise rd.fail(pair[0], f, _unknown("archetype", arch, self.archetypes))
                if state not in self.states:
                    raise rd.fail(pair[1], f, _unknown("state", state, self.states))
                if (arch, state) in self.heldout_pairs:
                    raise rd.fail(item, f, "duplicate held-out pair")
                self.heldout_pairs.append((arch, state))

    def _read_fallbacks(self, raw: _Raw) -> None:
        """Fallbacks."""
        # fallbacks: state -> cell, or archetype -> state -> cell; a cell is a list of
        # templates (voice groups allowed; the state's intent-neutral lines) or a mapping of
        # ``any`` and intents to lists (FallbackBook's cells; docs/linebook.md, "fallbacks")
        # keys: (archetype or None for every archetype, state, intent or ANY_INTENT)
        self._fallbacks: dict[tuple[str | None, str, str], list[_Source]] = {}
        if ANY_INTENT in self.intents:
            raise LineBookError(self._first_file, 1, f"intents.{ANY_INTENT}",
                                f"{ANY_INTENT!r} is the fallbacks' key for lines that answer any intent")
        for rd, name, key, value in self._entries(raw, "fallbacks"):
            f = f"fallbacks.{name}"
            if name in self.states:
                self._fallback_cell(rd, value, f, None, name)
            elif name in self.archetypes:
                for state, skey, snode in rd.mapping(value, f):
                    if state not in self.states:
                        raise rd.fail(skey, f"{f}.{state}", _unknown("state", state, self.states))
                    self._fallback_cell(rd, snode, f"{f}.{state}", name, state)
            else:
                raise rd.fail(
                    key, f, _unknown("state or archetype", name, self.states + self.archetypes)
                )
        for state in self.states:
            if (None, state, ANY_INTENT) not in self._fallbacks:
                raise LineBookError(
                    self._first_file, 1, f"fallbacks.{state}",
                    f"no fallback lines for this state (a list, or {ANY_INTENT!r} lines: what any intent gets)"
                )

    def _read_cells(self, raw: _Raw, section: str, outer: tuple[str, list[str]],
                    voice: Callable[[str], set[str]], slots: Callable[[str], set[str]]
                    ) -> dict[tuple[str, str, str], list[_Source]]:
        """``own_replies`` / ``trait_replies``: name -> state -> intent -> whole replies, a cell
        per (name, state, intent), which may be missing (the pattern drawing it is then not drawn
        for that prompt) but not written twice, also across files. A reply may use the slots of
        its state and intent (and ``slots(name)``) and the voice groups ``voice(name)``."""
        cells: dict[tuple[str, str, str], list[_Source]] = {}
        written: dict[tuple[str, str, str], _Where] = {}
        for rd, name, state, _skey, snode, f in self._nested(raw, section, outer, ("state", self.states)):
            for intent, ikey, inode in rd.mapping(snode, f):
                cf = f"{f}.{intent}"
                if intent not in self.intents:
                    raise rd.fail(ikey, cf, _unknown("intent", intent, self.intents))
                first = written.setdefault((name, state, intent), rd.where(ikey, cf))
                if first.file != rd.file or first.line != ikey.start_mark.line + 1:
                    raise rd.fail(ikey, cf, f"already defined at {first.file}:{first.line}")
                srcs = self._templates(rd, inode, cf, marks="part")
                self._check_slots(srcs, self._state_slots[state] | self._intent_slots[intent] | slots(name))
                allowed = voice(name)
                for src in srcs:
                    bad = src.refs - allowed
                    if bad:
                        whose = ("the archetype's voice groups" if section == "own_replies"
                                 else "the voice groups every archetype defines")
                        raise src.where.error(f"{section} may only use {whose} ({', '.join(f'[{g}]' for g in sorted(allowed))}); "
                                              f"[{sorted(bad)[0]}] is not one")
                cells[(name, state, intent)] = srcs
        return cells

    def _fallback_cell(self, rd: _Reader, node: yaml.Node, field: str, arch: str | None, state: str) -> None:
        """One state's fallbacks (``arch`` None: every archetype's): a list of intent-neutral
        templates, or a mapping of ``any`` and intents to lists. No slots: a fallback is served
        as written."""
        cells = ([(ANY_INTENT, node, field)] if not isinstance(node, yaml.MappingNode)
                 else [(k, v, f"{field}.{k}") for k, _kn, v in rd.mapping(node, field)])
        for intent, value, f in cells:
            if intent != ANY_INTENT and intent not in self.intents:
                raise rd.fail(value, f, _unknown("intent", intent, [ANY_INTENT, *self.intents]))
            srcs = self._templates(rd, value, f)
            for src in srcs:
                if src.slots:
                    raise src.where.error(
                        f"slot {{{sorted(src.slots)[0]}}} in a fallback: fallback lines are served as "
                        "written (no slot is filled), so they name no slot")
            self._fallbacks[(arch, state, intent)] = srcs

    def _check_references(self) -> None:
        voice_groups = {g for v in self._voice.values() for g in v}
        known = set(BUILTIN_GROUPS) | set(self.context) | voice_groups | set(self._phrases)
        for src in self._sources:
            for ref in sorted(src.refs):
                if ref not in known:
                    raise src.where.error(
                        _unknown("group", f"[{ref}]", sorted(f"[{k}]" for k in known))
                    )
                if ref in voice_groups:
                    for arch in self.archetypes:
                        if ref not in self._voice[arch]:
                            raise self._voice_where[arch].error(
                                f"voice group {ref!r} is used at {src.where.file}:{src.where.line} "
                                f"but archetype {arch!r} does not define it"
                            )
        # a voice group is drawn wherever it is referenced: its marks must leave every state and
        # intent a fragment to draw
        for arch in self.archetypes:
            for group, srcs in self._voice[arch].items():
                for state in self.states:
                    for intent in self.intents:
                        if not any(src.fits(state, intent, None) for src in srcs):
                            raise srcs[0].where.error(
                                f"archetypes.{arch}.voice.{group}: no entry may be drawn for state {state!r} "
                                f"and intent {intent!r} (their not_with / only_with marks exclude every one); "
                                "leave one that fits")
        # fragments that are drawn inside other fragments must not recurse into lead/reply
        for srcs in [*self._leads.values(), *self._codas.values(), *self._replies.values(),
                     *self._own.values(), *self._own_replies.values(), *self._trait_replies.values()]:
            for src in srcs:
                bad = src.refs & _PART_GROUPS
                if bad:
                    raise src.where.error(
                        f"[{sorted(bad)[0]}] may only be used in compose patterns"
                    )
        for group in [*self._voice.values(), self._phrases]:
            for srcs in group.values():
                for src in srcs:
                    if src.refs:
                        raise src.where.error("voice and phrase fragments may not reference groups")

    def _check_implies(self) -> None:
        """A context value's ``implies`` phrases may only be said by that value's fragments:
        a lead, reply, own line or another value's fragment that says "tonight" would tell a
        player at noon that it is night."""
        phrases = [(tuple(p.split()), key) for key, ps in self._implies.items() for p in ps]
        if not phrases:
            return
        tagged: list[tuple[_Source, str | None, tuple[str, ...] | None]] = [
            (src, None, None) for src in self._general_sources()]
        for tag, srcs in self._tag_sources().items():
            owner = tuple(tag.split(":", 1)[1].split("=")) if tag.startswith("context:") else None
            tagged += [(src, arch, owner) for src, arch in srcs]
        for src, arch, owner in tagged:
            for text in self._texts(src.template, arch, limit=64):
                for piece in text.split("\n"):
                    words = _words(piece)
                    for phrase, key in phrases:
                        if key == owner:
                            continue
                        n = len(phrase)
                        if any(tuple(words[i:i + n]) == phrase for i in range(len(words) - n + 1)):
                            raise src.where.error(
                                f"says {' '.join(phrase)!r}, which asserts {key[0]}={key[1]} "
                                f"(context.{key[0]}.{key[1]}.implies): only that value's fragments may say it")

    # -------------------------------------------------------------- public API

    def catalog(self) -> dict[str, list[str] | dict[str, list[str]]]:
        """The closed vocabulary a prompt is made of (saved as catalog.json beside a model)."""
        return {
            "archetypes": list(self.archetypes),
            "persona_traits": list(self.persona_traits),
            "states": list(self.states),
            "intents": list(self.intents),
            "context": {k: list(v) for k, v in self.context.items()},
            "slots": list(self.slots),
        }

    def allowed_slots(self, archetype: str, state: str, intent: str) -> set[str]:
        """Free-text slots a generated line for this condition may contain."""
        _check_known("archetype", archetype, self.archetypes)
        _check_known("state", state, self.states)
        _check_known("intent", intent, self.intents)
        return set(
            self._arch_slots[archetype] | self._state_slots[state] | self._intent_slots[intent]
        )

    def missing_reply_cells(self) -> list[str]:
        """The whole-reply cells not written yet, as fields (``own_replies.guard.alert.trade``,
        ``trait_replies.gruff.idle.greet``), in catalog order: every archetype and every
        persona trait × state × intent. A missing cell loads (the pattern drawing it is not
        drawn for that prompt); this lists what a writer has left to do."""
        return [f"{section}.{name}.{state}.{intent}"
                for section, names, cells in (("own_replies", self.archetypes, self._own_replies),
                                              ("trait_replies", self.persona_traits, self._trait_replies))
                for name in names for state in self.states for intent in self.intents
                if (name, state, intent) not in cells]

    def examples(self) -> list[Example]:
        """Every expanded example, in catalog order (archetype, state, intent), deterministic.

        Texts are distinct within a condition; a text never appears under two states.
        """
        if self._examples is None:
            self._examples = list(self._expand_all())
        return list(self._examples)

    def split(self, seed: int = 0) -> Split:
        """Train / val / test (about 90 / 5 / 5, by a hash of seed and text) plus held-out pairs.

        ``heldout``: the lines of the held-out (archetype, state) pairs that no other pair says.
        A line said in a held-out pair and in a seen one (a persona trait's whole reply, a state's
        own reply: words every archetype may say) stays with the seen pairs, so training keeps
        it and the held-out figures still read lines the model never saw (until book v5 such
        lines were dropped from training instead: 55,267 of book v5's 75,989 seen lines)."""
        heldout_pairs = set(self.heldout_pairs)
        seen_texts = {e.text for e in self.examples() if (e.archetype, e.state) not in heldout_pairs}
        heldout = [e for e in self.examples()
                   if (e.archetype, e.state) in heldout_pairs and e.text not in seen_texts]
        train: list[Example] = []
        val: list[Example] = []
        test: list[Example] = []
        for e in self.examples():
            if (e.archetype, e.state) in heldout_pairs:
                continue
            digest = hashlib.sha256(f"{seed}\x00{e.text}".encode()).digest()
            bucket = int.from_bytes(digest[:4], "big") % 100
            (train if bucket < 90 else val if bucket < 95 else test).append(e)
        return Split(train, val, test, heldout, list(self.heldout_pairs))

    def fallback_lines(self) -> dict[tuple[str, str], list[str]]:
        """Every authored fallback line per (archetype, state): the lines of all its
        :meth:`fallback_cells`, the ``any`` cell's first, then each intent's in catalog order
        (what the vocabulary and the word bigrams count as said)."""
        out: dict[tuple[str, str], list[str]] = {}
        for (arch, state, _intent), lines in self.fallback_cells().items():
            bucket = out.setdefault((arch, state), [])
            bucket.extend(t for t in lines if t not in bucket)
        return out

    def fallback_cells(self) -> dict[tuple[str, str, str], list[str]]:
        """The fallback lines :class:`runtime.client.fallback.FallbackBook` picks from, per
        (archetype, state, intent) cell, intent ``any`` for lines that answer any move.

        Every (archetype, state) has an ``any`` cell: the archetype's own intent-neutral lines
        for the state if written, else the state's. An intent's cell, the first written of: the
        archetype's own lines for (state, intent), the state's lines for the intent; a cell
        neither writes is left out, so the engine answers that intent with the ``any`` cell.
        Templates are expanded with the archetype's voice (up to three expansions each, first
        alternatives first). Order: archetypes, states, then ``any`` and the intents, as the
        catalog lists them.
        """
        out: dict[tuple[str, str, str], list[str]] = {}
        for arch in self.archetypes:
            for state in self.states:
                for intent in (ANY_INTENT, *self.intents):
                    srcs = self._fallbacks.get((arch, state, intent)) or self._fallbacks.get((None, state, intent))
                    if srcs:
                        out[(arch, state, intent)] = [line for line, _src in self._fallback_texts(srcs, arch)]
        return out

    def _fallback_texts(self, srcs: list[_Source], arch: str) -> list[tuple[str, _Source]]:
        """Each template's expansions in ``arch``'s voice (up to three each), deduplicated."""
        lines: dict[str, _Source] = {}
        for src in srcs:
            for text in self._enumerate(src.template, arch, limit=3):
                lines.setdefault(_normalize("".join(text)), src)
        return list(lines.items())

    def _fallback_lint(self) -> list[LintProblem]:
        """What a writer should fix in the fallbacks: an expanded line that reads as an artifact
        (:func:`lint_line`) or is over :data:`FALLBACK_MAX_WORDS` words, and a (state, intent)
        no fallback answers (the state's ``any`` lines would)."""
        problems: list[LintProblem] = []
        for arch in self.archetypes:
            for state in self.states:
                for intent in (ANY_INTENT, *self.intents):
                    srcs = self._fallbacks.get((arch, state, intent)) or self._fallbacks.get((None, state, intent))
                    for text, src in self._fallback_texts(srcs or [], arch):
                        where = (f"{src.where.file}:{src.where.line}",)
                        problem = lint_line(text)
                        if problem is None and len(text.split()) > FALLBACK_MAX_WORDS:
                            problem = f"a fallback over {FALLBACK_MAX_WORDS} words"
                        if problem is not None:
                            problems.append(LintProblem(text, problem, where))
        for state in self.states:
            for intent in self.intents:
                if (None, state, intent) not in self._fallbacks:
                    missing = [a for a in self.archetypes if (a, state, intent) not in self._fallbacks]
                    if missing:
                        src = self._fallbacks[(None, state, ANY_INTENT)][0]
                        problems.append(LintProblem(
                            f"fallbacks.{state}.{intent}",
                            f"no fallback for this intent ({', '.join(missing)}): the state's any lines answer it",
                            (f"{src.where.file}:{src.where.line}",)))
        return problems

    # -------------------------------------------------------------- expansion

    def _enumerate(self, template: _Template, arch: str, limit: int) -> Iterator[list[str]]:
        """Up to ``limit`` expansions of a fallback template, first alternatives first."""
        results: list[list[str]] = [[]]
        for part in template:
            options: list[list[str]]
            if isinstance(part, str):
                options = [[part]]
            elif part[0] == "slot":
                options = [["{" + part[1] + "}"]]
            elif part[0] == "ref":
                group = self._voice[arch].get(part[1]) or self._phrases.get(part[1]) or []
                options = [
                    seq for src in group for seq in self._enumerate(src.template, arch, limit)
                ][:limit] or [[""]]
            else:
                options = [seq for alt in part[1] for seq in self._enumerate(alt, arch, limit)][
                    :limit
                ]
            results = [r + o for r in results for o in options][:limit]
        yield from results

    def _fitting(self, srcs: list[_Source], state: str, intent: str, position: str | None) -> list[_Source]:
        """The fragments of ``srcs`` whose marks let them be drawn for ``state`` and ``intent``
        at ``position`` (:meth:`_Source.fits`); cached per list, so callers pass the book's own
        lists."""
        key = (id(srcs), state, intent, position)
        hit = self._fit_cache.get(key)
        if hit is None:
            hit = self._fit_cache[key] = [s for s in srcs if s.fits(state, intent, position)]
        return hit

    def _usable(self, pattern: _Pattern, arch: str, state: str, intent: str, tone: str,
                persona: tuple[str, ...], ctx: dict[str, str]) -> bool:
        """Whether every group the pattern draws has something to say for this prompt: a
        prompt without persona gets no [mood] pattern, one without context no [ctx], and a
        group whose fragments' marks (not_with, only_with, at) all exclude this intent, state
        or place in the line is not drawn either."""
        for part, position in zip(pattern.template, pattern.positions, strict=True):
            if isinstance(part, str) or part[0] != "ref":
                continue
            group = part[1]
            if group == "mood":
                ok = any(self._fitting(self._moods[t][tone], state, intent, position) for t in persona)
            elif group == "ctx":
                ok = any(self._fitting(self._ctx_frags[(k, v)][tone], state, intent, position)
                         for k, v in ctx.items())
            elif group == "own":
                ok = bool(self._fitting(self._own.get((arch, state), _NO_SOURCES), state, intent, position))
            elif group == "tag":
                ok = bool(self._fitting(self._tags[arch][tone], state, intent, position))
            elif group == "own_reply":
                ok = bool(self._fitting(self._own_replies.get((arch, state, intent), _NO_SOURCES),
                                        state, intent, position))
            elif group == "trait_reply":
                ok = any(self._fitting(self._trait_replies.get((t, state, intent), _NO_SOURCES),
                                       state, intent, position) for t in persona)
            else:
                continue
            if not ok:
                return False
        return True

    def lint(self) -> list[LintProblem]:
        """Lines the expansion drew and dropped as template artifacts (:func:`lint_line`, or the
        player named twice), each with the fragments it was made of, then the fallbacks'
        problems (an artifact, a line over :data:`FALLBACK_MAX_WORDS` words, an intent of a state
        no fallback answers): what a writer should fix."""
        self.examples()
        return list(self._lint_log) + self._fallback_lint() + self._reply_lint()

    def _reply_lint(self) -> list[LintProblem]:
        """Whole replies (``own_replies``, ``trait_replies``) with an expansion that is never
        drawn as a line of its own: one that reads as an artifact (:func:`lint_line`) or has
        fewer than ``min_words`` or more than ``max_words`` words. Each template's first
        expansions are read in an archetype's voice (its own; a trait reply's in every
        archetype's), up to 16 per archetype."""
        problems: list[LintProblem] = []
        cells = [(src, [arch]) for (arch, _s, _i), srcs in self._own_replies.items() for src in srcs]
        cells += [(src, self.archetypes) for srcs in self._trait_replies.values() for src in srcs]
        for src, archs in cells:
            texts = dict.fromkeys(_normalize("".join(t)) for arch in archs
                                  for t in self._enumerate(src.template, arch, limit=16))
            for text in texts:
                n = len(text.split())
                problem = lint_line(text) or (
                    f"{n} words, outside [{self.min_words}, {self.max_words}]: never drawn alone"
                    if not self.min_words <= n <= self.max_words else None)
                if problem is not None:
                    problems.append(LintProblem(text, problem, (f"{src.where.file}:{src.where.line}",)))
        return problems

    def _patterns_for(self, state: str, intent: str) -> list[_Pattern]:
        tone = self._state_tone[state]
        return [p for p in self._patterns if tone in p.tones and (p.fit is None or p.fit.fits(state, intent, None))]

    def _compose(self, patterns: Sequence[_Pattern], arch: str, state: str, intent: str,
                 persona: tuple[str, ...], ctx: dict[str, str], rng: random.Random
                 ) -> _Drawn | None:
        """One line drawn for a prompt, as the expansion draws it: a pattern among ``patterns``
        usable for the prompt (weighted), each part expanded; None when no pattern is usable
        for the prompt."""
        tone = self._state_tone[state]
        usable = [p for p in patterns if self._usable(p, arch, state, intent, tone, persona, ctx)]
        if not usable:
            return None
        pattern = rng.choices(usable, weights=[p.weight for p in usable])[0]
        env = _Env(self, arch, state, intent, tone, persona, ctx, rng)
        pieces: list[str] = []
        for part, position in zip(pattern.template, pattern.positions, strict=True):
            env.position = position
            pieces.append("".join(env.expand((part,))))
        text = _normalize("".join(pieces))
        repeated = repeated_word([piece for part, piece in zip(pattern.template, pieces, strict=True)
                                  if not isinstance(part, str)])
        problem = lint_line(text) or (
            "names the player twice" if env.addressed > 1 else None) or (
            f"repeats {repeated!r} across its parts" if repeated else None)
        found = None if problem is None else LintProblem(
            text, problem, tuple(f"{w.file}:{w.line}" for w in dict.fromkeys(src.where for src in env.sources)))
        fits = (self.min_words <= len(text.split()) <= self.max_words
                and (pattern.max_sentences is None or sentences(text) <= pattern.max_sentences))
        return _Drawn(text, found, fits, pattern)

    def _expand_all(self) -> Iterator[Example]:
        self._lint_log: list[LintProblem] = []
        text_state: dict[str, tuple[str, str, str]] = {}
        for arch in self.archetypes:
            for state in self.states:
                for intent in self.intents:
                    patterns = self._patterns_for(state, intent)
                    rng = random.Random(f"{self.seed}:{arch}:{state}:{intent}")
                    seen: set[str] = set()
                    attempts = 0
                    while len(seen) < self.per_condition and attempts < self.per_condition * 8:
                        attempts += 1
                        persona = self._draw_persona(rng)
                        ctx = self._draw_context(rng)
                        drawn = self._compose(patterns, arch, state, intent, persona, ctx, rng)
                        if drawn is None:
                            continue
                        text, problem, fits, pattern = drawn
                        if problem is not None:
                            self._lint_log.append(problem)
                        if text in seen or problem is not None or not fits:
                            continue
                        other = text_state.get(text)
                        if other is not None and other[0] != state:
                            raise pattern.where.error(
                                f"the line {text!r} is produced for state {state!r} "
                                f"({arch}, {intent}) and for state {other[0]!r} ({other[1]}, {other[2]}); "
                                "every line must belong to one state")
                        text_state.setdefault(text, (state, arch, intent))
                        seen.add(text)
                        yield Example(
                            archetype=arch,
                            persona=persona,
                            state=state,
                            intent=intent,
                            context=tuple(sorted(ctx.items())),
                            text=text,
                        )

    def lines_for(self, archetype: str, state: str, intent: str, persona: Sequence[str] = (),
                  context: Mapping[str, str] | Sequence[tuple[str, str]] = (), n: int = 50,
                  seed: int = 0) -> list[str]:
        """Up to ``n`` distinct lines the book writes for one prompt, drawn as its expansion
        draws a condition's lines (weighted patterns, no artifact, no line twice) but with the
        persona and context fixed: what the book itself says to one prompt asked again and
        again, the reference for the model's "distinct-2 within 50 seeds of one prompt". Stops
        after ``8 * n`` draws (fewer lines where the prompt's patterns run out). A composed line
        that says a signature of a tag the prompt does not ask for (:meth:`signatures`, which
        the engine bans) is left out: joined fragments can make one across a sentence end
        ("I can! Put that away", a farmer's "can put")."""
        traits, ctx = check_request(self.catalog(), archetype, persona, state, intent, context)
        asked = {f"archetype:{archetype}", *(f"persona:{t}" for t in traits),
                 *(f"context:{slot}={value}" for slot, value in ctx.items())}
        voices = self._signature_index()
        patterns = self._patterns_for(state, intent)
        rng = random.Random(f"{self.seed}:{seed}:{archetype}:{state}:{intent}:{','.join(traits)}:{sorted(ctx.items())}")
        out: list[str] = []
        for _ in range(8 * n):
            if len(out) >= n:
                break
            drawn = self._compose(patterns, archetype, state, intent, tuple(traits), ctx, rng)
            if drawn is None:
                break
            if (drawn.problem is None and drawn.fits and drawn.text not in out
                    and voices.hits(drawn.text) <= asked):
                out.append(drawn.text)
        return out

    def _signature_index(self) -> SignatureIndex:
        """A :class:`SignatureIndex` of :meth:`signatures`, made once."""
        if self._signature_hits is None:
            self._signature_hits = SignatureIndex(self.signatures())
        return self._signature_hits

    def _draw_persona(self, rng: random.Random) -> tuple[str, ...]:
        """0, 1 or 2 compatible traits (a quarter of prompts carry none)."""
        r = rng.random()
        if r < 0.25:
            return ()
        first = rng.choice(self.persona_traits)
        if r < 0.65:
            return (first,)
        others = [
            t for t in self.persona_traits if t != first and t not in self._trait_excludes[first]
        ]
        if not others:
            return (first,)
        return tuple(sorted((first, rng.choice(others))))

    def _draw_context(self, rng: random.Random) -> dict[str, str]:
        """Any subset of the context slots: all of them for about a third of prompts, else
        each slot with probability one half (so no slot at all about one prompt in twenty)."""
        every = rng.random() < 0.3
        return {slot: rng.choice(values) for slot, values in self.context.items()
                if every or rng.random() < 0.5}

    # -------------------------------------------------------------- what the book can say

    def vocabulary(self) -> list[str]:
        """Every word the book's lines and fallbacks say (lower case, sorted): the words the
        decoding constraints let a model complete."""
        if self._vocabulary is not None:
            return list(self._vocabulary)
        words: set[str] = set()
        for e in self.examples():
            words.update(_words(_SLOT_RE.sub(" ", e.text)))
        for lines in self.fallback_lines().values():
            for line in lines:
                words.update(_words(_SLOT_RE.sub(" ", line)))
        self._vocabulary = sorted(words)
        return list(self._vocabulary)

    def _texts(self, template: _Template, arch: str | None, limit: int = 256) -> list[str]:
        """Up to ``limit`` expansions of a template, every alternative in turn; a group reference
        becomes the archetype's voice (``arch``) or, without one, a break (``"\n"``) that no
        phrase crosses."""
        results = [""]
        for part in template:
            if isinstance(part, str):
                options = [part]
            elif part[0] == "slot":
                options = ["\n"]
            elif part[0] == "ref":
                group = self._voice[arch].get(part[1], []) if arch is not None else []
                options = [t for src in group for t in self._texts(src.template, arch, limit)] or ["\n"]
            else:
                options = [t for alt in part[1] for t in self._texts(alt, arch, limit)]
            results = [r + o for r in results for o in options][:limit]
        return results

    def _tag_sources(self, whole: bool = True) -> dict[str, list[tuple[_Source, str | None]]]:
        """Each tag's own fragments, with the archetype whose voice fills their references.
        ``whole``: with the whole replies (an archetype's own replies, a trait's trait replies),
        which are drawn only with their tag too (the ``implies`` check reads them); without
        them, the voice fragments alone (what :meth:`signatures` takes phrases from)."""
        out: dict[str, list[tuple[_Source, str | None]]] = {}
        for arch in self.archetypes:
            srcs = [(s, arch) for g in self._voice[arch].values() for s in g]
            srcs += [(s, arch) for t in TONES for s in self._tags[arch][t]]
            srcs += [(s, arch) for st in self.states for s in self._own.get((arch, st), [])]
            if whole:
                srcs += [(s, arch) for (a, _st, _i), cell in self._own_replies.items() if a == arch for s in cell]
            out[f"archetype:{arch}"] = srcs
        for trait in self.persona_traits:
            out[f"persona:{trait}"] = [(s, None) for t in TONES for s in self._moods[trait][t]]
            if whole:
                out[f"persona:{trait}"] += [(s, None) for (tr, _st, _i), cell in self._trait_replies.items()
                                            if tr == trait for s in cell]
        for (slot, value), frags in self._ctx_frags.items():
            out[f"context:{slot}={value}"] = [(s, None) for t in TONES for s in frags[t]]
        return out

    def _general_sources(self) -> list[_Source]:
        """Fragments that belong to no archetype, trait or context value."""
        return [s for group in (self._leads, self._codas, self._replies, self._phrases,
                                self._fallbacks) for v in group.values() for s in v]

    @staticmethod
    def _ngrams(texts: Sequence[str], n_max: int = 3) -> set[tuple[str, ...]]:
        grams: set[tuple[str, ...]] = set()
        for text in texts:
            for piece in text.split("\n"):
                words = _words(piece)
                for n in range(1, n_max + 1):
                    grams.update(tuple(words[i:i + n]) for i in range(len(words) - n + 1))
        return grams

    def _tag_grams(self, whole: bool) -> dict[str, set[tuple[str, ...]]]:
        """Each tag's phrases (:meth:`_ngrams` of its :meth:`_tag_sources` in their voice)."""
        return {tag: self._ngrams([t for src, arch in srcs for t in self._texts(src.template, arch)])
                for tag, srcs in self._tag_sources(whole).items()}

    def _general_grams(self) -> set[tuple[str, ...]]:
        return self._ngrams([t for src in self._general_sources() for t in self._texts(src.template, None)])

    def _said_only_with_their_tag(self, candidates: dict[str, set[tuple[str, ...]]]
                                  ) -> dict[str, set[tuple[str, ...]]]:
        """``candidates`` (tag -> phrases, each phrase one tag's) less the phrases some expanded
        line says without that tag in its prompt (pieces of two fragments meeting, "After
        that," + "the ..."): those do not voice the tag. Updates ``candidates`` in place."""
        owner_of = {g: tag for tag, grams in candidates.items() for g in grams}
        for e in self.examples():
            tags = {f"archetype:{e.archetype}", *(f"persona:{t}" for t in e.persona),
                    *(f"context:{k}={v}" for k, v in e.context)}
            for g in self._ngrams([_SLOT_RE.sub("\n", e.text)]) & owner_of.keys():
                if owner_of[g] not in tags:
                    candidates[owner_of[g]].discard(g)
        return candidates

    @staticmethod
    def _minimal_phrases(phrases: dict[str, set[tuple[str, ...]]]) -> dict[str, list[str]]:
        """Each tag's phrases that contain none of its shorter ones, shortest first."""
        return {tag: [" ".join(g) for g in sorted(
            (g for g in own if not any(g[i:j] in own for i in range(len(g))
                                       for j in range(i + 1, len(g) + 1) if (i, j) != (0, len(g)))),
            key=lambda g: (len(g), g))] for tag, own in phrases.items()}

    def signatures(self) -> dict[str, list[str]]:
        """Phrases (1-3 lower-case words) that voice one tag and nothing else in the book.

        Tags: ``archetype:NAME`` (its voice groups, signature tags and own lines),
        ``persona:NAME`` (its mood fragments) and ``context:SLOT=VALUE`` (its fragments, plus
        the value's declared ``implies`` phrases). Whole replies (``own_replies``,
        ``trait_replies``) are no tag's fragments here: drawn only with their tag, they also say
        the way, the gossip and the wares in everyday words ("nor", "safer", "wherever"), which
        would become phrases that request without the tag may never say; what they say still
        counts against other tags' phrases through the expanded lines. A phrase is a signature of a tag when its
        fragments say it, no other tag's fragments nor any general fragment (leads, codas,
        replies, phrase groups, fallbacks) do, and no expanded line says it without the tag in
        its prompt; only minimal phrases are kept (none contains a shorter signature). The decoding constraints ban the signatures of every tag a request
        did not ask for; ``flashnpc eval`` counts them to tell what a line voices.
        """
        if self._signatures is not None:
            return {k: list(v) for k, v in self._signatures.items()}
        tag_grams = self._tag_grams(whole=False)
        general = self._general_grams()
        owners: dict[tuple[str, ...], int] = {}
        for grams in tag_grams.values():
            for g in grams:
                owners[g] = owners.get(g, 0) + 1
        candidates = {tag: {g for g in grams if owners[g] == 1 and g not in general
                            and not _COMMON.issuperset(g)}
                      for tag, grams in tag_grams.items()}
        out = self._minimal_phrases(self._said_only_with_their_tag(candidates))
        for (slot, value), phrases in self._implies.items():
            tag = f"context:{slot}={value}"
            out[tag] = sorted(set(out.get(tag, [])) | set(phrases), key=lambda p: (len(p.split()), p))
        self._signatures = out
        return {k: list(v) for k, v in out.items()}

    def voice_markers(self, min_templates: int = VOICE_MARKER_MIN_TEMPLATES) -> dict[str, list[str]]:
        """Phrases (1-3 lower-case words) that recur through one persona trait's whole replies
        (``trait_replies``) and mark its voice: said by at least ``min_templates`` of its
        templates, by no other tag's fragments or whole replies, by no general fragment, and by
        no expanded line whose prompt lacks the trait ("um" and "sorry" for shy, "dear" for
        kind, "coin" for greedy). Not signatures: decoding never bans them (a request without
        the trait may say "sorry"); ``flashnpc eval`` and ``bench/book_measures.py`` count them
        beside the signatures when they ask whether a line voices a requested trait, since a
        trait's whole replies carry no mood fragment."""
        if self._markers is not None and self._markers[0] == min_templates:
            return {k: list(v) for k, v in self._markers[1].items()}
        tag_grams = self._tag_grams(whole=True)
        general = self._general_grams()
        counts: dict[str, dict[tuple[str, ...], int]] = {}
        for (trait, _state, _intent), cell in self._trait_replies.items():
            tally = counts.setdefault(f"persona:{trait}", {})
            for src in cell:
                for g in self._ngrams(self._texts(src.template, None)):
                    tally[g] = tally.get(g, 0) + 1
        found: dict[str, set[tuple[str, ...]]] = {}
        for tag, tally in counts.items():
            found[tag] = {g for g, n in tally.items() if n >= min_templates and g not in general
                          and not _COMMON.issuperset(g)
                          and not any(g in grams for other, grams in tag_grams.items() if other != tag)}
        out = self._minimal_phrases(self._said_only_with_their_tag(found))
        self._markers = (min_templates, out)
        return {k: list(v) for k, v in out.items()}

    def voiced_phrases(self) -> dict[str, list[str]]:
        """What tells that a line voices a tag: its :meth:`signatures`, and for a persona trait
        its :meth:`voice_markers` too."""
        out = self.signatures()
        for tag, phrases in self.voice_markers().items():
            out[tag] = sorted(set(out.get(tag, ())) | set(phrases), key=lambda p: (len(p.split()), p))
        return out


class _Env:
    """Resolves groups for one sampled line; the drawn persona and context decide fragments."""

    __slots__ = (
        "addressed",
        "arch",
        "book",
        "ctx",
        "intent",
        "persona",
        "position",
        "rng",
        "sources",
        "state",
        "tone",
        "used",
        "voice",
    )

    def __init__(
        self,
        book: LineBook,
        arch: str,
        state: str,
        intent: str,
        tone: str,
        persona: tuple[str, ...],
        ctx: dict[str, str],
        rng: random.Random,
    ) -> None:
        self.book, self.arch, self.state, self.intent = book, arch, state, intent
        self.tone, self.persona, self.ctx, self.rng = tone, persona, ctx, rng
        self.voice: dict[str, _Source] = {}
        self.used: set[int] = set()
        self.addressed = 0  # how often the line names the player ({player} or [address])
        self.sources: list[_Source] = []
        self.position: str | None = None  # where the part being expanded sits (_part_positions)

    def expand(self, template: _Template) -> list[str]:
        out: list[str] = []
        for part in template:
            if isinstance(part, str):
                out.append(part)
                continue
            kind, value = part
            if kind == "slot":
                out.append("{" + value + "}")
                self.addressed += value == "player"
            elif kind == "alt":
                out.extend(self.expand(self.rng.choice(value)))
            else:
                src = self._pick(value)
                if src is not None:
                    self.sources.append(src)
                    # a group inside a fragment is not a part of the line: no position
                    position, self.position = self.position, None
                    out.extend(self.expand(src.template))
                    self.position = position
        return out

    def _fit(self, srcs: list[_Source]) -> list[_Source]:
        return self.book._fitting(srcs, self.state, self.intent, self.position)

    def _pick(self, group: str) -> _Source | None:
        book, rng = self.book, self.rng
        options: Sequence[_Source]
        if group == "lead":
            options = self._fit(book._leads[self.state])
        elif group == "coda":
            options = self._fit(book._codas[self.state])
        elif group == "reply":
            options = book._replies[(self.state, self.intent)]
        elif group == "tag":
            options = self._fit(book._tags[self.arch][self.tone])
        elif group == "own":
            options = self._fit(book._own.get((self.arch, self.state), _NO_SOURCES))
        elif group == "own_reply":
            options = self._fit(book._own_replies.get((self.arch, self.state, self.intent), _NO_SOURCES))
        elif group == "trait_reply":
            options = [s for t in self.persona
                       for s in self._fit(book._trait_replies.get((t, self.state, self.intent), _NO_SOURCES))]
        elif group == "mood":
            options = [s for t in self.persona for s in self._fit(book._moods[t][self.tone])]
        elif group == "ctx":
            slots = [s for s in self.ctx if self._fit(book._ctx_frags[(s, self.ctx[s])][self.tone])]
            if not slots:
                return None
            slot = rng.choice(slots)
            options = self._fit(book._ctx_frags[(slot, self.ctx[slot])][self.tone])
        elif group in book.context:
            options = self._fit(book._ctx_frags[(group, self.ctx[group])][self.tone])
        elif group in book._phrases:
            # no phrase twice in one line
            options = book._phrases[group]
            choice = rng.choice(options)
            if id(choice) in self.used:
                fresh = [o for o in options if id(o) not in self.used]
                choice = rng.choice(fresh) if fresh else choice
            self.used.add(id(choice))
            return choice
        else:
            # one address / place / ... per line: a speaker does not switch names mid-line
            self.addressed += group == "address"
            if group not in self.voice:
                self.voice[group] = rng.choice(self.book._fitting(book._voice[self.arch][group], self.state,
                                                                  self.intent, None))
            return self.voice[group]
        return rng.choice(options) if options else None
