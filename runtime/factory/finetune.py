"""Fine-tune a shipped Flash model on a studio's own lines (``flashnpc finetune``).

The studio's file (CSV or JSONL, see docs/finetune.md) is read into :class:`StudioLine` rows;
archetypes, persona traits and context values the base model does not know become new control
tokens (the tokenizer is rebuilt with them, every other id shifted, the embedding rows moved
with them). Then, in the default ``adapters`` mode:

* the router, attention and expert weights, layer norms, position table and every existing
  embedding row stay **frozen** (``requires_grad`` off, never touched by the optimiser);
* LoRA adapters (rank ``rank``) on the attention projections, each expert's ``w1`` / ``w2``
  and the output head train, with the new control tokens' embedding rows;
* training runs under INT4 fake quantization (the export's formula), so what the adapters learn
  survives the INT4 export; a share of each batch replays the base line book.

The adapters are merged into the weights (``torch.nn.utils.parametrize``), the merged
checkpoint is written to ``DIR`` and exported in place through
:func:`runtime.factory.export.export_checkpoint`: ``DIR`` is a model directory that
``LineGenerator.load(DIR)``, ``flashnpc eval --model DIR`` and ``flashnpc export mobile --model
DIR`` take. ``mode="full"`` trains every weight instead (the contrast in docs/finetune.md).

Router confidence is the mean top-1 router probability over the line tokens of the studio's
lines and every MoE layer (teacher-forced, INT4 weights). Its checks are relative to the base
model on the same lines (see docs/finetune.md for why): ``>= 0.85`` of the base's passes, below
``0.7`` the export is refused unless ``force``.

torch is imported inside the functions, so ``flashnpc`` builds its parser without it.
"""

from __future__ import annotations

import argparse
import csv
import difflib
import functools
import itertools
import json
import math
import re
import time
import unicodedata
import zlib
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runtime.client.authored import AuthoredBook, AuthoredLine
from runtime.tokenizer import Tokenizer

if TYPE_CHECKING:
    from torch import Tensor, nn

    from runtime.client.bigrams import BigramTable
    from runtime.factory.model import Flash

COLUMNS = ("archetype", "state", "line", "persona", "intent", "context", "like")
REQUIRED = ("archetype", "state", "line")
DEFAULT_INTENT = "approach"
PASS_RATIO = 0.85  # router confidence kept, relative to the base model: the check passes
REFUSE_RATIO = 0.7  # below this the export is refused without force
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_SLOT_MARK = re.compile(r"\{([^{}]*)\}")
_WORD = re.compile(r"[a-z]+(?:'[a-z]+)?")
_CLAUSE_END = re.compile(r"[.!?;:]+")
ADAPTED = ("attn.c_attn.weight", "attn.c_proj.weight", "ffn.w1", "ffn.w2",
           "ffn.c_fc.weight", "ffn.c_proj.weight")


class FinetuneError(ValueError):
    """A fine-tune that cannot go on: bad rows (``problems`` lists each as ``file:line: field: ...``),
    a base model that cannot be read, or router confidence below the export threshold."""

    def __init__(self, message: str, problems: Sequence[str] = ()) -> None:
        self.problems = list(problems)
        shown = "\n".join(self.problems[:25])
        more = f"\n... and {len(self.problems) - 25} more" if len(self.problems) > 25 else ""
        super().__init__(f"{message}\n{shown}{more}" if self.problems else message)


class RoutingRefused(FinetuneError):
    """Router confidence fell under :data:`REFUSE_RATIO` of the base's: the checkpoint is written,
    the export refused (``force`` exports anyway)."""


# --------------------------------------------------------------------------- the studio's lines


@dataclass(frozen=True)
class StudioLine:
    """One authored line and its tags (the fields :class:`runtime.factory.train.ExampleLike` reads)."""

    archetype: str
    state: str
    text: str
    persona: tuple[str, ...] = ()
    intent: str = DEFAULT_INTENT
    context: tuple[tuple[str, str], ...] = ()
    where: str = ""  # file:line, for messages
    like: str = ""  # the base archetype a new archetype starts from ("": the nearest one)

    def to_json(self) -> dict[str, Any]:
        out = {"archetype": self.archetype, "state": self.state, "line": self.text,
               "persona": list(self.persona), "intent": self.intent, "context": dict(self.context)}
        return {**out, "like": self.like} if self.like else out


def _rows(path: Path) -> Iterable[tuple[int, dict[str, Any] | str]]:
    """(line number, row) for each row of a CSV or JSONL file; a string row is a parse error."""
    text = path.read_text(encoding="utf-8-sig")
    if path.suffix.lower() in (".jsonl", ".ndjson", ".json"):
        for n, raw in enumerate(text.splitlines(), 1):
            if not raw.strip() or raw.lstrip().startswith("#"):
                continue
            try:
                obj = json.loads(raw)
            except json.JSONDecodeError as exc:
                yield n, f"not a JSON object ({exc.msg} at column {exc.colno})"
                continue
            yield n, obj if isinstance(obj, dict) else f"not a JSON object (a {type(obj).__name__})"
        return
    reader = csv.DictReader(text.splitlines(keepends=True))
    unknown = [c for c in reader.fieldnames or () if c and c.strip() not in COLUMNS]
    missing = [c for c in REQUIRED if c not in [f.strip() for f in reader.fieldnames or ()]]
    if unknown or missing:
        what = [f"unknown column {c!r} (columns: {', '.join(COLUMNS)})" for c in unknown]
        what += [f"missing column {c!r}" for c in missing]
        yield 1, "; ".join(what)
        return
    for row in reader:
        clean = {k.strip(): v for k, v in row.items() if k is not None}
        if None in row:
            yield reader.line_num, f"more fields than the header's {len(reader.fieldnames or ())}"
            continue
        yield reader.line_num, clean


def _names(value: Any, field_name: str) -> list[str]:
    if value is None:
        return []
    items = value if isinstance(value, list) else re.split(r"[;,\s]+", str(value))
    out = [str(x).strip() for x in items if str(x).strip()]
    for x in out:
        if not _NAME.match(x):
            raise ValueError(f"{field_name}: {x!r} is not a name (lower-case letters, digits, _)")
    return out


def _context(value: Any) -> list[tuple[str, str]]:
    if value is None or value == "":
        return []
    if isinstance(value, dict):
        pairs = [(str(k).strip(), str(v).strip()) for k, v in value.items()]
    else:
        pairs = []
        for part in re.split(r"[;,]", str(value)):
            if not part.strip():
                continue
            if "=" not in part:
                raise ValueError(f"context: {part.strip()!r} is not slot=value")
            k, v = part.split("=", 1)
            pairs.append((k.strip(), v.strip()))
    seen: dict[str, str] = {}
    for k, v in pairs:
        for what, x in (("slot", k), ("value", v)):
            if not _NAME.match(x):
                raise ValueError(f"context: {what} {x!r} is not a name (lower-case letters, digits, _)")
        if k in seen and seen[k] != v:
            raise ValueError(f"context: slot {k!r} given twice ({seen[k]!r}, {v!r})")
        seen[k] = v
    return list(seen.items())


