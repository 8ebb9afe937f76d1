r"""Part 0003 of the LMS patch series: the Python API in TensorFlow's tree.

tensorflow/python/framework/config.py gains set_lms_enabled, get_lms_enabled,
set_lms_defrag_enabled, get_lms_defrag_enabled and the statistics functions
(docs/observing.md#statistics), exported as tf.config.experimental.<name> and
tf.experimental.<name> (IBM's names); tensorflow/python/eager/context.py keeps
the two settings and writes them into the ConfigProto's
GPUOptions.Experimental; the API golden files of tf.config.experimental and
tf.experimental (v1 and v2) list the new functions.

Example:
    >>> "def set_lms_enabled(" in patch_config_py("import platform\n")  # doctest: +SKIP
    True
"""

from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path

import api_goldens
from patch_text import insert_after, insert_before

PACKAGE = Path(__file__).resolve().parent.parent / "tensorflow_lms_allocator"


CONFIG_PY_ADDITION = '''

@tf_export(
    "config.experimental.set_lms_enabled", "experimental.set_lms_enabled"
)
def set_lms_enabled(enable):
  """Turns Large Model Support (LMS) on or off for the GPUs of this process.

  With LMS on, the GPU allocator keeps every tensor at one device address and
  moves inactive tensors to host memory when device memory runs out, paging
  them back in when a kernel needs them: models larger than the GPU train.
  Sets `GPUOptions.Experimental.lms_enabled` of the context's ConfigProto.
  Must be called before the GPUs are initialized.

  >>> tf.config.experimental.set_lms_enabled(True)  # doctest: +SKIP

  Args:
    enable: bool, whether LMS evicts tensors to host memory.

  Raises:
    RuntimeError: the runtime is already initialized with another value.
  """
  context.context().set_lms_enabled(enable)


@tf_export(
    "config.experimental.get_lms_enabled", "experimental.get_lms_enabled"
)
def get_lms_enabled():
  """Returns whether Large Model Support (LMS) is on for this process's GPUs."""
  return context.context().get_lms_enabled()


@tf_export(
    "config.experimental.set_lms_defrag_enabled",
    "experimental.set_lms_defrag_enabled",
)
def set_lms_defrag_enabled(enable):
  """Turns LMS's remapping defragmentation on or off.

  When a request finds enough free device memory but no free address range
  large enough, LMS remaps physical memory instead of evicting more tensors.
  Sets `GPUOptions.Experimental.lms_defrag_enabled`. Must be called before the
  GPUs are initialized.

  >>> tf.config.experimental.set_lms_defrag_enabled(True)  # doctest: +SKIP

  Args:
    enable: bool, whether LMS defragments by remapping.

  Raises:
    RuntimeError: the runtime is already initialized with another value.
  """
  context.context().set_lms_defrag_enabled(enable)


@tf_export(
    "config.experimental.get_lms_defrag_enabled",
    "experimental.get_lms_defrag_enabled",
)
def get_lms_defrag_enabled():
  """Returns whether LMS's remapping defragmentation is on."""
  return context.context().get_lms_defrag_enabled()
'''

CONTEXT_INIT_ANCHOR = "    self._optimizer_experimental_options = {}\n"
CONTEXT_INIT_ADDITION = '''\
    self._lms_enabled = None
    self._lms_defrag_enabled = None
'''

CONTEXT_CONFIG_ANCHOR = '''\
    gpu_options = self._compute_gpu_options()
    config.gpu_options.MergeFrom(gpu_options)
'''
CONTEXT_CONFIG_ADDITION = '''\
    if self._lms_enabled is not None:
      config.gpu_options.experimental.lms_enabled = self._lms_enabled
    if self._lms_defrag_enabled is not None:
      config.gpu_options.experimental.lms_defrag_enabled = (
          self._lms_defrag_enabled
      )
'''

