"""Record a PyTorch training run into a Keel recording that every Keel tool opens.

    import keel_torch
    with keel_torch.record("run.db", model=model, optimizer=opt, md5=True, stats=True):
        for x, y in batches:
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()          # ends the step: its loss is the tensor .backward() was called on
                                # (zero_grad and loss.item() stay in it; the next batch does not)
            opt.zero_grad()

Every ATen op call (a TorchDispatchMode) is recorded with its phase (forward; backward while
.backward() runs; optimizer while the optimizer's step runs), its module scope (the innermost
module running, named as model.named_modules() names it, its forward hooks included), its
inputs and outputs (shape, strides, dtype, device, and with md5/stats Keel's MD5 and
statistics of their bytes, computed by Keel's own hasher) and, with stacks=True, the Python call stack of the user's code (frames inside torch and
keel_torch left out). The file is written by Keel's own C++ writer (the _keel extension), one
batch per step. keel_torch.step(loss) ends a step by hand (without an optimizer, or to attach
another loss). CUDA tensors are copied to the host for hashing.

A backward op's forward op is the one whose autograd node it runs in (Note [keel_torch forward
links]), and its scope that forward op's (Note [keel_torch backward scopes]). Ops run after
.backward() returns and outside any module (gradient clipping) are phase optimizer, as Keel's
own clip_grad_norm is. Memory snapshots: keel_torch.snapshot.import_snapshot
(python3 -m keel_torch import-snapshot). rounded_md5=N adds Keel's rounded MD5 (N significant
digits: equal across frameworks within rounding). A recording of Keel's GPT in PyTorch
(tests/python/keel_gpt.py) and a Keel run of it compare op by op with `keel diff`
(docs/torch.md).

Note [keel_torch backward scopes]
A backward op's scope is the scope of the forward op it differentiates (its forward_seq), as
Keel's engine scopes a backward op: the gradient of blocks.1.mlp's `mul` is blocks.1.mlp's,
which lets `keel diff` pair a PyTorch run's backward ops with a Keel run's module by module.
Where autograd names no forward op (gradient accumulation into a parameter), it is the module
whose output gradient autograd was working back from: a hook on each module's outputs sets
`backward_scope` when their gradient is ready.

Note [keel_torch forward links]
A backward op differentiates the forward op whose autograd node is running. The dispatch mode
sees a forward op below autograd, before its outputs have a grad_fn; they get one on the way back
up. So each forward op's outputs wait in `pending_outputs` until the next op (or .backward())
starts; then every one that requires grad and has a grad_fn gets a tensor hook. Autograd runs a
tensor's hooks when its gradient is ready, just before the node that made it, so the hook sets
`forward_seq` to that op's seq and the backward ops dispatched next carry it. A parameter's hook
sets it to 0: what follows is gradient accumulation, not a forward op's backward. Ops that were
not hooked (an output that died before the next op started) leave the link of the node before.
"""

import contextlib
import json
import os
import socket
import sys
import threading
import time
import traceback
import weakref

import torch
from torch.utils import _python_dispatch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from . import _keel

__all__ = ["record", "step", "hash_tensor"]

_DTYPES = {
    torch.float32: "float32",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float64: "float64",
    torch.int32: "int32",
    torch.int64: "int64",
    torch.bool: "bool",
}
_TORCH_DIR = os.path.dirname(torch.__file__)
_OWN_DIR = os.path.dirname(__file__)


def _dtype_name(t):
    return _DTYPES.get(t.dtype, str(t.dtype).replace("torch.", ""))


def hash_tensor(t, md5=True, stats=True, rounded_digits=0):
    """(md5, stats, rounded md5) of a tensor's values as Keel computes them for the same bytes
    (rounded: to rounded_digits significant digits, 0 for none; docs/capture.md); ("", None, "")
    for a dtype Keel has no name for."""
    if t.dtype not in _DTYPES:
        return "", None, ""
    return _keel.hash(_host_bytes(t), _dtype_name(t), list(t.shape), md5, stats, rounded_digits)


def _host_bytes(t):
    """A tensor's elements in row-major order as a byte buffer on the host (CUDA tensors copied)."""
    host = t.detach().contiguous().cpu()
    if host.dtype in (torch.float16, torch.bfloat16):
        data = host.view(torch.int16).numpy()
    elif host.dtype == torch.bool:
        data = host.view(torch.uint8).numpy()
    else:
        data = host.numpy()
    return memoryview(data.reshape(-1)).cast("B")


