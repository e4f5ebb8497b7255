"""keel_torch (issue 19) through the real package and the real keel binary: a PyTorch training
loop recorded with keel_torch.record() opens in `keel inspect` and `keel ops` with its steps,
losses, phases and module scopes; the MD5s are Keel's (the documented digest of the element
bytes and the dtype/shape trailer); a failure inside the block ends the recording as failed,
keeping what was recorded. Run by ctest with PYTHONPATH at the build tree and KEEL_CLI the keel
binary."""

import hashlib
import os
import re
import signal
import stat
import struct
import json
import subprocess
import sys
import tempfile
import unittest

import torch

import keel_torch

KEEL = os.environ["KEEL_CLI"]


def keel(*args):
    r = subprocess.run([KEEL, *args], capture_output=True, text=True)
    return r.returncode, r.stdout, r.stderr


def keel_md5(t):
    """docs/capture.md: MD5 over the row-major element bytes, then dtype name, NUL, the rank and
    each dimension as little-endian int64."""
    data = t.detach().contiguous().numpy().tobytes()
    trailer = b"float32\0" + struct.pack("<q", t.dim()) + b"".join(struct.pack("<q", d) for d in t.shape)
    return hashlib.md5(data + trailer).hexdigest()


def freed_block_of(value):
    """Fills a block of 4x1024 floats with `value` and frees it (for the next allocation of that
    size), unseen by any recording."""
    guard = torch._C._DisableTorchDispatch()  # noqa: F841 (held until the function returns)
    junk = torch.full((4, 1024), value)
    del junk


def train(path, steps=2, fail_at=None):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(5, 8), torch.randn(5, 4)
    losses = []
    with keel_torch.record(path, model=model, optimizer=opt, stacks=True):
        for i in range(steps):
            if fail_at == i:
                raise ValueError("the data loader broke")
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
    return losses


class KeelTorchTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.dir.name, "torch.db")

    def tearDown(self):
        self.dir.cleanup()

    def test_a_training_loop_opens_in_keel_with_steps_losses_phases_and_scopes(self):
        losses = train(self.path)
        rc, out, err = keel("inspect", self.path)
        self.assertEqual(rc, 0, err)
        self.assertIn("backend torch", out)
        self.assertIn("status finished", out)
        self.assertIn("steps      2", out)
        self.assertIn("step 1    loss %.4f" % losses[0], out)
        self.assertIn("step 2    loss %.4f" % losses[1], out)
        # Two Linear layers' addmm in each step's forward; SGD's add_ in the optimizer phase;
        # zero_grad's zero_ with it (zero_grad belongs to the step it follows).
        self.assertRegex(out, r"addmm\s+4\s+0\s+0")
        self.assertRegex(out, r"zero_\s+0\s+0\s+8")
        rc, out, err = keel("ops", self.path, "--step", "1", "--phase", "forward")
        self.assertEqual(rc, 0, err)
        rows = [l.split() for l in out.splitlines() if " addmm " in l]
        self.assertEqual([r[4] for r in rows], ["0", "2"])  # scopes: model[0], model[2]
        # Backward ops carry the scope of the module they work back through: ReLU's backward is
        # model[1]'s, the second Linear's matmuls model[2]'s.
        rc, out, err = keel("ops", self.path, "--step", "1", "--phase", "backward")
        self.assertEqual(rc, 0, err)
        rows = [l.split() for l in out.splitlines()]
        scopes = {r[3]: r[4] for r in rows if len(r) > 5 and r[0].isdigit()}
        self.assertEqual(scopes["threshold_backward"], "1")
        first_mm = [l.split()[4] for l in out.splitlines() if " mm " in l][0]
        self.assertEqual(first_mm, "2")

    def test_backward_ops_name_the_forward_op_they_differentiate(self):
        """Note [keel_torch forward links]: each backward op's forward_seq (keel export csv) is
        the forward op whose autograd node ran it, in the same step."""
        import csv
        import io
        train(self.path)
        rc, out, err = keel("export", "csv", self.path)
        self.assertEqual(rc, 0, err)
        rows = list(csv.DictReader(io.StringIO(out)))
        by_seq = {int(r["seq"]): r for r in rows}
        pairs = set()
        for r in rows:
            f = int(r["forward_seq"])
            if r["phase"] != "backward":
                self.assertEqual(f, 0, r)
                continue
            if f == 0:
                continue
            fwd = by_seq[f]
            self.assertEqual(fwd["phase"], "forward", r)
            self.assertEqual(fwd["step"], r["step"], r)
            self.assertLess(f, int(r["seq"]))
            pairs.add((r["op"], fwd["op"], fwd["scope"]))
        self.assertIn(("mse_loss_backward", "mse_loss", ""), pairs)
        self.assertIn(("threshold_backward", "relu", "1"), pairs)
        # A Linear is t + addmm: the weight's gradient (mm) belongs to addmm, its transpose to t.
        self.assertIn(("mm", "addmm", "2"), pairs)
        self.assertIn(("mm", "addmm", "0"), pairs)
        self.assertIn(("t", "t", "2"), pairs)
        linked = sum(1 for r in rows if r["phase"] == "backward" and r["forward_seq"] != "0")
        self.assertGreaterEqual(linked, 10)

    def test_md5s_are_keels_digest_of_the_bytes(self):
        t = torch.arange(12, dtype=torch.float32).reshape(3, 4) / 7
        md5, stats, rounded = keel_torch.hash_tensor(t, rounded_digits=4)
        self.assertEqual(md5, keel_md5(t))
        # Rounded to 4 digits, a change in the 7th digit keeps the digest; in the 3rd, not.
        self.assertEqual(keel_torch.hash_tensor(t * (1 + 1e-7), rounded_digits=4)[2], rounded)
        self.assertNotEqual(keel_torch.hash_tensor(t * 1.01, rounded_digits=4)[2], rounded)
        self.assertEqual(len(rounded), 32)
        self.assertAlmostEqual(stats["mean"], float(t.mean()), places=6)
        self.assertAlmostEqual(stats["max"], 11 / 7, places=6)
        # A non-contiguous view hashes like its contiguous copy.
        self.assertEqual(keel_torch.hash_tensor(t.t())[0], keel_md5(t.t().contiguous()))
        # Recorded: the first op's output is model[0].weight transposed.
        train(self.path, steps=1)
        rc, out, err = keel("ops", self.path, "--step", "1", "--limit", "1")
        self.assertEqual(rc, 0, err)
        torch.manual_seed(0)
        weight = torch.nn.Linear(8, 16).weight
        self.assertIn(keel_md5(weight.t().contiguous())[:16], out)

    def test_a_failure_inside_the_block_keeps_what_was_recorded(self):
        with self.assertRaises(ValueError):
            train(self.path, steps=3, fail_at=1)
        rc, out, err = keel("inspect", self.path)
        self.assertEqual(rc, 0, err)
        # The exception's type and first line (it said only "failed: the data loader broke").
        self.assertIn("status failed: ValueError: the data loader broke\n", out)
        self.assertIn("steps      1", out)

    def test_an_output_that_is_not_a_recording_to_replace_is_refused_and_kept(self):
        # As `keel record -o`: a FIFO (a device: /dev/null, which this destroyed as root), a
        # directory or the running script is refused before anything is written; a symlink's
        # file is written and the link kept.
        fifo = os.path.join(self.dir.name, "fifo")
        os.mkfifo(fifo)
        folder = os.path.join(self.dir.name, "folder")
        os.mkdir(folder)
        for bad, words in ((fifo, "is a FIFO"), (folder, "is a directory"),
                           (os.path.abspath(sys.modules["__main__"].__file__),
                            "is the running script")):
            with self.assertRaises(RuntimeError) as cm:
                train(bad, steps=1)
            self.assertIn("keel_torch.record: output " + bad, str(cm.exception))
            self.assertIn(words, str(cm.exception))
        notes = os.path.join(self.dir.name, "notes.txt")
        with open(notes, "w") as f:
            f.write("my notes\n")
        with self.assertRaises(RuntimeError) as cm:
            train(notes, steps=1)
        self.assertIn("exists and is not a recording", str(cm.exception))
        with open(notes) as f:
            self.assertEqual(f.read(), "my notes\n")
        self.assertTrue(stat.S_ISFIFO(os.lstat(fifo).st_mode))
        self.assertTrue(os.path.isdir(folder))
        with open(sys.modules["__main__"].__file__, "rb") as f:
            self.assertTrue(f.read(3) == b'"""')
        link = os.path.join(self.dir.name, "link.db")
        os.symlink("torch.db", link)
        train(link, steps=1)
        self.assertTrue(os.path.islink(link))
        rc, out, err = keel("inspect", self.path)
        self.assertEqual(rc, 0, err)
        self.assertIn("steps      1", out)

    def test_work_after_the_optimizer_step_goes_to_the_step_it_belongs_to(self):
        # Note [keel_torch step boundary]: model.zero_grad() and reading the loss stay in the step
        # the optimizer ended; the next batch is the next step's first forward work.
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 4))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with keel_torch.record(self.path, model=model, optimizer=opt):
            for _ in range(3):
                loss = model(torch.randn(5, 8)).pow(2).mean()
                loss.backward()
                opt.step()
                model.zero_grad()
                float(loss.detach().item())
        rc, out, err = keel("ops", self.path)
        self.assertEqual(rc, 0, err)
        rows = [l.split() for l in out.splitlines() if l[:1] == " " and l.split()[0].isdigit()]
        randn = [(r[1], r[2]) for r in rows if r[3] == "randn"]
        self.assertEqual(randn, [("1", "forward"), ("2", "forward"), ("3", "forward")], out)
        zeroing = sorted({(r[1], r[2]) for r in rows if r[3] == "zero_"})
        self.assertEqual(zeroing, [("1", "optimizer"), ("2", "optimizer"), ("3", "optimizer")],
                         out)
        detach = sorted({r[1] for r in rows if r[3] == "detach" and r[2] != "backward"})
        self.assertNotIn("4", detach, out)

    def test_the_same_path_recorded_twice_in_one_process(self):
        # The output lock goes with close(): a second recording of the same path in the same
        # process (a notebook's next cell) found its own lock still held.
        model = torch.nn.Sequential(torch.nn.Linear(8, 4))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        sessions = []  # held, as a `with ... as s` or a traceback holds them
        for _ in range(2):
            with keel_torch.record(self.path, model=model, optimizer=opt) as s:
                sessions.append(s)
                model(torch.randn(5, 8)).pow(2).mean().backward()
                opt.step()
        self.assertFalse(os.path.exists(os.path.join(self.dir.name, ".torch.db.lock")))
        rc, out, err = keel("inspect", self.path)
        self.assertEqual(rc, 0, err)
        self.assertIn("status finished", out)

    def test_step_outside_a_recording_is_an_error(self):
        with self.assertRaises(RuntimeError):
            keel_torch.step()

    def run_until_a_write_error(self, loop):
        """Runs `loop` (Python lines, indented for the `with` block) in a child recording a
        Linear model to self.path with SIGXFSZ ignored; expects the `with` to raise a
        RuntimeError naming the file and the run to be marked failed with it. Returns (the
        error's first line, keel inspect's output)."""
        script = (
            "import os, resource, signal, sys, torch, keel_torch\n"
            "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
            "model = torch.nn.Linear(64, 64)\n"
            "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "try:\n"
            "    with keel_torch.record(sys.argv[1], model=model, optimizer=opt):\n"
            + loop +
            "except RuntimeError as e:\n"
            "    print(str(e).splitlines()[0])\n"
            "    sys.exit(3)\n")
        r = subprocess.run([sys.executable, "-c", script, self.path], capture_output=True,
                           text=True, timeout=300)
        self.assertEqual(r.returncode, 3, r.stdout + r.stderr)
        self.assertIn(self.path, r.stdout)
        rc, out, err = keel("inspect", self.path)
        self.assertEqual(rc, 0, err)
        self.assertIn("status failed: recording " + self.path, out)
        return r.stdout, out

    def test_a_write_error_on_the_writer_thread_reaches_the_training_loop(self):
        """Note [keel_torch writer thread]: SQLite writes on their own thread; a file-size limit
        (as a full disk) is raised in the user's loop as one RuntimeError naming the file, not
        a crash or a hang, and what was written stays readable."""
        error, _ = self.run_until_a_write_error(
            "        resource.setrlimit(resource.RLIMIT_FSIZE, (300000, 300000))\n"
            "        for i in range(400):\n"
            "            model(torch.randn(8, 64)).square().mean().backward()\n"
            "            opt.step()\n"
            "            opt.zero_grad()\n")
        self.assertIn("size limit", error)

    def test_a_write_error_at_close_leaves_a_failed_run_not_a_finished_one(self):
        """A loop that ends well but whose last records cannot be written (the file-size limit is
        reached when the recording is closed) raises from the `with` and leaves the run marked
        failed with the write's error, not finished, and the steps written before readable."""
        _, inspected = self.run_until_a_write_error(
            "        for i in range(4):\n"
            "            model(torch.randn(8, 64)).square().mean().backward()\n"
            "            opt.step()\n"
            "            opt.zero_grad()\n"
            "        model(torch.randn(8, 64)).square().mean().backward()\n"
            "        size = max(os.path.getsize(p) for p in (sys.argv[1], sys.argv[1] + '-wal')\n"
            "                   if os.path.exists(p))\n"
            "        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))\n")
        self.assertNotIn("status finished", inspected)
        self.assertRegex(inspected, r"steps\s+4\b")

    def tensor_rows(self):
        """(op, role, index) -> MD5 of every recorded tensor (keel export csv --tensors)."""
        import csv
        import io
        rc, out, err = keel("export", "csv", "--tensors", self.path)
        self.assertEqual(rc, 0, err)
        return {(int(r["seq"]), r["op"], r["role"], int(r["idx"])): r["md5"]
                for r in csv.DictReader(io.StringIO(out))}

    def op_names(self):
        """The recorded ops' names, in order (keel export csv)."""
        import csv
        import io
        rc, out, err = keel("export", "csv", self.path)
        self.assertEqual(rc, 0, err)
        return [r["op"] for r in sorted(csv.DictReader(io.StringIO(out)), key=lambda r: int(r["seq"]))]

    def test_a_mode_pushed_inside_the_recording_runs_first_and_the_recording_goes_on(self):
        """Note [keel_torch direct dispatch mode]: the session is PyTorch 1.13's C++ dispatch mode
        itself; a mode the user pushes inside the recording still sees its ops first (and can
        change them), the recording sees what it ran, and goes on after the mode is popped; a mode
        pushed before the recording sees the ops after it."""
        from torch.utils._python_dispatch import TorchDispatchMode
        seen = []

        class Doubling(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                seen.append(func.overloadpacket.__name__)
                out = func(*args, **(kwargs or {}))
                return out * 2 if func.overloadpacket.__name__ == "add" else out

        a = torch.ones(3)
        with keel_torch.record(self.path, md5=False, stats=False):
            b = a.mul(3)
            with Doubling():
                c = b.add(1)
            d = c.sub(1)
        self.assertEqual(seen, ["add"])  # its own `out * 2` goes to the modes below it
        self.assertEqual(d.tolist(), [7.0, 7.0, 7.0])
        self.assertEqual(self.op_names(), ["mul", "add", "mul", "sub"])
        self.assertEqual(torch._C._len_torch_dispatch_stack(), 0)
        a.add(1)  # nothing records it now
        self.assertEqual(self.op_names(), ["mul", "add", "mul", "sub"])

        seen.clear()
        with Doubling():
            with keel_torch.record(self.path, md5=False, stats=False):
                e = a.add(2)
        self.assertEqual(seen, ["add"])
        self.assertEqual(e.tolist(), [6.0, 6.0, 6.0])
        self.assertEqual(self.op_names(), ["add"])  # the recording is inside: before the doubling
        self.assertEqual(torch._C._len_torch_dispatch_stack(), 0)

    def test_a_run_without_steps_forgets_dead_tensors(self):
        """Note [keel_torch tensors read in C++]: the identities of tensors that died are
        forgotten even in a graph-only recording that never ends a step (an inference loop)."""
        a = torch.ones(4)
        with keel_torch.record(self.path, md5=False, stats=False) as session:
            for _ in range(150000):
                a = a + 0
            live = session.rec.counts()["identities"]
        self.assertLessEqual(live, 1 << 17)
        self.assertEqual(session.seq, 150000)

    def test_a_reshape_or_detach_takes_the_elements_digest_with_its_own_shape(self):
        """Note [keel_torch content cache]: a contiguous tensor's content is keyed by where its
        elements are, not by the tensor, so a reshape and a detach of hashed elements are not
        hashed again; each gets the MD5 of its own shape (the trailer)."""
        x = torch.arange(1 << 16, dtype=torch.float32) / 7
        with keel_torch.record(self.path, stats=False) as session:
            y = x * 2
            z = y.reshape(256, 256)
            w = z.detach()
            v = w + 1
        md5s = set(self.tensor_rows().values())
        expected = {keel_md5(x), keel_md5(y), keel_md5(z), keel_md5(v)}
        self.assertNotEqual(keel_md5(y), keel_md5(z))  # the same bytes, two shapes
        self.assertEqual(md5s, expected)
        self.assertEqual(session.hashed[0], 3)  # x, y and v; z and w are y's elements

    def test_memory_of_a_dead_tensor_in_a_new_tensor_is_hashed_again(self):
        """Note [keel_torch content cache]: a new tensor over the memory of a dead one — what
        PyTorch's allocator does with freed memory — has the same address, offset, size and
        version; its elements are hashed, not taken from the dead tensor's. (Made here with
        torch.from_numpy over one array, refilled between tensors.)"""
        import time
        import numpy
        array = numpy.zeros(1 << 12, dtype=numpy.float32)
        expected = [keel_md5(torch.full((1 << 12,), float(i))) for i in range(3)]
        with keel_torch.record(self.path, stats=False) as session:
            for i in range(3):
                array[:] = i
                t = torch.from_numpy(array)
                t * 1
                del t
                # The array is written next, by no torch op: its bytes are hashed first.
                for _ in range(3000):
                    if session.rec.counts()["waiting"] == 0:
                        break
                    time.sleep(0.01)
        rows = self.tensor_rows()
        inputs = [rows[k] for k in sorted(rows) if k[1] == "mul" and k[2] == "input" and k[3] == 0]
        self.assertEqual(inputs, expected)

    def test_an_op_returning_a_tensor_and_a_list_records_every_output(self):
        """A result (Tensor, Tensor[]) — cudnn's RNN backward, histogramdd on a GPU — has its
        list's tensors recorded as outputs too (an op of a torch.library made for the test)."""
        lib = torch.library.Library("keel_torch_test", "DEF")
        lib.define("split3(Tensor x) -> (Tensor, Tensor[])")
        lib.impl("split3", lambda x: (x * 1, [x + 1, x + 2]), "CPU")
        x = torch.arange(6, dtype=torch.float32)
        with keel_torch.record(self.path, stats=False):
            torch.ops.keel_torch_test.split3(x)
        rows = self.tensor_rows()
        outputs = [rows[k] for k in sorted(rows) if k[1] == "split3" and k[2] == "output"]
        self.assertEqual(outputs, [keel_md5(x), keel_md5(x + 1), keel_md5(x + 2)])

    def test_an_op_whose_recording_failed_leaves_its_digests_to_the_ops_after_it(self):
        """An op that ran but could not be recorded (here its stack: stacks=True and the stack
        walk raising) raises in the training loop; the tensors it read were keyed in the step's
        content cache, and an op after it reading them again gets their MD5, not an empty one."""
        u = torch.arange(1 << 18, dtype=torch.float32) / 3  # made before: hashed by u * 2 first
        with keel_torch.record(self.path, stacks=True, stats=False) as session:
            walk = session._stack

            def broken():
                raise RuntimeError("the stack walk broke")
            session._stack = broken
            with self.assertRaises(RuntimeError):
                u * 2
            session._stack = walk
            u + 1
        rows = self.tensor_rows()
        self.assertEqual([k[1] for k in sorted(rows)], ["add", "add"])  # u * 2 is not recorded
        self.assertEqual(rows[(2, "add", "input", 0)], keel_md5(u))
        self.assertEqual(rows[(2, "add", "output", 0)], keel_md5(u + 1))

    def test_dumps_given_an_empty_scope_stores_nothing(self):
        import sqlite3
        with keel_torch.record(self.path, dumps=""):
            torch.ones(4) * 2
        with sqlite3.connect(self.path) as db:
            self.assertEqual(db.execute("SELECT COUNT(*) FROM dumps").fetchone()[0], 0)
            self.assertEqual(db.execute("SELECT COUNT(*) FROM ops").fetchone()[0], 2)
        with keel_torch.record(self.path, dumps=True):
            torch.ones(4) * 2
        with sqlite3.connect(self.path) as db:
            self.assertEqual(db.execute("SELECT COUNT(*) FROM dumps").fetchone()[0], 2)

    def test_bytes_written_in_place_right_after_an_op_are_not_in_its_digest(self):
        """Note [keel_torch hashing off the Python thread]: the pool hashes PyTorch's own memory
        after the op returns; an in-place op that follows at once must not change what the first
        op's output is recorded as (4 MiB tensors: the hashing thread is still busy with them),
        and a tensor read again takes the digest already computed (Note [keel_torch content
        cache])."""
        x = torch.arange(1 << 20, dtype=torch.float32) / 7
        with keel_torch.record(self.path) as session:
            y = x * 2
            y.add_(1)
            z = y * 3
            z.sub_(x)
        rows = self.tensor_rows()
        doubled, plus_one = keel_md5(x * 2), keel_md5(x * 2 + 1)
        self.assertEqual(rows[(1, "mul", "output", 0)], doubled)
        self.assertEqual(rows[(2, "add_", "input", 0)], doubled)
        self.assertEqual(rows[(2, "add_", "output", 0)], plus_one)
        self.assertEqual(rows[(3, "mul", "input", 0)], plus_one)
        self.assertEqual(rows[(4, "sub_", "input", 0)], keel_md5((x * 2 + 1) * 3))
        self.assertEqual(rows[(4, "sub_", "input", 1)], keel_md5(x))
        self.assertEqual(rows[(4, "sub_", "output", 0)], keel_md5((x * 2 + 1) * 3 - x))
        # y as add_'s input is mul's output, y as the second mul's input add_'s output (at the
        # version after add_: Note [keel_torch versions]), z and x as sub_'s inputs the second
        # mul's output and the first's input: digests reused, not hashed.
        self.assertEqual(session.reused[0], 4)
        self.assertEqual(session.hashed[0], len(rows) - 4)

    def test_an_in_place_op_on_a_tensor_not_seen_before_records_its_bytes_before(self):
        """The inputs of an op that writes them are hashed from the bytes before it runs, also
        when nothing recorded read them earlier (a tensor made before the recording), and batch
        norm's running statistics (written in place without a `Tensor(a!)` in PyTorch 1.13's
        schema) are recorded as they were before each call."""
        w = torch.full((1 << 20,), 3.0)
        bn = torch.nn.BatchNorm1d(4)
        x = torch.randn(8, 4)
        zeros = keel_md5(torch.zeros(4))
        with keel_torch.record(self.path):
            w.add_(1)
            bn(x)
            after_first = keel_md5(bn.running_mean)
            bn(x * 2)
        rows = self.tensor_rows()
        self.assertEqual(rows[(1, "add_", "input", 0)], keel_md5(torch.full((1 << 20,), 3.0)))
        self.assertEqual(rows[(1, "add_", "output", 0)], keel_md5(w))
        norms = sorted(k[0] for k in rows if k[1] == "native_batch_norm" and k[2] == "output"
                       and k[3] == 0)
        self.assertEqual(len(norms), 2)
        # native_batch_norm(input, weight, bias, running_mean, running_var, ...)
        self.assertEqual(rows[(norms[0], "native_batch_norm", "input", 3)], zeros)
        self.assertEqual(rows[(norms[1], "native_batch_norm", "input", 3)], after_first)
        self.assertNotEqual(after_first, zeros)

    def test_a_write_through_another_alias_is_seen(self):
        """w.data is another tensor object with its own version counter: a write through it
        leaves w's version as it was, and the digest w had must not be reused for its new bytes
        (the written buffer's digests are dropped: Note [keel_torch content cache])."""
        with keel_torch.record(self.path):
            w = torch.ones(1 << 16) * 3
            before = w._version
            a = w + 1
            w.data.mul_(2)
            self.assertEqual(w._version, before)
            b = w + 1
        rows = self.tensor_rows()
        adds = sorted(k[0] for k in rows if k[1] == "add" and k[2] == "output")
        self.assertEqual(len(adds), 2)
        muls = [k[0] for k in rows if k[1] == "mul_" and k[2] == "input"]
        self.assertEqual(rows[(muls[0], "mul_", "input", 0)],
                         keel_md5(torch.full((1 << 16,), 3.0)))
        self.assertEqual(rows[(muls[0], "mul_", "output", 0)],
                         keel_md5(torch.full((1 << 16,), 6.0)))
        self.assertEqual(rows[(adds[0], "add", "input", 0)], keel_md5(torch.full((1 << 16,), 3.0)))
        self.assertEqual(rows[(adds[0], "add", "output", 0)], keel_md5(a))
        self.assertEqual(rows[(adds[1], "add", "input", 0)], keel_md5(torch.full((1 << 16,), 6.0)))
        self.assertEqual(rows[(adds[1], "add", "output", 0)], keel_md5(b))

    # ---- inference mode (Note [keel_torch versions]) -------------------------------------------

    def tensor_versions(self):
        """(seq, op, role, index) -> (tensor id, version) of every recorded tensor."""
        import csv
        import io
        rc, out, err = keel("export", "csv", "--tensors", self.path)
        self.assertEqual(rc, 0, err)
        return {(int(r["seq"]), r["op"], r["role"], int(r["idx"])):
                (int(r["tensor_id"]), int(r["version"])) for r in csv.DictReader(io.StringIO(out))}

    def status(self):
        rc, out, err = keel("inspect", self.path)
        self.assertEqual(rc, 0, err)
        return re.search(r"status (.*)\n", out).group(1)

    def test_inference_tensors_are_recorded_at_version_0(self):
        """Inference tensors have no version counter (reading it raised 'Inference tensors do
        not track version counter.' in the user's loop): made and written inside
        torch.inference_mode() within the recording, or made under it before, they are recorded
        at version 0 and the loop runs unchanged."""
        with keel_torch.record(self.path):
            with torch.inference_mode():
                x = torch.randn(2, 4)
                x.add_(1)
        self.assertEqual(self.status(), "finished")
        versions = self.tensor_versions()
        self.assertEqual(sorted(versions), [(1, "randn", "output", 0), (2, "add_", "input", 0),
                                            (2, "add_", "output", 0)])
        self.assertEqual({v for _, v in versions.values()}, {0})
        rows = self.tensor_rows()
        self.assertEqual(rows[(2, "add_", "output", 0)], keel_md5(x))
        with torch.inference_mode():
            x = torch.randn(2, 4)
        with keel_torch.record(self.path):
            y = x * 2
        self.assertEqual(self.status(), "finished")
        self.assertEqual(sorted(self.tensor_versions().items()),
                         [((1, "mul", "input", 0), (1, 0)), ((1, "mul", "output", 0), (2, 0))])
        rows = self.tensor_rows()
        self.assertEqual(rows[(1, "mul", "input", 0)], keel_md5(x))
        self.assertEqual(rows[(1, "mul", "output", 0)], keel_md5(y))

    # ---- versions after in-place ops and views (Note [keel_torch versions]) --------------------

    def graph_edges(self, step=1):
        """The edges of `keel export graph` (Note [Producer]) as (producer op, consumer op)."""
        rc, out, err = keel("export", "graph", self.path, "--step", str(step))
        self.assertEqual(rc, 0, err)
        names = dict(re.findall(r'"(o\d+)" \[label="([^\\"]+)\\n', out))
        return {(names[a], names[b]) for a, b in re.findall(r'"(o\d+)" -> "(o\d+)"', out)}

    def test_an_in_place_op_and_a_view_output_the_version_their_readers_see(self):
        """An in-place op's output is at the version after the write and a view at its base's
        (both were written at 0, read at 1: no producer edge in keel export graph, the studio's
        graph or keel diff's root analysis)."""
        with keel_torch.record(self.path):
            x = torch.randn(3, 3)
            x.add_(1)
            y = x.t()
            z = y.mm(y)
            keel_torch.step(z.sum())
        v = self.tensor_versions()
        x_id = v[(1, "randn", "output", 0)][0]
        y_id = v[(3, "t", "output", 0)][0]
        self.assertEqual(v[(1, "randn", "output", 0)], (x_id, 0))
        self.assertEqual(v[(2, "add_", "input", 0)], (x_id, 0))
        self.assertEqual(v[(2, "add_", "output", 0)], (x_id, 1))
        self.assertEqual(v[(3, "t", "input", 0)], (x_id, 1))
        self.assertEqual(v[(3, "t", "output", 0)], (y_id, 1))
        self.assertEqual(v[(4, "mm", "input", 0)], (y_id, 1))
        self.assertEqual(v[(4, "mm", "input", 1)], (y_id, 1))
        self.assertEqual(self.graph_edges(),
                         {("randn", "add_"), ("add_", "t"), ("t", "mm"), ("mm", "sum")})
        # A Linear's parameters are at version 1 after their initialisation: its weight's `t`
        # feeds its addmm.
        model = torch.nn.Linear(3, 2)
        self.assertEqual(model.weight._version, 1)
        with keel_torch.record(self.path, model=model):
            model(torch.randn(4, 3))
        self.assertEqual(self.graph_edges(), {("randn", "addmm"), ("t", "addmm")})
        v = self.tensor_versions()
        self.assertEqual(v[(2, "t", "output", 0)][1], 1)
        self.assertEqual(v[(3, "addmm", "input", 2)], v[(2, "t", "output", 0)])

    # ---- phases after .backward() (Note [keel_torch optimizer work]) ----------------------------

    def phases(self, step=None):
        """(step, phase, op) of the recorded ops, in order."""
        import csv
        import io
        rc, out, err = keel("export", "csv", self.path)
        self.assertEqual(rc, 0, err)
        rows = sorted(csv.DictReader(io.StringIO(out)), key=lambda r: int(r["seq"]))
        return [(int(r["step"]), r["phase"], r["op"]) for r in rows
                if step is None or int(r["step"]) == step]

    def test_work_after_backward_is_the_optimizers_only_when_it_reads_gradients(self):
        """Ops outside any module after .backward() are optimizer work only when they read a
        parameter's gradient or what such an op made (gradient clipping); the next batch is
        forward work, also before the optimizer steps (gradient accumulation) or with no
        optimizer at all (a loop ended by keel_torch.step()). Both read as optimizer work."""
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 4))
        with keel_torch.record(self.path, model=model):
            for _ in range(2):
                loss = model(torch.randn(5, 8)).pow(2).mean()
                loss.backward()
                keel_torch.step(loss)
        self.assertEqual([p for p in self.phases() if p[2] == "randn"],
                         [(1, "forward", "randn"), (2, "forward", "randn")])
        self.assertNotIn("optimizer", {p[1] for p in self.phases()})
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with keel_torch.record(self.path, model=model, optimizer=opt):
            for _ in range(2):
                for micro in range(2):  # two micro-batches, then one update
                    x = torch.randn(5, 8) * 2
                    model(x).pow(2).mean().backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
                opt.step()
                opt.zero_grad()
        ops = [(phase, op) for _, phase, op in self.phases(step=2) if phase != "backward"]
        # Each micro-batch (its data made before the model is called) is forward work; then
        # clip_grad_norm_ (each gradient's norm, their norm, the factor, the gradients scaled),
        # SGD's update and zero_grad are the optimizer's.
        forward = [("forward", op) for op in ("randn", "mul", "t", "addmm", "pow", "mean")]
        self.assertEqual(ops, forward + forward + [("optimizer", op) for op in (
            "detach", "detach", "norm", "detach", "detach", "norm", "stack", "norm", "add",
            "reciprocal", "mul", "clamp", "detach", "detach", "mul_", "detach", "detach", "mul_",
            "zeros", "add_", "add_", "zeros", "zero_", "zero_")])

    def test_a_step_of_micro_batches_records_the_sum_of_the_losses_backward_ran_on(self):
        """Gradient accumulation: each micro-batch's loss scaled by 1/2 and .backward()'ed; the
        step's loss is their sum, the mean loss the update used (it was the last micro-batch's
        scaled loss, half of what the loop printed)."""
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 4))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        expected = []
        with keel_torch.record(self.path, model=model, optimizer=opt):
            for _ in range(2):
                total = 0.0
                for micro in range(2):
                    loss = model(torch.randn(5, 8)).pow(2).mean() / 2
                    loss.backward()
                    total += loss.item()
                opt.step()
                opt.zero_grad()
                expected.append(total)
        rc, out, err = keel("inspect", self.path)
        self.assertEqual(rc, 0, err)
        for i, value in enumerate(expected):
            self.assertIn("step %d    loss %.4f" % (i + 1, value), out)

    # ---- nesting, Keel's own ops (Note [keel_torch own ops]) -----------------------------------

    def test_a_recording_inside_another_is_refused_and_the_outer_goes_on(self):
        inner = os.path.join(self.dir.name, "inner.db")
        with keel_torch.record(self.path):
            torch.ones(2) * 2
            with self.assertRaises(RuntimeError) as cm:
                with keel_torch.record(inner):
                    torch.ones(2) * 3
            torch.ones(2) * 4
            keel_torch.step(1.5)
        self.assertEqual(str(cm.exception),
                         "keel_torch.record: already recording to %s in this thread; recordings "
                         "do not nest (end that one first)" % self.path)
        self.assertFalse(os.path.exists(inner))
        self.assertEqual(self.status(), "finished")
        self.assertEqual(self.op_names(), ["ones", "mul", "ones", "mul"])

    def test_keels_own_ops_reach_no_dispatch_mode(self):
        """Hashing a tensor (detach, contiguous, view) and reading a loss are not seen by a mode
        of the user's entered before the recording (it saw 91 ops with md5=True, 23 without),
        and keel_torch.hash_tensor inside a recording records nothing of its own."""
        from torch.utils._python_dispatch import TorchDispatchMode

        class Seen(TorchDispatchMode):
            def __init__(self):
                super().__init__()
                self.ops = []

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                self.ops.append(str(func.overloadpacket.__name__))
                return func(*args, **(kwargs or {}))

        def loop(md5):
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(8, 4))
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            with Seen() as seen:
                with keel_torch.record(self.path, model=model, optimizer=opt, md5=md5, stats=md5):
                    loss = model(torch.randn(5, 8).to(torch.bfloat16).float()).pow(2).mean()
                    loss.backward()
                    opt.step()
            return seen.ops
        plain, hashed = loop(False), loop(True)
        self.assertEqual(plain, hashed)
        self.assertEqual(len(hashed), 29)
        with keel_torch.record(self.path):
            t = torch.ones(3) * 2
            md5, _, _ = keel_torch.hash_tensor(t)
        self.assertEqual(md5, keel_md5(t))
        self.assertEqual(self.op_names(), ["ones", "mul"])

    # ---- how a run ends (Note [keel_torch run status]) -----------------------------------------

    def test_the_status_names_how_the_run_ended(self):
        def run(body):
            with keel_torch.record(self.path):
                torch.ones(2) * 2
                body()
            return None

        def fail():
            raise ValueError("bad batch\nsecond line")
        with self.assertRaises(ValueError):
            run(fail)
        self.assertEqual(self.status(), "failed: ValueError: bad batch")
        with self.assertRaises(SystemExit):
            run(lambda: sys.exit(0))
        self.assertEqual(self.status(), "finished")
        with self.assertRaises(SystemExit):
            run(lambda: sys.exit(3))
        self.assertEqual(self.status(), "failed: exit code 3")
        with self.assertRaises(SystemExit):
            run(lambda: sys.exit("no data"))
        self.assertEqual(self.status(), "failed: exit code 1: no data")
        with self.assertRaises(KeyboardInterrupt):
            run(lambda: (_ for _ in ()).throw(KeyboardInterrupt()))
        self.assertEqual(self.status(), "stopped: interrupted (SIGINT)")
        self.assertEqual(signal.getsignal(signal.SIGTERM), signal.SIG_DFL)

    def test_sigterm_closes_the_recording_with_its_steps_and_ends_the_process(self):
        """Note [keel_torch SIGTERM]: killed after two steps, the recording keeps them and says
        so (it was left 'running, but no process is writing it' with 1 step); the process still
        ends by SIGTERM."""
        script = (
            "import os, signal, sys, torch, keel_torch\n"
            "model = torch.nn.Linear(8, 4)\n"
            "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "with keel_torch.record(sys.argv[1], model=model, optimizer=opt):\n"
            "    for i in range(100):\n"
            "        if i == 2:\n"
            "            os.kill(os.getpid(), signal.SIGTERM)\n"
            "        model(torch.randn(5, 8)).pow(2).mean().backward()\n"
            "        opt.step()\n"
            "        opt.zero_grad()\n"
            "print('not reached')\n")
        r = subprocess.run([sys.executable, "-c", script, self.path], capture_output=True,
                           text=True, timeout=300)
        self.assertEqual(r.returncode, -signal.SIGTERM, r.stdout + r.stderr)
        self.assertNotIn("not reached", r.stdout)
        self.assertEqual(self.status(), "stopped: terminated (SIGTERM)")
        rc, out, err = keel("inspect", self.path)
        self.assertRegex(out, r"\nsteps\s+2\n")

    # ---- learning-rate schedulers (Note [keel_torch optimizer]) ---------------------------------

    def test_a_learning_rate_scheduler_sees_no_override_and_steps_record_the_rate(self):
        """PyTorch warned 'Seems like optimizer.step() has been overridden after learning rate
        scheduler initialization' under any scheduler; each step's record has the rate its
        update used (param_groups[0]['lr'])."""
        import sqlite3
        import warnings
        model = torch.nn.Linear(8, 4)
        for made_inside in (False, True):
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                sched = None if made_inside else \
                    torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
                with keel_torch.record(self.path, model=model, optimizer=opt):
                    if made_inside:
                        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
                    for _ in range(3):
                        model(torch.randn(5, 8)).pow(2).mean().backward()
                        opt.step()
                        opt.zero_grad()
                        sched.step()
                model(torch.randn(5, 8)).pow(2).mean().backward()  # after: as without Keel
                opt.step()
                sched.step()
            self.assertEqual([str(w.message) for w in caught], [], made_inside)
            self.assertEqual(opt._step_count, 4)
            with sqlite3.connect(self.path) as db:
                self.assertEqual(db.execute("SELECT step, lr FROM steps").fetchall(),
                                 [(1, 0.1), (2, 0.05), (3, 0.025)])
        with keel_torch.record(self.path):  # no optimizer: the rate is unknown
            torch.ones(2) * 2
            keel_torch.step(1.0)
        with sqlite3.connect(self.path) as db:
            self.assertEqual(db.execute("SELECT lr FROM steps").fetchall(), [(None,)])

    # ---- dtypes Keel lacks (Note [keel_torch dtypes Keel lacks]) -------------------------------

    def test_a_nan_loss_is_a_nan_and_a_step_without_a_loss_is_not_reported(self):
        # Note [Reported NaN]: SQLite stores NaN as NULL; the step's nan_metrics bit tells the
        # NaN loss of step 2 from step 3, which reported none (keel inspect read both alike).
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)
        with keel_torch.record(self.path, model=model):
            for loss in (torch.tensor(1.5), torch.tensor(float("nan")), None):
                model(torch.randn(2, 4))
                keel_torch.step(loss)
        code, out, err = keel("inspect", self.path)
        self.assertEqual(code, 0, err)
        self.assertRegex(out, r"step 1 +loss 1\.5000 ")
        self.assertRegex(out, r"step 2 +loss NaN ")
        self.assertRegex(out, r"step 3 +loss not reported ")
        # Compared with a run whose step 2 had a number, step 2 diverges; step 3 is left out.
        other = os.path.join(self.dir.name, "other.db")
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)
        with keel_torch.record(other, model=model):
            for loss in (torch.tensor(1.5), torch.tensor(2.0), torch.tensor(3.0)):
                model(torch.randn(2, 4))
                keel_torch.step(loss)
        code, out, err = keel("diff", other, self.path, "--json")
        self.assertEqual(code, 1, err)
        losses = json.loads(out)["losses"]
        self.assertEqual([(l["step"], l["status"]) for l in losses],
                         [(1, "equal"), (2, "diverged")])

    def test_integer_bool_and_complex_tensors_are_hashed(self):
        """docs/capture.md's layout (the elements' bytes, then the dtype's name, NUL, rank and
        dimensions) with PyTorch's name: uint8, int8, int16 and complex got no MD5 at all."""
        def md5_of(data, name, shape):
            trailer = name.encode() + b"\0" + struct.pack("<q", len(shape)) + \
                b"".join(struct.pack("<q", d) for d in shape)
            return hashlib.md5(data + trailer).hexdigest()
        cases = [
            (torch.tensor([1, 2, 255], dtype=torch.uint8), b"\x01\x02\xff", "uint8"),
            (torch.tensor([-1, 2], dtype=torch.int8), b"\xff\x02", "int8"),
            (torch.tensor([[-2], [3]], dtype=torch.int16), b"\xfe\xff\x03\x00", "int16"),
            (torch.tensor([True, False]), b"\x01\x00", "bool"),
            (torch.tensor([1 + 2j], dtype=torch.complex64), struct.pack("<ff", 1, 2), "complex64"),
            (torch.tensor([1 - 2j], dtype=torch.complex128), struct.pack("<dd", 1, -2),
             "complex128"),
        ]
        for t, data, name in cases:
            self.assertEqual(keel_torch.hash_tensor(t), (md5_of(data, name, list(t.shape)),
                                                         None, ""), name)
        with keel_torch.record(self.path, rounded_md5=3, dumps=True):
            u = torch.tensor([1, 2, 255], dtype=torch.uint8) * 2
            c = torch.tensor([1 + 2j], dtype=torch.complex64) * 2
        rows = self.tensor_rows()
        self.assertEqual(rows[(2, "mul", "output", 0)], md5_of(b"\x02\x04\xfe", "uint8", [3]))
        self.assertEqual(rows[(4, "mul", "output", 0)],
                         md5_of(struct.pack("<ff", 2, 4), "complex64", [1]))
        self.assertEqual(rows[(4, "mul", "input", 0)],
                         md5_of(struct.pack("<ff", 1, 2), "complex64", [1]))
        # A quantized tensor's bytes have no layout: a warning, once, and no MD5.
        import warnings
        q = torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.qint8)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            self.assertEqual(keel_torch.hash_tensor(q), ("", None, ""))
            self.assertEqual(keel_torch.hash_tensor(q), ("", None, ""))
        self.assertEqual([str(w.message) for w in caught],
                         ["keel_torch: qint8 tensors are not hashed: their bytes have no layout "
                          "in Keel's MD5 (docs/torch.md)"])

    # ---- small things ----------------------------------------------------------------------------

    def test_sqlite_side_files_and_a_missing_directory_are_refused_by_name(self):
        for suffix in ("-journal", "-wal", "-shm"):
            bad = self.path + suffix
            with self.assertRaises(RuntimeError) as cm:
                with keel_torch.record(bad):
                    pass
            self.assertEqual(str(cm.exception),
                             "keel_torch.record: output %s: a name ending in %s is SQLite's own "
                             "file beside a recording; choose another name" % (bad, suffix))
            self.assertFalse(os.path.exists(bad))
        missing = os.path.join(self.dir.name, "no", "run.db")
        with self.assertRaises(RuntimeError) as cm:
            with keel_torch.record(missing):
                pass
        self.assertEqual(str(cm.exception), "keel_torch.record: output %s: no such directory %s"
                         % (missing, os.path.dirname(missing)))

    def test_a_dumps_scope_that_matches_nothing_warns_once(self):
        import warnings
        model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU())
        for scope, expected in (("2", 1), ("1", 0)):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                with keel_torch.record(self.path, model=model, dumps=scope):
                    model(torch.randn(5, 8))
                    model(torch.randn(5, 8))
            messages = [str(w.message) for w in caught]
            self.assertEqual(len(messages), expected, messages)
        self.assertEqual(messages, [])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with keel_torch.record(self.path, model=model, dumps="2"):
                model(torch.randn(5, 8))
        self.assertEqual([str(w.message) for w in caught],
                         ["keel_torch.record: dumps='2' matched no module scope, so no values "
                          "were stored (a scope is a name of model.named_modules(), such as "
                          "'blocks.1')"])


    # ---- Note [keel_torch uninitialised memory] ----------------------------------------------

    def record_uninitialised(self, path, garbage):
        """A dropout model and every allocation-only op, recorded with MD5s, statistics and
        dumps; the memory the allocation-only ops get was filled with `garbage` just before
        (a freed block of the same size, which the allocator hands out again)."""
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 1024), torch.nn.Dropout(0.5),
                                    torch.nn.Linear(1024, 4))
        x = torch.randn(4, 8)
        with keel_torch.record(path, model=model, md5=True, stats=True, dumps=True):
            for _ in range(2):
                keel_torch.step(model(x).sum())
                with torch.no_grad():
                    for make in (lambda: torch.empty(4, 1024),
                                 lambda: torch.empty_like(x.new_ones(4, 1024)),
                                 lambda: x.new_empty(4, 1024),
                                 lambda: torch.empty_strided((4, 1024), (1024, 1)),
                                 lambda: x.new_empty_strided((4, 1024), (1024, 1))):
                        freed_block_of(garbage)
                        make().fill_(2.0).sum()

    def test_uninitialised_memory_is_not_hashed_nor_judged(self):
        """F1 (dogfood 28): dropout's empty_like was hashed (its garbage named the run's first
        NaN, and made two identical runs diverge). The outputs of allocation-only ops, and that
        memory read before anything writes it (bernoulli_'s input), are recorded without MD5,
        statistics or values, and the op says why."""
        import csv
        import io
        import sqlite3
        other = os.path.join(self.dir.name, "other.db")
        self.record_uninitialised(self.path, float("nan"))
        self.record_uninitialised(other, 0.0)
        rc, out, err = keel("export", "csv", "--tensors", self.path)
        self.assertEqual(rc, 0, err)
        rows = list(csv.DictReader(io.StringIO(out)))
        allocation_only = ("empty", "empty_like", "new_empty", "empty_strided",
                           "new_empty_strided")
        made = [r for r in rows if r["op"] in allocation_only and r["role"] == "output"]
        self.assertEqual(sorted({r["op"] for r in made}), sorted(allocation_only))
        for r in made:
            self.assertEqual((r["md5"], r["min"], r["nan_count"]), ("", "", ""), r)
            self.assertEqual((r["shape"], r["dtype"]), ("4x1024", "float32"), r)
        self.assertEqual(len(made), 2 * 6)  # per step: the five, and dropout's empty_like
        masks = [r for r in rows if r["op"] == "bernoulli_"]
        self.assertEqual([(r["role"], r["md5"] == "") for r in masks],
                         [("input", True), ("output", False)] * 2)
        # What the buffer holds once written is hashed as ever: fill_'s output is all 2s.
        filled = [r for r in rows if r["op"] == "fill_" and r["role"] == "output"]
        self.assertEqual({(r["min"], r["max"], r["nan_count"]) for r in filled},
                         {("2", "2", "0")})
        with sqlite3.connect(self.path) as db:
            attrs = {json.loads(a)["uninitialised"] for (a,) in db.execute(
                "SELECT a.text FROM ops o JOIN strings n ON n.id = o.name_sid "
                "JOIN strings a ON a.id = o.attrs_sid WHERE n.text IN (%s)"
                % ",".join("'%s'" % n for n in allocation_only))}
            self.assertEqual(attrs, {"outputs not hashed: an allocation-only op leaves their "
                                     "memory unwritten"})
            dumped = db.execute(
                "SELECT COUNT(*) FROM dumps d JOIN ops o ON o.seq = d.op_seq "
                "JOIN strings n ON n.id = o.name_sid WHERE n.text IN (%s)"
                % ",".join("'%s'" % n for n in allocation_only)).fetchone()[0]
            self.assertEqual(dumped, 0)
        rc, out, err = keel("inspect", self.path)
        self.assertEqual(rc, 0, err)
        self.assertIn("first NaN/Inf: none (in the recorded statistics)\n", out)
        rc, out, err = keel("diff", self.path, other)
        self.assertEqual(rc, 0, out + err)
        self.assertIn("\nEQUAL within tolerance", out)
        self.assertIn(" 0 diverged, ", out)

    # ---- record()'s arguments and its output (dogfood 28: F2, F3, F10) ------------------------

    def test_a_bad_argument_is_refused_before_the_output_is_touched(self):
        train(self.path, steps=1)
        with open(self.path, "rb") as f:
            before = f.read()
        model = torch.nn.Linear(2, 2)
        for kwargs, error, message in (
                (dict(rounded_md5=99), ValueError, "rounded_md5 must be 0 (none) or a number of "
                 "significant digits in 1..17, got 99"),
                (dict(rounded_md5=True), TypeError, "rounded_md5 must be an integer (0 (none) or "
                 "a number of significant digits in 1..17), got True"),
                (dict(seed=-1), ValueError, "seed must be in 0..2**64-1, got -1"),
                (dict(seed=2**64), ValueError, "seed must be in 0..2**64-1, got %d" % 2**64),
                (dict(seed="x"), TypeError, "seed must be an integer (in 0..2**64-1), got 'x'"),
                (dict(model="notamodel"), TypeError,
                 "model must be a torch.nn.Module or None, got str"),
                (dict(optimizer=[1, 2]), TypeError, "optimizer must be a torch.optim.Optimizer "
                 "(step(), zero_grad() and param_groups) or None, got list"),
                (dict(md5="yes"), TypeError, "md5 must be True or False, got 'yes'"),
                (dict(stacks=2), TypeError, "stacks must be True or False, got 2"),
                (dict(dumps=3), TypeError,
                 "dumps must be True, False or a module scope ('blocks.1'), got 3"),
                (dict(config={"a": object()}), TypeError, "config must be JSON data (a dict of "
                 "numbers, strings, lists), and is not: Object of type object is not JSON "
                 "serializable")):
            with self.assertRaises(error) as cm:
                with keel_torch.record(self.path, **kwargs):
                    model(torch.ones(2))
            self.assertEqual(str(cm.exception), "keel_torch.record: " + message)
            with open(self.path, "rb") as f:
                self.assertEqual(f.read(), before, kwargs)
        # A setup that fails once the arguments passed (the optimizer's step cannot be
        # replaced) leaves the file as it was too.

        class Frozen:
            param_groups = []

            def step(self):
                pass

            def zero_grad(self):
                pass

            def __setattr__(self, name, value):
                raise AttributeError("frozen")
        with self.assertRaises(AttributeError):
            with keel_torch.record(self.path, optimizer=Frozen()):
                pass
        with open(self.path, "rb") as f:
            self.assertEqual(f.read(), before)
        self.assertFalse(os.path.exists(os.path.join(self.dir.name, ".torch.db.lock")))
        # Good arguments of the types a user has (a NumPy seed, flags as 0/1) record.
        import numpy
        with keel_torch.record(self.path, model=model, seed=numpy.int64(7), md5=1, stats=0):
            model(torch.ones(2))
        rc, out, err = keel("inspect", self.path)
        self.assertEqual(rc, 0, err)
        self.assertIn("seed 7", out)

    def test_step_given_something_that_is_not_a_loss_says_so(self):
        with keel_torch.record(self.path):
            for bad, got in (("not a loss", "str"), (torch.ones(3), "a tensor of 3 elements"),
                             (True, "bool")):
                with self.assertRaises(TypeError) as cm:
                    keel_torch.step(bad)
                self.assertEqual(str(cm.exception), "keel_torch.step: loss must be a number or a "
                                 "one-element tensor, got " + got)
            torch.ones(2) * 2
            keel_torch.step(torch.tensor([0.5]))
        rc, out, err = keel("inspect", self.path)
        self.assertEqual(rc, 0, err)
        self.assertIn("step 1    loss 0.5000", out)

    def as_nobody(self, code):
        """Runs Python `code` (keel_torch imported) in a child, as nobody when this is root
        (permission checks pass for root); returns (rc, stderr's last line)."""
        prefix = []
        if os.geteuid() == 0:
            if not os.access("/usr/bin/setpriv", os.X_OK):
                self.skipTest("root without setpriv")
            prefix = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        os.chmod(self.dir.name, 0o777)
        r = subprocess.run(prefix + [sys.executable, "-c", "import keel_torch, torch\n" + code],
                           capture_output=True, text=True, cwd=self.dir.name)
        return r.returncode, (r.stderr.strip().splitlines() or [""])[-1]

    def test_a_recording_keeps_its_mode_and_one_this_user_may_not_write_is_refused(self):
        """As `keel record`: a replaced recording keeps its permission bits (a private 0600 file
        stays private), and an existing recording this user may not write — read-only, or
        another user's in a folder anyone may write — is refused in one line and kept, as is a
        new file in a folder this user may not write."""
        train(self.path, steps=1)
        os.chmod(self.path, 0o600)
        train(self.path, steps=2)
        self.assertEqual(stat.S_IMODE(os.stat(self.path).st_mode), 0o600)
        rc, out, err = keel("inspect", self.path)
        self.assertIn("steps      2", out)
        os.chmod(self.path, 0o444)
        with open(self.path, "rb") as f:
            before = f.read()
        rc, last = self.as_nobody("with keel_torch.record('torch.db'):\n torch.ones(2) * 2\n")
        self.assertEqual((rc, last), (1, "RuntimeError: keel_torch.record: cannot write "
                                         "torch.db: Permission denied"))
        with open(self.path, "rb") as f:
            self.assertEqual(f.read(), before)
        self.assertEqual(stat.S_IMODE(os.stat(self.path).st_mode), 0o444)
        closed = os.path.join(self.dir.name, "closed")
        os.mkdir(closed, 0o755)
        if os.geteuid() != 0:
            os.chmod(closed, 0o555)
        rc, last = self.as_nobody("with keel_torch.record('closed/new.db'):\n torch.ones(2)\n")
        self.assertEqual((rc, last), (1, "RuntimeError: keel_torch.record: cannot write "
                                         "closed/new.db: Permission denied"))
        self.assertEqual(os.listdir(closed), [])

    def test_a_recording_of_no_ops_warns_that_other_threads_are_not_recorded(self):
        """F5 (dogfood 28): a training loop in another thread recorded nothing, silently."""
        import threading
        import warnings
        model = torch.nn.Linear(4, 2)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with keel_torch.record(self.path, model=model):
                worker = threading.Thread(target=lambda: [model(torch.ones(4)) for _ in range(3)])
                worker.start()
                worker.join()
        self.assertEqual([str(w.message) for w in caught], [
            "keel_torch.record: recorded 0 ops into %s: the model ran in another thread (3 "
            "module calls), and ops run in other threads are not recorded (one recording per "
            "thread: enter keel_torch.record() in the thread that trains)" % self.path])
        self.assertEqual(caught[0].filename, __file__)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with keel_torch.record(self.path):
                keel_torch.step(1.0)
        self.assertEqual([str(w.message) for w in caught], [
            "keel_torch.record: recorded 0 ops into %s: no PyTorch op ran in this thread inside "
            "the block (though keel_torch.step() was called once); ops run in other threads "
            "are not recorded (one recording per thread: enter keel_torch.record() in the "
            "thread that trains)" % self.path])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with keel_torch.record(self.path, model=model):
                model(torch.ones(4))
        self.assertEqual(caught, [])


