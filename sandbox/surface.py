"""The library surface a memory program may reach: tier 1's allow- and deny-lists, and the
import rule the sandbox host enforces again at run time.

Owns the lists :mod:`sandbox.static` checks a program's names, attributes, imports and strings
against (:data:`ALLOWED_IMPORTS`, :data:`FORBIDDEN_MODULES`, :data:`FORBIDDEN_NAMES`,
:data:`FORBIDDEN_ATTRIBUTES`, :data:`SELF_ONLY_ATTRIBUTES`, :data:`EVALUATION_NAMES`, ...),
the callables a survey of the allowed modules flags and tier 1 allows with the reason each is
harmless (:data:`REVIEWED_MEMBERS`, checked by ``tests/test_escapes.py`` against
``tests/surface_survey.py``), and the predicates both sides share: :func:`import_allowed` (the
host's ``__import__``), :func:`forbidden_module` and :func:`bad_attribute`.

Invariants: data and pure predicates only; nothing here parses or runs a program. A name is
refused in one list, and every rule that needs it reads that list.
"""

from __future__ import annotations

import re

ALLOWED_IMPORTS: frozenset[str] = frozenset(
    "__future__ math cmath re collections dataclasses typing itertools functools heapq bisect "
    "statistics datetime json string textwrap difflib enum abc copy operator unicodedata numbers "
    "fractions decimal array hashlib random numpy bm25s Stemmer".split()
)
# Allowed imports a sandbox host loads only for a program that imports them: bm25s (with scipy
# and tqdm) is most of a host's start, 0.3 of its 0.55 s (docs/performance.md, "The test suite").
LOADED_ON_DEMAND: frozenset[str] = frozenset({"bm25s"})
# Private numpy modules its C code imports by name on every use, through the caller's
# __import__ (``PyImport_ImportModule``, fromlist ['__doc__']): ``str(x.dtype)`` and dtype
# reprs. Reviewed: formatting helpers only, already loaded with numpy. Helpers numpy caches after
# a first use (``x.sum()``: numpy._core._methods) are used once by the host's warm-up instead.
NUMPY_RUNTIME_IMPORTS: frozenset[str] = frozenset({"numpy._core._dtype"})
# Submodules of allowed packages that read or write files, run code or reach the network.
FORBIDDEN_MODULES = (
    "numpy.testing", "numpy.f2py", "numpy.distutils", "numpy.ctypeslib", "numpy.lib.format",
    "numpy.lib.npyio", "numpy.compat", "bm25s.hf", "bm25s.utils", "bm25s.cli",
    "bm25s.high_level", "bm25s.mcp", "bm25s.terminal",
)  # fmt: skip
FORBIDDEN_NAMES: frozenset[str] = frozenset(
    "open exec eval compile __import__ globals locals vars breakpoint input exit quit help "
    "memoryview getattr setattr delattr copyright credits license __builtins__ __build_class__ "
    "__loader__ __spec__ __file__ __dict__".split()
)
ALLOWED_DUNDER_NAMES = frozenset({"__name__", "__slots__", "__all__"})
ALLOWED_DUNDER_ATTRIBUTES = frozenset({"__init__", "__post_init__", "__name__"})
ALLOWED_DUNDER_STRINGS = ALLOWED_DUNDER_ATTRIBUTES | {"__main__"}
NAMEDTUPLE_API = frozenset({"_asdict", "_replace", "_fields", "_make", "_field_defaults"})
FORBIDDEN_ATTRIBUTES: frozenset[str] = frozenset(
    # files and pickles (and the load/save/dump family: LOAD_SAVE)
    "open fromfile tofile fromregex genfromtxt memmap open_memmap DataSource fromtextfile "
    "openfile Path read_text read_bytes getline linecache formatwarning as_strided "
    # corners of allowed packages that run code or reach the network
    "ctypeslib f2py testing distutils compat hf utils scipy "
    # processes, code execution, frames and code objects, attribute lookup by string
    "system popen fork spawn exec_module eval exec getattr setattr delattr vars globals locals "
    "breakpoint gi_frame gi_code cr_frame cr_code ag_frame ag_code f_globals f_locals f_back "
    "f_builtins f_code tb_frame co_code mro format_map vformat Formatter attrgetter methodcaller "
    "get_type_hints ForwardRef CodeType FunctionType LambdaType ModuleType new_class "
    "update_wrapper no_type_check no_type_check_decorator "
    # test runners (numpy.test, scipy.sparse.test: pytest with any arguments), progress bars
    # that write to files and start monitor threads, test and tool submodules
    "test tests conftest tqdm tool add_newdoc add_docstring add_newdoc_ufunc "
    # modules that allowed modules expose as attributes (dataclasses.sys, enum.bltns, bm25s.os)
    "os _os sys _sys builtins bltns inspect codecs logging mmap resource subprocess importlib "
    "ctypes pickle marshal socket shutil pathlib io gc warnings "
    # library data that hands back the class a program gave it (dataclass fields, defaultdict)
    "default_factory".split()
)
# Library attributes with a name too common to refuse everywhere: allowed only on a method's own
# self or cls (numpy.info imports the module named by its 'toplevel' argument; a singledispatch
# function's registry hands back the classes its annotations name).
SELF_ONLY_ATTRIBUTES = frozenset({"info", "registry"})
# Callables that tests/surface_survey.py flags and tier 1 allows, each with why it is harmless.
REVIEWED_MEMBERS: dict[str, str] = {
    "collections.namedtuple": "execs code generated from field names it checks are identifiers",
    "dataclasses.dataclass": "execs code generated from the class's own annotated field names",
    "typing.TypeVar": "compiles a string bound into a ForwardRef; only get_type_hints (refused) "
    "would evaluate it",
    "numpy.rec.array": "opens a path only for an os.PathLike object, which needs a __fspath__ "
    "method (sandbox.objects refuses it); a str argument is data",
}
LOAD_SAVE = re.compile(r"(load|save|dump)(s|z|txt|z_compressed|_\w+)?")
CLASS_FACTORIES = frozenset({"make_dataclass", "NamedTuple", "TypedDict"})
TYPE_FACTORIES = frozenset({"TypeVar", "NewType", "ParamSpec"})
EVALUATION_NAMES: frozenset[str] = frozenset(
    "evolve sandbox scoring scorer splits rubric gold evidence_ids source_chat_ids "
    "probing_questions".split()
)
EVALUATION_STRINGS = (
    "probing_questions", "source_chat_ids", "/shared/", "shared/data", "splits/", "programs/",
    ".sqlite",
)  # fmt: skip


