"""Record a PyTorch training run into a Keel recording that every Keel tool opens.

    import keel_torch
    with keel_torch.record("run.db", model=model, optimizer=opt, md5=True, stats=True):
        for x, y in batches:
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()          # ends the step: its loss is the tensor .backward() was called on
                                # (the sum of them, with gradient accumulation)
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
.backward() returns and outside any module that read gradients (gradient clipping) are phase
optimizer, as Keel's own clip_grad_norm is (Note [keel_torch optimizer work]). Memory snapshots:
keel_torch.snapshot.import_snapshot (python3 -m keel_torch import-snapshot). rounded_md5=N adds
Keel's rounded MD5 (N significant digits: equal across frameworks within rounding). A recording
of Keel's GPT in PyTorch (tests/python/keel_gpt.py) and a Keel run of it compare op by op with
`keel diff` (docs/torch.md).

Note [keel_torch backward scopes]
A backward op's scope is the scope of the forward op it differentiates (its forward_seq), as
Keel's engine scopes a backward op: the gradient of blocks.1.mlp's `mul` is blocks.1.mlp's,
which lets `keel diff` pair a PyTorch run's backward ops with a Keel run's module by module.
Where autograd names no forward op (gradient accumulation into a parameter), it is the module
whose output gradient autograd was working back from: a hook on each module's outputs sets
`backward_scope` when their gradient is ready.

Note [keel_torch optimizer work]
Between .backward() and the end of the step (opt.step(), keel_torch.step(), or a module called
again), an op outside any module is the optimizer's when it reads a gradient: the buffer of a
parameter's .grad as .backward() left it (parameters of the model and the optimizer given), or a
tensor an op of this kind made (clip_grad_norm_'s norms, their sum, the clipping factor). Any
other op there is forward work: the next micro-batch's data under gradient accumulation, the next
batch of a loop without an optimizer. (Every op there was the optimizer's, and the state lasted
until a module was called: a step ended by keel_torch.step() left the next batch's randn under
optimizer.)

Note [keel_torch run status]
The status a recording ends with (_failure): "finished"; after sys.exit(0) too (the program said
it succeeded); "failed: exit code N" for another exit code ("failed: exit code 1: message" for
sys.exit("message"), as Python exits 1 and prints it); "failed: Type: first line" for an
exception; "stopped: interrupted (SIGINT)"; "stopped: terminated (SIGTERM)" (Note [keel_torch
SIGTERM]). A write of the recording that failed names itself instead (endedStatus in _keel.cpp).

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
import signal
import socket
import sys
import threading
import time
import traceback
import types
import warnings
import weakref

import torch
from torch.utils import _python_dispatch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from . import _keel

__all__ = ["record", "step", "hash_tensor"]

# The dtypes whose tensors are hashed (Note [keel_torch dtypes Keel lacks] in _keel.cpp): Keel's
# own, and those whose bytes have one meaning, hashed by the same layout under PyTorch's name
# (MD5 only).
_DTYPES = {
    torch.float32: "float32",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float64: "float64",
    torch.int32: "int32",
    torch.int64: "int64",
    torch.bool: "bool",
    torch.uint8: "uint8",
    torch.int8: "int8",
    torch.int16: "int16",
    torch.complex32: "complex32",
    torch.complex64: "complex64",
    torch.complex128: "complex128",
}
# Dtypes NumPy has no type for: their bytes through a same-sized integer view.
_AS_INTEGERS = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.bool: torch.uint8,
                torch.complex32: torch.int32}
_TORCH_DIR = os.path.dirname(torch.__file__)
_OWN_DIR = os.path.dirname(__file__)
_unhashed_dtypes = set()  # dtypes hash_tensor has warned about

# Note [keel_torch own ops]: the ops keel_torch runs itself (reading a tensor's bytes: detach,
# contiguous, cpu, view; reading a loss) run with PyTorch's dispatch to Python turned off, so no
# dispatch mode sees them: not the recording, not a mode of the user's entered before it (which
# saw every hashed tensor's detach and contiguous), not an outer recording.
_NoDispatch = torch._C._DisableTorchDispatch


def _dtype_name(t):
    return _DTYPES.get(t.dtype, str(t.dtype).replace("torch.", ""))


def hash_tensor(t, md5=True, stats=True, rounded_digits=0):
    """(md5, stats, rounded md5) of a tensor's values as Keel computes them for the same bytes
    (rounded: to rounded_digits significant digits, 0 for none; docs/capture.md). A dtype Keel
    lacks (uint8, int8, int16, complex) has its MD5 only, of the same layout under PyTorch's name;
    one with no layout to hash (quantized) gives ("", None, "") and a warning, once per dtype.
    Run inside a recording, its own ops are not recorded."""
    if t.dtype not in _DTYPES:
        if t.dtype not in _unhashed_dtypes:
            _unhashed_dtypes.add(t.dtype)
            warnings.warn("keel_torch: %s tensors are not hashed: their bytes have no layout "
                          "in Keel's MD5 (docs/torch.md)" % _dtype_name(t), RuntimeWarning,
                          stacklevel=2)
        return "", None, ""
    return _keel.hash(_host_bytes(t), _dtype_name(t), list(t.shape), md5, stats, rounded_digits)


def _host_bytes(t):
    """A tensor's elements in row-major order as a byte buffer on the host (CUDA tensors copied),
    read without any dispatch mode seeing it (Note [keel_torch own ops])."""
    guard = _NoDispatch()  # noqa: F841 (held until the function returns)
    host = t.detach().contiguous().cpu()
    as_integers = _AS_INTEGERS.get(host.dtype)
    if as_integers is not None:
        host = host.view(as_integers)
    return memoryview(host.numpy().reshape(-1)).cast("B")


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


def _returns(func):
    """How each return's tensors stand after the op (Note [keel_torch versions] in _keel.cpp):
    (kind, position, name) per return, kind 0 a tensor of its own, 1 a view of the argument at
    position (None: keyword-only) named name, 2 an argument the op wrote (`Tensor(a!)`)."""
    try:
        schema = func._schema
    except AttributeError:
        return ()
    arguments, position, result = [], 0, []
    for a in schema.arguments:
        arguments.append((None if a.kwarg_only else position, a.name, a.alias_info))
        if not a.kwarg_only:
            position += 1
    for r in schema.returns:
        alias = r.alias_info
        if alias is None:
            result.append((0, None, None))
        elif alias.is_write:
            result.append((2, None, None))
        else:
            # The argument of the same alias set; a Tensor(a)[] return names no set here (split):
            # the first argument that is aliased at all.
            aliased = [x for x in arguments if x[2] is not None]
            base = [x for x in aliased if x[2].before_set & alias.before_set] or aliased
            result.append((1, base[0][0], base[0][1]) if base else (0, None, None))
    return tuple(result)


# Note [keel_torch uninitialised memory] (in _keel.cpp): the ATen ops (every overload, .out
# included; prims too) whose outputs hold memory nothing has written, in PyTorch 1.13 and 2.x.
_ALLOCATION_ONLY = frozenset({
    "empty", "empty_like", "new_empty", "empty_strided", "new_empty_strided", "empty_permuted",
    "empty_quantized", "_empty_affine_quantized", "_empty_per_channel_affine_quantized",
})
_UNINITIALISED = "outputs not hashed: an allocation-only op leaves their memory unwritten"

_active = threading.local()
_OVERLOADS = {}  # id(ATen overload) -> _overload()'s tuple and the overload (kept alive)


def _overload(func):
    """What a recording keeps of an ATen overload: (op name, attributes JSON, the arguments it
    writes, whether it is left out, what to call to run it, how its returns stand after it,
    whether it only allocates its outputs), once per overload for every recording of the
    process."""
    known = _OVERLOADS.get(id(func))  # by id: an overload's __hash__ is Python code
    if known is None:
        name = str(func.overloadpacket.__name__) if hasattr(func, "overloadpacket") else str(func)
        # An OpOverload's __call__ is a Python frame around its C++ operator `_op`.
        run = func._op if isinstance(func, torch._ops.OpOverload) and hasattr(func, "_op") \
            else func
        attributes = {"aten": str(func)}
        allocation_only = name in _ALLOCATION_ONLY
        if allocation_only:
            attributes["uninitialised"] = _UNINITIALISED
        # The profiler's markers are not computation.
        known = _OVERLOADS[id(func)] = (name, json.dumps(attributes), _written_arguments(func),
                                        name.startswith("_record_function"), run,
                                        _returns(func), allocation_only, func)
    return known[:7]


class _Session(TorchDispatchMode):
    def __init__(self, path, model, optimizer, md5, stats, stacks, config, seed, rounded_md5,
                 dumps):
        super().__init__()
        # The arguments as _arguments() checked them: nothing below refuses one.
        self.md5, self.stats, self.stacks, self.rounded = md5, stats, stacks, rounded_md5
        # dumps: False, True (every op's outputs) or a scope prefix ("blocks.1").
        self.dumps = dumps
        self.path = os.fspath(path)
        options = json.dumps({"framework": "torch", "md5": md5, "stats": stats, "stacks": stacks,
                              "rounded_md5_digits": rounded_md5, "dumps": dumps})
        # The running script is an input the recording must never replace (record(__file__)).
        script = getattr(sys.modules.get("__main__"), "__file__", None) or ""
        # Checks the output and locks it; the file is written from open() on, once the setup is
        # done (a setup that fails leaves an existing recording as it was).
        self.rec = _keel.Recording(self.path, "cpu", socket.gethostname(), config, seed, options,
                                   torch.__version__, script)
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
        self.last_loss = None  # None: no loss reported (a NaN is a NaN)
        self.stack_ids = {}
        self.optimizer = optimizer
        self.lr = None            # the learning rate of the optimizer's last step
        self.closed = False
        self.in_zero_grad = False
        self.undo = []
        self.hooked = {}          # output tensors given a backward-scope hook: id -> weakref
        self.direct = False       # Note [keel_torch direct dispatch mode]
        self.other_threads = 0    # modules called in other threads while recording
        self.steps_asked = 0      # keel_torch.step() calls

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
                session.other_threads += 1  # (said at the end if nothing was recorded)
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
            if session.closed:  # a method kept past the recording (Note [keel_torch optimizer])
                return original_backward(tensor, *args, **kwargs)
            rec = session.rec
            if tensor.numel() == 1:  # the step's loss: the sum of those backward ran on
                loss = session.value(tensor)  # (micro-batches scaled by 1/N: their mean)
                session.last_loss = loss if session.last_loss is None else session.last_loss + loss
            rec.hook_pending()
            previous, rec.phase = rec.phase, "backward"
            rec.backward_scope = ""
            rec.forward_seq = 0
            try:
                return original_backward(tensor, *args, **kwargs)
            finally:
                rec.phase = previous
                rec.after_backward = True
                rec.gradients(session._gradients())  # Note [keel_torch optimizer work]

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

            def optimizer_step(optimizer, *args, **kwargs):
                if session.closed:  # Note [keel_torch optimizer]
                    return original_step(*args, **kwargs)
                rec = session.rec
                session.lr = _learning_rate(optimizer)  # the rate this update uses
                previous, rec.phase = rec.phase, "optimizer"
                try:
                    return original_step(*args, **kwargs)
                finally:
                    rec.phase = previous
                    # The step ends here; its record waits for the next step's first op
                    # (Note [keel_torch step boundary] in _keel.cpp).
                    rec.pending_end = time.monotonic_ns()

            # Note [keel_torch optimizer]: a method of the optimizer, as the one it replaces, so
            # a learning-rate scheduler made inside the recording can wrap it (it needs
            # __self__ and __func__), and one made before it still finds its counting wrapper
            # (`_with_counter`: without it PyTorch warns that optimizer.step() was overridden
            # after the scheduler's initialization). A scheduler made inside may have wrapped
            # it when the recording ends: then it stays, and calls straight through.
            if getattr(original_step, "_with_counter", False):
                optimizer_step._with_counter = True
            self._replace(opt, "step", types.MethodType(optimizer_step, opt))
            self._replace(opt, "zero_grad", self._zero_grad(opt.zero_grad))
        if self.model is not None:  # model.zero_grad() is the optimizer's work too
            self._replace(self.model, "zero_grad", self._zero_grad(self.model.zero_grad))

    def _replace(self, obj, name, method):
        """Sets obj.name to method until the recording ends: then the attribute is as it was,
        unless something replaced it meanwhile (Note [keel_torch optimizer])."""
        had, before = name in obj.__dict__, obj.__dict__.get(name)
        setattr(obj, name, method)

        def undo():
            if obj.__dict__.get(name) is not method:
                return
            if had:
                setattr(obj, name, before)
            else:
                del obj.__dict__[name]
        self.undo.append(undo)

    def _gradients(self):
        """The gradients of the model's and the optimizer's parameters (Note [keel_torch
        optimizer work])."""
        params = []
        if self.model is not None:
            params.extend(self.model.parameters())
        if self.optimizer is not None:
            for group in self.optimizer.param_groups:
                params.extend(group["params"])
        seen, grads = set(), []
        for p in params:
            if id(p) not in seen and p.grad is not None:
                seen.add(id(p))
                grads.append(p.grad)
        return grads

    def _zero_grad(self, original):
        """`original` (an optimizer's or a model's zero_grad) recorded as optimizer work of the
        step the optimizer ended (Note [keel_torch step boundary] in _keel.cpp)."""
        session = self

        def zero_grad(*args, **kwargs):
            if session.closed:
                return original(*args, **kwargs)
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
        self.closed = True
        for undo in reversed(self.undo):
            undo()
        self.undo = []

    def value(self, t):
        """A scalar tensor's value, read without any dispatch mode seeing the reads (Note
        [keel_torch own ops])."""
        guard = _NoDispatch()  # noqa: F841 (held until the function returns)
        return float(t.detach().cpu().reshape(())) if torch.is_tensor(t) else float(t)

    @staticmethod
    def check_loss(loss):
        """keel_torch.step()'s loss: None, a real number or a one-element tensor (TypeError
        naming what it got otherwise)."""
        import numbers
        if loss is None or (isinstance(loss, numbers.Real) and not isinstance(loss, bool)):
            return
        if torch.is_tensor(loss) and loss.numel() == 1 and not loss.is_complex():
            return
        got = ("a tensor of %d elements" % loss.numel() if torch.is_tensor(loss)
               else type(loss).__name__)
        raise TypeError("keel_torch.step: loss must be a number or a one-element tensor, got %s"
                        % got)

    def end_step(self, loss, end=None):
        rec = self.rec
        if loss is not None:
            self.last_loss = self.value(loss)
        rec.pending_end = 0
        # Note [keel_torch optimizer work]: what follows the step is not its optimizer's work.
        rec.after_backward = False
        if rec.step_ops == 0:
            return
        lr = self.lr
        if lr is None and self.optimizer is not None:  # a step ended by keel_torch.step()
            lr = _learning_rate(self.optimizer)
        rec.step(self.step_begin, end or time.monotonic_ns(), self.last_loss, lr)
        self.lr = None
        self.last_loss = None  # None: no loss reported (a NaN is a NaN)
        self.step_begin = time.monotonic_ns()
        self.hooked = {k: r for k, r in self.hooked.items() if r() is not None}

    def warn_unmatched_dumps(self):
        """dumps="scope" that no op's scope matched stored nothing: said once, at the end."""
        if isinstance(self.dumps, str) and self.dumps and self.rec.counts()["dumped_ops"] == 0:
            warnings.warn("keel_torch.record: dumps=%r matched no module scope, so no values were "
                          "stored (a scope is a name of model.named_modules(), such as "
                          "'blocks.1')" % self.dumps, RuntimeWarning, stacklevel=4)

    def warn_nothing_recorded(self):
        """A recording that ends with no op recorded is empty: said once, with the likely cause
        (a training loop in another thread: ops are recorded in the thread that entered
        record(), one recording per thread)."""
        if self.rec.seq != 0:
            return
        if self.other_threads:
            why = ("the model ran in another thread (%d module calls), and ops run in other "
                   "threads are not recorded" % self.other_threads)
        else:
            asked = {0: "", 1: " (though keel_torch.step() was called once)"}.get(
                self.steps_asked, " (though keel_torch.step() was called %d times)"
                % self.steps_asked)
            why = ("no PyTorch op ran in this thread inside the block%s; ops run in other "
                   "threads are not recorded" % asked)
        warnings.warn("keel_torch.record: recorded 0 ops into %s: %s (one recording per thread: "
                      "enter keel_torch.record() in the thread that trains)" % (self.path, why),
                      RuntimeWarning, stacklevel=4)

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


