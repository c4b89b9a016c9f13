"""Bounding what unpickling a pickle will cost, by walking its opcodes without running them.

An allow-list of globals (:mod:`trainer.checkpoint.safe_metadata`) stops a pickle from *calling*
anything
dangerous, but unpickling with only harmless names can still hang or crash a process:

* a dict key that is a tuple DAG (``t[i+1] = (t[i], t[i])`` through the memo) is a few hundred
  bytes, yet hashing it visits ``2**64`` leaves: every rank spins forever;
* a 1,000,000-deep nested tuple as a dict key makes ``hash`` recurse in C past the stack:
  SIGSEGV;
* ``BUILD`` is ``setattr``/``__dict__.update`` on whatever is below it on the stack: on an
  admitted *class* or *function* (``pathlib.PosixPath``, ``torch.serialization._get_layout``)
  it rewrites process-wide state (``PosixPath.__truediv__``) that outlives the refusal;
* a few MB of ``EMPTY_SET`` opcodes become GBs of empty sets.

:func:`check_pickle` simulates the unpickler's stack and memo on ``pickletools.genops``
(which parses, never executes) and keeps, for every object, its nesting depth and its size
*as a tree* (memo references counted every time they are used). It refuses, before anything
is unpickled:

* more than :data:`MAX_OPCODES` opcodes, or nesting deeper than :data:`MAX_DEPTH`;
* more *work* than :data:`WORK_PER_OPCODE` per opcode: every time an object is put into another
  one (or handed to a constructor), its tree size is added, which bounds every traversal the
  unpickler can make (hashing a key, building ``torch.Size``) by a linear function of the file;
* more memory than :data:`MEMORY_PER_BYTE` times the file size (plus :data:`MEMORY_SLACK`),
  for the unpickler or for the walk itself: both are charged as they grow (see
  ``_BASE_BYTES``), figures checked against ``tracemalloc`` for every shape of bomb
  (``tests/trainer/checkpoint/test_pickle_memory.py``), so a refusal costs at most that too;
* ``BUILD`` on anything but an instance of one of the ``buildable`` classes (DCP's metadata
  dataclasses), and any change to a container or instance after it was put into another
  object (which would make the sizes recorded above stale) — so also reference cycles;
* a dict key or set member that is not a string (``str``/``bytes``) or an instance of one of
  the ``key_classes``: ints, floats and tuples (``torch.Size`` too) hash without the process's
  secret (``hash(n) == n`` for small ints; a tuple's hash is a fixed function of its items'), so
  a file can hold 100,000 distinct keys with one hash, and inserting them into one dict costs
  ~N**2/2 comparisons (hash flooding: a 4 MB ``.metadata`` would hang every rank for minutes, a
  40 MB one for hours). Strings hash with the process's secret key; the ``key_classes``
  must be made hash-safe by the caller (:mod:`trainer.checkpoint.safe_metadata` does for DCP's
  ``MetadataIndex``); and for the same reason a call of a container that hashes its
  arguments' items itself (``OrderedDict(pairs)``, ``set([...])``, ``Counter(...)``):
  admitted with no arguments only;
* ``APPEND``/``SETITEM``/``ADDITEMS`` on anything but a list / dict (or ``OrderedDict``) / set,
  ``REDUCE``/``NEWOBJ`` on anything but a global, persistent ids (unless the caller's unpickler
  resolves them: ``torch.load``'s storages), the extension registry and out-of-band buffers,
  and memo indices out of sequence (CPython zero-fills a memo table of
  twice the largest index named: 14 bytes could ask for 24 GB).

The limits are far above what DCP writes (measured on real files: see the constants) and make
the unpickler's time and memory linear in the file size, whatever the file.
"""

from __future__ import annotations

import io
import pickletools
import sys
from collections.abc import Callable, Iterable
from typing import NamedTuple

