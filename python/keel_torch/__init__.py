"""Record a PyTorch training run into a Keel recording that every Keel tool opens.

    import keel_torch
    with keel_torch.record("run.db", model=model, optimizer=opt, md5=True, stats=True):
        for x, y in batches:
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()          # ends the step: its loss is the tensor .backward() was called on
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
import threading
import time
import traceback
import weakref

import torch
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
_now = time.monotonic_ns
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


def _tensors(values):
    """The tensors among an op's arguments or results (top level and inside lists/tuples), in
    order: what ATen ops take and return (a cheaper tree_flatten)."""
    found = []
    for v in values if isinstance(values, (list, tuple)) else (values,):
        if isinstance(v, torch.Tensor):
            found.append(v)
        elif isinstance(v, (list, tuple)):
            found.extend(x for x in v if isinstance(x, torch.Tensor))
    return found


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
_OVERLOADS = {}  # id(ATen overload) -> (op name, attributes JSON, written arguments, overload)


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
        self.rec = _keel.Recording(
            path, "cpu", socket.gethostname(), json.dumps(config) if config is not None else "{}",
            seed, options, torch.__version__)
        self.hashes = bool(md5 or stats or rounded_md5)
        # Hashed off the Python thread (Note [keel_torch hashing off the Python thread]).
        self.rec.hashing(md5, stats, rounded_md5, _host_bytes)
        self.names = {}
        self.model = model
        if model is not None:
            for name, module in model.named_modules():
                self.names[id(module)] = name
        self.scopes = []
        self.phase = "forward"
        self.seq = 0
        self.step_no = 1
        self.step_begin = time.monotonic_ns()
        self.step_ops = 0
        self.last_loss = float("nan")
        self.stack_ids = {}
        self.busy = False
        self.optimizer = optimizer
        self.pending_end = None  # the optimizer stepped: the step's record is due
        self.in_zero_grad = False
        self.undo = []
        self.hooked = {}          # output tensors given a backward-scope hook: id -> weakref
        self.backward_scope = ""  # the module whose backward is running
        # Note [keel_torch forward links]
        self.pending_outputs = []  # (seq, outputs) of the last forward op, hooked at the next op
        self.forward_seq = 0       # the forward op whose autograd node is running (backward)
        self.forward_scopes = {}   # this step's forward ops that may have a backward: seq -> scope
        self.after_backward = False  # .backward() returned and no module has run since

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
            session.after_backward = False
            session.scopes.append(session.names.get(id(module), type(module).__name__))
            try:
                output = original(module, *args, **kwargs)
            finally:
                name = session.scopes.pop()
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

    def _hook_forward_outputs(self):
        pending, self.pending_outputs = self.pending_outputs, []
        for seq, outputs in pending:
            for t in outputs:
                if t.requires_grad and t.grad_fn is not None:
                    t.register_hook(self._backward_of(seq))

    def _backward_of(self, seq):
        def hook(grad):
            self.forward_seq = seq
        return hook

    def _backward_scope(self, name):
        def hook(grad):
            self.backward_scope = name
        return hook

    def install(self):
        original_call = torch.nn.Module.__call__
        torch.nn.Module.__call__ = self._module_call(original_call)
        self.undo.append(lambda: setattr(torch.nn.Module, "__call__", original_call))
        session = self
        original_backward = torch.Tensor.backward

        def backward(tensor, *args, **kwargs):
            if tensor.numel() == 1:
                session.last_loss = session.value(tensor)
            session._hook_forward_outputs()
            previous, session.phase = session.phase, "backward"
            session.backward_scope = ""
            session.forward_seq = 0
            try:
                return original_backward(tensor, *args, **kwargs)
            finally:
                session.phase = previous
                session.after_backward = True

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
                previous, session.phase = session.phase, "optimizer"
                try:
                    return original_step(*args, **kwargs)
                finally:
                    session.phase = previous
                    # The step ends here; its record waits for the next step's first op.
                    session.pending_end = time.monotonic_ns()

            def zero_grad(*args, **kwargs):
                previous, session.phase = session.phase, "optimizer"
                session.in_zero_grad = True
                try:
                    return original_zero_grad(*args, **kwargs)
                finally:
                    session.phase = previous
                    session.in_zero_grad = False

            opt.step = optimizer_step
            opt.zero_grad = zero_grad
            self.undo.append(lambda: setattr(opt, "step", original_step))
            self.undo.append(lambda: setattr(opt, "zero_grad", original_zero_grad))

    def uninstall(self):
        for undo in reversed(self.undo):
            undo()
        self.undo = []

    def value(self, t):
        """A scalar tensor's value, read without recording the reads."""
        busy, self.busy = self.busy, True
        try:
            return float(t.detach().cpu().reshape(())) if torch.is_tensor(t) else float(t)
        finally:
            self.busy = busy

    def end_step(self, loss, end=None):
        if loss is not None:
            self.last_loss = self.value(loss)
        self.pending_end = None
        if self.step_ops == 0:
            return
        self.rec.step(self.step_no, self.step_begin, end or time.monotonic_ns(), self.last_loss)
        self.step_no += 1
        self.step_ops = 0
        self.last_loss = float("nan")
        self.step_begin = time.monotonic_ns()
        self.forward_scopes = {}
        self.hooked = {k: r for k, r in self.hooked.items() if r() is not None}

    # ---- ops ---------------------------------------------------------------------------------

    def _dumped(self, scope):
        """Whether an op of this scope has its outputs' values stored (dumps=)."""
        d = self.dumps
        if isinstance(d, bool):
            return d
        return scope == d or scope.startswith(d + ".") or d == ""

    @staticmethod
    def _written_tensors(written, args, kwargs):
        """The tensors an op writes: its arguments at the (position, name) pairs in `written`."""
        tensors = []
        for position, name in written:
            value = args[position] if position is not None and position < len(args) \
                else kwargs.get(name)
            if value is not None:
                tensors.extend(_tensors(value))
        return tensors

    def _stack(self):
        frames = []
        for f in reversed(traceback.extract_stack()[:-3]):
            if f.filename.startswith(_TORCH_DIR) or f.filename.startswith(_OWN_DIR):
                continue
            frames.append((f.name, f.filename, int(f.lineno or 0)))
        key = tuple(frames)
        if key not in self.stack_ids:
            self.stack_ids[key] = len(self.stack_ids) + 1
            self.rec.stack(self.stack_ids[key], frames)
        return self.stack_ids[key]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.busy:
            return func(*args, **kwargs)
        self.busy = True
        try:
            # After the optimizer's step the next step begins with the next module forward (or
            # backward): zero_grad, reading the loss, preparing the next batch stay in this one.
            if self.pending_end is not None and (self.scopes or self.phase == "backward"):
                self.end_step(None, self.pending_end)
                self.step_begin = time.monotonic_ns()
            if self.pending_outputs:
                self._hook_forward_outputs()
            # Name, attributes, written arguments once per ATen overload, for every recording
            # of the process (keyed by id: an overload's __hash__ is Python code; the entry
            # keeps the overload alive).
            known = _OVERLOADS.get(id(func))
            if known is None:
                name = str(func.overloadpacket.__name__) if hasattr(func, "overloadpacket") else str(func)
                known = _OVERLOADS[id(func)] = (name, json.dumps({"aten": str(func)}),
                                                _written_arguments(func), func)
            name, attrs, written, _ = known
            if name.startswith("_record_function"):  # the profiler's markers, not computation
                return func(*args, **kwargs)
            inputs = _tensors(args) + (_tensors(tuple(kwargs.values())) if kwargs else [])
            if written:
                # The inputs are read before the op writes them (their version, their bytes:
                # Note [keel_torch hashing off the Python thread], [keel_torch content cache]).
                self.rec.before_write(inputs, self._written_tensors(written, args, kwargs))
                begin = _now()
                try:
                    out = func(*args, **kwargs)
                except BaseException:
                    self.rec.abort_write()
                    raise
                finally:
                    self.rec.after_write()
                recorded_inputs = None
            else:
                begin = _now()
                out = func(*args, **kwargs)
                recorded_inputs = inputs
            end = _now()
            outputs = [out] if isinstance(out, torch.Tensor) else _tensors(out)
            self.seq += 1
            self.step_ops += 1
            forward_seq = 0
            phase = self.phase
            if phase == "backward":
                # Note [keel_torch backward scopes]
                forward_seq = self.forward_seq
                scope = self.forward_scopes.get(forward_seq, self.backward_scope)
            else:
                scope = self.scopes[-1] if self.scopes else ""
                # Outputs get a grad_fn when an input requires grad (only those are held: holding
                # the others changed what PyTorch 1.13 dispatched, an extra detach).
                if (phase == "forward" and torch.is_grad_enabled()
                        and any(t.requires_grad for t in inputs)):
                    self.pending_outputs.append((self.seq, outputs))
                    self.forward_scopes[self.seq] = scope
                elif phase == "forward" and self.after_backward and not self.scopes:
                    # Between .backward() and the optimizer, outside any module: gradient
                    # clipping or scaling, the optimizer's work (as Keel's clip_grad_norm).
                    phase = "optimizer"
            stack = self._stack() if self.stacks else -1
            dump = bool(self.dumps) and self._dumped(scope)
            self.rec.op(self.seq, self.step_no, phase, name, scope, attrs, begin, end,
                        forward_seq, stack, recorded_inputs, outputs, dump)
            return out
        finally:
            self.busy = False


@contextlib.contextmanager
def record(path, model=None, optimizer=None, md5=True, stats=True, stacks=False, config=None,
           seed=0, rounded_md5=0, dumps=False):
    """Records the PyTorch ops run inside the block into the Keel recording `path` (see the
    module's docstring). An existing file is replaced. dumps=True stores every op's output
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
            session.end_step(None, session.pending_end)
        finally:
            session.rec.close(status)


def step(loss=None):
    """Ends the current step of the active recording (its loss: `loss`, a number or a scalar
    tensor, else the tensor .backward() was last called on)."""
    session = getattr(_active, "session", None)
    if session is None:
        raise RuntimeError("keel_torch.step() outside keel_torch.record()")
    session.end_step(loss)