def import_allowed(name: str, fromlist: tuple[str, ...] = ()) -> bool:
    """The run-time twin of the import rules, used by the sandbox host's ``__import__``; it
    also admits the imports numpy's C code makes of :data:`NUMPY_RUNTIME_IMPORTS`."""
    if name in NUMPY_RUNTIME_IMPORTS and fromlist in ((), ("__doc__",)):
        return True
    if name.split(".")[0] not in ALLOWED_IMPORTS or forbidden_module(name):
        return False
    return not any(
        item == "*" or item.startswith("_") or forbidden_module(f"{name}.{item}")
        for item in fromlist
    )


def forbidden_module(path: str) -> bool:
    """Private parts, parts named like forbidden attributes (``testing``, ``tests``,
    ``conftest``, ``tool``, ``f2py``, ...), and :data:`FORBIDDEN_MODULES`."""
    parts = path.split(".")[1:]
    private = any(part.startswith("_") or part in FORBIDDEN_ATTRIBUTES for part in parts)
    return private or any(path == m or path.startswith(m + ".") for m in FORBIDDEN_MODULES)


def bad_attribute(attr: str, on_json: bool) -> bool:
    """A forbidden attribute, or a load/save/dump name anywhere but on the json module."""
    return attr in FORBIDDEN_ATTRIBUTES or (not on_json and bool(LOAD_SAVE.fullmatch(attr)))
