"""The tokenizer stored in a GGUF file's metadata, run by Hugging Face ``tokenizers``.

Supports GPT-2 style byte-level BPE vocabularies (``tokenizer.ggml.model == "gpt2"``), which is
what SmolLM2 (and Llama 3, Qwen 2, ...) use::

    tok = Tokenizer.from_gguf(GGUFFile(path))
    ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": "Hi"}]))
    tok.decode(ids)

The pre-tokenizer (how text is split into words before BPE) is chosen from
``tokenizer.ggml.pre``.  For ``"smollm"`` it is the one of SmolLM2's own ``tokenizer.json`` and
of llama.cpp: every digit split off on its own, then GPT-2's byte-level regex.  (transformers'
GGUF loader does not know ``"smollm"`` and falls back to plain GPT-2 splitting; the two only
disagree on a run of two or more whitespace characters directly before a digit, e.g.
``"  1"``.  Pass ``pre_tokenizer="gpt2"`` to get transformers' behaviour.)
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from functools import lru_cache

__all__ = ["Tokenizer", "TokenizerError", "StreamDecoder", "bytes_to_unicode"]


class TokenizerError(ValueError):
    """A tokenizer.json or tokenizer_config.json is not a valid tokenizer (GGUF tokenizers raise GGUFError)."""

# GGUF token types (llama.cpp's llama_token_type)
TOKEN_NORMAL = 1
TOKEN_UNKNOWN = 2
TOKEN_CONTROL = 3
TOKEN_USER_DEFINED = 4
TOKEN_UNUSED = 5
TOKEN_BYTE = 6

# Split patterns for pre-tokenizer names (tokenizer.ggml.pre) that need more than GPT-2's regex.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_SPLIT_PRE = {
    "llama3": _LLAMA3_SPLIT, "llama-v3": _LLAMA3_SPLIT, "llama-bpe": _LLAMA3_SPLIT,
    "smaug-bpe": _LLAMA3_SPLIT, "dbrx": _LLAMA3_SPLIT, "falcon3": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT, "deepseek-r1-qwen": _QWEN2_SPLIT,
}
# Pre-tokenizers that split every digit off on its own before GPT-2's regex (llama.cpp's
# "\p{N}" + gpt2 regex group).
_DIGITS_PRE = {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"}
_GPT2_PRE = {"gpt2", "default", "mpt", "olmo", "jais", "gpt-2"}


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from each byte to a printable character.

    Printable Latin-1 bytes stand for themselves; the other 68 bytes (controls, space, ...) are
    mapped in order to the code points 256, 257, ...
    """
    keep = set(range(ord("!"), ord("~") + 1)) | set(range(ord("\xa1"), ord("\xac") + 1)) \
        | set(range(ord("\xae"), ord("\xff") + 1))
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


def _meta_str(v) -> str | None:
    if v is None:
        return None
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


