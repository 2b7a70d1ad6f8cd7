"""What :class:`~tiers.backends.redis_kv.RedisKVStore` sends and reads: scripts, arguments, RESP.

A space is a values hash and a key-index sorted set (see ``redis_kv``). The
commit script checks, then writes; the scan script reads a key range and its
values in one consistent step. Both run on one server (or one cluster slot).
Also here: the commit's write groups, a command packed as RESP in one buffer,
and the scan's replies taken apart.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import redis

from tiers.backends.base import Delete, Put, Write

__all__ = [
    "COMMIT",
    "GROUP_KEYS",
    "SCAN",
    "SCAN_INLINE_BYTES",
    "exec_replies",
    "guessed_read",
    "resp_command",
    "scan_pairs",
    "write_groups",
]

# KEYS: (values-hash, index-zset) per space. ARGV: n_checks, then 4 per check
# (space#, key, must_exist, expected), then the writes in groups: op, space#, n, then
# n (key, value) pairs for 'P', n keys for 'D', nothing for 'X' (see write_groups).
# Returns 1 when it wrote, or {space#, key} of the first check that failed (nothing written):
# an integer is the cheapest reply for the server to build and the client to parse.
# A group is one HSET (and at most one ZADD), not one pair of commands per key: each
# redis.call is a command the server runs and, for a write, appends to its AOF.
COMMIT: Final = """
local n = tonumber(ARGV[1])
local i = 2
for _ = 1, n do
  local s = tonumber(ARGV[i])
  local v = redis.call('HGET', KEYS[2 * s - 1], ARGV[i + 1])
  if ARGV[i + 2] == '0' then
    if v then return {s, ARGV[i + 1]} end
  elseif (not v) or v ~= ARGV[i + 3] then
    return {s, ARGV[i + 1]}
  end
  i = i + 4
end
while i <= #ARGV do
  local op = ARGV[i]
  local s = tonumber(ARGV[i + 1])
  local count = tonumber(ARGV[i + 2])
  local h = KEYS[2 * s - 1]
  local z = KEYS[2 * s]
  if op == 'P' then
    -- HSET counts the fields it added; a key already in the hash is in the index too
    -- (every write keeps the two in step), so a group that added none skips the ZADD.
    if redis.call('HSET', h, unpack(ARGV, i + 3, i + 2 + 2 * count)) > 0 then
      local members = {}
      for j = 1, count do
        members[2 * j - 1] = 0
        members[2 * j] = ARGV[i + 1 + 2 * j]
      end
      redis.call('ZADD', z, unpack(members))
    end
    i = i + 3 + 2 * count
  elseif op == 'D' then
    redis.call('HDEL', h, unpack(ARGV, i + 3, i + 2 + count))
    redis.call('ZREM', z, unpack(ARGV, i + 3, i + 2 + count))
    i = i + 3 + count
  else
    redis.call('DEL', h, z)
    i = i + 3
  end
end
return 1
"""

# The most keys one write group holds: Lua's unpack() overflows its C stack past ~8000 values.
GROUP_KEYS: Final = 1000

# KEYS: values-hash, index-zset. ARGV: min, max, reverse ('1'/'0'), limit (-1 = all),
# inline (bytes, -1 = no bound). Returns {key1, value1, key2, value2, ...}; or {{key1,
# key2, ...}} (the keys alone, in one nested array) when two or more values would exceed
# `inline` bytes, estimated from the first value's length (one range of a space holds
# records of one kind, of like sizes); one value is always read here (one round trip).
# Each value a script reads is copied into a Lua string and back (about 10 us per 5 KB
# value on Redis 7.0, twice a plain HMGET's whole cost), so a large listing's values are
# read by the client outside Lua (see RedisKVStore.scan).
SCAN: Final = """
local keys
local limit = tonumber(ARGV[4])
if ARGV[3] == '1' then
  if limit >= 0 then
    keys = redis.call('ZREVRANGEBYLEX', KEYS[2], ARGV[2], ARGV[1], 'LIMIT', 0, limit)
  else
    keys = redis.call('ZREVRANGEBYLEX', KEYS[2], ARGV[2], ARGV[1])
  end
else
  if limit >= 0 then
    keys = redis.call('ZRANGEBYLEX', KEYS[2], ARGV[1], ARGV[2], 'LIMIT', 0, limit)
  else
    keys = redis.call('ZRANGEBYLEX', KEYS[2], ARGV[1], ARGV[2])
  end
