"""Grade a task without trusting the student's kernel: the checker runs in the grader.

``attention-course grade`` executes a submission in a Jupyter kernel, where every name
is the student's to rebind: ``attention_course.checks``, ``torch.allclose``,
``Tensor.__eq__``, what is printed. So the grader never runs a checker there. It runs
the same checkers, in its own process, on *proxies* of the student's objects:

* **kernel side** (:func:`serve`): started by one probe cell per task, it connects to a
  private Unix socket (a fresh 0700 temporary folder, and a random token that only the
  probe's code holds) and serves requests until told to stop: look up a name, call an
  object or a method, get or set an attribute, run backward on the kept graph of a call,
  register a recording forward hook.
* **grader side** (:class:`Client` and the proxies): a student's function becomes a
  :class:`RemoteFunction`; a class becomes a local class of the same name, built by
  :class:`RemoteClassMeta` on :class:`RemoteModule` (an ``nn.Module`` subclass) when the
  student's class subclasses ``nn.Module``, else on :class:`RemoteObject`, so that
  ``isinstance``/``issubclass`` hold exactly when they hold for the real candidate and
  ``class_problem``/``function_problem`` say the same thing. Its instances forward
  every attribute and call. Plain values (numbers, text, tuples, tensors) cross *by
  value*.

Every message is JSON plus the raw bytes of its tensors (:func:`_send`, :func:`_recv`):
reading one builds only tuples, lists, dicts, numbers, text and plain tensors, then the
grader checks them against the protocol's tags. Nothing of the student's is ever
unpickled, called or compared in the grader (the grader's own objects may go to the
kernel pickled: that direction is safe).
Inputs, reference outputs, comparisons and diagnoses stay in the grader; the inputs are
drawn from the run's seed (:func:`grade_task`'s ``seed``), which the kernel never sees.

What crosses the boundary, so that the checkers see what they would see in-process:

* autograd: a call whose outputs have a graph in the kernel goes through
  :class:`_RemoteCall`, a ``torch.autograd.Function`` whose backward sends the upstream
  gradients to the kernel, runs backward there and returns the inputs' gradients;
  parameters' gradients come back with ``named_parameters()`` after backward;
* in-place changes: the kernel reports each tensor argument whose value the call
  changed, and the grader writes it back into its own argument, so ``call_student``
  notices;
* a watched argument (a :class:`~attention_course.checks._watch.WriteWatch`, which notes
  indexed writes whose index repeats) is marked: the kernel wraps it in the same class and
  sends back the writes it noted, which the grader adds to its own record;
* the random state, grad mode and default dtype travel with each call (dropout cases
  seed the generator; ``torch.no_grad()`` blocks);
* built-ins that a checker forbids while a case runs (it patches ``F.<name>`` in the
  grader) are forbidden in the kernel during the call, with the same message;
* forward hooks a checker registers on a submodule record in the kernel and are
  replayed in the grader, on the recorded values, when the call returns;
* a *served* object (its class declares ``served_while_grading``: exercise 13's model
  and its cache) is never sent: the kernel gets a stand-in (:class:`_Served`) whose call,
  and the methods and attributes the class offers, come back to the grader as callbacks
  while it waits for the call, and run here on plain data (tensors by value, at most
  ``MAX_SERVED_ELEMENTS`` elements each; never an object of the kernel's); their CPU time
  counts towards the call's limit;
* an exception comes back as one of the same name and message, with the student's
  line, so that ``describe_exception`` writes the same text.

Nothing here watches what the student's code calls: in the sandbox the kernel imports
the exercise's build of the package (`attention_course.grading.absent`), where every
reference the exercise does not hand out is a stub that raises NotAvailableWhileGrading,
so a candidate that calls one fails its cases (and the grader says which reference it
called). The server part (:func:`serve` and what it uses) is real in every build.

A call that runs over its limit interrupts the kernel; a kernel that does not come back
makes :class:`KernelLost` (``reason`` says "hung" or "died"), for the grader to report.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import importlib
import inspect
import itertools
import json
import os
import socket
import struct
import sys
import threading
import time
import traceback
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

MAX_MESSAGE = 1 << 30  # bytes: a reply larger than this is refused
MAX_ITEMS = 100_000  # items of a list, tuple, dict or iterator sent back
MAX_DEPTH = 32  # nesting of containers sent back
INTERRUPT_GRACE = 5.0  # seconds a kernel has to come back after an interrupt
WALL_FACTOR = 10.0  # a CPU-time limit's wall-time guard: this many times the limit
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # attention_course/
_THIS_FILE = os.path.abspath(__file__)
_CHECKS_DIR = os.path.join(_PACKAGE_DIR, "checks") + os.sep


class SandboxError(Exception):
    """The kernel broke the protocol (a malformed or forbidden reply)."""

    remote_frame = None  # describe_exception: no line of the grader's to show


class KernelLost(Exception):
    """The kernel stopped answering: ``reason`` is "hung" or "died"."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class TimeLimitExceeded(KernelLost):
    """A call of the student's code spent its CPU-time limit and was interrupted."""

    remote_frame = None  # `describe_exception`: no line to show (the grader's, not theirs)


# ---------------------------------------------------------------- the wire


def _encode_atom(value: object) -> tuple | None:
    """The wire form of a value both sides send as it is (None, a bool, int, float or str of
    the exact type, a dtype, a device, a ``torch.Size``); ``None`` for anything else."""
    if value is None or type(value) in (bool, int, float, str):
        return ("v", value)
    if isinstance(value, torch.dtype):
        return ("dtype", str(value))
    if isinstance(value, torch.device):
        return ("device", str(value))
    if isinstance(value, torch.Size):
        return ("size", [int(s) for s in value])
    return None


def _pack(obj: object, buffers: list):
    """``obj`` as JSON-ready data; each tensor's bytes go to ``buffers``. Tuples stay JSON
    arrays; lists, dicts and tensors become one-key objects ("l", "d", "t")."""
    if obj is None or type(obj) in (bool, int, float, str):
        return obj
    if type(obj) is tuple:
        return [_pack(v, buffers) for v in obj]
    if type(obj) is list:
        return {"l": [_pack(v, buffers) for v in obj]}
    if type(obj) is dict:
        return {"d": [[_pack(k, buffers), _pack(v, buffers)] for k, v in obj.items()]}
    if type(obj) in (torch.Tensor, nn.Parameter):
        t = obj.detach()
        head = {"t": len(buffers), "dtype": str(t.dtype), "shape": list(t.shape)}
        head["device"] = str(t.device)
        if t.device.type == "meta":
            buffers.append(b"")
        else:
            flat = t.cpu().resolve_conj().resolve_neg().contiguous().reshape(-1)
            buffers.append(flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b"")
        return head
    raise TypeError(f"cannot send a {type(obj).__name__}")


def _unpack(obj, buffers: list):
    """The inverse of :func:`_pack`: builds only tuples, lists, dicts, plain values and
    plain tensors."""
    if obj is None or type(obj) in (bool, int, float, str):
        return obj
    if type(obj) is list:
        return tuple(_unpack(v, buffers) for v in obj)
    if type(obj) is dict and len(obj) in (1, 4):
        if "l" in obj and type(obj["l"]) is list:
            return [_unpack(v, buffers) for v in obj["l"]]
        if "d" in obj and type(obj["d"]) is list:
            return {_unpack(k, buffers): _unpack(v, buffers) for k, v in obj["d"]}
        if "t" in obj:
            dtype = getattr(torch, str(obj["dtype"]).removeprefix("torch."), None)
            if not isinstance(dtype, torch.dtype):
                raise SandboxError("a tensor of an unknown dtype")
            shape = [int(n) for n in obj["shape"]]
            device = torch.device(str(obj["device"]))
            data = buffers[int(obj["t"])]
            if device.type == "meta":
                return torch.empty(shape, dtype=dtype, device="meta")
            if not data:
                return torch.empty(shape, dtype=dtype).to(device)
            flat = torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dtype)
            return flat.reshape(shape).to(device)
    raise SandboxError("a malformed message")


