"""A Redis store that keeps an audit of every write it makes, for the hand-over proofs.

:class:`AuditedRedisStore` writes with the daemon's own write script, run
unchanged inside a script that then appends each accepted write to
``<prefix>:{<task>}:audit`` as ``<fence>\\n<state>`` (one script: the audit
is in the order Redis accepted the writes). A control run turns the fence
check off, to show what it prevents. The daemon never runs it:
``python -m tests._audited_store [--no-fence-check] [ctxwind flags]`` runs
ctxwind with it (``bench/reliability/fleet.py``).
"""

from __future__ import annotations

import functools
import sys
from typing import Any

from ctxwin.daemon import main
from ctxwin.daemon.store import open_store
from ctxwin.daemon.store._redis import _WRITE, Lease, RedisStore

__all__ = ["AuditedRedisStore", "audit_key", "run"]

_AUDITED_WRITE = f"""
local function write()
{_WRITE}
end
local reply = write()
if reply[1] == 0 and ARGV[3] == '0' then
  redis.call('SET', KEYS[3], ARGV[2])
  reply = {{1, reply[2]}}
end
if reply[1] == 1 then redis.call('RPUSH', KEYS[4], ARGV[1] .. '\\n' .. ARGV[2]) end
return reply
"""
"""Lua: the daemon's own write script, unchanged, then the audit of what it accepted.

Without the fence check (``ARGV[3]`` is ``'0'``) a write the fence refused is
made anyway, as if there were no check.
"""


def audit_key(prefix: str, task: str) -> str:
    """The audit list of ``task``, beside its other keys (one hash tag)."""
    return f"{prefix}:{{{task}}}:audit"


class AuditedRedisStore(RedisStore):
    """A :class:`RedisStore` whose writes are also appended to the task's audit list.

    Args:
        fence_check: False accepts every write, fenced or not (a control run).
        options: the :class:`RedisStore` arguments.
    """

    def __init__(self, *args: Any, fence_check: bool = True, **options: Any) -> None:
        super().__init__(*args, **options)
        self.fence_check = fence_check
        self._audited_write = self.client.register_script(_AUDITED_WRITE)

    def _write_script(self, lease: Lease, state: bytes) -> Any:
        return self._audited_write(
            keys=[*self.keys(lease.task), audit_key(self.prefix, lease.task)],
            args=[lease.fence, state, "1" if self.fence_check else "0"],
        )


def run(argv: list[str]) -> int:
    """Run ctxwind with the audited store (``--no-fence-check`` first: without the check)."""
    fence_check = argv[:1] != ["--no-fence-check"]
    redis = functools.partial(AuditedRedisStore, fence_check=fence_check)
    stores = functools.partial(open_store, redis=redis)
    return main(argv if fence_check else argv[1:], stores=stores)


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