#: Deepest nesting admitted. DCP metadata nests 12 levels (measured; ``Metadata`` -> its
#: state dict -> ``state_dict_metadata`` -> ``TensorStorageMetadata`` -> state -> ``chunks`` ->
#: chunk -> state -> ``torch.Size`` -> args tuple -> int); CPython's C recursion (hash, repr,
#: ==) is safe far beyond 100, and crashes near 100,000.
MAX_DEPTH = 100
#: Most opcodes walked: every opcode is at least one byte, so the byte cap of the caller bounds
#: it too; this bounds the walk for callers without one.
MAX_OPCODES = 1 << 30
#: Tree-size work admitted per opcode. Real DCP metadata needs ~4 (measured: every object
#: counted once per ancestor, most opcodes memo bookkeeping); a tuple DAG needs ``2**levels``.
WORK_PER_OPCODE = 64
#: Work always admitted, so tiny files are not judged by their ratio alone.
WORK_SLACK = 1 << 20
#: Bytes of memory admitted per byte of pickle, for the unpickler's objects and for the walk's
#: own records alike (each charged as it grows; the walk's are freed before unpickling). Real
#: DCP metadata (tracemalloc, 240 KB - 27 MB files of FSDP and single-process saves) unpickles
#: to 11-15x its size and the walk holds 10-15x; charged 15-19x (the most with short tensor
#: names, where objects outweigh text): 24 leaves real files a quarter to spare and bounds what
#: a hostile file costs before it is refused (the issue's 48 MB ``MEMOIZE`` file took 2.9 GB
#: when the walk's memo and records went uncharged; 16 MB of it now ~40 MB, refused in 2 s).
MEMORY_PER_BYTE = 24
#: Memory always admitted.
MEMORY_SLACK = 64 << 20
#: Saturation of tree sizes (Python ints are unbounded; a DAG's size is not worth computing).
_HUGE = 1 << 62


class PickleBombError(ValueError):
    """A pickle whose unpickling would take unbounded time, stack or memory, or whose ``BUILD``
    would change something other than a freshly made instance of an admitted class."""


class _Node:
    """What the walk knows of one object on the simulated stack or in the memo."""

    __slots__ = ("kind", "depth", "size", "value", "cls", "captured", "items", "text")

    def __init__(self, kind: str, depth: int = 1, size: int = 1, value: str | None = None,
                 cls: tuple[str, str] | None = None) -> None:
        self.kind = kind  # leaf, str, tuple, list, dict, set, frozenset, global, instance
        self.depth = depth
        self.size = size
        self.value = value  # a str constant's text (STACK_GLOBAL names a module and name so)
        self.cls = cls  # a global's (module, name); an instance's class
        self.captured = False  # put into another object: may no longer change
        self.items = 0  # a container's items (what BUILD copies into ``__dict__``)
        self.text = 0  # characters of a text, or of the texts directly in a tuple (a path's)


_LEAVES = ("INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4", "FLOAT", "BINFLOAT",
           "NONE", "NEWTRUE", "NEWFALSE", "EMPTY_TUPLE")
#: leaves the unpickler does not allocate (singletons, CPython's cached small ints)
_SHARED_LEAVES = frozenset({"NONE", "NEWTRUE", "NEWFALSE", "EMPTY_TUPLE", "BININT1"})
#: leaves of any size (the decoded number's ``sys.getsizeof`` is charged)
_LONG_LEAVES = frozenset({"INT", "LONG", "LONG1", "LONG4"})
_TEXT = ("STRING", "BINSTRING", "SHORT_BINSTRING", "UNICODE", "SHORT_BINUNICODE", "BINUNICODE",
         "BINUNICODE8", "BINBYTES", "SHORT_BINBYTES", "BINBYTES8", "BYTEARRAY8")
_NEVER = ("PERSID", "BINPERSID", "EXT1", "EXT2", "EXT4", "NEXT_BUFFER", "READONLY_BUFFER")

# What memory is charged, in two sums that only grow (nothing is refunded when an object is
# dropped), each held under the limit: ``memory``, what the unpickler will make (CPython's
# objects, its memo and its stack), and ``records``, what the walk itself holds (a record,
# :class:`_Node`, for each object in its memo or on its stack: the others are dropped once put
# into their container). The old single sum charged CPython's objects alone while the walk
# held a memo ``dict`` (~90 bytes an entry) and a record per object on its stack, so a file the
# walk admitted could cost 5-6x its estimate (``MEMOIZE`` x 48 MB: 2.9 GB). The figures are
# 64-bit CPython's (``sys.getsizeof``) rounded up to what ``tracemalloc`` measures at the peak
# of each shape of ``tests/trainer/checkpoint/test_pickle_memory.py``: dicts and sets at their
# emptiest
# after a resize, a growing array's old and new blocks both held while it is copied.
#: A pointer on a stack or in a list or memo: 8 bytes, up to ~24 while its array is copied.
_SLOT_BYTES = 32
#: The walk's record of one object in its memo or on its stack, and the pointer to it.
_RECORD_BYTES = 96 + _SLOT_BYTES
#: What the unpickler makes for an object of each kind (a text's size is added).
_BASE_BYTES = {"leaf": 32, "str": 0, "tuple": 40, "list": 56, "dict": 64, "set": 216,
               "frozenset": 216, "global": 0, "instance": 56}