def _send(sock: socket.socket, obj: object) -> None:
    buffers: list = []
    head = json.dumps(_pack(obj, buffers)).encode()
    parts = [head, *buffers]
    frame = struct.pack(f"!{1 + len(parts)}Q", len(parts), *(len(p) for p in parts))
    sock.sendall(frame + b"".join(parts))


def _read_exact(sock: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise EOFError("the connection closed")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _recv(sock: socket.socket) -> object:
    """One message: JSON and raw tensor bytes, read as data only (never unpickled: nothing
    of the sender's can run here)."""
    (count,) = struct.unpack("!Q", _read_exact(sock, 8))
    if not 1 <= count <= MAX_ITEMS:
        raise SandboxError(f"a message of {count} parts")
    sizes = struct.unpack(f"!{count}Q", _read_exact(sock, 8 * count))
    if sum(sizes) > MAX_MESSAGE:
        raise SandboxError(f"a message of {sum(sizes)} bytes is over the limit")
    head, *buffers = [_read_exact(sock, size) for size in sizes]
    return _unpack(json.loads(head.decode()), buffers)


# ================================================================ kernel side


def _frame_of(error: BaseException) -> tuple | None:
    """(line number, function, line) of the innermost frame of the student's code: not the
    package's (a reference the exercise hands out raises in `_validate.py`), nor PyTorch's."""
    torch_dir = os.path.dirname(os.path.abspath(torch.__file__))
    for frame in reversed(traceback.extract_tb(error.__traceback__)):
        path = os.path.abspath(frame.filename)
        if path == _THIS_FILE or path.startswith((_PACKAGE_DIR + os.sep, torch_dir + os.sep)):
            continue
        if path == os.path.abspath(threading.__file__):
            continue
        return (int(frame.lineno or 0), str(frame.name), str(frame.line or ""))
    return None


class _Server:
    """Serve the grader's requests on ``namespace`` (the notebook's globals)."""

    def __init__(self, namespace: dict, sock: socket.socket) -> None:
        self.namespace = namespace
        self.sock = sock
        self.objects: dict[int, object] = {}
        self.ids: dict[int, int] = {}  # id(obj) -> our id, while we hold obj
        self.calls: dict[int, tuple] = {}  # call id -> (inputs, differentiable outputs)
        self.hooks: dict[int, object] = {}
        self.events: list = []
        self.sent_modules: list = []  # the grader's modules passed to the current call
        self.watch: type | None = None  # WriteWatch, once the grader has sent a watched tensor
        self.served: dict[int, _Served] = {}  # stand-ins of the grader's served objects
        self.lock = threading.Lock()  # one callback at a time on the socket

    # -- encoding what goes back
    def ref(self, obj: object) -> tuple:
        key = self.ids.get(id(obj))
        if key is None or self.objects.get(key) is not obj:
            key = len(self.objects) + 1
            self.objects[key] = obj
            self.ids[id(obj)] = key
        if isinstance(obj, type):
            kind = "class"
            info = {"module_class": issubclass(obj, nn.Module)}
        elif isinstance(obj, nn.Module):
            kind, info = "module", {}
        elif callable(obj):
            kind, info = "function", {}
        else:
            kind, info = "object", {}
        if kind == "module":
            # the torch.nn class it is (nn.Linear, nn.Embedding...), so that the grader's
            # stand-in answers ``isinstance(x, nn.Linear)`` as the real object would
            for base in type(obj).__mro__:
                where = str(getattr(base, "__module__", ""))
                if base is not nn.Module and where.startswith("torch.nn.modules."):
                    info["torch_class"] = f"{where}.{base.__qualname__}"
                    break
        named = obj if isinstance(obj, type) or kind == "function" else type(obj)
        info.update(
            kind=kind,
            type=str(type(obj).__name__),
            name=str(getattr(named, "__name__", type(obj).__name__)),
            qualname=str(getattr(named, "__qualname__", "")),
            module=str(getattr(obj, "__module__", "") or ""),
        )
        return ("ref", key, info)

    def tensor(self, value: torch.Tensor, graph: list | None) -> tuple:
        plain = torch.Tensor._make_subclass(torch.Tensor, value.detach(), False)
        data = plain.clone() if value.device.type != "meta" else plain
        grad = None
        if value.is_leaf and value.grad is not None:
            grad = torch.Tensor._make_subclass(torch.Tensor, value.grad.detach(), False).clone()
        index = -1
        if graph is not None and value.requires_grad:
            graph.append(value)
            index = len(graph) - 1
        return ("t", data, bool(value.requires_grad), grad, isinstance(value, nn.Parameter), index)

    def encode(self, value: object, graph: list | None = None, depth: int = 0) -> tuple:
        if depth > MAX_DEPTH:
            return self.ref(value)
        if type(value) in (torch.Tensor, nn.Parameter):  # a subclass stays in the kernel
            return self.tensor(value, graph)
        if self.watch is not None and type(value) is self.watch:  # one the grader sent
            return self.tensor(value, graph)
        if type(value) is _Served:
            return ("served", object.__getattribute__(value, "_key"))
        atom = _encode_atom(value)
        if atom is not None:
            return atom
        if type(value).__module__ == "numpy" and hasattr(value, "dtype"):
            try:
                array = __import__("numpy").asarray(value)
                return ("np", torch.from_numpy(array.copy()), str(array.dtype), array.ndim == 0)
            except (TypeError, ValueError, RuntimeError):
                return self.ref(value)
        for base in (bool, int, float, str):  # a subclass of a plain type: its plain value
            if isinstance(value, base):
                return ("v", base(value))
        if isinstance(value, (tuple, list)) and len(value) <= MAX_ITEMS:
            tag = "list" if isinstance(value, list) else "tuple"
            return (tag, [self.encode(v, graph, depth + 1) for v in value])
        if isinstance(value, dict) and len(value) <= MAX_ITEMS:
            items = [
                (self.encode(k, graph, depth + 1), self.encode(v, graph, depth + 1))
                for k, v in value.items()
            ]
            return ("dict", items)
        if inspect.isgenerator(value):
            items = []
            for item in value:
                if len(items) >= MAX_ITEMS:
                    break
                items.append(self.encode(item, graph, depth + 1))
            return ("iter", items)
        return self.ref(value)

    # -- decoding what the grader sent
    def decode(self, value, inputs: list):
        tag = value[0]
        if tag == "v":
            return value[1]
        if tag == "t":
            tensor = value[1]
            if len(value) > 3 and value[3] == "watch":  # the grader's WriteWatch: the same here
                from ..checks._watch import WriteWatch

                self.watch = WriteWatch
                tensor = tensor.as_subclass(WriteWatch)
            if value[2]:
                tensor.requires_grad_(True)
                inputs.append(tensor)
            else:
                inputs.append(None)
            return tensor
        if tag == "ref":
            return self.objects[value[1]]
        if tag == "served":  # the grader's object, used by reference (it runs there)
            key = int(value[1])
            if key not in self.served:
                self.served[key] = _Served(self, key, value[2])
            return self.served[key]
        if tag in ("module", "obj"):  # the grader's own object, pickled by the grader
            import pickle

            obj = pickle.loads(value[1].numpy().tobytes())
            if tag == "module":
                self.sent_modules.append(obj)
            return obj
        if tag == "dtype":
            return getattr(torch, value[1].removeprefix("torch."))
        if tag == "device":
            return torch.device(value[1])
        if tag == "slice":
            return slice(*value[1])
        if tag == "size":
            return torch.Size(value[1])
        if tag in ("tuple", "list", "iter"):
            items = [self.decode(v, inputs) for v in value[1]]
            return tuple(items) if tag == "tuple" else iter(items) if tag == "iter" else items
        if tag == "dict":
            return {self.decode(k, inputs): self.decode(v, inputs) for k, v in value[1]}
        raise ValueError(f"unknown tag {tag!r}")

    def callback(self, op: str, key: int, name: str | None, args=(), kwargs=None):
        """Ask the grader to run a served object's call (``op`` "call", ``name`` a method or
        None) or attribute read ("getattr"), while the grader waits for the current call."""
        # a range (positions as `range(T)`) goes as the list it is, as torch.as_tensor reads it
        args = tuple(list(a) if type(a) is range else a for a in args)
        kwargs = {k: list(v) if type(v) is range else v for k, v in (kwargs or {}).items()}
        payload = self.encode((args, kwargs))
        with self.lock:
            _send(self.sock, ("callback", op, key, name, payload, torch.is_grad_enabled()))
            reply = _recv(self.sock)
        if reply[0] == "error":
            _, name, text, _, kind = reply
            import builtins

            base = getattr(builtins, str(kind), Exception)
            if not (isinstance(base, type) and issubclass(base, Exception)):
                base = Exception
            raise type(str(name), (base,), {})(text)
        return self.decode(reply[1], [])

    def error(self, error: BaseException) -> tuple:
        # the nearest built-in exception class, so that the grader's `except ValueError`
        # (or NotImplementedError, ...) catches what it would catch in-process
        kind = next(
            (c.__name__ for c in type(error).__mro__ if c.__module__ == "builtins"),
            "Exception",
        )
        try:
            text = str(error)
        except BaseException:  # noqa: BLE001 - a student's __str__ may raise
            text = ""
        return ("error", str(type(error).__name__), text, _frame_of(error), kind)

    # -- requests
    def handle(self, request: tuple) -> tuple:
        op = request[0]
        if op == "lookup":
            name = request[1]
            if name not in self.namespace:
                return ("missing",)
            return ("ok", self.encode(self.namespace[name]))
        if op == "getattr":
            return ("ok", self.encode(getattr(self.objects[request[1]], request[2])))
        if op == "setattr":
            setattr(self.objects[request[1]], request[2], self.decode(request[3], []))
            return ("ok", ("v", None))
        if op == "truth":
            return ("ok", ("v", bool(self.objects[request[1]])))
        if op == "call":
            return self.call(*request[1:])
        if op == "backward":
            return self.backward(request[1], request[2])
        if op == "hook":
            return self.add_hook(request[1], request[2])
        if op == "unhook":
            handle = self.hooks.pop(request[1], None)
            if handle is not None:
                handle.remove()
            return ("ok", ("v", None))
        raise ValueError(f"unknown request {op!r}")

    def call(self, key: int, method: str | None, args, kwargs, options: dict) -> tuple:
        target = self.objects[key]
        if method is not None and method != "__iter__":
            target = getattr(target, method)
        inputs: list = []
        self.sent_modules = []
        args = self.decode(args, inputs)
        kwargs = self.decode(kwargs, inputs)
        leaves = [t for t in inputs if t is not None]
        tensors = _flat_tensors((args, kwargs))
        if options["rng"] is not None:  # None: the kernel's state is the grader's already
            torch.set_rng_state(options["rng"])
        rng_before = torch.get_rng_state()
        dtype = torch.get_default_dtype()
        torch.set_default_dtype(getattr(torch, options["dtype"].removeprefix("torch.")))
        self.events = []
        watched = self.watch is not None and any(type(t) is self.watch for t in tensors)
        if watched:
            self.watch.repeated = []
        try:
            with (
                torch.set_grad_enabled(options["grad"]),
                _forbidden(options["forbid"]),
                _recording(bool(options.get("sizes"))) as largest,
            ):
                if method == "__iter__":
                    result = list(itertools.islice(iter(self.objects[key]), MAX_ITEMS))
                else:
                    result = target(*args, **kwargs)
        finally:
            torch.set_default_dtype(dtype)
        # every tensor argument as it is after the call: the grader compares
        after = [self.tensor(t, None) if t.device.type != "meta" else None for t in tensors]
        # and the state of every module the grader sent, which the call may have changed
        modules = [
            [(str(k), self.tensor(v, None)) for k, v in m.state_dict().items()]
            for m in self.sent_modules
        ]
        graph: list = []
        encoded = self.encode(result, graph)
        # An output with a graph, or an input returned as it is, is differentiable.
        differentiable = [
            i
            for i, t in enumerate(graph)
            if t.grad_fn is not None or any(t is leaf for leaf in leaves)
        ]
        rng_after = torch.get_rng_state()
        call_id = len(self.calls) + 1
        self.calls[call_id] = (inputs, [graph[i] for i in differentiable])
        events, self.events = self.events, []
        return (
            "ok",
            encoded,
            {
                "call": call_id,
                "differentiable": differentiable,
                "after": after,
                "modules": modules,
                "rng": None if torch.equal(rng_after, rng_before) else rng_after,
                "events": events,
                "largest": None if largest is None else largest.largest.as_wire(),
                "repeated": _repeated_indices(self.watch.repeated) if watched else [],
            },
        )

    def backward(self, call_id: int, grads: list) -> tuple:
        inputs, outputs = self.calls[call_id]
        pairs = [(o, g) for o, g in zip(outputs, grads) if g is not None]
        for t in inputs:
            if t is not None:
                t.grad = None
        if pairs:
            torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        back = [None if t is None or t.grad is None else t.grad.detach().clone() for t in inputs]
        return ("ok", ("grads", back))

    def add_hook(self, key: int, kind: str) -> tuple:
        module = self.objects[key]
        hook_id = len(self.hooks) + 1

        def record(*values):
            try:
                self.events.append((hook_id, self.encode(values[1:], None)))
            except Exception:  # noqa: BLE001 - a hook must not break the student's call
                pass

        if kind == "pre":
            handle = module.register_forward_pre_hook(lambda m, a: record(m, a))
        else:
            handle = module.register_forward_hook(lambda m, a, o: record(m, a, o))
        self.hooks[hook_id] = handle
        return ("ok", ("v", hook_id))


class _Served:
    """In the kernel, a grader object used by reference (exercise 13's model): its calls,
    the methods and attributes it offers, run in the grader, on plain data. Nothing of the
    object is here: no weights, no code."""

    def __init__(self, server: _Server, key: int, info: dict) -> None:
        object.__setattr__(self, "_server", server)
        object.__setattr__(self, "_key", key)
        object.__setattr__(self, "_info", info)

    def __call__(self, *args, **kwargs):
        server, key = (
            object.__getattribute__(self, "_server"),
            object.__getattribute__(self, "_key"),
        )
        return server.callback("call", key, None, args, kwargs)

    def __getattr__(self, name: str):
        server = object.__getattribute__(self, "_server")
        key, info = object.__getattribute__(self, "_key"), object.__getattribute__(self, "_info")
        if name in info.get("methods", ()):

            def method(*args, **kwargs):
                return server.callback("call", key, name, args, kwargs)

            method.__name__ = name
            return method
        if name in info.get("attributes", ()):
            return server.callback("getattr", key, name)
        raise AttributeError(
            f"{info.get('name', 'object')!r} object has no attribute {name!r} while grading "
            "(the grader runs it; it offers "
            + ", ".join([*info.get("methods", ()), *info.get("attributes", ())])
            + ")"
        )

    def __setattr__(self, name: str, value) -> None:
        info = object.__getattribute__(self, "_info")
        raise AttributeError(f"the grader's {info.get('name', 'object')} is read-only here")

    def __repr__(self) -> str:
        return (
            f"<{object.__getattribute__(self, '_info').get('name', 'object')}, run by the grader>"
        )


def _repeated_indices(noted: list) -> list:
    """What a WriteWatch noted, as lists of ints (at most ``MAX_ITEMS`` writes)."""
    return [[int(i) for i in write] for write in noted[:MAX_ITEMS]]


def _flat_tensors(value) -> list:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _flat_tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _flat_tensors(v)]
    return []


