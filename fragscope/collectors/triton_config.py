"""Triton model configuration (``config.pbtxt``, protobuf text format) -> the batching settings.

A small tolerant reader of the text format (fields ``name: value``, messages ``name { ... }`` or
``name: { ... }`` / ``< ... >``, lists ``[a, b]``, repeated fields, ``#`` comments, quoted strings with
escapes), not a full protobuf implementation: Triton's ``model_config.proto`` is not importable without
tritonclient and grpc (~40 MB). Unknown fields are kept and ignored; the file is never validated
against the schema. Limits: no ``Any`` expansion, no extensions ``[ext.name]``; a config of more than
1 MiB is refused (real ones are a few kB; ensembles a few tens of kB).

Defaults follow Triton's model-configuration documentation: no ``dynamic_batching`` block = no dynamic
batching; an empty block = batching with no delay; no ``instance_group`` = one instance per visible GPU
(``count`` defaults to 1 per group, per listed GPU when ``gpus`` is given).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from ..units import MAX_NUMBER_CHARS

MAX_BYTES = 1024 * 1024


class ConfigError(ValueError):
    """A config.pbtxt that cannot be read; the message is one line."""


# Strings as "unrolled loops" ([^"\\]* then (\\. [^"\\]*)*): an alternation repeated per character,
# (?:[^"\\]|\\.)*, keeps backtracking state for every character of a long string.
_TOKEN = re.compile(r"""\s*(?:(\#[^\n]*)|("[^"\\\n]*(?:\\.[^"\\\n]*)*"|'[^'\\\n]*(?:\\.[^'\\\n]*)*')|([{}\[\]<>:,;])|"""
                    r"""([^\s{}\[\]<>:,;"'#]+))""")
# Messages nested deeper than this are refused (real configs nest 3-4 levels: a field of an input of
# the model): the reader recurses once per level (1,100 nested messages reached the interpreter's limit).
MAX_DEPTH = 64


def _tokens(text: str):
    """(token, line number) pairs; linear: the line number is counted on from the last token (counting
    from the start of the text at every token made a 1 MiB config take 52 s)."""
    pos, n = 0, len(text)
    line, counted = 1, 0  # the line number at offset ``counted``
    while pos < n:
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            if text[pos:].strip() == "":
                return
            line += text.count("\n", counted, pos)
            raise ConfigError(f"line {line}: unexpected character {text[pos:pos + 10].strip()[:10]!r}")
        pos = m.end()
        if m.group(1) is not None:
            continue
        tok = m.group(2) or m.group(3) or m.group(4)
        if tok is None:
            continue
        start = m.start(2) if m.group(2) is not None else m.start(3) if m.group(3) is not None else m.start(4)
        line += text.count("\n", counted, start)
        counted = start
        yield tok, line


def _unquote(tok: str) -> str:
    body = tok[1:-1]
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t"}.get(m.group(1), m.group(1)), body)


def _scalar(tok: str, line: int = 0):
    """A value token: a string, a number (checked: finite, at most MAX_NUMBER_CHARS characters, as every
    number fragscope reads from outside), or a bare word (enum names TYPE_FP32, KIND_GPU; true/false)."""
    if tok[:1] in "\"'":
        return _unquote(tok)
    if not re.match(r"[-+.]?\d|[-+]?(?:inf|nan)", tok, re.I):
        return tok
    if len(tok) > MAX_NUMBER_CHARS:
        raise ConfigError(f"line {line}: a number of {len(tok)} characters ({tok[:20]}...) is not a setting")
    try:
        v = int(tok, 0) if re.fullmatch(r"[-+]?(0x[0-9a-fA-F]+|\d+)", tok) else float(tok)
    except ValueError:
        return tok
    if isinstance(v, float) and not math.isfinite(v):
        raise ConfigError(f"line {line}: {tok!r} is not a finite number")
    return v


class _Parser:
    def __init__(self, text: str):
        self.toks = list(_tokens(text))
        self.i = 0

    def peek(self):
        return self.toks[self.i][0] if self.i < len(self.toks) else None

    def line(self) -> int:
        return self.toks[min(self.i, len(self.toks) - 1)][1] if self.toks else 1

    def take(self):
        if self.i >= len(self.toks):
            raise ConfigError(f"line {self.line()}: unexpected end of file")
        t = self.toks[self.i][0]
        self.i += 1
        return t

    def message(self, close: str | None, depth: int = 0) -> dict[str, list]:
        if depth > MAX_DEPTH:
            raise ConfigError(f"line {self.line()}: messages nested more than {MAX_DEPTH} deep (not a model config)")
        out: dict[str, list] = {}
        while True:
            t = self.peek()
            if t is None:
                if close is not None:
                    raise ConfigError(f"line {self.line()}: unexpected end of file (missing {close!r})")
                return out
            if t == close:
                self.take()
                return out
            if t in ",;":
                self.take()
                continue
            name = self.take()
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]*", name):
                raise ConfigError(f"line {self.line()}: expected a field name, got {name!r}")
            if self.peek() == ":":
                self.take()
            out.setdefault(name, []).extend(self.value(depth))

    def value(self, depth: int = 0) -> list:
        t = self.take()
        if t == "{":
            return [self.message("}", depth + 1)]
        if t == "<":
            return [self.message(">", depth + 1)]
        if t == "[":
            vals: list = []
            while True:
                if self.peek() == "]":
                    self.take()
                    return vals
                vals.extend(self.value(depth))
                if self.peek() == ",":
                    self.take()
        if t in "}]>:,;":
            raise ConfigError(f"line {self.line()}: expected a value, got {t!r}")
        return [_scalar(t, self.line())]