def read_lines(path: str | Path, base_catalog: Mapping[str, Any], *,
               banned_words: Iterable[str] = ()) -> list[StudioLine]:
    """Read and check a studio's CSV or JSONL file against the base model's catalog.

    Archetypes, persona traits, states, intents, context slots and values may be new: each new
    name becomes a control token (a game's own catalog); a new state or intent that looks like a
    slip for a base one (``patrols``) is refused with the base name.
    ``like`` (optional) names the base archetype a new archetype's token starts from; it must be
    one of the base's archetypes, only on rows of a new archetype, and the same on all of them.
    Every problem is collected and raised at once as a :class:`FinetuneError` whose problems
    read ``file:line: field: what is wrong``.
    """
    p = Path(path)
    if not p.is_file():
        raise FinetuneError(f"{p}: no such file")
    slots = set(base_catalog["slots"])
    banned = [b.lower() for b in banned_words]
    out: list[StudioLine] = []
    problems: list[str] = []
    likes: dict[str, tuple[str, str]] = {}  # new archetype -> (like, where first declared)
    for n, row in _rows(p):
        where = f"{p}:{n}"
        if isinstance(row, str):
            problems.append(f"{where}: {row}")
            continue
        bad = [f"{where}: {k}: unknown field (fields: {', '.join(COLUMNS)})" for k in row if k not in COLUMNS]
        problems += bad
        values: dict[str, Any] = {}
        for name in REQUIRED:
            v = row.get(name)
            if v is None or not str(v).strip():
                problems.append(f"{where}: {name}: missing")
            values[name] = str(v).strip() if v is not None else ""
        try:
            arch = _names(values["archetype"], "archetype")
            if len(arch) > 1:
                raise ValueError(f"archetype: one name, got {values['archetype']!r}")
            if values["state"]:
                _new_name("state", values["state"], base_catalog["states"])
            intent = str(row.get("intent") or "").strip() or DEFAULT_INTENT
            _new_name("intent", intent, base_catalog["intents"])
            persona = _names(row.get("persona"), "persona")
            context = _context(row.get("context"))
            like = _like(row.get("like"), arch[0] if arch else "", base_catalog, likes, where)
            text = " ".join(values["line"].split())
            _check_text(text, slots, banned)
        except ValueError as exc:
            problems.append(f"{where}: {exc}")
            continue
        if bad or not all(values.values()):
            continue
        out.append(StudioLine(arch[0], values["state"], text, tuple(sorted(set(persona))), intent,
                              tuple(context), where, like))
    if problems:
        raise FinetuneError(f"{p}: {len(problems)} bad row(s)", problems)
    if not out:
        raise FinetuneError(f"{p}: no lines")
    return out


def _new_name(kind: str, name: str, known: Sequence[str]) -> None:
    """A state or intent may be the base's or a game's own (a new control token), but not a name
    so close to a base one that it reads as a slip (``patrols`` for ``patrol``)."""
    if name in known:
        return
    if not _NAME.match(name):
        raise ValueError(f"{kind}: {name!r} is not a name (lower-case letters, digits, _)")
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.8)
    if close:
        raise ValueError(f"{kind}: {name!r} is not one of the base model's {kind}s; did you mean "
                         f"{close[0]!r}? (a new {kind} must not look like a known one: "
                         f"{', '.join(known)})")


def _like(value: Any, arch: str, base_catalog: Mapping[str, Any], seen: dict[str, tuple[str, str]],
          where: str) -> str:
    """The row's ``like`` (checked: a base archetype, on a new archetype, one per archetype)."""
    like = str(value or "").strip()
    if not like:
        return ""
    known = base_catalog["archetypes"]
    if like not in known:
        raise ValueError(f"like: {like!r} is not an archetype of the base model ({', '.join(known)})")
    if arch in known:
        raise ValueError(f"like: {arch!r} is the base model's own archetype; like names where a new one starts")
    first = seen.setdefault(arch, (like, where))
    if first[0] != like:
        raise ValueError(f"like: {arch!r} is like {first[0]!r} at {first[1]}, here {like!r}")
    return like


