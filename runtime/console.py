"""What the ``flashnpc`` commands share on the terminal: progress bars and ``--json`` output.

:class:`Progress` draws on stderr (stdout stays for the report, or the JSON of ``--json``): with
tqdm when it is installed (the ``train`` and ``dev`` extras bring it), else with a small built-in
bar, so a command a game developer runs with the core install (``flashnpc bundle verify``,
``flashnpc export mobile``) shows progress too. The client engine never imports this module.

    with Progress("load test", total=60, unit="s", enabled=not args.no_progress) as bar:
        bar.set(elapsed)                  # or bar.update(1); bar.write("a line above the bar")

    with ticking("exporting bundle", enabled=...) as bar:   # one long call that reports nothing:
        export_bundle(...)                                  # the bar counts the seconds
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any, TextIO

__all__ = ["Progress", "print_json", "ticking"]


class Progress:
    """A progress bar on stderr: ``total`` steps of ``unit`` (None: no total, elapsed time only).

    ``enabled=False`` draws nothing (``write`` still prints); nothing shows either until
    ``delay_s`` have passed, so a command that fails or finishes at once prints no bar. Safe to
    call from several threads; :func:`ticking` refreshes one from a timer thread.
    """

    def __init__(self, desc: str, *, total: float | None = None, unit: str = "it", enabled: bool = True,
                 file: TextIO | None = None, delay_s: float = 0.5) -> None:
        self.desc, self.total, self.unit, self.enabled = desc, total, unit, enabled
        self.file = file if file is not None else sys.stderr
        self.done = 0.0
        self.t0 = time.perf_counter()
        self.delay_s = delay_s
        self._lock = threading.Lock()
        self._last_draw = 0.0
        self._tqdm: Any = None
        if enabled:
            try:
                from tqdm import tqdm
            except ModuleNotFoundError:
                pass
            else:
                fmt = ("{desc}: {elapsed}" if total is None else
                       "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} {unit} [{elapsed}<{remaining}]")
                self._tqdm = tqdm(total=_whole(total), desc=desc, unit=unit, file=self.file, dynamic_ncols=True,
                                  bar_format=fmt, leave=True, delay=delay_s)

    # ------------------------------------------------------------ progress

    def update(self, n: float = 1) -> None:
        """Advance by ``n`` steps."""
        self.set(self.done + n)

    def set(self, done: float) -> None:
        """Set the steps done so far (clipped to the total)."""
        with self._lock:
            if self.total is not None:
                done = min(done, self.total)
            step, self.done = done - self.done, done
            if not self.enabled:
                return
            if self._tqdm is not None:
                if step > 0:
                    self._tqdm.update(_whole(step))
                else:
                    self._tqdm.refresh()
            else:
                self._draw()

    def stage(self, desc: str) -> None:
        """Say what is under way now (the bar's label)."""
        with self._lock:
            self.desc = desc
            if self._tqdm is not None:
                self._tqdm.set_description_str(desc)
            elif self.enabled:
                self._draw(force=True)

    def refresh(self) -> None:
        """Redraw (the elapsed time moves on even when nothing else does)."""
        self.set(self.done)

    def write(self, message: str) -> None:
        """Print a line to stderr above the bar."""
        with self._lock:
            if self._tqdm is not None:
                self._tqdm.write(message, file=self.file)
            else:
                if self.enabled and self._interactive():
                    self.file.write("\r\033[K")
                print(message, file=self.file, flush=True)

    def close(self) -> None:
        """Finish the bar (the built-in one says how long it took)."""
        with self._lock:
            if not self.enabled:
                return
            self.enabled = False
            if self._tqdm is not None:
                self._tqdm.close()
                return
            if time.perf_counter() - self.t0 < self.delay_s:
                return
            end = "\r\033[K" if self._interactive() else ""
            self.file.write(f"{end}{self.desc}: done in {self._elapsed()}\n")
            self.file.flush()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ the built-in bar

    def _interactive(self) -> bool:
        return bool(getattr(self.file, "isatty", lambda: False)())

    def _elapsed(self) -> str:
        s = time.perf_counter() - self.t0
        return f"{s:.1f} s" if s < 60 else f"{int(s // 60)} min {s % 60:02.0f} s"

    def _draw(self, force: bool = False) -> None:
        """One ``\\r`` line on a terminal, at most five times a second; nothing on a pipe (the
        closing line says it is done)."""
        now = time.perf_counter()
        if not self._interactive() or now - self.t0 < self.delay_s or (not force and now - self._last_draw < 0.2):
            return
        self._last_draw = now
        if self.total:
            share = self.done / self.total
            filled = int(24 * share)
            text = (f"{self.desc}: {100 * share:3.0f}% |{'#' * filled}{'.' * (24 - filled)}| "
                    f"{self.done:g}/{self.total:g} {self.unit} [{self._elapsed()}]")
        else:
            text = f"{self.desc}: {self._elapsed()}"
        self.file.write(f"\r\033[K{text}")
        self.file.flush()


def _whole(value: float | None) -> float | int | None:
    """``value`` as an int when it is a whole number (tqdm shows 3/60, not 3.0/60.0)."""
    return int(value) if value is not None and float(value).is_integer() else value


@contextlib.contextmanager
def ticking(desc: str, *, enabled: bool = True, interval_s: float = 0.5) -> Iterator[Progress]:
    """A :class:`Progress` without a total for one long call that reports nothing: a timer thread
    redraws it (the elapsed time) every ``interval_s`` until the block ends."""
    bar = Progress(desc, enabled=enabled)
    stop = threading.Event()

    def tick() -> None:
        while not stop.wait(interval_s):
            bar.refresh()

    timer = threading.Thread(target=tick, name="flashnpc-progress", daemon=True)
    if enabled:
        timer.start()
    try:
        yield bar
    finally:
        stop.set()
        if enabled:
            timer.join()
        bar.close()


def print_json(data: Any, file: TextIO | None = None) -> None:
    """``data`` as indented JSON on stdout (what ``--json`` prints; paths and other objects as text)."""
    print(json.dumps(data, indent=2, default=str), file=file if file is not None else sys.stdout)