def _learning_rate(optimizer):
    """The first parameter group's learning rate, or None."""
    try:
        return float(optimizer.param_groups[0]["lr"])
    except (AttributeError, IndexError, KeyError, TypeError, ValueError):
        return None


class _Terminated(BaseException):
    """SIGTERM arrived while recording (Note [keel_torch SIGTERM]); a BaseException, as
    KeyboardInterrupt, so that `except Exception` in the loop lets it through."""


class _SigtermGuard:
    """Note [keel_torch SIGTERM]: SIGTERM's default action ends the process at once, and the
    recording with it, marked running with no process writing it and its last step lost. While
    recording (in the main thread, where the handler is the default) SIGTERM raises _Terminated in
    the loop instead, as SIGINT raises KeyboardInterrupt: the recording closes as `stopped:
    terminated (SIGTERM)` with the steps done, the default handler is put back, and the signal is
    raised again, so the process ends as SIGTERM ends it. A handler of the user's is left alone."""

    def __init__(self):
        self.installed = False
        self.received = False
        if threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
            return
        signal.signal(signal.SIGTERM, self._handler)
        self.installed = True

    def _handler(self, signum, frame):
        self.received = True
        raise _Terminated("SIGTERM")

    def restore(self):
        """The default handler back; a SIGTERM that came is raised again (the process ends)."""
        if not self.installed:
            return
        self.installed = False
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if self.received:
            sys.stdout.flush()
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGTERM)


