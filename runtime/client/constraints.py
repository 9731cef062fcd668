"""Constraints on a generated line: words and phrases at the token level, slot filling, repeat memory.

Word constraints are applied while sampling, never by filtering afterwards.
:class:`WordConstraint` reads the text a line spells the way :data:`_WORD` reads lower-cased
text (``[a-z]+`` with at most one inner apostrophe: ``"don't"`` is one word, ``"dogs'"`` is
``"dogs"``), with slot tokens (``{player}``) as word boundaries that no phrase runs across, and
blocks every token that would

* **leave the vocabulary** (when the model ships one): every word the line completes must be a
  vocabulary word, and the word being spelled must stay a prefix of one, so the token that
  would leave the vocabulary's trie is the one blocked, not a later one. The end of the line
  (``eos``, and the last token of the budget) ends the word being spelled. With a vocabulary,
  characters outside printable ASCII are blocked too (the line book writes none, and some
  non-ASCII letters lower-case to ASCII ones);
* **complete a banned phrase**: phrases of 1+ words, matched on the line's word sequence
  whatever punctuation sits between them. Every phrase carries *tag bits*: the static banned
  words (``"car"``, ``"train station"``) carry the ``banned`` tag, the line book's signature
  phrases the tag they voice (``archetype:guard``, ``persona:gruff``,
  ``context:time_of_day=night``). A request bans a set of tags (:meth:`WordConstraint.banned_bits`:
  the static words plus the signatures of every archetype, trait and context value it did not
  ask for) and a token is blocked when a phrase it completes has a banned tag;
* **lead into a dead end** (with a vocabulary, not at the end of the line): leave the word
  being spelled where it could neither end (no word, or ending it completes a banned phrase)
  nor go on to a word that is not blocked. Two sound judgements decide "not blocked" (each only
  finds states from which every word is blocked): from the root, the words below that are no
  single-word phrase are free, the others need one of their tags unbanned; and from the phrase
  state under way, where every word below that the root finds free completes a phrase there
  ("old" then "kne": "old knee", "old knees"), those words need one of those phrases' tags
  unbanned (phrase states that go on with more than ``_MAX_MOVES`` words are left to the root).
  Dead ends this does not foresee (phrases of several words further on, a budget too short to
  finish a word) leave every token blocked; the engines then end the row (finish ``blocked``),
  show only its complete words (:func:`settled_text`) and prefer another sample or a fallback
  line.

The same masks apply the *text rules* (:data:`TEXT_RULES`, on unless ``text_rules=False``): a
character automaton over the line as written (case kept, a slot as one character; state
``WordState.shape``) has no move for the glitches :func:`runtime.factory.text_metrics.glitches`
counts: after ``. , ! ? ; :`` and any spaces no token may start with one of them, except the dots
that make a three-dot ellipsis exactly (``..`` only goes on to a third dot, and a line never ends
on it); no space before a mark; no mark and no lower-case letter at the line's start or, after
``. ! ?`` and a space, at a sentence's start (a capital, a slot, a quote or a digit may start
one); no apostrophe right after a slot (the game's text fills it: "{location}'s" would read
"the fields's"). And no doubled word (``WordState.echo``: the last word or slot, while only spaces follow
it): a word being spelled that is the echo may not end, a slot may not follow itself, and the
token that would start the repeat is blocked where it could never end (the line's last token, a
trie leaf). Tables per shape (and the repeat's few cases per state) are built at load and
memoised per state, so a step adds one dict lookup and one index assignment.

A token that ends exactly on a banned word (``" car"``) is allowed, because the next token may
still extend it (``"t"`` -> ``"cart"``); the next token is then only allowed if it keeps
spelling letters.

How it stays cheap: the text's state (:class:`WordState`: the vocabulary-trie node of the word
being spelled and a word-level Aho-Corasick state of the phrases under way) never depends on
the request, and inside a word its phrase state is the first one of its failure chain that
goes on with a word the word being spelled may become (0 for most words), so states that mask
alike are one state. Per state (and whether the next token is the last), a *plan* is kept: the
template of its mode (a bool mask over the tokens, shared by all states and requests), the
lead tokens it unblocks (from a table of every trie node's token leads built at load), and the
tokens whose fate depends on the request, grouped by their tags as Python ints, so that a
request's part is a handful of bit tests (``hit & banned`` and, for the dead-end rule,
``need & ~banned``) plus the tokens read whole that the request's own tags block (kept per
request and template). A token's mask is then one dict lookup for the plan, one for the
request's part, one ``np.putmask`` and a few index assignments. Plans are made from memoised
pieces (word parts by trie node, what each phrase state adds); memos are bounded (oldest out,
a hit costs one dict lookup), and the tables kept per phrase state are bounded by the automaton.
"""

from __future__ import annotations

import bisect
import json
import math
import re
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from runtime.paths import DEFAULT_MODEL_DIR

if TYPE_CHECKING:
    from runtime.client.bigrams import BigramMask, BigramTable
    from runtime.client.trigrams import TrigramTable
    from runtime.tokenizer import Tokenizer

_WORD = re.compile(r"[a-z]+(?:'[a-z]+)?")
_SLOT_MARKER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_SLOT_CHAR = "\x01"  # how a slot token reads: a word boundary standing for words no phrase holds
_TAG_KEY = re.compile(r"(?:archetype|persona):[^\s:=]+|context:[^\s:=]+=[^\s:=]+")

_NEG_INF = np.float32(-np.inf)
_MAX_MOVES = 24  # phrase states going on with more words leave their dead ends to the root's judgement
_DEAD = -1  # trie node of a word no tracked word starts with (only tracked without a vocabulary)
_BOUNDARY, _LETTERS, _APOSTROPHE, _AFTER = 0, 1, 2, 3  # WordState.mode
_ECHO_OTHER, _ECHO_KEEP, _ECHO_SLOT, _ECHO_EXACT = range(4)  # how a token read whole moves WordState.echo
_VOCAB_TAG, _BANNED_TAG, _FREE_TAG = "vocabulary", "banned", "free"  # reserved tags; no request bans "free"


def _is_letter(c: str) -> bool:
    return "a" <= c <= "z"


class WordState(NamedTuple):
    """Where a line's text stands for the word constraints (request-independent).

    ``node``: the trie node of the word being spelled (0 at a word boundary; -1 for a word that
    no tracked word starts with, which only happens without a vocabulary). ``mode``: 0 at a
    boundary, 1 spelling letters, 2 right after an apostrophe that follows letters (the next
    character decides whether it belongs to the word; ``node`` is the word before it), 3
    spelling letters after that apostrophe (another apostrophe ends the word). ``phrase``: the
    phrase automaton's state, the longest run of last completed words that begins a phrase;
    inside a word, the first state of its failure chain that goes on with a word the word being
    spelled may become, else 0 (an equivalent state: see ``WordConstraint._state``).

    ``shape`` and ``echo`` are the text rules' part (see :data:`TEXT_RULES`): ``shape`` the
    punctuation and case automaton's state (0 at the line's start, :data:`MID_LINE`'s after a
    word); ``echo`` the last completed word (its trie node) or slot (``len(trie) + token id``)
    when only spaces followed it, which the next word or slot may not repeat (-1: none).

    ``prev``: the bigram table's part (:mod:`runtime.client.bigrams`, only with one): the id of
    the last word or slot completed in the sentence piece under way (the word before the one
    being spelled), ``bigrams.PIECE`` (-1) at a piece start, ``bigrams.ANY`` (-2) where unknown.
    """

    node: int = 0
    mode: int = 0
    phrase: int = 0
    shape: int = 0
    echo: int = -1
    prev: int = -1


# ---------------------------------------------------------------- text rules (punctuation, case)
#
# The shape automaton reads a line's characters (case kept, a slot token as one "other"
# character) and has no move where the text would hold a glitch that
# runtime.factory.text_metrics.glitches counts: two of ". , ! ? ; :" in a row (spaces between or
# not) other than an ellipsis of exactly three dots, a space before one of them, a mark at the
# line's start, a lower-case letter starting the line or a sentence (after ". ! ?" and spaces).
_START, _OTHER, _SPACE, _DOT1, _DOT2, _END, _PAUSE, _SENT, _SLOTTED = range(9)  # WordState.shape
_SPACE_C, _DOT_C, _END_C, _PAUSE_C, _LOWER_C, _OTHER_C, _APOS_C, _SLOT_C = range(8)  # character classes
_X = -1  # no move: a glitch
_SHAPE_NEXT: tuple[tuple[int, ...], ...] = (
    # space      .       ! ?     , ; :   a-z     other   '       slot
    (_START, _X, _X, _X, _X, _OTHER, _OTHER, _SLOTTED),           # _START: the line's start (spaces only so far)
    (_SPACE, _DOT1, _END, _PAUSE, _OTHER, _OTHER, _OTHER, _SLOTTED),  # _OTHER: after a word, a quote...
    (_SPACE, _X, _X, _X, _OTHER, _OTHER, _OTHER, _SLOTTED),       # _SPACE: spaces after a word, or after , ; :
    (_SENT, _DOT2, _X, _X, _OTHER, _OTHER, _OTHER, _SLOTTED),     # _DOT1: "." after a word
    (_X, _END, _X, _X, _X, _X, _X, _X),                           # _DOT2: "..": only a third dot (which ends like "!")
    (_SENT, _X, _X, _X, _OTHER, _OTHER, _OTHER, _SLOTTED),        # _END: after "!", "?" or "..."
    (_SPACE, _X, _X, _X, _OTHER, _OTHER, _OTHER, _SLOTTED),       # _PAUSE: after ",", ";" or ":"
    (_SENT, _X, _X, _X, _X, _OTHER, _OTHER, _SLOTTED),            # _SENT: a sentence's start (". ! ?" and spaces)
    (_SPACE, _DOT1, _END, _PAUSE, _OTHER, _OTHER, _X, _SLOTTED),  # _SLOTTED: right after a slot: no "'" glued to it
)
TEXT_RULES = ("double_punct", "space_before_punct", "lowercase_start", "double_word", "slot_possessive")
"""The glitch kinds of :func:`runtime.factory.text_metrics.glitches` that the masks make impossible
(with a vocabulary, ``stutter`` is too: every word is the book's)."""


def _char_class(c: str) -> int:
    if c == " " or "\t" <= c <= "\r":
        return _SPACE_C
    if c == ".":
        return _DOT_C
    if c in "!?":
        return _END_C
    if c in ",;:":
        return _PAUSE_C
    if c == "'":
        return _APOS_C
    if c == _SLOT_CHAR:
        return _SLOT_C
    return _LOWER_C if _is_letter(c) else _OTHER_C


def _shape_read(shape: int, text: str) -> int:
    """The shape after ``text`` (case kept; a slot as ``_SLOT_CHAR``), or -1 at a glitch."""
    for c in text:
        shape = _SHAPE_NEXT[shape][_char_class(c)]
        if shape < 0:
            return _X
    return shape


MID_LINE = WordState(shape=_OTHER)
"""The state after a word mid-sentence, with no word to echo (for reading text from the middle of a line)."""


_Group = tuple[int, int, np.ndarray]  # (hit tags, need tags, tokens)
_Ids = np.ndarray  # token ids in a table (int64), as a group holds them


def _selected(groups: Iterable[_Group], ban: int) -> list[np.ndarray]:
    """The tokens of ``groups`` a request banning ``ban`` blocks: a group's tokens are blocked
    when one of its ``hit`` tags is banned and none of its ``need`` tags is free (not banned)."""
    free = ~ban
    return [toks for hit, need, toks in groups if hit & ban and not need & free]


class _Tagged:
    """Tokens whose fate depends on the request, as the phrase automaton's root reads them:
    ``groups`` of (hit, need, tokens), and ``by_word``: the tokens whose hit comes from a word
    ending, by phrase-word id, as [(need, tokens)]. Read in another phrase state, a word can
    only complete more phrases (the root's are among them), and only the words that state
    sends elsewhere than the root does, so those get a group with their extra tags. ``at``
    (tokens that leave a word being spelled, not at the end of the line): all of them, by the
    state they leave as (trie node, pending apostrophe), for the dead ends that the phrase state
    under way decides (``WordConstraint._dead_groups``); made on first use from ``leaving``
    (tokens, nodes, pending apostrophes)."""

    __slots__ = ("_arrays", "_at", "by_word", "groups", "leaving")

    def __init__(self, groups: tuple[_Group, ...], by_word: dict[int, list[tuple[int, _Ids]]]) -> None:
        self.groups = groups
        self.by_word = by_word
        self.leaving: tuple[list[int], list[int], list[bool]] = ([], [], [])
        self._at: dict[tuple[int, bool], _Ids] | None = None
        self._arrays: tuple[np.ndarray, ...] | None = None

    @property
    def at(self) -> dict[tuple[int, bool], _Ids]:
        """See the class docstring."""
        if self._at is None:
            table: dict[tuple[int, bool], list[int]] = {}
            for t, node, a in zip(*self.leaving):
                table.setdefault((node, bool(a)), []).append(t)
            self._at = {k: np.asarray(v, dtype=np.int64) for k, v in table.items()}
        return self._at

    def select(self, ban: int) -> np.ndarray:
        """The tokens of ``groups`` that a request banning ``ban`` blocks (:func:`_selected`),
        vectorised over many groups when every tag fits in 64 bits."""
        if self._arrays is None:
            g = self.groups
            wide = len(g) < 16 or any(x[0] >> 64 or x[1] >> 64 for x in g)
            self._arrays = () if wide else (
                np.asarray([x[0] for x in g], dtype=np.uint64), np.asarray([x[1] for x in g], dtype=np.uint64),
                np.asarray([len(x[2]) for x in g], dtype=np.int64), np.concatenate([x[2] for x in g]))
        if not self._arrays or ban >> 64:
            return _joined(_selected(self.groups, ban))
        hit, need, counts, flat = self._arrays
        b = np.uint64(ban)
        return flat[np.repeat(((hit & b) != 0) & ((need & ~b) == 0), counts)]


