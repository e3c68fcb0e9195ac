package wallet

import (
	"sync"
	"time"
)

// Authenticate cache defaults.
const (
	// DefaultAuthCacheTTL is how long a successful Authenticate is served
	// from memory, and so how long another gateway instance sharing the
	// database may keep accepting a key after it was revoked there.
	DefaultAuthCacheTTL = 5 * time.Second
	// authCacheMax bounds the cache; when it is full an arbitrary entry
	// makes room.
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
	// gen changes on every invalidation, so that a lookup that read the
	// database before a revocation committed cannot store its stale answer
	// after the revocation cleared the cache.
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
		return // invalidated since the caller's lookup began
	}
	if _, ok := c.m[hash]; !ok && len(c.m) >= c.max {
		for h, e := range c.m {
			if !now.Before(e.expires) {
				delete(c.m, h)
			}
		}
		for h := range c.m {
			if len(c.m) < c.max {
				break
			}
			delete(c.m, h)
		}
	}
	c.m[hash] = authEntry{k: k, expires: now.Add(c.ttl)}
}

// forget forgets hash's entry.
func (c *authCache) forget(hash keyHash) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	delete(c.m, hash)
}

// invalidate forgets every entry. Revocations are rare, so clearing
// everything beats keeping an index from key ID to hash.
func (c *authCache) invalidate() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	clear(c.m)
}
