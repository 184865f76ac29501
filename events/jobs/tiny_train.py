"""tiny_train: a small training job to try spotrelay with. Plain Python (standard library only), no GPU.

It fits y = 3x + 1 by stochastic gradient descent on 64 noisy points drawn from a fixed seed, for
`--epochs` epochs (12) of `--epoch-seconds` each (5): about a minute. An epoch's work takes milliseconds;
it then waits out the rest of its interval, as a real epoch would take its time. It prints one line per
epoch (`epoch 3/12 loss 0.316446 w 1.9806 b 0.9717`) and, at the end, `done: 12 epochs, loss X`.

It keeps the contract of spotrelay's worker agent (spotrelay/agent/runner.py, spotrelay/agent/agent.py):
- after every epoch it saves its whole state (epoch, weights, loss history) to
  `$SPOTRELAY_CHECKPOINT_DIR/state.json`, atomically (a temporary file in that dir, fsync, rename): the
  agent uploads the dir as it finds it, at any moment, and must never find half a file;
- with `SPOTRELAY_RESUMED=1` (the agent restored a checkpoint into the dir) it goes on from the saved
  epoch, and if there is no readable state.json there it fails (exit 1) rather than start again from
  scratch; `0` or unset: a new run (a state.json already there is overwritten);
- at SIGTERM (the agent's, at a spot interruption notice, `checkpoint.grace_seconds` before its SIGKILL)
  it finishes the epoch it is computing, saves, prints `SIGTERM: checkpoint written at epoch N` and exits
  0 at once; the agent then takes its final checkpoint of the dir. SIGINT (Ctrl-C, by hand) does the same.
Without SPOTRELAY_CHECKPOINT_DIR (run by hand) the checkpoint dir is ./checkpoint.

The data and each epoch's order of samples come from fixed seeds, so a run stopped and resumed ends with
exactly the weights of one that ran straight through.

Exit status: 0 done, or stopped by SIGTERM/SIGINT with its state saved; 1 no usable checkpoint to resume
from, or one that cannot be written; 2 a bad argument or environment variable (the message names it).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import select
import signal
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

PROG = "tiny_train"
ENV_CHECKPOINT_DIR = "SPOTRELAY_CHECKPOINT_DIR"  # the names spotrelay/agent/runner.py gives the job
ENV_RESUMED = "SPOTRELAY_RESUMED"
DEFAULT_CHECKPOINT_DIR = "checkpoint"  # relative to the working directory, for a run by hand
STATE_FILE = "state.json"
STATE_FORMAT = 1

DEFAULT_EPOCHS = 12
DEFAULT_EPOCH_SECONDS = 5.0
MAX_EPOCHS = 100_000  # a toy: its state (one loss per epoch) stays a few MB at most
MAX_EPOCH_SECONDS = 86_400.0
MAX_STATE_BYTES = 8 * 1024 * 1024  # read no further: no state of MAX_EPOCHS epochs is that large

DATA_SEED = 19
SAMPLES = 64
TRUE_W, TRUE_B, NOISE = 3.0, 1.0, 0.1
LEARNING_RATE = 0.01  # small enough that the loss goes down over all twelve epochs, not in the first one

EXIT_NO_CHECKPOINT = 1
EXIT_USAGE = 2


class UsageError(Exception):
    """A bad environment variable; the message names it."""


class CheckpointError(Exception):
    """No usable state to resume from, or a state that cannot be written."""


@dataclass
class TrainingState:
    """All a run needs to go on: `epoch` epochs done, the weights after them, the loss after each."""

    epoch: int = 0
    w: float = 0.0
    b: float = 0.0
    losses: list[float] = field(default_factory=list)

    def to_json(self) -> str:
        # json writes a float as its repr, which reads back as the same float: a resumed run is exact
        document = {"format": STATE_FORMAT, "epoch": self.epoch, "w": self.w, "b": self.b, "losses": self.losses}
        return json.dumps(document, indent=1) + "\n"

    @classmethod
    def from_json(cls, document: Any) -> TrainingState:
        """The state `document` holds; ValueError saying what is wrong with it."""
        if not isinstance(document, dict):
            raise ValueError(f"expected a JSON object, got {type(document).__name__}")
        if document.get("format") != STATE_FORMAT:
            raise ValueError(f"format {document.get('format')!r}, expected {STATE_FORMAT}")
        epoch = document.get("epoch")
        if not isinstance(epoch, int) or isinstance(epoch, bool) or not 0 <= epoch <= MAX_EPOCHS:
            raise ValueError(f"epoch {epoch!r} is not a number of epochs (0 to {MAX_EPOCHS})")
        losses = document.get("losses")
        if not isinstance(losses, list) or len(losses) != epoch:
            raise ValueError(f"losses is not a list of {epoch} losses, one per epoch done")
        return cls(
            epoch=epoch,
            w=_finite(document.get("w"), "w"),
            b=_finite(document.get("b"), "b"),
            losses=[_finite(loss, "a loss") for loss in losses],
        )


def _finite(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{what} is {value!r}, not a finite number")
    return float(value)


# --- the training ---------------------------------------------------------------------------------------


def dataset() -> list[tuple[float, float]]:
    """64 points of y = 3x + 1 with Gaussian noise, the same on every run."""
    rng = random.Random(DATA_SEED)
    points = []
    for _ in range(SAMPLES):
        x = rng.uniform(-1.0, 1.0)
        points.append((x, TRUE_W * x + TRUE_B + rng.gauss(0.0, NOISE)))
    return points


def mean_squared_error(w: float, b: float, data: Sequence[tuple[float, float]]) -> float:
    return sum((w * x + b - y) ** 2 for x, y in data) / len(data)


def train_epoch(state: TrainingState, data: Sequence[tuple[float, float]]) -> None:
    """One pass of SGD over `data`, in an order drawn from the epoch's own seed (not from a generator
    carried along, which a resumed run would not have), then its loss."""
    order = list(range(len(data)))
    random.Random(DATA_SEED * 1_000_003 + state.epoch).shuffle(order)
    w, b = state.w, state.b
    for i in order:
        x, y = data[i]
        error = w * x + b - y
        w -= LEARNING_RATE * 2 * error * x
        b -= LEARNING_RATE * 2 * error
    state.w, state.b = w, b
    state.losses.append(mean_squared_error(w, b, data))
    state.epoch += 1


# --- the checkpoint -------------------------------------------------------------------------------------


def save_state(state: TrainingState, path: Path) -> None:
    """Write `path` atomically: a temporary file in its dir, fsync, rename over it, fsync the dir."""
    text = state.to_json()
    try:
        descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(descriptor, "w", encoding="utf-8") as file:
                file.write(text)
                file.flush()
                os.fsync(file.fileno())
            os.replace(temporary, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise
        _fsync_directory(path.parent)
    except OSError as e:
        raise CheckpointError(f"cannot write the checkpoint {path}: {e.strerror or e}") from None


def _fsync_directory(path: Path) -> None:
    """Make the rename itself durable (where the platform lets a directory be fsynced)."""
    with contextlib.suppress(OSError):
        descriptor = os.open(path, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)


def load_state(path: Path) -> TrainingState:
    """The state to resume from; CheckpointError if it is missing or unreadable (never a fresh start)."""
    never_fresh = f"{ENV_RESUMED}=1 but"
    advice = f"not starting again from scratch (to start a new run, set {ENV_RESUMED}=0)"
    try:
        with path.open("rb") as file:
            data = file.read(MAX_STATE_BYTES + 1)
    except FileNotFoundError:
        raise CheckpointError(f"{never_fresh} there is no checkpoint {path}; {advice}") from None
    except OSError as e:
        raise CheckpointError(f"{never_fresh} the checkpoint {path} cannot be read ({e.strerror}); {advice}") from None
    try:
        if len(data) > MAX_STATE_BYTES:
            raise ValueError(f"larger than {MAX_STATE_BYTES // (1024 * 1024)} MiB")
        try:
            document = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"not JSON ({e})") from None
        return TrainingState.from_json(document)
    except ValueError as e:
        raise CheckpointError(f"{never_fresh} the checkpoint {path} is unreadable: {e}; {advice}") from None


# --- SIGTERM --------------------------------------------------------------------------------------------


class StopRequest:
    """SIGTERM (and SIGINT) as something to wait on: `wait(seconds)` returns early once one has come.

    The handlers only note the signal. What wakes the wait is the interpreter's own wake-up fd
    (`signal.set_wakeup_fd`): the signal's arrival writes a byte to a pipe, which `select` sees, even if
    it came just before the wait began. (Not `threading.Event.set()` in the handler: a handler runs on the
    main thread between two bytecodes, possibly while that same thread holds the Event's lock inside its
    `wait()`, and that lock is not reentrant.)"""

    def __init__(self) -> None:
        self.signal_name: str | None = None
        self._wakeup, write = os.pipe()
        os.set_blocking(self._wakeup, False)
        os.set_blocking(write, False)
        signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._noted)

    @property
    def requested(self) -> bool:
        return self.signal_name is not None

    def _noted(self, signum: int, frame: FrameType | None) -> None:
        if self.signal_name is None:
            self.signal_name = signal.Signals(signum).name

    def wait(self, seconds: float) -> bool:
        """Wait `seconds`, or less if a stop is requested meanwhile; whether one is."""
        deadline = time.monotonic() + seconds
        while not self.requested:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            select.select([self._wakeup], [], [], left)  # (another signal wakes it too: wait on)
            with contextlib.suppress(BlockingIOError):
                os.read(self._wakeup, 512)
        return self.requested


# --- the command line -----------------------------------------------------------------------------------


def _epochs(text: str) -> int:
    try:
        epochs = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 1 <= epochs <= MAX_EPOCHS:
        raise argparse.ArgumentTypeError(f"use 1 to {MAX_EPOCHS} (got {epochs})")
    return epochs


def _epoch_seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not (math.isfinite(seconds) and 0 <= seconds <= MAX_EPOCH_SECONDS):
        raise argparse.ArgumentTypeError(f"use 0 to {MAX_EPOCH_SECONDS:g} seconds (got {text})")
    return seconds


def parse_arguments(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=(
            "A toy training job (fits y = 3x + 1 by SGD) that checkpoints to $SPOTRELAY_CHECKPOINT_DIR "
            "(./checkpoint if unset) and resumes when SPOTRELAY_RESUMED=1."
        ),
    )
    parser.add_argument(
        "--epochs", type=_epochs, default=DEFAULT_EPOCHS, help=f"epochs to train (default {DEFAULT_EPOCHS})"
    )
    parser.add_argument(
        "--epoch-seconds",
        type=_epoch_seconds,
        default=DEFAULT_EPOCH_SECONDS,
        help=f"how long an epoch takes, work and wait (default {DEFAULT_EPOCH_SECONDS:g}; 0: no wait)",
    )
    return parser.parse_args(argv)


def checkpoint_dir_from(env: Mapping[str, str]) -> Path:
    value = env.get(ENV_CHECKPOINT_DIR)
    if value is None:
        return Path(DEFAULT_CHECKPOINT_DIR)
    if not value:
        raise UsageError(f"{ENV_CHECKPOINT_DIR} is set but empty: give a directory, or unset it for ./checkpoint")
    return Path(value)


def resumed_from(env: Mapping[str, str]) -> bool:
    value = env.get(ENV_RESUMED, "")
    if value not in ("", "0", "1"):
        raise UsageError(f"{ENV_RESUMED} is {value!r}: use 1 (resume from the checkpoint) or 0 (a new run)")
    return value == "1"


# --- the run --------------------------------------------------------------------------------------------


def train(epochs: int, epoch_seconds: float, checkpoint_dir: Path, resumed: bool, stop: StopRequest) -> int:
    state_file = checkpoint_dir / STATE_FILE
    if resumed:
        state = load_state(state_file)
        say(f"resumed from epoch {state.epoch} (of {epochs}); checkpoint {state_file}")
    else:
        state = TrainingState()
        say(f"starting: {epochs} epochs of {epoch_seconds:g} s; checkpoint {state_file}")
    data = dataset()
    next_epoch_at = time.monotonic()
    while state.epoch < epochs and not stop.requested:
        next_epoch_at += epoch_seconds
        train_epoch(state, data)  # not interrupted by a signal: its handler only notes it
        save_state(state, state_file)
        say(f"epoch {state.epoch}/{epochs} loss {state.losses[-1]:.6f} w {state.w:.4f} b {state.b:.4f}")
        if state.epoch < epochs:
            stop.wait(next_epoch_at - time.monotonic())
    if stop.requested and state.epoch < epochs:
        save_state(state, state_file)  # (saved after each epoch already, but not if stopped before the first)
        say(f"{stop.signal_name}: checkpoint written at epoch {state.epoch}")
        return 0
    say(f"done: {state.epoch} epochs, loss {state.losses[-1]:.6f}")
    return 0


def say(line: str) -> None:
    print(line, flush=True)


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    stop = StopRequest()  # first: a SIGTERM while starting up is not lost
    arguments = parse_arguments(sys.argv[1:] if argv is None else argv)  # (exits 2, naming the argument)
    env = os.environ if env is None else env
    try:
        checkpoint_dir = checkpoint_dir_from(env)
        resumed = resumed_from(env)
        if not resumed:  # (to resume, the dir is there with its state in it, or the run fails saying so)
            try:
                checkpoint_dir.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise UsageError(
                    f"{ENV_CHECKPOINT_DIR}: cannot make the directory {checkpoint_dir}: {e.strerror}"
                ) from None
    except UsageError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    try:
        return train(arguments.epochs, arguments.epoch_seconds, checkpoint_dir, resumed, stop)
    except CheckpointError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr, flush=True)
        return EXIT_NO_CHECKPOINT


if __name__ == "__main__":
    sys.exit(main())