def _failure(e):
    """The status of a run that ended with exception e (Note [keel_torch run status])."""
    if isinstance(e, KeyboardInterrupt):
        return "stopped: interrupted (SIGINT)"
    if isinstance(e, _Terminated):
        return "stopped: terminated (SIGTERM)"
    if isinstance(e, SystemExit):
        code = e.code
        if code is None or code == 0:
            return "finished"
        if isinstance(code, int):
            return "failed: exit code %d" % code
        first = (str(code).splitlines() or [""])[0]
        return "failed: exit code 1: " + first  # Python prints the message and exits 1
    first = (str(e).splitlines() or [""])[0]
    return "failed: " + type(e).__name__ + (": " + first if first else "")


def _flag(name, value):
    """A yes/no argument of record(): True, False (or 1, 0)."""
    if isinstance(value, bool) or (isinstance(value, int) and value in (0, 1)):
        return bool(value)
    raise TypeError("keel_torch.record: %s must be True or False, got %r" % (name, value))


def _integer(name, value, low, high, what):
    """An integer argument of record() in low..high (`what` says what it may be)."""
    import operator
    if isinstance(value, bool):
        raise TypeError("keel_torch.record: %s must be an integer (%s), got %r"
                        % (name, what, value))
    try:
        number = operator.index(value)
    except TypeError:
        raise TypeError("keel_torch.record: %s must be an integer (%s), got %r"
                        % (name, what, value)) from None
    if not low <= number <= high:
        raise ValueError("keel_torch.record: %s must be %s, got %d" % (name, what, number))
    return number


