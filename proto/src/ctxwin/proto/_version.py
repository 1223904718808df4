from __future__ import annotations

PROTOCOL_VERSION = 1
"""Wire protocol version carried as ``v`` in every request and reply."""

__version__ = "0.1.0"

FEATURES = (
    "delta",
    "view_patch",
    "view_patch_prepend",
    "budgeting",
    "plan",
    "dialects",
    "read_tools",
    "auto",
    "summaries",
)
"""Optional parts of protocol version 1 this version implements, named in ``ping``.

``delta``: ops that take ``messages`` also take ``base``/``base_digest``/``append``;
``view_patch``: ``view: "patch"`` returns views as patches; ``view_patch_prepend``:
``view: "patch_prepend"`` returns them with ``prepend`` entries too; ``budgeting``:
``prepare_request`` takes ``strategy``/``proactive``/``estimate`` and tasks
calibrate estimates; ``plan``: the ``plan`` op; ``dialects``: task ops and
``count_tokens`` take ``dialect`` (``ping`` lists them, docs/DIALECTS.md);
``read_tools``: task ops take ``read_tools``, the tools whose calls read a
file in that task, besides the daemon's table; ``auto``:
``strategy: "auto"``, ``pricing`` and the cache ledger (docs/STRATEGIES.md, docs/PRICING.md);
``summaries``: the ``condense`` op, summaries kept as task state, and
``prepare_request``'s ``summary_due`` (docs/SUMMARIES.md).

A daemon's ``ping`` names these and those of its state store: ``fleet`` for
the Redis store (a task is served by one daemon at a time, and another answers
``owned_elsewhere`` naming its ``owner``).
"""
