"""Regenerate the fixed corpus and the tiny tokenizers under tests/fixtures/data/ (run by hand).

    .venv/bin/python -m tests.data.make_fixtures

The outputs are committed, so the golden .bin/.idx files do not depend on trainer versions; after
running this, regenerate the goldens: LINGJUN_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/data
"""

from __future__ import annotations

import json
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "data"

# Edge cases for byte-exactness: contractions (also upper case), runs of spaces/tabs/newlines,
# \r\n inside text, NBSP, U+2028, U+0085, U+001F (str.isspace() but not regex \s), zero-width space,
# combining marks, CJK, Arabic, Devanagari, emoji (4-byte UTF-8), digits of other scripts.
TEXTS = [
    "Hello world! It's a test, isn't it? We'll see; they've DON'T I'd you're.",
    "  Leading spaces,\ttabs\t\tand trailing spaces   ",
    "Line one\nLine two\n\n\nLine five\r\nwindows line\rcarriage",
    "Caf\u00e9 na\u00efve r\u00e9sum\u00e9 e\u0301 \u00a0nbsp\u2028sep\x85nel\x1funit\u200bzw",
    "\u4e2d\u6587\u5b57\u7b26 \u65e5\u672c\u8a9e\u306e\u6587 \ud55c\uad6d\uc5b4",
    "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645 \u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e",
    "Emoji \U0001F642\U0001F680 and digits 0123456789 \u0661\u0662\u0663 \u2167 \u00bd 3.14159 1,000,000",
    "Code: def f(x):\n    return x ** 2  # comment\n\t}]){[(",
    "",
    "   ",
    "'s 't 're 've 'm 'll 'd ''quoted'' 'S",
    "Numbers123mixed with456letters and a_b-c.d/e\\f",
]
TITLES = ["First", "", "Third title", "Quatri\u00e8me", "\u4e94", "Six", "Seven 7", "Eight", "Nine", "", "Eleven", "Twelve"]


def corpus_lines() -> list[dict]:
    rows = []
    for i, (text, title) in enumerate(zip(TEXTS, TITLES)):
        ids = " ".join(str((i * 37 + j * 11) % 512) for j in range(1 + i % 5))
        rows.append({"text": text, "title": title, "ids": ids})
    rows.append({"text": ["First sentence.", "", "Second one here.", "   "], "title": "list", "ids": "511 0 1"})
    rows.append({"text": ["", ""], "title": "empty list", "ids": "7"})
    return rows


def write_corpus() -> None:
    out = FIXTURES / "corpus"
    out.mkdir(parents=True, exist_ok=True)
    rows = corpus_lines()
    half = len(rows) // 2
    with open(out / "part-a.jsonl", "w", encoding="utf-8", newline="") as fh:
        for row in rows[:half]:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
        fh.write("\n")  # a blank line (skipped)
    with open(out / "part-b.jsonl", "w", encoding="utf-8", newline="") as fh:
        for i, row in enumerate(rows[half:]):
            fh.write(json.dumps(row) + ("\r\n" if i == 0 else "\n"))  # \u escapes; one CRLF line end


def training_text() -> list[str]:
    extra = ["The quick brown fox jumps over the lazy dog. " * 3, "It's what we'll do, isn't it?",
             "Numbers 12345 and 67890 appear here.", "Un caf\u00e9 tr\u00e8s na\u00eff."]
    return [t for t in TEXTS if t.strip()] + TITLES + extra


def write_tokenizers() -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from tokenizers.implementations import ByteLevelBPETokenizer
    import sentencepiece

    base = FIXTURES / "tokenizers"
    # huggingface: byte-level BPE, <s> added by the post-processor, eos </s> in tokenizer_config.json
    hf_dir = base / "hf"
    hf_dir.mkdir(parents=True, exist_ok=True)
    hf = Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, min_frequency=1, special_tokens=["<s>", "</s>", "<pad>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    hf.train_from_iterator(training_text(), trainer)
    hf.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                      special_tokens=[("<s>", hf.token_to_id("<s>"))])
    hf.save(str(hf_dir / "tokenizer.json"))
    (hf_dir / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
         "pad_token": "<pad>", "model_max_length": 1000000}, indent=1) + "\n")
    # gpt2-bpe: vocab.json + merges.txt from a byte-level BPE with <|endoftext|>
    gpt_dir = base / "gpt2"
    gpt_dir.mkdir(parents=True, exist_ok=True)
    gpt = ByteLevelBPETokenizer()
    gpt.train_from_iterator(training_text(), vocab_size=400, min_frequency=1, special_tokens=["<|endoftext|>"])
    gpt.save_model(str(gpt_dir))
    # sentencepiece: small BPE model, identity normalization (keeps the file small)
    sp_dir = base / "sp"
    sp_dir.mkdir(parents=True, exist_ok=True)
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(training_text() * 4), model_prefix=str(sp_dir / "tok"), vocab_size=480,
        model_type="bpe", normalization_rule_name="identity", character_coverage=1.0, byte_fallback=True,
        hard_vocab_limit=False, minloglevel=2)
    (sp_dir / "tok.vocab").unlink()


if __name__ == "__main__":
    write_corpus()
    write_tokenizers()
    print(f"wrote {FIXTURES}")