def _check_text(text: str, slots: set[str], banned: Sequence[str]) -> None:
    if not text:
        return
    bad = next((i for i, ch in enumerate(text) if unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Co", "Cn")), None)
    if bad is not None:
        raise ValueError(f"line: control or unassigned character U+{ord(text[bad]):04X} at column {bad + 1}")
    for m in _SLOT_MARK.finditer(text):
        if m.group(1) not in slots:
            raise ValueError(f"line: unknown slot {{{m.group(1)}}} (slots: "
                             f"{', '.join('{' + s + '}' for s in sorted(slots))})")
    if re.search(r"[{}]", _SLOT_MARK.sub("", text)):
        raise ValueError("line: unmatched brace (only {slot} markers may use braces)")
    low = " ".join(_WORD.findall(text.lower()))
    for word in banned:
        if re.search(rf"(?<![a-z']){re.escape(word)}(?![a-z'])", low):
            raise ValueError(f"line: banned word {word!r}")


def heldout(lines: Sequence[StudioLine], every: int = 10) -> tuple[list[StudioLine], list[StudioLine]]:
    """Deterministic split: a line is held out when crc32 of its text is 0 mod ``every``."""
    train, held = [], []
    for line in lines:
        (held if zlib.crc32(line.text.encode()) % every == 0 else train).append(line)
    return train, held


# --------------------------------------------------------------------------- catalog and tokens


def extend_catalog(base: Mapping[str, Any], lines: Iterable[StudioLine]) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """The base catalog plus the lines' new archetypes, persona traits and context slots/values
    (appended in order of first appearance); also returns the new names per kind."""
    cat = json.loads(json.dumps(base))
    added: dict[str, list[str]] = {"archetypes": [], "persona_traits": [], "states": [], "intents": [],
                                   "context": []}
    for line in lines:
        for kind, name in (("archetypes", line.archetype), ("states", line.state), ("intents", line.intent)):
            if name not in cat[kind]:
                cat[kind].append(name)
                added[kind].append(name)
        for t in line.persona:
            if t not in cat["persona_traits"]:
                cat["persona_traits"].append(t)
                added["persona_traits"].append(t)
        for k, v in line.context:
            values = cat["context"].setdefault(k, [])
            if v not in values:
                values.append(v)
                added["context"].append(f"{k}={v}")
    return cat, added


def extend_tokenizer(tok: Tokenizer, catalog: Mapping[str, Any]) -> tuple[Tokenizer, list[int]]:
    """A tokenizer for ``catalog`` with ``tok``'s merges, and old id -> new id.

    Control tokens keep their names (new ones slot in by catalog order); bytes and merges move
    up by the number of new control tokens.
    """
    probe = Tokenizer(catalog, [])
    delta = probe.n_control - tok.n_control
    new = Tokenizer(catalog, [(a + delta, b + delta) for a, b in tok.merges])
    id_map = [new.id_of(t) for t in tok.controls] + [i + delta for i in range(tok.n_control, tok.vocab_size)]
    return new, id_map


def _init_row(token: str, old: Tokenizer, table: Tensor) -> Tensor:
    """A new control token's starting embedding: the mean of the base tokens of its kind
    (``<arch:*>``, ``<persona:*>``, ``<ctx:slot=*>``, else every ``<ctx:*>``)."""
    import torch

    kind = token.split(":", 1)[0] + ":"
    if kind == "<ctx:":
        slot = token[5:].split("=", 1)[0] + "="
        same = [i for i, t in enumerate(old.controls) if t.startswith(f"<ctx:{slot}")]
        ids = same or [i for i, t in enumerate(old.controls) if t.startswith("<ctx:")]
    else:
        ids = [i for i, t in enumerate(old.controls) if t.startswith(kind)]
    return table[torch.tensor(ids)].mean(0) if ids else table[: old.n_control].mean(0)


def resize_vocab(model: Flash, old: Tokenizer, new: Tokenizer, id_map: Sequence[int]) -> list[int]:
    """Move ``model``'s token table and output head to ``new``'s ids (untied); returns the new
    control tokens' ids, whose rows start as the mean of their kind's."""
    import torch
    from torch import nn

    wte, head = model.transformer.wte.weight.detach(), model.lm_head.weight.detach()
    new_ids = sorted(set(range(new.vocab_size)) - set(id_map))
    index = torch.tensor(id_map)
    tables = []
    for table in (wte, head):
        t = torch.empty(new.vocab_size, table.shape[1], dtype=table.dtype)
        t[index] = table
        for i in new_ids:
            t[i] = _init_row(new.controls[i], old, table)
        tables.append(t)
    model.transformer.wte.weight = nn.Parameter(tables[0])
    model.lm_head.weight = nn.Parameter(tables[1])
    model.config.vocab_size = new.vocab_size
    return new_ids


def _candidates(token: str, tok: Tokenizer, new_ids: Sequence[int]) -> list[int]:
    """Base control tokens a new ``token`` may start from: the base archetypes for ``<arch:*>``,
    the base traits for ``<persona:*>``, the slot's base values for a new value of a base slot,
    every base ``<ctx:*>`` value for a value of a new slot."""
    kind = token.split(":", 1)[0] + ":"
    fresh = set(new_ids)
    base = [i for i, t in enumerate(tok.controls) if i not in fresh]
    if kind == "<ctx:":
        slot = "<ctx:" + token[5:].split("=", 1)[0] + "="
        same = [i for i in base if tok.controls[i].startswith(slot)]
        return same or [i for i in base if tok.controls[i].startswith("<ctx:")]
    return [i for i in base if tok.controls[i].startswith(kind)]


def start_rows(model: Flash, tok: Tokenizer, seqs: Sequence[Any], new_ids: Sequence[int],
               declared: Mapping[int, int], *, per_token: int = 64) -> dict[str, dict[str, Any]]:
    """Start each new control token's embedding row from one base token's row, so the model
    begins in a fluent voice and the adapters only add the studio's flavour.

    The base token is the declared one (``declared``: new id -> base id, from the file's
    ``like``), else the *nearest*: among :func:`_candidates`, the token that, put in the new
    token's place in the prompts of (up to ``per_token``) studio lines carrying it, gives the
    lowest line cross-entropy under ``model`` (the base voice the model already finds closest
    to those lines). New tokens of one kind (archetypes, traits, the values of one slot) get
    distinct base tokens where there are enough, so they start apart; declared ones first. The output-head row moves with it. Returns ``{token: {"from", "how",
    "ce", "ce_mean"}}`` (``ce_mean``: the lines' cross-entropy with the kind's mean row).
    """
    import torch

    from runtime.factory.train import TrainSeq

    wte, head = model.transformer.wte.weight, model.lm_head.weight
    out: dict[str, dict[str, Any]] = {}
    taken: dict[str, set[int]] = {}
    with torch.no_grad():
        for new in sorted(new_ids, key=lambda i: (i not in declared, i)):
            name = tok.controls[new]
            mine = [s for s in seqs if new in s.ids[:s.line_start]][:per_token]

            def ce(src: int, mine: list[Any] = mine, new: int = new) -> float:
                swapped = [TrainSeq(tuple(src if i == new else i for i in s.ids), s.line_start) for s in mine]
                return line_ce(model, swapped, tok.pad_id)

            ce_mean = ce(new) if mine else None
            group = name.split("=", 1)[0] if name.startswith("<ctx:") else name.split(":", 1)[0]
            if new in declared:
                src, how = declared[new], "declared"
            elif mine:
                scores = sorted((ce(c), c) for c in _candidates(name, tok, new_ids))
                free = [sc for sc in scores if sc[1] not in taken.get(group, set())] or scores
                src, how = free[0][1], "nearest"
            else:
                continue
            taken.setdefault(group, set()).add(src)
            wte[new] = wte[src]
            head[new] = head[src]
            out[name] = {"from": tok.controls[src], "how": how, "ce": ce(new) if mine else None, "ce_mean": ce_mean}
    return out


# --------------------------------------------------------------------------- adapters


def _lora_module(rank: int, alpha: float) -> type:
    import torch
    from torch import nn

    class LoRA(nn.Module):
        """W + (alpha / rank) * B @ A, batched over leading dims (one adapter per expert); B
        starts at zero so training starts from the base model exactly."""

        def __init__(self, weight: Tensor) -> None:
            super().__init__()
            *lead, out_f, in_f = weight.shape
            self.scale = alpha / rank
            self.A = nn.Parameter(torch.randn(*lead, rank, in_f) / math.sqrt(in_f))
            self.B = nn.Parameter(torch.zeros(*lead, out_f, rank))

        def forward(self, w: Tensor) -> Tensor:
            return w + self.scale * (self.B @ self.A).to(w.dtype)

    return LoRA


def _rows_module() -> type:
    import torch
    from torch import nn

    class NewRows(nn.Module):
        """The table with trainable rows at ``ids`` (the new control tokens); others untouched."""

        def __init__(self, weight: Tensor, ids: Sequence[int]) -> None:
            super().__init__()
            self.register_buffer("ids", torch.tensor(list(ids), dtype=torch.long))
            self.rows = nn.Parameter(weight.detach()[self.ids].clone())

        def forward(self, w: Tensor) -> Tensor:
            return w.index_copy(0, self.ids, self.rows.to(w.dtype))

    return NewRows


def add_adapters(model: Flash, new_ids: Sequence[int], *, rank: int = 8, alpha: float = 16.0) -> list[nn.Parameter]:
    """Freeze ``model`` and hang LoRA on attention, experts (each its own) and the output head,
    and trainable rows on the token table for ``new_ids``; returns the trainable parameters."""
    from torch.nn.utils import parametrize

    for p in model.parameters():
        p.requires_grad_(False)
    lora, rows = _lora_module(rank, alpha), _rows_module()
    for block in model.transformer.h:
        for path in ADAPTED:
            owner_name, _, attr = path.rpartition(".")
            try:
                owner = block.get_submodule(owner_name)
            except AttributeError:  # an MLP layer has no experts, an MoE layer no c_fc
                continue
            if hasattr(owner, attr):
                parametrize.register_parametrization(owner, attr, lora(getattr(owner, attr)))
    parametrize.register_parametrization(model.lm_head, "weight", lora(model.lm_head.weight))
    if new_ids:
        parametrize.register_parametrization(model.transformer.wte, "weight",
                                             rows(model.transformer.wte.weight, new_ids))
    trainable = [p for n, p in model.named_parameters() if ".parametrizations." in n and not n.endswith(".original")]
    for p in trainable:
        p.requires_grad_(True)
    return trainable


def merge_adapters(model: Flash) -> None:
    """Fold every adapter into its weight (plain parameters again, state-dict keys as trained)."""
    from torch.nn.utils import parametrize

    for module in list(model.modules()):
        if parametrize.is_parametrized(module):
            for name in list(module.parametrizations.keys()):
                parametrize.remove_parametrizations(module, name, leave_parametrized=True)


def frozen_weights(model: Flash) -> dict[str, Tensor]:
    """Copies of every parameter that does not train (the frozen router and backbone)."""
    return {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}


# --------------------------------------------------------------------------- measures


def router_confidence(model: Flash, seqs: Sequence[Any], pad_id: int, *, reference: Flash | None = None,
                      batch_size: int = 64) -> dict[str, float]:
    """Mean top-1 router probability over line tokens (eos included) and MoE layers of ``seqs``
    (teacher-forced); with ``reference``, also the share of those tokens routed to the same
    expert as by ``reference`` (fed the same ids)."""
    import torch

    from runtime.factory.train import collate

    total = same = 0.0
    count = 0
    was = model.training
    model.eval()
    with torch.no_grad():
        for i in range(0, len(seqs), batch_size):
            x, _y, mask = collate(seqs[i:i + batch_size], pad_id)
            probs = model(x).router_probs
            m = mask.unsqueeze(-1).float()
            for p in probs:
                total += float((p.max(-1).values.unsqueeze(-1) * m).sum())
                count += int(mask.sum())
            if reference is not None:
                for p, q in zip(probs, reference(x).router_probs, strict=True):
                    same += float(((p.argmax(-1) == q.argmax(-1)).float() * mask).sum())
    model.train(was)
    out = {"mean_top1": total / max(count, 1)}
    if reference is not None:
        out["same_expert"] = same / max(count, 1)
    return out


def line_ce(model: Flash, seqs: Sequence[Any], pad_id: int) -> float:
    """Mean cross-entropy per line token (the trainer's validation measure)."""
    import torch

    from runtime.factory.train import evaluate

    return evaluate(model, seqs, pad_id, torch.device("cpu"))


# --------------------------------------------------------------------------- base model and side files


@dataclass
class Base:
    """The model a fine-tune starts from and the files that go with it."""

    model: Flash
    tokenizer: Tokenizer
    catalog: dict[str, Any]
    constraints: dict[str, Any]
    fallbacks: dict[str, Any]  # the parsed fallbacks.json, version 1 or 2 (runtime.client.fallback)
    path: Path


def load_base(path: str | Path | None) -> Base:
    """A model directory (weights rebuilt from its INT4 graph, as the serving engine does) or a
    checkpoint directory with ``model.pt`` (untied, so the head can move on its own); side files
    missing there come from the shipped model."""
    from runtime.paths import DEFAULT_MODEL_DIR
    from runtime.serving.batched_engine import EngineLoadError, load_flash

    root = Path(path) if path is not None else DEFAULT_MODEL_DIR
    try:
        if (root / "model.pt").is_file():
            model, tok, _ = load_flash(DEFAULT_MODEL_DIR, checkpoint=root)
            from torch import nn

            model.lm_head.weight = nn.Parameter(model.lm_head.weight.detach().clone())
        else:
            model, tok, _ = load_flash(root)
    except EngineLoadError as exc:
        raise FinetuneError(f"--base {root}: {exc}") from exc

    def side(name: str) -> Any:
        f = root / name if (root / name).is_file() else DEFAULT_MODEL_DIR / name
        return json.loads(f.read_text(encoding="utf-8"))

    model.set_qat(False)
    return Base(model.float(), tok, side("catalog.json"), side("constraints.json"), side("fallbacks.json"), root)


def _grams(text: str, n_max: int = 3) -> set[tuple[str, ...]]:
    """The 1..``n_max``-word phrases of ``text`` as the signatures count them (lower case, never
    across a slot or a sentence's end)."""
    grams: set[tuple[str, ...]] = set()
    for piece in _CLAUSE_END.split(_SLOT_MARK.sub(".", text)):
        words = _WORD.findall(piece.lower())
        for n in range(1, n_max + 1):
            grams.update(tuple(words[i:i + n]) for i in range(len(words) - n + 1))
    return grams


def _tags(line: StudioLine) -> set[str]:
    return {f"archetype:{line.archetype}", *(f"persona:{t}" for t in line.persona),
            *(f"context:{k}={v}" for k, v in line.context)}


def phrases(texts: Iterable[str]) -> frozenset[tuple[str, ...]]:
    """Every phrase of 1-3 words that ``texts`` say (:func:`studio_signatures`' ``book``)."""
    out: set[tuple[str, ...]] = set()
    for text in texts:
        out |= _grams(text)
    return frozenset(out)


@functools.lru_cache(maxsize=1)
def book_phrases() -> frozenset[tuple[str, ...]]:
    """:func:`phrases` of the default line book's expanded lines and fallbacks (once a process)."""
    from runtime.factory.linebook import load_line_book

    book = load_line_book()
    return phrases([e.text for e in book.examples()] + [t for v in book.fallback_lines().values() for t in v])


def studio_signatures(lines: Sequence[StudioLine], book: Collection[tuple[str, ...]]) -> dict[str, list[str]]:
    """Signatures the studio's lines add, by the base book's rule (``LineBook.signatures``): a
    phrase of 1-3 words voices tag ``T`` when every studio line that says it has ``T`` in its
    prompt and no other tag common to all of them, the base book does not say it (``book``: its
    :func:`phrases`, :func:`book_phrases` for the default book), and it is not made of common words only; only
    minimal phrases are kept (none contains a shorter signature of its tag).

    So ``"low water"`` said only in ``tide=low`` lines becomes a signature of
    ``context:tide=low``, and the decoding constraints refuse it for ``tide=high`` (and for a
    prompt without ``tide``), as they refuse "full daylight" at night."""
    from runtime.factory.linebook import _COMMON

    common: dict[tuple[str, ...], set[str]] = {}
    for line in lines:
        tags = _tags(line)
        for g in _grams(line.text):
            common[g] = common[g] & tags if g in common else set(tags)
    own: dict[str, set[tuple[str, ...]]] = {}
    for g, tags in common.items():
        if len(tags) == 1 and g not in book and not _COMMON.issuperset(g):
            own.setdefault(next(iter(tags)), set()).add(g)
    out = {}
    for tag, grams in sorted(own.items()):
        minimal = [g for g in grams if not any(g[i:j] in grams for i in range(len(g))
                                               for j in range(i + 1, len(g) + 1) if (i, j) != (0, len(g)))]
        out[tag] = [" ".join(g) for g in sorted(minimal, key=lambda g: (len(g), g))]
    return out


def extend_bigrams(cons: Mapping[str, Any], texts: Iterable[str], vocabulary: Sequence[str]) -> BigramTable:
    """The base's word bigrams (``cons["bigrams"]``, :mod:`runtime.client.bigrams`) plus every
    bigram and piece start of ``texts`` (the studio's lines), over ``vocabulary`` (the base's
    plus the studio's words): a fine-tuned line may join two words where the base book or a
    studio line joins them, and nowhere else."""
    import numpy as np

    from runtime.client.bigrams import BigramTable, piece_words

    base = BigramTable.from_json(cons["bigrams"], cons["vocabulary"], cons["slots"])
    words = tuple(sorted(set(vocabulary)))
    index = {w: i for i, w in enumerate(words)}
    index.update({"{" + s + "}": len(words) + k for k, s in enumerate(base.slots)})
    rows: list[set[int]] = [set() for _ in index]
    starts = {index[w] for w in base.start_words()}
    for a, b in base.pairs():
        rows[index[a]].add(index[b])
    for text in texts:
        for ws in piece_words(text):
            starts.add(index[ws[0]])
            for a, b in itertools.pairwise(ws):
                rows[index[a]].add(index[b])
    offsets = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int64)
    succ = np.asarray([j for r in rows for j in sorted(r)], dtype=np.int64)
    return BigramTable(words, base.slots, np.asarray(sorted(starts), dtype=np.int64), offsets, succ)


def studio_banned_words(banned: Iterable[str], lines: Sequence[StudioLine]) -> list[str]:
    """The base's banned words less every one the studio's own lines say: the words a line may
    not say come from the studio's material (a space station says "radio" and "battery", a
    modern city "phone" and "car"), not from the village's list of anachronisms."""
    said = " ".join(" ".join(_WORD.findall(_SLOT_MARK.sub(" ", line.text).lower())) for line in lines)
    return [w for w in banned
            if not re.search(rf"(?<![a-z']){re.escape(w.lower())}(?![a-z])", said)]


def extend_constraints(cons: Mapping[str, Any], lines: Sequence[StudioLine], catalog: Mapping[str, Any],
                       book: Collection[tuple[str, ...]] | None = None) -> dict[str, Any]:
    """constraints.json for the fine-tune: the vocabulary gains every word of the studio's lines;
    a signature phrase a studio line says under another tag stops being a signature (it no longer
    voices one tag only); with ``book`` (the base book's :func:`phrases`), the studio's own
    signatures (:func:`studio_signatures`) join them, so a new context value or archetype is
    refused where the request did not ask for it; new archetypes get slot rules (the slots
    their lines use); where the base ships word bigrams, the studio's join them
    (:func:`extend_bigrams`), and likewise its word trigrams
    (:meth:`runtime.client.trigrams.TrigramTable.with_texts`). ``signatures_dropped`` / ``signatures_added`` (popped by the
    caller) report what changed."""
    from runtime.client.constraints import compact_document, expanded_document
    from runtime.factory.text_metrics import SignatureIndex

    cons = expanded_document(cons)
    out = json.loads(json.dumps(cons))
    vocab = set(out.get("vocabulary") or ())
    for line in lines:
        vocab.update(_WORD.findall(_SLOT_MARK.sub(" ", line.text).lower()))
    if out.get("vocabulary") is not None:
        out["vocabulary"] = sorted(vocab)
    out["banned_words"] = studio_banned_words(out.get("banned_words") or (), lines)
    sigs: dict[str, list[str]] = out.get("signatures") or {}
    drop: dict[str, set[str]] = {}
    for tag, phrases in sigs.items():
        index = SignatureIndex({tag: phrases})
        for line in lines:
            if tag in _tags(line) or not index.hits(line.text):
                continue
            for phrase in phrases:
                if SignatureIndex({tag: [phrase]}).hits(line.text):
                    drop.setdefault(tag, set()).add(phrase)
    for tag, gone in drop.items():
        sigs[tag] = [p for p in sigs[tag] if p not in gone]
    added = studio_signatures(lines, book) if book is not None else {}
    if added:
        for tag, phrases in added.items():
            sigs[tag] = sorted(set(sigs.get(tag, [])) | set(phrases), key=lambda p: (len(p.split()), p))
        out["signatures"] = dict(sorted(sigs.items()))
    if out.get("bigrams") is not None:
        out["bigrams"] = extend_bigrams(cons, [line.text for line in lines], out["vocabulary"]).to_json()
    if out.get("trigrams") is not None:
        from runtime.client.trigrams import TrigramTable

        out["trigrams"] = TrigramTable.from_json(cons["trigrams"]).with_texts(line.text for line in lines).to_json()
    for kind, names in (("archetype", catalog["archetypes"]), ("state", catalog["states"]),
                        ("intent", catalog["intents"])):
        rules = out["slot_rules"].setdefault(kind, {})
        for name in names:
            if name not in rules:
                used = {m for line in lines if getattr(line, kind) == name for m in _SLOT_MARK.findall(line.text)}
                rules[name] = sorted(used)
    out["signatures_dropped"] = {t: sorted(g) for t, g in sorted(drop.items())}
    out["signatures_added"] = added
    return compact_document(out)


def authored_book(lines: Sequence[StudioLine]) -> AuthoredBook:
    """The studio's lines as the engine plays them back (``authored.json``,
    :mod:`runtime.client.authored`): every line, the held-out ones too (they are held out of
    training to measure it, not out of the game)."""
    return AuthoredBook(AuthoredLine(ln.archetype, ln.state, ln.intent, ln.text, ln.persona, ln.context)
                        for ln in lines)


def studio_fallback_cells(lines: Sequence[StudioLine], per_cell: int = 6, max_words: int = 16
                          ) -> dict[tuple[str, str] | tuple[str, str, str], list[str]]:
    """The studio's fallback cells (:class:`runtime.client.fallback.FallbackBook`'s keys): per
    (archetype, state, intent) up to ``per_cell`` of the lines the studio wrote for that intent
    without a persona trait, context or slot, of at most ``max_words`` words, shortest first, so
    a fallback answers what the player did (a farewell gets a farewell).

    Every studio (archetype, state) pair also gets an empty key of two parts, which clears the
    base's cells for the pair (its ``any`` lines included, written in the village's voice): a
    studio line answers one move, so none is written into an ``any`` cell, and an intent the
    studio did not write for in a state is answered from a near state's cell for that intent
    (:data:`runtime.client.fallback.NEAR_STATES`), else by the generic lines; never by a line
    written for another move."""
    cells: dict[tuple[str, str] | tuple[str, str, str], list[str]] = {
        (line.archetype, line.state): [] for line in lines}
    by_intent: dict[tuple[str, str, str], set[str]] = {}
    for line in lines:
        if ("{" not in line.text and len(line.text.split()) <= max_words and not line.context
                and not line.persona):
            by_intent.setdefault((line.archetype, line.state, line.intent), set()).add(line.text)
    for key, texts in sorted(by_intent.items()):
        cells[key] = sorted(texts, key=lambda t: (len(t), t))[:per_cell]
    return cells


# --------------------------------------------------------------------------- fine-tuning


@dataclass
class FinetuneConfig:
    """Settings of one fine-tune (defaults: the documented run)."""

    mode: str = "adapters"  # or "full": every weight trains (the contrast)
    epochs: float = 6.0
    steps: int | None = None  # overrides epochs
    batch_size: int = 32
    replay: float = 0.75  # share of each batch drawn from the base line book
    rank: int = 8
    alpha: float = 16.0
    lr: float | None = None  # default: 2e-3 for adapters, 3e-4 for full
    warmup_steps: int = 10
    qat: bool = True
    seed: int = 0
    heldout_every: int = 10
    start: str = "like"  # new tokens' rows: "like" (declared or nearest base tag) or "mean" (of their kind)
    signatures: bool = True  # derive the studio's signatures for the decoding constraints
    force: bool = False
    export: bool = True
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        """Bad settings are a :class:`FinetuneError` naming the setting (``--replay``, ...)."""
        if self.mode not in ("adapters", "full"):
            raise FinetuneError(f"--mode must be 'adapters' or 'full', got {self.mode!r}")
        if self.start not in ("like", "mean"):
            raise FinetuneError(f"--start must be 'like' or 'mean', got {self.start!r}")
        if not 0.0 <= self.replay < 1.0:
            raise FinetuneError(f"--replay must be in [0, 1), got {self.replay!r}")
        for name, value in (("rank", self.rank), ("batch_size", self.batch_size), ("steps", self.steps)):
            if value is not None and value < 1:
                raise FinetuneError(f"--{name.replace('_', '-')} must be >= 1, got {value!r}")
        if not self.epochs > 0 or (self.lr is not None and not self.lr > 0):
            raise FinetuneError(f"--epochs and --lr must be > 0, got {self.epochs!r} and {self.lr!r}")

    @property
    def learning_rate(self) -> float:
        return self.lr if self.lr is not None else (2e-3 if self.mode == "adapters" else 3e-4)


def _replay_examples(tokenizer: Tokenizer, n: int, seed: int, block_size: int) -> tuple[list[Any], list[Any]]:
    """``n`` training lines of the default line book, spread over it (seeded), and 256 of its
    validation lines (never replayed) to measure what the fine-tune does to the base book."""
    import random

    from runtime.factory.linebook import load_line_book
    from runtime.factory.train import encode_examples

    split = load_line_book().split()
    picked = random.Random(seed).sample(range(len(split.train)), min(n, len(split.train)))
    probe = split.val[:: max(1, len(split.val) // 256)][:256]
    return (encode_examples(tokenizer, [split.train[i] for i in sorted(picked)], block_size)[0],
            encode_examples(tokenizer, probe, block_size)[0])


def finetune(base_path: str | Path | None, lines_path: str | Path, out_dir: str | Path,
             cfg: FinetuneConfig | None = None, *, progress: bool = True,
             on_step: Callable[[int, dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Fine-tune ``base_path`` on the studio's ``lines_path`` into ``out_dir``; returns the report
    (also written to ``out_dir/finetune.json``). See the module docstring."""
    import copy

    import torch

    from runtime.factory.export import export_checkpoint
    from runtime.factory.train import (
        TrainConfig,
        _progress,
        batch_indices,
        collate,
        encode_examples,
        learning_rate,
    )

    cfg = cfg or FinetuneConfig()
    t_start = time.perf_counter()
    base = load_base(base_path)
    lines = read_lines(lines_path, base.catalog)  # the studio's words are its own (studio_banned_words)
    train_lines, held_lines = heldout(lines, cfg.heldout_every)
    catalog, added = extend_catalog(base.catalog, lines)
    tok, id_map = extend_tokenizer(base.tokenizer, catalog)
    model = base.model
    new_ids = resize_vocab(model, base.tokenizer, tok, id_map)
    block = model.config.block_size
    too_long = [ln.where for ln in lines if len(encode_examples(tok, [ln], block)[0]) == 0]
    if too_long:
        raise FinetuneError(f"{lines_path}: {len(too_long)} line(s) too long for the model's {block} tokens",
                            [f"{w}: line: too long (prompt + line over {block} tokens)" for w in too_long])
    declared = {tok.id_of(f"<arch:{ln.archetype}>"): tok.id_of(f"<arch:{ln.like}>") for ln in lines if ln.like}
    model.set_qat(cfg.qat)
    started = (start_rows(model, tok, encode_examples(tok, train_lines, block)[0], new_ids, declared)
               if cfg.start == "like" else {})
    model.set_qat(False)
    reference = copy.deepcopy(model).eval()
    reference.set_qat(cfg.qat)
    for p in reference.parameters():
        p.requires_grad_(False)

    torch.manual_seed(cfg.seed)
    if cfg.mode == "adapters":
        trainable = add_adapters(model, new_ids, rank=cfg.rank, alpha=cfg.alpha)
    else:
        trainable = list(model.parameters())
        for p in trainable:
            p.requires_grad_(True)
    frozen = frozen_weights(model)
    model.set_qat(cfg.qat)

    studio = encode_examples(tok, train_lines, block)[0]
    studio_held = encode_examples(tok, held_lines, block)[0]
    all_studio = encode_examples(tok, lines, block)[0]
    n_replay = round(cfg.batch_size * cfg.replay)
    n_studio = cfg.batch_size - n_replay
    steps = cfg.steps or max(1, math.ceil(cfg.epochs * len(studio) / n_studio))
    replay, replay_probe = (_replay_examples(tok, max(256, steps * n_replay // 4), cfg.seed, block)
                            if n_replay else ([], []))

    before = {"router": router_confidence(reference, all_studio, tok.pad_id),
              "heldout_ce": line_ce(reference, studio_held, tok.pad_id) if studio_held else None,
              "replay_ce": line_ce(reference, replay_probe, tok.pad_id) if replay_probe else None}

    tcfg = TrainConfig(steps=steps, lr=cfg.learning_rate, min_lr=cfg.learning_rate / 10,
                       warmup_steps=min(cfg.warmup_steps, steps - 1), seed=cfg.seed)
    optimizer = torch.optim.AdamW(trainable, lr=tcfg.lr, betas=(0.9, 0.95),
                                  weight_decay=0.0 if cfg.mode == "adapters" else 0.1)
    lengths = [len(s.ids) for s in studio]
    model.train()
    bar = _progress(range(steps), initial=0, total=steps, enabled=progress)
    bar.set_description(f"finetune ({cfg.mode})")
    records = []
    t0 = time.perf_counter()
    for step in bar:
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, tcfg)
        batch = [studio[i] for i in batch_indices(len(studio), n_studio, step, cfg.seed, lengths, group=8)]
        if n_replay:
            batch += [replay[i] for i in batch_indices(len(replay), n_replay, step, cfg.seed + 1)]
        x, y, mask = collate(batch, tok.pad_id)
        result = model(x, y, loss_mask=mask)
        optimizer.zero_grad(set_to_none=True)
        result.loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        optimizer.step()
        record = {"step": step, "ce": result.ce_loss.item(), "elapsed_s": time.perf_counter() - t0}
        records.append(record)
        if step % 5 == 0:
            bar.set_postfix(loss=f"{record['ce']:.3f}")
        if on_step is not None:
            on_step(step, record)
    train_s = time.perf_counter() - t0

    unchanged = {n: bool(torch.equal(w, dict(model.named_parameters())[n].detach())) for n, w in frozen.items()}
    merge_adapters(model)
    after = {"router": router_confidence(model, all_studio, tok.pad_id, reference=reference),
             "heldout_ce": line_ce(model, studio_held, tok.pad_id) if studio_held else None,
             "replay_ce": line_ce(model, replay_probe, tok.pad_id) if replay_probe else None}
    ratio = after["router"]["mean_top1"] / max(before["router"]["mean_top1"], 1e-9)
    report: dict[str, Any] = {
        "base": str(base.path), "lines": str(lines_path), "mode": cfg.mode, "config": asdict(cfg),
        "counts": {"lines": len(lines), "train": len(train_lines), "heldout": len(held_lines),
                   "archetypes": sorted({ln.archetype for ln in lines})},
        "added": added, "new_token_ids": new_ids, "started_from": started, "vocab_size": tok.vocab_size,
        "trainable_params": sum(p.numel() for p in trainable),
        "total_params": sum(p.numel() for p in model.parameters()),
        "steps": steps, "train_s": train_s,
        "frozen_unchanged": all(unchanged.values()) if unchanged else None, "frozen_tensors": len(unchanged),
        "before": before, "after": after,
        "router_confidence": {"base": before["router"]["mean_top1"], "finetuned": after["router"]["mean_top1"],
                              "ratio": ratio, "same_expert": after["router"]["same_expert"],
                              "pass_ratio": PASS_RATIO, "refuse_ratio": REFUSE_RATIO,
                              "passed": ratio >= PASS_RATIO},
        "loss": records[:: max(1, len(records) // 50)] + records[-1:],
    }
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.set_qat(False)
    torch.save({"config": asdict(model.config), "model": model.state_dict(), "step": steps,
                "finetune": {k: report[k] for k in ("base", "mode", "added")}}, out / "model.pt")
    (out / "config.json").write_text(json.dumps(asdict(model.config), indent=2) + "\n")
    (out / "catalog.json").write_text(json.dumps(catalog, indent=2) + "\n")
    tok.save(out / "tokenizer.json")
    cons = extend_constraints(base.constraints, lines, catalog, book_phrases() if cfg.signatures else None)
    report["signatures_dropped"] = cons.pop("signatures_dropped")
    report["signatures_added"] = cons.pop("signatures_added")
    (out / "constraints.json").write_text(json.dumps(cons, ensure_ascii=False, separators=(",", ":")) + "\n")
    from runtime.client.fallback import FallbackBook  # the base's file may be version 1 or 2

    # a studio pair replaces the base's (archetype, state), every intent; its own intents' cells follow
    fallbacks = FallbackBook.from_doc(base.fallbacks, source=f"--base {base.path} fallbacks.json").replaced(
        studio_fallback_cells(lines)).to_doc()
    (out / "fallbacks.json").write_text(json.dumps(fallbacks, ensure_ascii=False, separators=(",", ":")) + "\n")
    (out / "authored.json").write_text(json.dumps(authored_book(lines).to_doc(), ensure_ascii=False) + "\n")
    with (out / "studio_lines.jsonl").open("w", encoding="utf-8") as f:
        for line in lines:
            f.write(json.dumps({**line.to_json(), "heldout": line in held_lines}) + "\n")
    refused = ratio < REFUSE_RATIO and not cfg.force
    report["exported"] = False
    if refused:
        report["refused"] = (f"router confidence {after['router']['mean_top1']:.3f} is {ratio:.2f} of the base's "
                             f"{before['router']['mean_top1']:.3f}, under {REFUSE_RATIO}: routing has failed; "
                             "not exported (--force exports anyway)")
    elif cfg.export:
        report["export"] = export_checkpoint(out, out)
        report["exported"] = True
    report["wall_s"] = time.perf_counter() - t_start
    (out / "finetune.json").write_text(json.dumps(report, indent=2) + "\n")
    if refused:
        raise RoutingRefused(f"{out}: {report['refused']}")
    return report


# --------------------------------------------------------------------------- flashnpc eval's section


def read_studio_lines(model_dir: str | Path) -> list[StudioLine] | None:
    """The lines a fine-tuned model directory was trained on (``studio_lines.jsonl``), or None."""
    path = Path(model_dir) / "studio_lines.jsonl"
    if not path.is_file():
        return None
    out = []
    for raw in path.read_text(encoding="utf-8").splitlines():
        d = json.loads(raw)
        out.append(StudioLine(d["archetype"], d["state"], d["line"], tuple(d["persona"]), d["intent"],
                              tuple(d["context"].items()), like=d.get("like", "")))
    return out


def eval_section(model_dir: str | Path | None) -> dict[str, Any] | None:
    """``flashnpc eval``'s fine-tune section: router confidence on the studio's lines, measured
    on the exported INT4 graph (weights rebuilt from it), against the base figure the fine-tune
    recorded; None for a model that is not a fine-tune."""
    if model_dir is None:
        return None
    lines = read_studio_lines(model_dir)
    info_path = Path(model_dir) / "finetune.json"
    if lines is None or not info_path.is_file():
        return None
    from runtime.factory.train import encode_examples
    from runtime.serving.batched_engine import load_flash

    model, tok, _ = load_flash(model_dir)
    seqs = encode_examples(tok, lines, model.config.block_size)[0]
    conf = router_confidence(model, seqs, tok.pad_id)["mean_top1"]
    info = json.loads(info_path.read_text())
    base = info["router_confidence"]["base"]
    ratio = conf / max(base, 1e-9)
    return {"router_confidence": conf, "base_router_confidence": base, "ratio": ratio,
            "passed": ratio >= PASS_RATIO, "lines": len(lines), "mode": info.get("mode")}


def format_eval_section(section: Mapping[str, Any]) -> str:
    mark = "PASS" if section["passed"] else "FAIL"
    return (f"fine-tune ({section['mode']}, {section['lines']} studio lines):\n"
            f"{mark}  router confidence (mean top-1)      {section['router_confidence']:.4f}"
            f"  (base {section['base_router_confidence']:.4f}, ratio {section['ratio']:.3f}, "
            f"target >= {PASS_RATIO})")


# --------------------------------------------------------------------------- flashnpc finetune


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``flashnpc finetune``."""
    d = FinetuneConfig()
    parser.add_argument("--base", type=Path, default=None, metavar="MODEL",
                        help="model directory or checkpoint to start from (default: the shipped model)")
    parser.add_argument("--lines", type=Path, required=True, metavar="FILE", help="the studio's lines, CSV or JSONL")
    parser.add_argument("--out", type=Path, required=True, metavar="DIR", help="model directory to write")
    parser.add_argument("--mode", choices=("adapters", "full"), default=d.mode,
                        help="adapters: router and backbone frozen (default); full: every weight trains")
    parser.add_argument("--epochs", type=float, default=d.epochs, help=f"passes over the lines (default {d.epochs:g})")
    parser.add_argument("--steps", type=int, default=None, help="optimiser steps (overrides --epochs)")
    parser.add_argument("--rank", type=int, default=d.rank, help=f"LoRA rank (default {d.rank})")
    parser.add_argument("--lr", type=float, default=None, help="peak learning rate (default 2e-3 adapters, 3e-4 full)")
    parser.add_argument("--replay", type=float, default=d.replay,
                        help=f"share of each batch from the base line book (default {d.replay})")
    parser.add_argument("--start", choices=("like", "mean"), default=d.start,
                        help="new tokens' embedding rows start from the file's `like` or the nearest base tag "
                             "(like, default) or from the mean of their kind (mean)")
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: all, at most 8)")
    parser.add_argument("--force", action="store_true", help="export even when routing has failed")


def run(args: argparse.Namespace) -> int:
    """``flashnpc finetune`` (its ``--json`` / ``--no-progress`` are ``runtime.cli``'s
    :func:`~runtime.cli.add_output_arguments`). Bad input raises :class:`FinetuneError`,
    which the ``flashnpc`` dispatcher prints as one line (exit 1, as for a refused export)."""
    import os

    from runtime.console import print_json

    cfg = FinetuneConfig(mode=args.mode, epochs=args.epochs, steps=args.steps, rank=args.rank, lr=args.lr,
                         replay=args.replay, seed=args.seed, force=args.force, start=args.start)
    if args.threads is not None and args.threads < 1:
        raise FinetuneError(f"--threads must be >= 1, got {args.threads}")
    try:
        import torch
    except ModuleNotFoundError:
        raise FinetuneError("fine-tuning needs torch: pip install torch==2.13.0 && pip install -e '.[train]'") from None
    torch.set_num_threads(args.threads or min(os.cpu_count() or 1, 8))
    report = finetune(args.base, args.lines, args.out, cfg, progress=not args.no_progress)
    if args.json:
        print_json(report)
        return 0
    rc = report["router_confidence"]
    print(f"{report['counts']['lines']} lines ({report['counts']['heldout']} held out), added "
          f"{sum(len(v) for v in report['added'].values())} control tokens "
          f"({', '.join(a for v in report['added'].values() for a in v) or 'none'})")
    for name, row in report["started_from"].items():
        print(f"{name} starts from {row['from']} ({row['how']})")
    print(f"{report['mode']}: {report['trainable_params']:,} of {report['total_params']:,} weights trained, "
          f"{report['steps']} steps in {report['train_s']:.0f} s; frozen weights unchanged: {report['frozen_unchanged']}")
    print(f"router confidence {rc['finetuned']:.3f} (base {rc['base']:.3f}, ratio {rc['ratio']:.3f}, "
          f"same expert {rc['same_expert']:.1%}) {'PASS' if rc['passed'] else 'FAIL'}")
    b, a = report["before"], report["after"]
    if b["heldout_ce"] is not None:
        print(f"held-out studio lines CE {b['heldout_ce']:.3f} -> {a['heldout_ce']:.3f}")
    if b["replay_ce"] is not None:
        print(f"base book validation lines CE {b['replay_ce']:.3f} -> {a['replay_ce']:.3f}")
    print(f"wrote {args.out}" + (" (exported)" if report["exported"] else ""))
    return 0


__all__ = ["FinetuneConfig", "FinetuneError", "RoutingRefused", "StudioLine", "add_adapters", "add_arguments",
           "book_phrases", "eval_section", "extend_bigrams", "extend_catalog", "extend_constraints",
           "extend_tokenizer", "finetune", "format_eval_section", "frozen_weights", "heldout", "load_base",
           "merge_adapters", "phrases", "read_lines", "resize_vocab", "router_confidence", "run", "start_rows",
           "studio_signatures"]
