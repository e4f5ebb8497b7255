"""Comparing a PyTorch run with a Keel run op by op (issue 19), through the real binaries: Keel's
GPT (configs/gpt-mini.json) in PyTorch (keel_gpt.py) starts from the weights and reads the
batches `keel train --save-inputs` wrote; `keel diff keel.db torch.db` pairs the two runs module
by module and finds them equal within float32 tolerance, and a forward hook that adds to one
element of one module's output is reported as the root divergence at that module and op. Run by
ctest with PYTHONPATH at the build tree and KEEL_CLI the keel binary."""

import json
import os
import re
import subprocess
import sys
import tempfile
import unittest

KEEL = os.environ["KEEL_CLI"]
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CONFIG = os.path.join(ROOT, "configs", "gpt-mini.json")
STEPS = 2
SEED = 7


def run(*args):
    r = subprocess.run(list(args), capture_output=True, text=True, timeout=600)
    return r.returncode, r.stdout, r.stderr


def torch_run(inputs, out, *extra):
    code, so, se = run(sys.executable, os.path.join(HERE, "keel_gpt.py"), "--config", CONFIG,
                       "--inputs", inputs, "--steps", str(STEPS), "-o", out, *extra)
    if code != 0:
        raise AssertionError(f"keel_gpt.py failed ({code}): {se}")
    return [float(x) for x in so.split("losses", 1)[1].split()]


class TorchCompareTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        d = cls.tmp.name
        cls.inputs = os.path.join(d, "inputs")
        code, so, se = run(KEEL, "train", "--config", CONFIG, "--steps", str(STEPS), "--seed",
                           str(SEED), "--eval-batches", "0", "--save-inputs", cls.inputs)
        assert code == 0, se
        cls.keel_losses = [float(m) for m in re.findall(r"loss (\d+\.\d+)", so)][:STEPS]
        cls.keel_db = os.path.join(d, "keel.db")
        code, so, se = run(KEEL, "record", "--config", CONFIG, "--steps", str(STEPS), "--seed",
                           str(SEED), "--md5", "--stats", "--stacks", "-o", cls.keel_db)
        assert code == 0, se
        cls.torch_db = os.path.join(d, "torch.db")
        cls.torch_losses = torch_run(cls.inputs, cls.torch_db)
        cls.bad_db = os.path.join(d, "perturbed.db")
        torch_run(cls.inputs, cls.bad_db, "--perturb", "blocks.1.mlp.w1:10")
        # With blocks.1's output values stored on both sides (step 1 in Keel), a change of
        # 0.001 in one of 393,216 elements, which no statistic shows, is found element by element.
        cls.keel_dumps = os.path.join(d, "keel-dumps.db")
        code, so, se = run(KEEL, "record", "--config", CONFIG, "--steps", str(STEPS), "--seed",
                           str(SEED), "--md5", "--stats", "--dumps", "--dump-scope", "blocks.1",
                           "--dump-steps", "1:1", "-o", cls.keel_dumps)
        assert code == 0, se
        cls.torch_dumps = os.path.join(d, "torch-dumps.db")
        torch_run(cls.inputs, cls.torch_dumps, "--dumps", "blocks.1")
        cls.small_db = os.path.join(d, "small.db")
        torch_run(cls.inputs, cls.small_db, "--dumps", "blocks.1", "--perturb",
                  "blocks.1.mlp.w1:0.001")

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def diff(self, b, *extra):
        code, so, se = run(KEEL, "diff", self.keel_db, b, *extra)
        self.assertIn(code, (0, 1), se)
        return code, so

    def test_save_inputs_writes_the_weights_and_batches(self):
        self.assertTrue(os.path.isfile(os.path.join(self.inputs, "init", "keel-checkpoint.json")))
        sys.path.insert(0, HERE)
        import keel_gpt
        b = keel_gpt.read_safetensors(os.path.join(self.inputs, "batches.safetensors"))
        self.assertEqual(list(b["idx"].shape), [STEPS, 16, 64])
        # Targets are the next tokens of the same windows.
        self.assertTrue(bool((b["idx"][:, :, 1:] == b["targets"][:, :, :-1]).all()))
        # An existing non-empty directory is refused, and kept.
        code, _, se = run(KEEL, "train", "--config", CONFIG, "--steps", "1", "--save-inputs",
                          self.inputs)
        self.assertEqual(code, 2)
        self.assertEqual(len(se.strip().splitlines()), 1, se)
        self.assertIn("not an empty directory", se)
        self.assertTrue(os.path.isfile(os.path.join(self.inputs, "batches.safetensors")))

    def test_a_causal_mask_is_not_the_runs_first_nan_and_a_real_nan_after_it_is(self):
        # The model's attention fills its causal mask with -inf before the softmax (masked_fill):
        # those infinities are the mask's, not a fault (Note [Where non-finite values appear]).
        code, so, se = run(KEEL, "inspect", self.torch_db)
        self.assertEqual(code, 0, se)
        self.assertIn("first NaN/Inf: none (in the recorded statistics)", so)
        nan_db = os.path.join(self.tmp.name, "nan.db")
        torch_run(self.inputs, nan_db, "--perturb", "blocks.1.mlp.w1:nan")
        code, so, se = run(KEEL, "inspect", nan_db)
        self.assertEqual(code, 0, se)
        self.assertRegex(so, r"first NaN/Inf: op #\d+ add \(forward\) in step 1, "
                             r"scope 'blocks\.1\.mlp\.w1'")

    def test_a_torch_recording_without_statistics_is_told_keel_torchs_argument(self):
        # keel inspect's hint names keel_torch.record's argument, not keel record's flags.
        db = os.path.join(self.tmp.name, "graph-only.db")
        script = ("import torch, keel_torch\n"
                  "m = torch.nn.Linear(4, 2)\n"
                  f"with keel_torch.record({db!r}, model=m, md5=False, stats=False):\n"
                  "    m(torch.ones(3, 4)).sum().backward()\n")
        code, _, se = run(sys.executable, "-c", script)
        self.assertEqual(code, 0, se)
        code, so, se = run(KEEL, "inspect", db)
        self.assertEqual(code, 0, se)
        self.assertIn("\nfirst NaN/Inf: unknown (recorded without statistics: record with "
                      "keel_torch.record(..., stats=True) to find it)\n", so)
        # keel diff of two such recordings names keel_torch's arguments too (it said --all).
        other = os.path.join(self.tmp.name, "graph-only-2.db")
        code, _, se = run(sys.executable, "-c", script.replace(repr(db), repr(other)))
        self.assertEqual(code, 0, se)
        code, so, se = run(KEEL, "diff", db, other)
        self.assertIn("record both with keel_torch.record(..., md5=True, stats=True)", so + se)

    def test_the_two_frameworks_compute_the_same_losses(self):
        self.assertEqual(len(self.keel_losses), STEPS)
        for k, t in zip(self.keel_losses, self.torch_losses):
            self.assertAlmostEqual(k, t, delta=1e-4)  # keel train prints 4 decimals

    def test_the_runs_are_equal_within_tolerance_module_by_module(self):
        code, so = self.diff(self.torch_db, "--json")
        rep = json.loads(so)
        self.assertEqual(code, 0, so[:2000])
        self.assertEqual(rep["options"]["align"], "module")
        self.assertEqual(rep["frameworks"], {"a": "keel", "b": "torch"})
        # Keel's seed (7) and keel_torch's (0) drive different generators, and the configs name
        # what their own side reads: no setup difference (it said "seed 7 vs 0: every random op
        # differs" and "attention_mask - vs \"causal\"").
        self.assertEqual([s for s in rep["setupDifferences"] if s.startswith(("seed", "config"))],
                         [], rep["setupDifferences"])
        self.assertEqual(rep["total"]["diverged"], 0)
        self.assertIsNone(rep["firstDivergence"])
        pairs = [p for p in rep["pairs"] if p["a"] and p["b"]]
        # Every module of the model has its forward and backward ops paired in both steps:
        # 4 blocks x (qkv, proj, w1, w3, w2) + lm_head matmuls.
        for step in (1, 2):
            fwd = [p for p in pairs if p["step"] == step and p["phase"] == "forward"
                   and p["kind"] == "matmul"]
            self.assertEqual(sorted({p["scope"] for p in fwd}),
                             sorted([f"blocks.{i}.{m}" for i in range(4)
                                     for m in ("attn.qkv", "attn.proj", "mlp.w1", "mlp.w3",
                                               "mlp.w2")] + ["lm_head"]))
            for kind in ("layer_norm", "embedding", "silu", "cross_entropy"):
                self.assertTrue(any(p["step"] == step and p["kind"] == kind for p in pairs),
                                f"no {kind} pair in step {step}")
            bwd = [p for p in pairs if p["step"] == step and p["phase"] == "backward"]
            self.assertGreaterEqual(len(bwd), 40)
        for p in pairs:
            self.assertIn(p["status"], ("equal", "within-tolerance"), p)

    def test_a_perturbed_op_is_the_root_divergence_at_its_module(self):
        code, so = self.diff(self.bad_db, "--json")
        self.assertEqual(code, 1)
        rep = json.loads(so)
        root = rep["rootDivergence"]["pair"]
        self.assertEqual((root["step"], root["phase"], root["scope"], root["name"]),
                         (1, "forward", "blocks.1.mlp.w1", "add"))
        self.assertIsNone(root["a"])  # only in the PyTorch run: the hook's add
        first = rep["firstDivergence"]["pair"]
        self.assertEqual((first["step"], first["phase"], first["scope"], first["name"]),
                         (1, "forward", "blocks.1.mlp", "silu"))
        # The change flows on: the module's output projection reads it and diverges too.
        w2 = [p for p in rep["pairs"] if p["a"] and p["b"] and p["step"] == 1
              and p["phase"] == "forward" and p["scope"] == "blocks.1.mlp.w2"]
        self.assertEqual([p["status"] for p in w2], ["diverged"])
        # The text report names it with the hook's Python stack.
        code, text = self.diff(self.bad_db)
        self.assertEqual(code, 1)
        self.assertIn("root divergence: step 1  A -  B #", text)
        self.assertIn("add [forward] blocks.1.mlp.w1", text)
        self.assertIn("only in B", text)
        self.assertRegex(text, r"hook\s+\S*keel_gpt\.py:\d+")

    def test_dumped_values_are_compared_element_by_element(self):
        code, so = run(KEEL, "diff", self.keel_dumps, self.torch_dumps, "--json")[:2]
        rep = json.loads(so)
        self.assertEqual(code, 0, so[:2000])
        by_values = [p for p in rep["pairs"] if p["a"] and p["b"] and p["step"] == 1
                     and p["outputs"][0]["basis"] == "values"]
        self.assertGreaterEqual(len(by_values), 10)
        self.assertTrue(all(p["scope"].startswith("blocks.1") for p in by_values))
        self.assertEqual(rep["total"]["diverged"], 0)

    def test_a_small_perturbation_is_found_in_the_dumped_values(self):
        code, so = run(KEEL, "diff", self.keel_dumps, self.small_db, "--json")[:2]
        self.assertEqual(code, 1)
        rep = json.loads(so)
        first = rep["firstDivergence"]["pair"]
        self.assertEqual((first["step"], first["scope"], first["name"]), (1, "blocks.1.mlp", "silu"))
        out = first["outputs"][0]
        self.assertEqual((out["basis"], out["badElements"]), ("values", 1))
        root = rep["rootDivergence"]["pair"]
        self.assertEqual((root["scope"], root["name"]), ("blocks.1.mlp.w1", "add"))
        self.assertIsNone(root["a"])

    def test_signature_alignment_pairs_almost_nothing_across_frameworks(self):
        code, so = self.diff(self.torch_db, "--json", "--align", "signature")
        rep = json.loads(so)
        self.assertEqual(rep["options"]["align"], "signature")
        module = json.loads(self.diff(self.torch_db, "--json")[1])
        paired = lambda r: r["total"]["equal"] + r["total"]["withinTolerance"]
        self.assertGreater(paired(module), 4 * paired(rep))


if __name__ == "__main__":
    unittest.main()
