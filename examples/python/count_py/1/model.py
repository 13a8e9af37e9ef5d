"""Streams TEXT back one word at a time, each with its index: a decoupled model whose execute
is a generator. An empty TEXT is refused (400) before anything is streamed."""

import numpy as np

import tessera


class Words(tessera.Handler):
    def execute(self, request: tessera.Request):
        [text] = request.strings("TEXT")
        words = text.split()
        if not words:
            raise tessera.InvalidInput("TEXT has no words")
        for index, word in enumerate(words):
            yield {"WORD": [word], "INDEX": np.array([index], dtype=np.int32)}