def _arguments(model, optimizer, md5, stats, stacks, config, seed, rounded_md5, dumps):
    """record()'s arguments checked before the output is touched (a bad one raised only once the
    recording had replaced the file): the values to record with, or TypeError / ValueError
    naming the argument."""
    if model is not None and not isinstance(model, torch.nn.Module):
        raise TypeError("keel_torch.record: model must be a torch.nn.Module or None, got %s"
                        % type(model).__name__)
    if optimizer is not None and not (
            callable(getattr(optimizer, "step", None)) and
            callable(getattr(optimizer, "zero_grad", None)) and
            isinstance(getattr(optimizer, "param_groups", None), (list, tuple)) and
            hasattr(optimizer, "__dict__")):
        raise TypeError("keel_torch.record: optimizer must be a torch.optim.Optimizer (step(), "
                        "zero_grad() and param_groups) or None, got %s" % type(optimizer).__name__)
    md5, stats, stacks = _flag("md5", md5), _flag("stats", stats), _flag("stacks", stacks)
    try:
        config = json.dumps(config) if config is not None else "{}"
    except (TypeError, ValueError) as e:
        raise TypeError("keel_torch.record: config must be JSON data (a dict of numbers, "
                        "strings, lists), and is not: %s" % e) from None
    seed = _integer("seed", seed, 0, 2**64 - 1, "in 0..2**64-1")
    rounded_md5 = _integer("rounded_md5", rounded_md5, 0, 17,
                           "0 (none) or a number of significant digits in 1..17")
    if not isinstance(dumps, (bool, str)):
        raise TypeError("keel_torch.record: dumps must be True, False or a module scope "
                        "('blocks.1'), got %r" % (dumps,))
    return md5, stats, stacks, config, seed, rounded_md5, dumps