def _same_value(now: torch.Tensor, before: torch.Tensor) -> bool:
    return bool(torch.equal(now, before)) or bool(
        torch.equal(torch.nan_to_num(now), torch.nan_to_num(before))
    )


@contextlib.contextmanager
def _recording(active: bool):
    """While the call runs, keep the largest tensor it creates, when the grader's case
    records sizes (`attention_course.checks._sizes`); None otherwise."""
    if not active:
        yield None
        return
    from ..checks._sizes import LargestTensor

    with LargestTensor() as mode:
        yield mode


class _forbidden:
    """While active, each ``(module, attr, exception name, message)`` raises that exception
    when called from outside the package (the reference may use it)."""

    def __init__(self, targets: list) -> None:
        self.targets = targets
        self.saved: list = []

    def __enter__(self) -> None:
        for module_name, attr, name, message in self.targets:
            owner = sys.modules.get(module_name)
            if owner is None or not hasattr(owner, attr):
                continue
            original = getattr(owner, attr)
            error = type(name, (Exception,), {})

            def guard(*args, _original=original, _error=error, _message=message, **kwargs):
                caller = os.path.abspath(sys._getframe(1).f_code.co_filename)
                if caller.startswith(_PACKAGE_DIR + os.sep) and caller != _THIS_FILE:
                    return _original(*args, **kwargs)
                raise _error(_message)

            # its own name in a traceback: the refused function, not a shared "guard"
            guard.__code__ = guard.__code__.replace(co_name=f"refused_{module_name}_{attr}")
            self.saved.append((owner, attr, original))
            setattr(owner, attr, guard)

    def __exit__(self, *exc) -> None:
        for owner, attr, original in reversed(self.saved):
            setattr(owner, attr, original)
        self.saved = []


