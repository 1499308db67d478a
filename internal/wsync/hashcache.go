package wsync

import "sync"

// cacheKey identifies a file version well enough to reuse its hash: any
// write changes mtime or ctime.
type cacheKey struct {
	ino, dev     uint64
	size         int64
	mtime, ctime int64
}

type hashCache struct {
	mu sync.Mutex
	m  map[string]cachedHash
}

type cachedHash struct {
	key  cacheKey
	hash string
}

func newHashCache() *hashCache { return &hashCache{m: map[string]cachedHash{}} }

func (c *hashCache) get(p string, k cacheKey) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[p]
	if !ok || e.key != k {
		return "", false
	}
	return e.hash, true
}

func (c *hashCache) put(p string, k cacheKey, h string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.m[p] = cachedHash{k, h}
}
