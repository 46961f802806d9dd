"""Corpora (Hub, local files, built-in), tokenizers, token-file preparation, batch samplers.

``prepare_data(cfg.data)`` -> ``PreparedData`` (``.tokenizer``, ``.split(name)``, ``.meta``,
``.dir``); ``TrainSampler`` draws training batches; ``eval_windows`` lays out evaluation.
"""

from ropelab.data.prepare import PreparedData, prepare_data
from ropelab.data.samplers import (EvalWindow, TrainSampler, document_spans, document_windows, eval_windows,
                           spread_windows, window_batch)
from ropelab.data.tokenizers import EOT, Tokenizer, load_tokenizer, train_tokenizer

__all__ = [
    "EOT", "EvalWindow", "PreparedData", "Tokenizer", "TrainSampler", "document_spans", "document_windows",
    "eval_windows", "load_tokenizer", "prepare_data", "spread_windows", "train_tokenizer", "window_batch",
]