def serve(namespace: dict, path: str, token: str) -> None:
    """The kernel side: connect to the grader at ``path`` and serve until told to stop.

    Started by the grader's probe cell; never by students.
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    server = _Server(namespace, sock)
    _send(sock, ("hello", token, os.getpid()))
    while True:
        try:
            request = _recv(sock)
        except (EOFError, OSError):
            return
        except KeyboardInterrupt:  # an interrupt that came late: nothing is running
            continue
        if request[0] == "stop":
            try:
                _send(sock, ("ok", ("v", None)))
            except OSError:
                pass
            sock.close()
            return
        try:
            reply = server.handle(request)
        except BaseException as error:  # noqa: BLE001 - everything goes back as data
            reply = server.error(error)
        try:
            try:
                _send(sock, reply)
            except (TypeError, ValueError, RuntimeError, AttributeError) as error:
                _send(sock, server.error(error))
        except (OSError, KeyboardInterrupt):
            return


def probe_source(path: str, token: str) -> str:
    """The probe cell the grader sends to the kernel (through ``__import__``, so that names
    the notebook rebound do not interfere with starting the server)."""
    return (
        "__import__('attention_course.grading.sandbox', fromlist=['_']).serve("
        f"globals(), {path!r}, {token!r})"
    )


# ================================================================ grader side


def _remote_exception(name: str, message: str, frame, kind: str) -> BaseException:
    """An exception of the student's exception's name, message and built-in base class,
    made in the grader, with the student's line for ``describe_exception``."""
    import builtins

    base = getattr(builtins, kind, None) if kind.isidentifier() else None
    if not (isinstance(base, type) and issubclass(base, Exception)):
        base = Exception
    try:
        error = type(name if name.isidentifier() else "Error", (base,), {})(message)
    except Exception:  # noqa: BLE001 - a base that takes other arguments (UnicodeError)
        error = type(name if name.isidentifier() else "Error", (Exception,), {})(message)
    error.remote_frame = (
        traceback.FrameSummary("<student>", frame[0], frame[1], line=frame[2])
        if isinstance(frame, tuple) and len(frame) == 3
        else None
    )
    return error


_SCANNED = (torch, torch.nn.functional, np)
"""The modules whose functions a checker may refuse while a case runs (exercise 12 refuses
numpy, whose arrays the size recorder cannot see)."""


def _original_functions() -> dict:
    return {module.__name__: dict(vars(module)) for module in _SCANNED}


_ORIGINALS = _original_functions()


def _forbidden_now() -> list:
    """The functions of torch (or numpy) that a checker replaced for the running case (to forbid a
    built-in), with the exception each raises when student code calls it."""
    found = []
    for module in _SCANNED:
        originals = _ORIGINALS[module.__name__]
        for attr, value in list(vars(module).items()):
            if value is originals.get(attr, value) or not callable(value):
                continue
            code = getattr(value, "__code__", None)  # only a checker's own guard
            if code is None or not os.path.abspath(code.co_filename).startswith(_CHECKS_DIR):
                continue
            refusal = getattr(value, "refusal", None)  # (exception name, message)
            if isinstance(refusal, tuple) and len(refusal) == 2:
                found.append((module.__name__, attr, str(refusal[0]), str(refusal[1])))
    return found