MB = 1 << 20


def snapshot():
    """A hand-made snapshot as torch.cuda.memory._snapshot() returns it: at the end, one 8 MiB
    segment holding a 2 MiB block still allocated and a 4 MiB segment (allocated by the trace)
    holding 3 MiB; the trace allocated 1 MiB at 0x10200000 and freed it, created the second
    segment and allocated in it, and freed a 2 MiB block that was live before it began."""
    frames = [{"filename": "train.py", "line": 12, "name": "forward"}]
    return {
        "segments": [
            {"device": 0, "address": 0x10000000, "total_size": 8 * MB, "stream": 0,
             "segment_type": "large",
             "blocks": [{"size": 2 * MB, "state": "active_allocated", "frames": frames},
                        {"size": 6 * MB, "state": "inactive"}]},
            {"device": 0, "address": 0x20000000, "total_size": 4 * MB, "stream": 0,
             "segment_type": "large",
             "blocks": [{"size": 3 * MB, "state": "active_allocated"},
                        {"size": 1 * MB, "state": "inactive"}]},
        ],
        "device_traces": [[
            {"action": "alloc", "addr": 0x10200000, "size": MB, "stream": 0, "frames": frames},
            {"action": "free_requested", "addr": 0x10200000, "size": MB, "stream": 0},
            {"action": "free_completed", "addr": 0x10200000, "size": MB, "stream": 0},
            {"action": "segment_alloc", "addr": 0x20000000, "size": 4 * MB, "stream": 0},
            {"action": "alloc", "addr": 0x20000000, "size": 3 * MB, "stream": 0},
            {"action": "free_completed", "addr": 0x10400000, "size": 2 * MB, "stream": 0},
        ]],
    }


