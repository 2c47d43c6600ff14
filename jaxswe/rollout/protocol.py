"""The SGLang-native `/generate` wire format, shared by `jaxswe serve` and `RolloutClient`.

Field shapes follow SGLang's `GenerateReqInput` and its response `meta_info`, so either side can
talk to a real SGLang server:
- request: `input_ids` ([int] or [[int]]), `sampling_params` (dict, or one dict per prompt;
  `ignore_eos` among them), `return_logprob`, `logprob_start_len` (-1: output log-probs only),
  `rid` (str, or one per prompt: the id `/abort_request` takes);
- response: `{output_ids, meta_info: {id, output_token_logprobs: [[logprob, id, null], ...],
  input_token_logprobs: [[null, id, null], [logprob, id, null], ...] (from `logprob_start_len`,
  its first entry None), finish_reason: {type: "stop", matched: id} | {type: "length", length: n}
  | {type: "abort", message, ...}, prompt_tokens, completion_tokens, cached_tokens,
  weight_version}}`, a list of those for batched input. `output_ids` include a matched stop
  token, as SGLang's do; an aborted request returns the tokens sampled before the abort.
"""

from __future__ import annotations

import dataclasses
import math
import uuid
from dataclasses import dataclass
from typing import Any

from jaxswe.errors import UserError
from jaxswe.rollout.types import MAX_SEED, Generation, SamplingParams


class ProtocolError(UserError):
    """A request or response that does not follow the protocol (HTTP 400 on the server side)."""


# SGLang sampling keys we accept only at their neutral value (anything else changes the distribution).
_NEUTRAL_KEYS: dict[str, Any] = {
    "repetition_penalty": 1.0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "n": 1,
    "min_new_tokens": 0,
    "skip_special_tokens": True,
    "spaces_between_special_tokens": True,
    "no_stop_trim": False,
    "stop": None,
    "logit_bias": None,
    "json_schema": None,
    "regex": None,
    "ebnf": None,
}
_PARAM_FIELDS = {f.name for f in dataclasses.fields(SamplingParams)}


@dataclass(frozen=True)
class GenerateRequest:
    """One prompt of a `/generate` call, validated."""

    input_ids: list[int]
    params: SamplingParams
    return_logprob: bool = False
    logprob_start_len: int = -1
    ignore_eos: bool = False  # True: the model's EOS ids do not end the request
    rid: str | None = None


# Sent on every request at their neutral values, so a server's preferred sampling params
# (SGLang fills what a request leaves out from the model's generation_config) cannot apply.
NEUTRAL_SENT: dict[str, Any] = {
    "repetition_penalty": 1.0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "min_new_tokens": 0,
    "n": 1,
    "ignore_eos": False,
}


def sampling_params_to_json(params: SamplingParams) -> dict[str, Any]:
    """Every sampling parameter, explicitly (the server must not fill in defaults): ours, and the
    penalties and the rest of `NEUTRAL_SENT` at their neutral values. `sampling_seed` only when
    set (a server without one uses its own RNG; SGLang honours it with
    --enable-deterministic-inference)."""
    out = dataclasses.asdict(params)
    out["stop_token_ids"] = list(params.stop_token_ids)
    if params.sampling_seed is None:
        del out["sampling_seed"]
    return {**out, **NEUTRAL_SENT}


