"""What zoo sets up around jax for its commands and library calls: where zoo keeps what it computes once
(`cache_root`), JAX's persistent compilation cache there, and XLA's C++ log lines kept off the console.

- Cache root: $ZOO_CACHE_DIR, else $XDG_CACHE_HOME/zoo, else ~/.cache/zoo. It holds the CPU's measured matmul
  peak (zoo.training.flops), checkpoints converted once (zoo.load of a .gguf file: converted/) and compiled
  programs (jax/).
- Compiled programs: every command and zoo.load / zoo.train turn on JAX's persistent compilation cache in
  CACHE_ROOT/jax, so a program compiled once (a decoder's generation loop, a train step) is read back by the
  next command instead of compiled again (jax keeps those that took >= 1 s to compile). A cache the user
  chose (JAX_COMPILATION_CACHE_DIR, or jax.config's jax_compilation_cache_dir) is left as it is;
  ZOO_COMPILE_CACHE=0 turns zoo's off.
- XLA's C++ logging: the commands set TF_CPP_MIN_LOG_LEVEL=3 (fatal only) unless it is set, so XLA's
  error-level chatter ("Very slow compile?" alarms after a long compile, which are not errors) stays off the
  console; a real failure still reaches the command as an exception and its one `error:` line.
  TF_CPP_MIN_LOG_LEVEL=0 shows everything again.
- libtpu installed on a host with no TPU attached (the test extras and the `tpu` extra bring it, for
  --compile-for): at every start it looks for its pod's workers and accelerator type and prints what it cannot
  find. `quiet_libtpu` gives it this host and a placeholder type first, only where no TPU chip is on the PCI bus
  and the user set neither, and lets several compile-only clients start at once; a TPU host is left as it is.
- Hugging Face datasets' progress bars ("Generating train split", "Filter", "tokenizing") stay off while zoo reads
  and tokenizes a source (`quiet_datasets`, around zoo's own calls into datasets only), in a command or a Python
  run, in a terminal or not; the user's setting is back afterwards, and HF_DATASETS_DISABLE_PROGRESS_BARS=0 shows them.
- Python runs: zoo.load and zoo.train (`use_compile_cache`) quiet libtpu as the commands do, which takes effect where
  they are the first to start jax's backend. jaxlib reads TF_CPP_MIN_LOG_LEVEL once, when jax is imported (set
  later, it changes nothing), so the first use of a zoo name that imports jax (zoo.load, zoo.train, zoo.config, ...)
  sets the commands' default then (`quiet_xla`), where jax is not imported yet and the user set no level: a script
  that imports only zoo sees no "Very slow compile?" alarm. One that imports jax first keeps XLA's lines (set
  TF_CPP_MIN_LOG_LEVEL=3 before importing it to quiet them).
- Cache directories users name (data.cache_dir, zoo-eval's --cache-dir): `check_cache_dir` refuses one that
  cannot take files in one line naming the setting, before any work.
"""

from __future__ import annotations

import contextlib
import glob
import os
import sys
import warnings

OFF = ("0", "false", "off", "no")


def cache_root() -> str:
    """Where zoo keeps what it computes once (see the module's docstring)."""
    root = os.environ.get("ZOO_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "zoo")
    return os.path.expanduser(root)


def compile_cache_dir() -> str | None:
    """zoo's persistent compilation cache directory, or None when ZOO_COMPILE_CACHE turns it off."""
    if os.environ.get("ZOO_COMPILE_CACHE", "").strip().lower() in OFF:
        return None
    return os.path.join(cache_root(), "jax")


def quiet_cache_failures() -> None:
    """A compiled program that cannot be written to the cache (a full disk) only costs its compile next time: jax's
    warning about it stays off the console (a full disk is said once, by what the run failed to write)."""
    warnings.filterwarnings("ignore", message=r"Error (writing|reading) persistent compilation cache")


GOOGLE_PCI_VENDOR = "0x1ae0"  # a TPU chip on the PCI bus (jax's cloud_tpu_init looks for the same)


def is_terminal() -> bool:
    """Whether the console is a terminal (stdout and stderr): a progress bar redrawn in a log file is
    one long line of carriage returns."""
    try:
        return sys.stdout.isatty() and sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed streams
        return False


def tpu_attached() -> bool:
    return any(open(p).read().strip() == GOOGLE_PCI_VENDOR for p in glob.glob("/sys/bus/pci/devices/*/vendor"))


def quiet_libtpu(env=None) -> None:
    """libtpu's start-up lines off the console on a host without a TPU (see the module's docstring)."""
    env = os.environ if env is None else env
    if not tpu_attached():
        env.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
        env.setdefault("TPU_ACCELERATOR_TYPE", "v5litepod-4")
        # libtpu's lockfile (/tmp/libtpu_lockfile) keeps two processes off one TPU's chips; with none attached, it
        # would only keep two compile-only clients (two test workers, two --compile-for runs) from starting.
        env.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")


def quiet_xla(env=None) -> None:
    """XLA's C++ log lines at fatal only (TF_CPP_MIN_LOG_LEVEL=3) unless the user chose a level; read by jaxlib when
    jax is imported, so it counts only before that (see the module's docstring)."""
    env = os.environ if env is None else env
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def prepare_command(env=None) -> None:
    """For a command, before jax is imported: the compilation cache and XLA's log level, as environment
    variables jax reads when it starts (the user's own settings kept)."""
    env = os.environ if env is None else env
    quiet_cache_failures()
    path = compile_cache_dir()
    if path is not None and "JAX_COMPILATION_CACHE_DIR" not in env:
        env["JAX_COMPILATION_CACHE_DIR"] = path
    quiet_xla(env)
    quiet_libtpu(env)
    if "jax" in sys.modules:  # imported already (a command called from Python): the same, through jax.config
        use_compile_cache()


def use_compile_cache() -> None:
    """For a library call (zoo.load, zoo.train): turn on zoo's compilation cache unless jax has one already, and
    quiet libtpu as a command does (read when jax's backend starts: nothing changes once it has)."""
    import jax
    quiet_cache_failures()
    quiet_libtpu()
    path = compile_cache_dir()
    if path is not None and not jax.config.jax_compilation_cache_dir:
        try:
            os.makedirs(path, exist_ok=True)
        except OSError:  # an unwritable cache directory only costs the compiles
            return
        jax.config.update("jax_compilation_cache_dir", path)


@contextlib.contextmanager
def quiet_datasets():
    """datasets' progress bars off for the body, as they were afterwards (see the module's docstring)."""
    import datasets
    import datasets.config
    if datasets.config.HF_DATASETS_DISABLE_PROGRESS_BARS is False:  # HF_DATASETS_DISABLE_PROGRESS_BARS=0: shown
        yield
        return
    shown = not datasets.are_progress_bars_disabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if shown:
            datasets.enable_progress_bars()


def check_cache_dir(cache_dir: str, name: str = "data.cache_dir", example: str = "--set data.cache_dir=~/.cache/zoo"
                    ) -> None:
    """A cache directory the user names (data.cache_dir: token stores and Arrow copies) exists (made if need
    be) and takes files, or one line naming it; `name` and `example` say how the line names the setting and
    shows a good one (zoo-eval's --cache-dir)."""
    import tempfile
    from zoo.errors import ZooDataError
    path = os.path.expanduser(cache_dir)
    try:
        os.makedirs(path, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()
    except OSError as e:
        raise ZooDataError(f"{name}={cache_dir!r} is not a writable directory ({e.strerror or e}); point it "
                           f"at one, e.g. {example}") from None
