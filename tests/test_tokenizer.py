"""Tests of luminal.tokenizer against transformers' tokenizer read from the same GGUF file.

These use the real SmolLM2-135M-Instruct GGUF (see tests/test_gguf.py: downloaded once into the
cache, offline afterwards; never skipped).  transformers is run offline.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from luminal import hub
from luminal.gguf import GGUFFile
from luminal.tokenizer import StreamDecoder, Tokenizer, bytes_to_unicode

with warnings.catch_warnings():  # the marker may not be registered in the project's config
    warnings.simplefilter("ignore", pytest.PytestUnknownMarkWarning)
    pytestmark = pytest.mark.model

CHAT = [{"role": "user", "content": "Explain how photosynthesis works."}]
CHAT_PROMPT = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nExplain how photosynthesis works.<|im_end|>\n<|im_start|>assistant\n"
)

PROMPTS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "Explain how photosynthesis works.",
    "Café déjà vu, naïve façade, Ångström, Straße, ĳ",
    "日本語のテキストと中文文本和한국어",
    "Emoji: 😀🤖🚀 👍🏽 👨‍👩‍👧‍👦 🇫🇷",
    "Digits: 1234567890 3.14159 1,000,000 2024-11-22 v0.1.2 x86_64 (½)²=٣?",
    "Whitespace:  two   three    four\ttab\t\ttabs\nnewline\n\nblank\r\n crlf   ",
    "   leading and trailing   ",
    "I'm sure they'll say it's fine, don't you think? We've seen it.",
    "def f(x):\n    return x ** 2  # square\n",
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>",
    "",
    " ",
    "\u00a0non-breaking\u3000ideographic space",
    "Привет, мир! Ελληνικά. العربية. עברית. हिन्दी",
    CHAT_PROMPT,
]


@pytest.fixture(scope="module")
def model_path() -> Path:
    return hub.bundled_model_path()  # fails (no skip) if the model can't be had


@pytest.fixture(scope="module")
def tok(model_path) -> Tokenizer:
    return Tokenizer.from_gguf(GGUFFile(model_path))


@pytest.fixture(scope="module")
def hf(model_path):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    transformers = pytest.importorskip("transformers")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return transformers.AutoTokenizer.from_pretrained(str(model_path.parent), gguf_file=model_path.name)


@pytest.fixture(scope="module")
def smollm2_reference(hf):
    """transformers' vocabulary and merges with the pre-tokenizer of SmolLM2's own tokenizer.json:
    Sequence[Digits(individual_digits=True), ByteLevel(add_prefix_space=False, use_regex=True)]."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import pre_tokenizers

    ref = HFTokenizer.from_str(hf.backend_tokenizer.to_str())
    ref.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    return ref


def _random_texts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    chars = list(" \n\t\r\u00a0\u3000½²٣0123456789abcXYZéüß日本😀🤖,.!?'\"<|>_-")
    out = [''.join(rng.choice(chars) for _ in range(rng.randint(0, 16))) for _ in range(n)]
    out += ["<|im_start|>" + t + "<|im_end|>" for t in out[:50]]
    return out


def test_metadata(tok):
    assert tok.pre_tokenizer_name == "smollm"
    assert tok.vocab_size == 49152
    assert tok.bos_token_id == 1 and tok.bos_token == "<|im_start|>"
    assert tok.eos_token_id == 2 and tok.eos_token == "<|im_end|>"
    assert tok.add_bos_token is False
    assert len(tok.special_token_ids) == 17
    assert tok.encode("<|im_start|><|im_end|><|endoftext|>") == [1, 2, 0]


def test_ids_identical_to_transformers(tok, hf):
    for text in PROMPTS:
        ours = tok.encode(text)
        assert ours == hf.encode(text, add_special_tokens=False), text
        assert tok.encode(text, add_special_tokens=True) == hf.encode(text, add_special_tokens=True), text
        assert tok.decode(ours) == hf.decode(ours) == text, text
        assert tok.decode(ours, skip_special_tokens=True) == hf.decode(ours, skip_special_tokens=True)


def test_chat_prompt(tok, hf):
    prompt = tok.apply_chat_template(CHAT, add_generation_prompt=True)
    assert prompt == CHAT_PROMPT  # the template adds SmolLM's default system prompt
    assert prompt == hf.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    ids = tok.encode(prompt)
    assert len(ids) == 35
    assert ids == hf.encode(prompt, add_special_tokens=False)
    assert ids[0] == ids[-4] == tok.bos_token_id and tok.decode(ids[-3:]) == "assistant\n"
    assert tok.decode(ids) == prompt
    # no generation prompt; an explicit system message replaces the default one
    msgs = [{"role": "system", "content": "Be brief."}] + CHAT + [{"role": "assistant", "content": "Sure."}]
    for gen in (False, True):
        assert tok.apply_chat_template(msgs, add_generation_prompt=gen) == hf.apply_chat_template(
            msgs, tokenize=False, add_generation_prompt=gen)
    assert "helpful AI assistant" not in tok.apply_chat_template(msgs)