class Tokenizer:
    """A GGUF file's tokenizer. Build with :meth:`from_gguf`."""

    def __init__(self, backend, *, bos_token_id=None, eos_token_id=None, unk_token_id=None,
                 pad_token_id=None, add_bos_token=False, add_eos_token=False, chat_template=None,
                 pre_tokenizer_name=None, special_token_ids=()):
        self.backend = backend  # a tokenizers.Tokenizer
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        self.unk_token_id = unk_token_id
        self.pad_token_id = pad_token_id
        self.add_bos_token = bool(add_bos_token)
        self.add_eos_token = bool(add_eos_token)
        self.chat_template = chat_template
        self.pre_tokenizer_name = pre_tokenizer_name
        self.special_token_ids = frozenset(special_token_ids)

    # ---------------------------------------------------------------------------- building
    @classmethod
    def from_file(cls, path) -> "Tokenizer":
        """From a Hugging Face tokenizer.json (special tokens and chat template from a tokenizer_config.json
        beside it, if there is one). A file that is not a valid tokenizer raises a TokenizerError naming it."""
        import os

        from tokenizers import Tokenizer as HFTokenizer

        from .loaders import ConfigError, read_json

        path = os.fspath(path)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{path}: no such tokenizer file")
        try:
            backend = HFTokenizer.from_file(path)
        except Exception as e:  # noqa: BLE001 - `tokenizers` raises plain Exceptions
            raise TokenizerError(f"{path}: not a valid tokenizer.json ({str(e)[:300]})") from None
        cfg_path = os.path.join(os.path.dirname(path), "tokenizer_config.json")
        try:
            cfg = read_json(cfg_path) if os.path.exists(cfg_path) else {}
        except ConfigError as e:
            raise TokenizerError(str(e)) from None

        def tid(key):
            tok = cfg.get(key)
            tok = tok.get("content") if isinstance(tok, dict) else tok
            return backend.token_to_id(tok) if isinstance(tok, str) and tok else None

        return cls(backend, bos_token_id=tid("bos_token"), eos_token_id=tid("eos_token"),
                   unk_token_id=tid("unk_token"), pad_token_id=tid("pad_token"),
                   chat_template=cfg.get("chat_template"))

    @classmethod
    def from_gguf(cls, gguf, pre_tokenizer: str | None = None) -> "Tokenizer":
        """Build from a :class:`~luminal.gguf.GGUFFile` (or a path to one).

        ``pre_tokenizer`` overrides the file's ``tokenizer.ggml.pre`` (e.g. ``"gpt2"``).
        """
        from .gguf import GGUFError, GGUFFile

        g = gguf if isinstance(gguf, GGUFFile) else GGUFFile(gguf)
        md = g.metadata
        model = _meta_str(md.get("tokenizer.ggml.model"))
        if model != "gpt2":
            raise GGUFError(f"{g.path}: tokenizer model {model!r} is not supported "
                            "(only byte-level BPE, tokenizer.ggml.model = 'gpt2')")
        tokens = md.get("tokenizer.ggml.tokens")
        merges = md.get("tokenizer.ggml.merges")
        if not isinstance(tokens, Sequence) or isinstance(tokens, (str, bytes)) or not tokens:
            raise GGUFError(f"{g.path}: metadata 'tokenizer.ggml.tokens' is missing or empty")
        if not isinstance(merges, Sequence) or isinstance(merges, (str, bytes)):
            raise GGUFError(f"{g.path}: metadata 'tokenizer.ggml.merges' is missing")
        token_types = md.get("tokenizer.ggml.token_type") or [TOKEN_NORMAL] * len(tokens)
        if not isinstance(token_types, Sequence) or isinstance(token_types, (str, bytes)):
            raise GGUFError(f"{g.path}: metadata 'tokenizer.ggml.token_type' should be an array, got "
                            f"{type(token_types).__name__}")
        if len(token_types) != len(tokens):
            raise GGUFError(f"{g.path}: tokenizer.ggml.token_type has {len(token_types)} entries "
                            f"for {len(tokens)} tokens")

        spelling = bytes_to_unicode()
        alphabet = set(spelling.values())
        tokens = [_meta_str(t) for t in tokens]
        vocab: dict[str, int] = {}
        for i, t in enumerate(tokens):
            if not set(t) <= alphabet:  # stored as plain text: respell in the byte alphabet
                t = "".join(spelling[b] for b in t.encode("utf-8"))
            vocab[t] = i
        pairs = []
        for i, m in enumerate(merges):
            parts = _meta_str(m).split(" ")
            if len(parts) != 2:
                raise GGUFError(f"{g.path}: merge {i} ({m!r}) is not two tokens separated by a space")
            for t in (parts[0], parts[1], parts[0] + parts[1]):  # what `tokenizers` needs, said with the file
                if t not in vocab:
                    raise GGUFError(f"{g.path}: merge {i} ({m!r}) of 'tokenizer.ggml.merges' needs token {t!r}, "
                                    "which is not in the vocabulary")
            pairs.append((parts[0], parts[1]))
        try:
            return cls._from_gguf_vocab(g, md, tokens, token_types, vocab, pairs, alphabet, pre_tokenizer)
        except GGUFError:
            raise
        except Exception as e:  # noqa: BLE001 - `tokenizers` raises plain Exceptions
            raise GGUFError(f"{g.path}: the tokenizer in its metadata cannot be built: {e}") from None

    @classmethod
    def _from_gguf_vocab(cls, g, md, tokens, token_types, vocab, pairs, alphabet, pre_tokenizer):
        from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
        from tokenizers import Tokenizer as HFTokenizer

        bpe = models.BPE(vocab=vocab, merges=pairs, dropout=None, unk_token=None,
                         continuing_subword_prefix="", end_of_word_suffix="",
                         fuse_unk=False, byte_fallback=False)
        backend = HFTokenizer(bpe)

        pre = pre_tokenizer or _meta_str(md.get("tokenizer.ggml.pre")) or "gpt2"
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        if pre in _DIGITS_PRE:
            backend.pre_tokenizer = pre_tokenizers.Sequence(
                [pre_tokenizers.Digits(individual_digits=True), byte_level])
        elif pre in _SPLIT_PRE:
            backend.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Split(Regex(_SPLIT_PRE[pre]), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        elif pre in _GPT2_PRE:
            backend.pre_tokenizer = byte_level
        else:
            import warnings
            warnings.warn(f"{g.path}: unknown pre-tokenizer {pre!r}; using GPT-2's", stacklevel=2)
            backend.pre_tokenizer = byte_level
        backend.decoder = decoders.ByteLevel()

        special, user = [], []
        for t, tt in zip(tokens, token_types):
            if tt == TOKEN_CONTROL and set(t) <= alphabet:
                special.append(AddedToken(t, normalized=False, special=True))
            elif tt == TOKEN_USER_DEFINED and t in vocab:
                user.append(AddedToken(t, normalized=False, special=False))
        if special:
            backend.add_special_tokens(special)
        if user:
            backend.add_tokens(user)

        def tid(key):
            v = md.get(f"tokenizer.ggml.{key}")
            return int(v) if isinstance(v, int) and 0 <= v < len(tokens) else None

        return cls(
            backend,
            bos_token_id=tid("bos_token_id"),
            eos_token_id=tid("eos_token_id"),
            unk_token_id=tid("unknown_token_id"),
            pad_token_id=tid("padding_token_id"),
            add_bos_token=md.get("tokenizer.ggml.add_bos_token", False),
            add_eos_token=md.get("tokenizer.ggml.add_eos_token", False),
            chat_template=_meta_str(md.get("tokenizer.chat_template")),
            pre_tokenizer_name=pre,
            special_token_ids=[vocab[t.content] for t in special if t.content in vocab],
        )

    # ---------------------------------------------------------------------------- tokens
    def _tok(self, i):
        return None if i is None else self.backend.id_to_token(i)

    @property
    def bos_token(self) -> str | None:
        return self._tok(self.bos_token_id)

    @property
    def eos_token(self) -> str | None:
        return self._tok(self.eos_token_id)

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def __len__(self) -> int:
        return self.vocab_size

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def id_to_token(self, i: int) -> str | None:
        return self.backend.id_to_token(i)

    # ------------------------------------------------------------------------ encode/decode
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text``.  Special tokens written in the text (``<|im_start|>``) are
        recognised.  ``add_special_tokens`` adds BOS/EOS where the file asks for them."""
        ids = self.backend.encode(text, add_special_tokens=False).ids
        if add_special_tokens:
            if self.add_bos_token and self.bos_token_id is not None:
                ids = [self.bos_token_id] + ids
            if self.add_eos_token and self.eos_token_id is not None:
                ids = ids + [self.eos_token_id]
        return ids

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = False) -> list[list[int]]:
        return [self.encode(t, add_special_tokens) for t in texts]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def stream_decoder(self, skip_special_tokens: bool = False) -> "StreamDecoder":
        return StreamDecoder(self, skip_special_tokens=skip_special_tokens)

    # --------------------------------------------------------------------------- chat
    def apply_chat_template(self, messages: Sequence[dict], add_generation_prompt: bool = True,
                            chat_template: str | None = None, **kwargs) -> str:
        """Render the file's ``tokenizer.chat_template`` (Jinja, sandboxed) for ``messages``."""
        template = chat_template or self.chat_template
        if template is None:
            raise ValueError("this tokenizer has no chat template (tokenizer.chat_template is not "
                             "in the GGUF file); pass chat_template=")
        tmpl = _compile_template(template)
        ctx = dict(bos_token=self.bos_token or "", eos_token=self.eos_token or "",
                   unk_token=self._tok(self.unk_token_id) or "",
                   pad_token=self._tok(self.pad_token_id) or "")
        ctx.update(kwargs)
        return tmpl.render(messages=list(messages), add_generation_prompt=add_generation_prompt, **ctx)

    def __repr__(self) -> str:
        return (f"Tokenizer(vocab_size={self.vocab_size}, pre={self.pre_tokenizer_name!r}, "
                f"bos={self.bos_token!r}, eos={self.eos_token!r})")


@lru_cache(maxsize=8)
def _compile_template(source: str):
    from jinja2 import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(fmt):
        import datetime
        return datetime.datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(source)


class StreamDecoder:
    """Turns token ids, one at a time, into text as soon as it is complete UTF-8.

    A byte-level token may hold only part of a character (an emoji is often split across
    tokens); such bytes are held back until the character is complete::

        sd = tok.stream_decoder()
        for i in ids:
            print(sd.push(i), end="")
        print(sd.flush())

    The concatenation of everything returned equals ``tok.decode(ids)``.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        self._prefix = 0   # start of the window re-decoded for context
        self._read = 0     # ids before this have been emitted

    def _dec(self, ids):
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def push(self, token_id: int) -> str:
        """Add one token; return the newly completed text (possibly '')."""
        self.ids.append(int(token_id))
        done = self._dec(self.ids[self._prefix:self._read])
        text = self._dec(self.ids[self._prefix:])
        if len(text) > len(done) and not text.endswith("\ufffd"):
            new = text[len(done):]
            self._prefix, self._read = self._read, len(self.ids)
            return new
        return ""

    def extend(self, ids: Iterable[int]) -> str:
        return "".join(self.push(i) for i in ids)

    def flush(self) -> str:
        """Return whatever is still held back (incomplete bytes become U+FFFD)."""
        done = self._dec(self.ids[self._prefix:self._read])
        text = self._dec(self.ids[self._prefix:])
        self._prefix = self._read = len(self.ids)
        return text[len(done):]
