"""Conversations in: ShareGPT and OpenAI chat records from JSON or JSONL,
validated, as lists of {"role", "content"} messages.

ShareGPT: {"conversations": [{"from": "human"|"gpt"|"system", "value": ...}]}
OpenAI:   {"messages": [{"role": "user"|"assistant"|"system", "content": ...}]}

A record that cannot be trained on raises BadRecord naming FILE:LINE (JSONL)
or FILE: record N (a JSON array), and the field.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "system": "system"}
OPENAI_ROLES = {"user", "assistant", "system"}


class BadRecord(ValueError):
    """A record that cannot be trained on; the message names where and why."""


@dataclass
class Conversation:
    where: str  # FILE:LINE or FILE: record N
    messages: list[dict[str, str]]


def read_conversations(path: Path) -> Iterator[Conversation | BadRecord]:
    """Every record of a .json (an array, or one record) or .jsonl file, in
    order: a Conversation, or the BadRecord saying why it is refused."""
    return records_of(path.read_bytes(), str(path), whole_json=path.suffix == ".json")


def records_of(raw: bytes, name: str, whole_json: bool) -> Iterator[Conversation | BadRecord]:
    """The records of a file's bytes (`name` in messages): one JSON document
    (`whole_json`) or JSON lines. Anything else than a Conversation or a
    BadRecord escaping from here is a bug (fuzz/chat_records_fuzz.py)."""
    if whole_json:
        doc = parsed(raw, name)
        if isinstance(doc, BadRecord):
            yield doc
            return
        for n, rec in enumerate(doc if isinstance(doc, list) else [doc], 1):
            yield checked(rec, f"{name}: record {n}")
        return
    for n, line in enumerate(raw.split(b"\n"), 1):
        if line.strip():
            rec = parsed(line, f"{name}:{n}")
            yield rec if isinstance(rec, BadRecord) else checked(rec, f"{name}:{n}")


def parsed(raw: bytes, where: str) -> object:
    """The JSON value of `raw`, or the BadRecord naming `where`."""
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        return BadRecord(f"{where}: invalid UTF-8 at byte {e.start}")
    except json.JSONDecodeError as e:
        return BadRecord(f"{where}: not valid JSON: {e.msg} (line {e.lineno} column {e.colno})")
    except RecursionError:
        return BadRecord(f"{where}: JSON nested too deeply to be a chat record")


def checked(rec: object, where: str) -> Conversation | BadRecord:
    try:
        return Conversation(where, messages_of(rec, where))
    except BadRecord as e:
        return e


def messages_of(rec: object, where: str) -> list[dict[str, str]]:
    if not isinstance(rec, dict):
        raise BadRecord(f"{where}: expected a JSON object, found {type(rec).__name__}")
    if "conversations" in rec:
        turns, role_key, text_key, roles = rec["conversations"], "from", "value", SHAREGPT_ROLES
        field = "conversations"
    elif "messages" in rec:
        turns, role_key, text_key = rec["messages"], "role", "content"
        roles, field = {r: r for r in OPENAI_ROLES}, "messages"
    else:
        raise BadRecord(f"{where}: expected \"conversations\" (ShareGPT) or \"messages\" "
                        f"(OpenAI), found keys {sorted(rec)}")
    if not isinstance(turns, list) or not turns:
        raise BadRecord(f"{where}: {field}: expected a non-empty list of turns")
    out = []
    for k, turn in enumerate(turns):
        at = f"{where}: {field}[{k}]"
        if not isinstance(turn, dict):
            raise BadRecord(f"{at}: expected an object, found {type(turn).__name__}")
        if role_key not in turn:
            raise BadRecord(f"{at}.{role_key}: missing")
        if not isinstance(turn[role_key], str) or turn[role_key] not in roles:
            raise BadRecord(f"{at}.{role_key}: unknown role {turn[role_key]!r} (expected one of "
                            f"{', '.join(sorted(roles))})")
        text = turn.get(text_key)
        if not isinstance(text, str) or not text.strip():
            raise BadRecord(f"{at}.{text_key}: empty or not a string")
        out.append({"role": roles[turn[role_key]], "content": text})
    if out[-1]["role"] != "assistant":
        raise BadRecord(f"{where}: {field}: ends on a {out[-1]['role']} turn (nothing to learn "
                        "after it: the last turn must be the assistant's)")
    if not any(m["role"] == "assistant" for m in out):
        raise BadRecord(f"{where}: {field}: no assistant turn")
    return out