def _check_path(path):
    """Refusals keel_torch makes before the writer sees the path."""
    name = os.fspath(path)
    if not isinstance(name, str):
        name = os.fsdecode(name)
    for suffix in ("-journal", "-wal", "-shm"):
        if name.endswith(suffix):
            raise RuntimeError("keel_torch.record: output %s: a name ending in %s is SQLite's own "
                               "file beside a recording; choose another name" % (name, suffix))
    folder = os.path.dirname(os.path.abspath(name))
    if not os.path.isdir(folder):
        raise RuntimeError("keel_torch.record: output %s: no such directory %s" % (name, folder))
    return name


@contextlib.contextmanager
def record(path, model=None, optimizer=None, md5=True, stats=True, stacks=False, config=None,
           seed=0, rounded_md5=0, dumps=False):
    """Records the PyTorch ops run inside the block into the Keel recording `path` (see the
    module's docstring). Every argument is checked first (TypeError or ValueError naming it);
    an existing recording at `path` is replaced, keeping its permission bits, once the setup has
    succeeded (a setup that fails leaves it as it was); a directory, a device, a FIFO, the
    running script, or a file or folder this user may not write is refused, and a symlink's file
    is written, the link kept (as `keel record -o`). A recording that ends with no op recorded
    warns (ops of other threads are not recorded). dumps=True stores every op's output
    values (zstd), dumps="blocks.1" those of the ops in that module, so `keel diff` compares them
    element by element (as `keel record --dumps`). Recordings do not nest: record() inside
    another in the same thread raises RuntimeError and leaves the outer one as it was."""
    outer = getattr(_active, "session", None)
    if outer is not None:
        raise RuntimeError("keel_torch.record: already recording to %s in this thread; "
                           "recordings do not nest (end that one first)" % outer.path)
    md5, stats, stacks, config, seed, rounded_md5, dumps = _arguments(
        model, optimizer, md5, stats, stacks, config, seed, rounded_md5, dumps)
    path = _check_path(path)
    session = _Session(path, model, optimizer, md5, stats, stacks, config, seed, rounded_md5,
                       dumps)
    status = "finished"
    sigterm = None
    try:
        sigterm = _SigtermGuard()
        session.install()  # inside: a failure half-way undoes what was patched, and closes
        session.rec.open()  # the setup is done: the recording replaces the file from here
        _active.session = session
        with session:
            yield session
    except BaseException as e:  # the recording keeps what was recorded, and says why it ended
        status = _failure(e)
        raise
    finally:
        if sigterm is not None and sigterm.received and status == "finished":
            status = "stopped: terminated (SIGTERM)"  # the loop caught _Terminated itself
        session.uninstall()
        _active.session = None
        try:
            if session.rec.opened:
                session.end_step(None, session.rec.pending_end)
                session.warn_unmatched_dumps()
                if status == "finished":
                    session.warn_nothing_recorded()
        finally:
            try:
                session.rec.unbind()
                session.rec.close(status)
            finally:
                if sigterm is not None:
                    sigterm.restore()


def step(loss=None):
    """Ends the current step of the active recording (its loss: `loss`, a number or a scalar
    tensor, else the tensor .backward() was last called on)."""
    session = getattr(_active, "session", None)
    if session is None:
        raise RuntimeError("keel_torch.step() outside keel_torch.record()")
    session.check_loss(loss)
    session.steps_asked += 1
    session.end_step(loss)
