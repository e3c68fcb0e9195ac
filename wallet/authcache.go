package wallet

import (
	"sync"
	"time"

	"github.com/llmfailover/caddy-llm-failover/internal/expiry"
)

// Authenticate cache defaults.
const (
	// DefaultAuthCacheTTL is how long a successful Authenticate is served
	// from memory, and so how long another gateway instance sharing the
	// database may keep accepting a key after it was revoked there.
	DefaultAuthCacheTTL = 5 * time.Second
	// authCacheMax bounds the cache; when it is full the entry that
	// expires soonest makes room.
	authCacheMax = 10_000
	// KnownKeyTTL is how long a key the database verified stays known to
	// this Store when the database cannot be asked (see Store.KnownKey).
	KnownKeyTTL = time.Hour
)

// authCache maps a key's SHA-256 hash to the key, for successful lookups
// only: unknown and revoked keys always go to the database (they are rare,
// and plausibleKey already turns garbage away without a query).
type authCache struct {
	ttl time.Duration
	max int

	mu sync.RWMutex
	m  map[keyHash]authEntry
	// expiry orders m's keys by expiry: a full cache forgets its first
	// in O(log n), not by reading every entry under mu.
	expiry expiry.Queue[keyHash]
	// gen changes on every revocation (forgetKey), so that a lookup that
	// read the database before a revocation committed cannot store its
	// stale answer after the revocation forgot the key.
	gen uint64
}

type authEntry struct {
	k       Key
	expires time.Time
}

func newAuthCache(ttl time.Duration, max int) *authCache {
	return &authCache{ttl: ttl, max: max, m: map[keyHash]authEntry{}}
}

// get returns the cached key for hash if it has not expired at now, and the
// generation to pass to put after a miss.
func (c *authCache) get(hash keyHash, now time.Time) (Key, bool, uint64) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	e, ok := c.m[hash]
	if ok && now.Before(e.expires) {
		return e.k, true, c.gen
	}
	return Key{}, false, c.gen
}

func (c *authCache) put(hash keyHash, k Key, now time.Time, gen uint64) {
	if c.ttl <= 0 || c.max <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if gen != c.gen {
		return // a key was revoked since the caller's lookup began
	}
	if _, ok := c.m[hash]; !ok {
		for len(c.m) >= c.max && c.expiry.Len() > 0 {
			first, _, _ := c.expiry.First()
			delete(c.m, first)
			c.expiry.Remove(first)
		}
	}
	e := authEntry{k: k, expires: now.Add(c.ttl)}
	c.m[hash] = e
	c.expiry.Set(hash, e.expires)
}

// forget forgets hash's entry.
func (c *authCache) forget(hash keyHash) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	delete(c.m, hash)
	c.expiry.Remove(hash)
}

// forgetKey forgets the entries of the key called id (a revoked key),
// keeping every other key's: a revocation, even one that failed, must
// not make the instance forget the keys it may serve while the database
// cannot be asked (KnownKey). It changes the generation,
// so that a lookup that read the database before the revocation cannot
// store its answer after it.
func (c *authCache) forgetKey(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	for h, e := range c.m {
		if e.k.ID == id {
			delete(c.m, h)
			c.expiry.Remove(h)
		}
	}
}
