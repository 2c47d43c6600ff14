"""DAPO RL, the paper's stage 2: one loop (`loop.train_rl`, one iteration in `loop.rl_iteration`)
over one `inputs.RLRun`, which the RL stage (jaxswe.stages.rl) builds; rl never imports stages.

pump: episodes drawn, sampled, graded and judged into groups (k = rl.max_staleness versions may
be in flight; k = 0 is the paper's synchronous loop). rewards: outcome + turn penalty, group
advantages. train: pack -> recompute -> check sampling -> update. problems: the data order and
stage 2's task filter.
"""
