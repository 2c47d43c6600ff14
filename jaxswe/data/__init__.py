"""Turning trajectories into fixed-shape token batches for the trainer."""