def _written_arguments(func):
    """The arguments an ATen op writes (`Tensor(a!)` in its schema): (position, name) of each,
    position None for a keyword-only one."""
    written = []
    try:
        arguments = func._schema.arguments
    except AttributeError:
        return ()
    position = 0
    for a in arguments:
        # Batch norm updates its running statistics in place without saying so in PyTorch
        # 1.13's schema (native_batch_norm, _batch_norm_impl_index, cudnn_batch_norm, ...).
        if (a.alias_info is not None and a.alias_info.is_write) or \
                a.name in ("running_mean", "running_var"):
            written.append((None if a.kwarg_only else position, a.name))
        if not a.kwarg_only:
            position += 1
    return tuple(written)


_active = threading.local()
_OVERLOADS = {}  # id(ATen overload) -> _overload()'s tuple and the overload (kept alive)


def _overload(func):
    """What a recording keeps of an ATen overload: (op name, attributes JSON, the arguments it
    writes, whether it is left out, what to call to run it), once per overload for every
    recording of the process."""
    known = _OVERLOADS.get(id(func))  # by id: an overload's __hash__ is Python code
    if known is None:
        name = str(func.overloadpacket.__name__) if hasattr(func, "overloadpacket") else str(func)
        # An OpOverload's __call__ is a Python frame around its C++ operator `_op`.
        run = func._op if isinstance(func, torch._ops.OpOverload) and hasattr(func, "_op") \
            else func
        # The profiler's markers are not computation.
        known = _OVERLOADS[id(func)] = (name, json.dumps({"aten": str(func)}),
                                        _written_arguments(func),
                                        name.startswith("_record_function"), run, func)
    return known[:5]