def parse_text_format(text: str) -> dict[str, list]:
    """Protobuf text format -> {field: [values]} (messages are nested dicts of the same shape)."""
    if len(text) > MAX_BYTES:
        raise ConfigError(f"config of {len(text)} bytes is larger than {MAX_BYTES} (not a model config?)")
    return _Parser(text).message(None)


def _one(msg: dict, name: str, default=None):
    v = msg.get(name)
    return v[-1] if v else default


@dataclass
class TritonModelConfig:
    name: str = ""
    platform: str = ""  # platform or backend
    max_batch_size: int = 0  # 0: the model does not batch (each request is one execution)
    dynamic_batching: bool = False
    preferred_batch_sizes: list[int] = field(default_factory=list)
    max_queue_delay_us: int = 0
    sequence_batching: bool = False
    instance_count: int | None = None  # total instances; None = Triton's default (one per visible GPU)
    instance_kinds: list[str] = field(default_factory=list)
    decoupled: bool = False

    def to_dict(self) -> dict:
        return dict(self.__dict__)


# "${decoupled_mode}": a template's placeholder (tensorrtllm_backend ships its all_models/ configs this way and fills
# them with tools/fill_template.py); such a file is not a config yet
_PLACEHOLDER = re.compile(r"\$\{[A-Za-z_][A-Za-z0-9_]{0,80}\}")


def unfilled_placeholders(text: str) -> list[str]:
    """The distinct ``${name}`` placeholders in ``text``, in order of first appearance."""
    seen: dict[str, None] = {}
    for m in _PLACEHOLDER.finditer(text[:MAX_BYTES]):
        seen.setdefault(m.group(0), None)
    return list(seen)


def read_config(text: str) -> TritonModelConfig:
    holes = unfilled_placeholders(text)
    if holes:
        shown = ", ".join(holes[:4]) + (f" and {len(holes) - 4} more" if len(holes) > 4 else "")
        raise ConfigError(f"an unfilled template ({len(holes)} placeholder(s): {shown}): fill the template first "
                          "(tensorrtllm_backend: python3 tools/fill_template.py -i config.pbtxt name:value,...)")
    msg = parse_text_format(text)
    if not msg:
        raise ConfigError("empty config (no fields)")
    known = {"name", "platform", "backend", "max_batch_size", "input", "output", "instance_group",
             "dynamic_batching", "sequence_batching", "ensemble_scheduling", "parameters", "model_transaction_policy"}
    if not known & set(msg):
        raise ConfigError(f"no Triton model-config fields (saw {', '.join(sorted(msg)[:5])})")
    cfg = TritonModelConfig(name=str(_one(msg, "name", "")),
                            platform=str(_one(msg, "platform", "") or _one(msg, "backend", "")))
    mbs = _one(msg, "max_batch_size", 0)
    if not isinstance(mbs, int) or mbs < 0:
        raise ConfigError(f"max_batch_size {mbs!r} is not a non-negative integer")
    cfg.max_batch_size = mbs
    db = _one(msg, "dynamic_batching")
    if isinstance(db, dict):
        cfg.dynamic_batching = True
        cfg.preferred_batch_sizes = sorted(int(x) for x in db.get("preferred_batch_size", []) if isinstance(x, int))
        delay = _one(db, "max_queue_delay_microseconds", 0)
        cfg.max_queue_delay_us = int(delay) if isinstance(delay, (int, float)) else 0
    cfg.sequence_batching = isinstance(_one(msg, "sequence_batching"), dict)
    groups = [g for g in msg.get("instance_group", []) if isinstance(g, dict)]
    if groups:
        total = 0
        for g in groups:
            count = _one(g, "count", 1)
            count = int(count) if isinstance(count, int) and count > 0 else 1
            gpus = [x for x in g.get("gpus", []) if isinstance(x, int)]
            total += count * max(1, len(gpus))
            cfg.instance_kinds.append(str(_one(g, "kind", "KIND_AUTO")))
        cfg.instance_count = total
    policy = _one(msg, "model_transaction_policy")
    cfg.decoupled = isinstance(policy, dict) and str(_one(policy, "decoupled", "false")).lower() == "true"
    return cfg