#: ... and per item put into it: a list's pointer, a dict's entry (up to 60 bytes), a set's
#: (96), an ``OrderedDict``'s (a dict's and a node: ~100), an instance's attribute (a
#: ``__dict__`` entry, what ``BUILD`` or the class's ``__init__`` sets).
_ITEM_BYTES = {"tuple": 8, "list": _SLOT_BYTES, "dict": 60, "set": 96, "frozenset": 96,
               "instance": 60, "odict": 100, "leaf": 0, "str": 0, "global": 0}
#: An ``OrderedDict`` over a plain instance.
_ODICT_EXTRA_BYTES = 72
#: A memo slot: CPython keeps a pointer array sized to twice the largest index.
_MEMO_BYTES = 16
#: Longest path (in characters) a ``pathlib`` class may be called with: Linux's ``PATH_MAX``.
#: DCP pickles one only as a checkpoint's id; a path is split into a list of parts, and the
#: parts interned, so a call costs ~300 bytes and up to ~22 per character of its arguments
#: (measured), charged as _PATH_BYTES and _PATH_CHAR_BYTES.
PATH_MAX = 4096
_PATH_BYTES = 256
_PATH_CHAR_BYTES = 24
_ODICT = ("collections", "OrderedDict")


#: callables the walk admits (DCP's or torch's allow-lists) that would hash the items of their
#: arguments as keys: admitted with none (``pickle`` writes them so for protocol 4 dicts and
#: ``OrderedDict``; a protocol-2 ``set`` is ``set([...])``, refused)
_HASHING_CALLS = frozenset({
    *((module, name) for module in ("builtins", "__builtin__")  # protocol 2 names Python 2's
      for name in ("set", "frozenset", "dict")),
    ("collections", "OrderedDict"), ("collections", "Counter")})

_LEAF = _Node("leaf")
_LEAF_BYTES = _BASE_BYTES["leaf"]
assert sys.getsizeof(_LEAF) + _SLOT_BYTES <= _RECORD_BYTES  # noqa: S101 - the table's premise
#: what each empty-container opcode makes
_EMPTY_KINDS = {"EMPTY_LIST": "list", "EMPTY_DICT": "dict", "EMPTY_SET": "set"}