class _Session(TorchDispatchMode):
    def __init__(self, path, model, optimizer, md5, stats, stacks, config, seed, rounded_md5,
                 dumps):
        super().__init__()
        self.md5, self.stats, self.stacks, self.rounded = md5, stats, stacks, rounded_md5
        # dumps: False, True (every op's outputs) or a scope prefix ("blocks.1").
        if not isinstance(dumps, (bool, str)):
            raise TypeError("keel_torch.record: dumps is True, False or a scope prefix")
        self.dumps = dumps
        options = json.dumps({"framework": "torch", "md5": md5, "stats": stats, "stacks": stacks,
                              "rounded_md5_digits": rounded_md5, "dumps": dumps})
        # The running script is an input the recording must never replace (record(__file__)).
        script = getattr(sys.modules.get("__main__"), "__file__", None) or ""
        self.rec = _keel.Recording(
            os.fspath(path), "cpu", socket.gethostname(),
            json.dumps(config) if config is not None else "{}", seed, options, torch.__version__,
            script)
        self.hashes = bool(md5 or stats or rounded_md5)
        # Hashed off the Python thread (Note [keel_torch hashing off the Python thread]).
        self.rec.hashing(md5, stats, rounded_md5, _host_bytes)
        self.names = {}
        self.model = model
        if model is not None:
            for name, module in model.named_modules():
                self.names[id(module)] = name
        # The per-op state (phase, module scopes, the op count, the forward op autograd runs,
        # the step the optimizer ended) is the C++ half's (Note [keel_torch dispatch in C++]).
        self.step_begin = time.monotonic_ns()
        self.last_loss = float("nan")
        self.stack_ids = {}
        self.optimizer = optimizer
        self.in_zero_grad = False
        self.undo = []
        self.hooked = {}          # output tensors given a backward-scope hook: id -> weakref
        self.direct = False       # Note [keel_torch direct dispatch mode]

    @property
    def seq(self):
        """The ops recorded so far."""
        return self.rec.seq

    @property
    def hashed(self):
        """(tensors, bytes) whose bytes were hashed (Note [keel_torch content cache])."""
        return self.rec.counts()["hashed"]

    @property
    def reused(self):
        """(tensors, bytes) that took the results of an identical tensor hashed earlier in the
        step instead."""
        return self.rec.counts()["reused"]

    # ---- scopes, phases, step boundaries -----------------------------------------------------

    def _module_call(self, original):
        """Module.__call__ under the recording: the module's scope holds from its forward
        pre-hooks to its forward hooks, so ops a user's hook runs (a forward hook that changes
        the output) are the module's, as they are part of calling it."""
        session = self
        thread = threading.get_ident()

        def call(module, *args, **kwargs):
            if threading.get_ident() != thread:  # another thread's modules: not this recording's
                return original(module, *args, **kwargs)
            rec = session.rec
            rec.after_backward = False
            rec.push_scope(session.names.get(id(module), type(module).__name__))
            try:
                output = original(module, *args, **kwargs)
            finally:
                name = rec.pop_scope()
            session._backward_scope_hooks(name, output)
            return output
        return call

    def _backward_scope_hooks(self, name, output):
        # Backward scopes: a hook on the module's output tensors fires when their gradient is
        # ready, just before autograd runs the ops that produced them; the backward ops from
        # then on are this module's (the innermost module's: an output already hooked keeps
        # its first, innermost, scope).
        tensors = (output,) if isinstance(output, torch.Tensor) else tree_flatten(output)[0]
        for t in tensors:
            if torch.is_tensor(t) and t.requires_grad and t.grad_fn is not None:
                # id() names the object only while the weak reference does (ids are reused).
                seen = self.hooked.get(id(t))
                if seen is not None and seen() is t:
                    continue
                self.hooked[id(t)] = weakref.ref(t)
                t.register_hook(self._backward_scope(name))

    def _hook_forward_outputs(self, pending):
        for seq, outputs in pending:
            for t in outputs:
                if t.requires_grad and t.grad_fn is not None:
                    t.register_hook(self._backward_of(seq))

    def _backward_of(self, seq):
        rec = self.rec

        def hook(grad):
            rec.forward_seq = seq
        return hook

    def _backward_scope(self, name):
        rec = self.rec

        def hook(grad):
            rec.backward_scope = name
        return hook

    def install(self):
        original_call = torch.nn.Module.__call__
        torch.nn.Module.__call__ = self._module_call(original_call)
        self.undo.append(lambda: setattr(torch.nn.Module, "__call__", original_call))
        session = self
        original_backward = torch.Tensor.backward

        def backward(tensor, *args, **kwargs):
            rec = session.rec
            if tensor.numel() == 1:
                session.last_loss = session.value(tensor)
            rec.hook_pending()
            previous, rec.phase = rec.phase, "backward"
            rec.backward_scope = ""
            rec.forward_seq = 0
            try:
                return original_backward(tensor, *args, **kwargs)
            finally:
                rec.phase = previous
                rec.after_backward = True

        torch.Tensor.backward = backward
        self.undo.append(lambda: setattr(torch.Tensor, "backward", original_backward))
        # Note [keel_torch forward links]: gradient accumulation into a parameter is no forward
        # op's backward.
        if self.model is not None:
            for p in self.model.parameters():
                if p.requires_grad:
                    self.undo.append(p.register_hook(self._backward_of(0)).remove)
        if self.optimizer is not None:
            opt = self.optimizer
            original_step = opt.step

            original_zero_grad = opt.zero_grad

            def optimizer_step(*args, **kwargs):
                rec = session.rec
                previous, rec.phase = rec.phase, "optimizer"
                try:
                    return original_step(*args, **kwargs)
                finally:
                    rec.phase = previous
                    # The step ends here; its record waits for the next step's first op
                    # (Note [keel_torch step boundary] in _keel.cpp).
                    rec.pending_end = time.monotonic_ns()

            opt.step = optimizer_step
            opt.zero_grad = self._zero_grad(original_zero_grad)
            self.undo.append(lambda: setattr(opt, "step", original_step))
            self.undo.append(lambda: setattr(opt, "zero_grad", original_zero_grad))
        if self.model is not None:  # model.zero_grad() is the optimizer's work too
            model = self.model
            model.zero_grad = self._zero_grad(model.zero_grad)
            self.undo.append(lambda: model.__dict__.pop("zero_grad", None))

    def _zero_grad(self, original):
        """`original` (an optimizer's or a model's zero_grad) recorded as optimizer work of the
        step the optimizer ended (Note [keel_torch step boundary] in _keel.cpp)."""
        session = self

        def zero_grad(*args, **kwargs):
            rec = session.rec
            previous, rec.phase = rec.phase, "optimizer"
            session.in_zero_grad = True
            try:
                return original(*args, **kwargs)
            finally:
                rec.phase = previous
                session.in_zero_grad = False
        return zero_grad

    def uninstall(self):
        for undo in reversed(self.undo):
            undo()
        self.undo = []

    def value(self, t):
        """A scalar tensor's value, read without recording the reads."""
        rec = self.rec
        busy, rec.busy = rec.busy, True
        try:
            return float(t.detach().cpu().reshape(())) if torch.is_tensor(t) else float(t)
        finally:
            rec.busy = busy

    def end_step(self, loss, end=None):
        rec = self.rec
        if loss is not None:
            self.last_loss = self.value(loss)
        rec.pending_end = 0
        if rec.step_ops == 0:
            return
        rec.step(self.step_begin, end or time.monotonic_ns(), self.last_loss)
        self.last_loss = float("nan")
        self.step_begin = time.monotonic_ns()
        self.hooked = {k: r for k, r in self.hooked.items() if r() is not None}

    def _end_pending(self):
        """The first op of the next step: the step the optimizer ended is written."""
        self.end_step(None, self.rec.pending_end)
        self.step_begin = time.monotonic_ns()

    # ---- the dispatch mode ---------------------------------------------------------------------

    # Note [keel_torch direct dispatch mode]
    # PyTorch 1.13 keeps its stack of dispatch modes in Python: the one mode its C++ side calls is
    # a helper that pops the top mode, calls it, and pushes it back, with a context manager — as
    # much work per op as the recording's own. When no other mode is active at the start, the
    # session is pushed on that stack and also made the C++ side's mode itself, with
    # __torch_dispatch__ the C++ half's dispatch() (Note [keel_torch dispatch in C++]); the C++
    # side turns the mode off while it runs, as the helper would. A mode the user pushes inside
    # the recording lands on the stack above it: dispatch() sees the stack longer than one and
    # hands the call to PyTorch's helper (_delegate), which runs that mode first and comes back
    # to the session through the stack, as without the shortcut. With another mode already
    # active, or on a PyTorch whose stack is C++ (2.x), the session is pushed as any mode is.

    def __enter__(self):
        self.direct = _python_dispatch._len_torch_dispatch_stack() == 0 and \
            hasattr(_python_dispatch, "_TorchDispatchStackMode")
        self.rec.bind(self, self.direct, self.stacks, self.dumps)
        if self.direct:
            self.__torch_dispatch__ = self.rec.dispatch  # what the C++ side calls
            torch._C._push_on_torch_dispatch_stack(self)
            torch._C._set_torch_dispatch_mode(self)
        else:
            super().__enter__()
        return self

    def __exit__(self, exc_type, exc_val, exc_tb):
        if self.direct:
            _python_dispatch._pop_mode()
            del self.__torch_dispatch__
        else:
            super().__exit__(exc_type, exc_val, exc_tb)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return self.rec.dispatch(func, types, args, kwargs)

    @staticmethod
    def _delegate(func, types, args, kwargs):
        """A mode pushed inside the recording runs first (Note [keel_torch direct dispatch
        mode])."""
        return _python_dispatch._TorchDispatchStackMode().__torch_dispatch__(func, types, args,
                                                                             kwargs)

    # ---- what dispatch() asks of the Python half (Note [keel_torch dispatch in C++]) ---------

    _overload = staticmethod(_overload)

    def _stack(self):
        """The id of the Python call stack of the user's code (frames inside torch and
        keel_torch left out)."""
        frames = []
        for f in reversed(traceback.extract_stack()[:-1]):
            if f.filename.startswith(_TORCH_DIR) or f.filename.startswith(_OWN_DIR):
                continue
            frames.append((f.name, f.filename, int(f.lineno or 0)))
        key = tuple(frames)
        if key not in self.stack_ids:
            self.stack_ids[key] = len(self.stack_ids) + 1
            self.rec.stack(self.stack_ids[key], frames)
        return self.stack_ids[key]