class Client:
    """The grader's end of one task's connection to :func:`serve`."""

    def __init__(
        self,
        sock: socket.socket,
        limit: float,
        interrupt: Callable[[], None],
        alive: Callable[[], bool],
        cpu: Callable[[], float | None] | None = None,
    ) -> None:
        self.sock = sock
        self.limit = limit
        # the kernel's CPU seconds, read by the grader (None: limits are wall time)
        self.cpu = cpu
        self.interrupt = interrupt
        self.alive = alive
        self.lost: KernelLost | None = None
        self.proxies: dict[int, object] = {}
        self.classes: dict[tuple, type] = {}
        self.hooks: dict[int, tuple] = {}
        self.kernel_rng: torch.Tensor | None = None  # the kernel's random state, when known
        self.served: dict[int, object] = {}  # the grader's objects the kernel uses by reference
        self.served_ids: dict[int, int] = {}
        self.pool = concurrent.futures.ThreadPoolExecutor(1, "attention-course-sandbox")

    # -- the exchange, in one worker thread so that a case thread stopped by run_cases's
    # time limit never leaves the protocol half way
    def request(self, message: tuple, limit: float | None = None) -> tuple:
        if self.lost is not None:
            raise self.lost
        reply = self.pool.submit(self._exchange, message, limit or self.limit).result()
        if isinstance(reply, KernelLost):
            raise reply
        if not isinstance(reply, tuple) or not reply or not isinstance(reply[0], str):
            raise SandboxError("the kernel sent a malformed reply")
        if reply[0] == "error":
            if len(reply) != 5:
                raise SandboxError("the kernel sent a malformed error")
            _, name, text, frame, kind = reply
            if kind == "KeyboardInterrupt":
                if self.cpu is not None:
                    raise TimeLimitExceeded(
                        "interrupted",
                        f"ran over the time limit of {self.limit:g} CPU seconds of the "
                        "candidate: look for an endless loop, or a loop over elements "
                        "that should be one tensor operation",
                    )
                raise KernelLost("interrupted", f"interrupted after {self.limit:g} s")
            raise _remote_exception(str(name), str(text), frame, str(kind))
        return reply

    def _exchange(self, message: tuple, limit: float):
        if self.lost is not None:
            return self.lost
        try:
            _send(self.sock, message)
            self.sock.settimeout(limit)
            start = (self.cpu() if self.cpu else None, time.monotonic(), time.thread_time())
            try:
                while True:
                    if self.cpu is not None and not self._within_cpu(limit, start):
                        raise TimeoutError
                    if self.cpu is not None:
                        self.sock.settimeout(max(limit, INTERRUPT_GRACE))  # the reply is coming
                    else:
                        left = limit - (time.monotonic() - start[1])
                        if left <= 0:
                            raise TimeoutError
                        self.sock.settimeout(left)
                    reply = _recv(self.sock)
                    if not _is_callback(reply):
                        return reply
                    _send(self.sock, self._callback(reply))  # a served object's method
            except TimeoutError:
                self.interrupt()
                self.sock.settimeout(INTERRUPT_GRACE)
                try:
                    # the interrupted call's reply; a callback sent as the interrupt came is
                    # refused, so that the kernel unwinds and the exchange stays in step
                    while _is_callback(_recv(self.sock)):
                        refused = ("error", "KeyboardInterrupt", "", None, "Exception")
                        _send(self.sock, refused)
                except TimeoutError:
                    self.lost = KernelLost(
                        "hung", "the kernel did not come back after an interrupt"
                    )
                    return self.lost
                return ("error", "KeyboardInterrupt", "", None, "KeyboardInterrupt")
        except SandboxError as error:
            return ("error", "SandboxError", str(error), None, "Exception")
        except Exception as error:  # noqa: BLE001 - EOF, a broken pipe, an unreadable reply
            if isinstance(error, (EOFError, OSError)) or not self.alive():
                deadline = time.monotonic() + 2.0  # a dying kernel closes its socket first
                while self.alive() and time.monotonic() < deadline:
                    time.sleep(0.02)
                reason = "died" if not self.alive() else "hung"
                self.lost = KernelLost(reason, f"the kernel {reason} ({error})")
                return self.lost
            return ("error", "SandboxError", f"an unreadable reply ({error})", None, "Exception")

    def _within_cpu(self, limit: float, start: tuple) -> bool:
        """Wait until the kernel's reply can be read: True, or False when the call spent
        more than ``limit`` CPU seconds since ``start`` (the kernel's CPU time, the wall
        time and this thread's CPU time when the call began): the kernel's and the grader's
        on the served objects the call used (or, a guard for a machine so loaded that the
        kernel gets no CPU at all, ``WALL_FACTOR`` times that in wall time). CPU time does
        not depend on how loaded the machine is; wall time does."""
        import select

        kernel, begun, served = start
        while True:
            readable, _, _ = select.select([self.sock], [], [], 0.1)
            if readable:
                return True
            now = self.cpu()
            spent = time.thread_time() - served  # the served objects' work, in this thread
            if kernel is not None and now is not None and now - kernel + spent > limit:
                return False
            if time.monotonic() - begun > max(limit * WALL_FACTOR, 60.0):
                return False

    # -- the grader's objects that the kernel uses by reference (served)
    def _serve_ref(self, value) -> tuple:
        """The wire form of a grader object with an interface (`served_interface`): it
        stays here; the kernel gets a stand-in whose calls come back as callbacks."""
        key = self.served_ids.get(id(value))
        if key is None or self.served.get(key) is not value:
            key = len(self.served) + 1
            self.served[key] = value
            self.served_ids[id(value)] = key
        call, methods, attributes = served_interface(value)
        info = {
            "name": type(value).__name__,
            "call": call,
            "methods": list(methods),
            "attributes": list(attributes),
        }
        return ("served", key, info)

    def _served_value(self, value, depth: int = 0):
        """A served call's result for the kernel: plain values and tensors by value, served
        objects by reference; nothing else of the grader's crosses."""
        if depth > MAX_DEPTH:
            raise TypeError("a value nested too deeply")
        if isinstance(value, torch.Tensor):
            data = torch.Tensor._make_subclass(torch.Tensor, value.detach(), False)
            return ("t", data.clone(), bool(value.requires_grad))
        atom = _encode_atom(value)
        if atom is not None:
            return atom
        if type(value) in (tuple, list):
            tag = "tuple" if type(value) is tuple else "list"
            return (tag, [self._served_value(v, depth + 1) for v in value])
        if inspect.isgenerator(value):  # model.parameters(): the tensors, by value
            items = list(itertools.islice(value, MAX_ITEMS))
            return ("iter", [self._served_value(v, depth + 1) for v in items])
        if served_interface(value) is not None:
            return self._serve_ref(value)
        raise TypeError(f"the grader's object cannot hand out a {type(value).__name__}")

    def _served_argument(self, value, depth: int = 0):
        """An argument the kernel passed to a served call: plain data, tensors and served
        objects only (never one of the kernel's objects: nothing of the student's runs
        here)."""
        if not isinstance(value, tuple) or not value or depth > MAX_DEPTH:
            raise SandboxError("the kernel sent a malformed argument")
        tag = value[0]
        if tag == "served" and len(value) == 2 and type(value[1]) is int:
            if value[1] not in self.served:
                raise SandboxError("the kernel named an object the grader never served")
            return self.served[value[1]]
        if tag in ("tuple", "list") and len(value) == 2 and type(value[1]) is list:
            items = [self._served_argument(v, depth + 1) for v in value[1]]
            return tuple(items) if tag == "tuple" else items
        if tag == "dict" and len(value) == 2 and type(value[1]) is list:
            return {
                self._served_argument(k, depth + 1): self._served_argument(v, depth + 1)
                for k, v in value[1]
            }
        if tag == "ref":
            kind = value[2].get("type", "object") if isinstance(value[2], dict) else "object"
            raise TypeError(
                "the grader's model takes tensors, numbers and what it hands out (its "
                f"cache), not a {kind}"
            )
        decoded = self.decode(value)
        if isinstance(decoded, torch.Tensor):
            decoded = decoded.detach()
            if decoded.numel() > MAX_SERVED_ELEMENTS:
                raise ValueError(
                    f"a tensor of {decoded.numel()} elements is more than the grader's model "
                    f"takes while grading ({MAX_SERVED_ELEMENTS})"
                )
        return decoded

    def _callback(self, message: tuple) -> tuple:
        """Run a served object's call or attribute read that the kernel asked for."""
        try:
            if len(message) != 6 or message[1] not in ("call", "getattr"):
                raise SandboxError("the kernel sent a malformed callback")
            _, op, key, name, payload, grad = message
            target = self.served.get(key) if type(key) is int else None
            if target is None:
                raise SandboxError("the kernel named an object the grader never served")
            call, methods, attributes = served_interface(target)
            shown = type(target).__name__
            if op == "getattr":
                if name not in attributes:
                    raise AttributeError(f"the grader's {shown} has no attribute {name!r}")
                return ("ok", self._served_value(getattr(target, name)))
            if name is None and not call:
                raise TypeError(f"the grader's {shown} is not callable")
            if name is not None and name not in methods:
                raise AttributeError(f"the grader's {shown} has no method {name!r}")
            args, kwargs = self._served_argument(payload)
            if not isinstance(args, tuple) or not isinstance(kwargs, dict):
                raise SandboxError("the kernel sent a malformed callback")
            method = target if name is None else getattr(target, name)
            with torch.set_grad_enabled(bool(grad)):
                result = method(*args, **kwargs)
            return ("ok", self._served_value(result))
        except Exception as error:  # noqa: BLE001 - it goes back to the student's code
            kind = next(
                (c.__name__ for c in type(error).__mro__ if c.__module__ == "builtins"),
                "Exception",
            )
            return ("error", type(error).__name__, str(error), None, kind)

    def close(self) -> None:
        if self.lost is None:
            try:
                self.pool.submit(self._exchange, ("stop",), INTERRUPT_GRACE).result()
            except Exception:  # noqa: BLE001
                pass
        self.pool.shutdown(wait=False)
        try:
            self.sock.close()
        except OSError:
            pass

    # -- what the kernel sends, as grader objects
    def decode(self, value, graph: tuple | None = None, depth: int = 0):
        if not isinstance(value, tuple) or not value or depth > MAX_DEPTH + 2:
            raise SandboxError("the kernel sent a malformed value")
        tag = value[0]
        if tag == "v" and len(value) == 2:
            if value[1] is None or type(value[1]) in (bool, int, float, str):
                return value[1]
        elif tag == "t" and len(value) == 6:
            return self._tensor(value, graph)
        elif tag == "size" and len(value) == 2:
            return torch.Size([int(s) for s in value[1]])
        elif tag == "dtype" and len(value) == 2 and isinstance(value[1], str):
            dtype = getattr(torch, value[1].removeprefix("torch."), None)
            if isinstance(dtype, torch.dtype):
                return dtype
        elif tag == "device" and len(value) == 2 and isinstance(value[1], str):
            return torch.device(value[1])
        elif tag == "np" and len(value) == 4 and type(value[1]) is torch.Tensor:
            import numpy as np

            array = value[1].numpy().astype(np.dtype(str(value[2])))
            return array[()] if value[3] else array
        elif tag in ("tuple", "list", "iter") and len(value) == 2 and type(value[1]) is list:
            items = [self.decode(v, graph, depth + 1) for v in value[1]]
            return tuple(items) if tag == "tuple" else iter(items) if tag == "iter" else items
        elif tag == "dict" and len(value) == 2 and type(value[1]) is list:
            import collections

            out = collections.OrderedDict()
            for pair in value[1]:
                if not isinstance(pair, tuple) or len(pair) != 2:
                    raise SandboxError("the kernel sent a malformed dict")
                key = self.decode(pair[0], graph, depth + 1)
                if not isinstance(key, (str, int, float, bool, tuple, type(None))):
                    raise SandboxError("the kernel sent a dict with a key that is not plain")
                out[key] = self.decode(pair[1], graph, depth + 1)
            return out
        elif tag == "ref" and len(value) == 3 and isinstance(value[2], dict):
            return self.proxy(int(value[1]), value[2])
        elif tag == "served" and len(value) == 2 and type(value[1]) is int:
            if value[1] in self.served:  # one of the grader's own, handed back
                return self.served[value[1]]
        raise SandboxError(f"the kernel sent a malformed value (tag {str(tag)[:20]!r})")

    def _tensor(self, value: tuple, graph: tuple | None):
        _, data, requires_grad, grad, is_param, index = value
        if type(data) not in (torch.Tensor, nn.Parameter) or (
            grad is not None and type(grad) is not torch.Tensor
        ):
            raise SandboxError("the kernel sent a tensor of a type that is not torch.Tensor")
        data = torch.Tensor._make_subclass(torch.Tensor, data.detach(), False)
        if graph is not None and isinstance(index, int) and index in graph[0]:
            graph[1].append((index, data))  # connected to the inputs by _RemoteCall
            return data
        if is_param:
            data = nn.Parameter(data, requires_grad=bool(requires_grad))
        elif requires_grad and (data.is_floating_point() or data.is_complex()):
            data.requires_grad_(True)
        if grad is not None and data.requires_grad and grad.shape == data.shape:
            data.grad = grad.to(data.dtype)
        return data

    def proxy(self, key: int, info: dict):
        if key in self.proxies:
            return self.proxies[key]
        kind, name = str(info.get("kind")), str(info.get("name") or "object")
        name = name if name.isidentifier() else "object"
        if kind == "class":
            base = RemoteModule if info.get("module_class") else RemoteObject
            proxy = RemoteClassMeta(name, (base,), {"__module__": "__main__"})
            type.__setattr__(proxy, "_rm", (self, key))
            type.__setattr__(proxy, "__qualname__", str(info.get("qualname") or name))
        elif kind == "function":
            proxy = RemoteFunction(self, key, name, str(info.get("qualname") or name))
        else:
            base = RemoteModule if kind == "module" else RemoteObject
            torch_class = _torch_module_class(info.get("torch_class")) if kind == "module" else None
            cls = self.classes.get((base, name, torch_class))
            if cls is None:
                body: dict = {"__module__": "__main__"}
                if torch_class is not None:  # isinstance(x, nn.Linear) reads __class__
                    body["__class__"] = property(lambda self, _cls=torch_class: _cls)
                cls = type(name, (base,), body)
                self.classes[(base, name, torch_class)] = cls
            proxy = object.__new__(cls)
            object.__setattr__(proxy, "_rm", (self, key))
        self.proxies[key] = proxy
        return proxy

    # -- requests
    def lookup(self, name: str):
        """The student's object called ``name``: a proxy or a plain value; ``MISSING``
        when the notebook does not define it. Also returns the object's ``__module__``."""
        reply = self.request(("lookup", name))
        if reply[0] == "missing":
            return MISSING, ""
        value = reply[1]
        module = value[2].get("module", "") if value[0] == "ref" else ""
        return self.decode(value), str(module)

    def getattr(self, key: int, name: str):
        return self.decode(self.request(("getattr", key, name))[1])

    def setattr(self, key: int, name: str, value) -> None:
        self.request(("setattr", key, name, self.encode(value, [])))

    def truth(self, key: int) -> bool:
        return bool(self.decode(self.request(("truth", key))[1]))

    def encode(self, value, tensors: list, modules: list | None = None):
        if isinstance(value, torch.Tensor):
            from ..checks._watch import WriteWatch

            tensors.append(value)
            data = value.detach()
            data = torch.Tensor._make_subclass(torch.Tensor, data, False)
            if isinstance(value, WriteWatch):  # the kernel wraps it and reports its writes
                return ("t", data, bool(value.requires_grad), "watch")
            return ("t", data, bool(value.requires_grad))
        atom = _encode_atom(value)
        if atom is not None:
            return atom
        if isinstance(value, slice):
            return ("slice", [self.encode_plain(v) for v in (value.start, value.stop, value.step)])
        if isinstance(value, (RemoteFunction, RemoteObject)) or (
            isinstance(value, type) and isinstance(value, RemoteClassMeta)
        ):
            owner, key = _rm(value)
            if owner is self:
                return ("ref", key)
        if isinstance(value, tuple):
            return ("tuple", [self.encode(v, tensors, modules) for v in value])
        if isinstance(value, list):
            return ("list", [self.encode(v, tensors, modules) for v in value])
        if isinstance(value, dict):
            return (
                "dict",
                [
                    (self.encode(k, tensors, modules), self.encode(v, tensors, modules))
                    for k, v in value.items()
                ],
            )
        if isinstance(value, (bool, int, float, str)):
            return ("v", value)
        if served_interface(value) is not None:  # it stays here; the kernel calls back
            return self._serve_ref(value)
        # Anything else of the grader's (a reference model to inspect, say) goes pickled:
        # the kernel may unpickle what the grader sends, never the other way round.
        import pickle

        try:
            data = pickle.dumps(value)
        except Exception as error:  # noqa: BLE001
            raise TypeError(
                f"the grader cannot send a {type(value).__name__} to the kernel ({error})"
            ) from None
        packed = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        if isinstance(value, nn.Module) and modules is not None:
            modules.append(value)
            return ("module", packed)
        return ("obj", packed)

    @staticmethod
    def encode_plain(value):
        if value is None or type(value) in (int,):
            return value
        raise TypeError("only int slices can be sent")

    def call(self, key: int, method: str | None, args: tuple, kwargs: dict):
        tensors: list = []
        modules: list = []
        payload = (
            self.encode(tuple(args), tensors, modules),
            self.encode(dict(kwargs), tensors, modules),
        )
        rng = torch.get_rng_state()
        same = self.kernel_rng is not None and torch.equal(rng, self.kernel_rng)
        options = {
            "rng": None if same else rng,
            "grad": torch.is_grad_enabled(),
            "dtype": str(torch.get_default_dtype()),
            "forbid": _forbidden_now(),
            "sizes": _recording_sizes(),  # a case records the sizes of the tensors created
        }
        self.kernel_rng = None  # unknown until the call returns (it may raise)
        reply = self.request(("call", key, method, *payload, options))
        if len(reply) != 3 or not isinstance(reply[2], dict):
            raise SandboxError("the kernel sent a malformed reply to a call")
        meta = reply[2]
        after = meta.get("rng")
        if type(after) is torch.Tensor and after.dtype == torch.uint8 and after.shape == rng.shape:
            torch.set_rng_state(after)
            rng = after
        self.kernel_rng = rng
        # in-place changes of the arguments, written back so that call_student sees them
        after = meta.get("after", [])
        if not isinstance(after, list) or len(after) != len(tensors):
            raise SandboxError("the kernel did not report the arguments after the call")
        for old, encoded in zip(tensors, after):
            if encoded is None or old.device.type == "meta":
                continue
            new = self._tensor(encoded, None).detach()
            if new.shape != old.shape or new.dtype != old.dtype:
                with torch.no_grad():
                    old.data = new.to(old.device)
            elif not _same_value(new, old.detach()):
                with torch.no_grad():
                    old.copy_(new)
        reported = meta.get("modules", [])
        if not isinstance(reported, list) or len(reported) != len(modules):
            raise SandboxError("the kernel did not report the modules after the call")
        for module, state in zip(modules, reported):
            own = module.state_dict()
            for name, encoded in state:
                target = own.get(name) if isinstance(name, str) else None
                if target is None:
                    continue
                new = self._tensor(encoded, None).detach()
                if new.shape == target.shape and not _same_value(new, target.detach()):
                    with torch.no_grad():
                        target.copy_(new.to(target.dtype))
        _note_largest(meta.get("largest"))
        _note_repeated(meta.get("repeated", []), tensors)
        differentiable = {int(i) for i in meta.get("differentiable", [])}
        wanted: list = []
        result = self.decode(reply[1], (differentiable, wanted))
        events = meta.get("events", [])
        if wanted and torch.is_grad_enabled():
            outs = _RemoteCall.apply(
                (self, int(meta["call"]), [t for t in tensors]),
                torch.zeros((), requires_grad=True),
                *[t for _, t in wanted],
                *tensors,
            )
            swap = {id(t): new for (_, t), new in zip(wanted, outs[1:])}
            result = _replace(result, swap)
        for hook_id, values in events:
            self._replay(int(hook_id), values)
        return result

    def _replay(self, hook_id: int, values) -> None:
        entry = self.hooks.get(hook_id)
        if entry is None:
            return
        module, fn = entry
        values = self.decode(values)
        fn(module, *values)

    def backward(self, call_id: int, grads: list) -> list:
        reply = self.request(("backward", call_id, grads))
        value = reply[1]
        if not (isinstance(value, tuple) and len(value) == 2 and value[0] == "grads"):
            raise SandboxError("the kernel sent a malformed reply to backward")
        out = []
        for g in value[1]:
            if g is not None and type(g) is not torch.Tensor:
                raise SandboxError("the kernel sent a gradient that is not a tensor")
            out.append(g)
        return out

    def add_hook(self, module, key: int, kind: str, fn: Callable):
        hook_id = int(self.decode(self.request(("hook", key, kind))[1]))
        self.hooks[hook_id] = (module, fn)
        return _HookHandle(self, hook_id)


