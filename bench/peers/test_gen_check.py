"""Tests of gen_check.py's comparison and prompts, without torch or a GPU.

Run: cd bench/peers && python3 -m unittest -v test_gen_check
"""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_check  # noqa: E402


def ours(tokens, gaps, reason="budget", prompt=(1, 2)):
    return {"tokens": tokens, "top2_gaps": gaps, "stop_reason": reason, "prompt_tokens": list(prompt)}


class CompareTest(unittest.TestCase):
    def test_equal(self):
        r = gen_check.compare([ours([5, 6], [1, 1])], [{"tokens": [5, 6], "gaps": [1, 1], "eos": False}])
        self.assertTrue(r["ok"])
        self.assertEqual(r["sequences"][0]["status"], "equal")

    def test_divergence_at_a_near_tie_passes(self):
        r = gen_check.compare([ours([5, 7], [1, 5e-5])], [{"tokens": [5, 6], "gaps": [1, 0.3], "eos": False}])
        self.assertTrue(r["ok"])
        s = r["sequences"][0]
        self.assertEqual((s["status"], s["at"], s["our_token"], s["hf_token"]), ("near-tie", 1, 7, 6))

    def test_divergence_fails(self):
        r = gen_check.compare([ours([5, 7], [1, 0.5])], [{"tokens": [5, 6], "gaps": [1, 0.3], "eos": False}])
        self.assertFalse(r["ok"])
        self.assertEqual(r["sequences"][0]["status"], "DIVERGES")

    def test_end_of_text(self):
        # transformers stopped at end of text; we must have too.
        hf = [{"tokens": [5], "gaps": [1, 1], "eos": True}]
        self.assertTrue(gen_check.compare([ours([5], [1], "stop_token")], hf)["ok"])
        self.assertFalse(gen_check.compare([ours([5], [1], "budget")], hf)["ok"])
        self.assertFalse(gen_check.compare([ours([5, 9], [1, 1])], hf)["ok"])


class PromptsTest(unittest.TestCase):
    def test_lengths_differ_and_repeat(self):
        p = gen_check.prompts(24)
        self.assertEqual(p, gen_check.prompts(24))
        self.assertEqual(len(set(len(x.split()) for x in p)), 24)
        self.assertTrue(all(x and "\n" not in x for x in p))

    def test_quantile(self):
        self.assertEqual(gen_check.quantile([3, 1, 2, 4], 0.5), 2)
        self.assertEqual(gen_check.quantile([3, 1, 2, 4], 0.9), 4)
        self.assertIsNone(gen_check.quantile([], 0.5))


if __name__ == "__main__":
    unittest.main()
