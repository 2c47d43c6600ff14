"""A scripted model for agent-loop tests: each episode replays its own replies."""

from jaxswe.rollout.types import Generation


class ScriptRouter:
    """Test double for the model: each episode (found by its problem statement) replays its own script."""

    def __init__(self, tok, scripts, version=None):
        self.tok, self.scripts = tok, scripts  # {problem_statement: [reply, ...]}
        self.version = version  # the weight version stamped on every sampled token (None: none)
        self.turn = dict.fromkeys(scripts, 0)
        self.eot = tok.convert_tokens_to_ids("<|im_end|>")
        self.outputs = []  # (the ids it saw, the ids it generated) per call

    async def generate(self, input_ids, params):
        text = self.tok.decode(input_ids)
        key = next(k for k in self.scripts if k in text)
        reply = self.scripts[key][self.turn[key]]
        self.turn[key] += 1
        ids = self.tok.encode(reply, add_special_tokens=False) + [self.eot]
        self.outputs.append((list(input_ids), ids))
        versions = None if self.version is None else [self.version] * len(ids)
        return Generation(ids, [-0.5] * len(ids), "stop", weight_versions=versions)