MISSING = object()
MAX_SERVED_ELEMENTS = 1024  # elements of a tensor a served call takes (the checks: < 40)


def _is_callback(message) -> bool:
    """Whether a message from the kernel asks for a served object's call."""
    return isinstance(message, tuple) and bool(message) and message[0] == "callback"


def served_interface(value) -> tuple | None:
    """``(callable, methods, attributes)`` that a grader object offers the kernel by
    reference (its class's ``served_while_grading``), or None: such an object is never
    sent; the kernel gets a stand-in whose calls and reads run here, on plain data."""
    found = getattr(type(value), "served_while_grading", None)
    if not (isinstance(found, tuple) and len(found) == 3) or isinstance(value, type):
        return None
    call, methods, attributes = found
    return bool(call), tuple(methods), tuple(attributes)


def _note_largest(largest) -> None:
    """The kernel's record of the largest tensor the call created, checked as data and
    handed to the running case's recorder."""
    if largest is None:
        return
    if not (
        isinstance(largest, tuple)
        and len(largest) == 4
        and type(largest[0]) is int
        and isinstance(largest[1], tuple)
        and all(type(n) is int for n in largest[1])
        and type(largest[2]) is str
        and type(largest[3]) is str
    ):
        raise SandboxError("the kernel sent a malformed record of tensor sizes")
    from ..checks import _sizes

    _sizes.note(*largest)