def test_chat_template_is_sandboxed(tok):
    from jinja2.exceptions import SecurityError

    with pytest.raises(SecurityError):
        tok.apply_chat_template(CHAT, chat_template="{{ messages.__class__.__mro__ }}")


def test_random_text_matches_reference_pre_tokenization(tok, hf, smollm2_reference, model_path):
    texts = _random_texts(1500, seed=3)
    # The default follows SmolLM2's tokenizer.json (and llama.cpp's "smollm"): digits split alone.
    for t in texts:
        assert tok.encode(t) == smollm2_reference.encode(t, add_special_tokens=False).ids, repr(t)
    # transformers' GGUF loader does not know "smollm" and uses GPT-2's splitting; asking for that
    # gives transformers' ids exactly.
    gpt2 = Tokenizer.from_gguf(GGUFFile(model_path), pre_tokenizer="gpt2")
    for t in texts:
        assert gpt2.encode(t) == hf.encode(t, add_special_tokens=False), repr(t)
        assert tok.decode(tok.encode(t)) == t


def test_where_smollm_and_gpt2_splitting_differ(tok, hf):
    # Two whitespace characters before a digit: SmolLM2 keeps the run whole ("ĠĠ", "1"), GPT-2's
    # regex leaves the last space to go with the digit ("Ġ", "Ġ", "1").
    v = tok.token_to_id
    assert tok.encode("x  1") == [v("x"), v("ĠĠ"), v("1")]
    assert hf.encode("x  1", add_special_tokens=False) == [v("x"), v("Ġ"), v("Ġ"), v("1")]
    assert tok.encode("x 1") == hf.encode("x 1", add_special_tokens=False) == [v("x"), v("Ġ"), v("1")]
    assert tok.encode("2024") == [v(c) for c in "2024"]
    # Also a space before a non-ASCII numeric character, which SmolLM2 splits off as a digit.
    assert tok.encode(" ²") == [v("Ġ"), v("Â²")]
    assert hf.encode(" ²", add_special_tokens=False) == [v("ĠÂ"), v("²")]


def test_stream_decoder(tok):
    for text in PROMPTS + ["a😀b", "🇫🇷🇫🇷", "日本", "é" * 7]:
        ids = tok.encode(text)
        sd = tok.stream_decoder()
        pieces = [sd.push(i) for i in ids]
        pieces.append(sd.flush())
        assert "".join(pieces) == tok.decode(ids) == text
        assert all("\ufffd" not in p for p in pieces)
    # an emoji spread over several byte tokens appears only when complete
    ids = tok.encode("😀")
    assert len(ids) > 1
    sd = StreamDecoder(tok)
    assert [sd.push(i) for i in ids] == [""] * (len(ids) - 1) + ["😀"]
    # an unfinished character is given (as U+FFFD) only by flush
    sd = tok.stream_decoder()
    assert sd.push(ids[0]) == "" and sd.flush() == "\ufffd"
    # skipping special tokens
    sd = tok.stream_decoder(skip_special_tokens=True)
    assert sd.extend(tok.encode("<|im_start|>hi<|im_end|>")) + sd.flush() == "hi"


def test_bytes_to_unicode():
    m = bytes_to_unicode()
    assert len(m) == 256 and len(set(m.values())) == 256
    assert m[ord("A")] == "A" and m[ord(" ")] == "Ġ" and m[ord("\n")] == "Ċ"


def test_imports_stay_light():
    code = (
        "import importlib.util, sys\n"
        f"base = {str(Path(__file__).resolve().parents[1] / 'python' / 'luminal')!r}\n"
        "for name in ('gguf', 'tokenizer', 'hub'):\n"
        "    spec = importlib.util.spec_from_file_location('lm_' + name, base + '/' + name + '.py')\n"
        "    mod = sys.modules[spec.name] = importlib.util.module_from_spec(spec)\n"
        "    spec.loader.exec_module(mod)\n"
        "heavy = [m for m in ('tokenizers', 'jinja2', 'tqdm', 'transformers', 'torch', 'gguf')\n"
        "         if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