end
local inline = tonumber(ARGV[5])
if inline >= 0 and #keys > 1 and #keys * redis.call('HSTRLEN', KEYS[1], keys[1]) > inline then
  return {keys}
end
local out = {}
-- HMGET in chunks: unpack() of more than ~8000 items overflows Lua's C stack.
for first = 1, #keys, 1000 do
  local last = math.min(first + 999, #keys)
  local values = redis.call('HMGET', KEYS[1], unpack(keys, first, last))
  for j = first, last do
    out[2 * j - 1] = keys[j]
    out[2 * j] = values[j - first + 1]
  end
end
return out
"""

# The most value bytes (estimated) the scan script reads itself: below it one round trip
# beats two, above it two (the listing, then the values outside Lua) beat Lua's copies of
# the values (measured on 5 KB and 300 B values, with and without hiredis).
SCAN_INLINE_BYTES: Final = 32 * 1024


def write_groups(writes: Sequence[Write], spaces: dict[str, int]) -> list[bytes]:
    """``writes`` as the commit script's write groups (see :data:`COMMIT`), in their order.

    Consecutive writes of one kind to one space form a group (at most
    ``GROUP_KEYS`` keys); within a group a later write of a key wins, as when
    the writes are applied one by one.
    """
    args: list[bytes] = []
    head = -1  # index in args of the open group's key count, or -1: none open
    op, number, count = b"", 0, 0
    for write in writes:
        items: tuple[bytes, ...]
        if isinstance(write, Put):
            kind, items = b"P", (write.key.encode(), write.value)
        elif isinstance(write, Delete):
            kind, items = b"D", (write.key.encode(),)
        else:
            kind, items = b"X", ()
        space_no = spaces[write.space]
        if kind == b"X" or head < 0 or (kind, space_no) != (op, number) or count >= GROUP_KEYS:
            if head >= 0:
                args[head] = b"%d" % count
            op, number, count = kind, space_no, 0
            args += [kind, b"%d" % space_no, b"0"]
            head = len(args) - 1
        args += items
        count += 1 if items else 0
    if head >= 0:
        args[head] = b"%d" % count
    return args


# The RESP length line of a bulk string shorter than 1 KiB (keys, counts, small values),
# made once: formatting it per word was a third of packing a commit.
_BULK_HEADS: Final = tuple(b"$%d" % length for length in range(1024))


def resp_command(words: list[bytes]) -> bytes:
    """``words`` as one RESP command (an array of bulk strings), in one buffer."""
    # Every line of RESP ends in CRLF: the lines joined by CRLF, plus a final one.
    lines = [b"*%d" % len(words)]
    heads = _BULK_HEADS
    for word in words:
        length = len(word)
        lines += (heads[length] if length < 1024 else b"$%d" % length, word)
    lines.append(b"")
    return b"\r\n".join(lines)


def scan_pairs(flat: list[Any]) -> list[tuple[str, bytes]]:
    """The scan script's ``key, value, ...`` reply as pairs (a key without a value left out)."""
    # Bulk strings arrive as bytes (the client does not decode responses).
    pairs = zip(flat[::2], flat[1::2], strict=True)
    return [(key.decode(), value) for key, value in pairs if value is not None]


def guessed_read(
    hash_name: str, index_name: str, args: list[bytes], guess: list[Any]
) -> list[list[bytes]]:
    """A scan's range listed and its ``guess``ed keys' values read, in one ``MULTI``.

    The range is the scan script's ``args``', listed as the script lists it (its
    ``LIMIT`` too); see ``_redis_ranges``.
    """
    low, high, reverse, limit = args[:4]
    listing = (
        [b"ZREVRANGEBYLEX", index_name.encode(), high, low]
        if reverse == b"1"
        else [b"ZRANGEBYLEX", index_name.encode(), low, high]
    )
    if limit != b"-1":
        listing += [b"LIMIT", b"0", limit]
    return [[b"MULTI"], listing, [b"HMGET", hash_name.encode(), *guess], [b"EXEC"]]


def exec_replies(replies: list[Any]) -> tuple[list[Any], Any]:
    """The two replies of an ``EXEC``: ``HMGET`` and ``ZLEXCOUNT``, or a listing and ``HMGET``.

    Raises:
        redis.ResponseError: One of them failed (a key of another type).
    """
    for reply in replies:
        # EXEC answers a command's error inside its array instead of raising it.
        if isinstance(reply, redis.ResponseError):
            raise reply
    values, count = replies
    return values, count