def _note_repeated(repeated, tensors: list) -> None:
    """The indexed writes with a repeated index that the kernel's WriteWatch noted during
    the call, checked as data and added to the grader's own record (as in-process)."""
    from ..checks._watch import WriteWatch

    if not (
        isinstance(repeated, list)
        and all(isinstance(w, list) and all(type(i) is int for i in w) for w in repeated)
    ):
        raise SandboxError("the kernel sent a malformed record of indexed writes")
    if repeated and not any(isinstance(t, WriteWatch) for t in tensors):
        raise SandboxError("the kernel reported writes to a tensor the grader did not watch")
    WriteWatch.repeated.extend(repeated)


def _recording_sizes() -> bool:
    from ..checks import _sizes

    return _sizes.active()


def _replace(value, swap: dict):
    if isinstance(value, torch.Tensor):
        return swap.get(id(value), value)
    if isinstance(value, tuple):
        return tuple(_replace(v, swap) for v in value)
    if isinstance(value, list):
        return [_replace(v, swap) for v in value]
    if isinstance(value, dict):
        return type(value)((k, _replace(v, swap)) for k, v in value.items())
    return value


class _HookHandle:
    def __init__(self, client: Client, hook_id: int) -> None:
        self.client, self.hook_id = client, hook_id

    def remove(self) -> None:
        self.client.hooks.pop(self.hook_id, None)
        self.client.request(("unhook", self.hook_id))


class _RemoteCall(torch.autograd.Function):
    """Connect a remote call's outputs to its inputs in the grader's autograd graph."""

    @staticmethod
    def forward(ctx, call, dummy, *tensors):
        client, call_id, inputs = call
        ctx.call = (client, call_id)
        ctx.n_out = len(tensors) - len(inputs)
        ctx.set_materialize_grads(False)
        sentinel = dummy.new_zeros(())
        ctx.mark_non_differentiable(sentinel)
        outs = [t.clone() for t in tensors[: ctx.n_out]]
        return (sentinel, *outs)

    @staticmethod
    def backward(ctx, _sentinel, *grads):
        client, call_id = ctx.call
        sent = [None if g is None else g.detach().contiguous() for g in grads]
        back = client.backward(call_id, sent)
        n_in = len(back)
        return (None, None, *([None] * ctx.n_out), *back[:n_in])


def _rm(proxy) -> tuple:
    if isinstance(proxy, type):
        return type.__getattribute__(proxy, "_rm")
    return object.__getattribute__(proxy, "_rm")


# ---------------------------------------------------------------- the proxies


class RemoteFunction:
    """A student's function (or any callable that is not a class) in the kernel."""

    def __init__(self, client: Client, key: int, name: str, qualname: str) -> None:
        self._rm = (client, key)
        self.__name__ = name
        self.__qualname__ = qualname
        self.__module__ = "__main__"

    def __call__(self, *args, **kwargs):
        client, key = self._rm
        return client.call(key, None, args, kwargs)

    def __repr__(self) -> str:
        return f"<function {self.__name__}>"


_LOCAL = frozenset(
    {
        "__class__",
        "__dict__",
        "_rm",
        "register_forward_hook",
        "register_forward_pre_hook",
        "__call__",
        "__repr__",
        "__str__",
        "__reduce__",
        "__reduce_ex__",
        "__eq__",
        "__ne__",
        "__hash__",
        "__init_subclass__",
        "__setattr__",
        "__getattr__",
    }
)


def _torch_module_class(path: object) -> type | None:
    """The ``torch.nn`` module class named by ``path`` (from the kernel), or None."""
    if not isinstance(path, str) or not path.startswith("torch.nn.modules."):
        return None
    import importlib

    module, _, name = path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name, None)
    except ImportError:
        return None
    return cls if isinstance(cls, type) and issubclass(cls, nn.Module) else None


