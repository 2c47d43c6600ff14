"""A task's environment: its Docker images and venvs, Docker engines, and the sandbox it opens in."""
