"""scripts/host-syncs.py on small fixture trees: which patterns it finds in
trainer/ and python/dynmo/, how an annotation is matched, what it prints and
when it fails. No repository file is read."""
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "host-syncs.py")


class HostSyncsTest(unittest.TestCase):
    def setUp(self):
        self.root = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.root)
        os.makedirs(os.path.join(self.root, "trainer"))
        os.makedirs(os.path.join(self.root, "python", "dynmo", "torch"))

    def write(self, rel, text):
        with open(os.path.join(self.root, rel), "w") as f:
            f.write(textwrap.dedent(text))

    def scan(self, *args):
        return subprocess.run([sys.executable, SCRIPT, self.root, *args],
                              capture_output=True, text=True)

    def test_unannotated_item_in_python_fails_and_names_the_line(self):
        self.write("python/dynmo/torch/clock.py", """\
            def loss_of(t):
                return t.item()
            """)
        r = self.scan()
        self.assertEqual(r.returncode, 1)
        self.assertIn("host syncs (unexplained): 1", r.stdout)
        self.assertIn("python/dynmo/torch/clock.py:2: item:", r.stdout)

    def test_annotated_sites_pass_and_are_listed_under_their_kind(self):
        self.write("python/dynmo/torch/clock.py", """\
            import torch

            def loss_of(t):
                # host-sync(steady): the loss for the log;
                #   cost: 3 us per iteration
                total = t.sum()
                return total.item()

            def at_plan(header, start, stop):
                sizes = header.tolist()  # host-sync(event): the header, once per plan
                # host-sync(cpu): the step counter lives on the CPU
                step = header.cpu()
                return sizes, step
            """)
        self.write("trainer/clock.cc", """\
            void Collect() {
              // host-sync(event): a speed probe: its one span
              events_[0].synchronize();
              seconds = events_[0].elapsedTime(events_[1]);
            }
            """)
        r = self.scan()
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(r.stdout.splitlines(), [
            "host syncs (steady): 1",
            "  python/dynmo/torch/clock.py:7: item: the loss for the log; cost: 3 us per iteration",
            "host syncs (model): 0 (the dynamic models' own arithmetic: a run without DynMo "
            "waits alike)",
            "host syncs (event): 3",
            "  trainer/clock.cc:3: synchronize: a speed probe: its one span",
            "  trainer/clock.cc:4: elapsed time: a speed probe: its one span",
            "  python/dynmo/torch/clock.py:10: tolist: the header, once per plan",
            "host syncs (cpu): 1",
            "  python/dynmo/torch/clock.py:12: cpu: the step counter lives on the CPU",
        ])
        steady = self.scan("--steady")
        self.assertEqual(steady.returncode, 0)
        self.assertEqual(steady.stdout.splitlines()[0], "host syncs (steady): 1")
        self.assertNotIn("event", steady.stdout)

    def test_the_models_own_waits_are_listed_apart_and_only_under_trainer_model(self):
        os.makedirs(os.path.join(self.root, "trainer", "model"))
        self.write("trainer/model/moe.cc", """\
            void Route() {
              // host-sync(model): per MoE layer: the experts' counts size their batches
              counts = key.bincount().to(torch::kCPU);
            }
            """)
        r = self.scan()
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("host syncs (steady): 0", r.stdout)
        self.assertIn("host syncs (model): 1 (the dynamic models' own arithmetic", r.stdout)
        self.assertIn("  trainer/model/moe.cc:3: to cpu: per MoE layer: the experts' counts "
                      "size their batches", r.stdout)
        # DynMo's own code cannot call a wait of its own the model's.
        self.write("trainer/report.cc", """\
            void Gather() {
              // host-sync(model): the report
              AllReduceSumWorld(summary);
            }
            """)
        r = self.scan()
        self.assertEqual(r.returncode, 1)
        self.assertIn("trainer/report.cc:3: world collective: host-sync(model) outside "
                      "trainer/model/", r.stderr)

    def test_a_note_more_than_three_code_lines_above_does_not_count(self):
        self.write("python/dynmo/torch/far.py", """\
            # host-sync(event): too far away
            a = 1
            b = 2
            c = 3
            d = 4
            x = t.tolist()
            """)
        r = self.scan()
        self.assertEqual(r.returncode, 1)
        self.assertIn("python/dynmo/torch/far.py:6: tolist:", r.stdout)

    def test_every_blocking_pattern_is_found_and_query_is_not(self):
        self.write("python/dynmo/torch/all.py", """\
            torch.cuda.synchronize(device)
            stream.synchronize()
            n = t.item()
            xs = t.tolist()
            h = t.cpu()
            a = t.numpy()
            u = t.to("cpu")
            v = t.to(torch.device("cpu"))
            w = t.to(device, non_blocking=False)
            s = torch.masked_select(t, m)
            i = t.nonzero()
            ms = start.elapsed_time(stop)
            done = stop.query()
            y = t.to(device, non_blocking=True)
            """)
        self.write("trainer/all.cc", """\
            at::cuda::getCurrentCUDAStream().synchronize();
            SynchronizeDevice(device);
            auto n = t.item<int64_t>();
            auto h = t.to(torch::kCPU);
            auto g = p->to(at::kCPU);
            auto c = t.to(device, torch::kLong, /*non_blocking=*/false, /*copy=*/true);
            float ms = a.elapsedTime(b);
            auto idx = torch::nonzero(m);
            auto k = t.masked_select(m);
            if (absl::Status s = transport.AllReduceSumWorld(summary); !s.ok()) return s;
            bool done = event.query();
            """)
        r = self.scan()
        self.assertEqual(r.returncode, 1)
        found = [line.split(": ")[0].strip() + " " + line.split(": ")[1]
                 for line in r.stdout.splitlines() if line.startswith("  ")]
        self.assertEqual(sorted(found), sorted([
            "python/dynmo/torch/all.py:1 synchronize", "python/dynmo/torch/all.py:2 synchronize",
            "python/dynmo/torch/all.py:3 item", "python/dynmo/torch/all.py:4 tolist",
            "python/dynmo/torch/all.py:5 cpu", "python/dynmo/torch/all.py:6 numpy",
            "python/dynmo/torch/all.py:7 to cpu", "python/dynmo/torch/all.py:8 to cpu",
            "python/dynmo/torch/all.py:9 blocking copy",
            "python/dynmo/torch/all.py:10 masked_select", "python/dynmo/torch/all.py:11 nonzero",
            "python/dynmo/torch/all.py:12 elapsed time",
            "trainer/all.cc:1 synchronize", "trainer/all.cc:2 synchronize", "trainer/all.cc:3 item",
            "trainer/all.cc:4 to cpu", "trainer/all.cc:5 to cpu", "trainer/all.cc:6 blocking copy",
            "trainer/all.cc:7 elapsed time", "trainer/all.cc:8 nonzero",
            "trainer/all.cc:9 masked_select", "trainer/all.cc:10 world collective",
        ]))

    def test_comments_and_docstrings_are_not_code(self):
        self.write("python/dynmo/torch/doc.py", '''\
            """Reads the clock lagged: no .item() and no synchronize() here."""

            def f(t):
                """Never calls t.cpu()."""
                return t  # not t.tolist()
            ''')
        self.write("trainer/doc.h", "// Collect() calls synchronize() once.\n")
        r = self.scan()
        self.assertEqual(r.returncode, 0, r.stdout)
        self.assertIn("host syncs (steady): 0", r.stdout)


if __name__ == "__main__":
    unittest.main()
