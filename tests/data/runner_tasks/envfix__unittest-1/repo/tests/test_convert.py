import unittest

from units import to_seconds


class ToSecondsTests(unittest.TestCase):
    def test_hours_and_minutes(self):
        self.assertEqual(to_seconds("1h30m"), 5400)

    def test_seconds_only(self):
        self.assertEqual(to_seconds("45s"), 45)

    def test_empty_is_refused(self):
        with self.assertRaises(ValueError):
            to_seconds("")


class SumTests(unittest.TestCase):
    def test_parts_add_up(self):
        self.assertEqual(to_seconds("1h1m1s"), 3661)