class RemoteObject:
    """An instance of a student's class in the kernel: every attribute is looked up there."""

    def __getattribute__(self, name: str):
        if name in _LOCAL or name.startswith("_rm"):
            return object.__getattribute__(self, name)
        client, key = object.__getattribute__(self, "_rm")
        return client.getattr(key, name)

    def __setattr__(self, name: str, value) -> None:
        client, key = object.__getattribute__(self, "_rm")
        client.setattr(key, name, value)

    def __call__(self, *args, **kwargs):
        client, key = object.__getattribute__(self, "_rm")
        return client.call(key, None, args, kwargs)

    def __getitem__(self, index):
        client, key = object.__getattribute__(self, "_rm")
        return client.call(key, "__getitem__", (index,), {})

    def __len__(self) -> int:
        client, key = object.__getattribute__(self, "_rm")
        return int(client.call(key, "__len__", (), {}))

    def __bool__(self) -> bool:
        client, key = object.__getattribute__(self, "_rm")
        return client.truth(key)

    def __iter__(self):
        client, key = object.__getattribute__(self, "_rm")
        return iter(client.call(key, "__iter__", (), {}))

    def register_forward_hook(self, hook: Callable):
        client, key = object.__getattribute__(self, "_rm")
        return client.add_hook(self, key, "post", hook)

    def register_forward_pre_hook(self, hook: Callable):
        client, key = object.__getattribute__(self, "_rm")
        return client.add_hook(self, key, "pre", hook)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} in the student's kernel>"

    __eq__ = object.__eq__
    __ne__ = object.__ne__
    __hash__ = object.__hash__


class RemoteModule(nn.Module):
    """An ``nn.Module`` of the student's in the kernel (see :class:`RemoteObject`)."""

    __getattribute__ = RemoteObject.__getattribute__
    __setattr__ = RemoteObject.__setattr__
    __call__ = RemoteObject.__call__
    __getitem__ = RemoteObject.__getitem__
    __len__ = RemoteObject.__len__
    __bool__ = RemoteObject.__bool__
    __iter__ = RemoteObject.__iter__
    register_forward_hook = RemoteObject.register_forward_hook
    register_forward_pre_hook = RemoteObject.register_forward_pre_hook
    __repr__ = RemoteObject.__repr__
    __eq__ = object.__eq__
    __ne__ = object.__ne__
    __hash__ = object.__hash__

    def __getattr__(self, name: str):  # nn.Module's, never reached: all goes remote
        raise AttributeError(name)


class RemoteClassMeta(type):
    """The metaclass of a student's class's stand-in: calling it builds the instance in the
    kernel; attributes of the class are looked up there."""

    def __call__(cls, *args, **kwargs):
        client, key = type.__getattribute__(cls, "_rm")
        return client.call(key, None, args, kwargs)

    def __getattr__(cls, name: str):
        if name.startswith("__") or name == "_rm":
            raise AttributeError(name)
        client, key = type.__getattribute__(cls, "_rm")
        return client.getattr(key, name)


# ---------------------------------------------------------------- starting a session


class Session:
    """One task's server in the kernel: ``with Session(kc, ...) as client: ...``.

    ``execute`` sends the probe cell (non-blocking) and returns its message id;
    ``interrupt`` and ``alive`` act on the kernel process.
    """

    def __init__(
        self,
        execute: Callable[[str], str],
        interrupt: Callable[[], None],
        alive: Callable[[], bool],
        limit: float,
        start_limit: float = 30.0,
        finished: Callable[[str], bool] | None = None,
        folder: str | None = None,
        cpu: Callable[[], float | None] | None = None,
    ) -> None:
        self.cpu = cpu
        self.execute, self.interrupt, self.alive = execute, interrupt, alive
        self.folder = folder  # where the socket is made (a sandbox sees only its own)
        self.finished = finished
        self.limit, self.start_limit = limit, start_limit
        self.client: Client | None = None
        self.msg_id: str | None = None

    def __enter__(self) -> Client:
        import secrets
        import shutil
        import tempfile

        folder = tempfile.mkdtemp(prefix="ac-grade-", dir=self.folder)
        os.chmod(folder, 0o700)
        path = os.path.join(folder, "s")
        token = secrets.token_hex(16)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(path)
            listener.listen(1)
            listener.settimeout(0.25)
            self.msg_id = self.execute(probe_source(path, token))
            deadline = time.monotonic() + self.start_limit
            while True:
                try:
                    sock, _ = listener.accept()
                    break
                except TimeoutError:
                    pass
                if not self.alive():
                    raise KernelLost("died", "the kernel died before the grader's probe ran")
                if self.finished is not None and self.finished(self.msg_id):
                    self.msg_id = None
                    raise SandboxError(
                        "the grader's probe ended without connecting: the notebook broke "
                        "`attention_course.grading.sandbox` or the import machinery"
                    )
                if time.monotonic() > deadline:
                    raise KernelLost("hung", "the kernel did not start the grader's probe")
        finally:
            listener.close()
            shutil.rmtree(folder, ignore_errors=True)
        sock.settimeout(self.start_limit)
        try:
            hello = _recv(sock)
        except Exception as error:  # noqa: BLE001
            sock.close()
            raise KernelLost("died" if not self.alive() else "hung", str(error)) from None
        if not (isinstance(hello, tuple) and len(hello) == 3 and hello[:2] == ("hello", token)):
            sock.close()
            raise SandboxError("the kernel's probe answered without the grader's token")
        self.client = Client(sock, self.limit, self.interrupt, self.alive, self.cpu)
        return self.client

    def __exit__(self, *exc) -> None:
        if self.client is not None:
            self.client.close()


def warm_up() -> threading.Thread:
    """Import the checkers and run one backward pass in a background thread (torch's first
    backward in a process takes a second or more), while the notebook's cells run."""

    def work() -> None:
        from .. import checks, quiz  # noqa: F401

        x = torch.ones(2, dtype=torch.float64, requires_grad=True)
        (x * x).sum().backward()
        importlib.import_module("torch._dynamo")  # what the first meta operation imports
        torch.ones(2, 2, device="meta").tril()

    thread = threading.Thread(target=work, name="attention-course-warm-up", daemon=True)
    thread.start()
    return thread


def _wall(client: Client, timeout: float) -> float:
    """A case's wall-time limit in the grader: ``timeout`` when the kernel's calls are
    limited in wall time, else a guard far above it (the kernel's CPU time is what is
    limited, by the client)."""
    return timeout if client.cpu is None else max(timeout * WALL_FACTOR, 60.0)


def grade_task(client: Client, task: dict, timeout: float, seed: int = 0) -> dict:
    """Run ``task``'s checker (or quiz check) in this process on the student's object
    behind ``client``, its inputs drawn from the run seed ``seed``; the result as
    ``grading._fill`` reads it."""
    try:
        candidate, module = client.lookup(task["name"])
    except KernelLost:
        raise
    except Exception as error:  # noqa: BLE001
        return {"status": "crashed", "error": f"{type(error).__name__}: {error}"}
    if candidate is MISSING:
        return {"status": "missing"}
    if module.split(".")[0] == "attention_course" and not task.get("absent"):
        # The reference itself, where it is real in the kernel: a run without the
        # sandbox, or a target the exercise hands out (`absent.real_targets`). Elsewhere
        # the reference is a stub in the sandbox (`attention_course.grading.absent`): the
        # check runs, and each call raises NotAvailableWhileGrading.
        return {"status": "reference", "module": module}
    from ..checks._runner import limits_in_wall_time

    if task["kind"] == "quiz":
        from ..quiz import check_quiz

        with limits_in_wall_time():
            report = check_quiz(
                task["question"], candidate, timeout=_wall(client, timeout), seed=seed
            )
    else:
        from .. import checks

        check = getattr(checks, task["checker"])
        with limits_in_wall_time():
            report = check(candidate, timeout=_wall(client, timeout), seed=seed)
    if client.lost is not None:
        raise client.lost
    return {"status": "graded", "report": report.to_dict()}
