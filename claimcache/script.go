package claimcache

import "github.com/redis/go-redis/v9"

// completeScript writes the done entry unless one exists: a done entry is
// never replaced (it is the first committed result). It may replace a
// pending entry, its own or another owner's: the bytes it writes are
// committed in Postgres, so they are the key's answer.
//
// KEYS[1] key; ARGV[1] the done value; ARGV[2] result TTL in ms.
var completeScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v and string.byte(v, 1) == 68 then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1`)

// abortScript deletes the key only if it is still this owner's pending
// entry: compare-and-delete.
//
// KEYS[1] key; ARGV[1] the pending value the owner wrote.
var abortScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0`)