CONTEXT_METHODS_ANCHOR = "  def get_optimizer_experimental_options(self):\n"
CONTEXT_METHODS_ADDITION = '''\
  def _set_lms_option(self, name, enable):
    enable = bool(enable)
    if getattr(self, name) == enable:
      return
    if self._context_handle is not None:
      raise RuntimeError(
          "Large Model Support must be configured before the runtime is "
          "initialized: call tf.config.experimental.%s before the first "
          "op, or set GPUOptions.Experimental.%s in the ConfigProto"
          % ("set" + name, name[1:])
      )
    setattr(self, name, enable)
    self._thread_local_data.function_call_options = None

  def set_lms_enabled(self, enable):
    """Turns Large Model Support on or off (before initialization)."""
    self._set_lms_option("_lms_enabled", enable)

  def get_lms_enabled(self):
    """Whether Large Model Support is on."""
    return bool(self.config.gpu_options.experimental.lms_enabled)

  def set_lms_defrag_enabled(self, enable):
    """Turns LMS's remapping defragmentation on or off."""
    self._set_lms_option("_lms_defrag_enabled", enable)

  def get_lms_defrag_enabled(self):
    """Whether LMS's remapping defragmentation is on."""
    return bool(self.config.gpu_options.experimental.lms_defrag_enabled)

'''


# --------------------------------------------------------------------------
# The statistics functions: one per public name of docs/observing.md, each reading the
# engine's statistic through LMS's C entry points (statistics_c_api.h), which
# the patched TensorFlow exports from the library its GPU runtime is in.

CONFIG_PY_IMPORTS_BEFORE = "import ctypes\nimport glob\nimport numbers\nimport os\n"
CONFIG_PY_IMPORTS_ANCHOR = "import platform\n"
CONFIG_PY_IMPORTS_AFTER = "import re\nimport sys\n"