def snapshot_113():
    """A hand-made snapshot as PyTorch 1.13's torch.cuda.memory._snapshot() returns it: a list of
    segments, blocks without addresses, their stacks in "history" (the block's own allocation
    first, older ones in the rest of the block after), no trace. Device 0: an 8 MiB segment of a
    3 MiB block allocated by a 2 MiB request (a freed 512 KiB allocation still recorded at +2.5
    MiB), 1 MiB free (its old allocation recorded), 2 MiB pending free (no history) and 2 MiB
    free; device 1: a 2 MiB segment, all allocated."""
    def history(addr, real_size, name, line):
        return {"addr": addr, "real_size": real_size,
                "frames": [{"filename": "train.py", "line": line, "name": name}]}
    return [
        {"device": 0, "address": 0x10000000, "total_size": 8 * MB, "allocated_size": 3 * MB,
         "active_size": 5 * MB, "stream": 0, "segment_type": "large",
         "blocks": [{"size": 3 * MB, "state": "active_allocated",
                     "history": [history(0x10000000, 2 * MB, "forward", 12),
                                 history(0x10280000, MB // 2, "old_forward", 7)]},
                    {"size": MB, "state": "inactive",
                     "history": [history(0x10300000, MB, "freed_temp", 40)]},
                    {"size": 2 * MB, "state": "active_pending_free"},
                    {"size": 2 * MB, "state": "inactive"}]},
        {"device": 1, "address": 0x20000000, "total_size": 2 * MB, "allocated_size": 2 * MB,
         "active_size": 2 * MB, "stream": 0, "segment_type": "large",
         "blocks": [{"size": 2 * MB, "state": "active_allocated",
                     "history": [history(0x20000000, 2 * MB, "step", 99)]}]},
    ]


def mem_events(path):
    """A recording's allocator events: [kind, address, bytes, [file, line, function] of its
    stack's innermost frame or None], in order."""
    import sqlite3
    with sqlite3.connect(path) as db:
        rows = db.execute(
            "SELECT k.text, m.address, m.bytes, fs.text, f.line, fn.text FROM mem_events m "
            "JOIN strings k ON k.id = m.kind_sid "
            "LEFT JOIN stack_frames sf ON sf.stack_id = m.stack_id AND sf.depth = 0 "
            "LEFT JOIN frames f ON f.id = sf.frame_id "
            "LEFT JOIN strings fs ON fs.id = f.file_sid "
            "LEFT JOIN strings fn ON fn.id = f.function_sid ORDER BY m.id").fetchall()
    return [[k, a, b, None if fn is None else [fs, line, fn]] for k, a, b, fs, line, fn in rows]


class GuideTest(unittest.TestCase):
    """docs/torch.md followed to the letter: its Python block is run as a user's train.py, and
    `keel inspect` shows what the guide says (3 steps, and the op count in its comment)."""

    def test_the_guides_five_lines_record_what_it_says(self):
        with open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "torch.md")) as f:
            guide = f.read()
        code = guide.split("```python\n", 1)[1].split("```", 1)[0]
        claim = re.search(r"inspect run\.db\s+# (\d+) steps, their losses, (\d+) ATen op calls", guide)
        self.assertIsNotNone(claim, "the guide's keel inspect line")
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "train.py"), "w") as f:
                f.write(code)
            r = subprocess.run([sys.executable, "train.py"], cwd=d, capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            rc, out, err = keel("inspect", os.path.join(d, "run.db"))
            self.assertEqual(rc, 0, err)
            self.assertRegex(out, r"\nsteps\s+%s\n" % claim.group(1))
            self.assertRegex(out, r"\nops\s+%s\s" % claim.group(2))
            self.assertIn('"md5": true', out)
            # Note [keel_torch step boundary]: each step's batch (the randn made before the
            # model is called) is that step's forward op; it read as the previous step's
            # optimizer work.
            rc, out, err = keel("ops", os.path.join(d, "run.db"), "--name", "randn")
            self.assertEqual(rc, 0, err)
            rows = [l.split() for l in out.splitlines() if " randn" in l]
            self.assertEqual([(r[1], r[2]) for r in rows],
                             [("1", "forward"), ("2", "forward"), ("3", "forward")], out)


class SnapshotImportTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.dir.cleanup()

    def test_a_snapshot_becomes_a_recording_with_its_allocator_events(self):
        import pickle
        src = os.path.join(self.dir.name, "snapshot.pickle")
        out = os.path.join(self.dir.name, "mem.db")
        with open(src, "wb") as f:
            pickle.dump(snapshot(), f)
        r = subprocess.run([sys.executable, "-m", "keel_torch", "import-snapshot", src, "-o", out],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        # Start: 8 MiB reserved, 2 + 2 MiB live (3 events); then +1, -1, +4 reserved, +3, -2.
        self.assertIn("8 allocator events", r.stdout)
        rc, stats, err = keel("memory", "stats", out)
        self.assertEqual(rc, 0, err)
        # Allocated peaks at 7 MiB (after the +3) and ends at 5 MiB; reserved 12 MiB.
        self.assertRegex(stats, r"allocated \(bytes\)\s+%d\s+%d" % (7 * MB, 5 * MB))
        self.assertRegex(stats, r"reserved \(bytes\)\s+%d\s+%d" % (12 * MB, 12 * MB))

    def test_generated_snapshots_give_the_generators_figures(self):
        """Snapshots written by Python's pickle from a simulated caching allocator (two devices,
        the trace cut as PyTorch's ring buffer cuts it): the importer's event count and peak/end
        bytes equal what the generator computed, through both front ends."""
        import json
        import pickle
        sys.path.insert(0, os.path.dirname(__file__))
        import torch_snapshot_gen
        snap, want = torch_snapshot_gen.generate(6000, keep=2500, seed=11, devices=2)
        src = os.path.join(self.dir.name, "gen.pickle")
        with open(src, "wb") as f:
            pickle.dump(snap, f)
        for dev in (0, 1):
            out = os.path.join(self.dir.name, f"gen{dev}.db")
            r = subprocess.run([sys.executable, "-m", "keel_torch", "import-snapshot", src, "-o",
                                out, "--device", str(dev)], capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn(f"{want[dev]['events']} allocator events", r.stdout)
            rc, stats, err = keel("memory", "stats", out)
            self.assertEqual(rc, 0, err)
            self.assertRegex(stats, r"allocated \(bytes\)\s+%d\s+%d" %
                             (want[dev]["peak_allocated"], want[dev]["end_allocated"]))
            # keel import torch-memory: the same reader in C++, the same figures
            out2 = os.path.join(self.dir.name, f"cli{dev}.db")
            rc, text, err = keel("import", "torch-memory", src, "-o", out2, "--device", str(dev))
            self.assertEqual(rc, 0, err)
            self.assertIn(f"{want[dev]['events']} allocator events", text)
            self.assertIn(f"{want[dev]['trace_entries']} trace entries", text)
        # the dict torch.cuda.memory._snapshot() returns, imported in the process
        out3 = os.path.join(self.dir.name, "dict.db")
        from keel_torch.snapshot import import_snapshot
        self.assertEqual(import_snapshot(snap, out3, 1), want[1]["events"])

    def test_a_pytorch_113_snapshot_list_imports_as_its_state(self):
        """PyTorch 1.13's _snapshot() is a list (it has no _dump_snapshot): pickled as users do,
        it imported as 'not a PyTorch memory snapshot: the pickle holds no dict', and the list
        itself made import_snapshot raise TypeError."""
        import pickle
        src = os.path.join(self.dir.name, "snap113.pickle")
        with open(src, "wb") as f:
            pickle.dump(snapshot_113(), f, protocol=2)
        # The 8 MiB segment, then the live blocks (allocated and pending free) in address order;
        # the 3 MiB block's stack is its own allocation's, not the freed one recorded after it.
        want0 = [["reserve", 0x10000000, 8 * MB, None],
                 ["alloc", 0x10000000, 3 * MB, ["train.py", 12, "forward"]],
                 ["alloc", 0x10400000, 2 * MB, None]]
        want1 = [["reserve", 0x20000000, 2 * MB, None],
                 ["alloc", 0x20000000, 2 * MB, ["train.py", 99, "step"]]]
        out = os.path.join(self.dir.name, "m0.db")
        r = subprocess.run([sys.executable, "-m", "keel_torch", "import-snapshot", src, "-o", out],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout, f"keel_torch: 3 allocator events from {src} -> {out}\n")
        self.assertEqual(mem_events(out), want0)
        rc, stats, err = keel("memory", "stats", out)
        self.assertEqual(rc, 0, err)
        self.assertRegex(stats, r"allocated \(bytes\)\s+%d\s+%d" % (5 * MB, 5 * MB))
        self.assertRegex(stats, r"reserved \(bytes\)\s+%d\s+%d" % (8 * MB, 8 * MB))
        out = os.path.join(self.dir.name, "cli1.db")
        rc, text, err = keel("import", "torch-memory", src, "-o", out, "--device", "1")
        self.assertEqual(rc, 0, err)
        self.assertIn("wrote %s: 2 allocator events" % out, text)
        self.assertEqual(mem_events(out), want1)
        # The list itself, as _snapshot() returns it in the process.
        from keel_torch.snapshot import import_snapshot
        out = os.path.join(self.dir.name, "list1.db")
        self.assertEqual(import_snapshot(snapshot_113(), out, 1), 2)
        self.assertEqual(mem_events(out), want1)

    def test_generated_pytorch_113_snapshots_give_every_event_the_generator_computed(self):
        import pickle
        sys.path.insert(0, os.path.dirname(__file__))
        import torch_snapshot_gen
        from keel_torch.snapshot import import_snapshot
        snap, want = torch_snapshot_gen.generate_113(4000, seed=3, devices=2)
        src = os.path.join(self.dir.name, "gen113.pickle")
        with open(src, "wb") as f:
            pickle.dump(snap, f, protocol=2)
        for dev in (0, 1):
            out = os.path.join(self.dir.name, f"gen113-{dev}.db")
            r = subprocess.run([sys.executable, "-m", "keel_torch", "import-snapshot", src, "-o",
                                out, "--device", str(dev)], capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn(f"keel_torch: {want[dev]['events']} allocator events", r.stdout)
            self.assertEqual(mem_events(out), want[dev]["mem_events"])
            rc, stats, err = keel("memory", "stats", out)
            self.assertEqual(rc, 0, err)
            self.assertRegex(stats, r"allocated \(bytes\)\s+%d\s+%d" %
                             (want[dev]["peak_allocated"], want[dev]["end_allocated"]))
            self.assertRegex(stats, r"reserved \(bytes\)\s+%d\s+%d" %
                             (want[dev]["peak_reserved"], want[dev]["end_reserved"]))
            out = os.path.join(self.dir.name, f"list113-{dev}.db")
            self.assertEqual(import_snapshot(snap, out, dev), want[dev]["events"])
            self.assertEqual(mem_events(out), want[dev]["mem_events"])

    def test_errors_about_a_snapshot_in_memory_name_it_not_a_temporary_file(self):
        """They said '/tmp/tmpnyisk_tu.pickle: the snapshot has no memory of device 3'."""
        from keel_torch.snapshot import SnapshotError, import_snapshot
        out = os.path.join(self.dir.name, "x.db")
        cases = [
            (snapshot_113(), 3,
             "the snapshot list: the snapshot has no memory of device 3 (devices in it: 0, 1)"),
            (snapshot(), 3,
             "the snapshot dict: the snapshot has no memory of device 3 (devices in it: 0)"),
            ([1, 2], 0, "the snapshot list: not a PyTorch memory snapshot: the pickle holds a "
                        "list, but not of segments (dicts)"),
            ({"device_traces": []}, 0,
             "the snapshot dict: not a PyTorch memory snapshot: it has no 'segments'"),
        ]
        for source, device, message in cases:
            with self.subTest(message=message):
                with self.assertRaises(SnapshotError) as caught:
                    import_snapshot(source, out, device)
                self.assertEqual(str(caught.exception), message)
                self.assertFalse(os.path.exists(out))
        # The recording names it the same way (its source was the temporary file's path).
        ok = os.path.join(self.dir.name, "named.db")
        import_snapshot(snapshot_113(), ok, 0)
        import sqlite3
        with sqlite3.connect(ok) as db:
            options = json.loads(db.execute("SELECT capture_options_json FROM run").fetchone()[0])
        self.assertEqual(options["source"], "the snapshot list")
        # A function in it is pickled by name, and the reader refuses to look it up.
        with self.assertRaisesRegex(SnapshotError, r"^the snapshot list: not a memory snapshot "
                                    r"Keel can read: opcode STACK_GLOBAL \(0x93\), which would "
                                    r"run code: Keel's reader builds plain data only "
                                    r"\(byte \d+\)$"):
            import_snapshot([{"device": 0, "address": 0, "total_size": 1, "f": os.system}], out)
        # What pickle cannot write at all: a lambda.
        with self.assertRaisesRegex(SnapshotError, r"^the snapshot dict: cannot be pickled: "):
            import_snapshot({"segments": [lambda: 0]}, out)
        with self.assertRaisesRegex(TypeError, r"^import_snapshot: source must be a path or what "
                                    r"torch\.cuda\.memory\._snapshot\(\) returns \(a dict or a "
                                    r"list\), not int$"):
            import_snapshot(3, out)
        # A path names itself, as before.
        bad = os.path.join(self.dir.name, "bad.pickle")
        with open(bad, "wb") as f:
            f.write(b"not a pickle")
        with self.assertRaises(SnapshotError) as caught:
            import_snapshot(bad, out)
        self.assertTrue(str(caught.exception).startswith(bad + ": "), caught.exception)

    def test_a_pickle_that_runs_code_is_refused_and_runs_nothing(self):
        import pickle

        class Evil:
            def __reduce__(self):
                return (os.system, ("touch " + os.path.join(self_dir, "PWNED"),))

        self_dir = self.dir.name
        evil = os.path.join(self.dir.name, "evil.pickle")
        with open(evil, "wb") as f:
            pickle.dump({"segments": [Evil()], "device_traces": []}, f)
        out = os.path.join(self.dir.name, "x.db")
        r = subprocess.run([sys.executable, "-m", "keel_torch", "import-snapshot", evil, "-o", out],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 2, r.stdout)
        self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
        self.assertIn("which would run code", r.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.dir.name, "PWNED")))
        self.assertFalse(os.path.exists(out))

    def test_a_bad_snapshot_is_one_line_and_status_2(self):
        bad = os.path.join(self.dir.name, "bad.pickle")
        with open(bad, "wb") as f:
            f.write(b"not a pickle")
        r = subprocess.run([sys.executable, "-m", "keel_torch", "import-snapshot", bad, "-o",
                            os.path.join(self.dir.name, "x.db")], capture_output=True, text=True)
        self.assertEqual(r.returncode, 2)
        self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
        self.assertIn("not a memory snapshot Keel can read", r.stderr)


if __name__ == "__main__":
    unittest.main()
