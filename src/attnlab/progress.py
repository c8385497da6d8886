"""Progress lines for long work: a line now and then, readable in a log file as on a terminal
(a tqdm bar redraws in place, which only a terminal shows; a log that is not one gets nothing)."""

import sys
import time
from collections.abc import Callable


class ProgressLines:
    """Writes "WHAT: DONE/TOTAL UNIT (Ns)" at most every `every` seconds while work goes on, and
    nothing for work that ends sooner. Example: ProgressLines("validation", 1014, "sentences
    translated").update(130) -> "validation: 130/1014 sentences translated (31s)" (when due)."""

    def __init__(
        self,
        what: str,
        total: int,
        unit: str,
        *,
        every: float = 15.0,
        write: Callable[[str], object] | None = None,
        done: int = 0,
    ) -> None:
        self.what, self.total, self.unit, self.every = what, total, unit, every
        self.write = write if write is not None else (lambda line: sys.stderr.write(line + "\n"))
        self.start = self.last = time.perf_counter()
        self.done = done  # e.g. the steps a resumed run had done

    def update(self, n: int) -> None:
        """`n` more units done; a line when `every` seconds have passed since the last one."""
        self.done += n
        now = time.perf_counter()
        if now - self.last >= self.every and self.done < self.total:
            self.write(f"{self.what}: {self.done}/{self.total} {self.unit} ({now - self.start:.0f}s)")
            self.last = now