CONFIG_PY_STATISTICS_HELPERS = r'''

# Large Model Support's statistics come from its C entry points
# (tensorflow/core/common_runtime/lms/tf_adapter/statistics_c_api.h), found
# once in the loaded library that exports them.
_lms_c_api = None

# A local device as TensorFlow names it: "GPU:1", "/device:GPU:1",
# "/physical_device:GPU:1", "/job:localhost/replica:0/task:0/device:GPU:1".
_LMS_DEVICE_NAME = re.compile(
    r"(?:/job:localhost)?(?:/replica:0)?(?:/task:0)?/?(?:physical_)?"
    r"(?:device:)?(CPU|GPU):(\d+)",
    re.IGNORECASE,
)


def _lms_library():
  """The loaded library that exports LMS's C entry points."""
  global _lms_c_api
  if _lms_c_api is not None:
    return _lms_c_api
  package = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
  candidates = sorted(
      glob.glob(os.path.join(package, "libtensorflow_framework*"))
  )
  internal = sys.modules.get("tensorflow.python._pywrap_tensorflow_internal")
  if getattr(internal, "__file__", None):
    candidates.append(internal.__file__)
  # Last, the global scope: a TensorFlow linked into the program, or the same
  # entry points loaded globally by another library.
  candidates.append(None)
  for path in candidates:
    try:
      library = ctypes.CDLL(
          path, mode=(os.RTLD_NOLOAD | os.RTLD_LAZY) if path else 0
      )
    except OSError:
      continue
    if hasattr(library, "tf_lms_get_statistics"):
      break
  else:
    raise RuntimeError(
        "This TensorFlow was built without Large Model Support: no loaded "
        "library exports tf_lms_get_statistics. Build TensorFlow with the "
        "LMS patch series (patches/README.md of tensorflow-lms-allocator)."
    )
  library.tf_lms_code_name.argtypes = [ctypes.c_int]
  library.tf_lms_code_name.restype = ctypes.c_char_p
  library.tf_lms_num_statistics.argtypes = []
  library.tf_lms_statistic_name.argtypes = [ctypes.c_int]
  library.tf_lms_statistic_name.restype = ctypes.c_char_p
  library.tf_lms_get_statistics.argtypes = [
      ctypes.c_char_p,
      ctypes.POINTER(ctypes.c_int64),
      ctypes.c_int,
      ctypes.c_char_p,
      ctypes.c_size_t,
  ]
  library.tf_lms_device_names.argtypes = []
  library.tf_lms_device_names.restype = ctypes.c_void_p
  library.tf_lms_free_string.argtypes = [ctypes.c_void_p]
  library.tf_lms_free_string.restype = None
  _lms_c_api = library
  return library


def _lms_device_names():
  """The LMS devices TensorFlow created ("GPU:0", ...), in index order."""
  library = _lms_library()
  context.ensure_initialized()
  names = library.tf_lms_device_names()
  try:
    return ctypes.string_at(names).decode().split()
  finally:
    library.tf_lms_free_string(names)


def _lms_device_name(device):
  """The name ("GPU:0") of the LMS device that `device` designates."""
  if isinstance(device, numbers.Integral) and not isinstance(device, bool):
    names = _lms_device_names()
    if not 0 <= device < len(names):
      raise ValueError(
          "No LMS device with index %d; the LMS devices are: %s. Turn LMS on "
          "with tf.config.experimental.set_lms_enabled(True) before the "
          "first op." % (device, ", ".join(names) or "none")
      )
    return names[device]
  name = getattr(device, "name", device)
  match = (
      _LMS_DEVICE_NAME.fullmatch(name) if isinstance(name, str) else None
  )
  if match is None:
    raise ValueError(
        "%r is not a local device: use an index (0), a device string "
        '("GPU:0", "/device:GPU:0") or a device from '
        "tf.config.list_logical_devices()." % (device,)
    )
  return "%s:%s" % (match.group(1).upper(), match.group(2))


def _lms_statistic(name, device):
  """The LMS engine's statistic `name` for `device`."""
  device_name = _lms_device_name(device)
  library = _lms_library()
  context.ensure_initialized()
  count = library.tf_lms_num_statistics()
  values = (ctypes.c_int64 * count)()
  message = ctypes.create_string_buffer(1024)
  code = library.tf_lms_get_statistics(
      device_name.encode(), values, count, message, len(message)
  )
  if code != 0:
    error = ValueError
    if library.tf_lms_code_name(code) != b"NOT_FOUND":
      error = RuntimeError
    raise error(message.value.decode(errors="replace"))
  for i in range(count):
    if library.tf_lms_statistic_name(i).decode() == name:
      return values[i]
  raise RuntimeError(
      "The LMS library has no statistic %r; it is not the one this "
      "TensorFlow was built with." % name
  )
'''

STATISTIC_FUNCTION = '''

@tf_export(
    "config.experimental.{public}",
    "experimental.{public}",
)
def {public}(device=0):
  """Returns the Large Model Support (LMS) statistic `{engine}`.

{doc}

  For example: `tf.config.experimental.{public}("GPU:0")`.

  Args:
    device: an LMS device: its index (`0` is the first GPU LMS serves), a
      device string such as `"GPU:0"`, or a device from
      `tf.config.list_logical_devices()`.

  Returns:
    The statistic, an int.

  Raises:
    ValueError: `device` is not an LMS device.
    RuntimeError: LMS could not create the device, or this TensorFlow was
      built without LMS.
  """
  return _lms_statistic("{engine}", device)
'''


