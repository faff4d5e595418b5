"""A small BM25 index over in-memory texts (the search tool of Search-QA and WebShop-lite), built on `bm25s`.

`bm25s` scores documents with sparse matrices (0.03 ms per query over 5,000 short documents here). This wrapper
fixes what the environments need on top of it:

- one tokenizer for documents and queries (lowercase words of two or more letters or digits, minus a short list of
  English stop words, no stemming), so that a query word matches a document word exactly;
- deterministic rankings: documents are ordered by score, ties by their position in the corpus, and documents that
  share no word with the query are never returned;
- queries made only of unknown words return no results instead of raising.

`bm25s` is imported when an index is built, so importing this module needs no optional package.

Example:
    >>> index = BM25Index(["The red fox jumps.", "A lazy dog sleeps.", "The red dog barks."])
    >>> index.search("red dog", k=2)
    [2, 0]
    >>> index.search("unicorn")
    []
"""

from __future__ import annotations

import re
from collections.abc import Sequence

# The words every query and document shares carry no signal; keeping them out also keeps the vocabulary small.
# fmt: off
STOP_WORDS = frozenset((
    "a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "from", "has", "have", "if", "in", "into", "is",
    "it", "its", "of", "on", "or", "that", "the", "their", "then", "there", "these", "they", "this", "to", "was",
    "were", "which", "while", "who", "whom", "will", "with",
))
# fmt: on
_WORD = re.compile(r"[a-z0-9]{2,}")


def tokenize(text: str) -> list[str]:
    """Lowercase words of two or more letters/digits, without stop words (`"The Fox-like 2 cats"` ->
    `["fox", "like", "cats"]`)."""
    return [word for word in _WORD.findall(text.lower()) if word not in STOP_WORDS]


def require_bm25s() -> None:
    """Raise an ImportError with the install command when `bm25s` is missing (environments call it when built, so
    the error comes before the first episode rather than at the first search)."""
    import importlib.util

    if importlib.util.find_spec("bm25s") is None:
        raise ImportError('The search tool needs bm25s: pip install "trl-agents[envs]"')


class BM25Index:
    """BM25 (Lucene variant, k1=1.5, b=0.75: the `bm25s` defaults) over a fixed list of texts.

    Args:
        texts: The documents, searched by position (`search` returns indices into this list).
    """

    def __init__(self, texts: Sequence[str]):
        require_bm25s()
        import bm25s
        import numpy as np

        if not texts:
            raise ValueError("BM25Index needs at least one document")
        self._np = np
        self.num_documents = len(texts)
        corpus = [tokenize(text) or [""] for text in texts]  # an empty document still takes its slot
        self._retriever = bm25s.BM25()
        self._retriever.index(corpus, show_progress=False)
        self._vocabulary = self._retriever.vocab_dict
        self._positions = np.arange(self.num_documents)

    def search(self, query: str, k: int = 10) -> list[int]:
        """Indices of the (at most) `k` best documents for `query`, best first; only documents with a positive
        score (at least one query word) are returned, and equal scores keep corpus order."""
        if k < 1:
            raise ValueError(f"`k` must be >= 1, got {k}")
        words = [word for word in tokenize(query) if word in self._vocabulary]
        if not words:
            return []
        np = self._np
        scores = self._retriever.get_scores(words)
        order = np.lexsort((self._positions, -scores))[:k]  # by score descending, then by position
        return [int(i) for i in order if scores[i] > 0]