def sampling_params_from_json(obj: Any) -> SamplingParams:
    """Validate a `sampling_params` dict; unknown or non-neutral extra keys are errors."""
    if obj is None:
        obj = {}
    if not isinstance(obj, dict):
        raise ProtocolError("sampling_params must be an object")
    kwargs: dict[str, Any] = {}
    for key, value in obj.items():
        if key in _PARAM_FIELDS:
            kwargs[key] = value
        elif key in _NEUTRAL_KEYS:
            if value not in (_NEUTRAL_KEYS[key], [], {}) and value is not None:
                raise ProtocolError(f"sampling_params.{key}={value!r} is not supported (only neutral values)")
        else:
            raise ProtocolError(f"sampling_params.{key}: unknown key")
    try:
        params = SamplingParams(
            temperature=float(kwargs.get("temperature", 1.0)),
            top_p=float(kwargs.get("top_p", 1.0)),
            top_k=int(kwargs.get("top_k", -1)),
            min_p=float(kwargs.get("min_p", 0.0)),
            max_new_tokens=int(kwargs.get("max_new_tokens", 128)),
            stop_token_ids=tuple(int(t) for t in (kwargs.get("stop_token_ids") or ())),
            sampling_seed=_seed(kwargs.get("sampling_seed")),
        )
    except (TypeError, ValueError) as err:
        raise ProtocolError(f"sampling_params: {err}") from None
    check_sampling_params(params)
    return params


def _seed(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"sampling_seed must be an integer or null, got {value!r}")
    return value


def check_sampling_params(params: SamplingParams) -> None:
    """Raise ProtocolError naming the first out-of-range field."""
    if not (params.temperature >= 0 and math.isfinite(params.temperature)):
        raise ProtocolError(f"sampling_params.temperature must be >= 0, got {params.temperature}")
    if not 0 < params.top_p <= 1:
        raise ProtocolError(f"sampling_params.top_p must be in (0, 1], got {params.top_p}")
    if params.top_k == 0 or params.top_k < -1:
        raise ProtocolError(f"sampling_params.top_k must be -1 (off) or >= 1, got {params.top_k}")
    if not 0 <= params.min_p <= 1:
        raise ProtocolError(f"sampling_params.min_p must be in [0, 1], got {params.min_p}")
    if params.max_new_tokens < 0:
        raise ProtocolError(f"sampling_params.max_new_tokens must be >= 0, got {params.max_new_tokens}")
    if params.sampling_seed is not None and not 0 <= params.sampling_seed < MAX_SEED:
        raise ProtocolError(
            f"sampling_params.sampling_seed must be in [0, 2**63), got {params.sampling_seed}"
        )


def _per_prompt(value: Any, n: int, name: str) -> list[Any]:
    if isinstance(value, list):
        if len(value) != n:
            raise ProtocolError(f"{name}: {len(value)} values for {n} prompts")
        return value
    return [value] * n


def _is_token_list(x: Any) -> bool:
    return isinstance(x, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in x)


def _request_ids(rid: Any, n: int, batched: bool) -> list[str | None]:
    if rid is None:
        return [None] * n
    rids = rid if batched else [rid]
    if not isinstance(rids, list) or len(rids) != n or not all(isinstance(r, str) and r for r in rids):
        raise ProtocolError("rid must be a non-empty string (a list of them, one per prompt, for a batch)")
    if len(set(rids)) != n:
        raise ProtocolError("rid: duplicate request ids in one batch")
    return rids


def parse_generate_body(body: Any, *, vocab_size: int | None = None) -> tuple[list[GenerateRequest], bool]:
    """Validate a `/generate` body; returns (requests, batched)."""
    if not isinstance(body, dict):
        raise ProtocolError("body must be a JSON object")
    if "text" in body and body["text"] is not None:
        raise ProtocolError("text input is not supported: send input_ids")
    ids = body.get("input_ids")
    if _is_token_list(ids) and ids:
        prompts, batched = [ids], False
    elif isinstance(ids, list) and ids and all(_is_token_list(p) and p for p in ids):
        prompts, batched = ids, True
    else:
        raise ProtocolError("input_ids must be a non-empty list of ints or a list of such lists")
    n = len(prompts)
    sps = body.get("sampling_params")
    sps = sps if isinstance(sps, list) else [sps] * n
    if len(sps) != n:
        raise ProtocolError(f"sampling_params: {len(sps)} values for {n} prompts")
    ret = _per_prompt(body.get("return_logprob", False), n, "return_logprob")
    starts = _per_prompt(body.get("logprob_start_len", -1), n, "logprob_start_len")
    rids = _request_ids(body.get("rid"), n, batched)
    requests = []
    for prompt, sp, r, s, rid in zip(prompts, sps, ret, starts, rids, strict=True):
        if vocab_size is not None and any(not 0 <= t < vocab_size for t in prompt):
            raise ProtocolError(f"input_ids: token id out of range [0, {vocab_size})")
        if not isinstance(s, int) or s < -1:
            raise ProtocolError(f"logprob_start_len must be an int >= -1, got {s!r}")
        sp = dict(sp) if isinstance(sp, dict) else sp
        ignore_eos = sp.pop("ignore_eos", False) if isinstance(sp, dict) else False
        if not isinstance(ignore_eos, bool):
            raise ProtocolError(f"sampling_params.ignore_eos must be a bool, got {ignore_eos!r}")
        params = sampling_params_from_json(sp)
        requests.append(GenerateRequest(list(prompt), params, bool(r), s, ignore_eos, rid))
    return requests, batched


