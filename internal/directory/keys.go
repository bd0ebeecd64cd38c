package directory

import "encoding/binary"

// Key layout of the directory's key space (see doc.go). Numeric ids are
// big-endian so that a scan returns them in order.
var (
	keyCluster   = []byte("c/cluster")
	keyClock     = []byte("c/clock")
	keyCounters  = []byte("c/counters")
	keyTLTHeader = []byte("t/header")

	prefixNode       = []byte("n/")
	prefixStats      = []byte("s/")
	prefixTLTRow     = []byte("t/row/")
	prefixExtent     = []byte("e/")
	prefixDelegation = []byte("d/")
	prefixFileSystem = []byte("f/")
	prefixLease      = []byte("l/")
	prefixConfig     = []byte("k/")
	// Requests that succeeded, by id, and the same ids by log index for
	// eviction (see requests.go).
	prefixRequest      = []byte("q/")
	prefixRequestIndex = []byte("Q/")
)

func uint64Key(prefix []byte, id uint64) []byte {
	k := make([]byte, len(prefix)+8)
	copy(k, prefix)
	binary.BigEndian.PutUint64(k[len(prefix):], id)
	return k
}

func uint32Key(prefix []byte, id uint32) []byte {
	k := make([]byte, len(prefix)+4)
	copy(k, prefix)
	binary.BigEndian.PutUint32(k[len(prefix):], id)
	return k
}

func stringKey(prefix []byte, s string) []byte {
	k := make([]byte, 0, len(prefix)+len(s))
	k = append(k, prefix...)
	return append(k, s...)
}

func nodeKey(id uint64) []byte       { return uint64Key(prefixNode, id) }
func statsKey(id uint64) []byte      { return uint64Key(prefixStats, id) }
func tltRowKey(row uint32) []byte    { return uint32Key(prefixTLTRow, row) }
func extentKey(id uint64) []byte     { return uint64Key(prefixExtent, id) }
func delegationKey(id uint64) []byte { return uint64Key(prefixDelegation, id) }
func fileSystemKey(id uint64) []byte { return uint64Key(prefixFileSystem, id) }
func leaseKey(name string) []byte    { return stringKey(prefixLease, name) }
func configKey(key string) []byte    { return stringKey(prefixConfig, key) }

// prefixEnd returns the first key after every key that starts with prefix.
// The prefixes above all end in '/', so incrementing the last byte works.
func prefixEnd(prefix []byte) []byte {
	end := append([]byte(nil), prefix...)
	end[len(end)-1]++
	return end
}