def public_statistics() -> dict[str, str]:
    """The statistics functions (docs/observing.md#statistics): public name -> the engine's name.

    Read from the runtime overlay's table (tensorflow_lms_allocator/lms.py),
    so that both ways in export the same functions.

    Example:
        >>> public_statistics()["get_gpu_host_bytes_in_use"]
        'host_bytes_in_use'
    """
    tree = ast.parse((PACKAGE / "lms.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "STATISTICS":
            return ast.literal_eval(node.value)
    raise SystemExit("error: tensorflow_lms_allocator/lms.py has no STATISTICS table")


def statistic_docs() -> dict[str, str]:
    """Each engine statistic's description, from LMS_FOR_EACH_STATISTIC.

    Example:
        >>> statistic_docs()["bytes_reclaimed"]
        'device bytes freed by evictions, cumulative'
    """
    header = (PACKAGE / "cc" / "engine" / "statistics.h").read_text()
    entries = re.findall(r'X\((\w+),[\s\\]*((?:"[^"]*"[\s\\]*)+)\)', header)
    return {name: "".join(re.findall(r'"([^"]*)"', doc)) for name, doc in entries}


def statistics_functions() -> str:
    """The text of every statistics function of config.py."""
    docs = statistic_docs()
    functions = []
    for public, engine in public_statistics().items():
        doc = textwrap.fill(docs[engine][0].upper() + docs[engine][1:] + ".", width=80,
                            initial_indent="  ", subsequent_indent="  ")
        functions.append(STATISTIC_FUNCTION.format(public=public, engine=engine, doc=doc))
    return "".join(functions)


def patch_config_py(text: str) -> str:
    path = "tensorflow/python/framework/config.py"
    text = insert_before(text, CONFIG_PY_IMPORTS_ANCHOR, CONFIG_PY_IMPORTS_BEFORE, path)
    text = insert_after(text, CONFIG_PY_IMPORTS_ANCHOR, CONFIG_PY_IMPORTS_AFTER, path)
    return (text.rstrip("\n") + "\n" + CONFIG_PY_ADDITION + CONFIG_PY_STATISTICS_HELPERS
            + statistics_functions())


def patch_context_py(text: str) -> str:
    path = "tensorflow/python/eager/context.py"
    text = insert_after(text, CONTEXT_INIT_ANCHOR, CONTEXT_INIT_ADDITION, path)
    text = insert_after(text, CONTEXT_CONFIG_ANCHOR, CONTEXT_CONFIG_ADDITION, path)
    return insert_before(text, CONTEXT_METHODS_ANCHOR, CONTEXT_METHODS_ADDITION, path)




# --------------------------------------------------------------------------
# The API golden files (api_goldens.py): each gains a member_method for every
# function above, at its place in name order.

SETTINGS_FUNCTIONS = {
    "set_lms_enabled": "args=['enable'], varargs=None, keywords=None, defaults=None",
    "get_lms_enabled": "args=[], varargs=None, keywords=None, defaults=None",
    "set_lms_defrag_enabled": "args=['enable'], varargs=None, keywords=None, defaults=None",
    "get_lms_defrag_enabled": "args=[], varargs=None, keywords=None, defaults=None",
}
STATISTIC_ARGSPEC = "args=['device'], varargs=None, keywords=None, defaults=['0'], "


def lms_functions() -> dict[str, str]:
    """Every function 0003 exports: name -> its argspec in the golden files.

    Example:
        >>> lms_functions()["get_bytes_reclaimed"]
        "args=['device'], varargs=None, keywords=None, defaults=['0'], "
    """
    return {**SETTINGS_FUNCTIONS,
            **{name: STATISTIC_ARGSPEC for name in public_statistics()}}


def patch_golden(text: str) -> str:
    """A golden file of tf.config.experimental or tf.experimental, with LMS's functions."""
    for name, spec in sorted(lms_functions().items()):
        later = [m.start() for m in re.finditer(r'^  member_method \{\n    name: "(\w+)"',
                                                text, re.M) if m.group(1) > name]
        at = later[0] if later else text.rindex("}\n")
        text = text[:at] + api_goldens.member_method(name, spec) + text[at:]
    return text


def golden_files() -> list[str]:
    """The golden files 0003 changes, relative to the TensorFlow tree."""
    return [api_goldens.golden_path(version, module) for version, module in api_goldens.MODULES]
