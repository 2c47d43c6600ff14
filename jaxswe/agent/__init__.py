"""The agent scaffold and loop.

commands (reply -> one command), scaffold (commands over a sandbox), prompts (YAML texts),
swe_env (SWEEnv: a SWE task as an Environment), trajectory (token-exact Trajectory, ChatFormat,
JSONL), loop (run_episode / run_episodes), episodes (collect_episodes: many at once, over
processes), demos (gold patch -> scaffold commands).
"""
