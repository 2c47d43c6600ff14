"""Grading a patch, validating tasks, measuring their strength and mining new ones."""
