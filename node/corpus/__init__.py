"""The corpus: indexing, search and the source-id language of a node's own folders.

Two bounds live here, at the package's root, because the answer contract
(node/answer/contract.py) states them in every request's schema and a guest's process
imports the contract without loading the corpus's modules (issue 44): importing this
package loads nothing else. :mod:`node.corpus.globs` and :mod:`node.corpus.types` re-export
them where they are used.
"""

#: Characters of one glob (DESIGN §14): the glob language's bound (node/corpus/globs.py).
MAX_GLOB_CHARS = 1024
#: Default cap of chunks per document in one result list (document-level dedup; the
#: contract's ``dedupe: chunk``; node/corpus/types.py, node/corpus/search.py).
MAX_PER_DOCUMENT = 2
