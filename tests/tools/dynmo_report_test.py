"""scripts/dynmo-report: the side-by-side table and picture from --log_json
files, and one-line errors for bad input. Synthetic records, no training."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

REPORT = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "dynmo-report")


def record(i, times, boundaries, epoch, loss, changed=False):
    return {"iter": i, "loss": loss, "tokens_per_s": 1000.0 / max(times),
            "stage_times": times, "boundaries": boundaries, "epoch": epoch,
            "iteration_s": max(times) * 1.1, "layer_forward_s": [0.0] * 4,
            "layer_backward_s": [0.0] * 4, "layer_memory_bytes": [10, 20, 30, 40],
            "model_changed": changed}


class DynmoReportTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp()

    def write(self, name, records):
        path = os.path.join(self.dir, name)
        with open(path, "w") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")
        return path

    def run_report(self, *args):
        return subprocess.run([sys.executable, REPORT, *args], capture_output=True, text=True)

    def test_table_counts_plans_moved_bytes_and_speedup_and_draws_the_picture(self):
        static = self.write("static.jsonl",
                            [record(i, [0.3, 0.1], [0, 3, 4], 0, 2.0 - i * 0.1) for i in range(6)])
        dynmo = self.write("dynmo.jsonl", [
            record(0, [0.3, 0.1], [0, 3, 4], 0, 2.0),
            record(1, [0.3, 0.1], [0, 3, 4], 0, 1.9),
            record(2, [0.2, 0.2], [0, 2, 4], 1, 1.8),  # layer 2 moved: 30 bytes
            record(3, [0.2, 0.2], [0, 2, 4], 1, 1.7, changed=True),
            record(4, [0.2, 0.2], [0, 2, 4], 1, 1.6),
            record(5, [0.2, 0.2], [0, 2, 4], 1, 1.5),
        ])
        svg = os.path.join(self.dir, "out.svg")
        r = self.run_report("--svg", svg, f"static={static}", f"DynMo={dynmo}")
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stdout.splitlines()
        dynmo_row = next(l for l in lines if l.startswith("DynMo"))
        self.assertIn("1.50x", dynmo_row)        # 1000/0.2 vs 1000/0.3 tokens/s
        self.assertIn(" 1 ", dynmo_row)          # one plan
        self.assertIn("30 B", dynmo_row)         # layer 2's resident bytes
        self.assertIn("1.500000", dynmo_row)     # final loss
        picture = open(svg).read()
        self.assertTrue(picture.startswith("<svg"))
        self.assertIn("0,2,4", picture)           # the plan's boundaries marked
        self.assertIn("model changed", picture)
        self.assertEqual(picture.count("<polyline"), 4)  # 2 runs x 2 stages

    def test_bad_input_is_one_line_and_exit_two(self):
        bad = os.path.join(self.dir, "bad.jsonl")
        with open(bad, "w") as f:
            f.write('{"iter": 0}\n')
        for args, message in [
            ([bad], "has no 'loss'"),
            ([os.path.join(self.dir, "missing.jsonl")], "cannot read"),
            (["--bogus"], "unknown flag --bogus"),
            ([], "no --log_json file"),
            (["--skip", "x", bad], "--skip must be"),
        ]:
            r = self.run_report(*args)
            self.assertEqual(r.returncode, 2, args)
            self.assertIn(message, r.stderr)
            self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)


if __name__ == "__main__":
    unittest.main()