class _WordPart(NamedTuple):
    """The phrase-independent part of a state's mask (see ``WordConstraint._word_part``): the
    ``mask`` is its ``base`` (a template per mode, shared by all states) with ``live`` unblocked
    (the template itself where none are). Tokens read whole from a boundary (the state's, or
    the one after the word being spelled ends) are dealt with apart (``WordConstraint._whole``)."""

    base: int  # the template's id: 4 * mode + 2 * last + (the word may end)
    live: np.ndarray | None  # lead tokens the vocabulary allows (unblocked in the template)
    mask: np.ndarray  # read-only
    end_wid: int  # the word that ``ends`` tokens complete (-1: none, at a boundary)
    ends: np.ndarray | None  # allowed tokens that end the word being spelled at their start
    whole: _Tagged | None  # the request-dependent tokens read whole after the word ends (None: none)
    exact: np.ndarray  # tokens read out one by one
    leads: _Tagged  # lead tokens: at the end of the line, completing words; else their dead ends


class _Plan(NamedTuple):
    """The request-independent part of a state's mask (``WordConstraint._plan``): its word
    part's ``mask``, then the ``groups`` a request blocks (see :func:`_selected`), besides the
    whole-read tokens of template ``base`` (``_ban_part``)."""

    base: int  # the template's id: 4 * mode + 2 * last + (the word may end)
    mask: np.ndarray  # read-only
    groups: tuple[_Group, ...]


class _Voice(NamedTuple):
    """One request's voice bonus (``WordConstraint._make_voice``): the potential ``phi`` per trie
    node; the tokens that start a word with a bonus, read from a word boundary, and their bonus
    (``idx``, ``val``); those of them that end a word being spelled first (``end_idx``,
    ``end_val``); (tag bit, worth) of the requested tags; and where ``phi`` is not 0."""

    phi: np.ndarray
    idx: np.ndarray
    val: np.ndarray
    end_idx: np.ndarray
    end_val: np.ndarray
    worth: list[tuple[int, float]]
    live: np.ndarray
    at_boundary: np.ndarray  # [vocab] the bonus at a word boundary: ``val`` at ``idx``, else 0 (read-only)
    at_end: np.ndarray  # [vocab] ``end_val`` at ``end_idx``, else 0 (read-only)


class MaskParts(NamedTuple):
    """What masking a logits row in ``state`` takes that the row's values play no part in
    (:meth:`WordConstraint.prepare`), for one (``state``, ``last``, ``ban``): the state's kept
    mask (``base``, read-only), the other tokens the request blocks there (``ids``, one array;
    None: none) and the voice bonus (``bonus``; None: none). The decode loop makes them for a
    row's next position while the model computes that position's logits."""

    state: WordState
    last: bool
    ban: int
    base: np.ndarray
    ids: np.ndarray | None
    bonus: np.ndarray | None


VOICE_KINDS = ("archetype", "persona", "context", "unasked", "within")
"""The keys of a voice bonus (:meth:`WordConstraint.voice_bonus`): the worth, in logits, of a
signature word of a requested archetype, persona trait and context value, the cost of heading
for one of a tag the request did not ask for, and how far below the model's most likely token
(in logits) a token may be and still get a bonus (:meth:`WordConstraint.mask_logits`)."""


