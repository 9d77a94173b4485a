"""zoo's errors: each one is bad input the user can fix, and its message names the culprit (config key,
file, value) and the valid choices in one line. Entry points print `error: <message>` and exit 2 on
any `ZooError` (a ValueError, so library callers may catch either). The library (zoo.load, zoo.train, ...)
raises them; only the commands print them."""


class ZooError(ValueError):
    """Bad input; the message says what was given, where, and what is allowed."""


class ConfigError(ZooError):
    """A config value is impossible; the message names the field and the valid choices."""


class ZooDataError(ZooError):
    """Bad data or tokenizer input; the message names the culprit and the valid choices or the fix."""


class CheckpointError(ZooError):
    """A checkpoint directory is missing, empty or of another model."""


class ConversionError(ZooError):
    """A checkpoint cannot be converted; the message names the file, key or architecture."""


class ArgumentError(ZooError):
    """An argument of a library call (or a command's flag) is of the wrong kind or out of range: the message
    names the argument, the value given and what is allowed."""


class FamilyError(ZooError):
    """The loaded model cannot do what was asked (a BERT asked to generate text); the message says what it
    can do."""


class TrainError(RuntimeError):
    """Training cannot go on (non-finite loss, bad workdir); the message says what to do."""


class Interrupted(TrainError):
    """A SIGTERM or Ctrl-C stopped a run outside its training loop (converting its base, building its data,
    compiling): the message says what was kept and what to run next; `signal` is the signal's number (a command
    exits with 128 + it, as a shell reports a process the signal ended)."""

    def __init__(self, message: str, signal: int):
        super().__init__(message)
        self.signal = signal