def finish_reason_json(gen: Generation) -> dict[str, Any]:
    if gen.finish_reason == "stop":
        return {"type": "stop", "matched": gen.output_ids[-1]}
    if gen.finish_reason == "abort":
        return {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}
    return {"type": "length", "length": len(gen.output_ids)}


def generation_to_json(req: GenerateRequest, gen: Generation, weight_version: str) -> dict[str, Any]:
    """One response object in SGLang's shape (`weight_version`: the weights that sampled it)."""
    meta: dict[str, Any] = {
        "id": req.rid or uuid.uuid4().hex,
        "finish_reason": finish_reason_json(gen),
        "prompt_tokens": len(req.input_ids),
        "completion_tokens": len(gen.output_ids),
        "cached_tokens": 0,
        "weight_version": weight_version,
    }
    if req.return_logprob:
        meta["output_token_logprobs"] = [
            [lp, t, None] for lp, t in zip(gen.logprobs, gen.output_ids, strict=True)
        ]
        start = max(req.logprob_start_len, 0) if req.logprob_start_len >= 0 else len(req.input_ids)
        prompt_lps = gen.prompt_logprobs or []
        meta["input_token_logprobs"] = [
            [None if pos == start else lp, req.input_ids[pos], None]
            for pos, lp in zip(range(start, len(req.input_ids)), prompt_lps, strict=False)
        ]
    return {"output_ids": list(gen.output_ids), "meta_info": meta}


def generation_from_json(obj: Any, *, want_prompt_logprobs: bool = False) -> Generation:
    """Parse one SGLang response object; log-probs must be present and match `output_ids`."""
    try:
        output_ids = [int(t) for t in obj["output_ids"]]
        meta = obj["meta_info"]
        entries = meta["output_token_logprobs"]
        finish = meta["finish_reason"]
        finish_type = finish["type"] if isinstance(finish, dict) else finish
    except (KeyError, TypeError, ValueError) as err:
        raise ProtocolError(f"malformed /generate response: missing or bad {err}") from None
    if finish_type not in ("stop", "length", "abort"):
        raise ProtocolError(f"/generate finished with {finish!r} (expected stop, length or abort)")
    if len(entries) != len(output_ids) or any(
        int(e[1]) != t for e, t in zip(entries, output_ids, strict=True)
    ):
        raise ProtocolError("output_token_logprobs do not match output_ids")
    version = meta.get("weight_version")
    prompt_logprobs = None
    if want_prompt_logprobs:
        prompt_logprobs = [
            0.0 if e[0] is None else float(e[0]) for e in meta.get("input_token_logprobs") or []
        ]
    return Generation(
        output_ids=output_ids,
        logprobs=[float(e[0]) for e in entries],
        finish_reason=finish_type,
        prompt_logprobs=prompt_logprobs,
        weight_versions=None if version is None else [str(version)] * len(output_ids),
    )
