"""Wiring LMS into a stock TensorFlow wheel at import time.

Order matters (docs/design.md, "Two ways in"): the interposer must be in the
process's global symbol scope before TensorFlow's libraries load, so that the
dynamic linker binds TensorFlow's calls to it; the adapter links TensorFlow and
loads after it.

Note [Activation]. Importing the package (or any of its modules: the tools
too) before TensorFlow loads the interposer, which needs nothing of
TensorFlow, and then either:
  - with an LMS setting in the environment (a TF_LMS_* variable that does
    not turn its feature off: LMS is asked for), imports TensorFlow and
    activates LMS at once, so a bad value
    is an error of the package's import, naming the variable; or
  - without one, waits: LMS activates when TensorFlow is first imported
    (after_import), or when an LMS function is first called (which imports
    TensorFlow). `python stats_tools/lms_stats.py` or `from
    tensorflow_lms_allocator import replay` never imports TensorFlow. What
    fails then (a TensorFlow built with the patch, an adapter that cannot
    configure) is a RuntimeWarning, and every LMS function raises the reason:
    TensorFlow's own import is not made to fail for LMS no one asked for yet.
Imported after TensorFlow, the package is its tools only
(install_or_explain). So is an import of the tools alone beside another
TensorFlow version than the build's, with no LMS setting in the environment
(_importing_tools_only): the interposer stays unloaded, and every LMS
function raises why; the package's own import still refuses that version.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import importlib.util
import json
import os
import sys
from pathlib import Path
from types import ModuleType

import warnings
from typing import Callable, Mapping

from tensorflow_lms_allocator.overlay import after_import, c_api, config_proto

_ADAPTER: ctypes.CDLL | None = None
# Whether this process loaded the interposer (before TensorFlow). It survives
# a failed `import tensorflow_lms_allocator`: Python drops the package from
# sys.modules but keeps this submodule, so a retry after fixing a bad
# environment value knows TensorFlow was imported by us, not before us.
_INTERPOSER_LOADED = False

# The exception each error code of the adapter's C API (cc/overlay/c_api.h)
# raises, by the code's name (tf_lms_code_name), so the type never depends on
# the message text. An error while importing raises ImportError instead when
# it is FAILED_PRECONDITION (another TensorFlow version, no interposer,
# devices created too early): the package cannot be used in this process.
_EXCEPTIONS: dict[str, type[Exception]] = {
    "INVALID_ARGUMENT": ValueError,
    "NOT_FOUND": ValueError,
    "RESOURCE_EXHAUSTED": MemoryError,
    "FAILED_PRECONDITION": RuntimeError,
    "INTERNAL": RuntimeError,
}

_MESSAGE_BYTES = 2048
# Why this process has no overlay (install_or_explain), for adapter()'s error.
_UNAVAILABLE: str | None = None


def _library_dir() -> Path:
    # The compiled libraries sit next to the _engine extension, which (in an
    # editable install) is not necessarily next to this file.
    spec = importlib.util.find_spec("tensorflow_lms_allocator._engine")
    if spec is None or spec.origin is None:
        raise ImportError(
            "tensorflow_lms_allocator is not built: run `make build` in the "
            "repository (or `pip install .`)")
    return Path(spec.origin).parent


def _check_not_patched(framework: Path) -> None:
    """ImportError if `framework` (loaded) is a TensorFlow built with the LMS patch.

    Such a build has LMS inside (patches/README.md); a second copy from this
    package would serve the same GPUs. Until the adapter registers its hooks,
    the interposer passes every call on to TensorFlow, so stopping here is safe.

    Example:
        >>> _check_not_patched(Path(tf.sysconfig.get_lib()) /  # doctest: +SKIP
        ...                    "libtensorflow_framework.so.2")
    """
    try:
        library = ctypes.CDLL(str(framework), mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    except OSError:
        return  # not loaded under that name: nothing to tell
    if hasattr(library, "tf_lms_get_statistics"):
        raise ImportError(
            f"{framework} exports tf_lms_get_statistics: this TensorFlow was built with "
            "the LMS patch series and has LMS already. Do not import "
            "tensorflow_lms_allocator; turn LMS on with "
            "tf.config.experimental.set_lms_enabled(True) or "
            "gpu_options.experimental.lms_enabled in the ConfigProto")


LATE_IMPORT = (
    "tensorflow_lms_allocator must be imported before TensorFlow: LMS "
    "replaces TensorFlow's allocator when TensorFlow's libraries load, "
    "and they are already loaded. Put `import tensorflow_lms_allocator` "
    "first, before `import tensorflow` and `import keras`.")


def _tensorflow_loaded_first() -> bool:
    return not _INTERPOSER_LOADED and ("tensorflow" in sys.modules or "keras" in sys.modules)


def _check_tensorflow_not_loaded() -> None:
    if _tensorflow_loaded_first():
        raise ImportError(LATE_IMPORT)


# The package's tools: they need no TensorFlow (tests/test_layout.py checks
# that its layering's TOOLS are these).
_TOOLS = frozenset({"engine", "trace", "replay", "_engine"})


def _importing_tools_only() -> bool:
    """Whether the package is being imported for its tools alone.

    True for ``import tensorflow_lms_allocator.replay``,
    ``importlib.import_module(...)`` or ``python -m`` of a tool (the import
    machinery's frames name the submodule) and for ``from
    tensorflow_lms_allocator import replay, trace`` (the importing frame's
    IMPORT_NAME takes that fromlist). Those may load beside another TensorFlow
    version: they never load the adapter.

    Example:
        >>> _importing_tools_only()  # not during the package's import
        False
    """
    import dis

    package = __name__.split(".")[0]
    own = str(Path(__file__).resolve().parents[1]) + os.sep  # the package's folder
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_filename.startswith("<frozen") or code.co_filename.endswith("runpy.py"):
            named = frame.f_locals.get("name") or frame.f_locals.get("mod_name")
            if isinstance(named, str) and named.startswith(package + "."):
                return named.split(".")[1] in _TOOLS
        elif not str(Path(code.co_filename).resolve()).startswith(own):
            # The first frame outside the package and the import machinery:
            # the statement importing it.
            previous = None
            for instruction in dis.get_instructions(code):
                if instruction.offset == frame.f_lasti:
                    fromlist = previous.argval if previous is not None else None
                    return (instruction.opname == "IMPORT_NAME"
                            and instruction.argval == package
                            and isinstance(fromlist, tuple) and bool(fromlist)
                            and set(fromlist) <= _TOOLS)
                previous = instruction
            return False
        frame = frame.f_back
    return False


def _tensorflow_installed() -> bool:
    try:
        return importlib.util.find_spec("tensorflow") is not None
    except ValueError:  # sys.modules["tensorflow"] is None: imports of it fail
        return False


# Settings whose value turns their feature off: set so, they ask for nothing.
# (TF_LMS_CPU_DEVICE_MEMORY_MB=0 is no such value: less than a granule, refused.)
_OFF = {"TF_LMS_ENABLED": ("0", "false"), "TF_LMS_DEFRAG_ENABLED": ("0", "false"),
        "TF_LMS_STRICT": ("0", "false"), "TF_LMS_PREFETCH": ("0", "false"),
        "TF_LMS_UNMAP_EVICTED": ("0", "false"), "TF_LMS_HOST_AHEAD_MB": ("0",)}


def asking_settings(environ: Mapping[str, str]) -> list[str]:
    """The TF_LMS_* variables of `environ` that ask for LMS, sorted.

    A variable set to a value that turns its feature off (``TF_LMS_ENABLED=0``,
    ``TF_LMS_STRICT=false``) asks for nothing, nor does an empty one.

    Example:
        >>> asking_settings({"TF_LMS_ENABLED": "0", "TF_LMS_POLICY": "lru"})
        ['TF_LMS_POLICY']
    """
    # As the adapter reads a flag (FlagFromEnv): any case, nothing stripped.
    return sorted(name for name, value in environ.items()
                  if name.startswith("TF_LMS_") and value
                  and value.lower() not in _OFF.get(name, ()))


def install_or_explain(then: Callable[[ModuleType], None]) -> None:
    """Activates LMS where it can serve this process (Note [Activation]); else keeps why not.

    `then(tf)` runs once TensorFlow is imported, activated or not (it adds
    the API to tf.config; without TensorFlow it never runs).

    The package's tools (the engine, traces, replay, the statistics files of
    the callbacks and stats_tools) need no TensorFlow, so the package imports
    without it, and after it: then every function that needs the overlay
    raises RuntimeError with the reason (Python's tf.config.experimental
    functions included). Settings for LMS in the environment (TF_LMS_*) ask
    for LMS, unless they turn it off (asking_settings): with TensorFlow
    loaded first they are an ImportError, as LMS cannot give what they ask. Returns the tensorflow module, or None
    without TensorFlow.

    Example:
        >>> import tensorflow as tf
        >>> from tensorflow_lms_allocator import replay  # works: a tool
        >>> tf.config.experimental.get_lms_enabled()  # doctest: +SKIP
        RuntimeError: LMS is not active in this process: tensorflow_lms_allocator must be imported before TensorFlow: ...
    """
    global _UNAVAILABLE
    if not _tensorflow_installed():
        version = built_for_tensorflow()
        _UNAVAILABLE = ("TensorFlow is not installed: this build of LMS serves tensorflow or "
                        f"tensorflow-cpu {version} (pip install tensorflow=={version}); the "
                        "tools (engine, trace, replay) work without it.")
        return
    requested = asking_settings(os.environ)
    if _tensorflow_loaded_first():
        if requested:
            raise ImportError(f"{LATE_IMPORT} (The environment sets {', '.join(requested)}, "
                              "asking for LMS, which this process cannot have now.)")
        _UNAVAILABLE = f"LMS is not active in this process: {LATE_IMPORT}"
        import tensorflow as tf

        then(tf)
        return
    if requested or "tensorflow" in sys.modules:  # asked for, or a retry after an error
        then(install())
        return
    mismatch = _tensorflow_version_mismatch()
    if mismatch is not None and _importing_tools_only():
        # The tools work beside any TensorFlow; LMS itself cannot.
        _UNAVAILABLE = f"LMS is not active in this process: {mismatch}"

        def explain(tf: ModuleType) -> None:
            warnings.warn(f"tensorflow_lms_allocator: {_UNAVAILABLE}", RuntimeWarning,
                          stacklevel=2)
            then(tf)

        after_import.after_import("tensorflow", explain)
        return
    _load_interposer()

    def activate(tf: ModuleType) -> None:
        global _UNAVAILABLE
        try:
            install()
        except Exception as error:  # noqa: BLE001  (kept, raised by every LMS call)
            _UNAVAILABLE = f"LMS is not active in this process: {error}"
            warnings.warn(f"tensorflow_lms_allocator: {_UNAVAILABLE}", RuntimeWarning,
                          stacklevel=2)
        then(tf)

    after_import.after_import("tensorflow", activate)


def installed_tensorflow() -> list[tuple[str, str]]:
    """The distributions that install the `tensorflow` module, with their versions.

    Read from the installed packages' metadata, without importing TensorFlow
    (which must load after the interposer).

    Example:
        >>> installed_tensorflow()  # doctest: +SKIP
        [('tensorflow_cpu', '2.21.0')]
    """
    names = importlib.metadata.packages_distributions().get("tensorflow", [])
    found = (importlib.metadata.distribution(name).metadata for name in names)
    return sorted({(meta["Name"], meta["Version"]) for meta in found})


# The oldest TensorFlow LMS builds for: the first with Keras 3.
OLDEST_SUPPORTED = "2.16"


def _older_than_keras_3(version: str) -> bool:
    """True for a TensorFlow version before 2.16 ("2.15.1", "1.15.5")."""
    try:
        major, minor = (int(part) for part in version.split(".")[:2])
    except ValueError:
        return False
    return (major, minor) < tuple(int(part) for part in OLDEST_SUPPORTED.split("."))


def built_for_tensorflow() -> str:
    """The TensorFlow version the package's binaries were built against.

    Example:
        >>> built_for_tensorflow()  # doctest: +SKIP
        '2.21.0'
    """
    build_info = _library_dir() / "build_info.json"
    return json.loads(build_info.read_text())["tensorflow_version"]


def _tensorflow_version_mismatch() -> str | None:
    """Why the installed TensorFlow cannot take this build, or None if it can.

    Read from the installed packages' metadata, without importing TensorFlow.

    Example:
        >>> _tensorflow_version_mismatch()  # doctest: +SKIP
        'tensorflow_lms_allocator was built for TensorFlow 2.21.0, but tensorflow_cpu 2.20.0 is installed. ...'
    """
    # The adapter links TensorFlow's C++ ABI: loaded into another TensorFlow
    # it fails on an undefined symbol (measured with 2.20.0) or, worse, loads.
    # The adapter checks again (tf_lms_configure) for a TensorFlow installed
    # without metadata.
    built_for = built_for_tensorflow()
    installed = installed_tensorflow()
    if installed and all(version != built_for for _, version in installed):
        found = ", ".join(f"{name} {version}" for name, version in installed)
        too_old = [version for _, version in installed if _older_than_keras_3(version)]
        if too_old:
            return (
                f"tensorflow_lms_allocator supports TensorFlow {OLDEST_SUPPORTED} to 2.21 "
                f"(Keras 3), and {found} is installed: TensorFlow {too_old[0]} uses Keras 2, "
                f"which LMS does not support. Upgrade TensorFlow to {built_for}, the version "
                "this package was built for (`pip install tensorflow=="
                f"{built_for}` or tensorflow-cpu).")
        return (
            f"tensorflow_lms_allocator was built for TensorFlow {built_for}, but "
            f"{found} is installed. Install TensorFlow {built_for} "
            f"(`pip install tensorflow=={built_for}` or tensorflow-cpu), or rebuild "
            "this package against the installed TensorFlow: `pip install "
            "--no-build-isolation --force-reinstall <this project>` (README, Install).")
    return None


def _check_tensorflow_version() -> None:
    """ImportError saying what to do if the installed TensorFlow cannot take this build.

    Example:
        >>> _check_tensorflow_version()  # the build's own TensorFlow: nothing happens
    """
    mismatch = _tensorflow_version_mismatch()
    if mismatch is not None:
        raise ImportError(mismatch)


def message_buffer() -> ctypes.Array:
    """A buffer for the message of a C API call that may fail."""
    return ctypes.create_string_buffer(_MESSAGE_BYTES)


def error(code: int, message: ctypes.Array) -> Exception:
    """The exception for a failed C API call: its type from `code` alone.

    Example:
        >>> buffer = message_buffer()
        >>> code = adapter().tf_lms_set_flag(b"lms_enabled", 1, buffer, len(buffer))
        >>> if code != 0:  # doctest: +SKIP
        ...     raise error(code, buffer)
    """
    name = adapter().tf_lms_code_name(code).decode()
    return _EXCEPTIONS.get(name, RuntimeError)(message.value.decode(errors="replace"))


def install() -> ModuleType:
    """Loads the interposer, imports TensorFlow, loads and configures the adapter.

    Returns the tensorflow module. Raises ImportError if TensorFlow was
    imported first (or the package cannot serve this TensorFlow), ValueError
    for an environment setting that cannot give a working device (naming the
    variable, its value and the valid range), MemoryError if valid settings
    cannot be served by this process. After such an error, correcting the
    setting (os.environ) and importing again works as long as TensorFlow has
    not created its devices in between.

    Example:
        >>> import tensorflow_lms_allocator  # runs install(); then tensorflow
    """
    global _ADAPTER
    _load_interposer()
    libs = _library_dir()
    if os.environ.get("TF_LMS_CPU_DEVICE_MEMORY_MB"):
        # TensorFlow's oneDNN CPU kernels crash (MklConvOp::Compute after a
        # failed temporary allocation in mkl_util.h) instead of raising OOM;
        # its Eigen kernels raise ResourceExhaustedError as GPU kernels do.
        # An explicit TF_ENABLE_ONEDNN_OPTS=1 still wins.
        os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
    import tensorflow as tf

    _check_not_patched(Path(tf.sysconfig.get_lib()) / "libtensorflow_framework.so.2")
    lib = ctypes.CDLL(str(libs / "libtf_lms_adapter.so"))
    c_api.declare(lib, libs / "c_api.h")
    if hasattr(lib, "tf_lms_test_allocate_raw"):  # a build for the tests (make build)
        c_api.declare(lib, libs / "c_api_testing.h")
    message = message_buffer()
    code = lib.tf_lms_configure(tf.__version__.encode(), message, len(message))
    if code != 0:
        name = lib.tf_lms_code_name(code).decode()
        text = message.value.decode(errors="replace")
        if name == "FAILED_PRECONDITION":
            raise ImportError(text)
        raise _EXCEPTIONS.get(name, ImportError)(text)
    _ADAPTER = lib
    _check_device_at_first_use(tf)
    enabled = ctypes.c_int(0)
    if lib.tf_lms_get_flag(b"strict", ctypes.byref(enabled), message, len(message)) != 0:
        raise ImportError(message.value.decode(errors="replace"))
    if enabled.value:
        _keep_strict_handler_first(lib)
    return tf


def _load_interposer() -> None:
    """Loads the interposer and ConfigProto's hook: before TensorFlow, once.

    ImportError if TensorFlow was loaded first, or is not the version the
    package was built for (read from its metadata: TensorFlow stays unloaded).
    """
    global _INTERPOSER_LOADED
    import tensorflow_lms_allocator._engine  # noqa: F401  (the build is present)

    if _INTERPOSER_LOADED:
        return
    libs = _library_dir()
    _check_tensorflow_not_loaded()
    _check_tensorflow_version()
    ctypes.CDLL(str(libs / "libtf_lms_interposer.so"), mode=ctypes.RTLD_GLOBAL)
    _INTERPOSER_LOADED = True
    config_proto.install()  # ConfigProto's lms_enabled, before TensorFlow loads it


def _keep_strict_handler_first(lib: ctypes.CDLL) -> None:
    """Keeps strict mode's SIGSEGV handler first when faulthandler is enabled later.

    faulthandler.enable() replaces every SIGSEGV handler with its own, which
    would report strict mode's harmless faults (unpinned touches of evicted
    memory) as a fatal error. After it runs, strict mode's handler goes back
    on top and forwards every fault that is not an unpinned touch to
    faulthandler, so real crashes still dump their traceback; after
    faulthandler.disable(), it forwards to what was there before.

    Example:
        >>> faulthandler.enable()  # doctest: +SKIP  (strict mode keeps working)
    """
    import faulthandler
    import functools

    original_enable = faulthandler.enable
    original_disable = faulthandler.disable

    @functools.wraps(original_enable)
    def enable(*args, **kwargs):  # type: ignore[no-untyped-def]
        was_enabled = faulthandler.is_enabled()
        original_enable(*args, **kwargs)
        if not was_enabled:
            lib.tf_lms_keep_fault_handler_first(0)

    @functools.wraps(original_disable)
    def disable():  # type: ignore[no-untyped-def]
        was_enabled = faulthandler.is_enabled()
        original_disable()
        if was_enabled:
            lib.tf_lms_keep_fault_handler_first(1)

    faulthandler.enable = enable
    faulthandler.disable = disable


def _raise_if_device_unavailable() -> None:
    """Raises RuntimeError (naming the settings) if the emulated device failed."""
    message = message_buffer()
    code = adapter().tf_lms_device_status(message, len(message))
    if code != 0:
        raise error(code, message)


def _check_device_at_first_use(tf: ModuleType) -> None:
    """Makes TensorFlow's first op raise if the emulated device could not be created.

    The device is created when TensorFlow's eager context initialises
    (Context.ensure_initialized, called before every op until it has run) or
    when a tf.compat.v1 Session is created. If LMS could not create it, the
    adapter gives TensorFlow an allocator whose every allocation fails, so
    nothing runs uncapped; these wrappers raise the reason (RuntimeError,
    naming the settings) from the eager context's initialisation (the first
    op, and every later one) and from every Session's construction, before
    TensorFlow reaches code that does not survive a failed allocation (tensor
    conversion from Python values, constants in graphs). Once the device is
    known good, the eager wrapper puts the original method back, so it costs
    nothing afterwards.

    Example:
        >>> tf.fill((2,), 1.0)  # doctest: +SKIP
        RuntimeError: the emulated device (TF_LMS_CPU_DEVICE_MEMORY_MB=1024, ...) could not be created: ...
    """
    from tensorflow.python.client import session
    from tensorflow.python.eager import context

    cls = context.Context
    original = cls.ensure_initialized

    def ensure_initialized(self: context.Context) -> None:
        original(self)
        _raise_if_device_unavailable()
        if cls.ensure_initialized is ensure_initialized:
            cls.ensure_initialized = original

    ensure_initialized.__doc__ = original.__doc__
    cls.ensure_initialized = ensure_initialized

    original_session_init = session.BaseSession.__init__

    def session_init(self: session.BaseSession, *args: object, **kwargs: object) -> None:
        original_session_init(self, *args, **kwargs)
        _raise_if_device_unavailable()

    session_init.__doc__ = original_session_init.__doc__
    session.BaseSession.__init__ = session_init


def set_learned_order(device: str, on: bool) -> None:
    """With TF_LMS_POLICY=learned, reclaims on LMS device `device` take the
    learned order (True, the default) or LRU's while the policy goes on
    learning (False): a test entry point, for comparing the two in one process.

    RuntimeError from a build without test entry points (a wheel); make build
    has them.

    Example:
        >>> import tensorflow_lms_allocator as lms
        >>> set_learned_order(lms.device_names()[0], False)  # doctest: +SKIP
    """
    lib = adapter()
    if not hasattr(lib, "tf_lms_test_set_learned_order"):
        raise RuntimeError("the reclaim order is a test entry point, which this build of "
                           "tensorflow_lms_allocator lacks: use the project's `make build`")
    message = message_buffer()
    code = lib.tf_lms_test_set_learned_order(device.encode(), int(on), message, len(message))
    if code != 0:
        raise error(code, message)


def active() -> bool:
    """Whether the overlay serves this process (install() succeeded)."""
    return _ADAPTER is not None


def adapter() -> ctypes.CDLL:
    """The loaded adapter library; imports TensorFlow if LMS waits for it (Note [Activation])."""
    if _ADAPTER is None and after_import.waiting("tensorflow"):
        import tensorflow  # noqa: F401  (activates LMS)
    if _ADAPTER is None:
        raise RuntimeError(_UNAVAILABLE or
                           "tensorflow_lms_allocator's TensorFlow overlay is not installed")
    return _ADAPTER
