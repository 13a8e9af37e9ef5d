"""tokenize: BERT's uncased WordPiece tokenizer in Triton's Python backend (pure Python).

TEXT: BYTES [batch, 1] (UTF-8)  ->  INPUT_IDS, ATTENTION_MASK, TOKEN_TYPE_IDS: INT64 [batch, seq]

The same algorithm as tessera's preprocess_text handler (examples/preprocess_text/src/wordpiece.rs),
i.e. Google's tokenization.py / Hugging Face's BertTokenizer (do_lower_case=True):
  BasicTokenizer: drop NUL, U+FFFD and control characters, whitespace -> space, CJK ideographs
  stand alone, lower-case, strip accents (NFD minus Mn), split punctuation off;
  then greedy longest-match-first WordPiece ("##" continuations; a word that cannot be covered or
  longer than 100 characters is [UNK]). Each text is [CLS] pieces [SEP], at most
  max_sequence_length ids ([SEP] kept), padded with 0 to the longest text of the request.
A text that is not UTF-8 fails its own request.
"""
import json
import os
import unicodedata

import numpy as np

try:
    import triton_python_backend_utils as pb_utils
except ImportError:  # imported outside Triton (tests)
    pb_utils = None

MAX_CHARS_PER_WORD = 100
PAD_ID = 0


def _is_whitespace(ch):
    return ch in " \t\n\r" or unicodedata.category(ch) == "Zs"


def _is_control(ch):
    if ch in "\t\n\r":
        return False
    return unicodedata.category(ch).startswith("C")


def _is_punctuation(ch):
    cp = ord(ch)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


def _is_cjk(cp):
    return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF
            or 0x2A700 <= cp <= 0x2B73F or 0x2B740 <= cp <= 0x2B81F or 0x2B820 <= cp <= 0x2CEAF
            or 0xF900 <= cp <= 0xFAFF or 0x2F800 <= cp <= 0x2FA1F)


def basic_tokenize(text):
    out = []
    for ch in text:
        cp = ord(ch)
        if cp == 0 or cp == 0xFFFD or _is_control(ch):
            continue
        if _is_whitespace(ch):
            out.append(" ")
        elif _is_cjk(cp):
            out.append(" " + ch + " ")
        else:
            out.append(ch)
    words = []
    for token in "".join(out).split(" "):
        if not token:
            continue
        token = unicodedata.normalize("NFD", token.lower())
        token = "".join(c for c in token if unicodedata.category(c) != "Mn")
        current = []
        for c in token:
            if _is_punctuation(c):
                if current:
                    words.append("".join(current))
                    current = []
                words.append(c)
            else:
                current.append(c)
        if current:
            words.append("".join(current))
    return [w for word in words for w in word.split()]


class WordPiece:
    def __init__(self, vocab_text):
        lines = vocab_text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        self.vocab = {line.rstrip("\r"): i for i, line in enumerate(lines)}
        self.unk, self.cls, self.sep = self.vocab["[UNK]"], self.vocab["[CLS]"], self.vocab["[SEP]"]

    def wordpiece(self, word):
        if len(word) > MAX_CHARS_PER_WORD:
            return [self.unk]
        vocab = self.vocab
        pieces = []
        start, n = 0, len(word)
        while start < n:
            end = n
            found = None
            while start < end:
                sub = word[start:end]
                if start > 0:
                    sub = "##" + sub
                found = vocab.get(sub)
                if found is not None:
                    break
                end -= 1
            if found is None:
                return [self.unk]
            pieces.append(found)
            start = end
        return pieces

    def encode(self, text, max_len):
        max_len = max(max_len, 2)
        ids = [self.cls]
        for word in basic_tokenize(text):
            for i in self.wordpiece(word):
                if len(ids) == max_len - 1:
                    ids.append(self.sep)
                    return ids
                ids.append(i)
        ids.append(self.sep)
        return ids


def pad(encoded):
    seq = max((len(e) for e in encoded), default=0)
    ids = np.zeros((len(encoded), seq), dtype=np.int64)
    mask = np.zeros((len(encoded), seq), dtype=np.int64)
    for row, e in enumerate(encoded):
        ids[row, :len(e)] = e
        mask[row, :len(e)] = 1
    return ids, mask, np.zeros_like(ids)


def _param(config, key, default):
    return config.get("parameters", {}).get(key, {}).get("string_value", default)


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.max_len = int(_param(config, "max_sequence_length", "128"))
        vocab_path = _param(config, "vocab_path", "vocab.txt")
        if not os.path.isabs(vocab_path):
            vocab_path = os.path.join(args["model_repository"], vocab_path)
        with open(vocab_path, encoding="utf-8") as f:
            self.tokenizer = WordPiece(f.read())

    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            try:
                rows = [t.decode("utf-8") if isinstance(t, bytes) else str(t)
                        for t in text.reshape(text.shape[0], -1)[:, 0]]
            except UnicodeDecodeError as e:
                responses.append(pb_utils.InferenceResponse(
                    output_tensors=[], error=pb_utils.TritonError(f"TEXT is not UTF-8: {e}")))
                continue
            ids, mask, types = pad([self.tokenizer.encode(t, self.max_len) for t in rows])
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("INPUT_IDS", ids),
                pb_utils.Tensor("ATTENTION_MASK", mask),
                pb_utils.Tensor("TOKEN_TYPE_IDS", types),
            ]))
        return responses
