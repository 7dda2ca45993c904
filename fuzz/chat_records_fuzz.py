#!/usr/bin/env python3
"""Fuzz target of the chat-record parser (python/dflash/chat_records.py,
`dflash prepare`'s reader of ShareGPT / OpenAI JSON and JSONL): any bytes,
read as a .jsonl and as a .json file, give Conversations and BadRecords
only, never another exception. A BadRecord names the file (and line or
record); a Conversation holds non-empty string turns of user / assistant /
system, ending on the assistant's.

usage:
  chat_records_fuzz.py CORPUS...            replay every file once (the quick
                                            test fuzz.chat_records_corpus)
  chat_records_fuzz.py --fuzz [libFuzzer options] CORPUS...
                                            fuzz with atheris (ci/fuzz.sh)
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))
FUZZ = len(sys.argv) > 1 and sys.argv[1] == "--fuzz"
if FUZZ:
    import atheris  # installed by ci/bootstrap.sh; only ci/fuzz.sh needs it

    with atheris.instrument_imports():  # coverage feedback from the parser
        from dflash.chat_records import BadRecord, Conversation, records_of
else:
    from dflash.chat_records import BadRecord, Conversation, records_of

ROLES = {"user", "assistant", "system"}


def check_one(data: bytes) -> None:
    for name, whole in (("in.jsonl", False), ("in.json", True)):
        for item in records_of(data, name, whole):
            if isinstance(item, BadRecord):
                assert str(item).startswith(name), (name, str(item))
                continue
            assert isinstance(item, Conversation), type(item)
            assert item.where.startswith(name), item.where
            assert item.messages and item.messages[-1]["role"] == "assistant", item.messages
            for m in item.messages:
                assert m["role"] in ROLES and isinstance(m["content"], str), m
                assert m["content"].strip(), m


def replay(paths: list[str]) -> int:
    files = [f for p in paths for f in (sorted(Path(p).iterdir()) if Path(p).is_dir() else [Path(p)])
             if f.is_file()]
    for f in files:
        try:
            check_one(f.read_bytes())
        except Exception:
            print(f"chat_records_fuzz: {f} fails:", file=sys.stderr)
            raise
    print(f"chat_records_fuzz: {len(files)} inputs replayed, nothing found")
    return 0 if files else 1


def main() -> int:
    if FUZZ:
        atheris.Setup([sys.argv[0], *sys.argv[2:]], check_one)
        atheris.Fuzz()
        return 0
    return replay(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