@contextlib.contextmanager
def record(path, model=None, optimizer=None, md5=True, stats=True, stacks=False, config=None,
           seed=0, rounded_md5=0, dumps=False):
    """Records the PyTorch ops run inside the block into the Keel recording `path` (see the
    module's docstring). An existing file at `path` is replaced when the recording starts; a
    directory, a device, a FIFO or the running script is refused, and a symlink's file is
    written, the link kept (as `keel record -o`). dumps=True stores every op's output
    values (zstd), dumps="blocks.1" those of the ops in that module, so `keel diff` compares them
    element by element (as `keel record --dumps`)."""
    session = _Session(path, model, optimizer, md5, stats, stacks, config, seed, rounded_md5,
                       dumps)
    status = "finished"
    try:
        session.install()  # inside: a failure half-way undoes what was patched, and closes
        _active.session = session
        with session:
            yield session
    except KeyboardInterrupt:
        status = "stopped: interrupted (SIGINT)"
        raise
    except BaseException as e:  # the recording keeps what was recorded, and says why it ended
        status = "failed: " + (str(e).splitlines() or [type(e).__name__])[0]
        raise
    finally:
        session.uninstall()
        _active.session = None
        try:
            session.end_step(None, session.rec.pending_end)
        finally:
            session.rec.unbind()
            session.rec.close(status)


def step(loss=None):
    """Ends the current step of the active recording (its loss: `loss`, a number or a scalar
    tensor, else the tensor .backward() was last called on)."""
    session = getattr(_active, "session", None)
    if session is None:
        raise RuntimeError("keel_torch.step() outside keel_torch.record()")
    session.end_step(loss)