class _Walk:
    """The simulated unpickler: a stack, a mark stack (as CPython keeps them), a memo, and
    the counters. One method per opcode, found through :attr:`dispatch`."""

    def __init__(self, size: int, buildable: frozenset[tuple[str, str]], source: str,
                 key_classes: frozenset[tuple[str, str]] = frozenset(),
                 persistent_ids: bool = False) -> None:
        self.key_classes = key_classes
        self.stack: list[_Node] = []
        self.marks: list[int] = []
        self.memo: list[_Node] = []  # indices in sequence: a list, one pointer each
        self.buildable = buildable
        self.source = source
        self.work = 0
        self.memory = 0  # what the unpickler will hold, at most (see _BASE_BYTES)
        self.records = 0  # what this walk holds, at most (see _RECORD_BYTES)
        self.memory_limit = MEMORY_PER_BYTE * size + MEMORY_SLACK
        self.ops = 0
        self.deepest = 0  # the stack's deepest point so far (charged by its levels)
        self.dispatch: dict[str, Callable[[object], None]] = {
            **{name: self.op_leaf for name in _LEAVES},
            **{name: self.op_text for name in _TEXT},
            **{name: self.op_never for name in _NEVER},
            "PROTO": self.op_nothing, "FRAME": self.op_nothing, "MARK": self.op_mark,
            "EMPTY_LIST": self.op_empty, "EMPTY_DICT": self.op_empty, "EMPTY_SET": self.op_empty,
            "TUPLE": self.op_tuple, "TUPLE1": self.op_tuple_n, "TUPLE2": self.op_tuple_n,
            "TUPLE3": self.op_tuple_n, "LIST": self.op_list, "DICT": self.op_dict,
            "FROZENSET": self.op_frozenset, "APPEND": self.op_append,
            "APPENDS": self.op_appends, "SETITEM": self.op_setitem,
            "SETITEMS": self.op_setitems, "ADDITEMS": self.op_additems,
            "GLOBAL": self.op_global, "STACK_GLOBAL": self.op_stack_global,
            "REDUCE": self.op_reduce, "NEWOBJ": self.op_reduce, "NEWOBJ_EX": self.op_newobj_ex,
            "INST": self.op_inst, "OBJ": self.op_obj, "BUILD": self.op_build,
            "POP": self.op_pop, "POP_MARK": self.op_pop_mark, "DUP": self.op_dup,
            "MEMOIZE": self.op_memoize, "PUT": self.op_put, "BINPUT": self.op_put,
            "LONG_BINPUT": self.op_put, "GET": self.op_get, "BINGET": self.op_get,
            "LONG_BINGET": self.op_get,
        }
        if persistent_ids:
            self.dispatch["PERSID"] = self.op_persid
            self.dispatch["BINPERSID"] = self.op_binpersid
        self.name = ""

    def fail(self, why: str) -> PickleBombError:
        return PickleBombError(f"{self.source}: {why}; refusing to load it")

    # -- the stack -----------------------------------------------------------------------

    def deeper(self) -> None:
        """Charge the stack's new deepest point: the unpickler's holds a pointer a level, the
        walk's a pointer and a record."""
        levels = len(self.stack) - self.deepest
        self.deepest += levels
        self.memory += levels * _SLOT_BYTES
        self.records += levels * _RECORD_BYTES
        self.check_memory()

    def pop(self) -> _Node:
        if len(self.stack) <= (self.marks[-1] if self.marks else 0):
            raise self.fail(f"{self.name} takes more objects than the stack holds")
        return self.stack.pop()

    def top(self) -> _Node:
        if len(self.stack) <= (self.marks[-1] if self.marks else 0):
            raise self.fail(f"{self.name} needs an object where there is none")
        return self.stack[-1]

    def pop_mark(self) -> list[_Node]:
        if not self.marks:
            raise self.fail(f"{self.name} needs a MARK that is not there")
        at = self.marks.pop()
        items = self.stack[at:]
        del self.stack[at:]
        return items

    # -- objects -------------------------------------------------------------------------

    def charge(self, kind: str, items: int, *, base: bool = True) -> None:
        self.memory += (_BASE_BYTES[kind] if base else 0) + _ITEM_BYTES[kind] * items
        if self.memory > self.memory_limit:
            self.check_memory()

    def check_memory(self) -> None:
        if self.memory > self.memory_limit:
            raise self.fail(f"unpickling would take more than {self.memory_limit:,} bytes "
                            "of memory")
        if self.records > self.memory_limit:
            raise self.fail(f"checking it would take more than {self.memory_limit:,} bytes "
                            "of memory (its objects are held on the stack or in the memo)")

    def capture(self, children: Iterable[_Node], parent: _Node | None) -> tuple[int, int]:
        depth, size = 0, 0
        for child in children:
            if child is parent:
                raise self.fail("an object contains itself (a reference cycle)")
            child.captured = True
            if child.depth > depth:
                depth = child.depth
            size += child.size
        size = min(size, _HUGE)
        self.work += size
        if self.work > WORK_PER_OPCODE * self.ops + WORK_SLACK:
            raise self.fail("objects are reused so often that unpickling would take "
                            "time exponential in the file size (a memo DAG)")
        return depth, size

    def make(self, kind: str, children: list[_Node], *, cls: tuple[str, str] | None = None,
             items: int | None = None) -> _Node:
        """A new ``kind`` made of ``children``, charged as holding ``items`` (all of them unless
        told: a call holds what its arguments hold, not the callable and the tuple)."""
        depth, size = self.capture(children, None)
        if depth >= MAX_DEPTH:
            raise self.fail(f"objects nested deeper than {MAX_DEPTH} levels")
        self.charge(kind, len(children) if items is None else items)
        node = _Node(kind, depth + 1, min(size + 1, _HUGE), cls=cls)
        node.items = len(children)
        if kind == "tuple":
            node.text = sum(child.text for child in children)
        self.stack.append(node)
        return node

    def grow(self, target: _Node, children: list[_Node], items: int) -> None:
        """Put ``children`` into ``target`` (APPEND, SETITEM, BUILD ...) in place."""
        if target.captured:
            raise self.fail("an object is changed after it was put into another one")
        depth, size = self.capture(children, target)
        if depth >= MAX_DEPTH:
            raise self.fail(f"objects nested deeper than {MAX_DEPTH} levels")
        target.depth = max(target.depth, depth + 1)
        target.size = min(target.size + size, _HUGE)
        target.items += items
        self.charge("odict" if target.cls == _ODICT else target.kind, items, base=False)

    def container(self, kind: str) -> _Node:
        target = self.top()
        if target.kind == kind or (kind == "dict" and target.kind == "instance"
                                   and target.cls == _ODICT):
            return target
        raise self.fail(f"{self.name} adds items to a {target.kind}, not a {kind}")

    def keys(self, keys: Iterable[_Node]) -> None:
        """Refuse dict keys and set members whose hash a file can choose (see the module doc)."""
        for key in keys:
            if key.kind == "str" or (key.kind == "instance" and key.cls in self.key_classes):
                continue
            what = ".".join(key.cls) if key.kind == "instance" and key.cls else key.kind
            if what == "leaf":
                what = "number or constant"
            raise self.fail(
                f"a {what} as a dict key or set member ({self.name}): its hash takes no secret, "
                "so a file can give thousands of keys one hash and make building the dict "
                "take time quadratic in their number (hash flooding)")

    def instance(self, func: _Node, args: list[_Node]) -> None:
        if func.kind != "global":
            raise self.fail(f"{self.name} calls a {func.kind}, not a named class or function")
        if func.cls in _HASHING_CALLS:
            # positional arguments (INST, OBJ), or the args tuple / kwargs dict (REDUCE, NEWOBJ)
            given = args if self.name in ("INST", "OBJ") else [a for a in args if not (
                a.kind == "leaf" or (a.kind in ("tuple", "dict") and a.items == 0))]
            if given:
                raise self.fail(
                    f"{'.'.join(func.cls)} called with arguments ({self.name}): it would hash "
                    "their items as keys unchecked (hash flooding); its items may come only "
                    "through SETITEMS/ADDITEMS")
        extra = _ODICT_EXTRA_BYTES if func.cls == _ODICT else 0
        if func.cls is not None and func.cls[0] == "pathlib":
            text = sum(a.text for a in args)
            if text > PATH_MAX:
                raise self.fail(f"a path of {text:,} characters, more than any checkpoint's "
                                f"(PATH_MAX {PATH_MAX:,})")
            extra = _PATH_BYTES + _PATH_CHAR_BYTES * text
        # what a call keeps of its arguments: an attribute of a dataclass each, a Size's or a
        # path's copy of a tuple's items
        self.memory += extra
        self.make("instance", [func, *args], cls=func.cls,
                  items=sum(a.items for a in args) if self.name not in ("INST", "OBJ")
                  else len(args))

    # -- opcodes -------------------------------------------------------------------------

    def op_nothing(self, arg: object) -> None:
        pass

    def op_never(self, arg: object) -> None:
        raise self.fail(f"opcode {self.name} (persistent ids, extensions and out-of-band "
                        "buffers are not allowed)")

    def op_persid(self, arg: object) -> None:
        self.op_leaf(arg)  # an object the caller's unpickler resolves (a tensor's storage)

    def op_binpersid(self, arg: object) -> None:
        self.capture([self.pop()], None)  # the id: counted, then replaced by what it names
        self.op_leaf(arg)

    def op_leaf(self, arg: object) -> None:
        self.stack.append(_LEAF)  # immutable and childless: one node serves all
        # charge("leaf", 0), inlined: a third of all opcodes
        if self.name in _SHARED_LEAVES:
            return
        self.memory += sys.getsizeof(arg) if self.name in _LONG_LEAVES else _LEAF_BYTES
        if self.memory > self.memory_limit:
            self.check_memory()  # raises

    def op_text(self, arg: object) -> None:
        node = _Node("str", value=arg if isinstance(arg, str) else None)
        node.text = len(arg) if isinstance(arg, str | bytes | bytearray) else 0
        self.stack.append(node)
        # the text, and the bytes a non-ASCII one is decoded from (both held at once); the
        # record holds a ``str`` too
        size = sys.getsizeof(arg)
        if isinstance(arg, str):
            if not arg.isascii():
                size *= 2
            self.records += size
        self.memory += size
        self.check_memory()

    def op_mark(self, arg: object) -> None:
        self.marks.append(len(self.stack))

    def op_empty(self, arg: object) -> None:
        # make(kind, []) inlined: an empty container has no children to capture (no work, no
        # depth) and is a fresh node at depth 1. It is a memory bomb's opcode, walked ~11 M
        # times before 20 MB of EMPTY_DICT is refused, so its cost is what a refusal costs
        # (tests/trainer/checkpoint/test_pickle_bombs.py's two bomb tests: less than half the time)
        kind = _EMPTY_KINDS[self.name]
        self.memory += _BASE_BYTES[kind]
        if self.memory > self.memory_limit:
            self.check_memory()  # raises
        self.stack.append(_Node(kind))

    def op_tuple(self, arg: object) -> None:
        self.make("tuple", self.pop_mark())

    def op_tuple_n(self, arg: object) -> None:
        n = int(self.name[-1])
        stack = self.stack
        if len(stack) - n < (self.marks[-1] if self.marks else 0):
            raise self.fail(f"{self.name} takes more objects than the stack holds")
        items = stack[-n:]
        del stack[-n:]
        self.make("tuple", items)

    def op_list(self, arg: object) -> None:
        self.make("list", self.pop_mark())

    def op_dict(self, arg: object) -> None:
        items = self.pop_mark()
        if len(items) % 2:
            raise self.fail("DICT with an odd number of items")
        self.keys(items[0::2])
        self.make("dict", items)

    def op_frozenset(self, arg: object) -> None:
        items = self.pop_mark()
        self.keys(items)
        self.make("frozenset", items)

    def op_append(self, arg: object) -> None:
        item = self.pop()
        self.grow(self.container("list"), [item], 1)

    def op_appends(self, arg: object) -> None:
        items = self.pop_mark()
        self.grow(self.container("list"), items, len(items))

    def op_setitem(self, arg: object) -> None:
        value = self.pop()
        key = self.pop()
        self.keys((key,))
        self.grow(self.container("dict"), [key, value], 1)

    def op_setitems(self, arg: object) -> None:
        items = self.pop_mark()
        if len(items) % 2:
            raise self.fail("SETITEMS with an odd number of items")
        self.keys(items[0::2])
        self.grow(self.container("dict"), items, len(items) // 2)

    def op_additems(self, arg: object) -> None:
        items = self.pop_mark()
        self.keys(items)
        self.grow(self.container("set"), items, len(items))

    def op_global(self, arg: object) -> None:
        module, _, qualname = str(arg).partition(" ")
        self.stack.append(_Node("global", cls=(module, qualname)))

    def op_stack_global(self, arg: object) -> None:
        qualname = self.pop()
        module = self.pop()
        if module.value is None or qualname.value is None:
            raise self.fail("STACK_GLOBAL on something other than two strings")
        self.stack.append(_Node("global", cls=(module.value, qualname.value)))

    def op_reduce(self, arg: object) -> None:
        args = self.pop()
        self.instance(self.pop(), [args])

    def op_newobj_ex(self, arg: object) -> None:
        kwargs = self.pop()
        args = self.pop()
        self.instance(self.pop(), [args, kwargs])

    def op_inst(self, arg: object) -> None:
        module, _, qualname = str(arg).partition(" ")
        self.instance(_Node("global", cls=(module, qualname)), self.pop_mark())

    def op_obj(self, arg: object) -> None:
        items = self.pop_mark()
        if not items:
            raise self.fail("OBJ without a class")
        self.instance(items[0], items[1:])

    def op_build(self, arg: object) -> None:
        state = self.pop()
        target = self.top()
        if target.kind != "instance" or target.cls not in self.buildable:
            what = f"{target.kind} {'.'.join(target.cls) if target.cls else ''}".strip()
            raise self.fail(f"BUILD (setstate) on a {what}, not on DCP checkpoint metadata")
        self.grow(target, [state], state.items)

    def op_pop(self, arg: object) -> None:
        if self.marks and self.marks[-1] == len(self.stack):
            self.marks.pop()
        else:
            self.pop()

    def op_pop_mark(self, arg: object) -> None:
        self.pop_mark()

    def op_dup(self, arg: object) -> None:
        self.stack.append(self.top())

    def op_memoize(self, arg: object) -> None:
        self.memo.append(self.top())
        self.memory += _MEMO_BYTES
        self.records += _RECORD_BYTES  # the record now outlives its use
        if self.records > self.memory_limit:
            self.check_memory()  # raises

    def op_put(self, arg: object) -> None:
        if not isinstance(arg, int) or not 0 <= arg <= len(self.memo):
            raise self.fail(f"memo index {arg} out of sequence (next is {len(self.memo)})")
        if arg == len(self.memo):
            self.memo.append(self.top())
        else:
            self.memo[arg] = self.top()
        self.memory += _MEMO_BYTES
        self.records += _RECORD_BYTES
        if self.records > self.memory_limit:
            self.check_memory()  # raises

    def op_get(self, arg: object) -> None:
        if not isinstance(arg, int) or not 0 <= arg < len(self.memo):
            raise self.fail(f"fetches memo index {arg}, never stored")
        self.stack.append(self.memo[arg])


class Cost(NamedTuple):
    """What :func:`check_pickle` charged a pickle it admitted, in bytes: at most what unpickling
    it will hold (``memory``) and what the walk held (``records``)."""

    memory: int
    records: int


def check_pickle(data: bytes, buildable: frozenset[tuple[str, str]], source: str = "pickle",
                 *, on_global: Callable[[str, str], None] | None = None,
                 key_classes: frozenset[tuple[str, str]] = frozenset(),
                 persistent_ids: bool = False) -> Cost:
    """Raise :class:`PickleBombError` unless unpickling ``data`` is bounded (see the module
    doc); what it will cost otherwise. ``buildable``: the ``(module, name)`` of the classes
    whose instances ``BUILD`` may set the state of. ``on_global`` sees every global named (to
    refuse early).
    ``key_classes``: the classes whose instances may be dict keys or set members besides
    strings; the caller unpickles them with a hash a file cannot choose. ``persistent_ids``:
    admit them (the caller's unpickler resolves each to one object, as ``torch.load`` does a
    tensor's storage); refused otherwise."""
    walk = _Walk(len(data), buildable, source, key_classes, persistent_ids)
    dispatch, stack = walk.dispatch, walk.stack
    # The loop is ``_Walk.step`` inlined (it runs once per opcode: ~1.2 us each, of which a
    # method call was a tenth).
    try:
        for op, arg, _pos in pickletools.genops(io.BytesIO(data)):
            name = op.name
            if name == "STOP":
                if len(walk.stack) != 1 or walk.marks:
                    raise walk.fail("STOP with other than one object on the stack")
                return Cost(walk.memory, walk.records)
            walk.ops += 1
            if walk.ops > MAX_OPCODES:
                raise walk.fail(f"more than {MAX_OPCODES:,} opcodes")
            handler = dispatch.get(name)
            if handler is None:
                raise walk.fail(f"unexpected opcode {name}")
            walk.name = name
            handler(arg)
            if len(stack) > walk.deepest:
                walk.deeper()
            if on_global is not None and name in _NAMING:
                cls = walk.stack[-1].cls
                assert cls is not None
                try:
                    on_global(*cls)
                except Exception as exc:  # noqa: BLE001  (its own error, passed on unwrapped)
                    raise _CallerError(exc) from None
    except PickleBombError:
        raise
    except _CallerError as wrapped:
        raise wrapped.error from None
    except Exception as exc:  # malformed opcodes or arguments (pickletools' ValueError)
        raise PickleBombError(f"{source}: unreadable pickle ({type(exc).__name__}: "
                              f"{exc})"[:500]) from None
    raise walk.fail("no STOP opcode (truncated)")


#: opcodes that name a global (``on_global`` sees each)
_NAMING = frozenset({"GLOBAL", "STACK_GLOBAL", "INST"})


class _CallerError(Exception):
    """``on_global``'s own error, carried through the walk's handler of malformed pickles."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error
