package failoverapp

import (
	"sync"
	"time"
)

// A provider's prompt cache lives on the channel that wrote it, so the
// next turn of a conversation is cheap only on the channel that served
// the last one. The affinity table remembers that channel per model and
// conversation (provider.ConversationKey), for the process: it outlives
// reloads, like the breakers, and a conversation whose entry expired (its
// cache has too) is routed as any request.

// maxAffinityEntries bounds the table: about 150 bytes an entry, 15 MB.
const maxAffinityEntries = 100_000

type affinityEntry struct {
	channel string
	expires time.Time
}

var affinity = struct {
	sync.Mutex
	m map[string]affinityEntry
}{m: make(map[string]affinityEntry)}

// AffinityChannel is the channel that last served conversation key of
// model, or "" when none did within its lifetime.
func (*App) AffinityChannel(model, key string, now time.Time) string {
	affinity.Lock()
	defer affinity.Unlock()
	e, ok := affinity.m[model+"\x00"+key]
	if !ok || now.After(e.expires) {
		return ""
	}
	return e.channel
}

// RememberAffinity records that channel served conversation key of model,
// for ttl. A full table first drops its expired entries, then, if none
// had, an arbitrary hundredth of the rest: a forgotten conversation is
// only routed as any request.
func (*App) RememberAffinity(model, key, channel string, ttl time.Duration, now time.Time) {
	affinity.Lock()
	defer affinity.Unlock()
	k := model + "\x00" + key
	if _, ok := affinity.m[k]; !ok && len(affinity.m) >= maxAffinityEntries {
		for old, e := range affinity.m {
			if now.After(e.expires) {
				delete(affinity.m, old)
			}
		}
		for old := range affinity.m {
			if len(affinity.m) < maxAffinityEntries-maxAffinityEntries/100 {
				break
			}
			delete(affinity.m, old)
		}
	}
	affinity.m[k] = affinityEntry{channel: channel, expires: now.Add(ttl)}
}
