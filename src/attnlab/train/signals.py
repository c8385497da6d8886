"""Stop a training run cleanly on SIGINT (Ctrl-C) or SIGTERM (`kill`, a batch scheduler's notice).

The first signal only asks: the loop finishes its step, saves a checkpoint and returns. A second
one interrupts at once (KeyboardInterrupt), for a user who would rather not wait.
"""

import signal
import threading
from types import FrameType


class StopRequest:
    """A context manager that catches SIGINT and SIGTERM while training runs.

    `signal_name` is None until a signal arrives, then e.g. "SIGTERM". Signal handlers can only be
    set from the main thread; elsewhere this catches nothing (and `signal_name` stays None). A
    signal the process was started ignoring (SIG_IGN) is left ignored.

    Example: `with StopRequest() as stop: result = train(config, "runs/x", stop=stop)`.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.signal_name: str | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> "StopRequest":
        if threading.current_thread() is threading.main_thread():
            # A signal ignored on purpose stays ignored (a shell's background job, nohup), as Python does.
            caught = [s for s in self.SIGNALS if signal.getsignal(s) is not signal.SIG_IGN]
            self._previous = {s: signal.signal(s, self._handle) for s in caught}
        return self

    def __exit__(self, *exc: object) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signal_name is not None:
            raise KeyboardInterrupt  # the second signal: stop now, without saving
        # Only a flag: the handler runs between two bytecodes of the loop, which may be mid-write.
        self.signal_name = signal.Signals(signum).name