def check_voice(voice: Mapping[str, float] | None) -> dict[str, float]:
    """``voice`` as a dict of floats; ValueError naming a key outside :data:`VOICE_KINDS` or a
    value that is not a finite number >= 0."""
    out: dict[str, float] = {}
    for key, value in (voice or {}).items():
        if key not in VOICE_KINDS:
            raise ValueError(f"voice bonus: unknown kind {key!r}; known: {', '.join(VOICE_KINDS)}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value) or value < 0:
            raise ValueError(f"voice bonus {key!r} must be a finite number >= 0, got {value!r}")
        if value:
            out[key] = float(value)
    return out


class _Memo:
    """A thread-safe memo of at most ``size`` entries that drops the oldest first.

    A hit is one dict lookup (no lock, no bookkeeping: atomic under the GIL), so the entries
    decoding meets on every token cost nothing to keep; an insert drops the oldest entry in
    O(1). An entry dropped while still in use is made again, once, and is then the newest."""

    def __init__(self, size: int) -> None:
        self.size = max(1, size)
        self._d: dict[Hashable, Any] = {}
        self._lock = threading.Lock()
        self.peek: Callable[[Hashable], Any] = self._d.get
        """The entry for a key, or None (the dict's own ``get``: no Python frame on the hot path)."""

    def get(self, key: Hashable, make: Callable[[], Any]) -> Any:
        """The entry for ``key``, made by ``make()`` and kept if there is none."""
        value = self._d.get(key)
        if value is not None:
            return value
        return self.put(key, make())

    def put(self, key: Hashable, value: Any) -> Any:
        """Keep ``value`` (not None) for ``key`` and return it (for a caller that made it after
        :attr:`peek` found none: no closure to build on the way)."""
        d = self._d
        with self._lock:
            d[key] = value
            while len(d) > self.size:
                del d[next(iter(d))]
        return value

    def __len__(self) -> int:
        return len(self._d)


def _words_of(phrase: str) -> tuple[str, ...]:
    return tuple(_WORD.findall(phrase.lower()))


class WordConstraint:
    """Token masks that keep a line inside a vocabulary and free of banned phrases (see the module
    docstring for the semantics).

    ``words``: the static banned words or phrases (case-insensitive; tag ``banned``).
    ``tokenizer``: the model's tokenizer. ``vocabulary``: every word a line may complete
    (None: no vocabulary constraint). ``signatures``: ``{tag: [phrases]}`` with tags
    ``archetype:NAME``, ``persona:NAME`` and ``context:SLOT=VALUE``; with a vocabulary, phrases
    holding a non-vocabulary word are dropped (no line can say them). ``max_states`` bounds the
    memos: the word parts and the plans of ``2 * max_states`` states each, the whole-read tokens
    of ``max_states`` requests, the steps of ``8 * max_states`` (state, token) pairs (a few MB
    in all at the default; what is kept per phrase state is
    bounded by the phrase automaton). Always blocked too: control tokens other than ``eos`` and
    slot tokens, and tokens holding ASCII control characters or braces.

    The dead-end rule applies with a vocabulary only (see the module docstring). ``text_rules``
    (default on): also block the punctuation, case and doubled-word glitches of
    :data:`TEXT_RULES` (the state still tracks them when off, for a peer measured without them).

    Thread-safe. Masks and states never depend on the request; only :meth:`blocked`'s
    ``banned`` argument does.
    """

    def __init__(self, words: Iterable[str], tokenizer: Tokenizer, *, vocabulary: Iterable[str] | None = None,
                 signatures: Mapping[str, Iterable[str]] | None = None, max_states: int = 4096,
                 text_rules: bool = True, voice: Mapping[str, float] | None = None,
                 bigrams: BigramTable | None = None) -> None:
        self.tokenizer = tokenizer
        self.text_rules = text_rules
        self.voice = check_voice(voice)
        self.vocab_size = tokenizer.vocab_size
        self.eos_id = tokenizer.eos_id
        self.vocabulary: frozenset[str] | None = None if vocabulary is None else frozenset(vocabulary)
        self.tags: tuple[str, ...] = (_VOCAB_TAG, _BANNED_TAG, _FREE_TAG, *sorted(signatures or {}))
        self._tag_bit = {t: 1 << i for i, t in enumerate(self.tags)}
        self._vocab_bit, self._free_bit = self._tag_bit[_VOCAB_TAG], self._tag_bit[_FREE_TAG]
        # per signature tag: (bit, kind, name: a trait, or a context value's slot), for the voice bonus
        self._tag_kinds = [(self._tag_bit[t], t.partition(":")[0], t.partition(":")[2].split("=", 1)[0])
                           for t in self.tags[3:]]
        self._context_slots = len({name for _, kind, name in self._tag_kinds if kind == "context"})
        phrases: dict[tuple[str, ...], int] = {}
        for w in words:
            parts = _words_of(w)
            if parts:
                phrases[parts] = phrases.get(parts, 0) | self._tag_bit[_BANNED_TAG]
        for tag, items in (signatures or {}).items():
            for p in items:
                parts = _words_of(p)
                if parts and (self.vocabulary is None or all(x in self.vocabulary for x in parts)):
                    phrases[parts] = phrases.get(parts, 0) | self._tag_bit[tag]
        self.phrases: list[tuple[str, ...]] = list(phrases)
        self._build_trie(self.vocabulary if self.vocabulary is not None else {x for p in phrases for x in p})
        self._build_phrases(phrases)
        self._build_ways()
        self._index_tokens()
        self._index_text_rules()
        self._default = self._vocab_bit | self._tag_bit[_BANNED_TAG]
        self._all_signatures = sum(self._tag_bit[t] for t in self.tags[3:])
        self._parts = _Memo(2 * max_states)  # word parts (small), by trie node, mode and last
        self._plans = _Memo(2 * max_states)  # a state's request-independent mask, by state and last
        self._per_ban = _Memo(max_states)  # per request: its whole-read tokens (by template id), made on first use
        self._rules = _Memo(2 * max_states)  # the doubled-word rule's tokens, by (node, mode, echo, last, shape?)
        self._fixed: dict[Hashable, Any] = {}  # per mode: whole-token groups, exact tokens
        self._voices = _Memo(max_states)  # per request: its voice bonus (_Voice), by banned tags
        self._steps = _Memo(8 * max_states)  # step(): the state after a token, by (state, token)
        self._voice_table: tuple[np.ndarray, np.ndarray, list[tuple[int, str]]] | None = None
        self._bigrams: BigramMask | None = None
        if bigrams is not None:  # (the bigram masks: runtime.client.bigrams)
            from runtime.client.bigrams import BigramMask
            self._bigrams = BigramMask(bigrams, self, max_states)

    # ------------------------------------------------------------ building

    def _build_trie(self, words: Iterable[str]) -> None:
        """The character trie of the tracked words (the vocabulary, else the phrases' words)."""
        self._child: list[dict[str, int]] = [{}]
        self._parent: list[int] = [-1]
        self._is_word: list[bool] = [False]
        self._spelled: list[str] = [""]  # each node's string
        for word in sorted(words):
            node = 0
            for k, c in enumerate(word):
                nxt = self._child[node].get(c)
                if nxt is None:
                    nxt = len(self._child)
                    self._child[node][c] = nxt
                    self._child.append({})
                    self._parent.append(node)
                    self._is_word.append(False)
                    self._spelled.append(word[: k + 1])
                node = nxt
            self._is_word[node] = True
        self._wid = [0] * len(self._child)  # phrase-word id per node (0: a word no phrase holds)
        # nodes are numbered in preorder (sorted words): a node's subtree is the ids up to this end
        self._subtree_end = list(range(1, len(self._child) + 1))
        for node in reversed(range(1, len(self._child))):
            parent = self._parent[node]
            self._subtree_end[parent] = max(self._subtree_end[parent], self._subtree_end[node])

    def _build_phrases(self, phrases: Mapping[tuple[str, ...], int]) -> None:
        """A word-level Aho-Corasick automaton: ``_goto`` per state, ``_fail`` links and the tag
        bits of every phrase that ends in each state (``_out``)."""
        wid_of: dict[str, int] = {}
        self._goto: list[dict[int, int]] = [{}]
        bits_at = [0]
        for parts, bits in phrases.items():
            q = 0
            for w in parts:
                wid = wid_of.setdefault(w, len(wid_of) + 1)
                nxt = self._goto[q].get(wid)
                if nxt is None:
                    nxt = len(self._goto)
                    self._goto[q][wid] = nxt
                    self._goto.append({})
                    bits_at.append(0)
                q = nxt
            bits_at[q] |= bits
        self._fail = [0] * len(self._goto)
        self._out = list(bits_at)
        todo = deque(self._goto[0].values())
        while todo:
            q = todo.popleft()
            self._out[q] |= self._out[self._fail[q]]
            for wid, nxt in self._goto[q].items():
                f = self._fail[q]  # q is never the root here: its children fail to the root
                while f and wid not in self._goto[f]:
                    f = self._fail[f]
                self._fail[nxt] = self._goto[f].get(wid, 0)
                todo.append(nxt)
        self._node_of_wid = [0] * (len(wid_of) + 1)  # (0: a word outside the trie)
        for w, wid in wid_of.items():
            node = self._walk(0, w)
            if node >= 0:
                self._wid[node] = wid
                self._node_of_wid[wid] = node
        self._root_next = [self._goto[0].get(wid, 0) for wid in range(len(wid_of) + 1)]
        # per phrase state, made on first use (so bounded by the automaton): the words it sends
        # elsewhere than the root does, the groups that makes per template, the words it goes on with
        n = len(self._goto)
        self._moves: list[dict[int, int] | None] = [None] * n
        self._moved: list[dict[int, list[_Group]] | None] = [None] * n
        self._goto_nodes: list[list[int] | None] = [None] * n  # the trie nodes of the words it goes on with
        self._dead: list[dict[tuple[int, bool], int] | None] = [None] * n  # see _dead_under

    def _build_ways(self) -> None:
        """What a word being spelled can still become, for the dead-end rule: per trie node
        ``_need_at`` (the node's word and those below it) and ``_need_below`` (those below
        only): the ``free`` tag if one of them is no single-word phrase, else the union of the
        tags of the single-word phrases they are (0: there are none). Also kept apart, for the
        phrase state under way (:meth:`_dead_under`): how many of them are free (``_free_at``,
        ``_free_below``) and the union of the others' tags (``_tags_at``, ``_tags_below``).
        Without a vocabulary every node is free (any word may follow)."""
        n = len(self._child)
        free = self._free_bit
        cnt_at, cnt_below, tags_at, tags_below = [0] * n, [0] * n, [0] * n, [0] * n
        if self.vocabulary is None:
            self._need_at = self._need_below = [free] * n
        else:
            for node in reversed(range(n)):  # children come after their parents
                c_b = t_b = 0
                for c in self._child[node].values():
                    c_b += cnt_at[c]
                    t_b |= tags_at[c]
                cnt_below[node], tags_below[node] = c_b, t_b
                single = self._out[self._goto[0].get(self._wid[node], 0)] if self._wid[node] else 0
                if not self._is_word[node]:
                    cnt_at[node], tags_at[node] = c_b, t_b
                elif single:
                    cnt_at[node], tags_at[node] = c_b, t_b | single
                else:
                    cnt_at[node], tags_at[node] = c_b + 1, t_b
            self._need_at = [free if c else t for c, t in zip(cnt_at, tags_at)]
            self._need_below = [free if c else t for c, t in zip(cnt_below, tags_below)]
        self._free_at, self._free_below, self._tags_at, self._tags_below = cnt_at, cnt_below, tags_at, tags_below

    def _walk(self, node: int, text: str) -> int:
        for c in text:
            if node < 0:
                return _DEAD
            node = self._child[node].get(c, _DEAD)
        return node

    def _index_tokens(self) -> None:
        """Read every token once: its text (lower case; a slot token reads as a boundary), what is
        always blocked, what the whole token does read from a word boundary, and per mode of the
        state it is read in, its *lead* (the characters that extend the word being spelled) and
        *rest* (what follows, read from a word boundary)."""
        tok, v = self.tokenizer, self.vocab_size
        vocab = self.vocabulary is not None
        self._texts: list[str] = []
        always = np.zeros(v, dtype=bool)
        for i in range(v):
            if i < tok.n_control:
                slot = tok._slot_of.get(i)
                self._texts.append(_SLOT_CHAR if slot else "")
                always[i] = slot is None and i != self.eos_id
            else:
                # latin-1 keeps one char per byte; bytes >= 0x80 never spell [a-z]
                raw = tok.token_bytes(i)
                self._texts.append(raw.decode("latin-1").lower())
                # ASCII control characters (newlines included) have no place in a subtitle, and
                # braces only come as slot tokens (a spelled-out "{player}" would bypass slot rules)
                always[i] = (any(b < 0x20 or b == 0x7F or (vocab and b >= 0x80) for b in raw)
                             or b"{" in raw or b"}" in raw)
        self._always = always
        # the whole token read from a boundary ("simple": it ends no word inside itself): fine
        # (not last / last), and the word its trailing letters leave being spelled
        bad = [np.zeros(v, dtype=bool), np.zeros(v, dtype=bool)]
        tail_wid = np.zeros(v, dtype=np.int64)
        tail_node = np.full(v, _DEAD, dtype=np.int64)
        tail_need = [self._free_bit] * v
        simple = np.zeros(v, dtype=bool)
        # for step(): the state a simple token leaves read from a boundary, (node, mode), None if
        # it is not simple; and whether it is a slot (which also resets the phrases under way)
        self._whole_state: list[tuple[int, int] | None] = [None] * v
        self._is_slot = [t == _SLOT_CHAR for t in self._texts]
        for i, text in enumerate(self._texts):
            if always[i]:
                continue
            simple[i] = self._simple(text)
            if simple[i]:
                st, ok, _ = self._read(WordState(), text, False)
                if i != self.eos_id:
                    self._whole_state[i] = (st.node, st.mode)
                bad[0][i] = not ok
                bad[1][i] = not self._read(WordState(), text, True)[1]
                if st.mode != _BOUNDARY and st.node >= 0:
                    tail_wid[i], tail_node[i] = self._wid[st.node], st.node
                    tail_need[i] = self._need_on(st.node, st.mode)
        self._rest_bad = bad
        self._tail_wid = tail_wid
        self._tail = (tail_node, tail_need)
        simple[self.eos_id] = True
        # per in-word mode: tokens ending the word at their first character (their rest is the
        # whole token: "ends"), tokens adding letters only (grouped by lead), and tokens read out
        # exactly (a lead and a rest, or a rest that ends a word or holds a slot)
        self._ends: dict[int, np.ndarray] = {}
        leads: dict[tuple[int, bool], dict[str, list[int]]] = {}
        self._exact: dict[int, np.ndarray] = {_BOUNDARY: np.flatnonzero(~simple & ~always)}
        # for step(): per in-word mode, a lead-only token's lead and the mode it leaves
        self._lead_step: dict[int, list[tuple[str, int] | None]] = {}
        for mode in (_LETTERS, _APOSTROPHE, _AFTER):
            ends: list[int] = []
            exact: list[int] = []
            normal, pending = leads[mode, False], leads[mode, True] = {}, {}
            lead_step = self._lead_step[mode] = [None] * v
            for i, text in enumerate(self._texts):
                if always[i]:
                    continue
                if i == self.eos_id:
                    ends.append(i)
                    continue
                lead, apos, rest = self._split(text, mode)
                if not lead and not apos:
                    (ends if simple[i] else exact).append(i)
                elif rest:
                    exact.append(i)
                else:
                    (pending if apos else normal).setdefault(lead, []).append(i)
                    lead_step[i] = (lead, _APOSTROPHE if apos else _AFTER if "'" in lead or mode == _AFTER
                                    else _LETTERS)
            self._ends[mode] = np.asarray(ends, dtype=np.int64)
            self._exact[mode] = np.asarray(exact, dtype=np.int64)
        self._build_lead_walks(leads)
        self._ends_mask = {m: np.zeros(v, dtype=bool) for m in self._ends}
        for m, idx in self._ends.items():
            self._ends_mask[m][idx] = True
        self._ends_list = {m: mask.tolist() for m, mask in self._ends_mask.items()}
        # mask templates: at a boundary; in a word whose end is fine / not fine (vocabulary only),
        # with the tokens that end it where it is fine
        self._boundary_blocked = []
        self._in_word: dict[tuple[int, bool], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        for last in (False, True):
            base = always | bad[last]
            base[self._exact[_BOUNDARY]] = False
            base.flags.writeable = False
            self._boundary_blocked.append(base)
            for m in self._ends:
                if vocab:
                    ok = np.ones(v, dtype=bool)
                    ok[self._ends[m]] = base[self._ends[m]]
                    not_ok = np.ones(v, dtype=bool)
                    ok[self._exact[m]] = not_ok[self._exact[m]] = False
                else:
                    ok = not_ok = always.copy()
                ok.flags.writeable = not_ok.flags.writeable = False
                self._in_word[m, last] = (ok, not_ok, self._ends[m][~ok[self._ends[m]]])
        # the same by template id (4 * mode + 2 * last + the word may end), as _pieces reads them
        self._templates: list[np.ndarray] = [self._boundary_blocked[0]] * 16
        for last in (False, True):
            self._templates[2 * last + 1] = self._boundary_blocked[last]
            for m in self._ends:
                self._templates[4 * m + 2 * last + 1], self._templates[4 * m + 2 * last] = self._in_word[m, last][:2]

    def _index_text_rules(self) -> None:
        """The text rules' tables (see :data:`TEXT_RULES`): per shape, the shape every token
        leaves (``_shape_next``; -1: it would write a glitch; ``eos`` keeps the shape where the
        line may end there) and the tokens blocked, not last and last (``_shape_block``: the
        glitches, and at the last token what leaves an unfinished ellipsis). For the doubled
        words: how each token read whole moves ``WordState.echo`` (``_echo_kind``), the tokens
        that start a word after spaces only, by the trie node they leave, whether on a pending
        apostrophe and whether they start with a space (``_lands``; ``(node, pending, False)``:
        all of them, as read at a boundary; ``True``: those that end a word being spelled first),
        and where a word has no way on (``_leaf``: a repeat of it there is
        a dead end)."""
        tok, v = self.tokenizer, self.vocab_size
        self._raw: list[str] = [
            (_SLOT_CHAR if self._is_slot[i] else "") if i < tok.n_control else tok.token_bytes(i).decode("latin-1")
            for i in range(v)]
        table = np.full((len(_SHAPE_NEXT), v), _X, dtype=np.int64)
        for shape in range(len(_SHAPE_NEXT)):
            table[shape] = [_shape_read(shape, text) for text in self._raw]
            table[shape, self.eos_id] = _X if shape == _DOT2 else shape
        self._shape_next = table.tolist()
        open_ = ~self._always
        self._shape_block = [[np.flatnonzero(open_ & ((row < 0) | (last & (row == _DOT2)))) for row in table]
                             for last in (False, True)]
        kinds = [_ECHO_OTHER] * v
        lands: dict[tuple[int, bool, bool], list[int]] = {}
        for i, text in enumerate(self._texts):
            whole = self._whole_state[i]
            if self._is_slot[i]:
                kinds[i] = _ECHO_SLOT
            elif whole is None:
                kinds[i] = _ECHO_EXACT if not self._always[i] and i != self.eos_id else _ECHO_OTHER
            elif text.strip(" ") == "" and text:
                kinds[i] = _ECHO_KEEP
            elif whole[1] != _BOUNDARY and text.lstrip(" ") and _is_letter(text.lstrip(" ")[0]):
                head = text.lstrip(" ")
                if all(_is_letter(c) or c == "'" for c in head):
                    kinds[i] = _ECHO_KEEP
                    if whole[0] >= 0 and not self._always[i]:
                        for spaced in (False, True) if head != text else (False,):
                            lands.setdefault((whole[0], whole[1] == _APOSTROPHE, spaced), []).append(i)
        self._echo_kind = kinds
        self._lands = {n: np.asarray(t, dtype=np.int64) for n, t in lands.items()}
        # a word that is the echo with no way on: a leaf; or, right after an apostrophe, no "'" below
        self._leaf = ([not c for c in self._child], ["'" not in c for c in self._child])
        self._slot_base = len(self._child)  # WordState.echo of a slot: this plus its token id
        self._slot_ids = {name: i for i, name in tok._slot_of.items()}
        self._exact_any = any(len(a) for a in self._exact.values())

    @staticmethod
    def _simple(text: str) -> bool:
        """Read from a word boundary, ``text`` ends no word inside itself, and is a slot token or
        holds no slot (a slot resets the phrases under way, which only the next state sees)."""
        if _SLOT_CHAR in text and text != _SLOT_CHAR:
            return False
        in_word = False
        for k, c in enumerate(text):
            if _is_letter(c):
                in_word = True
            elif c == "'" and in_word and (k + 1 == len(text) or _is_letter(text[k + 1])):
                continue
            elif in_word:
                return False
        return True

    @staticmethod
    def _split(text: str, mode: int) -> tuple[str, bool, str]:
        """(lead, lead ends on a pending apostrophe, rest) of a token read in an in-word ``mode``.

        The lead is what extends the word being spelled (for mode 2 it starts with the pending
        apostrophe, which a letter confirms); the rest starts at the first character that ends
        the word, and is read from a word boundary."""
        k, lead = 0, ""
        if mode == _APOSTROPHE:
            if not (text and _is_letter(text[0])):
                return "", False, text
            lead, mode = "'", _AFTER
        while k < len(text):
            c = text[k]
            if _is_letter(c):
                lead += c
            elif c == "'" and mode == _LETTERS:
                if k + 1 == len(text):
                    return lead, True, ""
                if not _is_letter(text[k + 1]):
                    break
                lead += c
                mode = _AFTER
            else:
                break
            k += 1
        return lead, False, text[k:]

    def _build_lead_walks(self, leads: Mapping[tuple[int, bool], Mapping[str, list[int]]]) -> None:
        """For every in-word state (trie node, mode): the tokens that only add letters and keep
        the word inside the trie, with the node each reaches and whether its lead ends on a
        pending apostrophe, as one slice of flat arrays sorted by state (``_walk_slice``). Built
        once for all states from the other side: each node's string split into a state's word
        and a token's lead."""
        groups: list[list[int]] = []
        by_lead: dict[str, tuple[list[tuple[int, int, bool]], list[tuple[int, int, bool]]]] = {}
        lone = None  # a lone apostrophe token after the word
        for (mode, apos), table in leads.items():
            for lead, toks in table.items():
                if mode == _LETTERS and apos and not lead:
                    lone = len(groups)
                else:  # (after an apostrophe, before one)
                    by_lead.setdefault(lead, ([], []))[mode != _AFTER].append((mode, len(groups), apos))
                groups.append(toks)
        # one entry per (state, node reached, token group), as flat lists
        states: list[int] = []  # 4 * node + mode
        reached: list[int] = []
        entry_group: list[int] = []
        entry_apos: list[bool] = []
        child, spelled = self._child, self._spelled
        for n2 in range(1, len(child)):
            p2 = spelled[n2]
            cut = p2.find("'")
            if lone is not None and cut < 0:
                states.append(4 * n2 + _LETTERS)
                reached.append(n2)
                entry_group.append(lone)
                entry_apos.append(True)
            node = 0
            for k in range(1, len(p2)):
                node = child[node][p2[k - 1]]
                hit = by_lead.get(p2[k:])
                if hit is None or p2[k - 1] == "'":  # no state rests on an apostrophe node
                    continue
                for mode, g, apos in hit[not 0 <= cut < k]:
                    states.append(4 * node + mode)
                    reached.append(n2)
                    entry_group.append(g)
                    entry_apos.append(apos)
        # expanded to one row per token and sorted by state: a state's walk is a slice
        sizes = np.asarray([len(g) for g in groups], dtype=np.int64)
        flat = np.asarray([t for g in groups for t in g], dtype=np.int64)
        start = np.cumsum(sizes) - sizes
        eg = np.asarray(entry_group, dtype=np.int64)
        order = np.argsort(np.asarray(states, dtype=np.int64), kind="stable")
        rep = np.repeat(order, sizes[eg[order]])
        within = np.arange(len(rep)) - np.repeat(np.cumsum(sizes[eg[order]]) - sizes[eg[order]], sizes[eg[order]])
        key = np.asarray(states, dtype=np.int64)[rep]
        self._walk_toks = flat[start[eg[rep]] + within]
        self._walk_reached = np.asarray(reached, dtype=np.int64)[rep]
        self._walk_apos = np.asarray(entry_apos, dtype=bool)[rep]
        bounds = np.flatnonzero(np.diff(key)) + 1
        lo = np.concatenate([[0], bounds]).tolist()
        hi = np.concatenate([bounds, [len(key)]]).tolist()
        self._walk_slice = dict(zip(key[lo].tolist() if len(key) else [], zip(lo, hi)))
        n = len(child)
        self._is_word_np = np.asarray(self._is_word, dtype=bool)
        self._wid_np = np.asarray(self._wid, dtype=np.int64)
        self._apos_live_np = np.asarray([self._is_word[i] or "'" in child[i] for i in range(n)], dtype=bool)
        self._need_apos = [self._need_on(i, _APOSTROPHE) for i in range(n)]

    # ------------------------------------------------------------ the state machine

    def _next_phrase(self, q: int, wid: int) -> int:
        """The phrase automaton's state after a completed word (``wid`` 0: no phrase holds it)."""
        if not wid:
            return 0
        goto, fail = self._goto, self._fail
        while q and wid not in goto[q]:
            q = fail[q]
        return goto[q].get(wid, 0)

    def _end(self, node: int, q: int) -> tuple[int, int, bool]:
        """A word (trie ``node``) ended: (phrase state after it, tag bits of the phrases it
        completes, whether the vocabulary allows it)."""
        wid = self._wid[node] if node >= 0 else 0
        q = self._next_phrase(q, wid)
        return q, self._out[q], self.vocabulary is None or (node >= 0 and self._is_word[node])

    def _need_on(self, node: int, mode: int) -> int:
        """The ``_need_*`` tags of going on with the word of an in-word state (past its end)."""
        if node < 0:
            return self._free_bit
        if mode != _APOSTROPHE:
            return self._need_below[node]
        after = self._child[node].get("'")
        return 0 if after is None else self._need_at[after]

    def _stuck(self, state: WordState, ban: int) -> bool:
        """The dead-end rule for the state a token leaves (not at the end of the line): its word
        can neither end (no word, or a banned phrase completes) nor go on to a free word, as
        judged from the root (single-word phrases) or from the phrase state under way (the
        phrases the words below complete there, :meth:`_dead_under`). Both judgements are sound:
        each only finds states from which every word is blocked."""
        if state.mode == _BOUNDARY or self.vocabulary is None:
            return False
        _, bits, ok = self._end(state.node, state.phrase)
        if ok and not bits & ban:
            return False
        if not self._need_on(state.node, state.mode) & ~ban:
            return True
        need = self._need_under(state)
        return need is not None and not need & ~ban

    def _need_under(self, state: WordState) -> int | None:
        """The ``need`` of going on with the word of an in-word state as its phrase state judges
        it, where that differs from the root's (None elsewhere)."""
        if not state.phrase or state.node < 0:
            return None
        return self._dead_under(state.phrase).get((state.node, state.mode == _APOSTROPHE))

    def _dead_under(self, q: int) -> dict[tuple[int, bool], int]:
        """{(trie node, pending apostrophe): need} for the in-word states whose way on phrase
        state ``q`` judges otherwise than the root: those where every word below that is free at
        the root completes a phrase in ``q`` (is one of ``q``'s moves). Their need is then the
        tags of the others (as at the root) and of those (as completed in ``q``): sound, as every
        word below has a tag in it. A word's ancestors are walked up while that holds (going up
        only adds words). Phrase states with more than ``_MAX_MOVES`` moves are left to the
        root's judgement (a bound on the work per state)."""
        dead = self._dead[q]
        if dead is not None:
            return dead
        dead = {}
        moves, out, root, node_of = self._moves_of(q), self._out, self._root_next, self._node_of_wid
        moved = sorted((node_of[w], bits) for w, bits in moves.items()
                       if not out[root[w]] and node_of[w]) if len(moves) <= _MAX_MOVES else []
        nodes = [n for n, _ in moved]
        child, parent, end = self._child, self._parent, self._subtree_end

        def need_in(lo: int, hi: int, free: int, tags: int) -> int | None:
            i, j = bisect.bisect_left(nodes, lo), bisect.bisect_left(nodes, hi)
            if not free or j - i < free:  # (the moved free words below are some of the free ones)
                return None
            for _, bits in moved[i:j]:
                tags |= bits
            return tags

        seen: set[int] = set()
        for n_w in nodes:
            prev, a = n_w, parent[n_w]
            while a > 0:
                if child[a].get("'") == prev:  # (the state right after the apostrophe)
                    need = need_in(prev, end[prev], self._free_at[prev], self._tags_at[prev])
                    if need is not None:
                        dead[a, True] = need
                if a in seen:
                    break
                seen.add(a)
                need = need_in(a + 1, end[a], self._free_below[a], self._tags_below[a])
                if need is None:
                    break
                dead[a, False] = need
                prev, a = a, parent[a]
        self._dead[q] = dead
        return dead

    def _end_bits(self, node: int, q: int) -> int:
        """The tags that block ending the word at trie ``node`` in phrase state ``q``: those of
        the phrases it completes, and the vocabulary's if it is no word."""
        _, bits, ok = self._end(node, q)
        return bits if ok else bits | self._vocab_bit

    def _read(self, state: WordState, text: str, final: bool) -> tuple[WordState, bool, int]:
        """(state after ``text``, whether the vocabulary allows it, tag bits of the phrases it
        completes): the reference semantics. ``text`` is lower case, slots as ``_SLOT_CHAR``;
        ``final``: the line ends after it. A word that leaves the vocabulary reads on as -1. The
        text rules' part of the state is not read here (:meth:`_text_chars` reads it): the state
        returned has the default one."""
        node, mode, q = state[:3]
        ok, bits = True, 0
        vocab = self.vocabulary is not None
        child = self._child
        for c in text:
            if _is_letter(c):
                if mode == _BOUNDARY:
                    node, mode = child[0].get(c, _DEAD), _LETTERS
                elif mode == _APOSTROPHE:
                    n = child[node].get("'", _DEAD) if node >= 0 else _DEAD
                    node, mode = (child[n].get(c, _DEAD) if n >= 0 else _DEAD), _AFTER
                elif node >= 0:
                    node = child[node].get(c, _DEAD)
                if node < 0 and vocab:
                    ok = False
            elif c == "'" and mode == _LETTERS:
                mode = _APOSTROPHE
                if vocab and not (node >= 0 and (self._is_word[node] or "'" in child[node])):
                    ok = False
            else:
                if mode != _BOUNDARY:
                    q, b, good = self._end(node, q)
                    bits |= b
                    ok &= good
                    node, mode = 0, _BOUNDARY
                if c == _SLOT_CHAR:
                    q = 0
        if final and mode != _BOUNDARY:
            q, b, good = self._end(node, q)
            bits |= b
            ok &= good
            node, mode = 0, _BOUNDARY
        return self._state(node, mode, q), ok, bits

    def _landing(self, out: list[np.ndarray], word: int, last: bool, spaced: bool) -> None:
        """Add to ``out`` the tokens that, after spaces only, start ``word`` again where it would
        end as a repeat (the line's last token) or have no way on (:meth:`_text_chars`);
        ``spaced``: only those that start with a space (read inside a word, which they end)."""
        for pending in (False, True):
            toks = self._lands.get((word, pending, spaced))
            if toks is not None and (last or self._leaf[pending][word]):
                out.append(toks)

    def _text_read(self, state: WordState, token_id: int, final: bool) -> tuple[int, int] | None:
        """:meth:`_text_chars` of one token (its text with case kept, a slot token whole)."""
        return self._text_chars(state, [token_id] if self._is_slot[token_id] else self._raw[token_id], final)

    def _text_chars(self, state: WordState, chars: Iterable[str | int], final: bool) -> tuple[int, int] | None:
        """The text rules' reference reader: (shape, echo) after ``chars`` (characters, case
        kept, and slot tokens by id), or None where they write a glitch (:data:`TEXT_RULES`):
        the shape automaton finds no move (or the line ends in ".."), a word ends as the echo
        (the last completed word, only spaces since), a slot follows itself, or, not at the end
        of the line, the word being spelled is the echo with no way on in the trie (it can
        neither end nor go on: a dead end)."""
        shape, echo = state.shape, state.echo
        ws = WordState(*state[:3])
        for c in chars:
            code = -1
            if isinstance(c, int):
                code, c = self._slot_base + c, _SLOT_CHAR
            shape = _SHAPE_NEXT[shape][_char_class(c)]
            if shape < 0:
                return None
            new = self._read(ws, c.lower(), False)[0]
            if _is_letter(c.lower()) or (new.mode != _BOUNDARY and ws.mode != _BOUNDARY):
                pass  # the word being spelled goes on (or begins)
            else:
                prev = echo
                if ws.mode != _BOUNDARY:  # c ends the word being spelled
                    ended = ws.node if ws.node > 0 else -1
                    if ended >= 0 and ended == echo:
                        return None
                    prev = ended
                if code >= 0 and code == prev:
                    return None
                echo = code if code >= 0 else prev if c == " " or "\t" <= c <= "\r" else -1
            ws = new
        if final:
            if shape == _DOT2 or (ws.mode != _BOUNDARY and ws.node > 0 and ws.node == echo):
                return None
        elif ws.mode != _BOUNDARY and ws.node > 0 and ws.node == echo and self._leaf[ws.mode == _APOSTROPHE][echo]:
            return None
        return shape, echo

    def _state(self, node: int, mode: int, q: int, shape: int = 0, echo: int = -1) -> WordState:
        """``WordState(node, mode, q)`` with the phrase state inside a word replaced by the first
        state of its failure chain (``q`` itself, else 0) that goes on with a word the word being
        spelled may become: the automaton moves from both alike on every such word, so the two
        states block alike and step alike, and the memos keyed by the state are shared."""
        if q and mode != _BOUNDARY:
            end = self._subtree_end[node] if node >= 0 else 0
            fail, nodes = self._fail, self._goto_nodes
            while q:
                arr = nodes[q]
                if arr is None:
                    arr = nodes[q] = sorted(self._node_of_wid[w] for w in self._goto[q] if self._node_of_wid[w])
                i = bisect.bisect_left(arr, node)
                if i < len(arr) and arr[i] < end:
                    break
                q = fail[q]
        return WordState(node, mode, q, shape, echo)

    # ------------------------------------------------------------ requests

    def banned_bits(self, archetype: str | None = None, persona: Iterable[str] = (),
                    context: Mapping[str, str] | Iterable[tuple[str, str]] | None = None, *,
                    static: bool = True) -> int:
        """The tags a request bans, for :meth:`blocked`: a bit set (bit ``i``: ``tags[i]``).

        Always the vocabulary; the static banned words unless ``static=False``; and the
        signatures of every tag the request did not ask for: every archetype but ``archetype``,
        every persona trait not in ``persona``, and for each context slot every value but the
        requested one (every value of a slot the request leaves out). Keys of ``context`` that
        are no closed context slot (free-text slots like ``player``) change nothing.
        """
        items = context.items() if isinstance(context, Mapping) else (context or ())
        asked = {f"archetype:{archetype}", *(f"persona:{t}" for t in persona),
                 *(f"context:{k}={v}" for k, v in items)}
        bits = self._all_signatures | self._vocab_bit
        if static:
            bits |= self._tag_bit[_BANNED_TAG]
        for tag in asked:
            bits &= ~self._tag_bit.get(tag, 0)
        return bits

    def says_banned(self, text: str, banned: int) -> bool:
        """Whether a whole line says a phrase of a tag in ``banned`` (:meth:`banned_bits`): a
        banned word, another tag's signature. Words outside the vocabulary and the text rules
        are not judged: this is the check of a writer's own line, which the model's checks would
        refuse for words the book never says."""
        _, _, bits = self._read(WordState(), _SLOT_MARKER.sub(_SLOT_CHAR, text).lower(), True)
        return bool(bits & banned & ~self._vocab_bit)

    def _bits_int(self, banned: int | None) -> int:
        return self._default if banned is None else banned

    def advance(self, state: WordState, text: str, *, final: bool = False,
                banned: int | None = None) -> WordState | None:
        """The state after ``text`` is appended, or None if a token ending there would be blocked
        (a word leaves the vocabulary, a phrase of a ``banned`` tag completes, or the dead-end
        rule; default ``banned``: the static banned words), or the text rules
        (:data:`TEXT_RULES`: ``text`` would write a glitch, as :meth:`_text_chars` reads it).
        ``final``: the text ends the line. ``{slot}`` markers read as slots. From
        ``WordState()`` the text starts the line (it must start upper-case); from
        :data:`MID_LINE` it goes on after a word."""
        new, ok, bits = self._read(state, _SLOT_MARKER.sub(_SLOT_CHAR, text).lower(), final)
        ban = self._bits_int(banned)
        if not ok or bits & ban or self._stuck(new, ban):
            return None
        chars: list[str | int] = []
        at = 0
        for m in _SLOT_MARKER.finditer(text):
            slot = self._slot_ids.get(m.group(1))
            chars += [*text[at:m.start()], _SLOT_CHAR if slot is None else slot]
            at = m.end()
        chars += text[at:]
        moved = self._text_chars(state, chars, final)
        if moved is None:
            return None if self.text_rules else new
        return new._replace(shape=moved[0], echo=moved[1])

    def step(self, state: WordState, token_id: int) -> WordState:
        """The state after ``token_id`` was emitted (request-independent; :meth:`_step_words`,
        then with a bigram table its ``prev``: :meth:`runtime.client.bigrams.BigramMask.after`),
        kept per (state, token) in a bounded memo: a step another line took is one dict lookup."""
        key = (state, token_id)
        new = self._steps.peek(key)
        if new is None:
            new = self._steps.put(key, self._step_read(state, token_id))
        return new  # type: ignore[no-any-return]

    def _step_read(self, state: WordState, token_id: int) -> WordState:
        new = self._step_words(state, token_id)
        return new if self._bigrams is None else self._bigrams.after(state, token_id, new)

    def _step_words(self, state: WordState, token_id: int) -> WordState:
        """The state after ``token_id`` was emitted (request-independent): :meth:`_read`, with
        shortcuts for a token read whole from a boundary (at one, or ending the word spelled)
        and for one that only adds letters to the word (its lead walks the trie); then the text
        rules' part (the shape from its table, the echo as :meth:`_text_read` moves it)."""
        node, mode, q, shape, echo = state[:5]
        shape = self._shape_next[shape][token_id]
        if shape < 0:  # (a token the masks block: read on from mid-line)
            shape = _OTHER
        if mode != _BOUNDARY:
            lead_step = self._lead_step[mode][token_id]
            if lead_step is not None:
                lead, mode = lead_step
                child = self._child
                for c in lead:
                    if node < 0:
                        break
                    node = child[node].get(c, _DEAD)
                if q:
                    return self._state(node, mode, q, shape, echo)
                return WordState(node, mode, 0, shape, echo)
        whole = self._whole_state[token_id]
        if whole is not None and (mode == _BOUNDARY or self._ends_list[mode][token_id]):
            if mode != _BOUNDARY:
                q = self._next_phrase(q, self._wid[node] if node >= 0 else 0)
                echo = node if node > 0 else -1
            kind = self._echo_kind[token_id]
            if kind != _ECHO_KEEP:
                echo = self._slot_base + token_id if kind == _ECHO_SLOT else -1
            return self._state(whole[0], whole[1], 0 if self._is_slot[token_id] else q, shape, echo)
        new = self._read(state, self._texts[token_id], False)[0]
        moved = self._text_read(state, token_id, False)
        return new._replace(shape=shape, echo=-1 if moved is None else moved[1])

    def blocked(self, state: WordState, *, last: bool = False, banned: int | None = None) -> np.ndarray:
        """Bool mask [vocab]: True where the token must not be sampled in ``state``.

        ``last``: the next token is the last of the budget (its end is the end of the line).
        ``banned``: the request's :meth:`banned_bits` (default: the vocabulary and the static
        banned words). The returned array is read-only (and often shared).
        """
        base, out = self._pieces(state, last, self._default if banned is None else banned)
        if not out:
            return base
        mask = base.copy()
        for toks in out:
            mask[toks] = True
        mask.flags.writeable = False
        return mask

    def prepare(self, state: WordState, *, last: bool = False, banned: int | None = None) -> MaskParts:
        """The part of :meth:`mask_logits` in ``state`` that needs no logits (:class:`MaskParts`:
        every first meeting of the state's masks and voice tables is made here), for
        ``mask_logits`` / :meth:`masked_row` to apply later (``parts=``) with the same result
        as without them. ``last`` and ``banned`` as for :meth:`blocked`."""
        ban = self._default if banned is None else banned
        base, out = self._pieces(state, last, ban)
        ids = None if not out else out[0] if len(out) == 1 else np.concatenate(out)
        return MaskParts(state, last, ban, base, ids, self._bonus_row(state, ban) if self.voice else None)

    def mask_logits(self, row: np.ndarray, state: WordState, *, last: bool = False,
                    banned: int | None = None, _top: np.floating | None = None,
                    parts: MaskParts | None = None) -> None:
        """Apply the constraints to a logits row, in place: ``row[blocked(state, last=last,
        banned=banned)]`` to -inf (the same result without building the mask: the state's kept
        mask, then the request's tokens), then, when the constraints carry one (``voice``), the
        voice bonus of the tags the request asked for (:meth:`voice_bonus`) on the tokens within
        ``voice["within"]`` logits of the row's largest (the model's most likely token).
        (``_top``: that largest, when the caller has it: :meth:`masked_row`.) ``parts``: what
        :meth:`prepare` made for this (``state``, ``last``, ``banned``), else it is made here;
        parts made for anything else raise ValueError."""
        ban = self._default if banned is None else banned
        if parts is None:
            parts = self.prepare(state, last=last, banned=ban)
        elif parts.state != state or parts.last != last or parts.ban != ban:
            raise ValueError(f"mask parts made for {parts.state}, last={parts.last}, ban={parts.ban:#x} "
                             f"applied to {state}, last={last}, ban={ban:#x}")
        base, ids, bonus = parts.base, parts.ids, parts.bonus
        near = None
        if bonus is not None:
            within = self.voice.get("within")
            if within is not None:
                top = (row.max() if _top is None else _top) - within
                if top == top:  # (no NaN in the row: else every token gets its bonus, as in _bonus)
                    near = row >= top
        np.putmask(row, base, _NEG_INF)
        if ids is not None:
            row[ids] = _NEG_INF
        if bonus is not None:
            if near is None:
                row += bonus
            else:  # row += _bonus(raw, ...): the tokens far below the top get nothing
                np.add(row, bonus, out=row, where=near)

    def masked_row(self, raw: np.ndarray, state: WordState, *, last: bool = False, banned: int | None = None,
                   block: np.ndarray | Sequence[int] | None = None,
                   parts: MaskParts | None = None) -> tuple[np.ndarray, bool]:
        """What every engine samples a token from (the client's :class:`runtime.client.generator.LineGenerator`,
        the server's batched engines, :func:`runtime.serving.batch_generate.generate_ids_batch`):
        ``(row, veto)``, where ``row`` is a float32 copy of the logits row ``raw`` with
        :meth:`mask_logits` applied (the masks and the voice bonus) and -inf at ``block`` (the
        request's own blocked ids, e.g. slot tokens it may not use), and ``veto`` is
        :func:`vetoed` (``raw``, ``row``, ``state``): the sample should be abandoned and drawn
        again. ``eos`` before ``min_tokens`` is the caller's (a line asked to go on is not
        derailing, so it is held back after the veto is judged). ``parts``: :meth:`prepare`'s
        for this (``state``, ``last``, ``banned``), made ahead (as :meth:`mask_logits`)."""
        row = raw.astype(np.float32, copy=True)
        top = int(np.argmax(raw))  # (rounding to float32 keeps the order: row's largest is row[top])
        self.mask_logits(row, state, last=last, banned=banned, _top=row[top], parts=parts)
        if block is not None and len(block):
            row[block] = _NEG_INF
        return row, _vetoed_at(raw, row, top, VETO, state)

    # ------------------------------------------------------------ voice bonus

    def voice_bonus(self, state: WordState, *, banned: int | None = None) -> np.ndarray:
        """The logit bonus [vocab] (float32) :meth:`mask_logits` adds in ``state`` for a request
        banning ``banned`` (zeros without ``voice``).

        It makes the tags a request asked for audible: a line is worth ``voice[kind]`` more for
        every word it completes that is a signature phrase of a requested tag of that kind
        (``archetype``, ``persona``, ``context``) — a one-word phrase, or the last word of a
        longer one whose first words were said — and, with ``voice["unasked"]``, that much less
        for every one-word signature it heads for of a tag the request did not ask for (which
        the masks would then block: steering away from it early avoids a veto and a redraw).
        The bonus is spread over the word's tokens by a potential over the vocabulary's trie:
        Φ(node) = Σ over tags of size × (share of the words below ``node`` that are that tag's
        one-word signatures), so a token moving the word from node a to node b gets Φ(b) − Φ(a),
        and the token ending it the word's own worth minus Φ of its node; summed over a line,
        the bonuses are exactly the worth of the words it completes (plus Φ of its unfinished
        last word). Tokens the masks block stay blocked."""
        row = np.zeros(self.vocab_size, dtype=np.float32)
        if self.voice:
            self._add_voice(row, state, self._default if banned is None else banned)
        return row

    def _bonus(self, raw: np.ndarray, state: WordState, ban: int) -> np.ndarray:
        """:meth:`voice_bonus`, kept to the tokens the model finds plausible: those whose logit
        in ``raw`` (the unmasked row) is within ``voice["within"]`` of its largest (all of them
        without ``within``), so the bonus chooses among what the model might say next and never
        drags in a word it would not say there ("Don't night dark")."""
        bonus = np.zeros(self.vocab_size, dtype=np.float32)
        self._add_voice(bonus, state, ban)
        within = self.voice.get("within")
        if within is not None:
            bonus[raw < raw.max() - within] = 0.0
        return bonus

    def _voice_tables(self) -> tuple[np.ndarray, np.ndarray, list[tuple[int, str]]]:
        """Per signature tag with one-word phrases: the share of the words below every trie node
        that are its one-word phrases (``F`` [tags, nodes], float32), their sum over all tags,
        and (tag bit, kind) per row of ``F``."""
        if self._voice_table is None:
            n = len(self._child)
            end = np.asarray(self._subtree_end, dtype=np.int64)
            start = np.arange(n, dtype=np.int64)
            words = np.concatenate([[0], np.cumsum(self._is_word, dtype=np.int64)])
            below = np.maximum(words[end] - words[start], 1)
            by_tag: dict[int, list[int]] = {}
            for wid, q in self._goto[0].items():
                node, bits = self._node_of_wid[wid], self._out[q]
                if node and bits:
                    for i in range(3, len(self.tags)):
                        if bits >> i & 1:
                            by_tag.setdefault(i, []).append(node)
            rows, kinds = [], []
            for i, nodes in sorted(by_tag.items()):
                at = np.zeros(n + 1, dtype=np.int64)
                np.add.at(at, np.asarray(nodes) + 1, 1)
                cum = np.cumsum(at)
                rows.append(((cum[end] - cum[start]) / below).astype(np.float32))
                kinds.append((1 << i, self.tags[i].split(":", 1)[0]))
            table = np.stack(rows) if rows else np.zeros((0, n), dtype=np.float32)
            # in a word, only tokens that start with neither a letter nor an apostrophe end it first
            self._voice_ends = np.asarray([not (t[:1] == "'" or _is_letter(t[:1])) for t in self._texts], dtype=bool)
            tail = self._tail[0]
            self._voice_tail, self._voice_open = np.maximum(tail, 0), (tail >= 0) & ~self._always
            self._voice_table = (table, table.sum(0), kinds)
        return self._voice_table

    def _voice_for(self, ban: int) -> _Voice:
        v = self._voices.peek(ban)
        if v is None:
            v = self._voices.put(ban, self._make_voice(ban))
        return v  # type: ignore[no-any-return]

    def _make_voice(self, ban: int) -> _Voice:
        table, total, kinds = self._voice_tables()
        unasked = self.voice.get("unasked", 0.0)
        size = self._voice_sizes(ban)
        phi = -unasked * total if unasked else np.zeros(len(self._child), dtype=np.float32)
        for r, (bit, kind) in enumerate(kinds):
            if not bit & ban:
                phi += (size.get(kind, 0.0) + unasked) * table[r]  # (phi is this request's own array)
        # (the tokens that start a word from a boundary and are not always blocked: their tail's phi)
        w0 = np.where(self._voice_open, phi[self._voice_tail] - phi[0], 0.0).astype(np.float32, copy=False)
        idx = np.flatnonzero(w0)
        ends = self._voice_ends[idx]
        val = w0[idx]
        end_idx, end_val = idx[ends], val[ends]
        worth = [(bit, size.get(kind, 0.0)) for bit, kind, _ in self._tag_kinds if not bit & ban]
        live = phi != 0.0
        at_end = np.zeros(self.vocab_size, dtype=np.float32)
        at_end[end_idx] = end_val
        w0.flags.writeable = at_end.flags.writeable = False
        return _Voice(phi, idx, val, end_idx, end_val, [(b, w) for b, w in worth if w], live, w0, at_end)

    def _voice_sizes(self, ban: int) -> dict[str, float]:
        """The worth of a signature word per kind for a request banning ``ban``: ``voice[kind]``,
        plus ln(n / k) where the request asks for k of the n tags of that kind it could ask
        for together (persona traits: the most a prompt holds, 2; context: one value per slot),
        so that fewer requested tags, with fewer words to voice them, are voiced about as often."""
        out = dict(self.voice)
        asked: dict[str, set[str]] = {"persona": set(), "context": set()}
        for bit, kind, name in self._tag_kinds:
            if kind in asked and not bit & ban:
                asked[kind].add(name)
        for kind, most in (("persona", 2), ("context", self._context_slots)):
            k = len(asked[kind])
            if kind in out and 0 < k < most:
                out[kind] += float(np.log(most / k))
        return out

    def _add_voice(self, row: np.ndarray, state: WordState, ban: int) -> None:
        """Add the voice bonus (:meth:`voice_bonus`) of ``state`` to ``row`` in place."""
        bonus = self._bonus_row(state, ban)
        if bonus is not None:
            row += bonus

    def _bonus_row(self, state: WordState, ban: int) -> np.ndarray | None:
        """The voice bonus [vocab] of ``state`` (:meth:`voice_bonus`), None where it is 0
        everywhere; read-only where it is the request's own (at a word boundary: the bonus of
        the words a token starts; inside a word with no potential under way: that of the
        tokens ending it), else a new array: the end of the word's worth on every token (what
        ending the word is worth, before the next one starts), the tokens ending it, and the
        potential difference of the tokens going on with it."""
        v = self._voice_for(ban)
        node, mode, q = state[0], state[1], state[2]
        if mode == _BOUNDARY:
            return v.at_boundary if len(v.idx) else None
        if node < 0:
            return None
        worth = 0.0
        if v.worth:
            bits = self._end(node, q)[1]
            if bits:
                worth = float(sum(w for b, w in v.worth if bits & b))
        here = float(v.phi[node])
        step = worth - here
        if not (step or v.live[node]):
            return v.at_end if len(v.end_idx) else None
        bonus = v.at_end + step  # (at_end is 0 but at the tokens ending the word first)
        toks, reached, _ = self._lead_arrays(node, mode)
        if len(toks):
            bonus[toks] += v.phi[reached] - (here + step)
        return bonus

    def _pieces(self, state: WordState, last: bool, ban: int) -> tuple[np.ndarray, list[np.ndarray]]:
        """A state's mask for a request as (the mask its plan keeps for every request, the token
        arrays the request blocks besides); see :meth:`blocked`."""
        key = (state[0], state[1], state[2], last)
        plan: _Plan | None = self._plans.peek(key)
        if plan is None:
            plan = self._plans.put(key, self._plan(state, last))
        per_ban = self._per_ban.peek(ban)
        if per_ban is None:
            per_ban = self._per_ban.put(ban, [None] * 16)
        whole = per_ban[plan.base]
        if whole is None:
            whole = per_ban[plan.base] = self._ban_part(plan.base, ban)
        free = ~ban
        out = [toks for hit, need, toks in plan.groups if hit & ban and not need & free]
        if whole:
            out += whole
        if self.text_rules:
            shaped = self._shape_block[last][state[3]]
            if len(shaped):
                out.append(shaped)
            if state[4] >= 0 or state[1] != _BOUNDARY or self._exact_any:
                key = (state[0], state[1], state[4], last, state[3] if self._exact_any else -1)
                rule = self._rules.peek(key)
                if rule is None:
                    rule = self._rules.put(key, self._shared_rule(state, last))
                if len(rule):
                    out.append(rule)
        if self._bigrams is not None:
            pairs = self._bigrams.blocked(state, last)
            if len(pairs):
                out.append(pairs)
        return plan.mask, out

    def _shared_rule(self, state: WordState, last: bool) -> np.ndarray:
        """:meth:`_rule_part`, shared inside a word by every echo out of its reach: there the
        doubled-word rule depends on the echo only where it is the word being spelled or a word
        below it (which a lead may reach), so the others are kept as no echo (-1)."""
        node, echo = state[0], state[4]
        if (state[1] == _BOUNDARY or node <= 0 or echo < 0 or self._exact_any or echo == node
                or node < echo < self._subtree_end[node]):
            return self._rule_part(state, last)
        key = (node, state[1], -1, last, -1)
        rule = self._rules.peek(key)
        if rule is None:
            rule = self._rules.put(key, self._rule_part(state._replace(echo=-1), last))
        return rule  # type: ignore[no-any-return]

    def _rule_part(self, state: WordState, last: bool) -> np.ndarray:
        """The tokens the doubled-word rule blocks in ``state`` (:meth:`_echo_block`; the
        phrase state plays no part, nor does the shape but for tokens read out one by one): the
        text rules' part besides the shape's, which is a table (``_shape_block``)."""
        parts = self._echo_block(state, last)
        out = _joined(parts)
        out.flags.writeable = False
        return out

    def _echo_block(self, state: WordState, last: bool) -> list[np.ndarray]:
        """The tokens that would write a doubled word or slot (:meth:`_text_chars`' rules): in a
        word that is the echo, every token ending it; a word or slot right after itself at the
        end of the line, or where the repeated word is a trie leaf (a dead end)."""
        node, mode, _q, _shape, echo = state[:5]
        out: list[np.ndarray] = []
        if mode == _BOUNDARY:
            if echo >= self._slot_base:
                out.append(np.asarray([echo - self._slot_base], dtype=np.int64))
            elif echo > 0:
                self._landing(out, echo, last, False)
        else:
            if node > 0 and node == echo:
                out.append(self._ends[mode])
            elif node > 0:
                self._landing(out, node, last, True)
            # (a lead only reaches nodes below ``node``: the echo must be one to be reached)
            if 0 < echo < self._slot_base and node < echo < self._subtree_end[node]:
                toks, reached, apos = self._lead_arrays(node, mode)
                at = reached == echo
                if not last:
                    leaf_l, leaf_a = self._leaf[0][echo], self._leaf[1][echo]
                    at &= (apos & leaf_a) | (~apos & leaf_l) if leaf_l != leaf_a else leaf_l
                hit = toks[at]
                if len(hit):
                    out.append(hit)
        exact = self._exact[mode]
        if len(exact):
            hit = np.asarray([i for i in exact.tolist() if self._text_read(state, i, last) is None], dtype=np.int64)
            if len(hit):
                out.append(hit)
        return out

    def _plan(self, state: WordState, last: bool) -> _Plan:
        """The request-independent part of a state's mask: its word part, and the groups that
        the phrase state under way adds (the word being spelled completing phrases, the words
        that state sends elsewhere than the automaton's root does, the dead ends it decides)."""
        node, mode, q = state[:3]
        key = (node, mode, last)
        wp: _WordPart = self._parts.get(key, lambda: self._word_part(node, mode, last))
        groups = list(wp.leads.groups)
        q1 = q
        if wp.end_wid >= 0:
            q1 = self._next_phrase(q, wp.end_wid)
            if wp.ends is not None and self._out[q1]:
                groups.append((self._out[q1], 0, wp.ends))
        if q1 and wp.whole is not None:
            groups += self._whole_elsewhere(q1, wp.base, wp.whole)
        if q and wp.leads.by_word:
            groups += self._elsewhere(q, wp.leads.by_word)
        if q and wp.leads.leaving[0]:
            groups += self._dead_groups(q, wp.leads.at)
        if len(wp.exact):
            groups += self._exact_read(state, last, wp.exact)
        return _Plan(wp.base, wp.mask, tuple(groups))

    def _elsewhere(self, q: int, by_word: Mapping[int, list[tuple[int, _Ids]]]) -> list[_Group]:
        """The groups of the tokens of ``by_word`` (see :class:`_Tagged`) whose words phrase state
        ``q`` sends elsewhere than the root does: to a state where other phrases end. A few words
        follow the failure chain one by one; many are matched against ``q``'s moves."""
        out, root = self._out, self._root_next
        if len(by_word) <= 8:
            groups: list[_Group] = []
            for wid, entries in by_word.items():
                bits = out[self._next_phrase(q, wid)]
                if bits != out[root[wid]]:
                    groups += [(bits, need, _ids(toks)) for need, toks in entries]
            return groups
        moves = self._moves_of(q)
        if len(moves) <= len(by_word):
            return [(bits, need, _ids(toks)) for wid, bits in moves.items() for need, toks in by_word.get(wid, ())]
        return [(moves[wid], need, _ids(toks)) for wid, entries in by_word.items() if wid in moves
                for need, toks in entries]

    def _whole_elsewhere(self, q: int, base_id: int, whole: _Tagged) -> list[_Group]:
        """:meth:`_elsewhere` for the whole-read tokens of template ``base_id`` (``whole``),
        kept per phrase state (at most one list per template and state of the automaton)."""
        per_q = self._moved[q]
        if per_q is None:
            per_q = self._moved[q] = {}
        groups = per_q.get(base_id)
        if groups is None:
            groups = per_q[base_id] = self._elsewhere(q, whole.by_word) + self._dead_groups(q, whole.at)
        return groups

    def _dead_groups(self, q: int, at: Mapping[tuple[int, bool], _Ids]) -> list[_Group]:
        """The groups of the tokens of ``at`` (see :class:`_Tagged`) that leave a state whose way
        on phrase state ``q`` judges otherwise than the root (:meth:`_dead_under`)."""
        dead = self._dead_under(q) if at else {}
        groups: list[_Group] = []
        for key in dead if len(dead) <= len(at) else at:
            toks = at.get(key)
            need = dead.get(key)
            if toks is not None and need is not None:
                hit = self._end_bits(key[0], q)
                if hit:
                    groups.append((hit, need, _ids(toks)))
        return groups

    def _moves_of(self, q: int) -> dict[int, int]:
        """:meth:`_make_moves`, kept per phrase state."""
        moves = self._moves[q]
        if moves is None:
            moves = self._moves[q] = self._make_moves(q)
        return moves

    def _make_moves(self, q: int) -> dict[int, int]:
        """{word: tag bits of the phrases it completes} for the words phrase state ``q`` (or its
        failure chain: the first state of the chain that knows a word decides) sends to a state
        whose phrases differ from those of the state the root sends it to."""
        seen: dict[int, int] = {}
        while q:
            for wid, nxt in self._goto[q].items():
                seen.setdefault(wid, nxt)
            q = self._fail[q]
        out, root = self._out, self._root_next
        return {wid: out[nxt] for wid, nxt in seen.items() if out[nxt] != out[root[wid]]}

    def _ban_part(self, base_id: int, ban: int) -> tuple[np.ndarray, ...]:
        """The tokens that a request banning ``ban`` blocks besides template ``base_id`` (id
        ``4 * mode + 2 * last + the word may end``): whole-read tokens completing phrases."""
        if not base_id & 1:
            return ()
        mode, last = base_id >> 2, bool(base_id & 2)
        idx = self._whole(None if mode == _BOUNDARY else mode, last).select(ban)
        return (idx,) if len(idx) else ()

    def blocked_exact(self, state: WordState, *, last: bool = False, banned: int | None = None) -> np.ndarray:
        """:meth:`blocked` computed token by token with the reference reader (slow)."""
        ban = self._bits_int(banned)
        mask = self._always.copy()
        for i, text in enumerate(self._texts):
            if not mask[i]:
                end = last or i == self.eos_id
                new, ok, bits = self._read(state, text, end)
                mask[i] = (not ok or bool(bits & ban) or (not end and self._stuck(new, ban))
                           or (self.text_rules and self._text_read(state, i, end) is None))
        if self._bigrams is not None:
            mask |= self._bigrams.blocked_exact(state, last)
        return mask

    # ------------------------------------------------------------ fast masks

    def _exact_read(self, state: WordState, last: bool, exact: np.ndarray) -> list[_Group]:
        """The groups of the tokens read out one by one (none with the shipped tokenizer)."""
        groups: list[_Group] = []
        for text, toks in self._exact_groups(exact):
            new, ok, bits = self._read(state, text, last)
            bits |= 0 if ok else self._vocab_bit
            if bits:
                groups.append((bits, 0, toks))
            if not last and new.mode != _BOUNDARY and self.vocabulary is not None:
                end_bits = self._end_bits(new.node, new.phrase)
                if end_bits:
                    groups.append((end_bits, self._need_on(new.node, new.mode), toks))
                    need = self._need_under(new)
                    if need is not None:
                        groups.append((end_bits, need, toks))
        return groups

    def _tagged(self, toks: Iterable[int], wids: Iterable[int], needs: Iterable[int],
                stuck: Iterable[tuple[int, int]] = ()) -> _Tagged:
        """:class:`_Tagged` of tokens that end (or may end) a phrase word ``wids`` with ``needs``
        (0: they end it for sure), and of ``stuck`` (token, need) that cannot end a word."""
        groups: dict[tuple[int, int], list[int]] = {}
        by_word: dict[int, dict[int, list[int]]] = {}
        out, root = self._out, self._root_next
        for t, w, n in zip(toks, wids, needs):
            hit = out[root[w]]
            if hit:
                groups.setdefault((hit, n), []).append(t)
            by_word.setdefault(w, {}).setdefault(n, []).append(t)
        for t, n in stuck:
            groups.setdefault((self._vocab_bit, n), []).append(t)
        return _Tagged(tuple((h, n, np.asarray(ts, dtype=np.int64)) for (h, n), ts in groups.items()),
                       {w: [(n, np.asarray(ts, dtype=np.int64)) for n, ts in d.items()] for w, d in by_word.items()})

    def _ways(self, toks: Sequence[int], nodes: Sequence[int], needs: Sequence[int]) -> _Tagged:
        """The dead-end rule for tokens that leave a word being spelled at trie ``nodes`` with
        ``needs`` (not at the end of the line): those with a free way on are fine; the others are
        stuck if their word cannot end there (no word), else the phrases decide whether it may
        (a word no phrase holds always may)."""
        if self.vocabulary is None:
            return _Tagged((), {})
        free = self._free_bit
        stuck, ways = [], []
        for t, n, nd in zip(toks, nodes, needs):
            if nd & free:
                continue
            if not self._is_word[n]:
                stuck.append((t, nd))
            elif self._wid[n]:
                ways.append((t, self._wid[n], nd))
        return self._tagged([w[0] for w in ways], [w[1] for w in ways], [w[2] for w in ways], stuck)

    def _word_part(self, node: int, mode: int, last: bool) -> _WordPart:
        """What a state's mask is without the phrases under way: which tokens the vocabulary
        blocks, and which tokens end or may end which word (for the phrase part).

        At a boundary every token is read whole, as tabulated. In a word, tokens that end it at
        their first character share its fate (the rest of them is tabulated too); tokens that
        only add letters come from the walk table of the state (those whose lead stays inside
        the trie), so no state looks at every token."""
        vocab = self.vocabulary is not None
        none = _Tagged((), {})
        if mode == _BOUNDARY:
            return _WordPart(2 * last + 1, None, self._templates[2 * last + 1], -1, None, self._whole(None, last),
                             self._exact[_BOUNDARY], none)
        end_ok = not vocab or (node >= 0 and self._is_word[node])
        ok_ends = self._in_word[mode, last][2]
        live_toks = None
        leads = none
        if node >= 0 and (vocab or last):
            toks, n2, apos = self._lead_arrays(node, mode)
            if len(toks):
                if last:
                    live = self._is_word_np[n2]
                    wids = self._wid_np[n2]
                    sel = wids > 0
                    leads = self._tagged(toks[sel].tolist(), wids[sel].tolist(), [0] * int(sel.sum()))
                else:
                    live = ~apos | self._apos_live_np[n2]
                    nodes = n2[live].tolist()
                    needs = [self._need_apos[n] if a else self._need_below[n]
                             for n, a in zip(nodes, apos[live].tolist())]
                    leads = self._ways(toks[live].tolist(), nodes, needs)
                    leads.leaving = (toks[live].tolist(), nodes, apos[live].tolist())
                if vocab and live.any():
                    live_toks = toks[live]
        base = 4 * mode + 2 * last + end_ok
        mask = self._templates[base]
        if live_toks is not None:
            mask = mask.copy()
            mask[live_toks] = False
            mask.flags.writeable = False
        return _WordPart(base, live_toks, mask, self._wid[node] if node >= 0 else 0,
                         ok_ends if end_ok else None, self._whole(mode, last) if end_ok else None,
                         self._exact[mode], leads)

    def _exact_groups(self, exact: np.ndarray) -> list[tuple[str, np.ndarray]]:
        """Tokens read out one by one, grouped by their text (the slot tokens read alike)."""
        key = ("exact", exact.tobytes())
        if key not in self._fixed:
            self._fixed[key] = [
            (t, np.asarray([i for i in exact if self._texts[i] == t]))
            for t in dict.fromkeys(self._texts[i] for i in exact)]
        return self._fixed[key]  # type: ignore[no-any-return]

    def _lead_arrays(self, node: int, mode: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(tokens, trie node each reaches, whether its lead ends on a pending apostrophe) for
        the lead-only tokens that keep the word at ``node`` in ``mode`` inside the trie (views
        of the walk table)."""
        lo, hi = self._walk_slice.get(4 * node + mode, (0, 0))
        return self._walk_toks[lo:hi], self._walk_reached[lo:hi], self._walk_apos[lo:hi]

    def _allowed_whole(self, mode: int | None, last: bool) -> np.ndarray:
        """Tokens read whole from a boundary that are allowed: at a boundary (``mode`` None), or
        ending the word of an in-word ``mode`` whose end is fine."""
        if mode is None:
            ok = ~self._boundary_blocked[last]
            ok[self._exact[_BOUNDARY]] = False
            return ok
        return self._ends_mask[mode] & ~self._rest_bad[last] & ~self._always

    def _whole(self, mode: int | None, last: bool) -> _Tagged:
        """The request-dependent tokens among those read whole from a boundary (at a boundary:
        ``mode`` None; else after the word of ``mode`` ended): at the end of the line, those
        whose own word is a phrase word; else their dead ends (kept for good)."""
        key = ("whole", mode, last)
        if key not in self._fixed:
            self._fixed[key] = self._make_whole(mode, last)
        return self._fixed[key]  # type: ignore[no-any-return]

    def _make_whole(self, mode: int | None, last: bool) -> _Tagged:
        idx = np.flatnonzero(self._allowed_whole(mode, last) & (self._tail[0] >= 0)).tolist()
        if last:
            idx = [i for i in idx if self._tail_wid[i]]
            return self._tagged(idx, [int(self._tail_wid[i]) for i in idx], [0] * len(idx))
        tagged = self._ways(idx, [int(self._tail[0][i]) for i in idx], [self._tail[1][i] for i in idx])
        left = [self._whole_state[i] for i in idx]
        tagged.leaving = (idx, [n for n, _ in left], [m == _APOSTROPHE for _, m in left])  # type: ignore[misc]
        return tagged

    def precompute(self) -> int:
        """Compute what decoding meets most, so a line rarely waits on it: the whole-read token
        tables of every mode, the voice bonus's tables (with ``voice``), and the masks (:meth:`_plan`) of a boundary and of every state one
        token after a space leaves (a word's first token), with no phrase under way; returns how
        many states."""
        for mode in (None, _LETTERS, _APOSTROPHE, _AFTER):
            for last in (False, True):
                self._whole(mode, last)
        if self.voice:
            self._voice_tables()
        seen = {(0, _BOUNDARY)}
        for i, text in enumerate(self._texts):
            if text[:1] == " " and not self._always[i] and self._simple(text):
                node, mode = self.step(WordState(), i)[:2]
                if mode != _BOUNDARY and node >= 0:
                    seen.add((node, mode))
        for node, mode in seen:  # (a line's last token rarely starts a word: boundary only)
            for last in (False, True) if mode == _BOUNDARY else (False,):
                state = WordState(node, mode, 0)
                self._plans.get((node, mode, 0, last), lambda s=state, x=last: self._plan(s, x))
        return len(seen)


def _ids(toks: _Ids) -> np.ndarray:
    """Token ids of a table entry, as the array a group holds (the entry itself)."""
    return toks


def _joined(parts: Sequence[np.ndarray]) -> np.ndarray:
    if not parts:
        return np.zeros(0, dtype=np.int64)
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


BannedWordMask = WordConstraint
"""The former name of :class:`WordConstraint` (static banned words, no vocabulary)."""


def fill_slots(text: str, values: Mapping[str, str]) -> str:
    """Replace ``{slot}`` markers with ``values[slot]``; markers without a value stay.

    A value that starts a sentence (the line, or after ``.``, ``!`` or ``?``) gets a capital
    first letter: "the barracks" at the start reads "The barracks is...".
    """

    def fill(m: re.Match[str]) -> str:
        value = values.get(m.group(1))
        if value is None:
            return m.group(0)
        value = str(value)
        if re.search(r"(^|[.!?]\s+)$", text[: m.start()]):
            value = value[:1].upper() + value[1:]
        return value

    return _SLOT_MARKER.sub(fill, text)


def unfilled_slots(text: str) -> set[str]:
    """Names of ``{slot}`` markers left in ``text``."""
    return set(_SLOT_MARKER.findall(text))


def normalise_line(text: str) -> str:
    """The form lines are compared in by the repeat memory: lower case, words only."""
    return " ".join(re.findall(r"\w+", text.lower()))


class RepeatMemory:
    """The last ``size`` lines said per key (an NPC and a player), for repeat avoidance.

    Lines are compared after :func:`normalise_line`. At most ``max_keys`` keys are kept, the
    least recently used dropped first. Thread-safe.
    """

    def __init__(self, size: int = 8, max_keys: int = 10_000) -> None:
        if size < 0 or max_keys < 1:
            raise ValueError(f"size must be >= 0 and max_keys >= 1, got {size}, {max_keys}")
        self.size = size
        self.max_keys = max_keys
        self._lines: OrderedDict[object, deque[str]] = OrderedDict()
        self._lock = threading.Lock()

    def said_recently(self, key: object, text: str) -> bool:
        norm = normalise_line(text)
        with self._lock:
            lines = self._lines.get(key)
            return lines is not None and norm in lines

    def remember(self, key: object, text: str) -> None:
        if self.size == 0:
            return
        with self._lock:
            lines = self._lines.get(key)
            if lines is None:
                lines = self._lines[key] = deque(maxlen=self.size)
                if len(self._lines) > self.max_keys:
                    self._lines.popitem(last=False)
            else:
                self._lines.move_to_end(key)
            lines.append(normalise_line(text))

    def recent(self, key: object) -> list[str]:
        """The remembered (normalised) lines for ``key``, oldest first."""
        with self._lock:
            return list(self._lines.get(key, ()))


@dataclass(frozen=True)
class SlotRules:
    """Which free-text slots a line may contain, per archetype, state and intent (from the line book)."""

    slots: tuple[str, ...]
    archetype: Mapping[str, frozenset[str]]
    state: Mapping[str, frozenset[str]]
    intent: Mapping[str, frozenset[str]]

    def allowed(self, archetype: str, state: str, intent: str) -> frozenset[str]:
        return (self.archetype.get(archetype, frozenset()) | self.state.get(state, frozenset())
                | self.intent.get(intent, frozenset()))


@dataclass(frozen=True)
class Constraints:
    """What a model's lines must respect, as ``constraints.json`` ships it (:func:`read_constraints`).

    ``banned_words``: static banned words and phrases; ``slot_rules``: which free-text slots a
    line may hold; ``vocabulary``: every word a line may complete; ``signatures``: ``{tag:
    [phrases]}`` that voice one tag only (see :meth:`WordConstraint.banned_bits`). The last two
    are None for a file that predates them: then no vocabulary constraint and no conditional
    phrases apply. ``slot_defaults``: ``{slot: text}`` filled in where a request gives no value
    for a slot its line may hold (None or missing: such slots are blocked while sampling).
    ``voice``: ``{kind: logits}`` (``voice_bonus`` in the file; :data:`VOICE_KINDS`): the bonus
    that makes a request's tags audible (:meth:`WordConstraint.voice_bonus`; None: none).
    ``bigrams``: which words may follow which inside a sentence piece
    (:class:`runtime.client.bigrams.BigramTable`, ``bigrams`` in the file; None: no such rule).
    ``trigrams``: which word trigrams a finished line may hold
    (:class:`runtime.client.trigrams.TrigramTable`, ``trigrams`` in the file; None: no such check).
    """

    banned_words: list[str]
    slot_rules: SlotRules
    vocabulary: tuple[str, ...] | None = None
    signatures: Mapping[str, tuple[str, ...]] | None = None
    slot_defaults: Mapping[str, str] | None = None  # what a line says for a slot the game left unfilled
    voice: Mapping[str, float] | None = None  # the voice bonus (WordConstraint.voice_bonus), by kind
    bigrams: BigramTable | None = None  # the book's word bigrams (runtime.client.bigrams)
    trigrams: TrigramTable | None = None  # the book's word trigrams (runtime.client.trigrams)

    def word_constraint(self, tokenizer: Tokenizer, **options: Any) -> WordConstraint:
        """The token masks these constraints make for ``tokenizer`` (options: :class:`WordConstraint`'s)."""
        options.setdefault("voice", self.voice)
        options.setdefault("bigrams", self.bigrams)
        return WordConstraint(self.banned_words, tokenizer, vocabulary=self.vocabulary,
                              signatures=self.signatures, **options)

    def to_json(self) -> dict[str, Any]:
        """The ``constraints.json`` document :func:`read_constraints` reads back."""
        rules = self.slot_rules
        data: dict[str, Any] = {"banned_words": list(self.banned_words), "slots": list(rules.slots), "slot_rules": {
            kind: {name: sorted(slots) for name, slots in getattr(rules, kind).items()}
            for kind in ("archetype", "state", "intent")}}
        if self.vocabulary is not None:
            data["vocabulary"] = sorted(self.vocabulary)
        if self.signatures is not None:
            data["signatures"] = {tag: list(p) for tag, p in sorted(self.signatures.items())}
        data = compact_document(data)
        if self.slot_defaults:
            data["slot_defaults"] = dict(self.slot_defaults)
        if self.voice:
            data["voice_bonus"] = dict(self.voice)
        if self.bigrams is not None:
            data["bigrams"] = self.bigrams.to_json()
        if self.trigrams is not None:
            data["trigrams"] = self.trigrams.to_json()
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Constraints:
        """Parse a ``constraints.json`` document; ValueError/KeyError/TypeError if malformed."""
        rules = data["slot_rules"]
        slot_rules = SlotRules(tuple(data["slots"]), *({k: frozenset(v) for k, v in rules[kind].items()}
                                                      for kind in ("archetype", "state", "intent")))
        banned = data["banned_words"]
        if not isinstance(banned, list) or not all(isinstance(w, str) for w in banned):
            raise TypeError("banned_words must be a list of strings")
        data = expanded_document(data)
        vocabulary = data.get("vocabulary")
        if vocabulary is not None:
            if not isinstance(vocabulary, list) or not all(
                    isinstance(w, str) and _WORD.fullmatch(w) for w in vocabulary):
                raise ValueError("vocabulary must be a list of lower-case words")
            vocabulary = tuple(vocabulary)
        signatures = data.get("signatures")
        if signatures is not None:
            if not isinstance(signatures, dict):
                raise TypeError("signatures must map tags to lists of phrases")
            for tag, phrases in signatures.items():
                if not _TAG_KEY.fullmatch(tag):
                    raise ValueError(f"signature tag {tag!r} is not archetype:, persona: or context:SLOT=VALUE")
                if not isinstance(phrases, list) or not all(isinstance(p, str) and _words_of(p) for p in phrases):
                    raise ValueError(f"signatures[{tag!r}] must be a list of phrases")
            signatures = {tag: tuple(p) for tag, p in signatures.items()}
        defaults = data.get("slot_defaults")
        if defaults is not None and not (isinstance(defaults, dict) and all(
                k in slot_rules.slots and isinstance(v, str) and v.strip() for k, v in defaults.items())):
            raise ValueError("slot_defaults must map known slots to non-empty text")
        voice = data.get("voice_bonus")
        if voice is not None:
            if not isinstance(voice, dict):
                raise TypeError("voice_bonus must map kinds to numbers")
            voice = check_voice(voice)
        bigrams = None
        if data.get("bigrams") is not None:
            from runtime.client.bigrams import table_of
            bigrams = table_of(data, vocabulary, slot_rules.slots)
        trigrams = None
        if data.get("trigrams") is not None:
            from runtime.client.trigrams import TrigramTable
            trigrams = TrigramTable.from_json(data["trigrams"])
        return cls(list(banned), slot_rules, vocabulary, signatures, defaults, voice, bigrams, trigrams)


def expanded_document(data: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a ``constraints.json`` document with its word lists as JSON lists: the file
    writes ``vocabulary`` as one string of space-separated words and each ``signatures`` entry
    as one string of ``|``-separated phrases (:func:`compact_document`: ~35 KB less of the
    mobile bundle's 8 MB than a list of quoted strings); lists are read as well."""
    out = dict(data)
    vocabulary = out.get("vocabulary")
    if isinstance(vocabulary, str):
        out["vocabulary"] = vocabulary.split()
    signatures = out.get("signatures")
    if isinstance(signatures, dict):
        out["signatures"] = {tag: [p for p in phrases.split("|") if p] if isinstance(phrases, str) else phrases
                             for tag, phrases in signatures.items()}
    return out


def compact_document(data: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a ``constraints.json`` document with its word lists as the strings the file
    holds (:func:`expanded_document` reads them back)."""
    out = dict(data)
    if isinstance(out.get("vocabulary"), list):
        out["vocabulary"] = " ".join(out["vocabulary"])
    if isinstance(out.get("signatures"), dict):
        out["signatures"] = {tag: "|".join(p) if isinstance(p, list) else p for tag, p in out["signatures"].items()}
    return out


VETO = 0.5


def vetoed(raw: np.ndarray, masked: np.ndarray, threshold: float = VETO, *,
           state: WordState | None = None) -> bool:
    """Whether a sample should be abandoned rather than steered: the model's most likely next
    token (``raw``, the unmasked logits row) is one the constraints block (-inf in ``masked``)
    and holds more than ``threshold`` of the probability at temperature 1.

    Then the line is heading for something the book never says for this request (another
    trait's "I'm hopeless with words", a hostile "No one trusts you" for an honored player);
    masking that one token would force an unlikely one and the line would derail into word
    salad, so the engines end the sample as ``blocked`` and draw another (from its last
    sentence end: :func:`restart_point`), and a fallback after the last attempt.

    ``state`` (the row's :class:`WordState`, optional): in the middle of an ellipsis (``..``,
    which only a third dot may follow) nothing is vetoed: the masks leave that dot, which is
    what the book writes, so steering there derails nothing.
    """
    return _vetoed_at(raw, masked, int(np.argmax(raw)), threshold, state)


def _vetoed_at(raw: np.ndarray, masked: np.ndarray, top: int, threshold: float, state: WordState | None) -> bool:
    """:func:`vetoed`, given ``top``, the index of ``raw``'s largest (``np.argmax``)."""
    if state is not None and state.shape == _DOT2:
        return False
    if math.isfinite(masked[top]):
        return False
    z = raw.astype(np.float64, copy=False)
    return float(1.0 / np.exp(z - z[top]).sum()) > threshold


def restart_point(states: Sequence[WordState], *, fresh: bool = False) -> int:
    """Where a sample the constraints stopped (a veto or a dead end) is drawn again from, given
    ``states[i]``, the state after each of its tokens (the last one the state where it stopped):
    the number of its first tokens that end at its last sentence end before that (``.``, ``!``,
    ``?`` or ``...`` after a word, at a word boundary), which are kept;
    0 when there is none (the line is drawn again from its start). The sentence under way when
    the sample stopped is the one heading for what the book never says for the request, so only
    it is drawn again; the sentences before it were allowed word by word. ``fresh``: only a
    sentence end with no phrase under way (where a decode that starts its masks from
    ``WordState()`` after the kept tokens blocks what the engine blocks; the evaluation's)."""
    for k in range(len(states) - 1, 0, -1):
        s = states[k - 1]
        if s.mode == _BOUNDARY and s.shape in (_DOT1, _END) and not (fresh and s.phrase):
            return k
    return 0


def constraints_file(path: Path) -> Constraints:
    """Parse one ``constraints.json`` file; ValueError saying what is wrong (not naming the
    file: callers do, as a bundle names its own path rather than where it was extracted)."""
    try:
        return Constraints.from_json(json.loads(path.read_text(encoding="utf-8")))
    except KeyError as exc:
        raise ValueError(f"not a constraints file (missing key {exc})") from exc
    except (OSError, ValueError, TypeError, AttributeError) as exc:
        raise ValueError(f"not a constraints file ({exc})") from exc


def read_constraints(model_dir: str | Path | None = None) -> Constraints:
    """The :class:`Constraints` of a model: ``model_dir/constraints.json`` (default: the shipped
    model's).

    ``constraints.json``: ``{"banned_words": [...], "slots": [...], "slot_rules": {"archetype":
    {name: [slots]}, "state": {...}, "intent": {...}}, "vocabulary": [...], "signatures": {tag:
    [...]}}``, the last two optional (files written before them still load). A malformed file
    raises ValueError naming it. ``flashnpc export`` writes the file from the line book
    (:func:`runtime.factory.export.write_constraints`); a model directory without one gets the
    shipped model's banned words, slot rules and slot defaults (the default line book's, as
    exported), without its vocabulary and signatures, so no line book (or YAML) is read here.
    """
    root = Path(model_dir) if model_dir is not None else DEFAULT_MODEL_DIR
    path = root / "constraints.json"
    own = path.is_file()
    if not own:
        path = DEFAULT_MODEL_DIR / "constraints.json"
        if not path.is_file():
            raise ValueError(f"{root / 'constraints.json'}: missing, and no shipped constraints to fall back on")
    try:
        cons = constraints_file(path)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from exc
    if not own:
        cons = Constraints(cons.banned_words, cons.slot_rules, slot_defaults=cons.slot_defaults)
    return cons


def usable(text: str) -> str | None:
    """None if ``text`` is a usable line, else why not (``empty``, ``no_words``)."""
    if not text.strip():
        return "empty"
    if not re.search(r"[A-Za-z]{2,}", text):
        return "no_words"
    return None


_TRAILING_WORD = re.compile(r"[A-Za-z']+$")
_OPEN_ELLIPSIS = re.compile(r"(?<!\.)\.\.$")


_BROKEN_BETWEEN_LETTERS = re.compile(r"(?<=[A-Za-z'])\ufffd+(?=[A-Za-z])")


def without_broken_bytes(text: str) -> str:
    """``text`` without the U+FFFD of bytes that decode to no character (a byte-level token the
    model emitted alone): between two letters as a space, since the masks read such a byte as a
    word's end (so "b", a stray byte, "us" stay two words and never spell a banned "bus"),
    elsewhere dropped."""
    return _BROKEN_BETWEEN_LETTERS.sub(" ", text).replace("\ufffd", "")


def settled_text(raw: str) -> str:
    """The part of a line still being decoded that may be shown: ``raw`` without its trailing
    run of letters and apostrophes, a word that the next token may still extend or, at a dead
    end (:meth:`WordConstraint.blocked` blocking every token), leave unfinished; and of an
    ellipsis under way (``".."``, which only a third dot may follow), its first dot only."""
    return _OPEN_ELLIPSIS.sub(".", _TRAILING_WORD.sub("", raw))


def check_sampling(temperature: float, top_k: int, top_p: float, max_tokens: int,
                   min_tokens: int = 0) -> None:
    """Raise ValueError naming the first out-of-range sampling parameter."""
    if not isinstance(temperature, (int, float)) or not np.isfinite(temperature) or temperature < 0:
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
    if not isinstance(top_k, (int, np.integer)) or isinstance(top_k, bool) or top_k < 0:
        raise ValueError(f"top_k must be an int >= 0 (0 = no limit), got {top_k!r}")
    if not isinstance(top_p, (int, float)) or not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
    if not isinstance(max_tokens, (int, np.integer)) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise ValueError(f"max_tokens must be an int >= 1, got {max_tokens!r}")
    if not isinstance(min_tokens, (int, np.integer)) or not 0 <= min_tokens <= max_tokens:
        raise ValueError(f"min_tokens must be an int in [0, max_tokens={max_tokens}], got {min_tokens!r}")


def stop_index(text: str, stops: Sequence[str]) -> int:
    """Index of the first stop string in ``text``, or -1."""
    hits = [i for i in (text.find(s) for s in stops if s) if i >= 0]
    return min(hits) if hits else -1


__all__ = ["MID_LINE", "TEXT_RULES", "VOICE_KINDS", "BannedWordMask", "Constraints", "MaskParts", "RepeatMemory", "SlotRules", "WordConstraint",
           "WordState",
           "check_sampling", "check_voice", "constraints_file", "fill_slots", "normalise_line", "read_constraints", "restart_point",
           "settled_text", "stop_index", "unfilled_slots", "usable", "vetoed"]
