"""The knowledge base and the offline retrieval variants: BM25 and regex search, and the policy each variant gives.

Variants (tau2's names): ``no_knowledge`` (no KB at all), ``full_kb`` (every document in the policy),
``golden_retrieval`` (the task's required documents in the policy), ``grep_only`` (a ``grep`` tool),
``bm25`` (a ``KB_search`` tool) and ``bm25_grep`` (both). tau2's other variants embed with OpenAI or
OpenRouter models, rerank with an LLM or run a shell sandbox: they need the network or binaries and are refused.

``KB_search`` ranks with Okapi BM25 exactly as ``rank_bm25.BM25Okapi`` (k1 1.5, b 0.75, negative idfs floored to
0.25 x the mean idf) over ``text.lower().split()``: the same float operations in the same order, so scores and the
top 10 (ties in document order) equal tau2's. Documents are in tau2's order: the documents folder's listing.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ctu.domains.banking_knowledge.toolkit import Method

TOP_K = 10
MIXINS = "tau2.domains.banking_knowledge.retrieval_mixins"


@dataclass(frozen=True)
class Document:
    id: str
    title: str
    content: str


@dataclass(frozen=True)
class Variant:
    name: str
    template: str  # prompt file in the domain's prompts/ folder
    kb_search: bool = False
    grep: bool = False
    inline: str | None = None  # "all": every document in the policy; "required": the task's required documents


VARIANTS = {v.name: v for v in (
    Variant("no_knowledge", "no_knowledge.md"),
    Variant("full_kb", "full_kb.md", inline="all"),
    Variant("golden_retrieval", "required_docs.md", inline="required"),
    Variant("grep_only", "grep_only.md", grep=True),
    Variant("bm25", "classic_rag_bm25_no_grep.md", kb_search=True),
    Variant("bm25_grep", "classic_rag_bm25.md", kb_search=True, grep=True),
)}
DEFAULT_VARIANT = "bm25"
# tau2's variants that need embeddings or an LLM reranker (network) or a shell sandbox
ONLINE_VARIANTS = ("qwen_embeddings_grep", "openai_embeddings_grep", "qwen_embeddings_reranker_grep",
                   "openai_embeddings_reranker_grep", "bm25_reranker_grep", "qwen_embeddings", "openai_embeddings",
                   "qwen_embeddings_reranker", "openai_embeddings_reranker", "bm25_reranker", "terminal_use",
                   "terminal_use_write", "alltools", "alltools-qwen", "AllTools")


def resolve_variant(name: str) -> Variant:
    """The offline variant ``name``; one line naming the ones that work otherwise."""
    if name in VARIANTS:
        return VARIANTS[name]
    offline = ", ".join(VARIANTS)
    if name in ONLINE_VARIANTS:
        raise ValueError(f"banking_knowledge retrieval variant '{name}' needs network access (embeddings or an LLM "
                         f"reranker) or a shell sandbox; ctu runs the offline ones: {offline}")
    raise ValueError(f"unknown banking_knowledge retrieval variant '{name}' (offline variants: {offline})")


class BM25Okapi:
    """Okapi BM25 over tokenized documents, computed as rank_bm25 computes it (see the module docstring).

    Each (term, document) weight ``idf * (tf * (k1 + 1) / (tf + k1 * (1 - b + b * dl / avgdl)))`` is the float
    rank_bm25 adds for that pair; it is computed once, here. A query adds its terms' weights in query order, so
    every score is the same sum of the same floats (a document without the term gains rank_bm25's exact 0).
    """

    def __init__(self, corpus: Sequence[Sequence[str]], k1: float = 1.5, b: float = 0.75, epsilon: float = 0.25):
        self.size = len(corpus)
        postings: dict[str, list[tuple[int, int]]] = {}
        total = 0
        for index, tokens in enumerate(corpus):
            total += len(tokens)
            counts: dict[str, int] = {}
            for token in tokens:
                counts[token] = counts.get(token, 0) + 1
            for token, count in counts.items():
                postings.setdefault(token, []).append((index, count))
        avgdl = total / self.size
        norm = [k1 * (1 - b + b * len(tokens) / avgdl) for tokens in corpus]
        self.idf: dict[str, float] = {}
        idf_sum = 0.0
        negative = []
        for token, docs in postings.items():  # first-seen order, as rank_bm25 sums them
            idf = math.log(self.size - len(docs) + 0.5) - math.log(len(docs) + 0.5)
            self.idf[token] = idf
            idf_sum += idf
            if idf < 0:
                negative.append(token)
        floor = epsilon * (idf_sum / len(self.idf))
        for token in negative:
            self.idf[token] = floor
        self.weights: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for token, docs in postings.items():
            idf = self.idf[token]
            if idf:  # rank_bm25 adds idf 0 as 0: nothing
                weights = [idf * (count * (k1 + 1) / (count + norm[i])) for i, count in docs]
                self.weights[token] = (np.array([i for i, _ in docs], dtype=np.intp), np.array(weights))

    def _scores(self, query: Sequence[str]) -> np.ndarray:
        out = np.zeros(self.size)
        for token in query:
            entry = self.weights.get(token)
            if entry is not None:
                out[entry[0]] += entry[1]  # a term's documents are distinct: one exact addition each
        return out

    def scores(self, query: Sequence[str]) -> list[float]:
        """Every document's score."""
        return self._scores(query).tolist()

    def top(self, query: Sequence[str], k: int = TOP_K) -> list[tuple[int, float]]:
        """The ``k`` best (index, score), best first; equal scores in document order (a stable sort)."""
        scores = self._scores(query)
        best = np.argsort(-scores, kind="stable")[:k]
        return [(int(i), float(scores[i])) for i in best]


class KnowledgeBase:
    """The documents, in tau2's order, with their BM25 index (built on first use)."""

    def __init__(self, documents: Sequence[Document]):
        self.documents = list(documents)
        self._bm25: BM25Okapi | None = None

    @property
    def bm25(self) -> BM25Okapi:
        if self._bm25 is None:
            self._bm25 = BM25Okapi([d.content.lower().split() for d in self.documents])
        return self._bm25

    def search(self, query: Any) -> tuple[list[tuple[Document, float]], float]:
        """(the top 10 by BM25, milliseconds spent); no results for an empty or blank query."""
        started = time.perf_counter()
        if not query or not query.strip():
            hits = []
        else:
            hits = [(self.documents[i], s) for i, s in self.bm25.top(query.lower().split())]
        return hits, (time.perf_counter() - started) * 1000

    def grep(self, pattern: Any) -> list[tuple[Document, float]]:
        """Documents by number of case-insensitive regex matches (top 10; an invalid regex is matched literally)."""
        if not pattern.strip():
            return []
        try:
            regex = re.compile(pattern, re.IGNORECASE)
        except re.error:
            regex = re.compile(re.escape(pattern), re.IGNORECASE)
        hits = []
        for doc in self.documents:
            count = len(regex.findall(doc.content))
            if count:
                hits.append((doc, float(count)))
        hits.sort(key=lambda hit: hit[1], reverse=True)
        return hits[:TOP_K]


def format_hits(hits: list[tuple[Document, float]]) -> str:
    return "\n".join(f"{i}. {doc.title or 'Untitled'}\n   ID: {doc.id}\n   Score: {score:.4f}\n   Content: {doc.content}\n"
                     for i, (doc, score) in enumerate(hits, 1))


def kb_search_method(kb: KnowledgeBase) -> Method:
    def KB_search(self, query: str) -> str:  # noqa: N802 (tau2's tool name)
        """Search the knowledge base for relevant documents.

        Args:
            query: The search query to find relevant documents

        Returns:
            Relevant document excerpts matching the query
        """
        hits, ms = kb.search(query)
        timing = f"\n\n[Timing: retrieval={ms:.0f}ms, total={ms:.0f}ms]"  # the only wall-clock text of the domain
        return (format_hits(hits) if hits else "No relevant documents found.") + timing

    return Method("KB_search", KB_search, "KBSearchMixin", "read", False, False, MIXINS)


def grep_method(kb: KnowledgeBase) -> Method:
    def grep(self, pattern: str) -> str:
        """Search for a regex pattern in all knowledge base documents.

        Returns documents ranked by number of matches, with full content.

        Args:
            pattern: The regex pattern to search for (e.g., 'credit.*card', 'fee|charge')

        Returns:
            Matching documents ranked by relevance (match count)
        """
        hits = kb.grep(pattern)
        return format_hits(hits) if hits else f"No matches found for pattern: {pattern}"

    return Method("grep", grep, "GrepMixin", "read", False, False, MIXINS)


# -- the agent's policy per variant --------------------------------------------------------------
def read_template(prompts: Path, name: str) -> str:
    """A prompt template with its ``{{component:NAME}}`` parts filled from ``prompts/components/NAME.md``."""
    text = (prompts / name).read_text()
    return re.sub(r"\{\{component:(\w+)\}\}", lambda m: (prompts / "components" / f"{m.group(1)}.md").read_text(),
                  text)


def documents_text(docs: Sequence[Document]) -> str:
    return "\n\n---\n\n".join(f"## {d.title}\n\n{d.content}" for d in docs)


def policy_builder(variant: Variant, prompts: Path, kb: KnowledgeBase,
                   required: Callable[[str], Sequence[str]]) -> tuple[str, Callable[[str], str] | None]:
    """(the variant's policy, a per-task policy builder taking a task id, or None)."""
    template = read_template(prompts, variant.template)
    if variant.inline == "all" and "{{full_knowledge_base}}" in template:
        # tau2 substitutes with re.sub and the text as a template (backslash escapes would be processed)
        return re.sub(r"\{\{full_knowledge_base\}\}", documents_text(kb.documents), template), None
    if variant.inline != "required":
        return template, None
    by_title = {d.title: d for d in kb.documents}
    by_id = {d.id: d for d in kb.documents}

    def for_task(task_id: str) -> str:
        docs = [by_title.get(ref) or by_id.get(ref) for ref in required(task_id)]
        text = documents_text([d for d in docs if d is not None]) or "(No documents provided)"
        return template.replace("{{required_documents}}", text)

    return template.replace("{{required_documents}}", "(Policy is task-specific)"), for_task
